//! Off-CPU time by reason (`sched:sched_switch`) and who wakes whom
//! (`sched:sched_waking`).
use aya_ebpf::{
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task_btf, bpf_probe_read_kernel,
        bpf_task_pt_regs,
    },
    macros::tracepoint,
    programs::TracePointContext,
};
use stall_common::{
    counter, fd_kind, inflight, reason, run_state, slot_state, syscall_class, Config, FdKey, ThreadStats,
    WakeKey, WakeStats,
};

use crate::{
    adopt, atomic_add, bump, config, ids,
    maps::{FILES, SYSCALL_CLASS, THREADS, WAKES},
    now, running, tracked,
};

/// `prev_state` as the tracepoint reports it: the low byte is the
/// `TASK_REPORT` bit (0 = running, 1 = S, 2 = D, ...); 0x100
/// (`TASK_REPORT_MAX`) marks a preemption.
const STATE_PREEMPTED: u64 = 0x100;
const STATE_UNINTERRUPTIBLE: u64 = 0x2;
/// `X` (EXIT_DEAD) and `Z` (EXIT_ZOMBIE) in the report bits.
const STATE_EXITING: u64 = 0x10 | 0x20;

#[tracepoint]
pub fn sched_switch(ctx: TracePointContext) -> u32 {
    let cfg = config();
    if cfg.floor != 0 {
        return 0;
    }
    let ts = now();
    // prev is the current task: the filter needs no field read.
    let (tid, tgid) = ids();
    let mut slot = running::slot();
    if let Some(cur) = tracked(tid, tgid) {
        if let Some(s) = slot.as_mut() {
            if s.tracked == slot_state::TRACKED {
                if s.tid == tid {
                    running::flush_into(s, cur.stats);
                } else {
                    running::flush(s);
                }
            }
        }
        let state = read_prev_state(&ctx, &cfg);
        switch_out(cur.stats, cur.tgid, state, ts, &cfg);
        crate::timeline::record(&cfg, cur.stats, tid, false, ts);
    } else {
        if let Some(s) = slot.as_mut() {
            if s.tracked == slot_state::TRACKED {
                running::flush(s);
            }
        }
        if cfg.cgroup_filter != 0 {
            // A task's last switch comes after its exit event (which removed it):
            // it must not be adopted again, or it would linger as a zombie.
            let state = read_prev_state(&ctx, &cfg);
            if state & STATE_EXITING == 0 {
                if let Some(cur) = adopt(&cfg, tid, tgid) {
                    switch_out(cur.stats, cur.tgid, state, ts, &cfg);
                    crate::timeline::record(&cfg, cur.stats, tid, false, ts);
                }
            }
        }
    }
    let next: i32 = match unsafe { ctx.read_at(usize::from(cfg.offsets.switch_next_pid)) } {
        Ok(pid) => pid,
        Err(_) => return 0,
    };
    let gen = running::generation();
    let next_stats = if next > 0 { THREADS.get_ptr_mut(next as u32) } else { None };
    match (next_stats, slot) {
        (Some(p), slot) => {
            let t = unsafe { &mut *p };
            crate::timeline::record(&cfg, t, next as u32, true, ts);
            switch_in(t, ts);
            if let Some(s) = slot {
                running::load(s, next as u32, 0, t, gen);
            }
        }
        (None, Some(s)) => {
            // In cgroup mode the task may still be adopted on its first syscall.
            let state = if cfg.cgroup_filter != 0 { slot_state::UNCHECKED } else { slot_state::UNTRACKED };
            running::set_untracked(s, next.max(0) as u32, gen, state);
        }
        (None, None) => {}
    }
    0
}

#[inline(always)]
fn read_prev_state(ctx: &TracePointContext, cfg: &Config) -> u64 {
    let off = usize::from(cfg.offsets.switch_prev_state);
    let v = if cfg.offsets.switch_prev_state_size == 8 {
        unsafe { ctx.read_at::<u64>(off) }
    } else {
        unsafe { ctx.read_at::<u32>(off) }.map(u64::from)
    };
    v.unwrap_or(0)
}

#[inline(always)]
fn switch_out(t: &mut ThreadStats, tgid: u32, state: u64, ts: u64, cfg: &Config) {
    if t.state == run_state::RUNNING {
        t.on_cpu_ns += ts.saturating_sub(t.last_ts);
    } else if t.state == run_state::OFF {
        bump(counter::SCHED_GAPS);
    }
    if t.tgid == 0 {
        t.tgid = tgid;
    }
    t.state = run_state::OFF;
    t.last_ts = ts;
    t.wake_ts = 0;
    if state & STATE_PREEMPTED != 0 || state & 0xff == 0 {
        t.off_reason = reason::RUNQUEUE;
        t.off_nr = -1;
        return;
    }
    let nr = syscall_nr(cfg);
    t.off_nr = nr;
    let class = if nr >= 0 {
        SYSCALL_CLASS.get(nr as u32).copied().unwrap_or(syscall_class::OTHER)
    } else {
        syscall_class::OTHER
    };
    t.off_reason = match class {
        syscall_class::FUTEX => reason::FUTEX,
        syscall_class::POLL => reason::POLL,
        syscall_class::SLEEP => reason::SLEEP,
        syscall_class::READ => {
            // A blocking read of a file is I/O; of a pipe or socket it is a
            // wait on another party, like poll.
            let key = FdKey { tgid, fd: t.inflight_fd };
            let is_file = inflight::kind(t.inflight, crate::running::generation()) == inflight::READ
                && matches!(unsafe { FILES.get(key) }, Some(f) if f.kind != fd_kind::OTHER);
            if is_file {
                reason::IO
            } else {
                reason::POLL
            }
        }
        // Uninterruptible sleep outside the known waits: disk I/O (page
        // faults on mapped files, metadata reads), rarely a kernel lock.
        _ if state & 0xff == STATE_UNINTERRUPTIBLE => reason::IO,
        _ => reason::OTHER,
    };
}

/// The syscall the current task is in, from its saved user registers
/// (`orig_ax` on x86-64); -1 when it is not in one.
#[inline(always)]
fn syscall_nr(cfg: &Config) -> i32 {
    unsafe {
        let regs = bpf_task_pt_regs(bpf_get_current_task_btf()) as usize;
        if regs == 0 {
            return -1;
        }
        let p = (regs + usize::from(cfg.regs.nr)) as *const i64;
        bpf_probe_read_kernel(p).map(|v| v as i32).unwrap_or(-1)
    }
}

#[inline(always)]
fn switch_in(t: &mut ThreadStats, ts: u64) {
    if t.state == run_state::RUNNING {
        bump(counter::SCHED_GAPS);
    }
    if t.state == run_state::OFF {
        let r = t.off_reason;
        let woke = t.wake_ts;
        if r != reason::RUNQUEUE && woke >= t.last_ts && woke != 0 {
            // Blocked until the wakeup, then waiting for a CPU.
            add_off(t, r, woke - t.last_ts);
            add_off(t, reason::RUNQUEUE, ts.saturating_sub(woke));
        } else {
            add_off(t, r, ts.saturating_sub(t.last_ts));
        }
        if r == reason::OTHER {
            t.other_nr = t.off_nr;
        }
    }
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

#[tracepoint]
pub fn sched_waking(ctx: TracePointContext) -> u32 {
    let cfg = config();
    if cfg.floor != 0 {
        return 0;
    }
    let wakee: i32 = match unsafe { ctx.read_at(usize::from(cfg.offsets.waking_pid)) } {
        Ok(pid) => pid,
        Err(_) => return 0,
    };
    if wakee <= 0 {
        return 0;
    }
    let Some(p) = THREADS.get_ptr_mut(wakee as u32) else {
        return 0;
    };
    let t = unsafe { &mut *p };
    if t.state != run_state::OFF || t.wake_ts != 0 || t.off_reason == reason::RUNQUEUE {
        return 0;
    }
    bump(counter::EVENTS);
    t.wake_ts = now();
    t.wakeups += 1;
    // The waker is whoever runs now (in interrupt context: the interrupted
    // task; the agent discounts wakers of I/O waits for that reason).
    let pid_tgid = bpf_get_current_pid_tgid();
    let key = WakeKey { wakee: wakee as u32, waker: pid_tgid as u32 };
    if let Some(w) = WAKES.get_ptr_mut(key) {
        unsafe { atomic_add(&mut (*w).count, 1) };
        return 0;
    }
    let fresh = WakeStats {
        count: 1,
        waker_tgid: (pid_tgid >> 32) as u32,
        _pad: 0,
        waker_comm: bpf_get_current_comm().unwrap_or_default(),
    };
    if WAKES.insert(key, fresh, 0).is_err() {
        bump(counter::LOST_WAKE_MAP);
    }
    0
}
