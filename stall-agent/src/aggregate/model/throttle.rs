//! CPU limits in the model: each limited cgroup's counters, and the time its
//! threads were held back by it, told apart from waiting for a CPU.
//!
//! The kernel does not say which part of a thread's runqueue wait its
//! cgroup's quota caused, so it is apportioned. A cgroup's `throttled_ns`
//! sums, over CPUs, the time its run queues were throttled; spread over the
//! run queues its threads kept busy (their demand, on CPU or runnable, in
//! CPUs, at most the usable CPUs), it is the share `f` of the span each of
//! them was throttled. A thread's throttled time is `f` of its time on CPU
//! or runnable, at most its runqueue wait. Exact for threads that always
//! want a CPU (what a quota throttles); for the rest an estimate, said so
//! in docs/JSON.md.
use stall_common::reason;

use super::{Model, Tally, Thread};
use crate::{cpulimit::Reading, decode::ThreadCounters};

/// One limited cgroup as seen so far.
#[derive(Debug, Clone, Default)]
pub(super) struct LimitTally {
    pub cpus: f64,
    pub periods: Tally,
    pub throttled_periods: Tally,
    pub throttled_ns: Tally,
    /// Its counters when first read, for a cgroup busy before tracing
    /// began (what it throttled before is not the job's).
    pub base: [u64; 3],
}

impl LimitTally {
    /// (periods, throttled periods, throttled ns) since the last mark, or
    /// since tracing started.
    pub fn counts(&self, since_mark: bool) -> [u64; 3] {
        let t = [&self.periods, &self.throttled_periods, &self.throttled_ns];
        let mut out = [0; 3];
        for (i, tally) in t.iter().enumerate() {
            out[i] = if since_mark { tally.since(true) } else { tally.total.saturating_sub(self.base[i]) };
        }
        out
    }

    pub fn set_mark(&mut self) {
        self.periods.set_mark();
        self.throttled_periods.set_mark();
        self.throttled_ns.set_mark();
    }
}

/// `raw` (the kernel's counters) with `throttled` of its runqueue wait
/// moved to [`reason::THROTTLED`].
pub(super) fn with_throttled(raw: &ThreadCounters, throttled: u64) -> ThreadCounters {
    let mut c = *raw;
    let rq = &mut c.off_ns[usize::from(reason::RUNQUEUE)];
    let moved = throttled.min(*rq);
    *rq -= moved;
    c.off_ns[usize::from(reason::THROTTLED)] = moved;
    c
}

/// On CPU and runnable (runqueue plus throttled), as the kernel counted.
fn demand(t: &Thread) -> (u64, u64) {
    let c = &t.total;
    (c.on_cpu_ns, c.off_ns[usize::from(reason::RUNQUEUE)] + c.off_ns[usize::from(reason::THROTTLED)])
}

impl Model {
    /// The cgroup that caps a process's CPU (None: none), from the host.
    pub fn note_cpu_limit(&mut self, tgid: u32, cgroup: Option<String>) {
        if let Some(p) = self.procs.get_mut(&tgid) {
            p.cpu_limit = cgroup;
        }
    }

    /// The limited cgroups the job's live processes are in.
    pub fn limited_cgroups(&self) -> Vec<String> {
        let mut v: Vec<String> =
            self.procs.values().filter(|p| p.alive).filter_map(|p| p.cpu_limit.clone()).collect();
        v.sort();
        v.dedup();
        v
    }

    /// Readings of the limited cgroups at `ts` (after the snapshot of the
    /// same moment): their counters, and the throttled time of their
    /// threads since the last readings. `cpus`: CPUs the job may use.
    pub fn apply_cpu_limits(&mut self, ts: u64, readings: &[Reading], cpus: u32) {
        let span = ts.saturating_sub(if self.limits_ns == 0 { self.start_ns } else { self.limits_ns });
        let traced = ts.saturating_sub(self.start_ns);
        self.limits_ns = ts;
        for r in readings {
            let s = r.stat;
            let now = [s.periods, s.throttled_periods, s.throttled_ns];
            let tally = self.cpu_limits.entry(r.limit.cgroup.clone()).or_insert_with(|| {
                // Its periods (those in which it had work) fit in the time
                // traced: created or busy only since, all it throttled is
                // the job's; else count from now on.
                let since_traced = s.periods.saturating_mul(r.limit.period_ns) <= traced;
                let base = if since_traced { [0; 3] } else { now };
                let mut t = LimitTally::default();
                for (tally, b) in
                    [&mut t.periods, &mut t.throttled_periods, &mut t.throttled_ns].into_iter().zip(base)
                {
                    tally.see(b);
                    tally.set_mark();
                }
                t.base = base;
                t
            });
            tally.cpus = r.limit.cpus;
            let throttled = s.throttled_ns.saturating_sub(tally.throttled_ns.total);
            tally.periods.see(s.periods);
            tally.throttled_periods.see(s.throttled_periods);
            tally.throttled_ns.see(s.throttled_ns);
            self.apportion(&r.limit.cgroup, throttled, span, cpus);
        }
    }

    /// Spreads `throttled` (summed over run queues, in `span`) over the
    /// threads of `cgroup`'s processes.
    fn apportion(&mut self, cgroup: &str, throttled: u64, span: u64, cpus: u32) {
        let tids: Vec<u32> = self
            .procs
            .values()
            .filter(|p| p.cpu_limit.as_deref() == Some(cgroup))
            .flat_map(|p| p.tids.iter().copied())
            .collect();
        let deltas: Vec<(u32, u64, u64)> = tids
            .iter()
            .filter_map(|tid| {
                let t = self.threads.get(tid)?;
                let (on, rq) = demand(t);
                Some((*tid, on.saturating_sub(t.apportioned.0), rq.saturating_sub(t.apportioned.1)))
            })
            .collect();
        if span == 0 {
            return;
        }
        let wanted: u64 = deltas.iter().map(|(_, on, rq)| on + rq).sum();
        let queues = (wanted as f64 / span as f64 - 0.05).ceil().clamp(1.0, f64::from(cpus.max(1)));
        let share = (throttled as f64 / (span as f64 * queues)).min(1.0);
        for (tid, on, rq) in deltas {
            let Some(t) = self.threads.get_mut(&tid) else { continue };
            let add = ((share * (on + rq) as f64) as u64).min(rq);
            let (raw_on, raw_rq) = demand(t);
            t.apportioned = (raw_on, raw_rq);
            if add > 0 {
                let mut raw = t.total;
                raw.off_ns[usize::from(reason::RUNQUEUE)] = raw_rq;
                raw.off_ns[usize::from(reason::THROTTLED)] = 0;
                t.throttled_ns += add;
                t.total = with_throttled(&raw, t.throttled_ns);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        cpulimit::{CpuStat, Limit},
        decode::{Snapshot, ThreadNow, ThreadSnap},
    };

    const S: u64 = 1_000_000_000;

    fn counters(on: f64, rq: f64) -> ThreadCounters {
        let mut c = ThreadCounters { on_cpu_ns: (on * S as f64) as u64, ..Default::default() };
        c.off_ns[usize::from(reason::RUNQUEUE)] = (rq * S as f64) as u64;
        c
    }

    fn snapshot(ts: u64, threads: &[(u32, ThreadCounters)]) -> Snapshot {
        Snapshot {
            ts,
            threads: threads
                .iter()
                .map(|(tid, c)| ThreadSnap {
                    tid: *tid,
                    tgid: *tid,
                    job: 1,
                    counters: *c,
                    now: ThreadNow::default(),
                    other_nr: -1,
                })
                .collect(),
            ..Default::default()
        }
    }

    fn reading(periods: u64, throttled: u64, throttled_s: f64) -> Reading {
        Reading {
            limit: Limit { cgroup: "/sys/fs/cgroup/job".into(), cpus: 0.6, period_ns: 100_000_000 },
            stat: CpuStat {
                periods,
                throttled_periods: throttled,
                throttled_ns: (throttled_s * S as f64) as u64,
            },
        }
    }

    /// Eight CPU-bound workers on two CPUs under a 0.6 CPU quota for 10 s:
    /// each ran 0.75 s and waited 9.25 s; both run queues were throttled 70
    /// % of the time (14 s summed): 7 s of each worker's wait is the limit,
    /// 2.25 s the other workers.
    #[test]
    fn a_quota_holds_cpu_bound_threads_back_for_its_share_of_their_wait() {
        let mut m = Model::new(0);
        let workers: Vec<u32> = (101..=108).collect();
        for &w in &workers {
            m.note_process(w, Some(100), "worker", None);
        }
        // Created during tracing: counted from zero.
        m.apply_snapshot(&snapshot(S, &[]));
        m.apply_snapshot(&snapshot(
            10 * S,
            &workers.iter().map(|&w| (w, counters(0.75, 9.25))).collect::<Vec<_>>(),
        ));
        for &w in &workers {
            m.note_cpu_limit(w, Some("/sys/fs/cgroup/job".into()));
        }
        assert_eq!(m.limited_cgroups(), vec!["/sys/fs/cgroup/job".to_string()]);
        m.apply_cpu_limits(10 * S, &[reading(100, 98, 14.0)], 2);
        for &w in &workers {
            let c = &m.threads[&w].total;
            assert_eq!(c.off_ns[usize::from(reason::THROTTLED)], 7 * S, "{c:?}");
            assert_eq!(c.off_ns[usize::from(reason::RUNQUEUE)], 2_250_000_000);
            assert_eq!(c.on_cpu_ns, 750_000_000);
        }
        // The next snapshot replaces the kernel's counters; what was
        // apportioned stays apportioned, the rest follows the next reading.
        m.apply_snapshot(&snapshot(
            20 * S,
            &workers.iter().map(|&w| (w, counters(1.5, 18.5))).collect::<Vec<_>>(),
        ));
        assert_eq!(m.threads[&101].total.off_ns[usize::from(reason::THROTTLED)], 7 * S);
        assert_eq!(m.threads[&101].total.off_ns[usize::from(reason::RUNQUEUE)], 11_500_000_000);
        m.apply_cpu_limits(20 * S, &[reading(200, 196, 28.0)], 2);
        let c = &m.threads[&101].total;
        assert_eq!(c.off_ns[usize::from(reason::THROTTLED)], 14 * S);
        assert_eq!(c.off_ns[usize::from(reason::RUNQUEUE)], 4_500_000_000);
        let w = m.summary(20 * S);
        assert_eq!(w.cpu_limits.len(), 1);
        let l = &w.cpu_limits[0];
        assert_eq!((l.periods, l.throttled_periods, l.throttled_ns), (200, 196, 28 * S));
        assert_eq!(w.proc(101).unwrap().cpu_limit.as_deref(), Some("/sys/fs/cgroup/job"));
    }

    /// A cgroup busy before tracing began counts from its first reading; a
    /// thread never runnable is never throttled.
    #[test]
    fn a_cgroup_there_before_counts_from_its_first_reading() {
        let mut m = Model::new(0);
        m.note_process(7, Some(1), "sleeper", None);
        m.apply_snapshot(&snapshot(S, &[(7, counters(0.0, 0.0))]));
        m.note_cpu_limit(7, Some("/sys/fs/cgroup/job".into()));
        m.apply_cpu_limits(S, &[reading(5000, 900, 300.0)], 4);
        m.apply_snapshot(&snapshot(2 * S, &[(7, counters(0.01, 0.0))]));
        m.apply_cpu_limits(2 * S, &[reading(5010, 905, 300.5)], 4);
        assert_eq!(m.threads[&7].total.off_ns[usize::from(reason::THROTTLED)], 0);
        let l = &m.summary(2 * S).cpu_limits[0];
        assert_eq!((l.periods, l.throttled_periods, l.throttled_ns), (10, 5, S / 2));
        let i = m.interval(2 * S);
        assert_eq!(i.cpu_limits[0].throttled_periods, 5);
    }
}
