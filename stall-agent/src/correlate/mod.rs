//! Who is who in the job: the trainer (the process that uses a GPU, or the
//! one the others feed), its workers, and the rest. Pure.
use std::collections::{HashMap, HashSet};

use serde::Serialize;

use crate::aggregate::{ProcWindow, Window};

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

#[derive(Debug, Clone, Default)]
pub struct Roles {
    by_tgid: HashMap<u32, Role>,
    pub trainers: Vec<u32>,
    pub workers: Vec<u32>,
    /// A distributed run: each rank and its trainer process, by rank
    /// (empty: not a run).
    pub ranks: Vec<(u32, u32)>,
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
            workers,
            ranks: Vec::new(),
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
    let by_tgid: HashMap<u32, &ProcWindow> = w.procs.iter().map(|p| (p.tgid, p)).collect();
    let present: HashSet<u32> = by_tgid.keys().copied().collect();
    let parent: HashMap<u32, u32> = w.procs.iter().filter_map(|p| Some((p.tgid, p.ppid?))).collect();
    let secs = w.secs().max(1e-3);
    let busy_set: HashSet<u32> = w.procs.iter().filter(|p| busy(p, secs)).map(|p| p.tgid).collect();
    let busy = |t: u32| busy_set.contains(&t);
    let worker_like = |child: u32, parent: u32| {
        busy(child) || forked_worker(by_tgid.get(&child).copied(), by_tgid.get(&parent).copied())
    };

    // Who feeds whom: waking its threads, or being its child that does work.
    let mut feeders: HashMap<u32, HashSet<u32>> = HashMap::new();
    let mut wakers: HashMap<u32, HashSet<u32>> = HashMap::new();
    for p in &w.procs {
        for t in &p.threads {
            for b in &t.woken_by {
                if b.tgid != p.tgid && present.contains(&b.tgid) {
                    feeders.entry(p.tgid).or_default().insert(b.tgid);
                    // A child's exit wakes its parent once: feeding is more.
                    if b.count >= FEEDER_MIN_WAKES {
                        wakers.entry(p.tgid).or_default().insert(b.tgid);
                    }
                }
            }
        }
        if let Some(pp) = p.ppid.filter(|pp| present.contains(pp)) {
            if busy(p.tgid) {
                feeders.entry(pp).or_default().insert(p.tgid);
            }
        }
    }

    // A run's ranks are its trainers, whatever else looks like one (the
    // launcher waits for them; NVML may not map them).
    let ranks = rank_processes(w, &by_tgid);
    let mut trainers: Vec<u32> = if ranks.is_empty() {
        w.procs.iter().map(|p| p.tgid).filter(|t| gpu_pids.contains(t)).collect()
    } else {
        ranks.iter().map(|(_, t)| *t).collect()
    };
    if trainers.is_empty() {
        let depth = |mut t: u32| {
            let mut d = 0;
            while let Some(&pp) = parent.get(&t) {
                if d > 64 {
                    break;
                }
                t = pp;
                d += 1;
            }
            d
        };
        // Worker-like children first (a DataLoader's parent is the trainer
        // even when the trainer is the busy one and wakes its workers more
        // than they wake it), then who wakes it, then nearest the root.
        // A shell or wrapper between (it only waits for its child) is no
        // trainer: its busy child counts for the process above it.
        let passes_on = |t: u32| {
            !busy(t) && by_tgid.get(&t).and_then(|p| p.main_thread()).is_some_and(|m| m.mostly_child_wait())
        };
        let mut kid_counts: HashMap<u32, usize> = HashMap::new();
        for c in &w.procs {
            if let Some(mut pp) = c.ppid.filter(|pp| present.contains(pp)) {
                if worker_like(c.tgid, pp) {
                    for _ in 0..8 {
                        match parent.get(&pp).filter(|up| passes_on(pp) && present.contains(up)) {
                            Some(&up) => pp = up,
                            None => break,
                        }
                    }
                    *kid_counts.entry(pp).or_default() += 1;
                }
            }
        }
        let kids = |t: u32| kid_counts.get(&t).copied().unwrap_or(0);
        let best = w
            .procs
            .iter()
            .map(|p| (kids(p.tgid), feeders.get(&p.tgid).map_or(0, HashSet::len), p.tgid))
            .filter(|(k, n, _)| *k > 0 || *n > 0)
            .max_by(|a, b| {
                a.0.cmp(&b.0).then(a.1.cmp(&b.1)).then(depth(b.2).cmp(&depth(a.2))).then(b.2.cmp(&a.2))
            });
        match (best, root) {
            (Some((_, _, t)), _) => trainers.push(t),
            (None, Some(r)) if present.contains(&r) => trainers.push(r),
            (None, _) => {
                let busiest = w.procs.iter().max_by_key(|p| p.sum().on_cpu_ns).map(|p| p.tgid);
                trainers.extend(busiest);
            }
        }
    }

    let trainer_set: HashSet<u32> = trainers.iter().copied().collect();
    let descends_from_trainer = |mut t: u32| {
        for _ in 0..64 {
            match parent.get(&t) {
                Some(pp) if trainer_set.contains(pp) => return true,
                Some(&pp) => t = pp,
                None => return false,
            }
        }
        false
    };
    // Programs run by the trainer (or by such programs), below the trainer.
    let is_helper = |t: u32| helper_of(t, &by_tgid, &parent, &trainer_set);
    // What started the ranks (torchrun's agent, mp.spawn's parent) hands
    // them their start-up data but feeds none of them.
    let launchers = ancestors(ranks.iter().map(|(_, t)| *t), &parent);
    let mut roles = HashMap::new();
    let mut workers = Vec::new();
    for p in &w.procs {
        let role = if trainer_set.contains(&p.tgid) {
            Role::Trainer
        } else if launchers.contains(&p.tgid) {
            Role::Other
        } else {
            let feeds = trainers.iter().any(|t| feeders.get(t).is_some_and(|f| f.contains(&p.tgid)));
            let wakes = trainers.iter().any(|t| wakers.get(t).is_some_and(|f| f.contains(&p.tgid)));
            let forked = p.ppid.is_some_and(|pp| trainer_set.contains(&pp) && worker_like(p.tgid, pp));
            let helper = is_helper(p.tgid);
            let like_a_worker = (descends_from_trainer(p.tgid) && busy(p.tgid)) || forked || feeds;
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
        .filter(|pp| worker_set.contains(pp) && by_tgid.get(pp).is_some_and(|p| !p.reads_data()))
        .collect();
    workers.retain(|t| !starters.contains(t));
    for t in &starters {
        roles.insert(*t, Role::Other);
    }
    let rank_of = rank_of_each(&ranks, &workers, &parent);
    let run_id = ranks.iter().find_map(|(_, t)| by_tgid.get(t)?.rank.as_ref()?.run_id.clone());
    Roles { by_tgid: roles, trainers, workers, ranks, rank_of, run_id }
}

/// Every process above `of` in the tree.
fn ancestors(of: impl Iterator<Item = u32>, parent: &HashMap<u32, u32>) -> HashSet<u32> {
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

/// A child that looks like a data worker of its parent even when idle (a
/// hung worker is still a worker): a fork that did not exec (same command
/// line: multiprocessing's fork start method, as DataLoader uses on Linux),
/// or a multiprocessing spawn child. The resource tracker is not one.
fn forked_worker(child: Option<&ProcWindow>, parent: Option<&ProcWindow>) -> bool {
    let child = child.and_then(|p| p.cmdline.as_deref());
    let parent = parent.and_then(|p| p.cmdline.as_deref());
    match (child, parent) {
        (Some(c), _) if c.contains("resource_tracker") => false,
        (Some(c), Some(p)) if c == p => true,
        (Some(c), _) => c.contains("multiprocessing.spawn") || c.contains("multiprocessing.forkserver"),
        _ => false,
    }
}

/// Wakeups of the trainer that make a program it ran one of its feeders (a
/// program's output read through a pipe and its exit wake the parent a few
/// times; a feeder delivers batch after batch).
pub const FEEDER_MIN_WAKES: u64 = 16;

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

/// Did this process do anything: read a file, or use the CPU (>1%)?
fn busy(p: &ProcWindow, secs: f64) -> bool {
    let c = p.sum();
    p.input_bytes() > 0 || c.file_read_calls > 0 || (c.on_cpu_ns as f64 / 1e9) / secs > 0.01
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::{FileWindow, ProcWindow, ThreadWindow, Waker};
    use crate::decode::ThreadCounters;

    fn proc(tgid: u32, ppid: u32, on_ms: u64, read: u64) -> ProcWindow {
        ProcWindow {
            tgid,
            ppid: Some(ppid),
            comm: format!("p{tgid}"),
            alive: true,
            threads: vec![ThreadWindow {
                tid: tgid,
                delta: ThreadCounters { on_cpu_ns: on_ms * 1_000_000, ..Default::default() },
                ..Default::default()
            }],
            files: if read > 0 {
                vec![FileWindow {
                    path: "/d".into(),
                    resolved: None,
                    opens: 1,
                    read_calls: 1,
                    read_bytes: read,
                    read_ns: 1,
                    timed_calls: 1,
                    open_ns: 1,
                    ..Default::default()
                }]
            } else {
                vec![]
            },
            ..Default::default()
        }
    }

    fn window(procs: Vec<ProcWindow>) -> Window {
        Window { start_ns: 0, end_ns: 10_000_000_000, procs, ..Default::default() }
    }

    #[test]
    fn the_fed_process_is_the_trainer_without_gpu_data() {
        // bash (1) → python trainer (2) → workers 3, 4, 5; resource tracker 6 idle.
        let w = window(vec![
            proc(1, 0, 0, 0),
            proc(2, 1, 500, 0),
            proc(3, 2, 100, 1000),
            proc(4, 2, 100, 1000),
            proc(5, 2, 100, 1000),
            proc(6, 2, 0, 0),
        ]);
        let r = assign(&w, &HashSet::new(), Some(1));
        assert_eq!(r.trainers, vec![2]);
        assert_eq!(r.of(3), Role::Worker);
        assert_eq!(r.of(6), Role::Other);
        assert_eq!(r.of(1), Role::Other);
    }

    #[test]
    fn the_busy_trainer_that_feeds_idle_workers_stays_the_trainer() {
        // Trainer computing (busy), handing indices to 2 forked workers that
        // are nearly idle: the trainer wakes them more than they wake it.
        let mut t = proc(2, 1, 900, 0);
        t.cmdline = Some("python train.py".into());
        let mut w1 = proc(3, 2, 5, 0);
        let mut w2 = proc(4, 2, 5, 0);
        for w in [&mut w1, &mut w2] {
            w.cmdline = Some("python train.py".into());
            w.threads[0].woken_by =
                vec![Waker { tid: 2, tgid: 2, comm: "python".into(), count: 50, blocked_ns: 0 }];
        }
        let mut tracker = proc(5, 2, 0, 0);
        tracker.cmdline = Some("python -c from multiprocessing.resource_tracker import main;main(8)".into());
        let w = window(vec![t, w1, w2, tracker]);
        let r = assign(&w, &HashSet::new(), Some(2));
        assert_eq!(r.trainers, vec![2]);
        assert_eq!((r.of(3), r.of(4), r.of(5)), (Role::Worker, Role::Worker, Role::Other));
    }

    #[test]
    fn hung_forked_workers_are_workers() {
        let mut t = proc(2, 1, 0, 0);
        t.cmdline = Some("python train.py".into());
        let mut w1 = proc(3, 2, 0, 0);
        w1.cmdline = Some("python train.py".into());
        let w = window(vec![t, w1]);
        let r = assign(&w, &HashSet::new(), Some(2));
        assert_eq!((r.trainers.clone(), r.of(3)), (vec![2], Role::Worker));
    }

    #[test]
    fn programs_run_at_import_are_not_workers() {
        // `import torch` runs ldconfig (reads ld.so.cache, busy for a moment,
        // ends); the DataLoader forks two workers that read shards.
        let mut t = proc(2, 1, 500, 0);
        t.cmdline = Some("python train.py".into());
        let mut ldconfig = proc(3, 2, 40, 60_000);
        ldconfig.cmdline = None; // gone before /proc was read
        (ldconfig.born_ns, ldconfig.exec_ns) = (10, 11);
        ldconfig.alive = false;
        let mut sh = proc(4, 2, 20, 0);
        sh.cmdline = Some("/bin/sh -c uname -p 2> /dev/null".into());
        let mut ws = Vec::new();
        for pid in [5, 6] {
            let mut w = proc(pid, 2, 100, 1_000_000);
            w.cmdline = Some("python train.py".into());
            ws.push(w);
        }
        // A spawned worker execs the interpreter anew: still a worker.
        let mut spawned = proc(7, 2, 100, 1_000_000);
        spawned.cmdline =
            Some("python -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5)".into());
        let w = window([vec![t, ldconfig, sh, spawned], ws].concat());
        let r = assign(&w, &HashSet::new(), Some(2));
        assert_eq!(r.trainers, vec![2]);
        assert_eq!((r.of(3), r.of(4)), (Role::Other, Role::Other));
        assert_eq!((r.of(5), r.of(6), r.of(7)), (Role::Worker, Role::Worker, Role::Worker));
        // A shim's helper, forked before the shim exec'd the interpreter,
        // and the subshell it forked in turn.
        let mut shim = w.clone();
        shim.procs[0].exec_ns = 50;
        shim.procs[2].born_ns = 20;
        shim.procs[2].cmdline = None;
        let mut sub = proc(8, 4, 30, 0);
        sub.born_ns = 25;
        shim.procs.push(sub);
        let r = assign(&shim, &HashSet::new(), Some(2));
        assert_eq!((r.of(4), r.of(8)), (Role::Other, Role::Other));
        // Its exit woke the trainer once: still not a worker.
        let mut exited = w.clone();
        exited.procs[0].threads[0].woken_by =
            vec![Waker { tid: 3, tgid: 3, comm: "ldconfig".into(), count: 1, blocked_ns: 0 }];
        assert_eq!(assign(&exited, &HashSet::new(), Some(2)).of(3), Role::Other);
        // A program that feeds the trainer is a worker, exec'd or not.
        let mut fed = w.clone();
        fed.procs[0].threads[0].woken_by =
            vec![Waker { tid: 3, tgid: 3, comm: "ldconfig".into(), count: 90, blocked_ns: 0 }];
        assert_eq!(assign(&fed, &HashSet::new(), Some(2)).of(3), Role::Worker);
    }

    #[test]
    fn gpu_users_are_trainers() {
        let w = window(vec![proc(1, 0, 0, 0), proc(2, 1, 500, 0), proc(3, 2, 100, 1000)]);
        let r = assign(&w, &HashSet::from([1]), Some(1));
        assert_eq!(r.trainers, vec![1]);
        assert_eq!(r.of(3), Role::Worker);
    }

    #[test]
    fn lone_process_is_its_own_trainer() {
        let w = window(vec![proc(7, 1, 900, 5000)]);
        let r = assign(&w, &HashSet::new(), None);
        assert_eq!(r.trainers, vec![7]);
        assert!(r.workers.is_empty());
    }
}
