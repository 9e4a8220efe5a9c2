//! Which rank of a distributed run each process of the job is, from the
//! sources [`crate::rank`] names, kept as processes start, fork, exec and
//! connect. The host is asked at those moments only: a process's exec-time
//! environment when it is first seen and at each exec; the environment it
//! has now when it was running before tracing began, and again at its
//! first child and its first connection (a rank that sets its rank in
//! `os.environ` does so before it joins the rendezvous and before it starts
//! its DataLoader workers); a child forked while traced inherits its
//! parent's. A process multiprocessing started is asked what it runs (its
//! main thread's Python stack) at those moments, and until it tells, at
//! most every [`LOOK_EVERY_NS`] during its first [`LOOK_FOR_NS`].
use std::collections::HashMap;

use super::Host;
use crate::{
    decode::CommSnap,
    pystack,
    rank::{spawn_ranks, Env, Found, Rank, SpawnChild},
};

/// How often a spawned process whose target is unknown is looked at again.
pub const LOOK_EVERY_NS: u64 = 2_000_000_000;
/// How long after its first sight it is looked at.
pub const LOOK_FOR_NS: u64 = 60_000_000_000;

#[derive(Debug, Default)]
struct Known {
    ppid: u32,
    /// Its parent was known when it was first seen (then its parent's end
    /// is seen too).
    parent_known: bool,
    /// The listed variables of the environment it was exec'd with.
    exec: Env,
    /// Those of the environment it has now, when read or inherited since
    /// (None: as at exec).
    live: Option<Env>,
    /// multiprocessing started it to run a target ([`started_how`]).
    spawned: bool,
    /// It is multiprocessing's fork server.
    fork_server: bool,
    /// Its command line, hashed (to tell a fork from a spawned child).
    cmdline: u64,
    /// What its stack showed: it runs `torch.multiprocessing.spawn`'s
    /// wrapper (None: not known yet).
    torch_spawned: Option<bool>,
    /// The index the wrapper was given, where its arguments were read.
    spawn_index: Option<u32>,
    started: (u64, u32),
    first_seen_ns: u64,
    last_look_ns: u64,
    /// The NCCL communicator it created that spans the most ranks (its
    /// world): (rank, size, unique id's hash).
    communicator: Option<(u32, u32, u64)>,
    /// Its first child and its first connection have been seen.
    forked: bool,
    connected: bool,
    alive: bool,
}

impl Known {
    fn env_now(&self) -> &Env {
        self.live.as_ref().unwrap_or(&self.exec)
    }
}

/// The job's processes, as the sources of their ranks see them.
#[derive(Debug, Default)]
pub struct Identities {
    known: HashMap<u32, Known>,
    /// Something changed since [`Identities::take_ranks`].
    changed: bool,
}

/// A process as first seen.
#[derive(Debug, Clone, Copy)]
pub struct Sighting<'a> {
    pub tgid: u32,
    pub ppid: u32,
    pub cmdline: Option<&'a str>,
    /// When it started, as /proc tells it (ns since boot, in 10 ms
    /// ticks): sorts siblings, ties by pid.
    pub started_ns: u64,
    /// It was forked while traced: its parent's environment is its own.
    pub forked_while_traced: bool,
}

fn is_spawn_child(cmdline: &str) -> bool {
    cmdline.contains("multiprocessing.spawn import spawn_main")
}

/// multiprocessing's fork server (it forks each process the `forkserver`
/// start method starts, and those run its command line).
fn is_forkserver(cmdline: &str) -> bool {
    cmdline.contains("multiprocessing.forkserver import main")
}

/// How multiprocessing started a process, from its command line and its
/// parent's (None: parent not known).
fn started_how(cmdline: Option<&str>, parent: Option<&Known>) -> Started {
    let Some(cmdline) = cmdline else { return Started::Other };
    let same_as_parent = parent.map(|p| p.cmdline) == Some(hash_of(cmdline));
    if is_spawn_child(cmdline) {
        // A fork of a spawned process (a rank's DataLoader worker) runs the
        // same command line, from inside its parent's target.
        if same_as_parent {
            Started::Other
        } else {
            Started::Spawned
        }
    } else if is_forkserver(cmdline) && !same_as_parent {
        Started::ForkServer
    } else if is_forkserver(cmdline) && parent.is_some_and(|p| p.fork_server) {
        // Only the server's own forks: a fork of one of those (a rank's
        // forked worker) is inside its parent's target.
        Started::Spawned
    } else {
        Started::Other
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Started {
    /// To run a target of its own: exec'd to run `spawn_main`, or forked
    /// by a fork server.
    Spawned,
    /// A fork server.
    ForkServer,
    Other,
}

fn hash_of(cmdline: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    cmdline.hash(&mut h);
    h.finish()
}

impl Identities {
    /// A process seen for the first time.
    pub fn first_sight(&mut self, host: &mut dyn Host, seen: Sighting, now: u64) {
        let Sighting { tgid, ppid, cmdline, started_ns, forked_while_traced } = seen;
        if self.known.contains_key(&tgid) {
            return;
        }
        let exec = host.exec_environ(tgid).unwrap_or_default();
        let live = match self.known.get(&ppid).filter(|_| forked_while_traced) {
            Some(parent) => parent.live.clone(),
            // Running before tracing began: it may have set anything since.
            None if !forked_while_traced => host.live_environ(tgid),
            None => None,
        };
        let hash = cmdline.map_or(0, hash_of);
        let started = started_how(cmdline, self.known.get(&ppid));
        let spawned = started == Started::Spawned;
        self.known.insert(
            tgid,
            Known {
                ppid,
                parent_known: self.known.contains_key(&ppid),
                exec,
                live,
                spawned,
                fork_server: started == Started::ForkServer,
                cmdline: hash,
                started: (started_ns, tgid),
                first_seen_ns: now,
                alive: true,
                ..Default::default()
            },
        );
        if spawned {
            self.look(host, tgid, now);
        }
        self.changed = true;
    }

    pub fn knows(&self, tgid: u32) -> bool {
        self.known.contains_key(&tgid)
    }

    /// The process exec'd: a new program with the environment it was given.
    pub fn exec(&mut self, host: &mut dyn Host, tgid: u32, cmdline: Option<&str>, now: u64) {
        let Some(k) = self.known.get_mut(&tgid) else { return };
        k.exec = host.exec_environ(tgid).unwrap_or_default();
        k.live = None;
        // Exec'd by its parent: not a fork of it, whatever it runs.
        let started = started_how(cmdline, None);
        (k.spawned, k.fork_server) = (started == Started::Spawned, started == Started::ForkServer);
        k.cmdline = cmdline.map_or(0, hash_of);
        (k.torch_spawned, k.spawn_index) = (None, None);
        (k.forked, k.connected) = (false, false);
        k.first_seen_ns = now;
        self.changed = true;
    }

    /// The process starts a child: at its first, what it has set so far
    /// is read (the child inherits it).
    pub fn forks(&mut self, host: &mut dyn Host, tgid: u32, now: u64) {
        if self.known.get(&tgid).is_some_and(|k| !k.forked) {
            self.read_now(host, tgid, now);
            if let Some(k) = self.known.get_mut(&tgid) {
                k.forked = true;
            }
        }
    }

    /// The process connects a socket: at its first (a rank joining its
    /// rendezvous), what it has set so far is read.
    pub fn connects(&mut self, host: &mut dyn Host, tgid: u32, now: u64) {
        if self.known.get(&tgid).is_some_and(|k| !k.connected) {
            self.read_now(host, tgid, now);
            if let Some(k) = self.known.get_mut(&tgid) {
                k.connected = true;
            }
        }
    }

    /// The NCCL communicators the GPU probes saw created: a process in
    /// one is a rank of the run its unique id names, whatever its
    /// environment says (a launcher that sets no variable). Of several (a
    /// sub-group from `ncclCommSplit`, a two-rank link for point-to-point),
    /// the widest is the process's world.
    pub fn communicators(&mut self, comms: &[CommSnap]) {
        for c in comms {
            let (Some(rank), Some(nranks), Some(id)) = (c.rank, c.nranks, c.id) else { continue };
            let Some(k) = self.known.get_mut(&c.tgid) else { continue };
            let wider = k.communicator.is_none_or(|(_, n, had)| nranks > n || (nranks == n && id < had));
            if wider && k.communicator != Some((rank, nranks, id)) {
                k.communicator = Some((rank, nranks, id));
                self.changed = true;
            }
        }
    }

    /// Spawned processes whose target is not known yet, looked at again.
    pub fn revisit(&mut self, host: &mut dyn Host, now: u64) {
        let due: Vec<u32> = self
            .known
            .iter()
            .filter(|(_, k)| {
                k.alive
                    && k.spawned
                    && k.torch_spawned.is_none()
                    && now.saturating_sub(k.first_seen_ns) < LOOK_FOR_NS
                    && now.saturating_sub(k.last_look_ns) >= LOOK_EVERY_NS
            })
            .map(|(t, _)| *t)
            .collect();
        for tgid in due {
            self.look(host, tgid, now);
        }
    }

    /// Whether a process multiprocessing spawned has not yet shown what it
    /// runs (it may be a rank still importing: who is who is not known).
    pub fn settling(&self, now: u64) -> bool {
        self.known.values().any(|k| {
            k.alive
                && k.spawned
                && k.torch_spawned.is_none()
                && now.saturating_sub(k.first_seen_ns) < LOOK_FOR_NS
        })
    }

    /// Processes that ended. Only one that may be a spawned rank is kept,
    /// until its launcher ends (its place among its siblings can be its
    /// rank); a spawned process of another target (a DataLoader's spawned
    /// worker, re-spawned every epoch) is not, or a daemon watching for
    /// weeks would keep every worker that ever ran.
    pub fn ended(&mut self, tgids: impl IntoIterator<Item = u32>) {
        for t in tgids {
            match self.known.get_mut(&t) {
                Some(k) if k.spawned && k.torch_spawned != Some(false) => k.alive = false,
                Some(_) => {
                    self.known.remove(&t);
                }
                None => {}
            }
        }
        let known = &self.known;
        let orphans: Vec<u32> = known
            .iter()
            .filter(|(_, k)| !k.alive && k.parent_known && !known.contains_key(&k.ppid))
            .map(|(t, _)| *t)
            .collect();
        for t in orphans {
            self.known.remove(&t);
        }
    }

    fn read_now(&mut self, host: &mut dyn Host, tgid: u32, now: u64) {
        let live = host.live_environ(tgid);
        let Some(k) = self.known.get_mut(&tgid) else { return };
        if live.is_some() && live != k.live {
            k.live = live;
            self.changed = true;
        }
        if k.spawned && k.torch_spawned.is_none() {
            self.look(host, tgid, now);
        }
    }

    fn look(&mut self, host: &mut dyn Host, tgid: u32, now: u64) {
        let main = host.main_python_thread(tgid);
        let seen = main.as_ref().and_then(|m| pystack::runs_torch_spawn(&m.frames));
        let Some(k) = self.known.get_mut(&tgid) else { return };
        k.last_look_ns = now;
        if seen.is_some() {
            k.torch_spawned = seen;
            k.spawn_index = main.and_then(|m| m.spawn_index).filter(|_| seen == Some(true));
            self.changed = true;
        }
    }

    /// Every known process's rank, when something changed since the last
    /// call (None: nothing changed).
    pub fn take_ranks(&mut self) -> Option<Vec<(u32, Option<Rank>)>> {
        if !std::mem::take(&mut self.changed) {
            return None;
        }
        let mut ranks: HashMap<u32, Option<Rank>> =
            self.known.iter().map(|(t, k)| (*t, environment_rank(k))).collect();
        let children: Vec<SpawnChild> = self
            .known
            .iter()
            .filter(|(_, k)| k.spawned)
            .map(|(t, k)| SpawnChild {
                tgid: *t,
                ppid: k.ppid,
                started: k.started,
                torch_spawned: k.torch_spawned,
                index: k.spawn_index,
                run_id: k.env_now().run_id(),
            })
            .collect();
        let node_rank = |launcher: u32| self.known.get(&launcher).and_then(|k| k.env_now().node_rank());
        for (tgid, rank) in spawn_ranks(&children, node_rank) {
            let slot = ranks.entry(tgid).or_default();
            if slot.is_none() {
                *slot = Some(rank);
            }
        }
        // Only where no launcher named one: a rank's sub-groups number it
        // anew.
        for (tgid, slot) in ranks.iter_mut().filter(|(_, r)| r.is_none()) {
            *slot = self.known.get(tgid).and_then(communicator_rank);
        }
        Some(ranks.into_iter().collect())
    }
}

/// What the NCCL communicator it created names.
fn communicator_rank(k: &Known) -> Option<Rank> {
    k.communicator.map(|(rank, nranks, id)| Rank::of_communicator(rank, nranks, id))
}

/// What its environment names: the one it has now where that differs from
/// the one it was exec'd with, else that one.
fn environment_rank(k: &Known) -> Option<Rank> {
    let exec = k.exec.rank(Found::ExecEnviron);
    match &k.live {
        Some(live) if *live != k.exec => live.rank(Found::LiveEnviron).or(exec),
        _ => exec,
    }
}
