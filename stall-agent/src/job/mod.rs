//! One traced job: its model, its recent windows and what its GPUs did,
//! with one way in for kernel events ([`Job::observe`]) and map snapshots
//! ([`Job::tick`]), and one way out per interval ([`Tick`]) and at the end
//! ([`Report`]). `stall run`/`attach` drive one job; `stall daemon` drives
//! one per cgroup. Both feed it through [`Feed`] and answer its questions
//! about the machine through [`Host`].
mod feed;
pub mod gpu;
mod host;
mod identity;
mod startup;

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};

use stall_common::fd_kind;

pub use self::{
    feed::{Feed, Received, Wake},
    gpu::{GpuFleet, GpuTrack},
    host::{Host, LiveHost, ProcInfo},
};
use self::{
    identity::{Identities, Sighting},
    startup::{past_set_up, Startup, MIN_STEADY_NS},
};
use crate::{
    aggregate::{push_recent, Model, ProcWindow, ThreadWindow, Window},
    correlate::{self, RoleChange, Roles},
    decode::{Event, Inode, Snapshot},
    gpu::GpuWindow,
    progress::{Progress, ProgressView},
    pystack::PyStack,
    verdict::{self, Kind, Verdict},
    wait::WaitObject,
};

/// Every this many snapshots, which cgroup caps each live process's CPU is
/// looked up again (processes move between cgroups; each lookup reads
/// /proc and the cgroup files).
const CPU_LIMIT_REFRESH: u64 = 5;

/// Whether to read the Python stacks of the threads a verdict blames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stacks {
    Off,
    /// With live verdicts that blame threads (a hang, an input bottleneck),
    /// rate-limited, and always for the final report.
    On,
    /// With every verdict, this often (what reading costs, measured).
    Every(std::time::Duration),
}

/// Which devices count as the job's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuScope {
    /// Every sampled device: a job stall was pointed at (its processes may
    /// be invisible to NVML from inside a container's pid namespace).
    All,
    /// Only devices on which one of the job's processes holds a context:
    /// the daemon's jobs share a node.
    Held,
}

pub struct Job {
    /// The kernel side's job id (cgroup mode); 1 for `run`/`attach`.
    pub id: u32,
    pub model: Model,
    recent: VecDeque<Window>,
    /// The process stall was pointed at (`attach --pid`, `run`'s command).
    root: Option<u32>,
    scope: GpuScope,
    /// Devices this job has used, so their series can be dropped with it.
    pub devices: BTreeSet<u32>,
    progress: Progress,
    /// The outputs open at attach have been looked at.
    outputs_noted: bool,
    startup: Startup,
    /// Workers that have read data or woken a trainer (their pipeline ran).
    workers_ran: HashSet<u32>,
    /// Last sum of /proc I/O counters ([`Job::note_io`]).
    io_chars: Option<u64>,
    /// Snapshots absorbed.
    snapshots: u64,
    /// Mapped files whose path was asked of the host.
    inodes_asked: HashSet<(u32, Inode)>,
    pub stacks: Stacks,
    /// The last Python stacks read, reused between live reads.
    last_stacks: Option<(Kind, Vec<PyStack>, Vec<String>)>,
    /// What each trainer thread was last seen blocked on for each reason
    /// (the reason it waited for, and the object; the latest first), by
    /// tid: a thread blocked 70 % of the time is found running at some
    /// ticks.
    waits: HashMap<u32, Vec<(u8, WaitObject)>>,
    /// The filesystem serving each file the job read, where a server does
    /// (None: a local one), by path: asked while its reader runs, once.
    filesystems: HashMap<String, Option<String>>,
    /// Which rank each process is, as its sources tell.
    identities: Identities,
    /// The trainers as last assigned, and each time they changed (the
    /// newest [`MAX_ROLE_CHANGES`]).
    trainers: Vec<u32>,
    role_changes: VecDeque<RoleChange>,
    /// The last live verdict, where it was a hang: what the threads were
    /// blocked on (a lock and its holder, a pipe) is gone with them once
    /// the job is killed.
    last_hang: Option<Verdict>,
}

/// Role changes kept for the report: a job whose trainer flaps between two
/// processes says so in the last few.
const MAX_ROLE_CHANGES: usize = 16;

/// What the outputs need after one interval.
#[derive(Debug, Clone)]
pub struct Tick {
    /// Since the previous tick (counters exported as increments).
    pub interval: Window,
    pub interval_gpus: Vec<GpuWindow>,
    /// The last few seconds, which the live verdict judges.
    pub recent: Window,
    pub gpus: Vec<GpuWindow>,
    pub roles: Roles,
    pub verdict: Verdict,
    pub progress: ProgressView,
    /// Seconds since tracing started.
    pub elapsed_s: f64,
    /// Still in its startup: the input pipeline has not run yet.
    pub starting_up: bool,
}

/// The whole run, when tracing ends.
#[derive(Debug, Clone)]
pub struct Report {
    pub summary: Window,
    pub gpus: Vec<GpuWindow>,
    pub roles: Roles,
    /// The verdict: on the steady state when a startup was set apart.
    pub verdict: Verdict,
    pub progress: ProgressView,
    /// Seconds from the start of tracing to the interval in which the input
    /// pipeline started, when there was a startup to set apart.
    pub startup_s: Option<f64>,
    /// The same instant, monotonic ns (the timeline marks it).
    pub startup_end_ns: Option<u64>,
    /// Each time the trainers changed while tracing, and why.
    pub role_changes: Vec<RoleChange>,
}

impl Job {
    pub fn new(id: u32, start_ns: u64, root: Option<u32>, scope: GpuScope) -> Self {
        Self {
            id,
            model: Model::new(start_ns),
            recent: VecDeque::new(),
            root,
            scope,
            devices: BTreeSet::new(),
            progress: Progress::new(start_ns),
            outputs_noted: false,
            startup: Startup::Watching { before: Window::default() },
            workers_ran: HashSet::new(),
            io_chars: None,
            snapshots: 0,
            inodes_asked: HashSet::new(),
            stacks: Stacks::Off,
            last_stacks: None,
            waits: HashMap::new(),
            filesystems: HashMap::new(),
            identities: Identities::default(),
            trainers: Vec::new(),
            role_changes: VecDeque::new(),
            last_hang: None,
        }
    }

    /// Records the outputs its processes have open now, with their last
    /// write: a job that went silent before stall attached is dated at once.
    /// Once, at the first snapshot that has its threads (not for every
    /// process forked later: a fork storm would walk /proc for each).
    fn note_outputs(&mut self, host: &dyn Host) {
        let pids: Vec<u32> = self.model.procs.values().filter(|p| p.alive).map(|p| p.tgid).collect();
        for pid in pids {
            for (path, last_write_ns) in host.outputs(pid) {
                self.progress.note_output(&path, pid, last_write_ns);
            }
        }
    }

    /// Applies a batch of decoded events, adding what only the host can
    /// tell: what an opened descriptor is, the new process's name, and the
    /// files it inherited (applied after the batch, as they come from /proc
    /// now, not from the stream).
    pub fn observe(&mut self, host: &mut dyn Host, events: impl IntoIterator<Item = Event>) {
        let mut inherited = Vec::new();
        for ev in events {
            self.model.apply(&ev);
            match &ev {
                Event::Open { tgid, fd, file_id, path, dup_of, .. } => {
                    // A dup of a descriptor already classified is the same;
                    // the kernel copied its kind, which may predate the
                    // original's classification.
                    let known =
                        self.model.files.get(file_id).map(|f| f.kind).filter(|k| *k != fd_kind::UNKNOWN);
                    if let (Some(_), Some(kind)) = (dup_of, known) {
                        if kind == fd_kind::OTHER {
                            host.mark_not_file(*tgid, *fd, *file_id);
                        }
                        continue;
                    }
                    let Some(opened) = host.classify_open(*tgid, *fd, path) else { continue };
                    if opened.regular {
                        // The kernel counts UNKNOWN as a file already; no map
                        // write, so no read-modify-write race with its counters.
                        self.model.set_file_kind(*file_id, fd_kind::REGULAR);
                        if !path.starts_with('/') {
                            self.model.set_file_resolved(*file_id, &opened.target);
                        }
                        if let Some(inode) = opened.inode {
                            self.model.set_file_inode(*file_id, inode);
                        }
                    } else {
                        host.mark_not_file(*tgid, *fd, *file_id);
                        self.model.set_file_kind(*file_id, fd_kind::OTHER);
                    }
                }
                Event::NewTask { ts, parent_tgid, child_tid, child_tgid, .. } if child_tid == child_tgid => {
                    // Before the child is seen: it inherits what its parent
                    // has set by now.
                    self.identities.forks(host, *parent_tgid, *ts);
                    self.note_process(host, *child_tgid, *ts);
                    // Inherited descriptors only matter if the parent had
                    // files open (a fork storm of processes without any
                    // costs no /proc walk).
                    if self.model.files.values().any(|f| f.tgid == *parent_tgid && f.open) {
                        inherited.extend(host.inherited_files(*child_tgid, self.id));
                    }
                }
                Event::Connect { ts, tgid, peer, .. } => {
                    self.identities.connects(host, *tgid, *ts);
                    // Asked once per peer: a loader connecting per sample
                    // connects to the same few.
                    if !self.model.peer_known(peer) {
                        let pids: Vec<u32> =
                            self.model.procs.values().filter(|p| p.alive).map(|p| p.tgid).collect();
                        let inside = host.peer_in(*tgid, peer, &pids);
                        self.model.note_peer(peer, inside);
                    }
                }
                Event::Exec { ts, tgid, .. } => {
                    // A process the job first meets as it execs (moved into
                    // a watched cgroup, then exec'd) is seen as it is now.
                    let first = !self.identities.knows(*tgid);
                    self.note_process(host, *tgid, *ts);
                    let cmdline = host.cmdline(*tgid);
                    // A launcher execs its ranks with their environment.
                    if !first {
                        self.identities.exec(host, *tgid, cmdline.as_deref(), *ts);
                    }
                    if let Some(c) = cmdline {
                        self.model.note_process(*tgid, None, "", Some(c));
                    }
                }
                _ => {}
            }
        }
        for (_, ev) in &inherited {
            self.model.apply(ev);
        }
        self.note_ranks();
    }

    /// The ranks of the job's processes into the model, when any changed.
    fn note_ranks(&mut self) {
        for (tgid, rank) in self.identities.take_ranks().into_iter().flatten() {
            self.model.note_rank(tgid, rank);
        }
    }

    /// Takes one map snapshot (this job's part of it) into the model:
    /// counters, current names, and the kernel entries of what ended freed
    /// (keeps the maps bounded), with the last counts of the descriptors
    /// exit closed.
    pub fn absorb(&mut self, host: &mut dyn Host, snap: &Snapshot) {
        self.model.apply_snapshot(snap);
        for t in &snap.threads {
            self.note_process(host, t.tgid, snap.ts);
        }
        self.identities.revisit(host, snap.ts);
        self.note_cpu_limits(host, snap.ts);
        self.name_mapped_files(host);
        self.model.refresh_names(|tgid, tid| host.thread_comm(tgid, tid));
        if !self.outputs_noted && !snap.threads.is_empty() {
            self.outputs_noted = true;
            self.note_outputs(host);
        }
        self.identities.communicators(&snap.communicators);
        let (tgids, tids) = self.model.dead();
        self.identities.ended(tgids.iter().copied());
        self.note_ranks();
        if tgids.is_empty() && tids.is_empty() {
            return;
        }
        self.inodes_asked.retain(|(tgid, _)| !tgids.contains(tgid));
        let last = host.retire(&tgids, &tids);
        self.model.apply_files(&last);
        self.model.end_files_of(&tgids, snap.ts);
        self.model.mark_retired(&tgids, &tids);
    }

    /// The CPU limits of the job's cgroups at the snapshot's time: which
    /// caps each process (looked up again now and then), their counters,
    /// and the runqueue wait they caused.
    fn note_cpu_limits(&mut self, host: &dyn Host, ts: u64) {
        self.snapshots += 1;
        if self.snapshots % CPU_LIMIT_REFRESH == 1 {
            let live: Vec<u32> = self.model.procs.values().filter(|p| p.alive).map(|p| p.tgid).collect();
            // A process that has just exited keeps what was known of it.
            for tgid in live {
                if let Some(limit) = host.cpu_limit(tgid) {
                    self.model.note_cpu_limit(tgid, limit);
                }
            }
        }
        let cgroups = self.model.limited_cgroups();
        if cgroups.is_empty() {
            return;
        }
        let readings: Vec<_> = cgroups.iter().filter_map(|c| host.read_cpu_limit(c)).collect();
        self.model.apply_cpu_limits(ts, &readings, host.usable_cpus());
    }

    /// Names the files whose pages a process took through a mapping no
    /// process of the job opened while traced (inherited across fork,
    /// made before stall came), from the process's mappings; each asked
    /// once.
    fn name_mapped_files(&mut self, host: &dyn Host) {
        for (tgid, inode) in self.model.unnamed_inodes() {
            if !self.inodes_asked.insert((tgid, inode)) {
                continue;
            }
            if let Some(path) = host.mapped_path(tgid, inode) {
                self.model.name_inode(inode, path);
            }
        }
    }

    /// Names a process once, from the host, and asks where it stands in a
    /// run.
    fn note_process(&mut self, host: &mut dyn Host, tgid: u32, now: u64) {
        if self.model.procs.get(&tgid).is_some_and(|p| p.cmdline.is_some()) && self.identities.knows(tgid) {
            return;
        }
        if let Some(limit) = host.cpu_limit(tgid) {
            self.model.note_cpu_limit(tgid, limit);
        }
        let info = host.process(tgid);
        let cmdline = host.cmdline(tgid);
        let born_ns = self.model.procs.get(&tgid).map_or(0, |p| p.born_ns);
        if let Some(i) = &info {
            let seen = Sighting {
                tgid,
                ppid: i.ppid,
                cmdline: cmdline.as_deref(),
                // /proc's time for every process, not the fork event's: a
                // process can be met in a map snapshot before its fork event
                // is read, and siblings are ordered on one clock (ties go to
                // the pid).
                started_ns: i.started_ns,
                forked_while_traced: born_ns > 0,
            };
            self.identities.first_sight(host, seen, now);
        }
        self.model.note_process(
            tgid,
            info.as_ref().map(|i| i.ppid),
            info.as_ref().map_or("", |i| i.comm.as_str()),
            cmdline,
        );
        if let Some(i) = &info {
            self.model.note_start(tgid, i.started_ns);
        }
    }

    /// Ends an interval at the snapshot's time: absorbs it, cuts the
    /// interval window and judges the last few seconds.
    pub fn tick(&mut self, host: &mut dyn Host, snap: &Snapshot, gpus: &GpuFleet) -> Tick {
        self.absorb(host, snap);
        let interval = self.model.interval(snap.ts);
        push_recent(&mut self.recent, interval.clone());
        let recent = Window::merge(self.recent.make_contiguous());
        let tracks = self.tracks(gpus);
        let summary = self.model.summary(snap.ts);
        let roles = self.roles(&tracks, &summary);
        self.note_roles(&roles, &summary, snap.ts);
        self.progress.observe(&interval, &roles);
        let window_of = |w: &Window| -> Vec<GpuWindow> {
            tracks.iter().map(|g| g.window(w.start_ns, w.end_ns)).collect()
        };
        let gpu_windows = window_of(&recent);
        let interval_gpus = window_of(&interval);
        self.watch_startup(summary, &interval, &roles, &interval_gpus);
        let progress = self.progress.view(snap.ts);
        let mut recent = recent;
        self.note_waits(host, &recent, &roles);
        self.note_filesystems(host, &recent);
        self.place_seen(&mut recent);
        let mut verdict = verdict::judge(&recent, &roles, &gpu_windows, &progress);
        if verdict.kind.wants_stacks() || matches!(self.stacks, Stacks::Every(_)) {
            self.add_stacks(host, &mut verdict, false);
            verdict = placed(host, verdict, &recent, &roles, &gpu_windows, &progress);
        }
        let alive = roles.trainers.iter().any(|t| recent.proc(*t).is_some_and(|p| p.alive));
        match verdict.kind {
            Kind::Hang if alive => self.last_hang = Some(verdict.clone()),
            // Judged as it died: what its threads waited on is gone.
            Kind::Hang => {}
            _ => self.last_hang = None,
        }
        Tick {
            progress,
            elapsed_s: snap.ts.saturating_sub(self.model.start_ns) as f64 / 1e9,
            interval,
            interval_gpus,
            recent,
            gpus: gpu_windows,
            roles,
            verdict,
            starting_up: matches!(self.startup, Startup::Watching { .. }),
        }
    }

    /// The whole run up to `end_ns`, and the verdict on its steady state
    /// (after startup, when it ended). A job that ends hung is hung,
    /// whatever it did before: then the verdict is the last few seconds'.
    pub fn finish(&mut self, host: &mut dyn Host, end_ns: u64, gpus: &GpuFleet) -> Report {
        let end_ns = end_ns.max(self.model.last_ns);
        let mut summary = self.model.summary(end_ns);
        let tracks = self.tracks(gpus);
        let roles = self.roles(&tracks, &summary);
        self.note_roles(&roles, &summary, end_ns);
        let mut recent = Window::merge(self.recent.make_contiguous());
        self.note_waits(host, &recent, &roles);
        self.place_seen(&mut recent);
        self.place_seen(&mut summary);
        let recent_gpus: Vec<GpuWindow> =
            tracks.iter().map(|g| g.window(recent.start_ns, recent.end_ns)).collect();
        let progress = self.progress.view(end_ns);
        let recent_verdict = verdict::judge(&recent, &roles, &recent_gpus, &progress);
        let summary_gpus: Vec<GpuWindow> = tracks.iter().map(|g| g.summary(end_ns)).collect();
        let hung_now = recent_verdict.kind == Kind::Hang;
        let (startup_end_ns, verdict) = match &self.startup {
            _ if hung_now => (None, recent_verdict),
            // A steady state too short to judge (the pipeline started as the
            // job ended) is no reason to drop the rest.
            Startup::Done { before, phases, .. }
                if before.end_ns > self.model.start_ns
                    && end_ns.saturating_sub(before.end_ns) >= MIN_STEADY_NS =>
            {
                // Past the trainers' last imports where that leaves a steady
                // state to judge: the first steps load what the job uses.
                let before = past_set_up(before, phases, end_ns);
                let mut steady = summary.since(before);
                self.place_seen(&mut steady);
                let gpus: Vec<GpuWindow> = tracks.iter().map(|g| g.since(steady.start_ns, end_ns)).collect();
                (Some(before.end_ns), verdict::judge(&steady, &roles, &gpus, &progress))
            }
            _ => (None, verdict::judge(&summary, &roles, &summary_gpus, &progress)),
        };
        // Killed hung (by its operator, a timeout): its threads are gone,
        // and with them what they were blocked on; the last live verdict
        // still says.
        let ended = roles.trainers.iter().all(|t| summary.proc(*t).is_none_or(|p| !p.alive));
        let verdict = match self.last_hang.take().filter(|_| hung_now && ended) {
            Some(mut last) => {
                last.summary.push_str(" (as last seen live, before the job ended)");
                last
            }
            None => {
                let mut verdict = verdict;
                self.add_stacks(host, &mut verdict, true);
                if hung_now {
                    verdict = placed(host, verdict, &recent, &roles, &recent_gpus, &progress);
                }
                verdict
            }
        };
        let startup_s = startup_end_ns.map(|t| (t - self.model.start_ns) as f64 / 1e9);
        let role_changes = self.role_changes.iter().cloned().collect();
        Report {
            summary,
            gpus: summary_gpus,
            roles,
            verdict,
            progress,
            startup_s,
            startup_end_ns,
            role_changes,
        }
    }

    /// Keeps the trainers just assigned over `summary`, noting a change.
    fn note_roles(&mut self, roles: &Roles, summary: &Window, now_ns: u64) {
        let at_s = now_ns.saturating_sub(self.model.start_ns) as f64 / 1e9;
        if let Some(c) = correlate::change(&self.trainers, roles, summary, at_s) {
            if self.role_changes.len() == MAX_ROLE_CHANGES {
                self.role_changes.pop_front();
            }
            self.role_changes.push_back(c);
        }
        self.trainers.clone_from(&roles.trainers);
    }

    /// The syscall hooks are attached again after a stretch without them
    /// (the daemon's cheap tier): what the processes opened and closed
    /// meanwhile was not seen. Their descriptors are retired with their
    /// counts and looked up afresh.
    pub fn reseed(&mut self, host: &mut dyn Host, now_ns: u64) {
        let tgids: HashSet<u32> = self.model.procs.values().filter(|p| p.alive).map(|p| p.tgid).collect();
        let last = host.forget_files(&tgids);
        self.model.apply_files(&last);
        self.model.end_files_of(&tgids, now_ns);
        let mut opens = Vec::new();
        for &pid in &tgids {
            opens.extend(host.inherited_files(pid, self.id).into_iter().map(|(_, ev)| ev));
        }
        self.observe(host, opens);
    }

    /// Progress from /proc while no syscall hook runs: the trainer's and
    /// its workers' read and write byte counters moved since the last look.
    pub fn note_io(&mut self, host: &dyn Host, roles: &Roles, now_ns: u64) {
        let counts = |tgid: u32| roles.trainers.is_empty() || roles.of(tgid) != correlate::Role::Other;
        let total: u64 = self
            .model
            .procs
            .values()
            .filter(|p| p.alive && counts(p.tgid))
            .filter_map(|p| host.io_chars(p.tgid))
            .sum();
        if self.io_chars.is_some_and(|prev| total > prev) {
            self.progress.moved_at(now_ns);
        }
        self.io_chars = Some(total);
    }

    /// Asks what the trainers' blocked threads wait on, where their
    /// syscall has an object (a descriptor, a lock, a child): one /proc
    /// read per such thread per tick, none for futexes and sleeps.
    fn note_waits(&mut self, host: &mut dyn Host, w: &Window, roles: &Roles) {
        const MAX_THREADS: usize = 64;
        let mut live = HashSet::new();
        for p in roles.trainers.iter().filter_map(|t| w.proc(*t)) {
            for t in p.threads.iter().take(MAX_THREADS) {
                // Kept for the report once the thread has ended.
                live.insert(t.tid);
                if !t.alive {
                    continue;
                }
                let nr = i64::from(t.now.syscall);
                if !t.now.running && crate::wait::subject_of(nr).is_some() {
                    if let Some(o) = host.waits_on(p.tgid, t.tid, nr) {
                        self.note_wait(t.tid, t.now.reason, o);
                        continue;
                    }
                }
                self.note_fd_wait(host, p, t);
            }
        }
        self.waits.retain(|tid, _| live.contains(tid));
    }

    /// For a thread not caught in its wait at this tick (a tick is a
    /// sample; a thread blocked 70 % of the time escapes a few in a row):
    /// what it blocked on longest, from the kernel's blocked time per
    /// descriptor of its process in the window, where that descriptor is
    /// the kind its longest descriptor wait blocks on (a pipe or socket for
    /// `send` and `poll`, a file for `io`, `write` and `sync`).
    fn note_fd_wait(&mut self, host: &mut dyn Host, p: &ProcWindow, t: &ThreadWindow) {
        use stall_common::reason;
        const FD_REASONS: [u8; 5] = [reason::SEND, reason::POLL, reason::IO, reason::WRITE, reason::SYNC];
        let Some(&why) = FD_REASONS.iter().max_by_key(|r| t.delta.off_ns[usize::from(**r)]) else { return };
        let blocked = t.delta.off_ns[usize::from(why)];
        if blocked == 0
            || p.fd_waits.is_empty()
            || self.waits.get(&t.tid).and_then(|w| w.first()).is_some_and(|(r, _)| *r == why)
        {
            return;
        }
        // The descriptor waits are the process's: another thread blocked
        // as long for the same reason could be the one that waited there.
        let shared =
            p.threads.iter().any(|o| o.tid != t.tid && o.delta.off_ns[usize::from(why)] >= blocked / 4);
        if shared {
            return;
        }
        let writing = matches!(why, reason::SEND | reason::WRITE | reason::SYNC);
        let fits = |o: &WaitObject| match o {
            WaitObject::Pipe { .. } | WaitObject::Socket { .. } => matches!(why, reason::SEND | reason::POLL),
            WaitObject::File { .. } => !matches!(why, reason::SEND | reason::POLL),
            WaitObject::Lock { .. } | WaitObject::Child { .. } => false,
        };
        // The few longest that fit its time: at least half of it in the
        // reason, at most all of its time in descriptor waits (more, and
        // other threads waited there too).
        let on_fds: u64 = FD_REASONS.iter().map(|r| t.delta.off_ns[usize::from(*r)]).sum();
        let fits_time = |ns: u64| ns >= blocked / 2 && ns <= on_fds + on_fds / 10 + 10_000_000;
        for f in p.fd_waits.iter().take(3).filter(|f| fits_time(f.blocked_ns)) {
            if let Some(o) = host.descriptor(p.tgid, f.fd, writing).filter(fits) {
                self.note_wait(t.tid, why, o);
                return;
            }
        }
    }

    /// `tid` was seen blocked on `o` for `why`: the latest object for that
    /// reason, and the latest of all.
    fn note_wait(&mut self, tid: u32, why: u8, o: WaitObject) {
        let seen = self.waits.entry(tid).or_default();
        seen.retain(|(r, _)| *r != why);
        seen.insert(0, (why, o));
    }

    /// Asks which filesystem serves each file the job's live processes
    /// read in `w` and that was not asked about yet: one stat per new file
    /// (the host reads a mount table once per device).
    fn note_filesystems(&mut self, host: &mut dyn Host, w: &Window) {
        // A job that opens a file per sample names many: past this, the
        // table starts over rather than grow.
        const MAX_FILES: usize = 16_384;
        if self.filesystems.len() > MAX_FILES {
            self.filesystems.clear();
        }
        for p in w.procs.iter().filter(|p| p.alive) {
            for f in p.files.iter().filter(|f| f.bytes_in() > 0 && !f.is_code()) {
                if !self.filesystems.contains_key(&f.path) {
                    let fs = host.remote_filesystem(p.tgid, f.name());
                    self.filesystems.insert(f.path.clone(), fs);
                }
            }
        }
    }

    /// Gives the threads of `w` what they were last seen waiting on, and
    /// its files the filesystem that serves them.
    fn place_seen(&self, w: &mut Window) {
        for t in w.procs.iter_mut().flat_map(|p| p.threads.iter_mut()) {
            t.waits_on = self.waits.get(&t.tid).cloned().unwrap_or_default();
        }
        for f in w.procs.iter_mut().flat_map(|p| p.files.iter_mut()) {
            f.filesystem = self.filesystems.get(&f.path).cloned().flatten();
        }
    }

    /// Adds the Python stacks of the threads `v` blames: read now when
    /// `fresh` or a live read is due, else the last ones read for a verdict
    /// of the same kind.
    fn add_stacks(&mut self, host: &mut dyn Host, v: &mut Verdict, fresh: bool) {
        if self.stacks == Stacks::Off || v.blamed.is_empty() {
            return;
        }
        let every = match self.stacks {
            Stacks::Every(d) => d,
            _ => crate::pystack::LIVE_EVERY,
        };
        if fresh || host.python_stacks_due(every) {
            let threads: Vec<(u32, u32, String)> =
                v.blamed.iter().map(|b| (b.pid, b.tid, b.what.to_string())).collect();
            let (stacks, notes) = host.python_stacks(&threads);
            // Processes that ended meanwhile leave nothing: keep what was
            // read while they ran (the final report of a job that exited).
            let kept = self.last_stacks.as_ref().is_some_and(|(k, s, _)| *k == v.kind && !s.is_empty());
            if !stacks.is_empty() || !notes.is_empty() || !kept {
                self.last_stacks = Some((v.kind, stacks, notes));
            }
        }
        if let Some((kind, stacks, notes)) = &self.last_stacks {
            if *kind == v.kind {
                v.python_stacks.clone_from(stacks);
                v.python_notes.clone_from(notes);
            }
        }
    }

    /// Forgets what has ended once it was counted (the daemon's memory
    /// follows the live job, not its history).
    pub fn prune(&mut self) {
        self.model.prune();
    }

    /// The process stall was pointed at has ended (or is a zombie).
    pub fn root_gone(&self, host: &dyn Host) -> bool {
        let Some(root) = self.root else { return false };
        let zombie_or_gone = host.process(root).is_none_or(|p| p.state == 'Z' || p.state == 'X');
        zombie_or_gone || self.model.procs.get(&root).is_some_and(|p| !p.alive)
    }

    /// This job's devices (and remembers them).
    fn tracks<'a>(&mut self, gpus: &'a GpuFleet) -> Vec<&'a GpuTrack> {
        let tracks: Vec<&GpuTrack> = match self.scope {
            GpuScope::All => gpus.tracks.iter().collect(),
            GpuScope::Held => gpus
                .tracks
                .iter()
                .filter(|g| g.pids.iter().any(|p| self.model.procs.contains_key(p)))
                .collect(),
        };
        self.devices.extend(tracks.iter().map(|g| g.index));
        tracks
    }

    /// Roles over the whole run so far (stable from one tick to the next).
    fn roles(&self, tracks: &[&GpuTrack], summary: &Window) -> Roles {
        let on_gpu: HashSet<u32> = tracks.iter().flat_map(|g| g.pids.iter().copied()).collect();
        correlate::assign(summary, &on_gpu, self.root)
    }
}

/// A run whose ranks all look hung, judged again once what their trainers
/// wait on (else the Python stacks read for it) tells the ranks waiting in
/// a collective from the one that never reached it (the stacks stay with
/// the verdict).
fn placed(
    host: &dyn Host,
    v: Verdict,
    w: &Window,
    roles: &Roles,
    gpus: &[GpuWindow],
    progress: &ProgressView,
) -> Verdict {
    let job: Vec<u32> = w.procs.iter().filter(|p| p.alive).map(|p| p.tgid).collect();
    let holder = |tgid: u32, peer: &str| host.socket_holder(tgid, peer, &job);
    let Some(in_collective) = verdict::collective_waits(&v, w, holder) else { return v };
    let mut placed = verdict::judge_placed(w, roles, gpus, progress, &in_collective);
    placed.python_stacks = v.python_stacks;
    placed.python_notes = v.python_notes;
    placed
}

#[cfg(test)]
mod tests;
