//! What is tracked: a PID tree or cgroups, seeded from /proc with the state
//! each thread is in now and the files each process has open, so the
//! kernel side counts from the first moment on.
use std::{collections::HashSet, path::Path};

use stall_common::{fd_kind, names, track_gen, FdKey, FileStats};

use super::{cgroup, error::map_err, procfs, schedstat, Capture, CaptureError};
use crate::{
    clock::monotonic_ns,
    decode::{Event, JobEvent},
};

impl Capture {
    /// Tracks `root`, all its threads and all its descendants, and returns
    /// the files they already had open (as `Open` events). The kernel
    /// follows every task created from here on; inserting parents before
    /// listing their children, and listing until nothing new appears, closes
    /// the window in which a fork could slip through.
    pub fn track_tree(&mut self, root: u32, job: u32) -> Result<Vec<JobEvent>, CaptureError> {
        if !procfs::exists(root) {
            return Err(CaptureError::NoSuchProcess(root));
        }
        let mut done: HashSet<u32> = HashSet::new();
        let mut todo = vec![root];
        let mut opened = Vec::new();
        loop {
            while let Some(pid) = todo.pop() {
                // stall itself, when the tree holds it (attach --pid 1): its
                // threads and output are not the job's.
                if pid == std::process::id() {
                    done.insert(pid);
                    continue;
                }
                if done.insert(pid) {
                    self.track_process(pid, job)?;
                    opened.extend(self.seed_fds(pid, job));
                }
            }
            let children = procfs::children_map();
            let mut stack: Vec<u32> = done.iter().copied().collect();
            while let Some(p) = stack.pop() {
                for &c in children.get(&p).into_iter().flatten() {
                    if !done.contains(&c) && !todo.contains(&c) {
                        todo.push(c);
                        stack.push(c);
                    }
                }
            }
            if todo.is_empty() {
                break;
            }
        }
        self.changed();
        Ok(opened)
    }

    /// Tells the kernel side that what is tracked changed: every CPU's
    /// slot (`CPU_SLOT`) is looked up again at its next syscall.
    pub(super) fn changed(&mut self) {
        self.gen = track_gen::next_tracking(self.gen);
        let _ = self.track_gen.set(0, self.gen, 0);
    }

    /// Adds every thread of `pid`, with its state as /proc shows it now.
    pub fn track_process(&mut self, pid: u32, job: u32) -> Result<(), CaptureError> {
        let mut seen: HashSet<u32> = HashSet::new();
        loop {
            let fresh: Vec<u32> = procfs::threads(pid).into_iter().filter(|t| !seen.contains(t)).collect();
            if fresh.is_empty() {
                return Ok(());
            }
            for tid in fresh {
                seen.insert(tid);
                self.seed_thread(pid, tid, job)?;
            }
            self.changed();
        }
    }

    pub(super) fn seed_thread(&mut self, tgid: u32, tid: u32, job: u32) -> Result<(), CaptureError> {
        let Some(r) = schedstat::read(tgid, tid, self.run_delay()) else { return Ok(()) };
        self.unreadable_threads += u32::from(r.unreadable);
        let t = schedstat::seed(tgid, job, monotonic_ns(), &r);
        // BPF_NOEXIST: the kernel may already have created it (a new thread).
        match self.threads.insert(tid, t, 1) {
            Ok(()) => Ok(()),
            Err(_) if self.threads.get(&tid, 0).is_ok() => Ok(()),
            Err(e) => Err(map_err(names::THREADS)(e)),
        }
    }

    /// Registers the regular files and connected TCP sockets `pid` has
    /// open, so reads of descriptors opened before attach (or inherited
    /// over fork) are counted.
    pub fn seed_fds(&mut self, pid: u32, job: u32) -> Vec<JobEvent> {
        // And the CUDA libraries it loaded before it was seen.
        self.gpu_libraries_of(pid);
        let now = monotonic_ns();
        let mut out = Vec::new();
        let fds = procfs::open_fds(pid);
        // Connected sockets too, named by their peer (read once per process).
        let peers = match fds.iter().any(|f| f.target.starts_with("socket:[")) {
            true => procfs::socket_peers(pid),
            false => Default::default(),
        };
        for f in fds {
            let peer = f
                .target
                .strip_prefix("socket:[")
                .and_then(|s| s.strip_suffix(']'))
                .and_then(|i| i.parse::<u64>().ok())
                .and_then(|inode| peers.get(&inode).cloned());
            let kind = match (&peer, f.regular) {
                (Some(_), _) => fd_kind::SOCKET,
                (None, true) => fd_kind::REGULAR,
                (None, false) => continue,
            };
            self.seed_seq += 1;
            let file_id = (1 << 63) | (u64::from(pid) << 24) | (self.seed_seq & 0xff_ffff);
            let stats = FileStats { file_id, kind, ..Default::default() };
            if self.files.insert(FdKey { tgid: pid, fd: f.fd }, stats, 1).is_ok() {
                let ev = match peer {
                    Some(peer) => Event::Connect { ts: now, tgid: pid, fd: f.fd, file_id, peer },
                    None => Event::Open {
                        ts: now,
                        tid: pid,
                        tgid: pid,
                        fd: f.fd,
                        file_id,
                        path: f.target,
                        dfd: -100,
                        dup_of: None,
                    },
                };
                out.push((job, ev));
            }
        }
        self.changed();
        out
    }

    /// Tracks every task of the cgroup `dir` and its descendants: those in it
    /// now, and any that later runs there. Returns the files already open.
    /// Called again, it follows the cgroups created below since, and (while
    /// the scheduler hooks, which adopt them, are detached) the tasks that
    /// entered from outside.
    pub fn watch_cgroup(&mut self, dir: &Path, job: u32) -> Result<Vec<JobEvent>, CaptureError> {
        let mut opened = Vec::new();
        for d in cgroup::subtree(dir) {
            let Some(id) = cgroup::id(&d) else { continue };
            if self.cgroups.get(&id, 0).is_ok() {
                if !self.sched_hooks() {
                    for pid in self.adopt(&cgroup::threads(&d), job) {
                        opened.extend(self.seed_fds(pid, job));
                    }
                }
                continue;
            }
            self.cgroups.insert(id, job, 0).map_err(map_err(names::CGROUPS))?;
            let mut pids = HashSet::new();
            for (pid, tid) in cgroup::threads(&d) {
                self.seed_thread(pid, tid, job)?;
                pids.insert(pid);
            }
            for pid in pids {
                opened.extend(self.seed_fds(pid, job));
            }
        }
        self.changed();
        Ok(opened)
    }

    /// Stops following a cgroup (daemon: the job is gone).
    pub fn unwatch_cgroup(&mut self, dir: &Path) {
        for d in cgroup::subtree(dir) {
            if let Some(id) = cgroup::id(&d) {
                let _ = self.cgroups.remove(&id);
            }
        }
        self.changed();
    }

    /// What an opened descriptor is. An absolute path is `stat`ed (the
    /// descriptor may be closed, or its number reused, by the time the
    /// event is read: a file mapped and closed at once); a relative one is
    /// looked up in /proc, where the descriptor says what it points to if it
    /// is still that open.
    pub fn classify_open(&mut self, tgid: u32, fd: i32, path: &str) -> Option<procfs::Opened> {
        if path.starts_with('/') {
            if let Some(opened) = procfs::path_info(path) {
                return Some(opened);
            }
        }
        procfs::fd_info_of_open(tgid, fd, path)
    }

    /// Records that an opened descriptor is not a regular file (FIFO,
    /// device...), so the kernel stops counting it as file reads; only if
    /// it still names the same open. This rewrites the whole entry: reads
    /// counted between the lookup and the update are lost, which is why it
    /// is used only for non-files, whose per-file counts nothing reports.
    /// Should the number be closed and opened again between the two, the
    /// new open's entry is overwritten: its counts are lost, and the model
    /// retires it at the close under the old id. Directories, the common
    /// case, are marked in the kernel at open: nothing is rewritten for them.
    pub fn set_fd_kind(&mut self, tgid: u32, fd: i32, file_id: u64, kind: u32) {
        let key = FdKey { tgid, fd };
        if let Ok(mut s) = self.files.get(&key, 0) {
            if s.file_id == file_id && s.kind != kind {
                s.kind = kind;
                let _ = self.files.insert(key, s, 2); // BPF_EXIST
                self.changed();
            }
        }
    }
}
