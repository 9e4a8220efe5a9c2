//! The daemon's capture tiers. Attaching any syscall tracepoint puts every
//! task of the node on the kernel's slow syscall path, and the scheduler
//! hooks run at every context switch of the node, so while its jobs are
//! healthy the daemon keeps only NVML and /proc (the threads' scheduling
//! counters read from there, `capture::schedstat`).
//! A job that looks wrong — its GPU idle for a while, or a busy GPU behind
//! a silent job — gets the full capture (file reads and writes) for a
//! bounded window; then it goes back, and a cooldown keeps it from flapping.
//! The cooldown bounds the cost, not what is known: a GPU that idles again
//! within it gets one short capture, enough for a verdict. Silence is
//! measured against the job's own rhythm. Pure: unit-tested on scripted
//! signals.
use std::time::Duration;

/// When to escalate, for how long, and how long to wait before again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    /// GPU idle this long: look at the input pipeline.
    pub idle_after: Duration,
    /// A busy GPU behind a job silent this long: look at what it waits in
    /// (where the job has no rhythm learnt yet; else 3 of its rhythms,
    /// not under `silent_floor` nor over this).
    pub silent_after: Duration,
    /// The shortest silence escalated, however fast the job's rhythm.
    pub silent_floor: Duration,
    /// How long a full capture lasts at most.
    pub window: Duration,
    /// After a full capture, how long before the next.
    pub cooldown: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            // One default interval: a GPU idle through a whole interval is
            // escalated at once, and explained by the end of the next.
            idle_after: Duration::from_secs(5),
            silent_after: Duration::from_secs(120),
            silent_floor: Duration::from_secs(10),
            window: Duration::from_secs(60),
            cooldown: Duration::from_secs(120),
        }
    }
}

/// How long a short capture, within a cooldown, lasts: the live verdict's
/// span and an interval to publish it.
pub const SHORT_WINDOW: Duration = Duration::from_secs(12);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// NVML and /proc only.
    Cheap,
    /// The full capture, since `since_ns`, until `until_ns` at the latest;
    /// `short`: one taken within a cooldown.
    Full { since_ns: u64, until_ns: u64, short: bool },
    /// Cheap again after a full capture; no escalation before `until_ns`
    /// but one short capture, where `short_left`, if the GPU idles again.
    Cooldown { until_ns: u64, short_left: bool },
}

impl Tier {
    pub fn is_full(self) -> bool {
        matches!(self, Tier::Full { .. })
    }
}

/// What one interval said about a job.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Signals {
    /// The job has GPU data at all (else nothing tells when to look, and it
    /// is always captured in full).
    pub has_gpu: bool,
    /// Its GPUs sat idle through the interval.
    pub gpu_idle: bool,
    /// Its GPUs reported busy.
    pub gpu_busy: bool,
    /// Seconds since the job last moved (read, wrote).
    pub silent_s: f64,
    /// The job's own rhythm: the longest recent gap between its moves.
    pub rhythm_s: Option<f64>,
    /// The span the signals cover (the interval just ended).
    pub interval_ns: u64,
}

/// A GPU idle at least this share of an interval counts as idle for it.
pub const GPU_IDLE_SHARE: f64 = 0.9;

/// One job's tier over time.
#[derive(Debug, Clone)]
pub struct JobTier {
    pub tier: Tier,
    /// Since when the GPU has been idle, while it is.
    idle_since_ns: Option<u64>,
    /// Consecutive busy intervals during a full capture.
    busy_streak: u32,
    /// A full capture asked for (the capture endpoint) lasts at least
    /// until then, whatever the GPU does.
    demanded_until_ns: Option<u64>,
    pub escalations: u64,
}

impl Default for JobTier {
    fn default() -> Self {
        Self {
            tier: Tier::Cheap,
            idle_since_ns: None,
            busy_streak: 0,
            demanded_until_ns: None,
            escalations: 0,
        }
    }
}

/// Busy intervals in a row that end a full capture early: the job is
/// healthy again.
const BUSY_TO_END: u32 = 2;

impl JobTier {
    /// Someone asked for the full capture now, until `until_ns` at least
    /// (a cooldown does not hold it back; a capture under way is extended).
    pub fn demand(&mut self, now_ns: u64, until_ns: u64) {
        self.demanded_until_ns = Some(until_ns);
        self.tier = match self.tier {
            Tier::Full { since_ns, until_ns: end, short } => {
                Tier::Full { since_ns, until_ns: end.max(until_ns), short }
            }
            _ => {
                self.escalations += 1;
                Tier::Full { since_ns: now_ns, until_ns, short: false }
            }
        };
    }

    /// Closes the interval ending at `now_ns`, in the daemon's order:
    /// whether its verdict rests on full data (a capture that has run at
    /// least `settle`), then the tier for the next.
    pub fn close_interval(&mut self, now_ns: u64, s: &Signals, p: &Policy, settle: Duration) -> bool {
        let full = self.settled(now_ns, settle);
        self.step(now_ns, s, p);
        full
    }

    /// Takes the interval ending at `now_ns`; returns the tier for the next.
    pub fn step(&mut self, now_ns: u64, s: &Signals, p: &Policy) -> Tier {
        // Idle since the start of the first idle interval: it was idle
        // (nearly) all through it.
        self.idle_since_ns =
            if s.gpu_idle { self.idle_since_ns.or(Some(now_ns.saturating_sub(s.interval_ns))) } else { None };
        if self.demanded_until_ns.is_some_and(|until| now_ns < until) {
            return self.tier;
        }
        self.demanded_until_ns = None;
        if !s.has_gpu {
            self.tier = Tier::Full { since_ns: self.since_or(now_ns), until_ns: u64::MAX, short: false };
            return self.tier;
        }
        let ns = |d: Duration| d.as_nanos() as u64;
        let idle_long = self.idle_since_ns.is_some_and(|t| now_ns.saturating_sub(t) >= ns(p.idle_after));
        let silent_long = s.gpu_busy && s.silent_s >= silent_threshold(s, p);
        self.tier = match self.tier {
            Tier::Full { since_ns, until_ns, short } => {
                self.busy_streak = if s.gpu_busy { self.busy_streak + 1 } else { 0 };
                if now_ns >= until_ns || self.busy_streak >= BUSY_TO_END {
                    self.busy_streak = 0;
                    // After a short capture, the rest of the cooldown
                    // without another: the cost stays bounded.
                    Tier::Cooldown { until_ns: now_ns.saturating_add(ns(p.cooldown)), short_left: !short }
                } else {
                    Tier::Full { since_ns, until_ns, short }
                }
            }
            Tier::Cooldown { until_ns, short_left } if now_ns < until_ns => {
                // Idle or silent *again*: since the cooldown began, after
                // the GPU was busy (a GPU idle all along waits it out).
                let began = until_ns.saturating_sub(ns(p.cooldown));
                let idle_again = idle_long && self.idle_since_ns.is_some_and(|t| t >= began);
                let silent_again = silent_long && s.silent_s <= now_ns.saturating_sub(began) as f64 / 1e9;
                if short_left && (idle_again || silent_again) {
                    self.escalations += 1;
                    let end = now_ns.saturating_add(ns(SHORT_WINDOW.min(p.window)));
                    Tier::Full { since_ns: now_ns, until_ns: end, short: true }
                } else {
                    Tier::Cooldown { until_ns, short_left }
                }
            }
            Tier::Cheap | Tier::Cooldown { .. } => {
                if idle_long || silent_long {
                    self.escalations += 1;
                    Tier::Full {
                        since_ns: now_ns,
                        until_ns: now_ns.saturating_add(ns(p.window)),
                        short: false,
                    }
                } else {
                    Tier::Cheap
                }
            }
        };
        self.tier
    }

    fn since_or(&self, now_ns: u64) -> u64 {
        match self.tier {
            Tier::Full { since_ns, .. } => since_ns,
            _ => now_ns,
        }
    }

    /// Whether the job's live verdict rests on full data: a full capture
    /// that has run at least `settle` (the span the live verdict judges).
    pub fn settled(&self, now_ns: u64, settle: Duration) -> bool {
        match self.tier {
            Tier::Full { since_ns, .. } => now_ns.saturating_sub(since_ns) >= settle.as_nanos() as u64,
            _ => false,
        }
    }
}

/// How long a job behind a busy GPU may be silent before it is looked at:
/// three of its own rhythms (a run logging every second is looked at after
/// seconds, one saving every ten minutes is not), within the policy's
/// floor and ceiling; the ceiling where no rhythm is known.
fn silent_threshold(s: &Signals, p: &Policy) -> f64 {
    let (floor, ceiling) = (p.silent_floor.as_secs_f64(), p.silent_after.as_secs_f64());
    s.rhythm_s
        .map_or(ceiling, |r| (crate::verdict::rules::SILENT_RHYTHMS * r).clamp(floor.min(ceiling), ceiling))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn policy() -> Policy {
        Policy {
            idle_after: Duration::from_secs(10),
            silent_after: Duration::from_secs(60),
            silent_floor: Duration::from_secs(5),
            window: Duration::from_secs(30),
            cooldown: Duration::from_secs(40),
        }
    }

    fn gpu(idle: bool, silent_s: f64) -> Signals {
        Signals { has_gpu: true, gpu_idle: idle, gpu_busy: !idle, silent_s, rhythm_s: None, interval_ns: S }
    }

    /// Steps `t` once a second over `from..to` with `s`; the tiers seen.
    fn run(t: &mut JobTier, from: u64, to: u64, s: Signals) -> Vec<Tier> {
        (from..to).map(|sec| t.step(sec * S, &s, &policy())).collect()
    }

    #[test]
    fn a_healthy_job_stays_cheap() {
        let mut t = JobTier::default();
        assert!(run(&mut t, 0, 600, gpu(false, 2.0)).iter().all(|x| *x == Tier::Cheap));
        assert_eq!(t.escalations, 0);
    }

    #[test]
    fn an_idle_gpu_escalates_after_the_threshold_then_busy_ends_it_into_a_cooldown() {
        let mut t = JobTier::default();
        // Idle through the interval ending at 1 s: idle since 0 s.
        let tiers = run(&mut t, 1, 20, gpu(true, 1.0));
        let first_full = tiers.iter().position(|x| x.is_full()).unwrap() + 1;
        assert_eq!(first_full, 10, "idle since 0 s, escalated at 10 s");
        assert_eq!(t.escalations, 1);
        assert!(!t.settled(14 * S, Duration::from_secs(5)) && t.settled(15 * S, Duration::from_secs(5)));
        // The GPU is busy again: two busy intervals end the capture.
        let tiers = run(&mut t, 20, 23, gpu(false, 0.5));
        assert!(tiers[0].is_full());
        assert_eq!(tiers[1], Tier::Cooldown { until_ns: 61 * S, short_left: true });
        // Idle again at once, within the cooldown: one short capture once
        // idle for the threshold (since 22 s), enough for a verdict.
        let tiers = run(&mut t, 23, 120, gpu(true, 1.0));
        let full_at: Vec<u64> = (23..120).filter(|s| tiers[(*s - 23) as usize].is_full()).collect();
        assert_eq!(full_at.first(), Some(&32), "idle since 22 s, short capture at 32 s");
        assert_eq!(tiers[(32 - 23) as usize], Tier::Full { since_ns: 32 * S, until_ns: 44 * S, short: true });
        // Then the cooldown that follows it holds, with no short capture
        // left: the next full one at its end (44 + 40 s).
        assert_eq!(tiers[(44 - 23) as usize], Tier::Cooldown { until_ns: 84 * S, short_left: false });
        assert!(full_at.iter().all(|s| (32..44).contains(s) || *s >= 84), "{full_at:?}");
        assert_eq!(full_at.iter().find(|s| **s >= 84), Some(&84));
        assert_eq!(t.escalations, 3);
    }

    /// With the default policy and interval, a GPU that idles again within
    /// the cooldown of an earlier capture, at any phase between two ticks,
    /// is explained within 15 s too: no blind spell.
    #[test]
    fn a_gpu_idle_again_within_a_cooldown_is_explained_within_15_s() {
        let p = Policy::default();
        let interval = 5 * S;
        let settle = Duration::from_nanos(crate::aggregate::RECENT_NS);
        for phase_ms in (0..5000u64).step_by(250) {
            let mut t = JobTier::default();
            // Idle from 0 to 20 s (escalated, explained), busy to 45 s.
            let idle_again = 45 * S + phase_ms * 1_000_000;
            let mut explained_again = None;
            for k in 1..40u64 {
                let now = k * interval;
                let idle_ns = |from: u64, to: u64| now.min(to).saturating_sub(from.max(now - interval));
                let idle = idle_ns(0, 20 * S) + idle_ns(idle_again, u64::MAX);
                let s = Signals {
                    has_gpu: true,
                    gpu_idle: idle as f64 / interval as f64 >= GPU_IDLE_SHARE,
                    gpu_busy: idle == 0,
                    silent_s: 0.0,
                    rhythm_s: None,
                    interval_ns: interval,
                };
                if t.close_interval(now, &s, &p, settle) && now > idle_again {
                    explained_again = Some(now - idle_again);
                    break;
                }
            }
            let after = explained_again.expect("explained again") as f64 / S as f64;
            assert!(after <= 15.0, "idle again at +{phase_ms} ms: explained after {after} s");
        }
    }

    /// Silence is measured against the job's own rhythm: three of them,
    /// not under the floor nor over the ceiling (`silent_after`), which is
    /// the wait where no rhythm is known.
    #[test]
    fn a_silent_job_is_looked_at_after_three_of_its_rhythms() {
        let at = |rhythm: Option<f64>| -> f64 {
            let mut t = JobTier::default();
            let mut silent = 0.0;
            while silent < 100.0 {
                silent += 0.5;
                let s = Signals { rhythm_s: rhythm, ..gpu(false, silent) };
                if t.step((silent * 2.0) as u64 * S, &s, &policy()).is_full() {
                    return silent;
                }
            }
            f64::INFINITY
        };
        assert_eq!(at(Some(1.0)), 5.0, "a job logging every second: the floor");
        assert_eq!(at(Some(4.0)), 12.0, "three rhythms");
        assert_eq!(at(Some(40.0)), 60.0, "the ceiling");
        assert_eq!(at(None), 60.0, "no rhythm learnt: the ceiling");
    }

    /// With the default policy and interval (5 s), a GPU that goes idle at
    /// any moment between two ticks is explained (a verdict on full data
    /// is published) within 15 s.
    #[test]
    fn a_gpu_gone_idle_is_explained_within_15_s_by_default() {
        let p = Policy::default();
        let interval = 5 * S;
        let settle = Duration::from_nanos(crate::aggregate::RECENT_NS);
        for phase_ms in (0..5000u64).step_by(100) {
            let idle_at = 100 * S + phase_ms * 1_000_000;
            let mut t = JobTier::default();
            let mut explained = None;
            for k in 1..60u64 {
                let now = k * interval;
                let idle_ns = now.saturating_sub(idle_at.max(now - interval));
                let idle = idle_ns as f64 / interval as f64 >= GPU_IDLE_SHARE;
                let s = Signals {
                    has_gpu: true,
                    gpu_idle: idle,
                    gpu_busy: idle_ns == 0,
                    silent_s: 0.0,
                    rhythm_s: None,
                    interval_ns: interval,
                };
                if t.close_interval(now, &s, &p, settle) && now > idle_at {
                    explained = Some(now - idle_at);
                    break;
                }
            }
            let after = explained.expect("explained at all") as f64 / S as f64;
            assert!(after <= 15.0, "idle at +{phase_ms} ms after a tick: explained after {after} s");
        }
    }

    #[test]
    fn a_full_capture_is_bounded() {
        let mut t = JobTier::default();
        let tiers = run(&mut t, 0, 60, gpu(true, 1.0));
        let full = tiers.iter().filter(|x| x.is_full()).count();
        assert_eq!(full, 30, "the window, then a cooldown");
        assert!(matches!(tiers[40], Tier::Cooldown { .. }));
    }

    #[test]
    fn a_silent_job_behind_a_busy_gpu_escalates() {
        let mut t = JobTier::default();
        assert_eq!(t.step(10 * S, &gpu(false, 59.0), &policy()), Tier::Cheap);
        assert!(t.step(11 * S, &gpu(false, 60.0), &policy()).is_full());
    }

    #[test]
    fn a_demanded_capture_runs_its_span_through_a_cooldown_and_a_busy_gpu() {
        let mut t = JobTier::default();
        run(&mut t, 0, 12, gpu(true, 1.0));
        run(&mut t, 12, 15, gpu(false, 0.5));
        assert!(matches!(t.tier, Tier::Cooldown { .. }), "{:?}", t.tier);
        t.demand(15 * S, 25 * S);
        assert_eq!(t.tier, Tier::Full { since_ns: 15 * S, until_ns: 25 * S, short: false });
        assert_eq!(t.escalations, 2);
        // Busy all along: the capture still lasts what was asked.
        let tiers = run(&mut t, 15, 30, gpu(false, 0.5));
        assert!(tiers[..10].iter().all(|x| x.is_full()), "{tiers:?}");
        assert!(matches!(tiers[10], Tier::Cooldown { .. }), "{tiers:?}");
    }

    #[test]
    fn a_job_without_gpu_data_is_always_captured_in_full() {
        let mut t = JobTier::default();
        let none = Signals { silent_s: 0.0, ..Default::default() };
        let tiers = run(&mut t, 0, 5, none);
        let always = Tier::Full { since_ns: 0, until_ns: u64::MAX, short: false };
        assert!(tiers.iter().all(|x| *x == always), "{tiers:?}");
    }
}
