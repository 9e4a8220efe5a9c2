//! A distributed run: every rank judged on its own trainer and workers,
//! and the rank that holds the others back named. Ranks end each step in a
//! collective, so one rank held by its own cause (its input, its host CPU,
//! a hang) leaves every other rank waiting for it: their own pipelines are
//! fine, their trainers blocked.
use std::collections::HashMap;

use serde::Serialize;
use stall_common::reason;

use super::{rules, shares::Shares, trainer, words, Blamed, Kind, Verdict};
use crate::{
    aggregate::Window, correlate::Roles, gpu::GpuWindow, progress::ProgressView, units, wait::WaitObject,
};

/// What the run's ranks did, and who holds them back.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct RunVerdict {
    pub ranks: Vec<RankVerdict>,
    /// The rank that holds the others (null: none does, or all alike).
    pub straggler: Option<Straggler>,
}

/// One rank, judged on its own part of the job (host side).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankVerdict {
    pub rank: u32,
    /// Its trainer process.
    pub pid: u32,
    pub kind: Kind,
    pub summary: String,
    /// Share of the window its trainer's main thread was blocked while its
    /// own pipeline kept up: waiting for its peers (0 where its own cause
    /// holds it).
    pub peer_wait: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Straggler {
    pub rank: u32,
    pub pid: u32,
    pub kind: Kind,
    /// The ranks that wait for it, and their mean share waiting.
    pub waiting_ranks: Vec<u32>,
    pub peer_wait: f64,
}

/// Kinds that are a rank's own cause: what it waits for is on its side.
fn holds(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::InputIoBound
            | Kind::InputCpuBound
            | Kind::InputWaitBound
            | Kind::OutputIoBound
            | Kind::TrainerHostBound
            | Kind::Hang
    )
}

/// The run's verdict: the straggler's, named as the run's, or (ranks even)
/// what most ranks say. `in_collective`: for the trainers (by pid) whose
/// Python stacks were read, whether their main thread waits inside a
/// collective: such a rank waits for its peers whatever its own verdict
/// says (a run stuck behind one hung rank looks hung on every rank).
pub(super) fn judge(
    w: &Window,
    roles: &Roles,
    gpus: &[GpuWindow],
    progress: &ProgressView,
    in_collective: &HashMap<u32, bool>,
) -> Verdict {
    // Busy GPUs answer for every rank the way they do for one trainer.
    if !gpus.is_empty() && gpus.iter().all(|g| g.util_mean_pct >= rules::GPU_BUSY_PCT) {
        return trainer::judge(w, roles, gpus, progress);
    }
    let secs = w.secs();
    let judged: Vec<Judged> = roles
        .ranks
        .iter()
        .map(|&(rank, pid)| {
            // Its own trainer and workers: their files, their CPU, and the
            // GPUs NVML saw them on.
            let own = w.only(|tgid| roles.rank_of(tgid) == Some(rank));
            let own_gpus: Vec<GpuWindow> = gpus
                .iter()
                .filter(|g| g.pids.iter().any(|p| roles.rank_of(*p) == Some(rank)))
                .cloned()
                .collect();
            let (verdict, summary) =
                trainer::judge_with_line(&own, &roles.of_rank(rank), &own_gpus, progress);
            let blocked =
                w.proc(pid).and_then(|p| p.main_thread()).map_or(0.0, |m| Shares::of(m, secs).blocked());
            let peer_wait = match in_collective.get(&pid) {
                Some(true) => blocked,
                _ if holds(verdict.kind) || blocked < rules::TRAINER_WAITS => 0.0,
                _ => blocked,
            };
            Judged {
                rank: RankVerdict { rank, pid, kind: verdict.kind, summary, peer_wait },
                verdict,
                blocked,
            }
        })
        .collect();
    let ranks: Vec<RankVerdict> = judged.iter().map(|j| j.rank.clone()).collect();
    let waiting: Vec<&RankVerdict> = ranks.iter().filter(|r| r.peer_wait > 0.0).collect();
    // The holder that waits least for anyone: the others wait for it.
    let holders: Vec<&Judged> =
        judged.iter().filter(|j| holds(j.rank.kind) && j.rank.peer_wait == 0.0).collect();
    let holder =
        holders.iter().min_by(|a, b| a.blocked.total_cmp(&b.blocked).then(a.rank.rank.cmp(&b.rank.rank)));
    // A few ranks holding the rest back; where most ranks "hold", nothing
    // says which of them the others wait for.
    let (mut v, straggler) = match holder {
        Some(Judged { rank: r, verdict: v, .. }) if !waiting.is_empty() && holders.len() <= waiting.len() => {
            let mean_wait = waiting.iter().map(|x| x.peer_wait).sum::<f64>() / waiting.len() as f64;
            let straggler = Straggler {
                rank: r.rank,
                pid: r.pid,
                kind: r.kind,
                waiting_ranks: waiting.iter().map(|x| x.rank).collect(),
                peer_wait: mean_wait,
            };
            let mut v = v.clone();
            v.summary = format!(
                "rank {} (pid {}) holds the run: {} — {}; {} wait for it {} of the time",
                r.rank,
                r.pid,
                r.kind,
                &r.summary,
                ranks_word(&straggler.waiting_ranks),
                units::pct(mean_wait)
            );
            (v, Some(straggler))
        }
        _ => (even(&judged), None),
    };
    // Every rank looks hung: their trainers' Python stacks (read for the
    // blamed threads) can tell the ranks waiting in a collective from the
    // one that never reached it.
    if straggler.is_none() && ranks.iter().filter(|r| r.kind == Kind::Hang).count() >= 2 {
        for r in ranks.iter().filter(|r| r.kind == Kind::Hang) {
            if !v.blamed.iter().any(|b| b.tid == r.pid) {
                v.blamed.push(Blamed { pid: r.pid, tid: r.pid, what: "rank trainer main thread" });
            }
        }
    }
    v.host_only = gpus.is_empty();
    v.summary = words::with_gpus(&v.summary, gpus, secs);
    if w.lost_total() > 0 {
        v.summary.push_str(words::PARTIAL_NOTE);
    }
    let mut evidence: Vec<String> = ranks
        .iter()
        .map(|r| format!("rank {} (pid {}): {} — {}", r.rank, r.pid, r.kind, &r.summary))
        .collect();
    evidence.append(&mut v.evidence);
    v.evidence = evidence;
    v.run = Some(RunVerdict { ranks, straggler });
    v
}

/// For a run whose hung ranks name no straggler yet: whether each rank's
/// trainer waits inside a collective (by pid), when that tells some ranks
/// apart. What its main thread waits on says so first: a socket to another
/// rank, or to a peer off this node (`holder`: which process of the job
/// holds the other end of a socket, from the waiter's side), is a wait on
/// its peers; any other object (a pipe, a file, a lock, a child) or a
/// sleep is not. Only a wait with no object to follow (a futex, as a
/// collective run by another thread of the trainer is waited for) is left
/// to its Python stack, where one was read.
pub fn collective_waits(
    v: &Verdict,
    w: &Window,
    holder: impl Fn(u32, &str) -> Option<u32>,
) -> Option<HashMap<u32, bool>> {
    let run = v.run.as_ref().filter(|r| r.straggler.is_none())?;
    let ranks: Vec<u32> = run.ranks.iter().map(|r| r.pid).collect();
    // Per rank: whether it waits on a peer, and the rank it waits on.
    let by_wait = |pid: u32| -> Option<(bool, Option<u32>)> {
        let main = w.proc(pid)?.main_thread()?;
        if main.now.running {
            return Some((false, None));
        }
        // What /proc said is kept from an earlier tick: it holds only while
        // the thread is still in a call with an object.
        let current = crate::wait::subject_of(i64::from(main.now.syscall)).is_some();
        match main.waits_on.as_ref().filter(|_| current) {
            Some((_, WaitObject::Socket { peer: Some(peer), .. })) => Some(match holder(pid, peer) {
                Some(other) => (other != pid && ranks.contains(&other), Some(other)),
                // Off this node (or outside the job): a peer on another node.
                None => (true, None),
            }),
            Some(_) => Some((false, None)),
            None => (main.now.reason == reason::SLEEP).then_some((false, None)),
        }
    };
    let by_stack = |pid: u32| {
        let stack = v.python_stacks.iter().find(|s| s.pid == pid && s.tid == pid)?;
        Some(stack.in_collective())
    };
    let waits: HashMap<u32, (bool, Option<u32>)> =
        ranks.iter().filter_map(|&p| Some((p, by_wait(p)?))).collect();
    // A rank others wait on, itself waiting on no peer, is where their
    // waits end: outside the collective.
    let waited_on = |pid: u32| waits.values().any(|(on_peer, of)| *on_peer && *of == Some(pid));
    let map: HashMap<u32, bool> = ranks
        .iter()
        .filter_map(|&pid| {
            let inside = waits
                .get(&pid)
                .map(|w| w.0)
                .or_else(|| by_stack(pid))
                .or_else(|| waited_on(pid).then_some(false));
            Some((pid, inside?))
        })
        .collect();
    (map.values().any(|c| *c) && map.values().any(|c| !*c)).then_some(map)
}

/// No rank holds the others: what most ranks say, from the lowest of them.
fn even(judged: &[Judged]) -> Verdict {
    let count = |k: Kind| judged.iter().filter(|j| j.rank.kind == k).count();
    let Some(Judged { rank: first, verdict: v, .. }) = judged
        .iter()
        .max_by(|a, b| count(a.rank.kind).cmp(&count(b.rank.kind)).then(b.rank.rank.cmp(&a.rank.rank)))
    else {
        return Verdict::default();
    };
    let mut v = v.clone();
    v.summary = format!(
        "{} of {} ranks {}; rank {} (pid {}): {}",
        count(first.kind),
        judged.len(),
        first.kind,
        first.rank,
        first.pid,
        &first.summary
    );
    v
}

/// One rank as judged: its line in the run, its own verdict, and how much
/// of the window its trainer's main thread was blocked at all.
struct Judged {
    rank: RankVerdict,
    verdict: Verdict,
    blocked: f64,
}

/// "ranks 0, 1, 3" / "rank 1".
fn ranks_word(ranks: &[u32]) -> String {
    let list: Vec<String> = ranks.iter().map(u32::to_string).collect();
    match ranks.len() {
        1 => format!("rank {}", list[0]),
        _ => format!("ranks {}", list.join(", ")),
    }
}

#[cfg(test)]
mod tests;
