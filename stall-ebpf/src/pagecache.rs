//! Page-cache fills (`mm_filemap_add_to_page_cache`): the bytes a tracked
//! process caused to be read from storage, per file, whether it read them
//! with read() or touched them through a mapping (read-ahead included).
//! The fill runs in the task that needs the data; what a write adds to the
//! cache (the data being written) is not a read and is left out. Costs a
//! lookup per filled folio of any process, nothing per read from cache.
use aya_ebpf::{helpers::bpf_probe_read_kernel, macros::raw_tracepoint, programs::RawTracePointContext};
use stall_common::{counter, inflight, slot_state, InodeKey};

use crate::{
    atomic_add, bump, config, current,
    maps::STORAGE,
    running,
    sched::{read_u32, read_u64},
    BPF_NOEXIST,
};

/// x86-64's page size.
const PAGE_BYTES: u64 = 4096;
/// `PAGE_MAPPING_ANON`: the mapping field of an anonymous page.
const MAPPING_ANON: u64 = 1;

/// `mm_filemap_add_to_page_cache(struct folio *folio)` (`struct page *`
/// before 5.16: the same first fields).
#[raw_tracepoint(tracepoint = "mm_filemap_add_to_page_cache")]
pub fn page_cache_fill(ctx: RawTracePointContext) -> i32 {
    let cfg = config();
    let off = &cfg.page;
    if cfg.floor != 0 || off.mapping == 0 {
        return 0;
    }
    let Some(cur) = current(&cfg) else {
        return 0;
    };
    // In a write: these are the pages being written.
    let gen = running::generation();
    let pending = match running::slot() {
        Some(s) if s.tracked == slot_state::TRACKED && s.tid == cur.tid && s.gen == gen => s.inflight,
        _ => cur.stats.inflight,
    };
    if inflight::kind(pending, gen) == inflight::WRITE {
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
