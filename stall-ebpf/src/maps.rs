//! The maps shared with the agent. Sizes are defaults; the agent may resize
//! them at load time (`EbpfLoader::map_max_entries`).
use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
};
use stall_common::{
    counter, CommInit, CommKey, Communicator, CpuSlot, FdKey, FileStats, FileWindows, GpuCalls, InodeBytes,
    InodeKey, ThreadStats, UringKey, UringRead, UringReads, WakeCache, WakeKey, WakeStats, WAKE_CACHE_SLOTS,
};

/// Tracked threads by tid. Being here is what "tracked" means.
#[map]
pub static THREADS: HashMap<u32, ThreadStats> = HashMap::with_max_entries(16384, 0);

/// Watched cgroup v2 ids (cgroup mode) → job id.
#[map]
pub static CGROUPS: HashMap<u64, u32> = HashMap::with_max_entries(1024, 0);

/// Open descriptors of tracked processes that were opened with openat (or
/// were open at attach), with their read and write counters.
#[map]
pub static FILES: HashMap<FdKey, FileStats> = HashMap::with_max_entries(32768, 0);

/// What each tracked process took of each file outside its read calls:
/// bytes read from storage for it, bytes its faults mapped.
#[map]
pub static INODE_BYTES: HashMap<InodeKey, InodeBytes> = HashMap::with_max_entries(32768, 0);

/// The page ranges last counted as mapped from each file, by any process
/// (key: tgid 0), so that a range two processes each get mapped counts once.
/// Least recently used files make room.
#[map]
pub static FILE_WINDOWS: LruHashMap<InodeKey, FileWindows> = LruHashMap::with_max_entries(4096, 0);

/// io_uring reads of tracked threads submitted and not completed yet.
#[map]
pub static URING_PENDING: HashMap<UringKey, UringRead> = HashMap::with_max_entries(16384, 0);

/// io_uring reads completed, by the submitting thread.
#[map]
pub static URING_READS: HashMap<u32, UringReads> = HashMap::with_max_entries(16384, 0);

/// The descriptor `io_uring_file_get` just named on this CPU, for the
/// submission traced next by the same thread (kernels whose submission
/// tracepoint carries no request: 5.10).
#[map]
pub static URING_FD: PerCpuArray<UringRead> = PerCpuArray::with_max_entries(1, 0);

/// Who woke a tracked thread, and how often.
#[map]
pub static WAKES: HashMap<WakeKey, WakeStats> = HashMap::with_max_entries(32768, 0);

/// Per (process, descriptor): how long its threads were blocked in read
/// and write family calls on it (ns), added up from each thread's
/// `fd_waited_ns` (see `ThreadStats::blocked_fd`). Full: counted as
/// `LOST_FD_MAP`.
#[map]
pub static FD_WAITS: HashMap<FdKey, u64> = HashMap::with_max_entries(16384, 0);

/// Per tracked thread that called into a hooked GPU library: its time in
/// the calls that wait for the GPU, and its launches (gpu/). Full:
/// counted as `LOST_GPU_MAP`.
#[map]
pub static GPU_CALLS: HashMap<u32, GpuCalls> = HashMap::with_max_entries(4096, 0);

/// The NCCL communicators of tracked processes, with their ranks' last
/// arrival times (nccl.rs). Full: counted as `LOST_GPU_MAP`.
#[map]
pub static NCCL_COMMS: HashMap<CommKey, Communicator> = HashMap::with_max_entries(1024, 0);

/// Communicators being created, by the creating thread.
#[map]
pub static NCCL_INITS: HashMap<u32, CommInit> = HashMap::with_max_entries(1024, 0);

/// Room to build a `Communicator` (over a kilobyte: more than a program's
/// stack) before it goes into `NCCL_COMMS`.
#[map]
pub static NCCL_SCRATCH: PerCpuArray<Communicator> = PerCpuArray::with_max_entries(1, 0);

/// What `WAKES` has no room for, per waking process (`WAKER_ANY_THREAD`).
#[map]
pub static WAKES_BY_PROC: HashMap<WakeKey, WakeStats> = HashMap::with_max_entries(16384, 0);

/// Per CPU, by the wakee's tid modulo its size: the last pair of `WAKES`
/// counted there and its wakeups not added yet (see `WakeCache`). Slots
/// apart, so that two threads waking each other in turn keep their pairs.
#[map]
pub static WAKE_CACHE: PerCpuArray<WakeCache> = PerCpuArray::with_max_entries(WAKE_CACHE_SLOTS, 0);

/// What each CPU runs now, with the hot per-thread state (see `CpuSlot`).
#[map]
pub static CPU_SLOT: PerCpuArray<CpuSlot> = PerCpuArray::with_max_entries(1, 0);

/// Tasks known not to be tracked, by a hash of their address: see
/// untracked.rs. Kernel-side only.
pub const UNTRACKED_SLOTS: u32 = 16384;
#[map]
pub static UNTRACKED: Array<UntrackedNote> = Array::with_max_entries(UNTRACKED_SLOTS, 0);

/// A task's address and the generations it was found not ours under.
#[repr(C)]
pub struct UntrackedNote {
    pub task: u64,
    pub gens: u64,
}

/// Tracked tasks' thread ids, by a hash of their address: see untracked.rs.
/// A table apart from `UNTRACKED`, so that notes torn by two CPUs writing
/// one slot at once never pair a tracked task with "not ours".
/// Kernel-side only.
pub const OURS_SLOTS: u32 = 4096;
#[map]
pub static OURS: Array<OursNote> = Array::with_max_entries(OURS_SLOTS, 0);

/// A tracked task's address, the generations it was noted under, and its
/// thread id.
#[repr(C)]
pub struct OursNote {
    pub task: u64,
    pub gens: u64,
    pub tid: u32,
    pub _pad: u32,
}

/// Cgroup migrations seen (cgroup mode; untracked.rs). Kernel-side only.
#[map]
pub static MIGRATIONS: Array<u64> = Array::with_max_entries(1, 0);

/// The job whose switches are recorded on demand (the daemon's capture
/// endpoint), beside `Config::timeline`, which records every job's; 0: none.
#[map]
pub static TIMELINE_JOB: Array<u32> = Array::with_max_entries(1, 0);

/// Events that must be seen one by one.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(4 << 20, 0);

/// Losses by cause and totals, see `stall_common::counter`.
#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

/// Per-CPU sequence for file ids.
#[map]
pub static FILE_SEQ: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
