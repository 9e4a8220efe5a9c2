//! The scheduler family: off-CPU time by reason (`sched_switch`, switch.rs,
//! with the runqueue-clock cache in clock.rs), who wakes whom
//! (`sched_waking`, wakeups.rs) and the job's tasks coming and going
//! (task.rs), on raw tracepoints: a perf-event tracepoint program is
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
mod clock;
mod switch;
mod task;
mod wakeups;

use stall_common::{Config, ThreadStats};

use crate::{
    kread::read_u32,
    maps::THREADS,
    untracked::{self, Noted},
};

pub(crate) use switch::{flush_fd_waited, kclock_flags, kernel_totals, split_by_totals};
pub(crate) use wakeups::flush_waited;

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
