//! Bytes of files brought into a tracked process through its mappings
//! (memory-mapped datasets, safetensors, `torch.load(mmap=True)`): counted
//! where the kernel maps a file's pages on a fault, whether they come from
//! the page cache or storage.
//!
//! A read fault first maps what the page cache holds of the aligned window
//! around the address (fault-around, `filemap_map_pages`, 16 pages by
//! default), and only if that did not map the faulting page reads that one
//! (`filemap_fault`). Each such window or page counts, clipped to the end of
//! the file. A page of the window not yet read when first tried faults again
//! into the same window: the part already counted (the last window of that
//! process and file) is not counted twice, so a file touched page by page
//! counts its size whether cold or cached. Random faults that come back to an
//! older window after another may count some of its pages again.
//!
//! Nor is a range counted again for another process that gets it mapped just
//! after (the file's last 32 windows, any process's, in `FILE_WINDOWS`): the
//! kernel maps whole large folios, so workers reading neighbouring batches of
//! one table each get the folios at their batches' ends, and counted for
//! each, a table read once would add up to well more than its size. Such a
//! range counts as mapped for the process that got it mapped first, and as
//! shared for the others (which of them faults first is a race: each
//! worker's own part is its mapped and shared bytes together).
//!
//! From 6.18 a fault maps each large folio it reaches whole where it fits
//! (the tracepoint still names the window): the window is widened to the
//! folios at its ends, found in the page cache's XArray. A single-page
//! fault runs before its page is read, so its folio is looked at again at
//! the file's next fault.
//!
//! Two ways in, chosen by the agent: the `mm_filemap_map_pages` and
//! `mm_filemap_fault` tracepoints (6.11 on; the first fires only where a page
//! was mapped), else trampolines on the two functions (BTF kernels before
//! 6.11). Costs a lookup per file fault of any process, nothing for anonymous
//! memory.
use aya_ebpf::{
    macros::{fentry, raw_tracepoint},
    programs::{FEntryContext, RawTracePointContext},
};
use core::mem::MaybeUninit;

use stall_common::{zeroed_in, FileWindows, InodeBytes, InodeKey, PageCacheOffsets};

use super::{folio_pages, inode_entry, inode_key, MAPPING_ANON, PAGE_BYTES};
use crate::{
    atomic_add, config, current,
    kread::{read_u64, read_u8},
    maps::FILE_WINDOWS,
};

/// `mm_filemap_map_pages(mapping, start_index, last_index)`.
#[raw_tracepoint(tracepoint = "mm_filemap_map_pages")]
pub fn mapped_window(ctx: RawTracePointContext) -> i32 {
    count(ctx.arg(0), ctx.arg(1), ctx.arg(2), false);
    0
}

/// `mm_filemap_fault(mapping, index)`.
#[raw_tracepoint(tracepoint = "mm_filemap_fault")]
pub fn mapped_page(ctx: RawTracePointContext) -> i32 {
    let index: u64 = ctx.arg(1);
    count(ctx.arg(0), index, index, true);
    0
}

/// `filemap_map_pages(struct vm_fault *vmf, pgoff_t start, pgoff_t end)`.
#[fentry]
pub fn fentry_map_pages(ctx: FEntryContext) -> i32 {
    let vmf: u64 = ctx.arg(0);
    count(fault_mapping(vmf), ctx.arg(1), ctx.arg(2), false);
    0
}

/// `filemap_fault(struct vm_fault *vmf)`: the page at `vmf->pgoff`.
#[fentry]
pub fn fentry_filemap_fault(ctx: FEntryContext) -> i32 {
    let vmf: u64 = ctx.arg(0);
    let index = read_u64(vmf, config().page.fault_pgoff);
    count(fault_mapping(vmf), index, index, true);
    0
}

/// `vmf->vma->vm_file->f_mapping`.
#[inline(always)]
fn fault_mapping(vmf: u64) -> u64 {
    let off = config().page;
    let file = read_u64(read_u64(vmf, off.fault_vma), off.vma_file);
    if file == 0 {
        return 0;
    }
    read_u64(file, off.file_mapping)
}

/// Counts pages `first..=last` of `mapping`'s file for the current process,
/// less those past the end of the file and those of its last window.
/// `one_page`: a fault that reads its page itself (not there yet, or not
/// mapped by fault-around).
#[inline(always)]
fn count(mapping: u64, first: u64, last: u64, one_page: bool) {
    let cfg = config();
    let off = &cfg.page;
    if cfg.floor != 0 || off.mapping == 0 || mapping == 0 || mapping & MAPPING_ANON != 0 {
        return;
    }
    let Some(cur) = current(&cfg) else {
        return;
    };
    let size = read_u64(read_u64(mapping, off.host), off.size);
    let pages_in_file = size.div_ceil(PAGE_BYTES);
    let (mut first, mut stop) = (first, (last + 1).min(pages_in_file));
    if first >= stop {
        return;
    }
    let Some(key) = inode_key(cur.tgid, mapping, off) else {
        return;
    };
    let Some(e) = inode_entry(&key) else {
        return;
    };
    // SAFETY: `e` is the non-null value pointer `inode_entry` found; the map
    // is preallocated, so it stays valid memory for the program's run. Other
    // threads of the process may fault on the same file on other CPUs: the
    // byte counts are added atomically, the window fields are plain stores
    // (a race may count a window twice, never fault).
    let e = unsafe { &mut *e };
    if off.whole_folios != 0 {
        // The page a single-page fault counted alone before is in the cache
        // now: its folio was mapped whole; count the rest of it.
        if e.pending != 0 {
            let page = e.pending - 1;
            e.pending = 0;
            let (start, end) = folio_span(mapping, page, pages_in_file, off);
            add(e, start, end);
        }
        let (start, _) = folio_span(mapping, first, pages_in_file, off);
        let (_, end) = folio_span(mapping, stop - 1, pages_in_file, off);
        if one_page && (start, end) == (first, stop) {
            e.pending = first + 1;
        }
        (first, stop) = (start.min(first), end.max(stop));
    }
    // What another process (or this one) counted just before, off the ends.
    if let Some(w) = file_windows(&key) {
        // SAFETY: a non-null value pointer of the preallocated map; its
        // fields are plain stores that a race may mix (a window counted
        // twice or not at all), never a fault.
        let w = unsafe { &mut *w };
        let (lo, hi) = w.uncovered(first, stop);
        w.remember(first, stop);
        add_shared(e, lo, hi, first, stop);
        // The own last window is still what the whole range makes it.
        add_uncovered(e, lo, hi, first, stop);
        return;
    }
    add(e, first, stop);
}

/// The file's recent windows (`FILE_WINDOWS`), made if missing; None when
/// the entry cannot be made (the count is then this process's alone).
#[inline(always)]
fn file_windows(key: &InodeKey) -> Option<*mut FileWindows> {
    let file = InodeKey { tgid: 0, ..*key };
    if let Some(p) = FILE_WINDOWS.get_ptr_mut(&file) {
        return Some(p);
    }
    let mut at = MaybeUninit::<FileWindows>::uninit();
    let _ = FILE_WINDOWS.insert(&file, &*zeroed_in(&mut at), 0);
    FILE_WINDOWS.get_ptr_mut(&file)
}

/// Adds pages `[first, stop)` less those of the last window counted, and
/// makes them the last window unless they lie inside it (its other pages
/// may still fault).
#[inline(always)]
fn add(e: &mut InodeBytes, first: u64, stop: u64) {
    add_uncovered(e, first, stop, first, stop);
}

/// Counts as shared the pages of `[first, stop)` outside `[lo, hi)` (a
/// recent window of the file covered them) that are not of the process's
/// own last window (a retried fault): those another process got mapped just
/// before. Called before [`add_uncovered`] moves the last window.
#[inline(always)]
fn add_shared(e: &mut InodeBytes, lo: u64, hi: u64, first: u64, stop: u64) {
    let own = |a: u64, b: u64| b.min(e.window_stop).saturating_sub(a.max(e.window_start));
    let covered = (stop - first).saturating_sub(hi.saturating_sub(lo));
    let pages = covered.saturating_sub(own(first, stop).saturating_sub(own(lo, hi)));
    if pages > 0 {
        // SAFETY: as in `add_uncovered`: `shared` is a valid, 8-byte
        // aligned `u64` of the live map value.
        unsafe { atomic_add(&raw mut e.shared, pages * PAGE_BYTES) };
    }
}

/// [`add`] of `[first, stop)` counting only its part `[lo, hi)`.
#[inline(always)]
fn add_uncovered(e: &mut InodeBytes, lo: u64, hi: u64, first: u64, stop: u64) {
    let overlap = hi.min(e.window_stop).saturating_sub(lo.max(e.window_start));
    let pages = hi.saturating_sub(lo).saturating_sub(overlap);
    if pages > 0 {
        // SAFETY: `e` is a live reference to the map value: `mapped` is a
        // valid, 8-byte aligned `u64`.
        unsafe { atomic_add(&raw mut e.mapped, pages * PAGE_BYTES) };
    }
    if first < e.window_start || stop > e.window_stop {
        (e.window_start, e.window_stop) = (first, stop);
    }
}

/// The pages `[start, stop)` of the large folio holding `index` in the page
/// cache where it lies wholly inside the file (the kernel maps only those
/// whole); `(index, index + 1)` for a single page, a page not in the cache,
/// or one not found. Page-cache folios are aligned to their size.
#[inline(always)]
fn folio_span(mapping: u64, index: u64, pages_in_file: u64, off: &PageCacheOffsets) -> (u64, u64) {
    let single = (index, index + 1);
    let folio = folio_at(mapping, index, off);
    if folio == 0 {
        return single;
    }
    let pages = folio_pages(folio, off);
    let start = index & !(pages - 1);
    if start + pages > pages_in_file {
        return single;
    }
    (start, start + pages)
}

/// XArray internal entries: a node pointer is tagged 2 (and above 4096);
/// a sibling (the other slots of a multi-index entry) is tagged 2 and below
/// 256, its value the slot of the entry itself.
const XA_NODE_TAG: u64 = 2;
/// `XA_CHUNK_SHIFT`: 64 slots per node.
const XA_CHUNK_MASK: u64 = 63;
/// Levels walked at most: 64^5 pages (4 PiB) of a file.
const XA_MAX_DEPTH: usize = 5;

/// The folio of `mapping`'s page cache holding `index`, or 0: a walk down
/// `i_pages` as `xa_load` does it, without the RCU read lock the kernel
/// takes (a node freed under the walk reads as garbage, which the probe
/// reads tolerate: the count is then that of a single page).
#[inline(always)]
fn folio_at(mapping: u64, index: u64, off: &PageCacheOffsets) -> u64 {
    let mut entry = read_u64(mapping, off.xa_head);
    let mut depth = 0;
    while depth < XA_MAX_DEPTH && entry & 3 == XA_NODE_TAG && entry > 4096 {
        let node = entry - XA_NODE_TAG;
        let shift = u64::from(read_u8(node, off.node_shift));
        let slot = (index >> (shift & 63)) & XA_CHUNK_MASK;
        entry = read_u64(node, off.node_slots + (slot as u32) * 8);
        if entry & 3 == XA_NODE_TAG && entry < 256 {
            entry = read_u64(node, off.node_slots + ((entry >> 2) as u32 & 63) * 8);
        }
        depth += 1;
    }
    // A value entry (a shadow of an evicted page) or anything internal.
    if entry & 3 != 0 {
        return 0;
    }
    entry
}
