//! A capture asked for over HTTP: the job escalated to the full capture at
//! once, its switches recorded, and after the window its timeline (the
//! gzip'd Chrome/Perfetto trace `--timeline` writes) handed back. One at a
//! time: the kernel records one job's switches on demand.
use std::path::PathBuf;

use stall_common::counter::LOST_RINGBUF;
use tokio::sync::oneshot;

use super::{
    http::{CaptureRefused, CaptureRequest},
    tier::JobTier,
};
use crate::{
    aggregate::Model,
    decode::Event,
    job::{GpuFleet, LiveHost, Tick},
    timeline::{Buffer, Recording},
};

/// Events a capture's trace holds at most (then it says it was cut).
const MAX_EVENTS: u64 = 1_000_000;

pub struct OnDemand {
    /// The job's cgroup directory (its key in the node) and id.
    pub dir: PathBuf,
    pub job: u32,
    until_ns: u64,
    recording: Recording,
    out: Buffer,
    lost_at_start: u64,
    reply: oneshot::Sender<Result<Vec<u8>, CaptureRefused>>,
}

impl OnDemand {
    /// Starts `req` for job `job` (cgroup `dir`, tier `tier`) at `now_ns`
    /// (the newest snapshot's time), or answers why not.
    pub fn start(
        req: CaptureRequest,
        (job, dir, tier): (u32, &PathBuf, &mut JobTier),
        live: &mut LiveHost,
        now_ns: u64,
        lost: u64,
    ) -> Option<Self> {
        let out = Buffer::default();
        let started = Recording::in_memory(&out, now_ns, MAX_EVENTS)
            .and_then(|r| live.capture.set_timeline_job(job).map(|_| r).map_err(anyhow::Error::from));
        let recording = match started {
            Ok(r) => r,
            Err(e) => {
                let _ = req.reply.send(Err(CaptureRefused::Failed(format!("{e:#}"))));
                return None;
            }
        };
        let until_ns = now_ns.saturating_add(req.seconds * 1_000_000_000);
        tier.demand(now_ns, until_ns);
        eprintln!("stall daemon: capture of {} for {} s asked for", dir.display(), req.seconds);
        Some(Self { dir: dir.clone(), job, until_ns, recording, out, lost_at_start: lost, reply: req.reply })
    }

    /// Takes the job's switch records out of its batch.
    pub fn take(&mut self, batch: &mut Vec<Event>) {
        if let Err(e) = self.recording.take_switches_of(batch, |ev| ev) {
            eprintln!("stall: capture: {e:#}");
        }
    }

    /// Records the job's interval; whether the window is over.
    pub fn tick(&mut self, last: Option<&Tick>, gpus: &GpuFleet, now_ns: u64) -> bool {
        if let Some(tick) = last {
            if let Err(e) = self.recording.tick(tick, gpus) {
                eprintln!("stall: capture: {e:#}");
            }
        }
        now_ns >= self.until_ns
    }

    /// Ends the trace at `end_ns` and answers; `job` is the job's model and
    /// last interval (None: it ended meanwhile).
    pub fn finish(self, job: Option<(&Model, Option<&Tick>)>, live: &mut LiveHost, lost: u64, end_ns: u64) {
        let _ = live.capture.set_timeline_job(0);
        let Some((model, last)) = job else {
            let _ = self.reply.send(Err(CaptureRefused::JobEnded));
            return;
        };
        let roles = last.map(|t| t.roles.clone()).unwrap_or_default();
        let lost = lost.saturating_sub(self.lost_at_start);
        let answer = match self.recording.finish_named(model, &roles, lost, end_ns) {
            Ok(()) => Ok(self.out.take()),
            Err(e) => Err(CaptureRefused::Failed(format!("{e:#}"))),
        };
        let _ = self.reply.send(answer);
    }
}

/// The ring buffer's losses so far, from a snapshot's counters.
pub fn ring_lost(lost: &[u64]) -> u64 {
    lost.get(LOST_RINGBUF as usize).copied().unwrap_or(0)
}
