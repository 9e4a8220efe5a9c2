//! Page-cache fills (`mm_filemap_add_to_page_cache`): the bytes a tracked
//! process caused to be read from storage, per file, whether it read them
//! with read() or touched them through a mapping (read-ahead included).
//! The fill runs in the task that needs the data; what a write adds to the
//! cache (the data being written) is not a read and is left out: the task's
//! syscall, from its saved registers, says whether it is writing, whichever
//! syscall hooks are attached (none in the daemon's cheap tier). Costs a
//! lookup per filled folio of any process, nothing per read from cache.
mod mapped;

use core::mem::MaybeUninit;

use aya_ebpf::{macros::raw_tracepoint, programs::RawTracePointContext};
use stall_common::{counter, hook, zeroed_in, InodeBytes, InodeKey, PageCacheOffsets};

use crate::{
    atomic_add, bump, config, current, current_task,
    kread::{read_u32, read_u64, read_u8, syscall_nr},
    maps::INODE_BYTES,
    BPF_NOEXIST,
};

/// x86-64's page size.
pub(crate) const PAGE_BYTES: u64 = 4096;
/// `PAGE_MAPPING_ANON`: the mapping field of an anonymous page.
pub(crate) const MAPPING_ANON: u64 = 1;

/// `mm_filemap_add_to_page_cache(struct folio *folio)` (`struct page *`
/// before 5.16: the same first fields), on kernels with `bpf_task_pt_regs`.
#[raw_tracepoint(tracepoint = "mm_filemap_add_to_page_cache")]
pub fn page_cache_fill(ctx: RawTracePointContext) -> i32 {
    fill::<false>(&ctx)
}

/// The same where the saved registers are found from `task->stack` (see
/// `sched_switch_stack`). The agent loads one of the two.
#[raw_tracepoint(tracepoint = "mm_filemap_add_to_page_cache")]
pub fn page_cache_fill_stack(ctx: RawTracePointContext) -> i32 {
    fill::<true>(&ctx)
}

#[inline(always)]
fn fill<const STACK: bool>(ctx: &RawTracePointContext) -> i32 {
    let cfg = config();
    let off = &cfg.page;
    if cfg.floor != 0 || off.mapping == 0 {
        return 0;
    }
    let Some(cur) = current(&cfg) else {
        return 0;
    };
    // In a write: these are the pages being written.
    if cfg.tables.hook(i64::from(syscall_nr::<STACK>(current_task(), &cfg))) == hook::WRITE {
        return 0;
    }
    let folio: u64 = ctx.arg(0);
    let mapping = read_u64(folio, off.mapping);
    if mapping == 0 || mapping & MAPPING_ANON != 0 {
        return 0;
    }
    let Some(key) = inode_key(cur.tgid, mapping, off) else {
        return 0;
    };
    if let Some(e) = inode_entry(&key) {
        // SAFETY: `e` is the non-null value pointer `inode_entry` found (the
        // map is preallocated: valid memory for the program's run);
        // `storage` is an aligned `u64` that other CPUs add to atomically,
        // and no reference to it is made.
        unsafe { atomic_add(&raw mut (*e).storage, folio_pages(folio, off) * PAGE_BYTES) };
    }
    0
}

/// How many pages `folio` holds: 1, or 2^order for a large one.
#[inline(always)]
pub(crate) fn folio_pages(folio: u64, off: &PageCacheOffsets) -> u64 {
    if off.order_byte == 0 || (read_u64(folio, off.flags) >> off.head_bit) & 1 == 0 {
        return 1;
    }
    1u64 << (read_u8(folio, off.order_byte) & 31)
}

/// The file of an `address_space`, as a process's entry in `INODE_BYTES`.
#[inline(always)]
pub(crate) fn inode_key(tgid: u32, mapping: u64, off: &PageCacheOffsets) -> Option<InodeKey> {
    let inode = read_u64(mapping, off.host);
    if inode == 0 {
        return None;
    }
    Some(InodeKey { tgid, dev: read_u32(read_u64(inode, off.sb), off.dev), ino: read_u64(inode, off.ino) })
}

/// The process's entry for a file, made if missing; None (and counted as
/// lost) when the map is full.
#[inline(always)]
pub(crate) fn inode_entry(key: &InodeKey) -> Option<*mut InodeBytes> {
    if let Some(p) = INODE_BYTES.get_ptr_mut(key) {
        return Some(p);
    }
    // Another thread of the process may insert the same file at once: then
    // its entry is used.
    let mut at = MaybeUninit::<InodeBytes>::uninit();
    let _ = INODE_BYTES.insert(key, &*zeroed_in(&mut at), BPF_NOEXIST);
    let p = INODE_BYTES.get_ptr_mut(key);
    if p.is_none() {
        bump(counter::LOST_INODE_MAP);
        crate::diag::map_full(counter::LOST_INODE_MAP);
    }
    p
}
