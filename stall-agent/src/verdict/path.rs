//! The path a finding followed: from the trainer's main thread, through
//! what it waits on and who ends its waits, to where the time goes — each
//! step with its share. What the JSON carries as `verdict.path`.
use serde::Serialize;
use stall_common::reason;

use super::{
    classify::{Finding, Scene},
    shares::{self, Shares},
};
use crate::aggregate::{ProcWindow, ThreadWindow, Waker};

/// One step of the path.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PathStep {
    /// Who: `trainer main thread`, `workers`, `loader threads`, `thread`,
    /// `child` (a step each, through a shell that waits for its own),
    /// `children` (run one after another), `peer` (a process outside the
    /// job at the other end of the socket or pipe the trainer reads), or
    /// what it waits on (`output`, `lock`).
    pub who: &'static str,
    pub pids: Vec<u32>,
    pub tids: Vec<u32>,
    /// Where its time goes: a reason (`futex`, `io`, `send`, …), `on-cpu`
    /// (wanting the CPU: on it, or runnable), `gpu-sync` or `gpu-copy`
    /// (inside CUDA's synchronizations or synchronous copies, on CPU or
    /// not); empty for an object.
    pub state: &'static str,
    /// Its share of the window in that state (null for an object).
    pub share: Option<f64>,
    /// What it waits on, in words: a pipe and its reader, a socket's peer,
    /// a lock and its holder.
    pub object: Option<crate::detail::Text>,
    /// Share of the window the trainer's main thread was blocked in waits
    /// this step's threads ended (null for the first step, or where the
    /// kernel did not time the waits).
    pub waited: Option<f64>,
}

fn step(who: &'static str, pids: Vec<u32>, tids: Vec<u32>, state: &'static str, share: f64) -> PathStep {
    PathStep { who, pids, tids, state, share: Some(share), object: None, waited: None }
}

/// Share of the window `main` was blocked in waits ended by the wakers
/// `by` picks; None where no wait of it was timed.
fn waited_for(main: &ThreadWindow, secs: f64, by: impl Fn(&Waker) -> bool) -> Option<f64> {
    if !main.woken_by.iter().any(|b| b.blocked_ns > 0) {
        return None;
    }
    let ns = main.woken_by.iter().filter(|b| by(b)).map(|b| b.blocked_ns).sum();
    Some(Shares::part(main, secs, ns))
}

/// The path of `finding` in `s`; empty where there is no trainer to start
/// from (a busy GPU, too little data).
pub(super) fn of(s: &Scene, finding: &Finding) -> Vec<PathStep> {
    let (Some(trainer), Some((main, tm))) = (s.trainer, s.main.as_ref()) else { return Vec::new() };
    let start = |state: u8, share: f64| {
        let mut first =
            step("trainer main thread", vec![trainer.tgid], vec![main.tid], reason::name(state), share);
        first.object = object_of(main, state);
        first
    };
    let top = tm.top_wait();
    let workers = |state: u8, share: f64| {
        let pids = s.workers.iter().map(|p| p.tgid).collect();
        let tids = s.workers.iter().filter_map(|p| p.main_thread()).map(|t| t.tid).collect();
        step("workers", pids, tids, reason::name(state), share)
    };
    let on_cpu = |who: &'static str, p: &ProcWindow, tids: Vec<u32>, share: f64| {
        step(who, vec![p.tgid], tids, "on-cpu", share)
    };
    let mut path = match finding {
        Finding::InputIo { worker_io, .. } => vec![start(top.0, top.1), workers(reason::IO, *worker_io)],
        Finding::InputNet { worker_wait, .. } => {
            vec![start(top.0, top.1), workers(reason::POLL, *worker_wait)]
        }
        Finding::InputWait { reason: r, share, .. } => vec![start(top.0, top.1), workers(*r, *share)],
        Finding::InputCpu { .. } => {
            let cpu = shares::mean(s.workers.iter().filter_map(|p| p.main_thread()), s.secs, Shares::cpu);
            let mut w = workers(reason::RUNQUEUE, cpu);
            w.state = "on-cpu";
            vec![start(top.0, top.1), w]
        }
        Finding::LoaderThreads { threads, io, cpu, .. } => {
            let tids = threads.iter().map(|t| t.tid).collect();
            let (state, share) = if io >= cpu { (reason::name(reason::IO), *io) } else { ("on-cpu", *cpu) };
            vec![start(top.0, top.1), step("loader threads", vec![trainer.tgid], tids, state, share)]
        }
        Finding::OwnThreadBusy { thread, cpu, .. } => {
            vec![start(top.0, top.1), on_cpu("thread", trainer, vec![thread.tid], *cpu)]
        }
        Finding::OwnThreadWaits { thread, state, share, .. } => {
            let mut t = step("thread", vec![trainer.tgid], vec![thread.tid], reason::name(*state), *share);
            t.object = object_of(thread, *state);
            vec![start(top.0, top.1), t]
        }
        Finding::Child(c) => {
            let mut path = vec![start(reason::OTHER, c.waits)];
            let group = |procs: &[&ProcWindow], state: Option<u8>, share: f64| {
                let pids = procs.iter().map(|p| p.tgid).collect();
                let tids = procs.iter().filter_map(|p| p.main_thread()).map(|t| t.tid).collect();
                let who = if procs.len() > 1 { "children" } else { "child" };
                let mut g = step(who, pids, tids, state.map_or("on-cpu", reason::name), share);
                g.object = state.and_then(|r| object_of(procs.first()?.main_thread()?, r));
                g
            };
            for level in &c.via {
                let mains = level.iter().filter_map(|p| p.main_thread());
                let share = Shares::of_all(mains, s.secs).r(reason::OTHER);
                path.push(group(level, Some(reason::OTHER), share));
            }
            let mut last = group(&c.children, c.state, c.share);
            last.tids = c.threads.iter().map(|t| t.tid).collect();
            last.object = c.state.and_then(|r| c.threads.iter().find_map(|t| object_of(t, r)));
            path.push(last);
            path
        }
        Finding::OutputIo { out, .. } => {
            let out_reason = [reason::SEND, reason::WRITE, reason::SYNC]
                .into_iter()
                .max_by(|a, b| tm.r(*a).total_cmp(&tm.r(*b)))
                .unwrap_or(reason::WRITE);
            vec![start(out_reason, *out)]
        }
        Finding::TrainerReads { own_io } => vec![start(reason::IO, *own_io)],
        Finding::TrainerStream { wait, peer, .. } => {
            let mut path = vec![start(reason::POLL, *wait)];
            if let Some((p, a)) = peer.and_then(|p| Some((p, p.activity?))) {
                let mut past = step("peer", vec![p.pid], Vec::new(), "on-cpu", a.cpu().min(1.0));
                if super::classify::peer_work(p) == Some(super::classify::PeerWork::Storage) {
                    (past.state, past.share) = (reason::name(reason::IO), None);
                }
                path.push(past);
            }
            path
        }
        Finding::GpuWait { sync } => {
            vec![step("trainer main thread", vec![trainer.tgid], vec![main.tid], "gpu-sync", *sync)]
        }
        Finding::GpuCopies { copy } => {
            vec![step("trainer main thread", vec![trainer.tgid], vec![main.tid], "gpu-copy", *copy)]
        }
        Finding::TrainerBusy { cpu } => {
            vec![on_cpu("trainer main thread", trainer, vec![main.tid], *cpu)]
        }
        Finding::HangNoProgress(_) | Finding::HangBehindBusyGpu(_) | Finding::Idle { .. } => {
            vec![start(top.0, top.1)]
        }
        Finding::NoSingleBottleneck => vec![start(top.0, top.1)],
        Finding::GpuBusy(_) | Finding::NotEnoughData | Finding::TrainerUntraced => Vec::new(),
    };
    // The step the main thread's waits lead to: how much of them it ended.
    if let Some(last) = path.get_mut(1) {
        let (pids, tids) = (last.pids.clone(), last.tids.clone());
        last.waited = match last.who {
            "workers" | "child" | "children" | "peer" => waited_for(main, s.secs, |b| pids.contains(&b.tgid)),
            _ => waited_for(main, s.secs, |b| b.thread().is_some_and(|t| tids.contains(&t))),
        };
    }
    path
}

/// What `t` was seen waiting on in `state`, in words.
fn object_of(t: &ThreadWindow, state: u8) -> Option<crate::detail::Text> {
    t.wait_object(state).map(|o| o.describe())
}
