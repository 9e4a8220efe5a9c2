//! Per-descriptor and per-file state: the `FILES` map (descriptors of
//! tracked processes, with their read and write counters), the syscall in
//! flight between enter and exit, and `INODE_BYTES` (what a process took of
//! a file outside its read calls).

use crate::{track_gen, CpuSlot};

/// What a tracked descriptor is; set by the agent after it has looked at it.
pub mod fd_kind {
    /// Opened with openat, not yet classified: counted as a file.
    pub const UNKNOWN: u32 = 0;
    pub const REGULAR: u32 = 1;
    /// FIFO, socket, device, eventfd...: never file throughput.
    pub const OTHER: u32 = 2;
    /// An inet socket the job connected (to the peer its `OpenEvent` names):
    /// counted per descriptor like a file, but network traffic, never file
    /// throughput.
    pub const SOCKET: u32 = 3;

    /// Whether reads and writes of a descriptor of kind `k` are file I/O.
    #[inline(always)]
    pub fn is_file(k: u32) -> bool {
        k == UNKNOWN || k == REGULAR
    }
}

/// In-flight syscall kinds recorded at sys_enter for use at sys_exit.
///
/// The kind is the low byte; the bits above hold the hooks epoch of
/// `TRACK_GEN` it was recorded in ([`track_gen`]). The syscall hooks can be
/// detached and attached again (the daemon's tiers): an entry recorded
/// before a detach never sees its exit, and must not pair with the exit of
/// some later, unhooked syscall.
pub mod inflight {
    pub const NONE: u32 = 0;
    pub const READ: u32 = 1;
    pub const OPEN: u32 = 2;
    /// write-family: counted at exit, on the slot (`CpuSlot::write_fd`).
    pub const WRITE: u32 = 3;
    /// dup-family: the returned descriptor names the same open as
    /// `inflight_fd`.
    pub const DUP: u32 = 4;
    /// connect: `inflight_ptr` is the peer's address (user memory).
    pub const CONNECT: u32 = 5;
    /// `inflight_fd` of a read or write whose descriptor is taken from the
    /// saved registers when it is needed (at its return, or when it
    /// blocks), not at its entry: one register read per call instead of two.
    pub const FD_IN_REGS: i32 = i32::MIN;
    const KIND_MASK: u32 = 0xff;

    /// `kind` as recorded under `gen` (a `TRACK_GEN` value).
    #[inline(always)]
    pub fn tag(kind: u32, gen: u32) -> u32 {
        kind | (super::track_gen::epoch(gen) << 8)
    }

    /// The kind of a `tag`ged entry if it was recorded in the epoch of
    /// `gen`, else `NONE`.
    #[inline(always)]
    pub fn kind(tagged: u32, gen: u32) -> u32 {
        if tagged >> 8 == super::track_gen::epoch(gen) {
            tagged & KIND_MASK
        } else {
            NONE
        }
    }
}

/// Key of the `FILES` map: one open descriptor of one process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FdKey {
    pub tgid: u32,
    pub fd: i32,
}

/// Value of the `FILES` map. `file_id` names one open(); a reused fd number
/// gets a new id, so bytes never land on the file that had the number before.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FileStats {
    pub file_id: u64,
    pub read_bytes: u64,
    pub read_calls: u64,
    /// Time in reads, estimated from the timed ones: a read is timed at
    /// random, one in `Config::latency_mask + 1` (one in
    /// `latency_run_mask + 1` in a long on-CPU run of calls: the clock
    /// costs more than the rest of a read's accounting), and counts its
    /// time and itself once for every read it stands for. `timed_calls` is
    /// the reads the timed ones stand for; `read_ns / timed_calls`, their
    /// mean, is unbiased.
    pub read_ns: u64,
    pub timed_calls: u64,
    /// Successful write-family calls on this descriptor, and their bytes.
    pub write_bytes: u64,
    pub write_calls: u64,
    pub kind: u32,
    pub _pad: u32,
}

// SAFETY: integers only (checked by `layouts_have_no_hidden_padding`),
// 8-aligned by its `u64` fields, 64 bytes.
unsafe impl crate::Plain for FileStats {}

impl FileStats {
    /// Adds the per-file counts a CPU slot (`CPU_SLOT`) holds for its cached
    /// descriptor (`CpuSlot::file_fd`, if it is still `file_id`), each
    /// through `add`: the kernel side adds atomically when it flushes the
    /// slot (threads of one process share descriptors), the agent plainly
    /// when it reads one.
    #[inline(always)]
    pub fn add_slot_file_with(&mut self, s: &CpuSlot, mut add: impl FnMut(&mut u64, u64)) {
        add(&mut self.read_bytes, s.file_bytes);
        add(&mut self.read_calls, s.file_calls);
        add(&mut self.read_ns, s.file_ns);
        add(&mut self.timed_calls, s.file_timed);
    }

    /// [`FileStats::add_slot_file_with`] with plain additions.
    #[inline(always)]
    pub fn add_slot_file(&mut self, s: &CpuSlot) {
        self.add_slot_file_with(s, |a, v| *a += v);
    }

    /// Adds the write counts a CPU slot holds for its cached written
    /// descriptor (`CpuSlot::write_fd`, if it is still `write_file_id`),
    /// through `add` as in [`FileStats::add_slot_file_with`].
    #[inline(always)]
    pub fn add_slot_writes_with(&mut self, s: &CpuSlot, mut add: impl FnMut(&mut u64, u64)) {
        add(&mut self.write_bytes, s.write_bytes);
        add(&mut self.write_calls, s.write_calls);
    }

    /// [`FileStats::add_slot_writes_with`] with plain additions.
    #[inline(always)]
    pub fn add_slot_writes(&mut self, s: &CpuSlot) {
        self.add_slot_writes_with(s, |a, v| *a += v);
    }
}

/// Key of the `INODE_BYTES` map: one file (the kernel's device and inode
/// number, as the page cache knows it) read by one process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct InodeKey {
    pub tgid: u32,
    /// The kernel's `dev_t`: major << 20 | minor.
    pub dev: u32,
    pub ino: u64,
}

/// Value of the `INODE_BYTES` map: what one process took of one file
/// outside its read calls, cumulative.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InodeBytes {
    /// Bytes it caused to be read from storage (page-cache fills by its
    /// reads, its faults and their read-ahead).
    pub storage: u64,
    /// Bytes its faults mapped into it from the file (fault-around windows
    /// and single-page faults, from the page cache or storage).
    pub mapped: u64,
    /// Bytes its faults mapped that another process got mapped from the
    /// file just before (counted in that one's `mapped`, not in this one's).
    pub shared: u64,
    /// The page range `[window_start, window_stop)` counted last for this
    /// file: a fault that retries pages of it (not yet read when first
    /// tried) does not count them again. Zeroed: none.
    pub window_start: u64,
    pub window_stop: u64,
    /// 1 + the page a single-page fault counted alone where the kernel maps
    /// whole folios: the page was not in the cache yet, so its folio's other
    /// pages are counted at the file's next fault; 0: none.
    pub pending: u64,
}

// SAFETY: integers only (checked by `layouts_have_no_hidden_padding`),
// 8-aligned by its `u64` fields, 48 bytes.
unsafe impl crate::Plain for InodeBytes {}

/// How many windows [`FileWindows`] remembers per file.
pub const FILE_WINDOW_SLOTS: usize = 32;

/// Value of the `FILE_WINDOWS` map (keyed by an [`InodeKey`] of tgid 0): the
/// page ranges last counted as mapped from one file, by any process. Where
/// the kernel maps whole large folios (6.18 on), processes reading
/// neighbouring parts of one file (DataLoader workers taking consecutive
/// batches of a table they share) each get the folios their parts share
/// mapped: counted for each, a file read once would add up to more than its
/// size. A range another process counted just before is counted once.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileWindows {
    /// Where the next window goes (a count; its slot is modulo the length).
    pub next: u64,
    /// `start << 24 | pages` of each window (a page index up to 2^40, up to
    /// 2^24 pages); 0: none.
    pub windows: [u64; FILE_WINDOW_SLOTS],
}

impl Default for FileWindows {
    fn default() -> Self {
        Self { next: 0, windows: [0; FILE_WINDOW_SLOTS] }
    }
}

const WINDOW_PAGE_BITS: u32 = 24;

impl FileWindows {
    /// `[first, stop)` less the pages at either end that a remembered window
    /// covers (one inside it, leaving pages on both sides, is kept: windows
    /// meet the ranges of other processes at their ends). One pass, in the
    /// order of the slots: enough for ranges counted in ascending order.
    /// Without a branch: the verifier would follow every way through each
    /// window, and did, for seconds at every load.
    #[inline(always)]
    pub fn uncovered(&self, first: u64, stop: u64) -> (u64, u64) {
        // 1 where `a < b`, for page indices (below 2^40: no wrap past 2^63).
        let below = |a: u64, b: u64| a.wrapping_sub(b) >> 63;
        let (mut lo, mut hi) = (first, stop);
        for w in self.windows.iter() {
            let start = w >> WINDOW_PAGE_BITS;
            let end = start + (w & ((1 << WINDOW_PAGE_BITS) - 1));
            // start <= lo < end: the window covers the range's head.
            let head = (1 ^ below(lo, start)) & below(lo, end);
            lo = lo.wrapping_add(head * end.wrapping_sub(lo));
            // start < hi <= end: it covers the tail.
            let tail = (1 ^ head) & below(start, hi) & (1 ^ below(end, hi));
            hi = hi.wrapping_sub(tail * hi.wrapping_sub(start));
        }
        // hi < lo: all of it was covered.
        hi = hi.wrapping_add(below(hi, lo) * lo.wrapping_sub(hi));
        (lo, hi)
    }

    /// Remembers `[first, stop)` in place of the oldest window.
    #[inline(always)]
    pub fn remember(&mut self, first: u64, stop: u64) {
        let pages = stop.saturating_sub(first).min((1 << WINDOW_PAGE_BITS) - 1);
        if pages == 0 || first >= 1 << 40 {
            return;
        }
        let slot = (self.next as usize) % FILE_WINDOW_SLOTS;
        self.windows[slot] = first << WINDOW_PAGE_BITS | pages;
        self.next = self.next.wrapping_add(1);
    }
}

// SAFETY: integers only, 8-aligned, 8 + 8 × FILE_WINDOW_SLOTS bytes.
unsafe impl crate::Plain for FileWindows {}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: all these are repr(C), Copy, and have no implicit padding.
    unsafe impl aya::Pod for FdKey {}
    unsafe impl aya::Pod for FileStats {}
    unsafe impl aya::Pod for InodeKey {}
    unsafe impl aya::Pod for InodeBytes {}
    unsafe impl aya::Pod for FileWindows {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn a_window_another_process_counted_is_trimmed_off_the_ends() {
        let mut w = FileWindows::default();
        assert_eq!(w.uncovered(10, 20), (10, 20), "nothing remembered");
        w.remember(0, 16);
        assert_eq!(w.uncovered(8, 40), (16, 40), "its head was counted");
        assert_eq!(w.uncovered(4, 12), (16, 16), "all of it was");
        w.remember(32, 48);
        assert_eq!(w.uncovered(8, 40), (16, 32), "both ends");
        assert_eq!(w.uncovered(100, 116), (100, 116), "elsewhere");
        // One inside the range is not taken off: the range is kept whole.
        assert_eq!(w.uncovered(60, 80), (60, 80));
        w.remember(64, 68);
        assert_eq!(w.uncovered(60, 80), (60, 80));
    }

    #[test]
    fn windows_chain_in_order_and_the_oldest_is_forgotten() {
        let mut w = FileWindows::default();
        w.remember(0, 16);
        w.remember(16, 32);
        assert_eq!(w.uncovered(0, 40), (32, 40));
        for i in 0..FILE_WINDOW_SLOTS as u64 {
            w.remember(1000 + 16 * i, 1016 + 16 * i);
        }
        assert_eq!(w.uncovered(0, 40), (0, 40), "forgotten after FILE_WINDOW_SLOTS more");
        assert_eq!(size_of::<FileWindows>(), 8 + 8 * FILE_WINDOW_SLOTS);
    }

    #[test]
    fn slot_file_counts_add_every_field() {
        let s = CpuSlot { file_bytes: 100, file_calls: 3, file_ns: 50, file_timed: 1, ..Default::default() };
        let mut f =
            FileStats { read_bytes: 1, read_calls: 1, read_ns: 1, timed_calls: 1, ..Default::default() };
        f.add_slot_file(&s);
        assert_eq!((f.read_bytes, f.read_calls, f.read_ns, f.timed_calls), (101, 4, 51, 2));
    }

    // Sizes are fixed so a change on one side cannot silently desync the other.
    #[test]
    fn layouts_have_no_hidden_padding() {
        assert_eq!(size_of::<FdKey>(), 8);
        assert_eq!(size_of::<FileStats>(), 64);
        assert_eq!(size_of::<InodeKey>(), 16);
        assert_eq!(size_of::<InodeBytes>(), 48);
    }
}
