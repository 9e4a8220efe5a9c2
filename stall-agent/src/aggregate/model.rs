//! The job as seen so far: processes, threads, files and wakeups, built from
//! decoded events and map snapshots, and cut into [`Window`]s.
//!
//! Counters are kept as the kernel reports them: `total` is the latest
//! cumulative value, `mark` the value at the end of the previous interval
//! window. An interval is `total - mark`; the whole run is `total`. Nothing
//! here subtracts from the kernel's counters, so a snapshot can never be
//! counted twice. Pure: no kernel, no /proc; unit-tested on synthetic streams.
mod cut;
mod ended;
mod throttle;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use stall_common::{counter::LOST_CAUSES, fd_kind};

pub use self::ended::MAX_ENDED;
use self::{ended::Folded, throttle::LimitTally};
use super::FileWindow;
use crate::{
    decode::{Event, FileCounters, FileSnap, Inode, Snapshot, ThreadCounters, ThreadNow},
    rank::Rank,
};

#[derive(Debug, Clone, Default)]
pub struct Proc {
    pub tgid: u32,
    pub ppid: Option<u32>,
    pub comm: String,
    pub cmdline: Option<String>,
    /// Its rank of a distributed run, from its environment.
    pub rank: Option<Rank>,
    pub alive: bool,
    /// Its threads (an index: exits and folding touch one process, not
    /// every thread of the job).
    pub tids: Vec<u32>,
    /// When it was forked and when it last exec'd, if seen (0: not seen;
    /// it ran before tracing started).
    pub born_ns: u64,
    pub exec_ns: u64,
    /// When it started, as /proc tells it (ns since boot, in 10 ms ticks;
    /// 0: not known), whether or not it was traced then.
    pub started_ns: u64,
    /// The cgroup that caps its CPU, if any.
    pub cpu_limit: Option<String>,
    /// Ended and its kernel entries freed (see [`Model::dead`]).
    retired: bool,
    /// Its threads that ended and whose ids a new thread took (pids wrap),
    /// summed.
    reused_tids: Option<Box<Thread>>,
}

#[derive(Debug, Clone, Default)]
pub struct Thread {
    pub tid: u32,
    pub tgid: u32,
    pub comm: String,
    /// The kernel's counters, with the runqueue wait its CPU limit caused
    /// moved to `THROTTLED` (see `throttle`).
    pub total: ThreadCounters,
    mark: ThreadCounters,
    pub now: ThreadNow,
    pub other_nr: i32,
    pub alive: bool,
    retired: bool,
    /// Runqueue wait apportioned to its CPU limit so far.
    throttled_ns: u64,
    /// Its on-CPU and runnable time when last apportioned.
    apportioned: (u64, u64),
}

#[derive(Debug, Clone, Default)]
pub struct File {
    pub file_id: u64,
    pub tgid: u32,
    pub fd: i32,
    pub path: String,
    /// Absolute path, when `path` was given relative.
    pub resolved: Option<String>,
    pub kind: u32,
    /// A copy of another descriptor (dup): its reads count, it is not
    /// another open.
    pub dup: bool,
    /// Which file it is, for the page cache's fills of it.
    pub inode: Option<Inode>,
    pub total: FileCounters,
    mark: FileCounters,
    pub open: bool,
    pub open_ts: u64,
    pub close_ts: Option<u64>,
}

/// One count the kernel keeps cumulative (wakes of a pair, storage bytes
/// of a file): `total` as last read, `mark` at the end of the previous
/// interval window.
#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    total: u64,
    mark: u64,
}

impl Tally {
    /// A reading of the kernel's count (never taken back).
    fn see(&mut self, count: u64) {
        self.total = self.total.max(count);
    }

    /// Since the last mark, or the whole run.
    fn since(&self, since_mark: bool) -> u64 {
        if since_mark {
            self.total.saturating_sub(self.mark)
        } else {
            self.total
        }
    }

    fn set_mark(&mut self) {
        self.mark = self.total;
    }
}

#[derive(Debug, Clone, Default)]
struct Wake {
    waker_tgid: u32,
    waker_comm: String,
    count: Tally,
    blocked: Tally,
}

#[derive(Debug, Default)]
pub struct Model {
    pub start_ns: u64,
    mark_ns: u64,
    pub last_ns: u64,
    pub procs: BTreeMap<u32, Proc>,
    pub threads: BTreeMap<u32, Thread>,
    pub files: HashMap<u64, File>,
    /// Which open of `files` each (process, descriptor) names now: the
    /// kernel keeps one entry per descriptor, so an older open still
    /// listed under the same number is stale (its close never reached the
    /// model) and must not be taken for it.
    open_fds: HashMap<(u32, i32), u64>,
    wakes: HashMap<(u32, u32), Wake>,
    /// Blocked time per (process, descriptor) in reads and writes.
    fd_waits: HashMap<(u32, i32), Tally>,
    /// Storage and mapped bytes per (process, file); None: not seen on
    /// this kernel.
    inode_bytes: Option<HashMap<(u32, Inode), InodeTally>>,
    /// Whether mapped bytes are followed on this kernel.
    mmap_known: bool,
    /// The path a process opened each file by (kept after it closes: the
    /// page cache fills a mapping long after its descriptor is gone).
    inode_paths: HashMap<(u32, Inode), (String, Option<String>)>,
    /// A path for each file by its inode alone: what names the pages a
    /// process faults in from a mapping it inherited (a dataset mapped
    /// before the DataLoader forked) or made before stall came.
    inode_names: HashMap<Inode, (String, Option<String>)>,
    /// Socket peers seen, and whether each is a process of the job.
    peers: HashMap<String, bool>,
    /// Closed files, folded per (process, path) once an interval has counted
    /// them: memory follows distinct paths, not opens (a job that opens the
    /// same shards a million times keeps one entry per shard).
    archived: HashMap<(u32, String), FileWindow>,
    /// What files closed since the last window read in it, per (process,
    /// path): a closed file leaves `files` at once, so an open storm costs
    /// memory per path, not per open.
    closing: HashMap<(u32, String), FileWindow>,
    /// Opens seen since the last window, per file id (a file opened and
    /// read between two snapshots is still counted once).
    opened: HashSet<u64>,
    /// The ranks' arrivals at their NCCL collectives, compared.
    arrivals: super::Arrivals,
    lost: [u64; LOST_CAUSES],
    lost_mark: [u64; LOST_CAUSES],
    events: u64,
    events_mark: u64,
    sched_gaps: u64,
    sched_repaired: u64,
    /// Processes in the order they ended, for folding the oldest.
    ended: VecDeque<u32>,
    /// Ended processes beyond [`MAX_ENDED`], summed (fork storms).
    folded: Folded,
    /// The limited cgroups of the job's processes, by directory, and when
    /// they were last read.
    cpu_limits: BTreeMap<String, LimitTally>,
    limits_ns: u64,
}

/// What the kernel counts per (process, file) outside read calls.
#[derive(Debug, Clone, Copy, Default)]
struct InodeTally {
    storage: Tally,
    mapped: Tally,
    shared: Tally,
}

impl Model {
    pub fn new(start_ns: u64) -> Self {
        Self { start_ns, mark_ns: start_ns, last_ns: start_ns, ..Default::default() }
    }

    /// Records what /proc (or the caller) knows of a process.
    pub fn note_process(&mut self, tgid: u32, ppid: Option<u32>, comm: &str, cmdline: Option<String>) {
        let p = self.procs.entry(tgid).or_insert_with(|| Proc { tgid, alive: true, ..Default::default() });
        if ppid.is_some() {
            p.ppid = ppid;
        }
        if !comm.is_empty() {
            p.comm = comm.to_string();
        }
        if cmdline.is_some() {
            p.cmdline = cmdline;
        }
    }

    /// Records when a process started, as /proc tells it.
    pub fn note_start(&mut self, tgid: u32, started_ns: u64) {
        if let Some(p) = self.procs.get_mut(&tgid) {
            p.started_ns = started_ns;
        }
    }

    /// Records a process's rank (read at its first sight and at each exec).
    pub fn note_rank(&mut self, tgid: u32, rank: Option<Rank>) {
        if let Some(p) = self.procs.get_mut(&tgid) {
            p.rank = rank;
        }
    }

    /// Current names (threads rename themselves after fork, e.g.
    /// DataLoader workers): `name(tgid, tid)` asks the caller's source.
    pub fn refresh_names(&mut self, mut name: impl FnMut(u32, u32) -> Option<String>) {
        for t in self.threads.values_mut().filter(|t| t.alive) {
            if let Some(n) = name(t.tgid, t.tid) {
                t.comm = n;
            }
        }
        for p in self.procs.values_mut().filter(|p| p.alive) {
            if let Some(t) = self.threads.get(&p.tgid) {
                p.comm.clone_from(&t.comm);
            }
        }
    }

    fn proc_mut(&mut self, tgid: u32) -> &mut Proc {
        self.procs.entry(tgid).or_insert_with(|| Proc { tgid, alive: true, ..Default::default() })
    }

    fn thread_mut(&mut self, tid: u32, tgid: u32) -> &mut Thread {
        if !self.threads.contains_key(&tid) {
            self.proc_mut(tgid).tids.push(tid);
        }
        let t = self.threads.entry(tid).or_insert_with(|| Thread {
            tid,
            tgid,
            alive: true,
            other_nr: -1,
            ..Default::default()
        });
        if t.tgid == 0 {
            t.tgid = tgid;
        }
        t
    }

    pub fn apply(&mut self, ev: &Event) {
        match ev {
            Event::Open { ts, tgid, fd, file_id, path, dup_of, .. } => {
                self.open(*ts, *tgid, *fd, *file_id, path, *dup_of);
            }
            Event::Connect { ts, tgid, fd, file_id, peer } => {
                self.open(*ts, *tgid, *fd, *file_id, peer, None);
                self.set_file_kind(*file_id, fd_kind::SOCKET);
            }
            Event::NewTask { ts, parent_tgid, child_tid, child_tgid, comm, .. } => {
                self.new_task(*ts, *parent_tgid, *child_tid, *child_tgid, comm);
            }
            Event::Exec { ts, tid, tgid, comm } => {
                let p = self.proc_mut(*tgid);
                p.comm = comm.clone();
                p.exec_ns = *ts;
                self.thread_mut(*tid, *tgid).comm = comm.clone();
            }
            Event::Exit { tid, tgid, comm, counters, other_nr, ts } => {
                self.exit(*ts, *tid, *tgid, comm, counters, *other_nr);
            }
            // The timeline's, not the model's.
            Event::Switch(_) => {}
            Event::Close { ts, tgid, fd, file_id, counters } => {
                match self.files.remove(file_id) {
                    Some(mut f) => {
                        f.total = *counters;
                        self.end_open(f, *ts);
                    }
                    // The kernel closed an open the model does not hold under
                    // this number: whatever the model holds there (opened
                    // before) no longer names it.
                    None => self.close_stale(*ts, *tgid, *fd),
                }
            }
        }
    }

    fn open(&mut self, ts: u64, tgid: u32, fd: i32, file_id: u64, path: &str, dup_of: Option<i32>) {
        self.proc_mut(tgid);
        // A dup is not another open; it names what the original names.
        if dup_of.is_none() {
            self.opened.insert(file_id);
        }
        let original = dup_of.and_then(|old| self.open_file(tgid, old));
        let (path, resolved, kind, inode) = match original {
            Some(f) => (f.path.clone(), f.resolved.clone(), f.kind, f.inode),
            None => (path.to_string(), None, fd_kind::UNKNOWN, None),
        };
        // The kernel replaced whatever this number named (its close came
        // first, or was never seen).
        if let Some(old) = self.open_fds.insert((tgid, fd), file_id) {
            if old != file_id {
                self.retire_open(old, ts);
            }
        }
        self.files.insert(
            file_id,
            File {
                file_id,
                tgid,
                fd,
                path,
                resolved,
                kind,
                dup: dup_of.is_some(),
                inode,
                open: true,
                open_ts: ts,
                ..Default::default()
            },
        );
    }

    fn new_task(&mut self, ts: u64, parent_tgid: u32, child_tid: u32, child_tgid: u32, comm: &str) {
        self.make_room(child_tid, child_tgid);
        self.proc_mut(parent_tgid);
        if child_tgid != parent_tgid {
            let p = self.proc_mut(child_tgid);
            p.ppid = Some(parent_tgid);
            p.born_ns = ts;
            if p.comm.is_empty() {
                p.comm = comm.to_string();
            }
        }
        let t = self.thread_mut(child_tid, child_tgid);
        if t.comm.is_empty() {
            t.comm = comm.to_string();
        }
    }

    /// A thread ended; its process too once no thread of it is alive.
    fn exit(&mut self, ts: u64, tid: u32, tgid: u32, comm: &str, counters: &ThreadCounters, other_nr: i32) {
        let t = self.thread_mut(tid, tgid);
        // The exit record carries no GPU library counters: the last
        // snapshot's stand.
        let gpu = t.total.gpu;
        t.total = throttle::with_throttled(counters, t.throttled_ns);
        t.total.gpu = gpu;
        t.alive = false;
        t.other_nr = other_nr;
        t.now = ThreadNow::default();
        // The comm at exit is the latest (workers rename themselves).
        if !comm.is_empty() {
            t.comm = comm.to_string();
        }
        self.last_ns = self.last_ns.max(ts);
        let tids = self.procs.get(&tgid).map(|p| p.tids.as_slice()).unwrap_or_default();
        if !tids.iter().any(|t| self.threads.get(t).is_some_and(|t| t.alive)) {
            let p = self.proc_mut(tgid);
            if p.alive {
                p.alive = false;
                self.ended.push_back(tgid);
            }
        }
    }

    pub fn apply_snapshot(&mut self, snap: &Snapshot) {
        self.last_ns = self.last_ns.max(snap.ts);
        for s in &snap.threads {
            let t = self.thread_mut(s.tid, s.tgid);
            if t.alive {
                // Its GPU library counters come apart (`gpu_calls`).
                let gpu = t.total.gpu;
                t.total = throttle::with_throttled(&s.counters, t.throttled_ns);
                t.total.gpu = gpu;
                t.now = s.now;
                t.other_nr = s.other_nr;
            }
            let tgid = t.tgid;
            self.proc_mut(tgid);
        }
        self.apply_files(&snap.files);
        if let Some(counts) = &snap.inode_bytes {
            self.mmap_known = snap.mmap_known;
            let inode_bytes = self.inode_bytes.get_or_insert_with(HashMap::new);
            for s in counts {
                // Cumulative in the kernel until the process is retired.
                let e = inode_bytes.entry((s.tgid, s.inode)).or_default();
                e.storage.see(s.storage_bytes);
                e.mapped.see(s.mmap_bytes);
                e.shared.see(s.mmap_shared_bytes);
            }
        }
        for f in &snap.fd_waits {
            self.fd_waits.entry((f.tgid, f.fd)).or_default().see(f.blocked_ns);
        }
        for w in &snap.wakes {
            let e = self.wakes.entry((w.wakee, w.waker)).or_default();
            e.count.see(w.count);
            e.blocked.see(w.blocked_ns);
            e.waker_tgid = w.waker_tgid;
            e.waker_comm.clone_from(&w.waker_comm);
        }
        for (tid, g) in &snap.gpu_calls {
            if let Some(t) = self.threads.get_mut(tid) {
                t.total.gpu = *g;
            }
        }
        self.arrivals.update(&snap.communicators);
        for (tid, a) in self.arrivals.threads() {
            if let Some(t) = self.threads.get_mut(&tid) {
                t.total.gpu.arrivals_compared = a.compared;
                t.total.gpu.arrivals_last = a.last;
                t.total.gpu.arrival_late_ns = a.late_ns;
            }
        }
        self.lost = snap.lost;
        self.events = snap.events;
        self.sched_gaps = self.sched_gaps.max(snap.sched_gaps);
        self.sched_repaired = self.sched_repaired.max(snap.sched_repaired);
    }

    /// Counters of descriptors read from the kernel (snapshot or retire).
    pub fn apply_files(&mut self, files: &[FileSnap]) {
        for f in files {
            if let Some(file) = self.files.get_mut(&f.file_id) {
                file.total = f.counters;
                file.kind = f.kind;
            }
        }
    }

    /// The open file `fd` of process `tgid` names.
    pub fn open_file(&self, tgid: u32, fd: i32) -> Option<&File> {
        self.open_fds.get(&(tgid, fd)).and_then(|id| self.files.get(id)).filter(|f| f.open)
    }

    fn forget_fd(&mut self, tgid: u32, fd: i32, file_id: u64) {
        if self.open_fds.get(&(tgid, fd)) == Some(&file_id) {
            self.open_fds.remove(&(tgid, fd));
        }
    }

    /// Folds open `file_id` as closed at `ts` with the counts last seen.
    fn retire_open(&mut self, file_id: u64, ts: u64) {
        if let Some(f) = self.files.remove(&file_id) {
            self.end_open(f, ts);
        }
    }

    /// Folds `f`, taken out of `files`, as closed at `ts`.
    fn end_open(&mut self, mut f: File, ts: u64) {
        self.forget_fd(f.tgid, f.fd, f.file_id);
        f.open = false;
        f.close_ts = Some(ts.max(f.open_ts));
        self.retire_file(f);
    }

    /// A close of an open the model never held, on `fd` of `tgid`: the
    /// model's open under that number, if it is older, is stale.
    fn close_stale(&mut self, ts: u64, tgid: u32, fd: i32) {
        let Some(&id) = self.open_fds.get(&(tgid, fd)) else { return };
        if self.files.get(&id).is_some_and(|f| f.open_ts <= ts) {
            self.retire_open(id, ts);
        }
    }

    /// What the agent learnt about a descriptor (regular file or not).
    pub fn set_file_kind(&mut self, file_id: u64, kind: u32) {
        if let Some(f) = self.files.get_mut(&file_id) {
            f.kind = kind;
        }
    }

    /// Which file a descriptor is (device and inode), so that what the
    /// page cache fills for it lands on its path.
    pub fn set_file_inode(&mut self, file_id: u64, inode: Inode) {
        if let Some(f) = self.files.get_mut(&file_id) {
            f.inode = Some(inode);
            let name = (f.path.clone(), f.resolved.clone());
            self.inode_names.entry(inode).or_insert_with(|| name.clone());
            self.inode_paths.insert((f.tgid, inode), name);
        }
    }

    /// Whether a socket peer is known to be inside the job or outside.
    pub fn peer_known(&self, peer: &str) -> bool {
        self.peers.contains_key(peer)
    }

    /// A socket peer is a process of the job (`inside`: IPC) or not
    /// (network input).
    pub fn note_peer(&mut self, peer: &str, inside: bool) {
        self.peers.insert(peer.to_string(), inside);
    }

    /// A path for a file known by its inode only (from a process's
    /// mappings).
    pub fn name_inode(&mut self, inode: Inode, path: String) {
        self.inode_names.entry(inode).or_insert((path, None));
    }

    /// Files the kernel counted pages of for a process that no process of
    /// the job opened while traced: (process, file), to name from /proc.
    pub fn unnamed_inodes(&self) -> Vec<(u32, Inode)> {
        let Some(bytes) = &self.inode_bytes else { return Vec::new() };
        bytes.keys().filter(|(_, inode)| !self.inode_names.contains_key(inode)).copied().collect()
    }

    /// The path a process's pages of a file count under: the one it opened
    /// the file by, else one another process of the job did (or /proc
    /// named).
    fn inode_path(&self, tgid: u32, inode: Inode) -> Option<&(String, Option<String>)> {
        self.inode_paths.get(&(tgid, inode)).or_else(|| self.inode_names.get(&inode))
    }

    /// Where a file given relative (or as a dup of an unknown descriptor:
    /// no path at all) points.
    pub fn set_file_resolved(&mut self, file_id: u64, resolved: &str) {
        if let Some(f) = self.files.get_mut(&file_id) {
            if f.path.is_empty() {
                f.path = resolved.to_string();
            } else {
                f.resolved = Some(resolved.to_string());
            }
        }
    }

    /// Processes whose every thread has exited, and exited threads, that
    /// the kernel maps may still hold; `mark_retired` once they are freed.
    pub fn dead(&self) -> (HashSet<u32>, HashSet<u32>) {
        let tids: HashSet<u32> =
            self.threads.values().filter(|t| !t.alive && !t.retired).map(|t| t.tid).collect();
        let tgids = self.procs.values().filter(|p| !p.alive && !p.retired).map(|p| p.tgid).collect();
        (tgids, tids)
    }

    /// What [`Model::dead`] returned has been retired from the kernel maps.
    pub fn mark_retired(&mut self, tgids: &HashSet<u32>, tids: &HashSet<u32>) {
        for t in tids {
            if let Some(t) = self.threads.get_mut(t) {
                t.retired = true;
            }
        }
        for p in tgids {
            if let Some(p) = self.procs.get_mut(p) {
                p.retired = true;
            }
        }
    }

    /// Forgets what has ended (exited threads and processes, closed files,
    /// their wakers) once an interval has counted it: a long-running
    /// daemon's memory then follows the live job, not its history. The
    /// whole-run summary no longer covers what was pruned.
    pub fn prune(&mut self) {
        self.threads.retain(|_, t| t.alive);
        let threads = &self.threads;
        for p in self.procs.values_mut() {
            p.tids.retain(|t| threads.contains_key(t));
            p.reused_tids = None;
        }
        self.procs.retain(|_, p| p.alive || !p.tids.is_empty());
        let procs = &self.procs;
        self.files.retain(|_, f| f.open && procs.contains_key(&f.tgid));
        let files = &self.files;
        self.open_fds.retain(|_, id| files.contains_key(id));
        // A peer is asked about again at its next connect.
        let sockets: HashSet<&str> =
            files.values().filter(|f| f.kind == fd_kind::SOCKET).map(|f| f.path.as_str()).collect();
        self.peers.retain(|peer, _| sockets.contains(peer.as_str()));
        let (paths, bytes) = (&self.inode_paths, &self.inode_bytes);
        self.inode_names.retain(|inode, _| {
            paths.keys().any(|(_, i)| i == inode)
                || bytes.iter().flat_map(|b| b.keys()).any(|(_, i)| i == inode)
        });
        self.wakes.retain(|(wakee, _), _| threads.contains_key(wakee));
        self.archived.clear();
        self.closing.clear();
        self.ended.clear();
        self.folded = Folded::default();
    }

    /// Folds a closed file into this window's `closing` (what it read
    /// since the last window) and into `archived` (the whole run).
    fn retire_file(&mut self, f: File) {
        let opened_now = self.opened.remove(&f.file_id);
        if f.kind == fd_kind::OTHER {
            return;
        }
        let close = f.close_ts.unwrap_or(f.open_ts);
        let key = (f.tgid, f.path.clone());
        let fresh = || FileWindow {
            path: f.path.clone(),
            resolved: f.resolved.clone(),
            socket: f.kind == fd_kind::SOCKET,
            ..Default::default()
        };
        let c = self.closing.entry(key.clone()).or_insert_with(fresh);
        c.opens += u64::from(opened_now);
        c.add_counters(&f.total.saturating_sub(&f.mark));
        let a = self.archived.entry(key).or_insert_with(fresh);
        a.add_counters(&f.total);
        // Open time is per open: a copy's is the original's.
        if !f.dup {
            c.open_ns += close.saturating_sub(f.open_ts.max(self.mark_ns));
            a.opens += 1;
            a.open_ns += close.saturating_sub(f.open_ts);
        }
    }

    /// Descriptors of processes that ended (closed by exit, not `close`):
    /// their last counts are in; fold them like closed files.
    pub fn end_files_of(&mut self, tgids: &HashSet<u32>, ts: u64) {
        let ids: Vec<u64> =
            self.files.values().filter(|f| tgids.contains(&f.tgid)).map(|f| f.file_id).collect();
        for id in ids {
            self.retire_open(id, ts);
        }
    }
}

#[cfg(test)]
mod tests;
