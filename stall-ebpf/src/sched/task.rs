//! Following the job's tasks: creation (`task_newtask`, in the parent's
//! context, before the child can run, so no fork escapes), exec and exit.
//! Raw tracepoints, like the scheduler's (see mod.rs): never skipped
//! while another tracing program or a `bpf()` syscall runs on the CPU.
use core::mem::MaybeUninit;

use aya_ebpf::{helpers::bpf_get_current_comm, macros::raw_tracepoint, programs::RawTracePointContext};
use stall_common::{
    counter, event_kind, kclock, reason, run_state, slot_state, zeroed_in, ExecEvent, ExitEvent,
    NewTaskEvent, ThreadStats,
};

use super::{kclock_flags, kernel_totals, split_by_totals};
use crate::{
    bump, config, current, current_task, header,
    kread::read_u32,
    maps::{EVENTS, THREADS, URING_READS},
    now, running, submit_flags, untracked,
};

const CLONE_THREAD: u64 = 0x0001_0000;

/// `task_newtask(struct task_struct *task, unsigned long clone_flags)`.
#[raw_tracepoint(tracepoint = "task_newtask")]
pub fn task_newtask(ctx: RawTracePointContext) -> i32 {
    let cfg = config();
    if cfg.floor != 0 {
        return 0;
    }
    let task: u64 = ctx.arg(0);
    // A reused task struct: whatever was noted of its last owner is not of
    // this task, which may be ours (a tracked parent's, or born into a
    // watched cgroup).
    untracked::forget(task);
    let Some(parent) = current(&cfg) else {
        return 0;
    };
    let flags: u64 = ctx.arg(1);
    let child = read_u32(task, cfg.task.pid) as i32;
    if child <= 0 {
        return 0;
    }
    let child = child as u32;
    let child_tgid = if flags & CLONE_THREAD != 0 { parent.tgid } else { child };
    // Zero for a task this new (sched_fork cleared them); read all the same.
    let (exec, delay) = kernel_totals(task, &cfg);
    let ts = now();
    // A new task is runnable from its creation until it first runs.
    let mut at = MaybeUninit::<ThreadStats>::uninit();
    let fresh = zeroed_in(&mut at);
    fresh.tgid = child_tgid;
    fresh.job = parent.stats.job;
    fresh.state = run_state::OFF;
    fresh.off_reason = reason::RUNQUEUE;
    fresh.off_nr = -1;
    fresh.other_nr = -1;
    fresh.last_ts = ts;
    fresh.kclock = kclock_flags(&cfg);
    (fresh.exec_base, fresh.exec_ns) = (exec, exec);
    (fresh.delay_base, fresh.delay_ns) = (delay, delay);
    if THREADS.insert(child, &*fresh, 0).is_err() {
        bump(counter::LOST_THREAD_MAP);
        crate::diag::map_full(counter::LOST_THREAD_MAP);
    }
    match EVENTS.reserve::<NewTaskEvent>(0) {
        Some(mut e) => {
            e.write(NewTaskEvent {
                hdr: header(event_kind::NEWTASK, parent.tid, parent.tgid, parent.stats.job, ts),
                child_tid: child,
                child_tgid,
                clone_flags: flags,
                comm: bpf_get_current_comm().unwrap_or_default(),
            });
            e.submit(submit_flags(&cfg));
        }
        None => bump(counter::LOST_RINGBUF),
    }
    0
}

/// `sched_process_exec(struct task_struct *p, pid_t old_pid, struct
/// linux_binprm *bprm)`: p is the current task.
#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn sched_process_exec(_ctx: RawTracePointContext) -> i32 {
    let cfg = config();
    if cfg.floor != 0 {
        return 0;
    }
    let Some(cur) = current(&cfg) else {
        return 0;
    };
    match EVENTS.reserve::<ExecEvent>(0) {
        Some(mut e) => {
            e.write(ExecEvent {
                hdr: header(event_kind::EXEC, cur.tid, cur.tgid, cur.stats.job, now()),
                comm: bpf_get_current_comm().unwrap_or_default(),
            });
            e.submit(submit_flags(&cfg));
        }
        None => bump(counter::LOST_RINGBUF),
    }
    0
}

/// `sched_process_exit(struct task_struct *p[, bool group_dead])`: p is
/// the current task.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn sched_process_exit(_ctx: RawTracePointContext) -> i32 {
    let cfg = config();
    if cfg.floor != 0 {
        return 0;
    }
    let Some(cur) = current(&cfg) else {
        return 0;
    };
    let ts = now();
    let t = cur.stats;
    // Its slot holds reads not yet in the entry; after this it is untracked.
    if let Some(s) = running::slot() {
        if s.tracked == slot_state::TRACKED && s.tid == cur.tid {
            running::flush_into(s, t);
            s.tracked = slot_state::UNTRACKED;
        }
    }
    if t.kclock & kclock::EXEC != 0 && (t.seeded != 0 || t.state == run_state::OFF) {
        // Its state is the agent's reading of /proc, or a switch-out whose
        // switch-in was never seen (the daemon's cheap tier runs no
        // scheduler hook): the span since is split by the kernel's own
        // totals, as the agent splits it.
        let (exec, delay) = kernel_totals(current_task(), &cfg);
        settle_from_totals(t, ts, exec, delay);
    } else if t.state == run_state::RUNNING {
        let span = ts.saturating_sub(t.last_ts);
        t.on_cpu_ns += span;
        // exec_ns stays "the kernel's total as of last_ts" (its own
        // counter lags by up to a tick here).
        t.exec_ns += span;
        t.last_ts = ts;
    }
    if t.tgid == 0 {
        t.tgid = cur.tgid;
    }
    // Its last waker's share of its waits, which only the entry holds.
    super::flush_waited(t, cur.tid);
    super::flush_fd_waited(t);
    // Its io_uring reads, counted apart where they completed, are part of
    // its last counts (added in the entry itself, which goes below: a copy
    // would not fit the stack beside the event).
    // SAFETY: `get` is unsafe because another CPU may change or delete the
    // entry while the reference lives (a preallocated element can be
    // reused); it is read at once, before the removal below. A completion
    // adding to it on another CPU meanwhile may be missed: a lost count.
    if let Some(u) = unsafe { URING_READS.get(cur.tid) } {
        t.add_uring_reads(u);
        let _ = URING_READS.remove(cur.tid);
    }
    match EVENTS.reserve::<ExitEvent>(0) {
        Some(mut e) => {
            e.write(ExitEvent {
                hdr: header(event_kind::EXIT, cur.tid, cur.tgid, t.job, ts),
                stats: *t,
                comm: bpf_get_current_comm().unwrap_or_default(),
            });
            e.submit(submit_flags(&cfg));
        }
        None => bump(counter::LOST_RINGBUF),
    }
    let _ = THREADS.remove(cur.tid);
    0
}

/// `cgroup_attach_task(struct cgroup *dst, const char *path, struct
/// task_struct *task, bool threadgroup)`, attached in cgroup mode only: a
/// task (or its whole process) moved into another cgroup, perhaps a watched
/// one, so no thread is known to be outside them any more.
#[raw_tracepoint(tracepoint = "cgroup_attach_task")]
pub fn cgroup_attach_task(_ctx: RawTracePointContext) -> i32 {
    if config().floor == 0 {
        untracked::migrated();
    }
    0
}

/// Brings an entry up to `ts` from its state as of `last_ts` (read from
/// /proc by the agent, or a switch-out): blocked for the reason it was
/// blocked in then, or, runnable then, waiting for a CPU; split by the
/// kernel's totals as the agent's `capture::schedstat` splits the span
/// between two readings.
#[inline(always)]
fn settle_from_totals(t: &mut ThreadStats, ts: u64, exec: u64, delay: u64) {
    let why = if t.state == run_state::OFF { t.off_reason } else { reason::RUNQUEUE };
    split_by_totals(t, ts, exec, delay, why);
    if exec > t.exec_ns {
        t.exec_ns = exec;
    }
    t.delay_ns = delay;
    // Nothing more for the agent's fold to add.
    t.state = run_state::RUNNING;
    t.last_ts = ts;
}
