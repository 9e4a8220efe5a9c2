//! The job as seen so far: processes, threads, files and wakeups, built from
//! decoded events and map snapshots, and cut into [`Window`]s.
//!
//! Counters are kept as the kernel reports them: `total` is the latest
//! cumulative value, `mark` the value at the end of the previous interval
//! window. An interval is `total - mark`; the whole run is `total`. Nothing
//! here subtracts from the kernel's counters, so a snapshot can never be
//! counted twice. Pure: no kernel, no /proc; unit-tested on synthetic streams.
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use stall_common::{counter::LOST_CAUSES, fd_kind, WAKER_ANY_THREAD};

use super::window::{add_known, fold_small_ended, FileWindow, ProcWindow, ThreadWindow, Waker, Window};
use crate::decode::{Event, FileCounters, FileSnap, Inode, Snapshot, ThreadCounters, ThreadNow};

#[derive(Debug, Clone, Default)]
pub struct Proc {
    pub tgid: u32,
    pub ppid: Option<u32>,
    pub comm: String,
    pub cmdline: Option<String>,
    pub alive: bool,
    /// Its threads (an index: exits and folding touch one process, not
    /// every thread of the job).
    pub tids: Vec<u32>,
    /// When it was forked and when it last exec'd, if seen (0: not seen;
    /// it ran before tracing started).
    pub born_ns: u64,
    pub exec_ns: u64,
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
    pub total: ThreadCounters,
    mark: ThreadCounters,
    pub now: ThreadNow,
    pub other_nr: i32,
    pub alive: bool,
    retired: bool,
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
}

#[derive(Debug, Default)]
pub struct Model {
    pub start_ns: u64,
    mark_ns: u64,
    pub last_ns: u64,
    pub procs: BTreeMap<u32, Proc>,
    pub threads: BTreeMap<u32, Thread>,
    pub files: HashMap<u64, File>,
    wakes: HashMap<(u32, u32), Wake>,
    /// Storage and mapped bytes per (process, file); None: not seen on
    /// this kernel.
    inode_bytes: Option<HashMap<(u32, Inode), InodeTally>>,
    /// Whether mapped bytes are followed on this kernel.
    mmap_known: bool,
    /// The path a process opened each file by (kept after it closes: the
    /// page cache fills a mapping long after its descriptor is gone).
    inode_paths: HashMap<(u32, Inode), (String, Option<String>)>,
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
}

/// Ended processes kept one by one; older ones are folded into one entry.
pub const MAX_ENDED: usize = 4096;

#[derive(Debug, Default)]
struct Folded {
    procs: u64,
    counters: ThreadCounters,
    files: HashMap<String, FileWindow>,
    storage_bytes: u64,
    mmap_bytes: u64,
}

/// What the kernel counts per (process, file) outside read calls.
#[derive(Debug, Clone, Copy, Default)]
struct InodeTally {
    storage: Tally,
    mapped: Tally,
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
                self.proc_mut(*tgid);
                // A dup is not another open; it names what the original names.
                if dup_of.is_none() {
                    self.opened.insert(*file_id);
                }
                let original = dup_of.and_then(|old| self.open_file(*tgid, old));
                let (path, resolved, kind, inode) = match original {
                    Some(f) => (f.path.clone(), f.resolved.clone(), f.kind, f.inode),
                    None => (path.clone(), None, fd_kind::UNKNOWN, None),
                };
                self.files.insert(
                    *file_id,
                    File {
                        file_id: *file_id,
                        tgid: *tgid,
                        fd: *fd,
                        path,
                        resolved,
                        kind,
                        dup: dup_of.is_some(),
                        inode,
                        open: true,
                        open_ts: *ts,
                        ..Default::default()
                    },
                );
            }
            Event::NewTask { ts, parent_tgid, child_tid, child_tgid, comm, .. } => {
                self.make_room(*child_tid, *child_tgid);
                self.proc_mut(*parent_tgid);
                if child_tgid != parent_tgid {
                    let p = self.proc_mut(*child_tgid);
                    p.ppid = Some(*parent_tgid);
                    p.born_ns = *ts;
                    if p.comm.is_empty() {
                        p.comm = comm.clone();
                    }
                }
                let t = self.thread_mut(*child_tid, *child_tgid);
                if t.comm.is_empty() {
                    t.comm = comm.clone();
                }
            }
            Event::Exec { ts, tid, tgid, comm } => {
                let p = self.proc_mut(*tgid);
                p.comm = comm.clone();
                p.exec_ns = *ts;
                self.thread_mut(*tid, *tgid).comm = comm.clone();
            }
            Event::Exit { tid, tgid, comm, counters, other_nr, ts } => {
                let t = self.thread_mut(*tid, *tgid);
                t.total = *counters;
                t.alive = false;
                t.other_nr = *other_nr;
                t.now = ThreadNow::default();
                // The comm at exit is the latest (workers rename themselves).
                if !comm.is_empty() {
                    t.comm = comm.clone();
                }
                self.last_ns = self.last_ns.max(*ts);
                let tg = *tgid;
                let tids = self.procs.get(&tg).map(|p| p.tids.as_slice()).unwrap_or_default();
                if !tids.iter().any(|t| self.threads.get(t).is_some_and(|t| t.alive)) {
                    let p = self.proc_mut(tg);
                    if p.alive {
                        p.alive = false;
                        self.ended.push_back(tg);
                    }
                }
            }
            // The timeline's, not the model's.
            Event::Switch(_) => {}
            Event::Close { ts, file_id, counters, .. } => {
                if let Some(mut f) = self.files.remove(file_id) {
                    f.total = *counters;
                    f.open = false;
                    f.close_ts = Some(*ts);
                    self.retire_file(f);
                }
            }
        }
    }

    pub fn apply_snapshot(&mut self, snap: &Snapshot) {
        self.last_ns = self.last_ns.max(snap.ts);
        for s in &snap.threads {
            let t = self.thread_mut(s.tid, s.tgid);
            if t.alive {
                t.total = s.counters;
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
            }
        }
        for w in &snap.wakes {
            let e = self.wakes.entry((w.wakee, w.waker)).or_default();
            e.count.see(w.count);
            e.waker_tgid = w.waker_tgid;
            e.waker_comm.clone_from(&w.waker_comm);
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

    /// What the agent learnt about a descriptor (regular file or not).
    /// The open file `fd` of process `tgid` names.
    pub fn open_file(&self, tgid: u32, fd: i32) -> Option<&File> {
        self.files.values().find(|f| f.tgid == tgid && f.fd == fd && f.open)
    }

    pub fn set_file_kind(&mut self, file_id: u64, kind: u32) {
        if let Some(f) = self.files.get_mut(&file_id) {
            f.kind = kind;
        }
    }

    /// Where a file given relative (or as a dup of an unknown descriptor:
    /// no path at all) points.
    /// Which file a descriptor is (device and inode), so that what the
    /// page cache fills for it lands on its path.
    pub fn set_file_inode(&mut self, file_id: u64, inode: Inode) {
        if let Some(f) = self.files.get_mut(&file_id) {
            f.inode = Some(inode);
            self.inode_paths.insert((f.tgid, inode), (f.path.clone(), f.resolved.clone()));
        }
    }

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
        let fresh =
            || FileWindow { path: f.path.clone(), resolved: f.resolved.clone(), ..Default::default() };
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
            let mut f = self.files.remove(&id).expect("listed above");
            f.open = false;
            f.close_ts = Some(ts.max(f.open_ts));
            self.retire_file(f);
        }
    }

    /// The window since the previous call, and starts the next one.
    pub fn interval(&mut self, end_ns: u64) -> Window {
        let w = self.window(self.mark_ns, end_ns, true);
        self.mark_ns = end_ns;
        for t in self
            .threads
            .values_mut()
            .chain(self.procs.values_mut().filter_map(|p| p.reused_tids.as_deref_mut()))
        {
            t.mark = t.total;
        }
        for f in self.files.values_mut() {
            f.mark = f.total;
        }
        for w in self.wakes.values_mut() {
            w.count.set_mark();
        }
        for s in self.inode_bytes.iter_mut().flat_map(|m| m.values_mut()) {
            s.storage.set_mark();
            s.mapped.set_mark();
        }
        self.opened.clear();
        self.lost_mark = self.lost;
        self.events_mark = self.events;
        self.closing.clear();
        self.fold_ended();
        w
    }

    /// A new task takes `tid` (a new process `tgid == tid`): whatever ended
    /// under that id before (pids wrap, and a long run sees them come back)
    /// is set aside, so the new one starts afresh instead of adding to a dead
    /// entry: an ended process is folded into the summed ones, an ended
    /// thread of a live process into that process's summed reused threads.
    /// Only once their kernel entries are freed (always, but for a pid
    /// reused within the same interval).
    fn make_room(&mut self, tid: u32, tgid: u32) {
        let ended = |p: &Proc| !p.alive && p.retired;
        if tid == tgid && self.procs.get(&tgid).is_some_and(ended) {
            self.ended.retain(|t| *t != tgid);
            self.fold([tgid]);
        }
        let Some(old) = self.threads.get(&tid).filter(|t| !t.alive && t.retired) else { return };
        let owner = old.tgid;
        if self.procs.get(&owner).is_some_and(ended) {
            self.ended.retain(|t| *t != owner);
            self.fold([owner]);
            return;
        }
        let old = self.threads.remove(&tid).expect("found above");
        self.wakes.retain(|(wakee, waker), _| *wakee != tid && *waker != tid);
        let p = self.proc_mut(owner);
        p.tids.retain(|t| *t != tid);
        let sum = p.reused_tids.get_or_insert_with(|| {
            Box::new(Thread {
                tgid: owner,
                comm: "(ended threads whose ids were reused, summed)".into(),
                other_nr: -1,
                ..Default::default()
            })
        });
        sum.total.add(&old.total);
        sum.mark.add(&old.mark);
    }

    /// Sums the oldest ended processes beyond [`MAX_ENDED`] into one entry,
    /// so a job that forks without end keeps the agent's memory bounded.
    fn fold_ended(&mut self) {
        if self.ended.len() <= MAX_ENDED {
            return;
        }
        let mut oldest = Vec::new();
        while self.ended.len() > MAX_ENDED {
            oldest.push(self.ended.pop_front().expect("non-empty"));
        }
        self.fold(oldest);
    }

    /// Sums ended processes into the one entry of [`Folded`].
    fn fold(&mut self, tgids: impl IntoIterator<Item = u32>) {
        let mut gone_tgids = HashSet::new();
        let mut gone_tids = HashSet::new();
        for tgid in tgids {
            if self.procs.get(&tgid).is_none_or(|p| p.alive) {
                continue; // the pid came back as a new process
            }
            let p = self.procs.remove(&tgid).expect("checked above");
            if let Some(t) = &p.reused_tids {
                self.folded.counters.add(&t.total);
            }
            for tid in p.tids {
                if let Some(t) = self.threads.remove(&tid) {
                    self.folded.counters.add(&t.total);
                    gone_tids.insert(tid);
                }
            }
            gone_tgids.insert(tgid);
            self.folded.procs += 1;
        }
        // One pass over the wakers, storage and folded files for the batch.
        self.wakes.retain(|(wakee, waker), _| !gone_tids.contains(wakee) && !gone_tids.contains(waker));
        if let Some(inode_bytes) = self.inode_bytes.as_mut() {
            let folded = &mut self.folded;
            let paths = &self.inode_paths;
            let mmap_known = self.mmap_known;
            inode_bytes.retain(|key, s| {
                if !gone_tgids.contains(&key.0) {
                    return true;
                }
                folded.storage_bytes += s.storage.total;
                folded.mmap_bytes += s.mapped.total;
                if let Some((path, _)) = paths.get(key) {
                    let f = folded
                        .files
                        .entry(path.clone())
                        .or_insert_with(|| FileWindow { path: path.clone(), ..Default::default() });
                    f.storage_bytes = Some(f.storage_bytes.unwrap_or(0) + s.storage.total);
                    if mmap_known {
                        f.mmap_bytes = Some(f.mmap_bytes.unwrap_or(0) + s.mapped.total);
                    }
                }
                false
            });
        }
        self.inode_paths.retain(|(tgid, _), _| !gone_tgids.contains(tgid));
        let keys: Vec<(u32, String)> =
            self.archived.keys().filter(|k| gone_tgids.contains(&k.0)).cloned().collect();
        for k in keys {
            let a = self.archived.remove(&k).expect("listed above");
            self.folded
                .files
                .entry(k.1)
                .or_insert_with(|| FileWindow { path: a.path.clone(), ..Default::default() })
                .add(&a);
        }
    }

    /// The whole run so far.
    pub fn summary(&self, end_ns: u64) -> Window {
        self.window(self.start_ns, end_ns, false)
    }

    fn window(&self, start_ns: u64, end_ns: u64, since_mark: bool) -> Window {
        let mut procs: Vec<ProcWindow> = self
            .procs
            .values()
            .map(|p| ProcWindow {
                tgid: p.tgid,
                ppid: p.ppid,
                comm: p.comm.clone(),
                cmdline: p.cmdline.clone(),
                alive: p.alive,
                born_ns: p.born_ns,
                exec_ns: p.exec_ns,
                ..Default::default()
            })
            .collect();
        let index: HashMap<u32, usize> = procs.iter().enumerate().map(|(i, p)| (p.tgid, i)).collect();

        let mut woken: HashMap<u32, Vec<Waker>> = HashMap::new();
        for (&(wakee, waker), w) in &self.wakes {
            let n = w.count.since(since_mark);
            if n > 0 {
                // A traced waker's current name (the kernel's is from its
                // first wakeup, maybe before it renamed itself); a process's
                // for wakes counted per process.
                let comm = match waker & WAKER_ANY_THREAD {
                    0 => self.threads.get(&waker).map(|t| &t.comm),
                    _ => self.procs.get(&w.waker_tgid).map(|p| &p.comm),
                };
                let comm = comm.filter(|c| !c.is_empty()).unwrap_or(&w.waker_comm).clone();
                woken.entry(wakee).or_default().push(Waker {
                    tid: waker,
                    tgid: w.waker_tgid,
                    comm,
                    count: n,
                });
            }
        }
        let reused = self.procs.values().filter_map(|p| p.reused_tids.as_deref());
        for t in self.threads.values().chain(reused) {
            let Some(&i) = index.get(&t.tgid) else { continue };
            let delta = if since_mark { t.total.saturating_sub(&t.mark) } else { t.total };
            // A thread that exited before this window adds nothing to it
            // (nor do reused ids' threads that counted nothing).
            if (since_mark || t.tid == 0) && !t.alive && delta == ThreadCounters::default() {
                continue;
            }
            let mut by = woken.remove(&t.tid).unwrap_or_default();
            Waker::rank(&mut by);
            let comm = if t.comm.is_empty() { procs[i].comm.clone() } else { t.comm.clone() };
            procs[i].other_read_bytes += delta.other_read_bytes;
            procs[i].threads.push(ThreadWindow {
                tid: t.tid,
                comm,
                delta,
                now: t.now,
                other_nr: t.other_nr,
                alive: t.alive,
                woken_by: by,
            });
        }
        let mut by_path: HashMap<(usize, &str), FileWindow> = HashMap::new();
        let folded = if since_mark { &self.closing } else { &self.archived };
        for ((tgid, path), a) in folded {
            if let Some(&i) = index.get(tgid) {
                by_path.insert((i, path.as_str()), a.clone());
            }
        }
        for f in self.files.values() {
            let Some(&i) = index.get(&f.tgid) else { continue };
            if f.kind == fd_kind::OTHER {
                continue;
            }
            let d = if since_mark { f.total.saturating_sub(&f.mark) } else { f.total };
            let opened_now = (!since_mark && !f.dup) || self.opened.contains(&f.file_id);
            if since_mark && d.read_calls == 0 && d.write_calls == 0 && !opened_now {
                continue;
            }
            let e = by_path.entry((i, f.path.as_str())).or_insert_with(|| FileWindow {
                path: f.path.clone(),
                resolved: f.resolved.clone(),
                ..Default::default()
            });
            e.opens += u64::from(opened_now);
            if !f.dup {
                let from = f.open_ts.max(start_ns);
                let to = f.close_ts.unwrap_or(end_ns).min(end_ns);
                e.open_ns += to.saturating_sub(from);
            }
            e.add_counters(&d);
        }
        if let Some(inode_bytes) = &self.inode_bytes {
            let mmap_zero = self.mmap_known.then_some(0);
            for p in &mut procs {
                (p.storage_bytes, p.mmap_bytes) = (Some(0), mmap_zero);
            }
            for f in by_path.values_mut() {
                (f.storage_bytes, f.mmap_bytes) = (Some(0), mmap_zero);
            }
            for ((tgid, inode), s) in inode_bytes {
                let Some(&i) = index.get(tgid) else { continue };
                let (storage, mapped) = (s.storage.since(since_mark), s.mapped.since(since_mark));
                if storage == 0 && mapped == 0 {
                    continue;
                }
                let p = &mut procs[i];
                p.storage_bytes = add_known(p.storage_bytes, Some(storage));
                p.mmap_bytes = add_known(p.mmap_bytes, mmap_zero.map(|_| mapped));
                // Files it opened under a path; others (mapped before stall
                // came) count for the process only.
                let Some((path, resolved)) = self.inode_paths.get(&(*tgid, *inode)) else { continue };
                let e = by_path.entry((i, path.as_str())).or_insert_with(|| FileWindow {
                    path: path.clone(),
                    resolved: resolved.clone(),
                    storage_bytes: Some(0),
                    mmap_bytes: mmap_zero,
                    ..Default::default()
                });
                e.storage_bytes = add_known(e.storage_bytes, Some(storage));
                e.mmap_bytes = add_known(e.mmap_bytes, mmap_zero.map(|_| mapped));
            }
        }
        for ((i, _), fw) in by_path {
            procs[i].files.push(fw);
        }
        if !since_mark && self.folded.procs > 0 {
            let mut files: Vec<FileWindow> = self.folded.files.values().cloned().collect();
            files.sort_by(|a, b| b.read_bytes.cmp(&a.read_bytes).then(a.path.cmp(&b.path)));
            procs.push(ProcWindow {
                tgid: 0,
                comm: format!("({} ended processes, summed)", self.folded.procs),
                other_read_bytes: self.folded.counters.other_read_bytes,
                threads: vec![ThreadWindow {
                    tid: 0,
                    comm: "(summed)".into(),
                    delta: self.folded.counters,
                    other_nr: -1,
                    ..Default::default()
                }],
                files,
                storage_bytes: self.inode_bytes.as_ref().map(|_| self.folded.storage_bytes),
                mmap_bytes: (self.inode_bytes.is_some() && self.mmap_known).then_some(self.folded.mmap_bytes),
                ..Default::default()
            });
        }
        for p in &mut procs {
            p.files.sort_by(|a, b| b.read_bytes.cmp(&a.read_bytes).then(a.path.cmp(&b.path)));
            p.threads.sort_by_key(|t| t.tid);
        }
        // Processes with nothing in this window (gone before it) are left out.
        procs.retain(|p| !p.threads.is_empty() || !p.files.is_empty() || p.alive);
        if since_mark {
            fold_small_ended(&mut procs);
        }
        let (lost, events) = if since_mark {
            let mut l = [0; LOST_CAUSES];
            for (i, v) in l.iter_mut().enumerate() {
                *v = self.lost[i].saturating_sub(self.lost_mark[i]);
            }
            (l, self.events.saturating_sub(self.events_mark))
        } else {
            (self.lost, self.events)
        };
        Window {
            start_ns,
            end_ns,
            procs,
            lost,
            events,
            sched_gaps: self.sched_gaps,
            sched_repaired: self.sched_repaired,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{InodeSnap, ThreadSnap, WakeSnap};

    fn open(tgid: u32, fd: i32, id: u64, path: &str) -> Event {
        Event::Open { ts: 0, tid: tgid, tgid, fd, file_id: id, path: path.into(), dfd: -100, dup_of: None }
    }

    fn dup(tgid: u32, fd: i32, id: u64, of: i32) -> Event {
        Event::Open {
            ts: 0,
            tid: tgid,
            tgid,
            fd,
            file_id: id,
            path: String::new(),
            dfd: of,
            dup_of: Some(of),
        }
    }

    fn file_snap(tgid: u32, fd: i32, id: u64, bytes: u64, calls: u64) -> FileSnap {
        FileSnap {
            tgid,
            fd,
            file_id: id,
            kind: fd_kind::REGULAR,
            counters: FileCounters {
                read_bytes: bytes,
                read_calls: calls,
                read_ns: calls * 10,
                timed_calls: calls,
                ..Default::default()
            },
        }
    }

    #[test]
    fn reused_fd_keeps_files_apart() {
        let mut m = Model::new(0);
        m.apply(&open(10, 3, 1, "/a"));
        m.apply(&Event::Close {
            ts: 1,
            tgid: 10,
            fd: 3,
            file_id: 1,
            counters: FileCounters { read_bytes: 100, read_calls: 2, ..Default::default() },
        });
        m.apply(&open(10, 3, 2, "/b"));
        m.apply_snapshot(&Snapshot { ts: 5, files: vec![file_snap(10, 3, 2, 7, 1)], ..Default::default() });
        let w = m.summary(5);
        let p = w.proc(10).unwrap();
        let get = |path: &str| p.files.iter().find(|f| f.path == path).unwrap().read_bytes;
        assert_eq!((get("/a"), get("/b")), (100, 7));
    }

    /// Storage and mapped bytes land on the path the process opened the file
    /// by, in the window they were counted in, also after the descriptor
    /// closed (a mapping outlives it); a file stall never saw opened counts
    /// for the process only; a kernel without the hooks says nothing (None).
    #[test]
    fn inode_bytes_follow_the_inode_to_its_path() {
        let mut m = Model::new(0);
        m.apply(&open(10, 3, 1, "/data/shard.arrow"));
        let shard = Inode { dev: 8 << 20 | 1, ino: 42 };
        m.set_file_inode(1, shard);
        m.apply(&Event::Close { ts: 10, tgid: 10, fd: 3, file_id: 1, counters: FileCounters::default() });
        let lib = Inode { dev: 8 << 20 | 1, ino: 7 };
        let counts = |shard_bytes, lib_bytes, mmap_known| Snapshot {
            ts: 1_000,
            inode_bytes: Some(vec![
                InodeSnap { tgid: 10, inode: shard, storage_bytes: shard_bytes, mmap_bytes: 2 * shard_bytes },
                InodeSnap { tgid: 10, inode: lib, storage_bytes: lib_bytes, mmap_bytes: 0 },
            ]),
            mmap_known,
            ..Default::default()
        };
        m.apply_snapshot(&counts(4096, 8192, true));
        let w1 = m.interval(1_000);
        m.apply_snapshot(&counts(3 * 4096, 8192, true));
        let w2 = m.interval(2_000);
        let bytes = |w: &Window| {
            let p = w.proc(10).unwrap();
            let f = p.files.iter().find(|f| f.path == "/data/shard.arrow").unwrap();
            (p.storage_bytes, f.storage_bytes, p.mmap_bytes, f.mmap_bytes)
        };
        assert_eq!(bytes(&w1), (Some(4096 + 8192), Some(4096), Some(8192), Some(8192)));
        assert_eq!(bytes(&w2), (Some(2 * 4096), Some(2 * 4096), Some(4 * 4096), Some(4 * 4096)));
        assert_eq!(
            bytes(&m.summary(2_000)),
            (Some(3 * 4096 + 8192), Some(3 * 4096), Some(6 * 4096), Some(6 * 4096))
        );

        // Fills seen, faults not followed: mapped bytes unknown.
        let mut no_faults = Model::new(0);
        no_faults.apply(&open(10, 3, 1, "/data/shard.arrow"));
        no_faults.set_file_inode(1, shard);
        no_faults.apply_snapshot(&counts(4096, 0, false));
        let w = no_faults.summary(1_000);
        let f = &w.proc(10).unwrap().files[0];
        assert_eq!((f.storage_bytes, f.mmap_bytes, w.proc(10).unwrap().mmap_bytes), (Some(4096), None, None));

        let mut none = Model::new(0);
        none.apply(&open(10, 3, 1, "/data/shard.arrow"));
        none.apply_snapshot(&Snapshot { ts: 1, ..Default::default() });
        let w = none.summary(1);
        let (p, f) = (w.proc(10).unwrap(), &w.proc(10).unwrap().files[0]);
        assert_eq!((p.storage_bytes, f.storage_bytes, p.mmap_bytes, f.mmap_bytes), (None, None, None, None));
    }

    /// A dup names the original's file: its reads add to that path, and it
    /// is not another open (nor more open time), even once the original is
    /// closed.
    #[test]
    fn a_dup_reads_as_its_original() {
        let mut m = Model::new(0);
        m.apply(&open(10, 3, 1, "data/a.bin"));
        m.set_file_resolved(1, "/work/data/a.bin");
        m.apply(&dup(10, 60, 2, 3));
        let f = &m.files[&2];
        assert_eq!(
            (f.path.as_str(), f.resolved.as_deref(), f.dup),
            ("data/a.bin", Some("/work/data/a.bin"), true)
        );
        m.apply_snapshot(&Snapshot {
            ts: 1_000,
            files: vec![file_snap(10, 3, 1, 100, 1), file_snap(10, 60, 2, 50, 2)],
            ..Default::default()
        });
        let w = m.interval(1_000);
        let files = &w.proc(10).unwrap().files;
        assert_eq!(files.len(), 1, "{files:?}");
        assert_eq!((files[0].read_bytes, files[0].read_calls, files[0].opens), (150, 3, 1));
        assert_eq!(files[0].open_ns, 1_000);
        // A dup of a descriptor stall does not know gets a path later.
        m.apply(&dup(10, 61, 3, 9));
        m.set_file_resolved(3, "/work/other.bin");
        assert_eq!(m.files[&3].path, "/work/other.bin");
    }

    #[test]
    fn intervals_are_deltas_and_sum_to_total() {
        let mut m = Model::new(0);
        m.apply(&open(10, 3, 1, "/a"));
        let thread = |on: u64| ThreadSnap {
            tid: 10,
            tgid: 10,
            counters: ThreadCounters { on_cpu_ns: on, ..Default::default() },
            ..Default::default()
        };
        m.apply_snapshot(&Snapshot {
            ts: 1_000,
            threads: vec![thread(400)],
            files: vec![file_snap(10, 3, 1, 4096, 1)],
            ..Default::default()
        });
        let w1 = m.interval(1_000);
        m.apply_snapshot(&Snapshot {
            ts: 2_000,
            threads: vec![thread(1_000)],
            files: vec![file_snap(10, 3, 1, 5000, 3)],
            ..Default::default()
        });
        let w2 = m.interval(2_000);
        let p1 = w1.proc(10).unwrap();
        let p2 = w2.proc(10).unwrap();
        assert_eq!(p1.threads[0].delta.on_cpu_ns, 400);
        assert_eq!(p2.threads[0].delta.on_cpu_ns, 600);
        assert_eq!(p1.files[0].read_bytes + p2.files[0].read_bytes, 5000);
        assert_eq!((p1.files[0].opens, p2.files[0].opens), (1, 0));
        assert_eq!(m.summary(2_000).proc(10).unwrap().files[0].read_bytes, 5000);
    }

    #[test]
    fn non_files_never_count_as_file_reads() {
        let mut m = Model::new(0);
        m.apply(&open(10, 5, 9, "/tmp/fifo"));
        m.set_file_kind(9, fd_kind::OTHER);
        m.apply_snapshot(&Snapshot {
            ts: 10,
            files: vec![FileSnap { kind: fd_kind::OTHER, ..file_snap(10, 5, 9, 50, 5) }],
            ..Default::default()
        });
        assert!(m.summary(10).proc(10).unwrap().files.is_empty());
    }

    #[test]
    fn forks_exec_exit_build_the_tree() {
        let mut m = Model::new(0);
        m.note_process(10, Some(1), "python", None);
        m.apply(&Event::NewTask {
            ts: 1,
            parent_tid: 10,
            parent_tgid: 10,
            child_tid: 11,
            child_tgid: 10,
            comm: "python".into(),
        });
        m.apply(&Event::NewTask {
            ts: 2,
            parent_tid: 10,
            parent_tgid: 10,
            child_tid: 20,
            child_tgid: 20,
            comm: "python".into(),
        });
        m.apply(&Event::Exec { ts: 3, tid: 20, tgid: 20, comm: "worker".into() });
        assert_eq!(m.procs[&20].ppid, Some(10));
        assert_eq!(m.procs[&20].comm, "worker");
        assert_eq!(m.threads[&11].tgid, 10);
        let counters = ThreadCounters { file_read_bytes: 9, ..Default::default() };
        m.apply(&Event::Exit { ts: 4, tid: 20, tgid: 20, comm: "worker".into(), counters, other_nr: -1 });
        assert!(!m.procs[&20].alive);
        assert!(m.procs[&10].alive);
        let (tgids, tids) = m.dead();
        assert!(tgids.contains(&20) && tids.contains(&20) && !tids.contains(&11));
        m.mark_retired(&tgids, &tids);
        let (tgids, tids) = m.dead();
        assert!(tgids.is_empty() && tids.is_empty(), "retired once, not every interval");
        // An exited thread's last counters stay in the totals.
        assert_eq!(m.summary(5).thread(20).unwrap().1.delta.file_read_bytes, 9);
    }

    /// Ids come back (pids wrap): a new process or thread under the id of
    /// one that ended starts afresh, and what the old one counted stays in
    /// the run's totals.
    #[test]
    fn a_reused_id_is_a_new_task() {
        let mut m = Model::new(0);
        let new_task = |ts, parent: u32, tid: u32, tgid: u32| Event::NewTask {
            ts,
            parent_tid: parent,
            parent_tgid: parent,
            child_tid: tid,
            child_tgid: tgid,
            comm: "python".into(),
        };
        let exit = |ts, tid, tgid, file_read_bytes| Event::Exit {
            ts,
            tid,
            tgid,
            comm: "worker".into(),
            counters: ThreadCounters { file_read_bytes, ..Default::default() },
            other_nr: -1,
        };
        // A worker process 20 and a thread 11 of the trainer 10 end.
        m.apply(&new_task(0, 1, 10, 10));
        m.apply(&new_task(1, 10, 20, 20));
        m.apply(&new_task(1, 10, 11, 10));
        m.apply(&exit(2, 20, 20, 100));
        m.apply(&exit(2, 11, 10, 7));
        let (tgids, tids) = m.dead();
        m.mark_retired(&tgids, &tids);
        m.interval(3);
        // Their ids come back: a new worker 20, a new trainer thread 11.
        m.apply(&new_task(4, 10, 20, 20));
        m.apply(&new_task(4, 10, 11, 10));
        assert!(m.procs[&20].alive && m.threads[&20].alive && m.threads[&11].alive);
        assert_eq!((m.threads[&20].total, m.threads[&11].total), Default::default());
        m.apply(&exit(5, 20, 20, 30));
        let w = m.summary(6);
        let proc_bytes =
            |tgid| w.procs.iter().filter(|p| p.tgid == tgid).map(|p| p.sum().file_read_bytes).sum::<u64>();
        assert_eq!(proc_bytes(20), 30, "the new worker alone");
        assert_eq!(proc_bytes(0), 100, "the old one, folded");
        let trainer = w.proc(10).unwrap();
        let reused = trainer.threads.iter().find(|t| t.tid == 0).expect("the old thread, summed");
        assert_eq!(reused.delta.file_read_bytes, 7);
        // An interval after counts only what happened in it.
        let w = m.interval(6);
        assert_eq!(w.proc(20).unwrap().sum().file_read_bytes, 30);
        assert!(w.proc(10).unwrap().threads.iter().all(|t| t.tid != 0), "nothing new of the old thread");
    }

    #[test]
    fn merged_windows_equal_the_longer_window() {
        let mut m = Model::new(0);
        m.apply(&open(10, 3, 1, "/a"));
        let mut windows = Vec::new();
        for i in 1..=3u64 {
            m.apply_snapshot(&Snapshot {
                ts: i * 1000,
                threads: vec![ThreadSnap {
                    tid: 10,
                    tgid: 10,
                    counters: ThreadCounters { on_cpu_ns: i * 100, ..Default::default() },
                    ..Default::default()
                }],
                files: vec![file_snap(10, 3, 1, i * 4096, i)],
                ..Default::default()
            });
            windows.push(m.interval(i * 1000));
        }
        let merged = Window::merge(&windows);
        let total = m.summary(3000);
        assert_eq!(merged.secs(), total.secs());
        let (mp, tp) = (merged.proc(10).unwrap(), total.proc(10).unwrap());
        assert_eq!(mp.threads[0].delta, tp.threads[0].delta);
        assert_eq!(mp.files, tp.files);
    }

    #[test]
    fn closed_files_fold_per_path_and_keep_their_counts() {
        let mut m = Model::new(0);
        for k in 0..1000u64 {
            m.apply(&Event::Open {
                ts: k,
                tid: 10,
                tgid: 10,
                fd: 3,
                file_id: k,
                path: "/shard".into(),
                dfd: -100,
                dup_of: None,
            });
            let counters = FileCounters {
                read_bytes: 10,
                read_calls: 2,
                read_ns: 5,
                timed_calls: 1,
                ..Default::default()
            };
            m.apply(&Event::Close { ts: k + 1, tgid: 10, fd: 3, file_id: k, counters });
            if k % 100 == 99 {
                let _ = m.interval(k + 1);
            }
        }
        assert!(m.files.is_empty(), "closed files are folded away");
        let w = m.summary(1000);
        let f = &w.proc(10).unwrap().files[0];
        assert_eq!((f.opens, f.read_bytes, f.read_calls, f.open_ns), (1000, 10_000, 2000, 1000));
    }

    #[test]
    fn ended_processes_beyond_the_cap_are_summed() {
        let mut m = Model::new(0);
        let n = MAX_ENDED as u32 + 100;
        for pid in 100..100 + n {
            m.apply(&Event::NewTask {
                ts: 1,
                parent_tid: 10,
                parent_tgid: 10,
                child_tid: pid,
                child_tgid: pid,
                comm: "w".into(),
            });
            m.apply(&open(pid, 3, u64::from(pid), "/shard"));
            let fc = FileCounters {
                read_bytes: 7,
                read_calls: 1,
                read_ns: 1,
                timed_calls: 1,
                ..Default::default()
            };
            m.apply(&Event::Close { ts: 2, tgid: pid, fd: 3, file_id: u64::from(pid), counters: fc });
            let counters = ThreadCounters { file_read_bytes: 7, on_cpu_ns: 3, ..Default::default() };
            m.apply(&Event::Exit { ts: 3, tid: pid, tgid: pid, comm: "w".into(), counters, other_nr: -1 });
        }
        let _ = m.interval(10);
        assert!(m.procs.len() <= MAX_ENDED + 1, "{}", m.procs.len());
        let w = m.summary(10);
        let folded = w.proc(0).expect("the summed entry");
        assert!(folded.comm.starts_with("(100 ended processes"), "{}", folded.comm);
        let total_bytes: u64 = w.procs.iter().map(ProcWindow::file_read_bytes).sum();
        assert_eq!(total_bytes, 7 * u64::from(n));
        let on: u64 = w.procs.iter().map(|p| p.sum().on_cpu_ns).sum();
        assert_eq!(on, 3 * u64::from(n));
    }

    #[test]
    fn prune_keeps_only_the_live_job() {
        let mut m = Model::new(0);
        m.apply(&open(10, 3, 1, "/a"));
        m.apply(&open(20, 3, 2, "/b"));
        m.apply(&Event::NewTask {
            ts: 1,
            parent_tid: 10,
            parent_tgid: 10,
            child_tid: 20,
            child_tgid: 20,
            comm: "w".into(),
        });
        let counters = ThreadCounters::default();
        m.apply(&Event::Exit { ts: 2, tid: 20, tgid: 20, comm: "w".into(), counters, other_nr: -1 });
        m.apply(&Event::Close { ts: 2, tgid: 10, fd: 3, file_id: 1, counters: FileCounters::default() });
        m.apply_snapshot(&Snapshot {
            ts: 3,
            threads: vec![ThreadSnap { tid: 10, tgid: 10, ..Default::default() }],
            ..Default::default()
        });
        let _ = m.interval(3);
        m.prune();
        assert_eq!(m.threads.keys().copied().collect::<Vec<_>>(), vec![10]);
        assert_eq!(m.procs.keys().copied().collect::<Vec<_>>(), vec![10]);
        assert!(m.files.is_empty());
    }

    #[test]
    fn wakers_are_listed_most_frequent_first() {
        let mut m = Model::new(0);
        m.apply_snapshot(&Snapshot {
            ts: 10,
            threads: vec![ThreadSnap { tid: 10, tgid: 10, ..Default::default() }],
            wakes: vec![
                WakeSnap { wakee: 10, waker: 21, waker_tgid: 21, waker_comm: "w1".into(), count: 3 },
                WakeSnap { wakee: 10, waker: 22, waker_tgid: 22, waker_comm: "w2".into(), count: 30 },
            ],
            ..Default::default()
        });
        let w = m.summary(10);
        let by = &w.thread(10).unwrap().1.woken_by;
        assert_eq!(by.iter().map(|b| (b.tid, b.count)).collect::<Vec<_>>(), vec![(22, 30), (21, 3)]);
    }

    /// Wakes the kernel counted per waking process (its pair table full)
    /// stay apart from the waking threads', under the process's name and
    /// with no thread.
    #[test]
    fn wakes_counted_per_process_name_no_thread() {
        let mut m = Model::new(0);
        m.note_process(20, Some(1), "python3", None);
        m.apply_snapshot(&Snapshot {
            ts: 10,
            threads: vec![ThreadSnap { tid: 10, tgid: 10, ..Default::default() }],
            wakes: vec![
                WakeSnap { wakee: 10, waker: 21, waker_tgid: 20, waker_comm: "w1".into(), count: 3 },
                WakeSnap {
                    wakee: 10,
                    waker: 20 | WAKER_ANY_THREAD,
                    waker_tgid: 20,
                    waker_comm: "w7".into(),
                    count: 40,
                },
            ],
            ..Default::default()
        });
        let w = m.summary(10);
        let by = &w.thread(10).unwrap().1.woken_by;
        let got: Vec<_> = by.iter().map(|b| (b.thread(), b.tgid, b.comm.as_str(), b.count)).collect();
        assert_eq!(got, vec![(None, 20, "python3", 40), (Some(21), 20, "w1", 3)]);
    }
}
