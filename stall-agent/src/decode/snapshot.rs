//! [`Snapshot`]: one read of the kernel maps (threads, descriptors,
//! wakeups, blocked descriptors, page-cache fills per inode, GPU calls) as
//! plain values.
use stall_common::{counter, FdKey, FileStats};

use super::{FileCounters, GpuCounters, ThreadCounters, ThreadNow};

/// One read of the kernel maps.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// CLOCK_MONOTONIC ns, the clock of every kernel timestamp.
    pub ts: u64,
    pub threads: Vec<ThreadSnap>,
    pub files: Vec<FileSnap>,
    pub wakes: Vec<WakeSnap>,
    /// How long each process was blocked reading or writing each of its
    /// descriptors, cumulative.
    pub fd_waits: Vec<FdWaitSnap>,
    /// Losses by cause (`stall_common::counter::LOST_NAMES`), cumulative.
    pub lost: [u64; counter::LOST_CAUSES],
    /// Events handled in the kernel for tracked threads, cumulative.
    pub events: u64,
    /// Switches that did not match the state before (see
    /// `stall_common::counter::SCHED_GAPS`), cumulative.
    pub sched_gaps: u64,
    /// Switches the tracepoint never delivered, repaired from the kernel's
    /// counters (see `stall_common::counter::SCHED_REPAIRED`), cumulative.
    pub sched_repaired: u64,
    /// What each process took of each file outside its read calls, per
    /// file, cumulative; None where the kernel does not let stall see
    /// page-cache fills.
    pub inode_bytes: Option<Vec<InodeSnap>>,
    /// Whether the kernel side follows faults on mappings here (else
    /// `InodeSnap::mmap_bytes` stays 0 and means nothing).
    pub mmap_known: bool,
    /// Per thread that called into the job's GPU libraries, by tid,
    /// cumulative; kept after the thread ends, until its entry is freed.
    pub gpu_calls: Vec<(u32, GpuCounters)>,
    /// The NCCL communicators of the job's processes, with their ranks'
    /// last arrival times.
    pub communicators: Vec<CommSnap>,
}

/// One process's NCCL communicator: what it is, its calls, and when its
/// rank called each of its last collectives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommSnap {
    pub tgid: u32,
    /// The `ncclComm_t` handle.
    pub comm: u64,
    /// Shared by all ranks of the communicator; None where it was made
    /// before stall's probes.
    pub id: Option<u64>,
    pub nranks: Option<u32>,
    pub rank: Option<u32>,
    /// The thread that called the last collective.
    pub tid: u32,
    pub collectives: u64,
    pub p2p: u64,
    /// The kernel's ring: `ring[seq % ring.len()]` is the arrival time of
    /// collective `seq`, for the last `ring.len()` of them.
    pub ring: Vec<u64>,
}

impl CommSnap {
    pub fn of(k: &stall_common::CommKey, c: &stall_common::Communicator) -> Self {
        Self {
            tgid: k.tgid,
            comm: k.comm,
            id: (c.id_hash != 0).then_some(c.id_hash),
            nranks: (c.nranks != 0).then_some(c.nranks),
            rank: u32::try_from(c.rank).ok(),
            tid: c.tid,
            collectives: c.collectives,
            p2p: c.p2p,
            ring: c.arrivals.to_vec(),
        }
    }

    /// When this rank called collective `seq`, if the ring still holds it.
    pub fn arrival(&self, seq: u64) -> Option<u64> {
        let kept = self.ring.len() as u64;
        (seq < self.collectives && seq + kept >= self.collectives && kept > 0)
            .then(|| self.ring[(seq % kept) as usize])
    }

    /// The oldest collective the ring still holds.
    pub fn oldest_kept(&self) -> u64 {
        self.collectives.saturating_sub(self.ring.len() as u64)
    }
}

/// A file as the page cache knows it: the kernel's device number (major
/// << 20 | minor) and inode number.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Inode {
    pub dev: u32,
    pub ino: u64,
}

impl Inode {
    /// From `stat`'s `st_dev` (glibc's encoding) and `st_ino`.
    pub fn from_stat(st_dev: u64, st_ino: u64) -> Self {
        let (major, minor) = (libc::major(st_dev), libc::minor(st_dev));
        Self { dev: (major << 20) | (minor & 0xf_ffff), ino: st_ino }
    }
}

/// What one process took of one file outside its read calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InodeSnap {
    pub tgid: u32,
    pub inode: Inode,
    /// Bytes it caused to be read from storage.
    pub storage_bytes: u64,
    /// Bytes its faults mapped into it first of the job's processes.
    pub mmap_bytes: u64,
    /// Bytes its faults mapped that another process got mapped just before.
    pub mmap_shared_bytes: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThreadSnap {
    pub tid: u32,
    pub tgid: u32,
    pub job: u32,
    pub counters: ThreadCounters,
    pub now: ThreadNow,
    pub other_nr: i32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileSnap {
    pub tgid: u32,
    pub fd: i32,
    pub file_id: u64,
    pub kind: u32,
    pub counters: FileCounters,
}

impl FileSnap {
    /// A `FILES` entry as read from the map.
    pub fn of(k: &FdKey, s: &FileStats) -> Self {
        Self { tgid: k.tgid, fd: k.fd, file_id: s.file_id, kind: s.kind, counters: s.into() }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WakeSnap {
    pub wakee: u32,
    pub waker: u32,
    pub waker_tgid: u32,
    pub waker_comm: String,
    pub count: u64,
    /// The wakee's blocked time that this waker's wakeups ended (ns).
    pub blocked_ns: u64,
}

/// Blocked time of one process in reads and writes of one descriptor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FdWaitSnap {
    pub tgid: u32,
    pub fd: i32,
    pub blocked_ns: u64,
}

impl Snapshot {
    /// The part that belongs to one job (cgroup mode): its threads, their
    /// processes' descriptors, page-cache and mapped bytes and NCCL
    /// communicators, and its threads' wakeups and GPU calls. Node-wide
    /// totals (losses, events) stay with the whole snapshot.
    pub fn of_job(&self, job: u32) -> Snapshot {
        let threads: Vec<ThreadSnap> = self.threads.iter().filter(|t| t.job == job).copied().collect();
        let tgids: std::collections::HashSet<u32> = threads.iter().map(|t| t.tgid).collect();
        let tids: std::collections::HashSet<u32> = threads.iter().map(|t| t.tid).collect();
        Snapshot {
            ts: self.ts,
            files: self.files.iter().filter(|f| tgids.contains(&f.tgid)).copied().collect(),
            wakes: self.wakes.iter().filter(|w| tids.contains(&w.wakee)).cloned().collect(),
            fd_waits: self.fd_waits.iter().filter(|f| tgids.contains(&f.tgid)).copied().collect(),
            inode_bytes: self
                .inode_bytes
                .as_ref()
                .map(|b| b.iter().filter(|b| tgids.contains(&b.tgid)).copied().collect()),
            mmap_known: self.mmap_known,
            gpu_calls: self.gpu_calls.iter().filter(|(tid, _)| tids.contains(tid)).copied().collect(),
            communicators: self.communicators.iter().filter(|c| tgids.contains(&c.tgid)).cloned().collect(),
            threads,
            ..Default::default()
        }
    }
}
