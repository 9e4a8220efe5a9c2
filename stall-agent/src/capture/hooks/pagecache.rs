//! The page cache and mappings family: page-cache fills (storage bytes
//! per file), and which way the kernel side follows faults on file mappings (bytes a
//! process takes in through `mmap`): the `mm_filemap_*` fault tracepoints
//! (6.11 on), else trampolines on the two functions they sit in, where BTF
//! and the kernel allow them, else not at all (`mmap_bytes` unknown).
use aya::{programs::RawTracePoint, Btf, Ebpf};
use stall_common::{names, PageCacheOffsets};

use super::syscalls;
use crate::capture::{btf::KernelBtf, error::load_err, object::program, tracefs::Tracefs, CaptureError};

/// (program, tracepoint), in the `filemap` category.
const TRACEPOINTS: [(&str, &str); 2] =
    [(names::MAPPED_WINDOW, "mm_filemap_map_pages"), (names::MAPPED_PAGE, "mm_filemap_fault")];

/// (program, kernel function), the same places as the tracepoints.
const TRAMPOLINES: [(&str, &str); 2] =
    [(names::FENTRY_MAP_PAGES, "filemap_map_pages"), (names::FENTRY_FILEMAP_FAULT, "filemap_fault")];

/// (program, category, tracepoint) for page-cache fills (storage bytes per
/// file); attached where the kernel's BTF has the fields it reads.
const PAGE_CACHE_FILL: (&str, &str, &str) =
    (names::PAGE_CACHE_FILL, "filemap", "mm_filemap_add_to_page_cache");

/// The page-cache fields the family reads, where the fill tracepoint is
/// there and BTF has them; the default (`mapping == 0`: not loaded) else.
pub fn offsets_here(tracefs: &Tracefs, btf: &KernelBtf) -> PageCacheOffsets {
    if tracefs.has(PAGE_CACHE_FILL.1, PAGE_CACHE_FILL.2) {
        btf.page_cache_offsets(whole_folios()).unwrap_or_default()
    } else {
        Default::default()
    }
}

/// Loads and attaches the fill program (`task_pt_regs`: the kernel has
/// `bpf_task_pt_regs`, else the variant that finds registers from the
/// stack), then the mapping faults the best way this kernel offers.
pub fn load(
    ebpf: &mut Ebpf,
    tracefs: &Tracefs,
    off: &PageCacheOffsets,
    task_pt_regs: bool,
    btf: Option<&Btf>,
) -> Result<Option<Way>, CaptureError> {
    if off.mapping != 0 {
        let (prog, _, name) = PAGE_CACHE_FILL;
        let prog = if task_pt_regs { prog } else { names::PAGE_CACHE_FILL_STACK };
        program(ebpf, prog, RawTracePoint::load)?.attach(name).map_err(load_err)?;
    }
    // Needs the page-cache fields too: None where the fill program is not attached.
    attach(ebpf, tracefs, off, btf)
}

/// How the mapping faults are followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    Tracepoints,
    Trampolines,
}

impl Way {
    /// As the JSON summary says it (`mmap_hooks`).
    pub fn name(way: Option<Way>) -> &'static str {
        match way {
            Some(Way::Tracepoints) => "tracepoint",
            Some(Way::Trampolines) => "trampoline",
            None => "none",
        }
    }
}

/// Attaches the mapping-fault programs the best way this kernel offers;
/// None where none works (which is not an error: only `mmap_bytes` is then
/// unknown). `off` must have the page-cache fields (the fill program's).
pub fn attach(
    ebpf: &mut Ebpf,
    tracefs: &Tracefs,
    off: &PageCacheOffsets,
    btf: Option<&Btf>,
) -> Result<Option<Way>, CaptureError> {
    if off.mapping == 0 || off.size == 0 {
        return Ok(None);
    }
    if TRACEPOINTS.iter().all(|(_, tp)| tracefs.has("filemap", tp)) {
        for (prog, tp) in TRACEPOINTS {
            program(ebpf, prog, RawTracePoint::load)?.attach(tp).map_err(load_err)?;
        }
        return Ok(Some(Way::Tracepoints));
    }
    let Some(btf) = btf.filter(|_| off.file_mapping != 0) else {
        return Ok(None);
    };
    // A refusal (no trampolines on this kernel, or a function traced
    // another way) leaves the counts unknown rather than ending start-up.
    Ok(syscalls::fentries(ebpf, btf, &TRAMPOLINES).ok().map(|()| Way::Trampolines))
}

/// Whether this kernel maps each large folio a fault reaches whole (where
/// it fits the mapping and its page table), not only the fault-around
/// window's part: from 6.18 on. Read from the release, as BTF does not show
/// it (the function that does it is inlined).
pub fn whole_folios() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").is_ok_and(|r| release_at_least(r.trim(), (6, 18)))
}

/// `6.18.44-fc` ≥ (6, 18).
fn release_at_least(release: &str, want: (u32, u32)) -> bool {
    let mut parts = release.split(|c: char| !c.is_ascii_digit()).map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= want
}

#[cfg(test)]
mod tests {
    use super::release_at_least;

    #[test]
    fn kernel_releases_compare_by_major_and_minor() {
        assert!(release_at_least("6.18.44-fc-v782", (6, 18)));
        assert!(release_at_least("7.0.0", (6, 18)));
        assert!(!release_at_least("6.12.57+deb13-cloud-amd64", (6, 18)));
        assert!(!release_at_least("5.10.0-35-cloud-amd64", (6, 18)));
        assert!(!release_at_least("garbage", (6, 18)));
    }
}
