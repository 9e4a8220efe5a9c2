//! The threads' scheduling counters without the scheduler hooks. While the
//! daemon's cheap tier leaves `sched_switch` and `sched_waking` detached (a
//! node's context switches then pay nothing for stall), each tracked
//! thread's `THREADS` entry is brought up to date from /proc once per
//! interval: on-CPU and runqueue time exactly, from the kernel's own totals
//! (`schedstat`: `se.sum_exec_runtime`, `sched_info.run_delay`, which the
//! hooks read too); the rest of the span blocked, for the reason the thread
//! waits in when read (`stat`, `syscall`), which is a sample. Wakers are
//! not seen. An entry keeps the kernel side's meaning (marked `seeded`, a
//! state read from /proc), so the hooks go on from the last reading when
//! they are attached again, and a reading goes on from the hooks' last
//! switch once they are detached.
use std::collections::HashSet;

use stall_common::{kclock, reason, run_state, sleep, task_flags, ThreadStats};

use super::{procfs, Capture};
use crate::clock::monotonic_ns;

/// One thread as /proc shows it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    /// `None` where the kernel keeps no `schedstat` (CONFIG_SCHED_INFO).
    pub exec_ns: Option<u64>,
    /// `None` where the kernel keeps no `run_delay`.
    pub delay_ns: Option<u64>,
    /// Blocked: why, and in which syscall (-1: none); `None`: runnable.
    pub blocked: Option<(u8, i32)>,
    /// Blocked, but /proc would not say in which syscall: the reason is
    /// a guess from the state letter alone.
    pub unreadable: bool,
}

/// Reads thread `tid` of `tgid`; None once it is gone (or a zombie).
pub fn read(tgid: u32, tid: u32, run_delay: bool) -> Option<Reading> {
    read_with(tgid, tid, procfs::thread_schedstat(tgid, tid), run_delay)
}

/// [`read`], the kernel's totals (`schedstat`) read already.
fn read_with(tgid: u32, tid: u32, totals: Option<procfs::Schedstat>, run_delay: bool) -> Option<Reading> {
    let stat = procfs::thread_stat(tgid, tid)?;
    if matches!(stat.state, 'Z' | 'X' | 'x') {
        return None;
    }
    // A thread blocked has a syscall to show; one that runs (or has just
    // been woken: the two reads race it) shows "running".
    let mut unreadable = false;
    let blocked = match stat.state {
        'R' => None,
        state => match procfs::thread_syscall_text(tgid, tid) {
            // Still blocked (the state says so), not running: counted as
            // such, in no known syscall, rather than as on-CPU all along.
            Err(_) => {
                unreadable = true;
                Some((blocked_reason(-1, state, || None), -1))
            }
            Ok(text) => procfs::parse_syscall(&text).map(|call| {
                let fd_regular = || procfs::fd_info(tgid, call.arg0? as i32).map(|o| o.regular);
                (blocked_reason(call.nr, state, fd_regular), call.nr as i32)
            }),
        },
    };
    Some(Reading {
        exec_ns: totals.map(|k| k.exec_ns),
        delay_ns: totals.filter(|_| run_delay).map(|k| k.delay_ns),
        blocked,
        unreadable,
    })
}

/// A new entry for a thread read as `r` at `now`: the kernel's totals so
/// far are its base (what they add from now on is the job's).
pub fn seed(tgid: u32, job: u32, now: u64, r: &Reading) -> ThreadStats {
    let t = ThreadStats { tgid, job, last_ts: now, off_nr: -1, other_nr: -1, ..Default::default() };
    settle(&t, now, r)
}

/// Entry `e` brought up to `now` by reading `r`. Since `e.last_ts` the
/// kernel's totals moved by exactly the thread's time on-CPU and in the
/// runqueue; the rest it was blocked: for the reason it is blocked in now,
/// else for the one it was blocked in then, else (runnable both times) it
/// waited for a CPU whose wait `run_delay` does not hold yet. The state
/// is set as read, for the hooks or the next reading to go on from.
pub fn settle(e: &ThreadStats, now: u64, r: &Reading) -> ThreadStats {
    let mut t = *e;
    let rq = usize::from(reason::RUNQUEUE);
    // A span is counted from a known state (an entry the kernel adopted
    // but never switched has none: its time so far is in its totals).
    let known = e.state != run_state::UNKNOWN;
    if let (Some(exec), true, true) = (r.exec_ns, e.kclock & kclock::EXEC != 0, known) {
        let span = now.saturating_sub(e.last_ts);
        let ran = exec.saturating_sub(e.exec_ns).min(span);
        let off = span - ran;
        // `delay_ns` is as of the last switch-out; a thread switched in
        // since had that wait counted already (from its wakeup).
        let delay_then = match e.state == run_state::RUNNING && e.seeded == 0 {
            true => e.delay_ns + e.off_ns[rq].saturating_sub(e.rq_at_out),
            false => e.delay_ns,
        };
        let waited = match (r.delay_ns, e.kclock & kclock::DELAY != 0) {
            (Some(delay), true) => delay.saturating_sub(delay_then).min(off),
            _ => 0,
        };
        let was_blocked = e.state == run_state::OFF && e.off_reason != reason::RUNQUEUE;
        let (why, nr) = match r.blocked {
            Some(b) => b,
            None if was_blocked => (e.off_reason, e.off_nr),
            None => (reason::RUNQUEUE, -1),
        };
        t.off_ns[rq] += waited;
        t.off_ns[usize::from(why).min(reason::COUNT - 1)] += off - waited;
        if why == reason::OTHER && off > waited {
            t.other_nr = nr;
        }
        t.on_cpu_ns += ran;
        t.exec_ns = t.exec_ns.max(exec);
    } else if let (Some(exec), true) = (r.exec_ns, e.kclock & kclock::EXEC != 0) {
        t.exec_ns = t.exec_ns.max(exec);
    } else if let Some(exec) = r.exec_ns {
        // Created without the kernel's totals (a seed, or an entry from
        // before): based on them from now on, with on-CPU time so far kept.
        t.kclock |= kclock::EXEC;
        t.exec_base = exec.saturating_sub(e.on_cpu_ns);
        t.exec_ns = exec;
    }
    if let Some(delay) = r.delay_ns {
        if t.kclock & kclock::DELAY == 0 {
            t.kclock |= kclock::DELAY;
            t.delay_base = delay;
        }
        t.delay_ns = delay;
    }
    match r.blocked {
        Some((why, nr)) => {
            t.state = run_state::OFF;
            t.off_reason = why;
            t.off_nr = nr;
        }
        None => {
            t.state = run_state::RUNNING;
            t.off_nr = -1;
        }
    }
    t.rq_at_out = t.off_ns[rq];
    t.last_ts = now;
    t.wake_ts = 0;
    t.seeded = 1;
    t
}

/// Whether a thread its entry shows blocked has not run since: its entry
/// is right as it stands (blocked, for the reason read then, since
/// `last_ts`), with nothing to read or write. Most threads of a job, most
/// of the time.
fn still_blocked(e: &ThreadStats, now: &procfs::Schedstat) -> bool {
    e.state == run_state::OFF && e.kclock & kclock::EXEC != 0 && now.exec_ns == e.exec_ns
}

impl Capture {
    /// Whether the kernel keeps `run_delay` (runqueue time in `schedstat`).
    pub(super) fn run_delay(&self) -> bool {
        self.task_flags & task_flags::RUN_DELAY != 0
    }

    /// Brings every tracked thread's entry up to now from /proc (see the
    /// module's comment); for use while the scheduler hooks are detached.
    pub fn sample_sched(&mut self) {
        let entries: Vec<(u32, ThreadStats)> = self.threads.iter().filter_map(Result::ok).collect();
        self.sampled = entries.iter().map(|(tid, _)| *tid).collect();
        let run_delay = self.run_delay();
        for (tid, e) in entries {
            let Some(totals) = procfs::thread_schedstat(e.tgid, tid) else { continue };
            if still_blocked(&e, &totals) {
                continue;
            }
            let Some(r) = read_with(e.tgid, tid, Some(totals), run_delay) else { continue };
            // BPF_EXIST: an entry its exit removed meanwhile stays removed.
            let _ = self.threads.insert(tid, settle(&e, monotonic_ns(), &r), 2);
        }
    }

    /// Seeds the `tasks` (pid, tid) of a watched cgroup not tracked yet:
    /// without the scheduler hooks nothing adopts a task that enters a
    /// watched cgroup from outside (`kubectl exec`), so the agent does, at
    /// each look. Returns the processes new to the job.
    pub(super) fn adopt(&mut self, tasks: &[(u32, u32)], job: u32) -> HashSet<u32> {
        let mut new_procs = HashSet::new();
        for &(pid, tid) in tasks {
            // Known from the last sample (a tid reused since is adopted at
            // the look after the next), else asked of the map.
            if self.sampled.contains(&tid) || self.threads.get(&tid, 0).is_ok() {
                continue;
            }
            if self.threads.get(&pid, 0).is_err() {
                new_procs.insert(pid);
            }
            let _ = self.seed_thread(pid, tid, job);
        }
        new_procs
    }
}

/// The wait reason of a thread found blocked, from what /proc shows: the
/// syscall it is in (classed by the table the kernel side is loaded
/// with), its state letter, and (for reads and writes) whether the
/// descriptor is a regular file; by the kernel side's own rule.
fn blocked_reason(nr: i64, state: char, fd_regular: impl FnOnce() -> Option<bool>) -> u8 {
    reason::reason_for(crate::syscalls::class(nr), sleep::from_proc(state), fd_regular)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocked_reasons_from_proc() {
        assert_eq!(blocked_reason(202, 'S', || None), reason::FUTEX);
        assert_eq!(blocked_reason(0, 'S', || Some(false)), reason::POLL);
        assert_eq!(blocked_reason(0, 'D', || Some(true)), reason::IO);
        assert_eq!(blocked_reason(7, 'S', || None), reason::POLL);
        assert_eq!(blocked_reason(230, 'S', || None), reason::SLEEP);
        assert_eq!(blocked_reason(-1, 'D', || None), reason::IO);
        assert_eq!(blocked_reason(61, 'S', || None), reason::OTHER);
        assert_eq!(blocked_reason(1, 'D', || Some(true)), reason::WRITE);
        assert_eq!(blocked_reason(1, 'S', || Some(false)), reason::SEND);
        // Descriptor unknown: a file blocks uninterruptibly, a pipe does not.
        assert_eq!(blocked_reason(18, 'D', || None), reason::WRITE);
        assert_eq!(blocked_reason(1, 'S', || None), reason::SEND);
        assert_eq!(blocked_reason(44, 'S', || None), reason::SEND, "sendto");
        assert_eq!(blocked_reason(74, 'D', || None), reason::SYNC);
        assert_eq!(blocked_reason(75, 'S', || None), reason::SYNC);
    }

    const MS: u64 = 1_000_000;
    const FUTEX: Option<(u8, i32)> = Some((reason::FUTEX, 202));

    fn reading(exec_ms: u64, delay_ms: u64, blocked: Option<(u8, i32)>) -> Reading {
        Reading { exec_ns: Some(exec_ms * MS), delay_ns: Some(delay_ms * MS), blocked, unreadable: false }
    }

    /// What the agent's fold reports for `t` at `now`.
    fn counters(t: &ThreadStats, now: u64) -> crate::decode::ThreadCounters {
        crate::decode::fold(t, now).0
    }

    #[test]
    fn a_blocked_thread_that_has_not_run_needs_no_reading() {
        let t = seed(10, 1, 0, &reading(5000, 700, FUTEX));
        let same = procfs::Schedstat { exec_ns: 5000 * MS, delay_ns: 700 * MS };
        assert!(still_blocked(&t, &same));
        assert!(!still_blocked(&t, &procfs::Schedstat { exec_ns: 5001 * MS, ..same }));
        // Runnable when read: it may be waiting for a CPU all along.
        let t = seed(10, 1, 0, &reading(5000, 700, None));
        assert!(!still_blocked(&t, &same));
        // Its fold, untouched, counts the span as it would have been settled.
        let t = seed(10, 1, 0, &reading(5000, 700, FUTEX));
        let settled = settle(&t, 3000 * MS, &reading(5000, 700, FUTEX));
        assert_eq!(counters(&t, 3000 * MS).off_ns, counters(&settled, 3000 * MS).off_ns);
    }

    #[test]
    fn a_seed_counts_from_its_reading_on() {
        let t = seed(10, 1, 1000 * MS, &reading(5000, 700, FUTEX));
        let c = counters(&t, 1000 * MS);
        assert_eq!((c.on_cpu_ns, c.off_cpu_ns()), (0, 0));
        assert_eq!((t.state, t.off_reason, t.off_nr, t.seeded), (run_state::OFF, reason::FUTEX, 202, 1));
    }

    /// Over two readings a second apart: 300 ms on CPU, 100 ms in the
    /// runqueue (the kernel's totals), the other 600 ms blocked in the
    /// futex it is found in.
    #[test]
    fn a_span_splits_by_the_kernels_totals() {
        let t = seed(10, 1, 0, &reading(5000, 700, None));
        let t = settle(&t, 1000 * MS, &reading(5300, 800, FUTEX));
        let c = counters(&t, 1000 * MS);
        assert_eq!(c.on_cpu_ns, 300 * MS);
        assert_eq!(c.off_ns[usize::from(reason::RUNQUEUE)], 100 * MS);
        assert_eq!(c.off_ns[usize::from(reason::FUTEX)], 600 * MS);
        // Still blocked a second later, without running: all futex.
        let t = settle(&t, 2000 * MS, &reading(5300, 800, FUTEX));
        let c = counters(&t, 2000 * MS);
        assert_eq!((c.on_cpu_ns, c.off_ns[usize::from(reason::FUTEX)]), (300 * MS, 1600 * MS));
    }

    /// Woken since: the time off-CPU was spent in what it waited in then.
    /// Runnable both times: what is neither running nor in `run_delay` is
    /// the wait for a CPU still under way.
    #[test]
    fn the_blocked_reason_is_the_one_read_now_else_then() {
        let sleep = Some((reason::SLEEP, 230));
        let t = seed(10, 1, 0, &reading(0, 0, sleep));
        let t = settle(&t, 1000 * MS, &reading(100, 0, None));
        assert_eq!(counters(&t, 1000 * MS).off_ns[usize::from(reason::SLEEP)], 900 * MS);
        let t = settle(&t, 2000 * MS, &reading(1000, 50, None));
        let c = counters(&t, 2000 * MS);
        assert_eq!(c.off_ns[usize::from(reason::RUNQUEUE)], 100 * MS);
        assert_eq!(c.on_cpu_ns, 1000 * MS);
        assert_eq!(c.off_cpu_ns() + c.on_cpu_ns, 2000 * MS, "every ns of the span counted once");
    }

    /// The hooks detached after a switch-in: the wait before it is in
    /// `off_ns` already and must not count again from `run_delay`.
    #[test]
    fn a_reading_goes_on_from_the_hooks_last_switch() {
        let rq = usize::from(reason::RUNQUEUE);
        let mut k = seed(10, 1, 0, &reading(0, 0, None));
        k.seeded = 0;
        // Switched out at 100 ms (delay 0), woken, switched in at 130 ms
        // after 30 ms in the runqueue (now in run_delay too).
        k.state = run_state::RUNNING;
        k.last_ts = 130 * MS;
        k.exec_ns = 100 * MS;
        k.off_ns[rq] = 30 * MS;
        k.rq_at_out = 0;
        k.delay_ns = 0;
        let t = settle(&k, 1000 * MS, &reading(970, 30, None));
        let c = counters(&t, 1000 * MS);
        assert_eq!(c.off_ns[rq], 30 * MS, "the wait counted once");
        assert_eq!(c.on_cpu_ns, 970 * MS);
        // And the kernel side goes on from the reading: marked read from /proc.
        assert_eq!((t.seeded, t.state, t.last_ts), (1, run_state::RUNNING, 1000 * MS));
    }

    /// Adopted by the kernel (at its exit or exec) but never switched: no
    /// state to count a span from, only its totals since adoption.
    #[test]
    fn an_entry_never_switched_counts_no_span() {
        let e = ThreadStats {
            kclock: kclock::EXEC | kclock::DELAY,
            exec_base: 500 * MS,
            exec_ns: 500 * MS,
            ..Default::default()
        };
        let t = settle(&e, 10_000 * MS, &reading(700, 0, FUTEX));
        let c = counters(&t, 10_000 * MS);
        assert_eq!((c.on_cpu_ns, c.off_cpu_ns()), (200 * MS, 0));
        let t = settle(&t, 11_000 * MS, &reading(700, 0, FUTEX));
        assert_eq!(counters(&t, 11_000 * MS).off_ns[usize::from(reason::FUTEX)], 1000 * MS);
    }

    #[test]
    fn an_entry_without_the_kernels_totals_keeps_its_time_so_far() {
        let e =
            ThreadStats { on_cpu_ns: 40 * MS, last_ts: 0, state: run_state::RUNNING, ..Default::default() };
        let t = settle(&e, 1000 * MS, &reading(900, 10, FUTEX));
        assert_eq!(counters(&t, 1000 * MS).on_cpu_ns, 40 * MS);
        let t = settle(&t, 2000 * MS, &reading(950, 10, FUTEX));
        assert_eq!(counters(&t, 2000 * MS).on_cpu_ns, 90 * MS);
    }
}
