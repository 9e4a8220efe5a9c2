//! `sched_switch`: the task going off-CPU is counted and its reason
//! noted, the one coming in is counted off-CPU until now; one program per
//! `SwitchReads` variant, the cheapest the kernel takes loaded.
use aya_ebpf::{
    helpers::{bpf_get_current_task_btf, bpf_probe_read_kernel, bpf_task_pt_regs},
    macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use stall_common::{
    counter, fd_kind, inflight, kclock, kfunc, reason, run_state,
    sleep::{EXITING, RUNNABLE, SLEEPING, UNINTERRUPTIBLE},
    slot_state, syscall_class, task_flags, Config, CpuSlot, FdKey, SwitchReads, ThreadStats, WAIT_NOTED,
    WOKEN_UNTIMED,
};

use super::{
    clock::{queued_at, switch_now},
    thread_of,
};
use crate::{
    adopt_into, atomic_add, bump, config, ids,
    kread::{nr_in, read_u64, user_regs},
    maps::{FD_WAITS, FILES},
    running, tracked, untracked, watched_job,
};

/// `task_struct::__state` bits (stable since long before 5.10).
const TASK_UNINTERRUPTIBLE: u32 = 0x2;
const TASK_DEAD: u32 = 0x80;
const TASK_NOLOAD: u32 = 0x400;

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

/// How `switch` reads the task going off-CPU (the current task), one
/// program per `SwitchReads` variant, its `how()` the `HOW` parameter: by
/// `bpf_probe_read_kernel`, its registers found from `task->stack` (before
/// 5.15) or from `bpf_task_pt_regs`; or `DIRECT`ly, by plain loads through
/// the BTF pointers `bpf_get_current_task_btf` and `bpf_task_pt_regs`
/// return, which the verifier turns into fault-safe loads: no helper call
/// per field. `QUEUED` adds a woken task's wait for a CPU taken from the
/// kernel at its switch-in (`queued_at`) rather than from the clock at its
/// wakeup; `QUEUED_CAST` reaches the current task through `bpf_rdonly_cast`
/// of the tracepoint's argument and its registers from its stack, where
/// the kfunc placeholders were rewritten: no helper call to find either.
const PROBE_STACK: u8 = SwitchReads::ProbeStack.how();
const PROBE: u8 = SwitchReads::Probe.how();
const DIRECT: u8 = SwitchReads::Direct.how();
const QUEUED: u8 = SwitchReads::Queued.how();
const QUEUED_CAST: u8 = SwitchReads::QueuedChecked.how();

/// Whether `HOW` reads the current task by plain loads.
const fn direct(how: u8) -> bool {
    SwitchReads::from_how(how).direct()
}

/// Whether `HOW` takes a woken task's wait for a CPU from the kernel.
const fn queued(how: u8) -> bool {
    SwitchReads::from_how(how).queued()
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
    t.off_reason = reason::reason_for(class, state, || on_file(t, tgid, what, regs, cfg));
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
/// recorded the call; else (they are not attached) unknown, which
/// `reason_for` decides by the sleep. `regs`: the task's
/// saved user registers, where the call's descriptor is if its entry did
/// not read it (`inflight::FD_IN_REGS`); it is kept for the call's return.
#[inline(always)]
fn on_file(t: &mut ThreadStats, tgid: u32, what: u32, regs: u64, cfg: &Config) -> Option<bool> {
    if inflight::kind(t.inflight, crate::running::generation()) != what {
        return None;
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
    Some(matches!(unsafe { FILES.get(key) }, Some(f) if fd_kind::is_file(f.kind)))
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
    crate::diag::switch_repaired();
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
