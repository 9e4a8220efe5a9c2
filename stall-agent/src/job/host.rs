//! What a job asks of the machine beyond the decoded stream: what a
//! descriptor is, what a new process inherited, the kernel entries of what
//! ended, and names from /proc. [`LiveHost`] answers for real; tests answer
//! from a script, so a [`super::Job`] runs without root.
use std::collections::HashSet;

use crate::{
    capture::{
        environ::EnvironReader, mounts::Mounts, peer_activity::PeerActivity, procfs, waits_on, Capture,
    },
    clock::ClockSnapshot,
    cpulimit::{self, Hierarchy, Reading},
    decode::{FileSnap, Inode, JobEvent},
    pystack::{MainThread, PyStack, PyStacks},
    rank::Env,
    wait::WaitObject,
};

/// A process as /proc shows it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcInfo {
    pub ppid: u32,
    pub comm: String,
    /// /proc state letter ('R', 'S', 'D', 'Z', ...).
    pub state: char,
    /// When it started, ns since boot (to clock-tick precision).
    pub started_ns: u64,
}

pub trait Host {
    /// Where an opened descriptor points, whether it is a regular file,
    /// and which.
    fn classify_open(&mut self, tgid: u32, fd: i32, path: &str) -> Option<procfs::Opened>;
    /// Tells the kernel side that a descriptor is not a file (its reads are
    /// not file throughput).
    fn mark_not_file(&mut self, tgid: u32, fd: i32, file_id: u64);
    /// The descriptors a new process inherited, as open events of `job`.
    fn inherited_files(&mut self, pid: u32, job: u32) -> Vec<JobEvent>;
    /// Frees the kernel entries of ended processes and threads; returns the
    /// last counts of the descriptors their exit closed.
    fn retire(&mut self, tgids: &HashSet<u32>, tids: &HashSet<u32>) -> Vec<FileSnap>;
    /// Forgets the descriptors of live processes (to look them up afresh);
    /// returns their last counts.
    fn forget_files(&mut self, tgids: &HashSet<u32>) -> Vec<FileSnap>;
    /// Bytes the process read and wrote through any syscall so far
    /// (/proc/PID/io `rchar` + `wchar`): progress seen without any hook.
    fn io_chars(&self, pid: u32) -> Option<u64>;
    fn process(&self, tgid: u32) -> Option<ProcInfo>;
    fn cmdline(&self, tgid: u32) -> Option<String>;
    /// The listed variables of the environment it was exec'd with
    /// (`/proc/PID/environ`).
    fn exec_environ(&self, tgid: u32) -> Option<Env>;
    /// Those of the environment it has now, read from its memory.
    fn live_environ(&mut self, tgid: u32) -> Option<Env>;
    /// Its main thread's Python stack, innermost frame first (None: not
    /// Python, or not readable now).
    fn main_python_thread(&mut self, tgid: u32) -> Option<MainThread>;
    fn thread_comm(&self, tgid: u32, tid: u32) -> Option<String>;
    /// The outputs a process has open (regular files open for writing, and
    /// stdout/stderr when they are files): path and last write, in
    /// CLOCK_MONOTONIC ns.
    fn outputs(&self, pid: u32) -> Vec<(String, u64)>;
    /// The Python stacks of `threads` (pid, tid, as what), and one note per
    /// process whose stacks cannot be read.
    fn python_stacks(&mut self, threads: &[(u32, u32, String)]) -> (Vec<PyStack>, Vec<String>);
    /// Whether a live read of Python stacks is due (at most one per `every`).
    fn python_stacks_due(&self, every: std::time::Duration) -> bool;
    /// The cgroup that caps the process's CPU, if any; None (outer) when
    /// the process cannot be asked (it has just exited).
    fn cpu_limit(&self, tgid: u32) -> Option<Option<String>>;
    /// A limited cgroup's limit and throttling counters now.
    fn read_cpu_limit(&self, cgroup: &str) -> Option<Reading>;
    /// How many CPUs the job's tasks may run on.
    fn usable_cpus(&self) -> u32;
    /// The path a process maps a file from, by its device and inode.
    fn mapped_path(&self, tgid: u32, inode: Inode) -> Option<String>;
    /// Whether the peer `tgid` connected to is one of `pids` (it holds the
    /// socket listening there): traffic inside the job, not input.
    fn peer_in(&self, tgid: u32, peer: &str, pids: &[u32]) -> bool;
    /// Which of `pids` holds a socket at the address `peer` (listening
    /// there, or connected from there) in `tgid`'s network namespace: the
    /// other end of `tgid`'s connection to `peer`, where it is in the job.
    fn socket_holder(&self, tgid: u32, peer: &str, pids: &[u32]) -> Option<u32>;
    /// What thread `tid` of `tgid`, blocked in syscall `nr`, waits on, and
    /// who holds its other end (None: no object, or it woke meanwhile).
    fn waits_on(&mut self, tgid: u32, tid: u32, nr: i64) -> Option<WaitObject>;
    /// What descriptor `fd` of `tgid` is, as an object waited on by
    /// reading or `writing` it, and who holds its other end.
    fn descriptor(&mut self, tgid: u32, fd: i32, writing: bool) -> Option<WaitObject>;
    /// The filesystem serving `path` as `tgid` sees it, where a server
    /// does (FUSE, a network filesystem): its mount type.
    fn remote_filesystem(&mut self, tgid: u32, path: &str) -> Option<String>;
}

/// The machine as it is: the capture, and beside it the readers of the
/// traced processes' Python stacks.
pub struct LiveHost {
    pub capture: Capture,
    pub stacks: PyStacks,
    /// Where CPU limits are kept on this machine (None: no cgroup CPU
    /// controller found).
    cpu: Option<Hierarchy>,
    pipes: waits_on::PipeHolders,
    peers: PeerActivity,
    mounts: Mounts,
    environ: EnvironReader,
}

impl LiveHost {
    pub fn new(capture: Capture) -> Self {
        Self {
            capture,
            stacks: PyStacks::new(),
            cpu: Hierarchy::find(),
            pipes: Default::default(),
            peers: Default::default(),
            mounts: Default::default(),
            environ: Default::default(),
        }
    }
}

impl Host for LiveHost {
    fn classify_open(&mut self, tgid: u32, fd: i32, path: &str) -> Option<procfs::Opened> {
        // A CUDA library opened (`dlopen` at first use, or at start) is
        // probed as soon as its open is read (anything else is skipped).
        self.capture.gpu_library(path);
        self.capture.classify_open(tgid, fd, path)
    }

    fn mark_not_file(&mut self, tgid: u32, fd: i32, file_id: u64) {
        self.capture.set_fd_kind(tgid, fd, file_id, stall_common::fd_kind::OTHER);
    }

    fn inherited_files(&mut self, pid: u32, job: u32) -> Vec<JobEvent> {
        self.capture.seed_fds(pid, job)
    }

    fn retire(&mut self, tgids: &HashSet<u32>, tids: &HashSet<u32>) -> Vec<FileSnap> {
        self.capture.retire(tgids, tids)
    }

    fn forget_files(&mut self, tgids: &HashSet<u32>) -> Vec<FileSnap> {
        self.capture.retire(tgids, &HashSet::new())
    }

    fn io_chars(&self, pid: u32) -> Option<u64> {
        procfs::io_chars(pid)
    }

    fn process(&self, tgid: u32) -> Option<ProcInfo> {
        procfs::stat(tgid).map(|s| ProcInfo {
            ppid: s.ppid,
            comm: s.comm,
            state: s.state,
            started_ns: procfs::ticks_to_ns(s.start_ticks),
        })
    }

    fn cmdline(&self, tgid: u32) -> Option<String> {
        procfs::cmdline(tgid)
    }

    fn exec_environ(&self, tgid: u32) -> Option<Env> {
        Some(Env::from_environ(&procfs::environ(tgid)?))
    }

    fn live_environ(&mut self, tgid: u32) -> Option<Env> {
        Some(Env::from_environ(&self.environ.read(tgid)?))
    }

    fn main_python_thread(&mut self, tgid: u32) -> Option<MainThread> {
        self.stacks.main_thread(tgid)
    }

    fn thread_comm(&self, tgid: u32, tid: u32) -> Option<String> {
        procfs::thread_comm(tgid, tid)
    }

    fn python_stacks(&mut self, threads: &[(u32, u32, String)]) -> (Vec<PyStack>, Vec<String>) {
        self.stacks.read(threads)
    }

    fn python_stacks_due(&self, every: std::time::Duration) -> bool {
        self.stacks.due(every)
    }

    fn cpu_limit(&self, tgid: u32) -> Option<Option<String>> {
        match &self.cpu {
            Some(h) => h.limit_of(tgid).map(|l| l.map(|l| l.cgroup)),
            None => Some(None),
        }
    }

    fn read_cpu_limit(&self, cgroup: &str) -> Option<Reading> {
        self.cpu.as_ref()?.read(cgroup)
    }

    fn usable_cpus(&self) -> u32 {
        cpulimit::usable_cpus()
    }

    fn mapped_path(&self, tgid: u32, inode: Inode) -> Option<String> {
        procfs::mapped_path(tgid, inode)
    }

    fn peer_in(&self, tgid: u32, peer: &str, pids: &[u32]) -> bool {
        procfs::listener_of(tgid, peer)
            .is_some_and(|inode| pids.iter().any(|p| procfs::holds_socket(*p, inode)))
    }

    fn socket_holder(&self, tgid: u32, peer: &str, pids: &[u32]) -> Option<u32> {
        let inodes = procfs::sockets_at(tgid, peer);
        if inodes.is_empty() {
            return None;
        }
        pids.iter().copied().find(|p| inodes.iter().any(|i| procfs::holds_socket(*p, *i)))
    }

    fn waits_on(&mut self, tgid: u32, tid: u32, nr: i64) -> Option<WaitObject> {
        let mut o = waits_on::wait_object(tgid, tid, nr, &mut self.pipes)?;
        self.peers.fill(&mut o);
        Some(o)
    }

    fn descriptor(&mut self, tgid: u32, fd: i32, writing: bool) -> Option<WaitObject> {
        let mut o = waits_on::descriptor(tgid, fd, writing, &mut self.pipes)?;
        self.peers.fill(&mut o);
        Some(o)
    }

    fn remote_filesystem(&mut self, tgid: u32, path: &str) -> Option<String> {
        self.mounts.remote_filesystem(tgid, path)
    }

    fn outputs(&self, pid: u32) -> Vec<(String, u64)> {
        let clock = ClockSnapshot::now();
        procfs::written_files(pid)
            .into_iter()
            .map(|f| (f.path, clock.realtime_us_to_mono_ns(f.mtime_ns_realtime / 1000)))
            .collect()
    }
}
