//! A distributed run: every rank judged on its own trainer and workers,
//! and the rank that holds the others back named. Ranks end each step in a
//! collective, so one rank held by its own cause (its input, its host CPU,
//! a hang) leaves every other rank waiting for it: their own pipelines are
//! fine, their trainers blocked. Under NCCL the waits hide on the GPU (a
//! collective returns at once, the rank then spins in its next
//! synchronization), so where the uprobes saw the ranks' collectives, the
//! rank that calls them last is the straggler, whatever its host side
//! looks like.
use std::collections::HashMap;

use serde::Serialize;
use stall_common::reason;

use super::{rules, shares::Shares, trainer, words, Blamed, Kind, Verdict};
use crate::{
    aggregate::Window, correlate::Roles, detail::Text, gpu::GpuWindow, progress::ProgressView, units,
    wait::WaitObject,
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
    /// The rank as stall keys it: its number, or where the run's ranks
    /// say none ([`Roles::unnumbered`]) its trainer's pid.
    #[serde(skip)]
    pub rank: u32,
    /// Its number (null: none known).
    #[serde(rename = "rank")]
    pub number: Option<u32>,
    /// Its trainer process.
    pub pid: u32,
    pub kind: Kind,
    pub summary: crate::detail::Text,
    /// Share of the window its trainer's main thread was blocked while its
    /// own pipeline kept up: waiting for its peers (0 where its own cause
    /// holds it); under NCCL, its share from each collective's call to the
    /// synchronization that saw it complete.
    pub peer_wait: f64,
    /// Its NCCL collectives in the window (absent: none seen).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub collectives: Option<Collectives>,
}

impl RankVerdict {
    /// Rank `rank` (keyed as the roles key it) whose trainer is `pid`,
    /// judged on its own part of the job.
    fn of(
        roles: &Roles,
        (rank, pid): (u32, u32),
        own: &Verdict,
        summary: String,
        peer_wait: f64,
        collectives: Option<&Collectives>,
    ) -> Self {
        RankVerdict {
            rank,
            number: roles.rank_number(pid),
            pid,
            kind: own.kind,
            summary: summary.into(),
            peer_wait,
            collectives: collectives.copied(),
        }
    }
}

/// A rank's NCCL collectives in a window: how long it waited for each,
/// and, compared with the other ranks on this node, how late it called
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct Collectives {
    pub calls: u64,
    /// Mean time from a collective's call to the synchronization after it
    /// (the rank waiting for its peers, and its GPU), seconds.
    pub wait_s: f64,
    /// Its collectives whose arrival was compared with other ranks'.
    pub compared: u64,
    /// How often it called last.
    pub last: u64,
    /// Mean time after the first rank's call, seconds.
    pub late_s: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Straggler {
    /// Keyed as [`RankVerdict::rank`].
    #[serde(skip)]
    pub rank: u32,
    /// Its number (null: none known).
    #[serde(rename = "rank")]
    pub number: Option<u32>,
    pub pid: u32,
    pub kind: Kind,
    /// The ranks that wait for it (keyed as `rank`), their numbers where
    /// known, their trainers, and their mean share waiting.
    #[serde(skip)]
    pub waiting_ranks: Vec<u32>,
    #[serde(rename = "waiting_ranks")]
    pub waiting_numbers: Vec<u32>,
    pub waiting_pids: Vec<u32>,
    pub peer_wait: f64,
    /// Named by its arrivals at the NCCL collectives: how late it calls
    /// each, on average, seconds (absent: named by its host side).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub late_s: Option<f64>,
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
    let secs = w.secs();
    let collectives: HashMap<u32, Collectives> =
        roles.ranks.iter().filter_map(|&(rank, _)| Some((rank, collectives_of(w, roles, rank)?))).collect();
    if let Some(v) = late_at_collectives(w, roles, gpus, progress, &collectives) {
        return v;
    }
    // Busy GPUs answer for every rank the way they do for one trainer.
    if !gpus.is_empty() && gpus.iter().all(|g| g.util_mean_pct >= rules::GPU_BUSY_PCT) {
        return trainer::judge(w, roles, gpus, progress);
    }
    let judged: Vec<Judged> = roles
        .ranks
        .iter()
        .map(|&(rank, pid)| {
            let (verdict, summary) = judge_rank(w, roles, gpus, progress, rank);
            let main = w.proc(pid).and_then(|p| p.main_thread()).map(|m| Shares::of(m, secs));
            let blocked = main.map_or(0.0, |m| m.blocked());
            // Of the time it could act: a trainer crowded off a busy host
            // (waiting for a CPU, or held by its limit) still waits for
            // its peers for most of what it was given.
            let free = main.map_or(1.0, |m| (1.0 - m.runnable()).max(0.1));
            let peer_wait = match in_collective.get(&pid) {
                Some(true) => blocked,
                _ if holds(verdict.kind) || blocked / free < rules::TRAINER_WAITS => 0.0,
                _ => blocked,
            };
            Judged {
                rank: RankVerdict::of(
                    roles,
                    (rank, pid),
                    &verdict,
                    summary,
                    peer_wait,
                    collectives.get(&rank),
                ),
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
                number: r.number,
                pid: r.pid,
                kind: r.kind,
                waiting_ranks: waiting.iter().map(|x| x.rank).collect(),
                waiting_numbers: waiting.iter().filter_map(|x| x.number).collect(),
                waiting_pids: waiting.iter().map(|x| x.pid).collect(),
                peer_wait: mean_wait,
                late_s: None,
            };
            let mut v = v.clone();
            v.summary = format!(
                "{} holds the run: {} — {}; {} wait for it {} of the time",
                roles.rank_name(r.rank, r.pid),
                r.kind,
                &r.summary,
                ranks_word(roles, &straggler.waiting_ranks),
                units::pct(mean_wait)
            )
            .into();
            (v, Some(straggler))
        }
        _ => (even(roles, &judged), None),
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
    v.summary = words::with_gpus(v.summary.marked(), gpus, secs).into();
    if w.lost_total() > 0 {
        v.summary.push_str(words::PARTIAL_NOTE);
    }
    let mut evidence: Vec<Text> = ranks
        .iter()
        .map(|r| format!("{}: {} — {}", roles.rank_name(r.rank, r.pid), r.kind, &r.summary).into())
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
        match main.last_wait().filter(|_| current) {
            Some((_, WaitObject::Socket { peer: Some(peer), .. })) => Some(match holder(pid, peer.value()) {
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

/// One rank judged on its own trainer and workers (their files, their
/// CPU) and the GPUs NVML saw them on: its verdict and its line.
fn judge_rank(
    w: &Window,
    roles: &Roles,
    gpus: &[GpuWindow],
    progress: &ProgressView,
    rank: u32,
) -> (Verdict, String) {
    let own = w.only(|tgid| roles.rank_of(tgid) == Some(rank));
    let own_gpus: Vec<GpuWindow> =
        gpus.iter().filter(|g| g.pids.iter().any(|p| roles.rank_of(*p) == Some(rank))).cloned().collect();
    trainer::judge_with_line(&own, &roles.of_rank(rank), &own_gpus, progress)
}

/// A rank's NCCL collectives in the window, from the threads of its
/// processes; None where it made none.
fn collectives_of(w: &Window, roles: &Roles, rank: u32) -> Option<Collectives> {
    let mut g = crate::decode::GpuCounters::default();
    for p in w.procs.iter().filter(|p| roles.rank_of(p.tgid) == Some(rank)) {
        g.add(&p.sum().gpu);
    }
    (g.collectives > 0).then(|| Collectives {
        calls: g.collectives,
        wait_s: mean_collective_wait(&g),
        compared: g.arrivals_compared,
        last: g.arrivals_last,
        late_s: g.arrival_late_ns as f64 / 1e9 / g.arrivals_compared.max(1) as f64,
    })
}

/// The mean of a rank's waits from a collective to the synchronization
/// after it, over those that ended in the window; with none ended, the one
/// in progress so far (a rank stuck in one).
fn mean_collective_wait(g: &crate::decode::GpuCounters) -> f64 {
    let ns = match g.collective_waits {
        0 => g.collective_wait_ns,
        n => g.collective_waited_ns / n,
    };
    ns as f64 / 1e9
}

/// The rank that calls the collectives last, and by how much on average:
/// from the ranks' arrivals compared on this node where enough were, else
/// from the waits (each collective completes when its last rank calls it,
/// so the last rank waits least: its lateness is what the others wait
/// more, which holds across nodes as well, without comparing clocks).
fn late_rank(collectives: &HashMap<u32, Collectives>) -> Option<(u32, f64)> {
    let compared = collectives.iter().filter(|(_, c)| c.compared >= rules::COLLECTIVES_COMPARED);
    if let Some((&rank, c)) = compared.max_by(|a, b| a.1.late_s.total_cmp(&b.1.late_s).then(b.0.cmp(a.0))) {
        let last_share = c.last as f64 / c.compared as f64;
        return (c.late_s >= rules::COLLECTIVE_LATE_S && last_share >= rules::COLLECTIVE_LAST_SHARE)
            .then_some((rank, c.late_s));
    }
    let waited: Vec<(u32, f64)> = collectives
        .iter()
        .filter(|(_, c)| c.calls >= rules::COLLECTIVES_COMPARED)
        .map(|(&r, c)| (r, c.wait_s))
        .collect();
    if waited.len() < 2 {
        return None;
    }
    let &(rank, least) = waited.iter().min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))?;
    let mut others: Vec<f64> = waited.iter().filter(|(r, _)| *r != rank).map(|(_, w)| *w).collect();
    others.sort_by(f64::total_cmp);
    let median = others[others.len() / 2];
    let late = median - least;
    (late >= rules::COLLECTIVE_LATE_S && least <= median / 2.0).then_some((rank, late))
}

/// A run whose ranks' NCCL collectives name the one that calls them last:
/// its own verdict (what its host side does meanwhile) says why, the
/// others' waits from each collective to the synchronization after it are
/// put on it.
fn late_at_collectives(
    w: &Window,
    roles: &Roles,
    gpus: &[GpuWindow],
    progress: &ProgressView,
    collectives: &HashMap<u32, Collectives>,
) -> Option<Verdict> {
    let (late, late_s) = late_rank(collectives)?;
    let &(_, pid) = roles.ranks.iter().find(|(r, _)| *r == late)?;
    let secs = w.secs();
    let ranks: Vec<RankVerdict> = roles
        .ranks
        .iter()
        .map(|&(rank, pid)| {
            let (verdict, summary) = judge_rank(w, roles, gpus, progress, rank);
            let c = collectives.get(&rank).copied();
            let waited = w
                .procs
                .iter()
                .filter(|p| roles.rank_of(p.tgid) == Some(rank))
                .map(|p| p.sum().gpu.collective_wait_ns)
                .sum::<u64>();
            let peer_wait = if rank == late { 0.0 } else { (waited as f64 / 1e9 / secs).min(1.0) };
            RankVerdict::of(roles, (rank, pid), &verdict, summary, peer_wait, c.as_ref())
        })
        .collect();
    let r = ranks.iter().find(|r| r.rank == late)?;
    let waiting: Vec<&RankVerdict> =
        ranks.iter().filter(|r| r.rank != late && r.collectives.is_some()).collect();
    let mean_wait = waiting.iter().map(|x| x.peer_wait).sum::<f64>() / waiting.len().max(1) as f64;
    // What its host side does meanwhile is why it calls late; a rank that
    // shows no cause of its own (asleep, idle) is late on its host side.
    let kind = match r.kind {
        Kind::Unknown | Kind::Idle => Kind::TrainerHostBound,
        k => k,
    };
    let c = r.collectives.unwrap_or_default();
    let how = if c.compared >= rules::COLLECTIVES_COMPARED {
        format!(
            "last at {} of {} NCCL collectives compared, {} after the first rank on average",
            c.last,
            c.compared,
            units::millis(late_s)
        )
    } else {
        format!(
            "it waits {} per NCCL collective where the others wait {} more",
            units::millis(c.wait_s),
            units::millis(late_s)
        )
    };
    let mut v = Verdict {
        kind,
        summary: format!(
            "{} calls the collectives late: {how}; {} wait for it {} of the time (from each collective to the \
             synchronization that sees it done) — the late rank itself: {} — {}",
            roles.rank_name(late, pid),
            ranks_word(roles, &waiting.iter().map(|x| x.rank).collect::<Vec<_>>()),
            units::pct(mean_wait),
            r.kind,
            r.summary
        ).into(),
        blamed: vec![Blamed { pid, tid: pid, what: "late rank trainer main thread" }],
        ..Verdict::default()
    };
    v.host_only = gpus.is_empty();
    v.summary = words::with_gpus(v.summary.marked(), gpus, secs).into();
    if w.lost_total() > 0 {
        v.summary.push_str(words::PARTIAL_NOTE);
    }
    v.evidence = ranks
        .iter()
        .map(|r| {
            let c = r.collectives.unwrap_or_default();
            format!(
                "{}: {} collectives, waits {} for each{}; {} — {}",
                roles.rank_name(r.rank, r.pid),
                c.calls,
                units::millis(c.wait_s),
                if c.compared > 0 {
                    format!(
                        ", last at {} of {}, {} late on average",
                        c.last,
                        c.compared,
                        units::millis(c.late_s)
                    )
                } else {
                    String::new()
                },
                r.kind,
                r.summary
            )
            .into()
        })
        .collect();
    let straggler = Straggler {
        rank: late,
        number: r.number,
        pid,
        kind,
        waiting_ranks: waiting.iter().map(|x| x.rank).collect(),
        waiting_numbers: waiting.iter().filter_map(|x| x.number).collect(),
        waiting_pids: waiting.iter().map(|x| x.pid).collect(),
        peer_wait: mean_wait,
        late_s: Some(late_s),
    };
    v.run = Some(RunVerdict { ranks, straggler: Some(straggler) });
    Some(v)
}

/// No rank holds the others: what most ranks say, from the lowest of them.
fn even(roles: &Roles, judged: &[Judged]) -> Verdict {
    let count = |k: Kind| judged.iter().filter(|j| j.rank.kind == k).count();
    let Some(Judged { rank: first, verdict: v, .. }) = judged
        .iter()
        .max_by(|a, b| count(a.rank.kind).cmp(&count(b.rank.kind)).then(b.rank.rank.cmp(&a.rank.rank)))
    else {
        return Verdict::default();
    };
    let mut v = v.clone();
    v.summary = format!(
        "{} of {} ranks {}; {}: {}",
        count(first.kind),
        judged.len(),
        first.kind,
        roles.rank_name(first.rank, first.pid),
        &first.summary
    )
    .into();
    v
}

/// One rank as judged: its line in the run, its own verdict, and how much
/// of the window its trainer's main thread was blocked at all.
struct Judged {
    rank: RankVerdict,
    verdict: Verdict,
    blocked: f64,
}

/// "ranks 0, 1, 3" / "rank 1"; where no number is known (the ranks keyed
/// by their trainers' pids), "the ranks in pids 301, 302".
fn ranks_word(roles: &Roles, ranks: &[u32]) -> String {
    let list: Vec<String> = ranks.iter().map(u32::to_string).collect();
    match (roles.unnumbered, ranks.len()) {
        (false, 1) => format!("rank {}", list[0]),
        (false, _) => format!("ranks {}", list.join(", ")),
        (true, 1) => format!("the rank in pid {}", list[0]),
        (true, _) => format!("the ranks in pids {}", list.join(", ")),
    }
}

#[cfg(test)]
mod tests;
