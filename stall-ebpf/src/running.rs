//! The per-CPU slot (`CPU_SLOT`): which task this CPU runs and, for a tracked
//! one, its hot state (in-flight syscall, read and write counts, the last
//! descriptor read and the last written). Syscall programs work on the
//! slot alone; `sched_switch` loads it from `THREADS` when a tracked task
//! comes in and adds it back when the task goes out. A slot that does not match the running task (a missed
//! switch, or the agent changed what is tracked: `TRACK_GEN`) is looked up
//! again, so a stale slot costs a lookup, never a wrong count.
use aya_ebpf::helpers::bpf_probe_read_kernel;
use stall_common::{counter, fd_kind, inflight, slot_state, Config, CpuSlot, FdKey, FileStats, ThreadStats};

use crate::{
    atomic_add, bump_by, current, ids,
    maps::{CPU_SLOT, FILES, THREADS},
};

#[inline(always)]
pub(crate) fn slot() -> Option<&'static mut CpuSlot> {
    // SAFETY: `p` is non-null and points at this CPU's element of a per-CPU
    // array, valid memory while the map exists (no caller keeps the
    // `'static` past its run). The agent only reads it. The programs that
    // use it (scheduler, syscalls, exit) run in task context and take it once
    // per run; the one overlap is a trampoline preempted on a preemptible
    // kernel (trampolines run with migration, not preemption, disabled),
    // whose slot `sched_switch` then rewrites under it: a miscount, never a
    // fault.
    CPU_SLOT.get_ptr_mut(0).map(|p| unsafe { &mut *p })
}

/// Bumped by the agent whenever it changes `THREADS`, `FILES` or `CGROUPS`
/// itself (`stall_common::track_gen`): a slot filled under an older value
/// is looked up again. A global, alone in the object's `.bss` (the agent
/// writes it there), rather than a map: every syscall of a tracked task
/// reads it, and a global is one load where a map lookup took a dozen
/// instructions and a stack slot.
// SAFETY: no other symbol of the object is named `TRACK_GEN`; the name is
// kept so that the linker cannot merge or drop it. Mutable so that it lands
// in `.bss` (writable), not `.rodata`; no program writes it.
#[unsafe(no_mangle)]
static mut TRACK_GEN: u32 = 0;

#[inline(always)]
pub(crate) fn generation() -> u32 {
    // SAFETY: an aligned `u32` that only the agent writes (a 4-byte store):
    // the volatile read keeps the compiler from folding the zero it sees.
    unsafe { core::ptr::read_volatile(&raw const TRACK_GEN) }
}

/// The slot of the current task if it is tracked, looked up again if it
/// was filled for another task or an older generation. `regs` is the
/// raw syscall tracepoint's register pointer (see `CpuSlot::regs`).
#[inline(always)]
pub(crate) fn tracked_slot(cfg: &Config, regs: u64) -> Option<&'static mut CpuSlot> {
    let s = slot()?;
    let gen = generation();
    if s.regs != regs || s.gen != gen || s.tracked == slot_state::UNCHECKED {
        let (tid, _) = ids();
        if s.tid != tid || s.gen != gen || s.tracked == slot_state::UNCHECKED {
            refill(s, tid, gen, cfg);
        }
        s.regs = regs;
        if s.tracked == slot_state::TRACKED {
            // Once per thread where its syscalls come from 64-bit code (its
            // entry keeps the registers, `ThreadStats::regs`), else once per
            // span: a compat (ia32) task numbers its syscalls differently.
            // SAFETY: bpf_probe_read_kernel checks the address (the saved
            // registers the tracepoint or trampoline passed); a fault returns
            // an error, read as 0, never a crash. Any 2 bytes are a `u16`.
            let cs: u16 =
                unsafe { bpf_probe_read_kernel((regs + u64::from(cfg.regs.cs)) as *const u16) }.unwrap_or(0);
            s.native = u8::from(cs == cfg.regs.user_cs);
        }
    }
    if s.tracked == slot_state::TRACKED && s.native != 0 {
        Some(s)
    } else {
        None
    }
}

#[inline(always)]
fn refill(s: &mut CpuSlot, tid: u32, gen: u32, cfg: &Config) {
    if s.tracked == slot_state::TRACKED {
        flush(s);
    }
    match current(cfg) {
        Some(c) => s.load_thread(tid, c.tgid, gen, c.stats),
        None => set_untracked(s, tid, gen, slot_state::UNTRACKED),
    }
}

#[inline(always)]
pub(crate) fn set_untracked(s: &mut CpuSlot, tid: u32, gen: u32, state: u8) {
    s.tid = tid;
    s.regs = 0;
    s.gen = gen;
    s.tracked = state;
    s.file_fd = -1;
    s.write_fd = -1;
}

/// Adds the slot's pending state to its thread (looked up) and file.
#[inline(always)]
pub(crate) fn flush(s: &mut CpuSlot) {
    match THREADS.get_ptr_mut(s.tid) {
        // SAFETY: the non-null value pointer of the slot thread's `THREADS`
        // entry, valid for the program's run; see `crate::tracked`.
        Some(t) => flush_into(s, unsafe { &mut *t }),
        None => {
            // The thread is gone (exit removed it): only its file counts remain.
            flush_events(s);
            flush_files(s);
            s.tracked = slot_state::UNTRACKED;
        }
    }
}

/// Adds the slot's pending state to `t`, the slot task's `THREADS` entry.
#[inline(always)]
pub(crate) fn flush_into(s: &mut CpuSlot, t: &mut ThreadStats) {
    t.inflight = s.inflight;
    t.inflight_fd = s.inflight_fd;
    t.inflight_kind = s.inflight_kind;
    t.inflight_ts = s.inflight_ts;
    t.inflight_ptr = s.inflight_ptr;
    // The registers are the thread's only where its syscalls were seen to
    // come from 64-bit code (`tracked_slot`).
    t.regs = if s.native != 0 { s.regs } else { 0 };
    // Counts move only in a syscall return that counts itself in `events`:
    // a thread that made no hooked call since its switch-in (a futex or
    // poll waiter) has nothing to add.
    if s.events != 0 {
        t.add_slot_counts(s);
        s.clear_thread_counts();
        flush_events(s);
        flush_files(s);
    }
}

/// Adds the pending program runs to the per-CPU `counter::EVENTS`.
#[inline(always)]
fn flush_events(s: &mut CpuSlot) {
    if s.events != 0 {
        bump_by(counter::EVENTS, s.events);
        s.events = 0;
    }
}

/// Adds the pending per-file counts of both cached descriptors to `FILES`.
#[inline(always)]
fn flush_files(s: &mut CpuSlot) {
    flush_file(s);
    flush_write_file(s);
}

/// The `FILES` entry of `(tgid, fd)` if it still names the open `file_id`
/// (another thread may have closed and reused the number meanwhile: the
/// counts pending for it then lose their file, not their bytes).
#[inline(always)]
fn same_open(tgid: u32, fd: i32, file_id: u64) -> Option<&'static mut FileStats> {
    let f = FILES.get_ptr_mut(FdKey { tgid, fd })?;
    // SAFETY: the non-null value pointer of a `FILES` entry; the map is
    // preallocated, so it stays valid memory for the program's run even if
    // another thread closes the descriptor meanwhile (a recycled element: a
    // miscount, never a fault). Other CPUs write the same entry only
    // through `atomic_add`, as the callers do.
    let f = unsafe { &mut *f };
    (f.file_id == file_id).then_some(f)
}

/// Adds the pending read counts of the cached descriptor to `FILES`.
#[inline(always)]
pub(crate) fn flush_file(s: &mut CpuSlot) {
    if s.file_calls == 0 {
        return;
    }
    if let Some(f) = same_open(s.tgid, s.file_fd, s.file_id) {
        // Threads of one process share descriptors: add atomically.
        // SAFETY: `p` is a `&mut u64` field of the entry: valid and
        // 8-byte aligned.
        f.add_slot_file_with(s, |p, v| unsafe { atomic_add(p, v) });
    }
    s.clear_file_counts();
}

/// Adds the pending write counts of the cached written descriptor to `FILES`.
#[inline(always)]
fn flush_write_file(s: &mut CpuSlot) {
    if s.write_calls == 0 {
        return;
    }
    if let Some(f) = same_open(s.tgid, s.write_fd, s.write_file_id) {
        // SAFETY: as in `flush_file`.
        f.add_slot_writes_with(s, |p, v| unsafe { atomic_add(p, v) });
    }
    s.clear_write_counts();
}

/// What `fd` of `tgid` is (its file id and `FileStats::kind`), from
/// `FILES`; not followed (`fd_kind::OTHER`) when it has no entry.
#[inline(always)]
fn identify(tgid: u32, fd: i32) -> (u64, u32) {
    // SAFETY: `get` is unsafe because another CPU may change or delete the
    // entry while the reference lives (a preallocated element can be
    // reused); two fields are copied at once, stale values at worst.
    match unsafe { FILES.get(FdKey { tgid, fd }) } {
        Some(f) => (f.file_id, f.kind),
        None => (0, fd_kind::OTHER),
    }
}

/// Makes `fd` the slot's cached descriptor: what it is, from `FILES`.
#[inline(always)]
pub(crate) fn cache_fd(s: &mut CpuSlot, fd: i32) {
    flush_file(s);
    s.file_fd = fd;
    (s.file_id, s.file_kind) = identify(s.tgid, fd);
}

/// Makes `fd` the slot's cached written descriptor.
#[inline(always)]
fn cache_write_fd(s: &mut CpuSlot, fd: i32) {
    flush_write_file(s);
    s.write_fd = fd;
    (s.write_file_id, s.write_kind) = identify(s.tgid, fd);
}

/// Forgets `fd` where it is cached (it is being closed or replaced).
#[inline(always)]
pub(crate) fn uncache_fd(s: &mut CpuSlot, fd: i32) {
    if s.file_fd == fd {
        flush_file(s);
        s.file_fd = -1;
    }
    if s.write_fd == fd {
        flush_write_file(s);
        s.write_fd = -1;
    }
}

/// Whether the read starting now is timed, and if so for how many reads it
/// stands: a random one in `mask + 1` (xorshift32 in the slot: no helper
/// call), the mask by the calls made since the thread came on-CPU
/// (`Config::read_sample_mask`).
#[inline(always)]
pub(crate) fn time_this_read(s: &mut CpuSlot, cfg: &Config) -> Option<u32> {
    let mut x = s.rng;
    if x == 0 {
        x = 0x9e37_79b9 ^ s.tid;
    }
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    s.rng = x;
    let mask = u32::from(cfg.read_sample_mask(s.events));
    (x & mask == 0).then_some(mask + 1)
}

/// Counts one finished read on the slot; `timed` is, if it was timed, its
/// duration and the reads it stands for.
#[inline(always)]
pub(crate) fn count_read(s: &mut CpuSlot, bytes: u64, timed: Option<(u64, u32)>) {
    let fd = s.inflight_fd;
    s.inflight = inflight::NONE;
    if s.file_fd != fd {
        cache_fd(s, fd);
    }
    // Files and connected sockets are counted per descriptor; only files'
    // bytes are file throughput.
    if s.file_kind != fd_kind::OTHER {
        s.file_bytes += bytes;
        s.file_calls += 1;
        if let Some((ns, weight)) = timed {
            s.file_ns += ns * u64::from(weight);
            s.file_timed += u64::from(weight);
        }
    }
    if fd_kind::is_file(s.file_kind) {
        s.file_read_bytes += bytes;
        s.file_read_calls += 1;
    } else {
        s.other_read_bytes += bytes;
        s.other_read_calls += 1;
    }
}

/// Applies `add` to the `FILES` entry of `fd` if it is followed per
/// descriptor (a file or a connected socket, not a pipe or terminal);
/// whether it names a file. Threads of one process share descriptors, and
/// completions run anywhere: `add` adds atomically.
#[inline(always)]
pub(crate) fn add_to_file(tgid: u32, fd: i32, add: impl FnOnce(&mut FileStats)) -> bool {
    match FILES.get_ptr_mut(FdKey { tgid, fd }) {
        Some(f) => {
            // SAFETY: the non-null value pointer of a `FILES` entry, valid
            // for the program's run (see `flush_file`); `add` writes it only
            // atomically, other threads and completions too.
            let f = unsafe { &mut *f };
            if f.kind != fd_kind::OTHER {
                add(f);
            }
            fd_kind::is_file(f.kind)
        }
        None => false,
    }
}

/// Counts one finished write-family call on the slot, for its thread and,
/// if the descriptor is followed, its file (through the written
/// descriptor's cache, apart from the read one); failed ones (`bytes` 0)
/// not at all.
#[inline(always)]
pub(crate) fn count_write(s: &mut CpuSlot, bytes: u64) {
    let fd = s.inflight_fd;
    s.inflight = inflight::NONE;
    if bytes == 0 {
        return;
    }
    if fd == 1 || fd == 2 {
        s.stdio_write_bytes += bytes;
    }
    if s.write_fd != fd {
        cache_write_fd(s, fd);
    }
    if s.write_kind != fd_kind::OTHER {
        s.write_bytes += bytes;
        s.write_calls += 1;
    }
    if fd_kind::is_file(s.write_kind) {
        s.file_write_bytes += bytes;
        s.file_write_calls += 1;
    } else {
        s.other_write_bytes += bytes;
        s.other_write_calls += 1;
    }
}
