//! Who is who in the job: the trainer (the process that uses a GPU, or the
//! one the others feed), its workers, and the rest. Pure.
use std::collections::{HashMap, HashSet};

use serde::Serialize;

use crate::aggregate::{ProcWindow, Window};

mod changes;
mod evidence;
pub use changes::{change, RoleChange};
pub use evidence::FEEDER_MIN_WAKES;
use evidence::{calls_the_gpu, Evidence};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Trainer,
    Worker,
    Other,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Trainer => "trainer",
            Role::Worker => "worker",
            Role::Other => "other",
        }
    }
}

/// The evidence that made the trainers the trainers, strongest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TrainerRule {
    /// A launcher's variable, `mp.spawn`'s index or an NCCL communicator
    /// names it a rank (or, unnumbered, it calls the run's collectives).
    Rank,
    /// It holds a GPU, or calls the job's GPU libraries.
    Gpu,
    /// Its workers, or a producer through a pipe, feed it.
    Fed,
    /// What stall was pointed at, past the wrappers that only wait.
    Root,
    /// Nothing else told: the busiest process.
    #[default]
    Busiest,
}

impl TrainerRule {
    /// Why, in words: "the trainer: pid 12, which {says}".
    pub fn says(self) -> &'static str {
        match self {
            TrainerRule::Rank => "is a rank of the run",
            TrainerRule::Gpu => "holds a GPU or calls the job's GPU libraries",
            TrainerRule::Fed => "its workers or a producer feed",
            TrainerRule::Root => "is what stall was pointed at, past the wrappers that only wait",
            TrainerRule::Busiest => "is the busiest process, nothing else telling",
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Roles {
    by_tgid: HashMap<u32, Role>,
    pub trainers: Vec<u32>,
    /// What made them so.
    pub rule: TrainerRule,
    pub workers: Vec<u32>,
    /// A distributed run: each rank and its trainer process, by rank
    /// (empty: not a run). Where no rank says its number (`unnumbered`),
    /// each is keyed by its trainer's pid.
    pub ranks: Vec<(u32, u32)>,
    /// The ranks are trainers that call the same collectives, with no
    /// number known: none was named, and no communicator was seen made
    /// (stall attached after).
    pub unnumbered: bool,
    /// The rank each trainer and worker of a run works for.
    rank_of: HashMap<u32, u32>,
    /// The run's id, as its ranks' environments name it.
    pub run_id: Option<String>,
}

impl Roles {
    pub fn of(&self, tgid: u32) -> Role {
        self.by_tgid.get(&tgid).copied().unwrap_or(Role::Other)
    }

    /// The rank a trainer or worker works for (None: not a run, or neither).
    pub fn rank_of(&self, tgid: u32) -> Option<u32> {
        self.rank_of.get(&tgid).copied()
    }

    /// The number of the rank a trainer or worker works for, where known.
    pub fn rank_number(&self, tgid: u32) -> Option<u32> {
        self.rank_of(tgid).filter(|_| !self.unnumbered)
    }

    /// "rank 2 (pid 301)", or where no number is known "the rank in pid
    /// 301".
    pub fn rank_name(&self, rank: u32, pid: u32) -> String {
        if self.unnumbered {
            format!("the rank in pid {pid}")
        } else {
            format!("rank {rank} (pid {pid})")
        }
    }

    /// One rank's part of the job: its trainer and the workers that work
    /// for it.
    pub fn of_rank(&self, rank: u32) -> Roles {
        let Some(&(_, trainer)) = self.ranks.iter().find(|(r, _)| *r == rank) else {
            return Roles::default();
        };
        let workers: Vec<u32> =
            self.workers.iter().copied().filter(|w| self.rank_of(*w) == Some(rank)).collect();
        let by_tgid = std::iter::once((trainer, Role::Trainer))
            .chain(workers.iter().map(|w| (*w, Role::Worker)))
            .collect();
        Roles {
            by_tgid,
            trainers: vec![trainer],
            rule: self.rule,
            workers,
            ranks: Vec::new(),
            unnumbered: false,
            rank_of: HashMap::new(),
            run_id: None,
        }
    }
}

/// The processes that are ranks of a distributed run: those whose
/// environment names a rank that their parent's does not (a rank's
/// DataLoader workers inherit its environment), as (rank, tgid) by rank.
/// Only the most specific launcher counts: torch's `RANK` where any
/// process has it, else Slurm's task, else MPI's. A helper that inherited a
/// rank's environment (multiprocessing's resource tracker, started while
/// the launcher's environment named a rank) is not that rank: of several
/// processes claiming one rank, the busiest is.
fn rank_processes(w: &Window, by_tgid: &HashMap<u32, &ProcWindow>) -> Vec<(u32, u32)> {
    let Some(best) = w.procs.iter().filter_map(|p| Some(p.rank.as_ref()?.source)).max() else {
        return Vec::new();
    };
    let mut claims: HashMap<(u32, Option<&str>), &ProcWindow> = HashMap::new();
    for p in &w.procs {
        let Some(r) = p.rank.as_ref().filter(|r| r.source == best) else { continue };
        let parent_same = p
            .ppid
            .and_then(|pp| by_tgid.get(&pp))
            .and_then(|pp| pp.rank.as_ref())
            .is_some_and(|pr| pr.same_as(r));
        let tracker = p.cmdline.as_deref().is_some_and(|c| c.contains("resource_tracker"));
        if parent_same || tracker {
            continue;
        }
        let busier = |q: &ProcWindow| (q.sum().on_cpu_ns, std::cmp::Reverse(q.tgid));
        claims
            .entry((r.rank, r.run_id.as_deref()))
            .and_modify(|q| {
                if busier(p) > busier(q) {
                    *q = p;
                }
            })
            .or_insert(p);
    }
    let mut out: Vec<(u32, u32)> = claims.into_iter().map(|((rank, _), p)| (rank, p.tgid)).collect();
    out.sort_unstable();
    out
}

/// Assigns roles over `w` (normally the whole run, so they stay stable).
/// `gpu_pids`: processes NVML saw on a GPU; `root`: the process stall was
/// pointed at (attach --pid, or run's child), if any.
pub fn assign(w: &Window, gpu_pids: &HashSet<u32>, root: Option<u32>) -> Roles {
    // Indexes first: a fork storm leaves thousands of processes here.
    let ev = Evidence::of(w);
    let mut ranks = rank_processes(w, &ev.by_tgid);
    let by = |rule: TrainerRule| move |t: Vec<u32>| (t, rule);
    let (trainers, rule) = trainers_by_rank(&ranks)
        .map(by(TrainerRule::Rank))
        .or_else(|| trainers_by_gpu(w, &ev, gpu_pids).map(by(TrainerRule::Gpu)))
        .or_else(|| trainer_fed_or_forking(w, &ev).map(by(TrainerRule::Fed)))
        .or_else(|| root.and_then(|r| ev.standing_for(r)).map(|t| (vec![t], TrainerRule::Root)))
        .unwrap_or_else(|| (busiest(w, &ev), TrainerRule::Busiest));
    let unnumbered = ranks.is_empty() && is_a_run(w, &trainers);
    let rule = if unnumbered { TrainerRule::Rank } else { rule };
    if unnumbered {
        ranks = trainers.iter().map(|&t| (t, t)).collect();
        ranks.sort_unstable();
    }
    let (roles, workers) = workers_of(w, &ev, &trainers, &ranks);
    let rank_of = rank_of_each(&ranks, &workers, &ev.parent);
    let run_id = ranks.iter().find_map(|(_, t)| ev.by_tgid.get(t)?.rank.as_ref()?.run_id.clone());
    Roles { by_tgid: roles, trainers, rule, workers, ranks, unnumbered, rank_of, run_id }
}

/// Trainers that each call collectives are ranks of one run, even where
/// none says which (stall attached after their communicators were made,
/// and no launcher named them).
fn is_a_run(w: &Window, trainers: &[u32]) -> bool {
    trainers.len() > 1 && trainers.iter().all(|&t| w.proc(t).is_some_and(|p| p.sum().gpu.collectives > 0))
}

/// A run's ranks are its trainers, whatever else looks like one (the
/// launcher waits for them; NVML may not map them).
fn trainers_by_rank(ranks: &[(u32, u32)]) -> Option<Vec<u32>> {
    (!ranks.is_empty()).then(|| ranks.iter().map(|(_, t)| *t).collect())
}

/// The processes that hold a GPU (NVML) or call the job's GPU libraries.
fn trainers_by_gpu(w: &Window, ev: &Evidence, gpu_pids: &HashSet<u32>) -> Option<Vec<u32>> {
    let on_gpu: Vec<u32> = w.procs.iter().map(|p| p.tgid).filter(|t| gpu_pids.contains(t)).collect();
    if !on_gpu.is_empty() {
        return Some(on_gpu);
    }
    let calling: Vec<u32> =
        w.procs.iter().filter(|p| ev.may_hold_a_role(p.tgid) && calls_the_gpu(p)).map(|p| p.tgid).collect();
    (!calling.is_empty()).then_some(calling)
}

/// Without a GPU or a rank to go by: the process with the most children
/// working for it (a DataLoader's parent is the trainer even when it is
/// the busy one and wakes its workers more than they wake it), then the
/// one fed data by the most busy producers (a pipeline's consumer), then
/// the one the most others wake, then the nearest the root. Wrappers pass
/// their children up to the process above them; helpers, wrappers and
/// what ended are no candidates.
fn trainer_fed_or_forking(w: &Window, ev: &Evidence) -> Option<Vec<u32>> {
    let mut kid_counts: HashMap<u32, usize> = HashMap::new();
    for c in w.procs.iter().filter(|c| !ev.of_a_replaced_program(c.tgid)) {
        let Some(mut pp) = c.ppid.filter(|pp| ev.present(*pp)) else { continue };
        if !ev.worker_like(c.tgid, pp) {
            continue;
        }
        for _ in 0..8 {
            match ev.parent.get(&pp).filter(|up| ev.passes_on(pp) && ev.present(**up)) {
                Some(&up) => pp = up,
                None => break,
            }
        }
        *kid_counts.entry(pp).or_default() += 1;
    }
    let count = |m: &HashMap<u32, HashSet<u32>>, t: u32| m.get(&t).map_or(0, HashSet::len);
    w.procs
        .iter()
        .map(|p| p.tgid)
        .filter(|t| ev.may_hold_a_role(*t))
        .map(|t| {
            // Woken by others makes a trainer of a process that works: a
            // quiet reader of the job's output (`| tee log`) is woken too.
            let fed = if ev.busy(t) { count(&ev.feeders, t) } else { 0 };
            (kid_counts.get(&t).copied().unwrap_or(0), count(&ev.producers, t), fed, t)
        })
        .filter(|(k, p, n, _)| *k > 0 || *p > 0 || *n > 0)
        .max_by(|a, b| {
            (a.0, a.1, a.2).cmp(&(b.0, b.1, b.2)).then(ev.depth(b.3).cmp(&ev.depth(a.3))).then(b.3.cmp(&a.3))
        })
        .map(|(.., t)| vec![t])
}

/// The busiest process that may hold a role (else the busiest at all).
fn busiest(w: &Window, ev: &Evidence) -> Vec<u32> {
    let cpu = |p: &&ProcWindow| p.sum().on_cpu_ns;
    w.procs
        .iter()
        .filter(|p| ev.may_hold_a_role(p.tgid))
        .max_by_key(cpu)
        .or_else(|| w.procs.iter().max_by_key(cpu))
        .map(|p| p.tgid)
        .into_iter()
        .collect()
}

/// Each process's role once the trainers are known, and the workers: what
/// the trainers forked or ran that works or feeds them, less the helpers,
/// the launchers of the ranks and the starters of the workers.
fn workers_of(
    w: &Window,
    ev: &Evidence,
    trainers: &[u32],
    ranks: &[(u32, u32)],
) -> (HashMap<u32, Role>, Vec<u32>) {
    let trainer_set: HashSet<u32> = trainers.iter().copied().collect();
    let descends_from_trainer = |mut t: u32| {
        for _ in 0..64 {
            match ev.parent.get(&t) {
                Some(pp) if trainer_set.contains(pp) => return true,
                Some(&pp) => t = pp,
                None => return false,
            }
        }
        false
    };
    // What started the ranks (torchrun's agent, mp.spawn's parent) hands
    // them their start-up data but feeds none of them.
    let launchers = ancestors(ranks.iter().map(|(_, t)| *t), &ev.parent);
    let in_set = |m: &HashMap<u32, HashSet<u32>>, p: u32| {
        trainers.iter().any(|t| m.get(t).is_some_and(|f| f.contains(&p)))
    };
    let mut roles = HashMap::new();
    let mut workers = Vec::new();
    for p in &w.procs {
        let role = if trainer_set.contains(&p.tgid) {
            Role::Trainer
        } else if launchers.contains(&p.tgid) || ev.is_wrapper(p.tgid) {
            Role::Other
        } else {
            let feeds = in_set(&ev.feeders, p.tgid);
            let wakes = in_set(&ev.wakers, p.tgid);
            let forked = p.ppid.is_some_and(|pp| trainer_set.contains(&pp) && ev.worker_like(p.tgid, pp));
            let helper = helper_of(p.tgid, &ev.by_tgid, &ev.parent, &trainer_set);
            let like_a_worker = (descends_from_trainer(p.tgid) && ev.busy(p.tgid)) || forked || feeds;
            let previous_program = helper == Some(Helper::BeforeExec);
            if (like_a_worker && helper.is_none()) || (wakes && !previous_program) {
                workers.push(p.tgid);
                Role::Worker
            } else {
                Role::Other
            }
        };
        roles.insert(p.tgid, role);
    }
    // What starts the workers and feeds nobody (multiprocessing's
    // forkserver, whose children the workers are) is none of them.
    let worker_set: HashSet<u32> = workers.iter().copied().collect();
    let starters: HashSet<u32> = w
        .procs
        .iter()
        .filter(|c| worker_set.contains(&c.tgid))
        .filter_map(|c| c.ppid)
        .filter(|pp| worker_set.contains(pp) && ev.by_tgid.get(pp).is_some_and(|p| !p.reads_data()))
        .collect();
    workers.retain(|t| !starters.contains(t));
    for t in &starters {
        roles.insert(*t, Role::Other);
    }
    (roles, workers)
}

/// Every process above `of` in the tree.
pub(crate) fn ancestors(of: impl Iterator<Item = u32>, parent: &HashMap<u32, u32>) -> HashSet<u32> {
    let mut out = HashSet::new();
    for mut t in of {
        for _ in 0..64 {
            let Some(&pp) = parent.get(&t) else { break };
            if !out.insert(pp) {
                break;
            }
            t = pp;
        }
    }
    out
}

/// Each rank's trainer, and each worker's nearest rank above it.
fn rank_of_each(ranks: &[(u32, u32)], workers: &[u32], parent: &HashMap<u32, u32>) -> HashMap<u32, u32> {
    let mut out: HashMap<u32, u32> = ranks.iter().map(|(r, t)| (*t, *r)).collect();
    for &w in workers {
        let mut t = w;
        for _ in 0..64 {
            let Some(&pp) = parent.get(&t) else { break };
            if let Some(&(r, _)) = ranks.iter().find(|(_, trainer)| *trainer == pp) {
                out.insert(w, r);
                break;
            }
            t = pp;
        }
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Helper {
    /// Forked before its parent exec'd its present program (a pyenv shim's
    /// helpers, before the shim became the interpreter): it belongs to the
    /// previous program.
    BeforeExec,
    /// A program the parent ran: a child that exec'd something else
    /// (`ldconfig` and `uname` at `import torch`, a launcher's shell).
    Program,
}

/// Whether `t`, or a process between it and the trainer, is a helper of
/// its parent rather than a data worker. Workers are forks that did not
/// exec, or multiprocessing spawn/forkserver children.
fn helper_of(
    mut t: u32,
    procs: &HashMap<u32, &ProcWindow>,
    parent: &HashMap<u32, u32>,
    trainers: &HashSet<u32>,
) -> Option<Helper> {
    for _ in 0..64 {
        if trainers.contains(&t) {
            return None;
        }
        let (Some(c), Some(&pp)) = (procs.get(&t), parent.get(&t)) else { return None };
        if let Some(h) = procs.get(&pp).and_then(|p| helper_kind(c, p)) {
            return Some(h);
        }
        t = pp;
    }
    None
}

fn helper_kind(child: &ProcWindow, parent: &ProcWindow) -> Option<Helper> {
    let spawned = child
        .cmdline
        .as_deref()
        .is_some_and(|c| c.contains("multiprocessing.spawn") || c.contains("multiprocessing.forkserver"));
    if spawned {
        return None;
    }
    if child.born_ns > 0 && parent.exec_ns > child.born_ns {
        return Some(Helper::BeforeExec);
    }
    let other_command =
        matches!((child.cmdline.as_deref(), parent.cmdline.as_deref()), (Some(c), Some(p)) if c != p);
    (child.exec_ns > 0 || other_command).then_some(Helper::Program)
}

#[cfg(test)]
mod tests;
