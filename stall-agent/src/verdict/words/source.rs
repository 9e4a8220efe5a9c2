//! Where the bytes a verdict counts came from: the share storage brought
//! in, or the FUSE or network filesystem that served them, and for FUSE
//! its server.
use crate::{
    aggregate::{storage_share, PageCache, ProcWindow},
    detail::Name,
    verdict::classify::Scene,
};

/// " (98 % from storage, page cache cold)": how much of what `procs` took
/// in (`bytes`) the page cache had to bring from storage; empty where the
/// kernel does not show it. Where a FUSE or network filesystem served most
/// of it, that instead: its bytes pass no block layer, so none counted
/// from storage says nothing of the page cache.
pub(super) fn from_storage(procs: &[&ProcWindow], bytes: u64) -> String {
    if let Some((fstype, share)) = served_filesystem(procs, bytes) {
        let what = if fstype.starts_with("fuse") {
            "a FUSE filesystem, served by a program in user space"
        } else {
            "a network filesystem"
        };
        return format!(
            " ({:.0} % from {fstype}, {what}, not from a local disk or its page cache)",
            share * 100.0
        );
    }
    let known: Vec<u64> = procs.iter().filter_map(|p| p.storage_bytes).collect();
    if known.is_empty() || bytes == 0 {
        return String::new();
    }
    let share = storage_share(known.iter().sum(), bytes);
    let cache = match PageCache::of(share) {
        Some(PageCache::Cold) => ", page cache cold",
        Some(PageCache::Warm) => ", from the page cache",
        None => "",
    };
    format!(" ({:.0} % from storage{cache})", share * 100.0)
}

/// The filesystem that served at least half of what `procs` took in
/// (`bytes`), where a server does (FUSE, a network filesystem), and its
/// share.
fn served_filesystem<'a>(procs: &[&'a ProcWindow], bytes: u64) -> Option<(&'a str, f64)> {
    let mut by_type: Vec<(&str, u64)> = Vec::new();
    for f in procs.iter().flat_map(|p| &p.files).filter(|f| !f.is_code()) {
        let Some(fs) = f.filesystem.as_deref() else { continue };
        match by_type.iter_mut().find(|(t, _)| *t == fs) {
            Some((_, n)) => *n += f.bytes_in(),
            None => by_type.push((fs, f.bytes_in())),
        }
    }
    let served: u64 = by_type.iter().map(|(_, n)| n).sum();
    let (top, _) = by_type.into_iter().max_by_key(|(_, n)| *n)?;
    (bytes > 0 && served * 2 >= bytes).then(|| (top, storage_share(served, bytes)))
}

/// ", the reads answered by pid 4410 (s3fs)": the process outside the job
/// that ended most of the time `procs` were blocked, where their input
/// came from a FUSE filesystem (its server answers each read).
pub(super) fn fuse_server(s: &Scene, procs: &[&ProcWindow], bytes: u64) -> String {
    if !served_filesystem(procs, bytes).is_some_and(|(t, _)| t.starts_with("fuse")) {
        return String::new();
    }
    let job: std::collections::HashSet<u32> = s.w.procs.iter().map(|p| p.tgid).collect();
    let mut by: Vec<(u32, &str, u64)> = Vec::new();
    for b in
        procs.iter().flat_map(|p| &p.threads).flat_map(|t| &t.woken_by).filter(|b| !job.contains(&b.tgid))
    {
        match by.iter_mut().find(|(pid, _, _)| *pid == b.tgid) {
            Some((_, _, ns)) => *ns += b.blocked_ns.max(b.count),
            None => by.push((b.tgid, &b.comm, b.blocked_ns.max(b.count))),
        }
    }
    by.into_iter()
        .max_by_key(|(pid, _, ns)| (*ns, std::cmp::Reverse(*pid)))
        .map(|(pid, comm, _)| format!(", the reads answered by pid {pid} ({})", Name::from(comm)))
        .unwrap_or_default()
}
