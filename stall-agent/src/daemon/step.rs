//! One interval of one job in the daemon: its tick, its capture tier for
//! the next, the verdict it may publish, and its series exported.
use std::time::Duration;

use super::{
    metrics::{Metrics, RankState},
    node::Watched,
    tier,
};
use crate::{
    aggregate::RECENT_NS,
    decode::Snapshot,
    job::{GpuFleet, LiveHost, Stacks, Tick},
    verdict::{rules, Kind, Verdict},
};

/// One interval of one job: its tick, its tier for the next, exported,
/// then what ended forgotten.
pub(super) fn step(
    w: &mut Watched,
    live: &mut LiveHost,
    snap: &Snapshot,
    gpus: &GpuFleet,
    metrics: &Metrics,
    tiers: Option<&tier::Policy>,
    hooks: bool,
) {
    // Python stacks for what the full capture blames (escalated jobs).
    w.job.stacks = if tiers.is_none() || w.tier.tier.is_full() { Stacks::On } else { Stacks::Off };
    let tick = w.job.tick(live, &snap.of_job(w.job.id), gpus);
    if !hooks {
        w.job.note_io(live, &tick.roles, snap.ts);
    }
    metrics.add_window(&w.labels, &tick.interval, &tick.roles);
    let secs = tick.interval.secs();
    for g in &tick.interval_gpus {
        metrics.add_job_gpu(&w.labels, g, secs);
    }
    metrics.set_last_progress(&w.labels, crate::clock::unix_now_s() - tick.progress.silent_s);
    let verdict = match tiers {
        None => tick.verdict.clone(),
        Some(policy) => {
            if w.tier.tier.is_full() {
                metrics.add_full_capture(&w.labels, secs);
            }
            let before = w.tier.escalations;
            // Full data for the span the live verdict judges, or not.
            let full =
                w.tier.close_interval(snap.ts, &signals(&tick), policy, Duration::from_nanos(RECENT_NS));
            metrics.add_escalations(&w.labels, w.tier.escalations - before);
            metrics.set_tier(&w.labels, w.tier.tier.is_full());
            published(&tick, full, w.published.as_ref())
        }
    };
    metrics.set_verdict(&w.labels, verdict.kind);
    let run_id = tick.roles.run_id.as_deref().unwrap_or("");
    let ranks = verdict.run.iter().flat_map(|r| &r.ranks);
    let ranks = ranks
        .map(|r| RankState {
            labels: w.labels.rank(run_id, r.number, r.pid),
            kind: r.kind,
            peer_wait: r.peer_wait,
            collectives: r.collectives,
        })
        .collect();
    w.ranks = metrics.set_ranks(ranks, &w.ranks);
    w.published = Some(verdict);
    w.last = Some(tick);
    w.job.prune();
}

/// What a tick says to the tiers.
fn signals(tick: &Tick) -> tier::Signals {
    let has_gpu = !tick.interval_gpus.is_empty();
    tier::Signals {
        has_gpu,
        gpu_idle: has_gpu
            && tick.interval_gpus.iter().all(|g| g.samples > 0 && g.idle_fraction >= tier::GPU_IDLE_SHARE),
        gpu_busy: tick.interval_gpus.iter().any(|g| g.util_mean_pct >= rules::GPU_BUSY_PCT),
        silent_s: tick.progress.silent_s,
        rhythm_s: tick.progress.rhythm_s,
        interval_ns: (tick.interval.secs() * 1e9) as u64,
    }
}

/// The verdict to publish: the live one when it rests on full data; in the
/// cheap tier only what it can vouch for — a busy GPU (or a hang behind
/// one), judged from the GPU and /proc — and otherwise the
/// last full verdict while the job waits for its next capture.
fn published(tick: &Tick, full: bool, before: Option<&Verdict>) -> Verdict {
    if full || tick.verdict.kind.cheap_tier_vouches() {
        return tick.verdict.clone();
    }
    if let Some(v) = before.filter(|v| !v.kind.cheap_tier_vouches()) {
        return v.clone();
    }
    Verdict {
        kind: Kind::Unknown,
        summary: "no full capture of this job yet (cheap tier: the GPU and the kernel's per-thread counters only); it starts once its GPU has idled for the escalation threshold".into(),
        evidence: tick.verdict.evidence.clone(),
        host_only: tick.verdict.host_only,
        ..Default::default()
    }
}
