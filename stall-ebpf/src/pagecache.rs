//! Page-cache fills (`mm_filemap_add_to_page_cache`): the bytes a tracked
//! process caused to be read from storage, per file, whether it read them
//! with read() or touched them through a mapping (read-ahead included).
//! The fill runs in the task that needs the data; what a write adds to the
//! cache (the data being written) is not a read and is left out: the task's
//! syscall, from its saved registers, says whether it is writing, whichever
//! syscall hooks are attached (none in the daemon's cheap tier). Costs a
//! lookup per filled folio of any process, nothing per read from cache.
use aya_ebpf::{helpers::bpf_probe_read_kernel, macros::raw_tracepoint, programs::RawTracePointContext};
use stall_common::{counter, hook, InodeKey};

use crate::{
    atomic_add, bump, config, current,
    maps::STORAGE,
    sched::{current_task, read_u32, read_u64, syscall_nr},
    syscalls::hook_of,
    BPF_NOEXIST,
};

/// x86-64's page size.
const PAGE_BYTES: u64 = 4096;
/// `PAGE_MAPPING_ANON`: the mapping field of an anonymous page.
const MAPPING_ANON: u64 = 1;

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
    if hook_of(i64::from(syscall_nr::<STACK>(current_task(), &cfg))) == hook::WRITE {
        return 0;
    }
    let folio: u64 = ctx.arg(0);
    let mapping = read_u64(folio, off.mapping);
    if mapping == 0 || mapping & MAPPING_ANON != 0 {
        return 0;
    }
    let inode = read_u64(mapping, off.host);
    if inode == 0 {
        return 0;
    }
    let key = InodeKey {
        tgid: cur.tgid,
        dev: read_u32(read_u64(inode, off.sb), off.dev),
        ino: read_u64(inode, off.ino),
    };
    let mut pages = 1;
    if off.order_byte != 0 && (read_u64(folio, off.flags) >> off.head_bit) & 1 != 0 {
        let order =
            unsafe { bpf_probe_read_kernel((folio + u64::from(off.order_byte)) as *const u8) }.unwrap_or(0);
        pages = 1u64 << (order & 31);
    }
    let bytes = pages * PAGE_BYTES;
    if let Some(p) = STORAGE.get_ptr_mut(key) {
        unsafe { atomic_add(p, bytes) };
        return 0;
    }
    // Another thread of the process may insert the same file at once: then
    // add to its entry.
    if STORAGE.insert(key, bytes, BPF_NOEXIST).is_err() {
        match STORAGE.get_ptr_mut(key) {
            Some(p) => unsafe { atomic_add(p, bytes) },
            None => bump(counter::LOST_INODE_MAP),
        }
    }
    0
}
