//! Off-CPU time by reason (`sched_switch`) and who wakes whom
//! (`sched_waking`), on raw tracepoints: a perf-event tracepoint program is
//! skipped while `bpf_prog_active` is held on its CPU (another tracing
//! program, or any process's `bpf()` map syscall), which loses switches; a
//! raw tracepoint program is not. Raw tracepoints hand the programs the
//! tracepoint's arguments (task pointers), whose fields are read at the
//! offsets the agent took from the kernel's BTF (`Config::task`).
//!
//! On-CPU and runqueue totals come from the kernel's own counters
//! (`se.sum_exec_runtime`, `sched_info.run_delay`), read at every switch:
//! a missed event can delay them, never skew them. A woken task's wait for
//! a CPU is the kernel's too where it can be read at the switch-in
//! (`queued_at`), else the time from its wakeup.
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_task_btf, bpf_probe_read_kernel, bpf_task_pt_regs},
    macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use stall_common::{
    counter, fd_kind, inflight, kclock, kfunc, reason, run_state, slot_state, syscall_class, task_flags,
    Config, CpuSlot, FdKey, ThreadStats, WakeCache, WakeKey, WakeStats, WAIT_NOTED, WAKER_ANY_THREAD,
    WAKE_CACHE_SLOTS, WOKEN_UNTIMED,
};

use crate::{
    adopt_into, atomic_add, bump, config, current_comm, ids,
    maps::{FD_WAITS, FILES, THREADS, WAKES, WAKES_BY_PROC, WAKE_CACHE},
    now, running, tracked,
    untracked::{self, Noted},
    watched_job,
};

/// What the task going off-CPU is doing (from `preempt` and its state).
const RUNNABLE: u8 = 0;
const SLEEPING: u8 = 1;
const UNINTERRUPTIBLE: u8 = 2;
const EXITING: u8 = 3;

/// `task_struct::__state` bits (stable since long before 5.10).
const TASK_UNINTERRUPTIBLE: u32 = 0x2;
const TASK_DEAD: u32 = 0x80;
const TASK_NOLOAD: u32 = 0x400;

/// A `u8` field of a kernel object, 0 if unreadable.
#[inline(always)]
pub(crate) fn read_u8(base: u64, off: u32) -> u8 {
    // SAFETY: bpf_probe_read_kernel checks the address (any address, even a
    // stale or garbage one); a fault returns an error, read as 0, never a
    // crash. Any byte is a valid `u8`.
    unsafe { bpf_probe_read_kernel((base + u64::from(off)) as *const u8) }.unwrap_or(0)
}

#[inline(always)]
pub(crate) fn read_u32(base: u64, off: u32) -> u32 {
    // SAFETY: as in `read_u8`: the helper checks the address, a fault reads
    // as 0; any 4 bytes are a valid `u32`.
    unsafe { bpf_probe_read_kernel((base + u64::from(off)) as *const u32) }.unwrap_or(0)
}

#[inline(always)]
pub(crate) fn read_u64(base: u64, off: u32) -> u64 {
    // SAFETY: as in `read_u8`: the helper checks the address, a fault reads
    // as 0; any 8 bytes are a valid `u64`.
    unsafe { bpf_probe_read_kernel((base + u64::from(off)) as *const u64) }.unwrap_or(0)
}

/// Where the kernel's totals stand for `task` now: (`sum_exec_runtime`,
/// `run_delay` or 0).
#[inline(always)]
pub(crate) fn kernel_totals(task: u64, cfg: &Config) -> (u64, u64) {
    Prev { task, btf: core::ptr::null() }.totals::<PROBE>(cfg)
}

/// Which kernel totals a thread entry created now carries.
#[inline(always)]
pub(crate) fn kclock_flags(cfg: &Config) -> u8 {
    if cfg.task.flags & task_flags::RUN_DELAY != 0 {
        kclock::EXEC | kclock::DELAY
    } else {
        kclock::EXEC
    }
}

/// How `switch` reads the task going off-CPU (the current task): by
/// `bpf_probe_read_kernel`, its registers found from `task->stack` (before
/// 5.15) or from `bpf_task_pt_regs`; or `DIRECT`ly, by plain loads through
/// the BTF pointers `bpf_get_current_task_btf` and `bpf_task_pt_regs`
/// return, which the verifier turns into fault-safe loads: no helper call
/// per field. The agent loads `sched_switch_queued` (`DIRECT` reads, and a
/// woken task's wait for a CPU from the kernel) or else `sched_switch_direct`
/// where the kernel's verifier takes it, else one of the other two.
const PROBE_STACK: u8 = 0;
const PROBE: u8 = 1;
const DIRECT: u8 = 2;
/// `DIRECT`, and a woken task's wait for a CPU taken from the kernel at its
/// switch-in (`queued_at`) rather than from the clock at its wakeup.
const QUEUED: u8 = 3;
/// `QUEUED`, the current task reached through `bpf_rdonly_cast` of the
/// tracepoint's argument and its registers from its stack, where the
/// kfunc placeholders were rewritten: no helper call to find either.
const QUEUED_CAST: u8 = 4;

/// Whether `HOW` reads the current task by plain loads.
const fn direct(how: u8) -> bool {
    how == DIRECT || how == QUEUED || how == QUEUED_CAST
}

/// Whether `HOW` takes a woken task's wait for a CPU from the kernel.
const fn queued(how: u8) -> bool {
    how == QUEUED || how == QUEUED_CAST
}

/// Kernels that also keep `sched_info.last_queued` with the runqueue's
/// clock in reach (`task_flags::QUEUED_AT`): loaded with
/// `sched_waking_marked`, which reads no clock, or where EEVDF delays
/// dequeues with `sched_waking_checked`, which reads it only where the
/// wakee's enqueue time is not this wakeup's.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn sched_switch_queued(ctx: RawTracePointContext) -> i32 {
    switch::<QUEUED>(&ctx)
}

/// `sched_switch_queued` where the kernel has `bpf_rdonly_cast` (6.2 on)
/// and the agent rewrote its placeholders: the task going off-CPU is the
/// tracepoint's argument cast to `struct task_struct`, its user registers
/// the top of its stack cast to `struct pt_regs`, so that neither
/// `bpf_get_current_task_btf` nor `bpf_task_pt_regs` is called.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn sched_switch_queued_cast(ctx: RawTracePointContext) -> i32 {
    switch::<QUEUED_CAST>(&ctx)
}

/// Kernels whose verifier takes plain loads through the current task's BTF
/// pointer in a raw tracepoint program.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn sched_switch_direct(ctx: RawTracePointContext) -> i32 {
    switch::<DIRECT>(&ctx)
}

/// Kernels with `bpf_task_pt_regs` (5.15 and later): the saved user
/// registers come from the helper.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn sched_switch(ctx: RawTracePointContext) -> i32 {
    switch::<PROBE>(&ctx)
}

/// Kernels without it: from `task->stack` (`TaskOffsets::regs_in_stack`).
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn sched_switch_stack(ctx: RawTracePointContext) -> i32 {
    switch::<PROBE_STACK>(&ctx)
}

/// A task read by `bpf_probe_read_kernel` or, for `DIRECT` (the current
/// task alone, the one going off-CPU), through its BTF pointer: its address
/// (the tracepoint's argument) and that pointer.
#[derive(Clone, Copy)]
struct Prev {
    task: u64,
    btf: *const u8,
}

impl Prev {
    #[inline(always)]
    fn new<const HOW: u8>(task: u64) -> Self {
        let btf = if HOW == QUEUED_CAST {
            crate::rdonly_cast(task, kfunc::TASK_STRUCT_TYPE)
        } else if direct(HOW) {
            // SAFETY: takes no arguments; returns the current task as a
            // BTF pointer, which is only ever loaded from (see `at`).
            unsafe { bpf_get_current_task_btf() as *const u8 }
        } else {
            core::ptr::null()
        };
        Self { task, btf }
    }

    /// Its field at `off` (a `T` of the size the field has, or its low
    /// bytes), 0 if unreadable.
    #[inline(always)]
    fn at<T: Copy + Default, const HOW: u8>(self, off: u32) -> T {
        if direct(HOW) {
            // SAFETY: `btf` is the current task's BTF pointer and `off` an
            // offset the agent took from the kernel's BTF for a field of at
            // least `T`'s size; the verifier checks the load against that
            // BTF (it rejects the program otherwise, and the agent loads
            // another variant) and makes it a fault-safe load: a fault
            // reads 0. `T` is an integer: any bytes are valid.
            unsafe { core::ptr::read_volatile(self.btf.add(off as usize) as *const T) }
        } else {
            // SAFETY: as in `read_u8`: the helper checks the address; a
            // fault reads as 0.
            unsafe { bpf_probe_read_kernel((self.task + u64::from(off)) as *const T) }.unwrap_or_default()
        }
    }

    /// Its thread and process ids.
    #[inline(always)]
    fn ids<const HOW: u8>(self, cfg: &Config) -> (u32, u32) {
        if direct(HOW) {
            (self.at::<u32, HOW>(cfg.task.pid), self.at::<u32, HOW>(cfg.task.tgid))
        } else {
            ids()
        }
    }

    /// Where the kernel's totals stand for it (see `kernel_totals`).
    #[inline(always)]
    fn totals<const HOW: u8>(self, cfg: &Config) -> (u64, u64) {
        let exec = self.at::<u64, HOW>(cfg.task.sum_exec);
        let delay = if cfg.task.flags & task_flags::RUN_DELAY != 0 {
            self.at::<u64, HOW>(cfg.task.run_delay)
        } else {
            0
        };
        (exec, delay)
    }

    /// The address of its saved user registers (0 if unknown) and the
    /// syscall it is in there (-1: none).
    #[inline(always)]
    fn regs_and_nr<const HOW: u8>(self, cfg: &Config) -> (u64, i32) {
        if HOW == QUEUED_CAST {
            // `task_pt_regs`: the top of the task's kernel stack.
            let stack = self.at::<u64, HOW>(cfg.task.stack);
            if stack == 0 {
                return (0, -1);
            }
            let regs = stack + u64::from(cfg.task.regs_in_stack);
            let at = crate::rdonly_cast(regs, kfunc::PT_REGS_TYPE);
            // SAFETY: the verifier checks the load against `struct pt_regs`
            // (x86-64's offset of `orig_ax`) and makes it fault-safe: a
            // fault reads 0. Any 8 bytes are an `i64`.
            let nr = unsafe { core::ptr::read_volatile(at.add(kfunc::X86_64_NR) as *const i64) };
            (regs, nr as i32)
        } else if direct(HOW) {
            // SAFETY: `btf` is the current task's BTF pointer, as
            // bpf_task_pt_regs requires; it returns a BTF pointer to the
            // task's `struct pt_regs`, loaded from as in `at` (`orig_ax`,
            // 8 bytes).
            unsafe {
                let regs = bpf_task_pt_regs(self.btf as *mut _) as *const u8;
                let nr = core::ptr::read_volatile(regs.add(usize::from(cfg.regs.nr)) as *const i64);
                (regs as u64, nr as i32)
            }
        } else {
            let regs = if HOW == PROBE_STACK {
                user_regs::<true>(self.task, cfg)
            } else {
                user_regs::<false>(self.task, cfg)
            };
            (regs, nr_in(regs, cfg))
        }
    }
}

/// `sched_switch(bool preempt, struct task_struct *prev, struct task_struct
/// *next[, unsigned int prev_state])`: only the first three, which every
/// kernel has (a raw tracepoint program may not read past the arguments).
#[inline(always)]
fn switch<const HOW: u8>(ctx: &RawTracePointContext) -> i32 {
    let cfg = config();
    if cfg.floor != 0 {
        return 0;
    }
    let preempt: u64 = ctx.arg(0);
    let prev: u64 = ctx.arg(1);
    let next: u64 = ctx.arg(2);
    // Read before any lookup: a thread the agent adds meanwhile bumps it
    // after, so a note taken under this value is stale by then.
    let gen = running::generation();
    let gens = untracked::generations(gen);
    let mut slot = running::slot();
    // Taken only when a tracked thread is involved: the rest of the
    // machine does not pay for the clock.
    let mut ts = 0;
    // The current task's BTF pointer where it was taken (DIRECT), else null.
    let mut current: *const u8 = core::ptr::null();
    if untracked::known(prev, gens) {
        if let Some(s) = slot.as_mut() {
            if s.tracked == slot_state::TRACKED {
                running::flush(s);
            }
        }
    } else {
        let p = Prev::new::<HOW>(prev);
        current = p.btf;
        switch_out_unknown::<HOW>(cfg, preempt, p, next, gens, &mut slot, &mut ts);
    }
    let Some((next_pid, next_stats)) = thread_of(next, gens, cfg) else {
        // Its tid is not read: a syscall program that finds the slot
        // unchecked asks the note again (`running::refill`).
        if let Some(s) = slot {
            running::set_untracked(s, 0, gen, slot_state::UNCHECKED);
        }
        return 0;
    };
    match (next_stats, slot) {
        (Some(p), mut slot) => {
            // SAFETY: the non-null value pointer of `next`'s `THREADS` entry,
            // valid for the program's run (see `crate::tracked`); `next` is
            // not running yet, so no program of its own writes it meanwhile.
            let t = unsafe { &mut *p };
            if queued(HOW) && current.is_null() {
                current = if HOW == QUEUED_CAST {
                    crate::rdonly_cast(prev, kfunc::TASK_STRUCT_TYPE)
                } else {
                    // SAFETY: takes no arguments; returns the current task
                    // as a BTF pointer, only ever loaded from.
                    unsafe { bpf_get_current_task_btf() as *const u8 }
                };
            }
            if ts == 0 {
                ts = switch_now::<HOW>(cfg, current, next, &mut slot);
            }
            if queued(HOW)
                && t.state == run_state::OFF
                && t.off_reason != reason::RUNQUEUE
                && enqueue_is_wakeup(t, cfg)
            {
                t.wake_ts = queued_at(cfg, current, next, ts, t.last_ts);
            }
            crate::timeline::record(cfg, t, next_pid, true, ts);
            switch_in(t, ts, next, cfg);
            if let Some(s) = slot {
                s.load_thread(next_pid, 0, gen, t);
            }
        }
        (None, Some(s)) => {
            // In cgroup mode the task may still be adopted on its first syscall.
            let state = if cfg.cgroup_filter != 0 { slot_state::UNCHECKED } else { slot_state::UNTRACKED };
            running::set_untracked(s, next_pid, gen, state);
        }
        (None, None) => {}
    }
    0
}

/// The thread id and `THREADS` entry of the task at `task` (not the
/// current one): by its note where it names one of ours still there (no
/// read of the task), else by its pid (0 if unreadable, with no entry).
/// None: noted as not ours.
#[inline(always)]
fn thread_of(task: u64, gens: u64, cfg: &Config) -> Option<(u32, Option<*mut ThreadStats>)> {
    match untracked::noted(task, gens) {
        Noted::NotOurs => return None,
        Noted::Ours(tid) => {
            if let Some(p) = THREADS.get_ptr_mut(tid) {
                // SAFETY: the non-null value pointer of a `THREADS` entry,
                // valid for the program's run (see `crate::tracked`); one
                // aligned field is read.
                if unsafe { (*p).task } == task {
                    return Some((tid, Some(p)));
                }
            }
        }
        Noted::Nothing => {}
    }
    let pid = read_u32(task, cfg.task.pid) as i32;
    if pid <= 0 {
        return Some((0, None));
    }
    Some((pid as u32, THREADS.get_ptr_mut(pid as u32)))
}

/// `prev` (the current task) goes off-CPU, not known to be outside the
/// job: counted if tracked, adopted if its cgroup is watched, else noted.
#[inline(always)]
fn switch_out_unknown<const HOW: u8>(
    cfg: &Config,
    preempt: u64,
    prev: Prev,
    next: u64,
    gens: u64,
    slot: &mut Option<&'static mut CpuSlot>,
    ts: &mut u64,
) {
    // prev is the current task: the filter needs no probe read.
    let (tid, tgid) = prev.ids::<HOW>(cfg);
    if let Some(cur) = tracked(tid, tgid) {
        *ts = switch_now::<HOW>(cfg, prev.btf, next, slot);
        if let Some(s) = slot.as_mut() {
            if s.tracked == slot_state::TRACKED {
                if s.tid == tid {
                    running::flush_into(s, cur.stats);
                } else {
                    running::flush(s);
                }
            }
        }
        // A tracked task is no longer one once its exit event removed it:
        // whether it is exiting need not be asked (`exit_state`).
        let state = prev_state::<false, HOW>(preempt, prev, cfg);
        switch_out::<HOW>(cur.stats, cur.tgid, state, *ts, prev, cfg);
        crate::timeline::record(cfg, cur.stats, tid, false, *ts);
        untracked::note_ours(prev.task, gens, tid);
    } else {
        if let Some(s) = slot.as_mut() {
            if s.tracked == slot_state::TRACKED {
                running::flush(s);
            }
        }
        // Cgroup mode: the task's cgroup first (a helper and a small map),
        // its state only for a task of a watched job: a task of no job
        // (the rest of the node) costs no field read here.
        match watched_job(cfg, tid) {
            Some(job) => {
                // A task's last switch comes after its exit event (which removed it):
                // it must not be adopted again, or it would linger as a zombie.
                let state = prev_state::<true, HOW>(preempt, prev, cfg);
                if state != EXITING {
                    if let Some(cur) = adopt_into(cfg, tid, tgid, job) {
                        *ts = switch_now::<HOW>(cfg, prev.btf, next, slot);
                        switch_out::<HOW>(cur.stats, cur.tgid, state, *ts, prev, cfg);
                        crate::timeline::record(cfg, cur.stats, tid, false, *ts);
                        untracked::note_ours(prev.task, gens, tid);
                    }
                }
            }
            None => untracked::note(prev.task, gens),
        }
    }
}

/// What `prev` goes off-CPU for, as `__trace_sched_switch_state` reports
/// it: preempted (or still running: a signal cancelled its sleep) is
/// runnable; `TASK_IDLE` (uninterruptible without load) is not I/O.
/// `EXIT_STATE`: a task past `exit_notify` (a zombie still switching) is
/// exiting too, at the price of one more read.
#[inline(always)]
fn prev_state<const EXIT_STATE: bool, const HOW: u8>(preempt: u64, prev: Prev, cfg: &Config) -> u8 {
    if preempt & 0xff != 0 {
        return RUNNABLE;
    }
    let state = prev.at::<u32, HOW>(cfg.task.state);
    if state & TASK_DEAD != 0 || (EXIT_STATE && prev.at::<u32, HOW>(cfg.task.exit_state) != 0) {
        EXITING
    } else if state & 0xff == 0 {
        RUNNABLE
    } else if state & 0xff == TASK_UNINTERRUPTIBLE && state & TASK_NOLOAD == 0 {
        UNINTERRUPTIBLE
    } else {
        SLEEPING
    }
}

#[inline(always)]
fn switch_out<const HOW: u8>(t: &mut ThreadStats, tgid: u32, state: u8, ts: u64, prev: Prev, cfg: &Config) {
    // The kernel's totals are current for prev here: pick_next_task has
    // accounted its last slice, and its run_delay last moved at its switch-in.
    let (exec, delay) = prev.totals::<HOW>(cfg);
    if t.state == run_state::RUNNING {
        t.on_cpu_ns += ts.saturating_sub(t.last_ts);
    } else if t.state == run_state::OFF && t.seeded == 0 {
        missed_switch_in(t, ts, exec, delay);
    }
    t.seeded = 0;
    if exec != 0 {
        t.exec_ns = exec;
    }
    t.delay_ns = delay;
    t.rq_at_out = t.off_ns[usize::from(reason::RUNQUEUE)];
    if t.tgid == 0 {
        t.tgid = tgid;
    }
    t.state = run_state::OFF;
    t.last_ts = ts;
    t.wake_ts = 0;
    // A wakeup noted whose switch-in was missed: its wait is not counted.
    t.waited_by &= !WAIT_NOTED;
    t.task = prev.task;
    t.blocked_fd = 0;
    if state == RUNNABLE {
        t.off_reason = reason::RUNQUEUE;
        t.off_nr = -1;
        return;
    }
    let (regs, nr) = prev.regs_and_nr::<HOW>(cfg);
    t.off_nr = nr;
    let class = cfg.tables.class(i64::from(nr));
    let what = if class == syscall_class::READ { inflight::READ } else { inflight::WRITE };
    t.off_reason =
        reason::for_class(class, state == UNINTERRUPTIBLE, || on_file(t, tgid, what, state, regs, cfg));
    // `on_file` ran for the read and write families and found the call's
    // descriptor where its entry was recorded.
    if (class == syscall_class::READ || class == syscall_class::WRITE)
        && inflight::kind(t.inflight, crate::running::generation()) == what
        && t.inflight_fd >= 0
    {
        t.blocked_fd = t.inflight_fd + 1;
    }
}

/// Whether the read or write (`what`, an `inflight` kind) `t` blocks in is
/// on a file: by the descriptor's `FILES` entry where the syscall programs
/// recorded the call; else (they are not attached) by the sleep, as files
/// block uninterruptibly and pipes and sockets do not. `regs`: the task's
/// saved user registers, where the call's descriptor is if its entry did
/// not read it (`inflight::FD_IN_REGS`); it is kept for the call's return.
#[inline(always)]
fn on_file(t: &mut ThreadStats, tgid: u32, what: u32, state: u8, regs: u64, cfg: &Config) -> bool {
    if inflight::kind(t.inflight, crate::running::generation()) != what {
        return state == UNINTERRUPTIBLE;
    }
    if t.inflight_fd == inflight::FD_IN_REGS && regs != 0 {
        // SAFETY: as in `nr_in`: the helper checks the address; a fault
        // reads as -1 (no descriptor). Any 8 bytes are a valid `u64`.
        t.inflight_fd = unsafe { bpf_probe_read_kernel((regs + u64::from(cfg.regs.arg0)) as *const u64) }
            .map_or(-1, |v| v as i32);
    }
    let key = FdKey { tgid, fd: t.inflight_fd };
    // SAFETY: `get` is unsafe because another CPU may change or delete the
    // entry while the reference lives (a preallocated element can be
    // reused); one field is read at once.
    matches!(unsafe { FILES.get(key) }, Some(f) if fd_kind::is_file(f.kind))
}

/// The syscall the current task (`prev`) is in, from its saved user
/// registers (`orig_ax` on x86-64); -1 when it is not in one.
#[inline(always)]
pub(crate) fn syscall_nr<const STACK: bool>(prev: u64, cfg: &Config) -> i32 {
    nr_in(user_regs::<STACK>(prev, cfg), cfg)
}

/// The address of the current task's (`prev`'s) saved user registers, 0
/// if unknown. `STACK`: they sit at the top of its kernel stack
/// (`task_pt_regs`).
#[inline(always)]
fn user_regs<const STACK: bool>(prev: u64, cfg: &Config) -> u64 {
    if STACK {
        let stack = read_u64(prev, cfg.task.stack);
        if stack == 0 {
            return 0;
        }
        stack + u64::from(cfg.task.regs_in_stack)
    } else {
        // SAFETY: bpf_get_current_task_btf returns the trusted BTF pointer to
        // the current task that bpf_task_pt_regs requires (the verifier checks
        // its type, and rejects the call on kernels without the helper: the
        // agent loads the `STACK` variant there). The result is used only as
        // an address for bpf_probe_read_kernel.
        unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) as u64 }
    }
}

/// The syscall number in saved user registers at `regs` (0: unknown);
/// -1 when the task is not in a syscall.
#[inline(always)]
fn nr_in(regs: u64, cfg: &Config) -> i32 {
    if regs == 0 {
        return -1;
    }
    // SAFETY: bpf_probe_read_kernel checks the address (computed from the
    // task's stack or `bpf_task_pt_regs`); a fault returns an error, read as
    // -1, never a crash. Any 8 bytes are a valid `i64`.
    unsafe { bpf_probe_read_kernel((regs + u64::from(cfg.regs.nr)) as *const i64) }
        .map(|v| v as i32)
        .unwrap_or(-1)
}

/// prev goes off-CPU while marked off: its switch-in was never delivered
/// (some kernels do not trace every switch). Since its last switch-out the
/// kernel's counters moved by exactly its time on-CPU and in the runqueue;
/// the rest of the span it was blocked for the reason seen then.
#[inline(always)]
fn missed_switch_in(t: &mut ThreadStats, ts: u64, exec: u64, delay: u64) {
    if t.kclock & kclock::EXEC == 0 || exec < t.exec_ns {
        bump(counter::SCHED_GAPS);
        return;
    }
    split_by_totals(t, ts, exec, delay, t.off_reason);
    bump(counter::SCHED_REPAIRED);
}

/// The span from `t.last_ts` to `ts`, split by the kernel's totals now
/// (`exec`, `delay`) against those of `t`: on-CPU by exactly what `exec`
/// moved, runqueue by what `delay` moved, the rest blocked for `why` (all
/// of it runqueue where `why` is). Only the counters change.
#[inline(always)]
pub(crate) fn split_by_totals(t: &mut ThreadStats, ts: u64, exec: u64, delay: u64, why: u8) {
    let span = ts.saturating_sub(t.last_ts);
    let ran = exec.saturating_sub(t.exec_ns).min(span);
    t.on_cpu_ns += ran;
    let off = span - ran;
    let rq = if t.kclock & kclock::DELAY != 0 { delay.saturating_sub(t.delay_ns).min(off) } else { 0 };
    if why == reason::RUNQUEUE {
        add_off(t, why, off);
    } else {
        add_off(t, reason::RUNQUEUE, rq);
        add_off(t, why, off - rq);
        if why == reason::OTHER {
            t.other_nr = t.off_nr;
        }
    }
}

/// Whether a blocked task's `last_queued` tells when its wakeup queued it:
/// its wakeup was marked (`WOKEN_UNTIMED`: no earlier enqueue seen then),
/// or went unseen where no enqueue comes before a wakeup (no delayed
/// dequeues). A wakeup timed by the clock keeps its time.
#[inline(always)]
fn enqueue_is_wakeup(t: &ThreadStats, cfg: &Config) -> bool {
    t.wake_ts == WOKEN_UNTIMED || (t.wake_ts == 0 && cfg.task.flags & task_flags::DELAYED_DEQUEUE == 0)
}

/// How long after this CPU read the clock and its runqueue's clock
/// together the runqueue's clock stands in for the clock (`switch_now`).
const CLOCK_SPAN_NS: u64 = 2_000_000;

/// The time of this switch, on `now()`'s clock. Where the runqueue is in
/// reach (`queued` variants; `current`: the current task as a BTF
/// pointer), its clock, which the switch has just updated, counts on from
/// this CPU's last reading of both clocks together (`CpuSlot::clock_rq`,
/// `clock_mono`) for up to `CLOCK_SPAN_NS`: a few loads in place of the
/// helper call, which cost a tracked switch 60 to 80 ns on the AMD host.
/// The two clocks drift apart by parts per million, nanoseconds over the
/// span; the runqueue's is the one the kernel's own `schedstat` totals
/// are taken on. Past the span, or with no runqueue, the clock is read
/// (and both are noted again).
#[inline(always)]
fn switch_now<const HOW: u8>(
    cfg: &Config,
    current: *const u8,
    next: u64,
    slot: &mut Option<&'static mut CpuSlot>,
) -> u64 {
    if !queued(HOW) || current.is_null() {
        return now();
    }
    let Some(s) = slot.as_mut() else {
        return now();
    };
    let clock = match runqueue(cfg, current, next) {
        // SAFETY: as in `runqueue`: a field of `struct rq` at the offset the
        // agent took from the kernel's BTF, a fault-safe load of a `u64`.
        Some((rq, _)) => unsafe {
            core::ptr::read_volatile(rq.add(cfg.task.rq_clock as usize) as *const u64)
        },
        None => 0,
    };
    // A runqueue clock behind the noted one wraps to a large `since`.
    let since = clock.wrapping_sub(s.clock_rq);
    if clock != 0 && s.clock_rq != 0 && since < CLOCK_SPAN_NS {
        return s.clock_mono + since;
    }
    let t = now();
    s.clock_rq = clock;
    s.clock_mono = t;
    t
}

/// This CPU's runqueue, reached from the current task (`se.cfs_rq->rq`,
/// `current` its BTF pointer), and its `curr`, if that is `next` already,
/// as the switch set it (else it is not the runqueue switching).
#[inline(always)]
fn runqueue(cfg: &Config, current: *const u8, next: u64) -> Option<(*const u8, *const u8)> {
    let o = &cfg.task;
    // SAFETY: `current` is the current task as a BTF pointer. Each load is
    // at an offset the agent took from the kernel's BTF for a field of the
    // loaded type (pointers to `struct cfs_rq`, `struct rq` and `struct
    // task_struct`), through a pointer the verifier typed from the one
    // before: it checks each against that BTF (refusing the program
    // otherwise, and the agent loads another) and makes it a fault-safe
    // load, a fault reading 0.
    unsafe {
        let cfs_rq = core::ptr::read_volatile(current.add(o.se_cfs_rq as usize) as *const *const u8);
        let rq = core::ptr::read_volatile(cfs_rq.add(o.cfs_rq_rq as usize) as *const *const u8);
        let curr = core::ptr::read_volatile(rq.add(o.rq_curr as usize) as *const *const u8);
        (curr as u64 == next).then_some((rq, curr))
    }
}

/// When `next`, switching in at `ts` after an off-CPU span from `since`,
/// was put on the runqueue, on the clock of `ts`; 0 where unknown. Its wait
/// for a CPU is what the kernel adds to its `run_delay` right after this
/// tracepoint: the runqueue's clock, as the switch updated it, less the
/// task's `sched_info.last_queued`. That clock differs from `ts`'s, so only
/// the difference crosses over. The runqueue is the current task's
/// (`se.cfs_rq->rq`); its `curr` is `next` already, and leads to its field.
/// `current`: the current task as a BTF pointer (`bpf_get_current_task_btf`
/// or `bpf_rdonly_cast`).
#[inline(always)]
fn queued_at(cfg: &Config, current: *const u8, next: u64, ts: u64, since: u64) -> u64 {
    let o = &cfg.task;
    let Some((rq, curr)) = runqueue(cfg, current, next) else {
        return 0;
    };
    // SAFETY: as in `runqueue`: fields of `struct rq` and of `next` (its
    // `curr`, typed by the verifier) at offsets from the kernel's BTF,
    // fault-safe loads of `u64`s.
    let (clock, queued) = unsafe {
        (
            core::ptr::read_volatile(rq.add(o.rq_clock as usize) as *const u64),
            core::ptr::read_volatile(curr.add(o.last_queued as usize) as *const u64),
        )
    };
    let waited = clock.wrapping_sub(queued);
    // Not queued since it went off-CPU, or clocks that disagree.
    if queued == 0 || queued > clock || waited > ts.saturating_sub(since) {
        return 0;
    }
    ts - waited
}

#[inline(always)]
fn switch_in(t: &mut ThreadStats, ts: u64, next: u64, cfg: &Config) {
    if t.state == run_state::RUNNING && t.seeded == 0 {
        // Its switch-out was never delivered: on-CPU time stays exact (the
        // kernel's counter), but what it waited for meanwhile is unknown.
        bump(counter::SCHED_GAPS);
    }
    // The kernel's total is current for next (its last slice was accounted
    // when it went out), and unchanged since that switch-out stored it:
    // read only where that switch-out was missed or the entry is new.
    if t.state != run_state::OFF || t.seeded != 0 {
        let exec = read_u64(next, cfg.task.sum_exec);
        if exec != 0 {
            t.exec_ns = exec;
        }
    }
    t.seeded = 0;
    if t.state == run_state::OFF {
        let r = t.off_reason;
        let woke = t.wake_ts;
        let blocked = if r != reason::RUNQUEUE && woke >= t.last_ts && woke != 0 {
            // Blocked until the wakeup, then waiting for a CPU.
            add_off(t, reason::RUNQUEUE, ts.saturating_sub(woke));
            woke - t.last_ts
        } else {
            ts.saturating_sub(t.last_ts)
        };
        add_off(t, r, blocked);
        if r == reason::OTHER {
            t.other_nr = t.off_nr;
        }
        if t.waited_by & WAIT_NOTED != 0 {
            t.waited_ns += blocked;
        }
        if t.blocked_fd != 0 && r != reason::RUNQUEUE {
            if t.blocked_fd != t.fd_waited {
                flush_fd_waited(t);
                t.fd_waited = t.blocked_fd;
            }
            t.fd_waited_ns += blocked;
        }
    }
    t.waited_by &= !WAIT_NOTED;
    t.state = run_state::RUNNING;
    t.last_ts = ts;
    t.wake_ts = 0;
}

#[inline(always)]
fn add_off(t: &mut ThreadStats, r: u8, ns: u64) {
    if let Some(slot) = t.off_ns.get_mut(usize::from(r)) {
        *slot += ns;
    }
}

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
    let pid_tgid = if in_interrupt::<HOW>(cfg) { 0 } else { bpf_get_current_pid_tgid() };
    let key = WakeKey { wakee, waker: pid_tgid as u32 };
    let waker_tgid = (pid_tgid >> 32) as u32;
    if t.waited_by & !WAIT_NOTED != key.waker {
        flush_waited(t, wakee);
        t.waited_by_tgid = waker_tgid;
    }
    t.waited_by = key.waker | WAIT_NOTED;
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
    }
    0
}

/// Whether this program runs in interrupt context (a device, a timer, the
/// network's softirq). x86-64 runs an interrupt that came while the CPU ran
/// kernel code (a syscall, the idle loop) on a stack of its own, outside
/// the current task's (`stack` up to its saved user registers); one that
/// came from user mode on the task's own stack, then empty, whose saved
/// registers are the interrupted program's — where a syscall's hold
/// `-ENOSYS` in `ax` until it returns. `CHECKED` (6.12 on, the placeholders
/// rewritten) reads them by plain loads; the others with two probe reads.
#[inline(always)]
fn in_interrupt<const HOW: u8>(cfg: &Config) -> bool {
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
        return false;
    }
    let regs = base + u64::from(cfg.task.regs_in_stack);
    let mark = 0u8;
    // The address of a slot of this frame: compared, never dereferenced
    // (comparing a stack pointer needs CAP_PERFMON, which stall has).
    let here = core::hint::black_box(core::ptr::addr_of!(mark)) as u64;
    if here < base || here >= regs {
        return true;
    }
    let (ax, cs) = if HOW == CHECKED {
        let at = crate::rdonly_cast(regs, kfunc::PT_REGS_TYPE);
        // SAFETY: fault-safe loads checked against `struct pt_regs` at
        // x86-64's offsets of `ax` and `cs`; any 8 bytes are a `u64`.
        unsafe {
            (
                core::ptr::read_volatile(at.add(kfunc::X86_64_AX) as *const u64),
                core::ptr::read_volatile(at.add(kfunc::X86_64_CS) as *const u64),
            )
        }
    } else {
        const WORDS: usize = (kfunc::X86_64_CS - kfunc::X86_64_AX) / 8 + 1;
        // SAFETY: as in `read_u8`: the helper checks the address, a fault
        // reads as 0; any 64 bytes are eight `u64`s.
        let w = unsafe { bpf_probe_read_kernel((regs + kfunc::X86_64_AX as u64) as *const [u64; WORDS]) }
            .unwrap_or([0; WORDS]);
        (w[0], w[WORDS - 1])
    };
    cs & 3 == 3 && ax != ENOSYS.wrapping_neg()
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

/// Moves the blocked time `t` spent on its last descriptor
/// (`fd_waited_ns`) into that descriptor's `FD_WAITS` entry.
#[inline(always)]
pub(crate) fn flush_fd_waited(t: &mut ThreadStats) {
    let ns = t.fd_waited_ns;
    if ns == 0 || t.fd_waited == 0 {
        return;
    }
    t.fd_waited_ns = 0;
    let key = FdKey { tgid: t.tgid, fd: t.fd_waited - 1 };
    if let Some(w) = FD_WAITS.get_ptr_mut(key) {
        // SAFETY: a non-null, preallocated value pointer of `FD_WAITS`,
        // an aligned `u64` that other threads of the process add to
        // atomically.
        unsafe { atomic_add(w, ns) };
    } else if FD_WAITS.insert(key, ns, 0).is_err() {
        bump(counter::LOST_FD_MAP);
    }
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
