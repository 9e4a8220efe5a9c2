//! What the daemon hands out at the end of each interval: the node-wide
//! series, the board `/jobs` serves, and a log line per changed verdict.
use std::time::Duration;

use stall_common::counter::LOST_CAUSES;

use super::{
    http::{Board, BoardJob, Shared},
    metrics::Metrics,
    node::Node,
};
use crate::{capture::procfs, clock, decode::Snapshot, job::GpuFleet, output::jobs};

/// The agent's own cost and the node-wide counters, as last exported.
#[derive(Default)]
pub(super) struct Seen {
    cpu_s: f64,
    events: u64,
    lost: [u64; LOST_CAUSES],
}

/// Each job's published verdict into its history; a change is logged as
/// one JSON line on stderr.
pub(super) fn log_changes(node: &mut Node, details: bool) {
    let now = clock::unix_now_s();
    for w in node.jobs.values_mut() {
        let Some(v) = &w.published else { continue };
        let Some(change) = w.history.note(now, v).cloned() else { continue };
        let mut line = serde_json::json!({
            "msg": "verdict changed",
            "time": change.time,
            "job": w.id,
            "cgroup": w.labels.cgroup,
            "namespace": w.labels.namespace,
            "pod": w.labels.pod,
            "container": w.labels.container,
            "kind": change.kind,
            "verdict": {"line": change.line, "evidence": change.evidence},
        });
        if let Some(previous) = w.history.previous() {
            line["previous"] = serde_json::json!(previous);
        }
        jobs::resolve(&mut line, details);
        eprintln!("{line}");
    }
}

/// What `/jobs` serves until the next interval; the loop is alive.
pub(super) fn board(shared: &Shared, node: &Node) {
    let views = node.views();
    let board = Board {
        time: clock::unix_now_s(),
        jobs: views
            .iter()
            .zip(node.jobs.values())
            .map(|(view, w)| BoardJob {
                id: view.id.clone(),
                doc: jobs::job(view),
                history: serde_json::to_value(w.history.changes().collect::<Vec<_>>()).unwrap_or_default(),
            })
            .collect(),
        not_watched: node.not_watched.clone(),
    };
    shared.publish(board);
    shared.beat();
}

/// Node-wide series: each GPU, losses, and the agent's own cost.
pub(super) fn export_node(
    m: &Metrics,
    snap: &Snapshot,
    gpus: &GpuFleet,
    seen: &mut Seen,
    interval: Duration,
    jobs: usize,
) {
    for g in &gpus.tracks {
        let w = g.window(snap.ts.saturating_sub(interval.as_nanos() as u64), snap.ts);
        m.set_gpu(&w, w.idle_fraction * interval.as_secs_f64());
    }
    let lost: [u64; LOST_CAUSES] = std::array::from_fn(|i| snap.lost[i].saturating_sub(seen.lost[i]));
    seen.lost = snap.lost;
    m.add_lost(&lost);
    m.agent_events.inc_by(snap.events.saturating_sub(seen.events));
    seen.events = snap.events;
    let cpu = procfs::self_cpu_seconds();
    m.agent_cpu.inc_by((cpu - seen.cpu_s).max(0.0));
    seen.cpu_s = cpu;
    m.agent_rss.set(procfs::self_rss_bytes() as i64);
    m.agent_jobs.set(jobs as i64);
    m.nvml_up.set(i64::from(gpus.sampling()));
}
