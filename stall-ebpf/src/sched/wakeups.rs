//! `sched_waking`: who wakes a tracked thread (`WAKES`, per process in
//! `WAKES_BY_PROC` once full), and when, unless the switch-in takes its
//! wait for a CPU from the kernel.
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_kernel},
    macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use stall_common::{
    counter, kfunc, reason, run_state, syscall_class, Config, ThreadStats, WakeCache, WakeKey, WakeStats,
    WAIT_NOTED, WAKER_ANY_THREAD, WAKER_SIGNAL, WAKE_CACHE_SLOTS, WOKEN_UNTIMED,
};

use super::thread_of;
use crate::{
    atomic_add, bump, config, current_comm,
    kread::read_u64,
    maps::{WAKES, WAKES_BY_PROC, WAKE_CACHE},
    now, running, untracked,
};

/// How a wakeup is noted in its wakee's entry (`wake_ts`).
const TIMED: u8 = 0;
const MARKED: u8 = 1;
const CHECKED: u8 = 2;

/// `sched_waking(struct task_struct *p)`.
#[raw_tracepoint(tracepoint = "sched_waking")]
pub fn sched_waking(ctx: RawTracePointContext) -> i32 {
    waking::<TIMED>(&ctx)
}

/// Beside `sched_switch_queued`, which takes a woken task's wait for a CPU
/// from the kernel: the wakeup is marked (`WOKEN_UNTIMED`), not timed, and
/// the clock read that costs as much as the rest of a wakeup is saved.
#[raw_tracepoint(tracepoint = "sched_waking")]
pub fn sched_waking_marked(ctx: RawTracePointContext) -> i32 {
    waking::<MARKED>(&ctx)
}

/// `sched_waking_marked` where EEVDF delays dequeues
/// (`task_flags::DELAYED_DEQUEUE`): a blocked task still queued that was
/// migrated meanwhile was enqueued then, and this wakeup will not set its
/// `last_queued` again. The wakee's `last_queued`, read by a plain load
/// through `bpf_rdonly_cast` (the agent rewrites the placeholders), says
/// so: 0, this wakeup's enqueue will set it, and the wakeup is marked;
/// set, the wakeup is timed by the clock.
#[raw_tracepoint(tracepoint = "sched_waking")]
pub fn sched_waking_checked(ctx: RawTracePointContext) -> i32 {
    waking::<CHECKED>(&ctx)
}

#[inline(always)]
fn waking<const HOW: u8>(ctx: &RawTracePointContext) -> i32 {
    let cfg = config();
    if cfg.floor != 0 {
        return 0;
    }
    let task: u64 = ctx.arg(0);
    let Some((wakee, Some(p))) = thread_of(task, untracked::generations(running::generation()), cfg) else {
        return 0;
    };
    // SAFETY: the non-null value pointer of the wakee's `THREADS` entry,
    // valid for the program's run (see `crate::tracked`). The wakee may be
    // switching on another CPU at this moment: `sched_switch` there writes
    // the same entry, so a racing wakeup may be misattributed, never a fault.
    let t = unsafe { &mut *p };
    if t.state != run_state::OFF || t.wake_ts != 0 || t.off_reason == reason::RUNQUEUE {
        return 0;
    }
    bump(counter::EVENTS);
    t.wake_ts = match HOW {
        MARKED => WOKEN_UNTIMED,
        CHECKED if enqueued_before(task, cfg) == 0 => WOKEN_UNTIMED,
        _ => now(),
    };
    t.wakeups += 1;
    // The waker is whoever runs now, unless this is interrupt context (a
    // device, a timer, the network's softirq): the wakeup is the kernel's
    // then, not the interrupted task's.
    let waker_nr = waker_syscall::<HOW>(cfg);
    let pid_tgid = if waker_nr.is_none() { 0 } else { bpf_get_current_pid_tgid() };
    let waker_tgid = (pid_tgid >> 32) as u32;
    // A signal, or its own process's exit killing it, interrupts the wait:
    // nobody handed it what it waited for, and no pair is counted (a
    // deadlocked job ended by `kill`, or by `os._exit` from a watchdog
    // thread, was otherwise "waiting for" its killer all along).
    let interrupted = match waker_nr.map(|nr| cfg.tables.class(i64::from(nr))) {
        Some(syscall_class::SIGNAL) => true,
        Some(syscall_class::EXIT_GROUP) => waker_tgid == t.tgid,
        _ => false,
    };
    let key = WakeKey { wakee, waker: if interrupted { WAKER_SIGNAL } else { pid_tgid as u32 } };
    if t.waited_by & !WAIT_NOTED != key.waker {
        flush_waited(t, wakee);
        t.waited_by_tgid = waker_tgid;
    }
    t.waited_by = key.waker | WAIT_NOTED;
    if interrupted {
        return 0;
    }
    // SAFETY: this CPU's element of a per-CPU array, valid memory for the
    // program's run. Besides this program only the agent writes it (to
    // clear gone pairs); that, or a wakeup in an interrupt nested in this
    // run (kernels that do not skip nested runs), may lose a count, never
    // fault.
    let mut cache = WAKE_CACHE.get_ptr_mut(wakee & (WAKE_CACHE_SLOTS - 1)).map(|c| unsafe { &mut *c });
    if let Some(c) = cache.as_deref_mut() {
        if c.key == key {
            c.pending += 1;
            return 0;
        }
        flush_wakes(c);
    }
    if add_to_pair(key, 1) {
        // Its next wakeups by the same waker are counted in the cache.
        if let Some(c) = cache {
            c.key = key;
        }
        return 0;
    }
    // Waker 0 (an interrupt) keeps the interrupted task's name here; the
    // agent names it.
    let fresh = WakeStats { count: 1, blocked_ns: 0, waker_tgid, _pad: 0, waker_comm: current_comm() };
    if WAKES.insert(key, fresh, 0).is_ok() {
        return 0;
    }
    // Full (a thousand threads waking one another): count it per process.
    let key = WakeKey { wakee, waker: waker_tgid | WAKER_ANY_THREAD };
    if let Some(w) = WAKES_BY_PROC.get_ptr_mut(key) {
        // SAFETY: as in `add_to_pair`: a non-null, preallocated value
        // pointer; `count` is an aligned `u64` only ever added to atomically.
        unsafe { atomic_add(&mut (*w).count, 1) };
    } else if WAKES_BY_PROC.insert(key, fresh, 0).is_err() {
        bump(counter::LOST_WAKE_MAP);
        crate::diag::map_full(counter::LOST_WAKE_MAP);
    }
    0
}

/// The syscall the waker (the current task) is in — -1 where it is in
/// none, or its registers are unknown — or None in interrupt context (a
/// device, a timer, the network's softirq). x86-64 runs an interrupt that came while the CPU ran
/// kernel code (a syscall, the idle loop) on a stack of its own, outside
/// the current task's (`stack` up to its saved user registers); one that
/// came from user mode on the task's own stack, then empty, whose saved
/// registers are the interrupted program's — where a syscall's hold
/// `-ENOSYS` in `ax` until it returns. `CHECKED` (6.12 on, the placeholders
/// rewritten) reads them by plain loads; the others with two probe reads.
/// The syscall's number (`orig_ax`) lies between the two.
#[inline(always)]
fn waker_syscall<const HOW: u8>(cfg: &Config) -> Option<i32> {
    const ENOSYS: u64 = 38;
    let task = crate::current_task();
    let base = if HOW == CHECKED {
        let at = crate::rdonly_cast(task, kfunc::TASK_STRUCT_TYPE);
        // SAFETY: as in `enqueued_before`: a fault-safe load the verifier
        // checks against `struct task_struct` (`stack`, 8 bytes, at an offset
        // the agent took from the kernel's BTF); a fault reads 0.
        unsafe { core::ptr::read_volatile(at.add(cfg.task.stack as usize) as *const u64) }
    } else {
        read_u64(task, cfg.task.stack)
    };
    if base == 0 {
        return Some(-1);
    }
    let regs = base + u64::from(cfg.task.regs_in_stack);
    let mark = 0u8;
    // The address of a slot of this frame: compared, never dereferenced
    // (comparing a stack pointer needs CAP_PERFMON, which stall has).
    let here = core::hint::black_box(core::ptr::addr_of!(mark)) as u64;
    if here < base || here >= regs {
        return None;
    }
    let (ax, nr, cs) = if HOW == CHECKED {
        let at = crate::rdonly_cast(regs, kfunc::PT_REGS_TYPE);
        // SAFETY: fault-safe loads checked against `struct pt_regs` at
        // x86-64's offsets of `ax`, `orig_ax` and `cs`; any 8 bytes are a
        // `u64`.
        unsafe {
            (
                core::ptr::read_volatile(at.add(kfunc::X86_64_AX) as *const u64),
                core::ptr::read_volatile(at.add(kfunc::X86_64_NR) as *const u64),
                core::ptr::read_volatile(at.add(kfunc::X86_64_CS) as *const u64),
            )
        }
    } else {
        const WORDS: usize = (kfunc::X86_64_CS - kfunc::X86_64_AX) / 8 + 1;
        // SAFETY: as in `read_u8`: the helper checks the address, a fault
        // reads as 0; any 64 bytes are eight `u64`s.
        let w = unsafe { bpf_probe_read_kernel((regs + kfunc::X86_64_AX as u64) as *const [u64; WORDS]) }
            .unwrap_or([0; WORDS]);
        (w[0], w[(kfunc::X86_64_NR - kfunc::X86_64_AX) / 8], w[WORDS - 1])
    };
    if cs & 3 == 3 && ax != ENOSYS.wrapping_neg() {
        return None;
    }
    Some(if cs & 3 == 3 { nr as i32 } else { -1 })
}

/// The `sched_info.last_queued` of the task at `task` (not the current one),
/// by a plain load through `bpf_rdonly_cast`: 0 unless it was enqueued
/// since it last ran (or the load faulted).
#[inline(always)]
fn enqueued_before(task: u64, cfg: &Config) -> u64 {
    let at = crate::rdonly_cast(task, kfunc::TASK_STRUCT_TYPE);
    // SAFETY: the verifier checks the load against `struct task_struct`
    // (the offset is one the agent took from the kernel's BTF for this
    // `u64`, a frozen constant) and makes it fault-safe: a fault reads 0.
    unsafe { core::ptr::read_volatile(at.add(cfg.task.last_queued as usize) as *const u64) }
}

/// Adds the wakeups a CPU's slot counted for its last pair to the pair's
/// `WAKES` entry, and forgets the pair (an entry the agent removed, its
/// wakee or waker gone, takes nothing).
#[inline(always)]
fn flush_wakes(c: &mut WakeCache) {
    if c.pending != 0 {
        add_to_pair(c.key, c.pending);
        c.pending = 0;
    }
    c.key = WakeKey::default();
}

/// Moves the blocked time that `t`'s last waker ended (`waited_ns`) into
/// that pair's entry: in `WAKES`, else in `WAKES_BY_PROC` where the pair
/// was counted per process. A pair with neither (the agent removed it, its
/// waker gone; the model keeps its counts) takes nothing.
#[inline(always)]
pub(crate) fn flush_waited(t: &mut ThreadStats, wakee: u32) {
    let ns = t.waited_ns;
    if ns == 0 {
        return;
    }
    t.waited_ns = 0;
    let key = WakeKey { wakee, waker: t.waited_by & !WAIT_NOTED };
    let w = match WAKES.get_ptr_mut(key) {
        Some(w) => w,
        None => {
            let key = WakeKey { wakee, waker: t.waited_by_tgid | WAKER_ANY_THREAD };
            let Some(w) = WAKES_BY_PROC.get_ptr_mut(key) else { return };
            w
        }
    };
    // SAFETY: as in `add_to_pair`: a non-null, preallocated value pointer;
    // `blocked_ns` is an aligned `u64` only ever added to atomically.
    unsafe { atomic_add(&mut (*w).blocked_ns, ns) };
}

/// Adds `n` wakeups to the `WAKES` entry of `key`; whether it has one.
#[inline(always)]
fn add_to_pair(key: WakeKey, n: u64) -> bool {
    let Some(w) = WAKES.get_ptr_mut(key) else {
        return false;
    };
    // SAFETY: `w` is the non-null value pointer of a `WAKES` entry
    // (preallocated: valid memory for the program's run); `count` is an
    // aligned `u64` that wakers on other CPUs also add to atomically.
    unsafe { atomic_add(&mut (*w).count, n) };
    true
}
