//! cgroup v2: finding the mount (also on hybrid systems, where it sits at
//! /sys/fs/cgroup/unified), resolving a user's path, ids and members.
use std::{
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use super::CaptureError;

/// Mount point of the cgroup2 hierarchy, from /proc/self/mountinfo.
pub fn mount_point() -> Option<PathBuf> {
    let text = fs::read_to_string("/proc/self/mountinfo").ok()?;
    parse_mountinfo(&text)
}

pub fn parse_mountinfo(text: &str) -> Option<PathBuf> {
    text.lines().find_map(|line| {
        let (pre, post) = line.split_once(" - ")?;
        let fstype = post.split_whitespace().next()?;
        if fstype != "cgroup2" {
            return None;
        }
        Some(PathBuf::from(pre.split_whitespace().nth(4)?))
    })
}

/// An absolute path, or one relative to the cgroup2 mount; must be a
/// directory on cgroup2.
pub fn resolve(user_path: &Path) -> Result<PathBuf, CaptureError> {
    let mount = mount_point().ok_or(CaptureError::NoCgroup2)?;
    let candidates = if user_path.is_absolute() {
        vec![user_path.to_path_buf(), mount.join(user_path.strip_prefix("/").unwrap_or(user_path))]
    } else {
        vec![mount.join(user_path)]
    };
    for c in &candidates {
        if c.is_dir() && is_cgroup2(c) {
            return Ok(c.canonicalize().unwrap_or_else(|_| c.clone()));
        }
    }
    Err(CaptureError::BadCgroup { path: user_path.to_path_buf(), mount })
}

fn is_cgroup2(dir: &Path) -> bool {
    nix::sys::statfs::statfs(dir)
        .map(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
        .unwrap_or(false)
}

/// The id `bpf_get_current_cgroup_id` returns for tasks in `dir`: the
/// directory's inode number on cgroup2 (kernfs node id).
/// The cgroup v2 directory of process `pid` (its `0::` line in
/// /proc/PID/cgroup) under `mount`.
pub fn of_process(pid: u32, mount: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(mount.join(rel.trim_start_matches('/')))
}

pub fn id(dir: &Path) -> Option<u64> {
    fs::metadata(dir).ok().map(|m| m.ino())
}

/// `dir` and every cgroup below it.
pub fn subtree(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        if let Ok(rd) = fs::read_dir(&out[i]) {
            let mut kids: Vec<PathBuf> = rd
                .filter_map(|e| e.ok())
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect();
            kids.sort();
            out.extend(kids);
        }
        i += 1;
    }
    out
}

/// Threads in exactly this cgroup (`cgroup.threads`; falls back to
/// `cgroup.procs` plus each process's threads).
pub fn threads(dir: &Path) -> Vec<(u32, u32)> {
    let procs = read_list(&dir.join("cgroup.procs"));
    let mut out = Vec::new();
    for pid in procs {
        for tid in super::procfs::threads(pid) {
            out.push((pid, tid));
        }
    }
    out
}

fn read_list(path: &Path) -> Vec<u32> {
    fs::read_to_string(path)
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_hybrid_mount() {
        let info = "25 30 0:22 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
                    32 25 0:27 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw\n\
                    33 25 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n";
        assert_eq!(parse_mountinfo(info), Some(PathBuf::from("/sys/fs/cgroup/unified")));
        assert_eq!(parse_mountinfo("1 2 0:1 / / rw - ext4 /dev/vda rw\n"), None);
    }
}
