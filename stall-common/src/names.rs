//! The names the agent finds the kernel object's maps, programs and globals
//! by (`Ebpf::take_map`, `Ebpf::program_mut`, `EbpfLoader::override_global`).
//!
//! The kernel side cannot use these: aya-ebpf's `#[map]` and program macros
//! name a map or program after its Rust identifier (a map's `name = ...`
//! takes a string literal only), so each constant here equals the identifier
//! of its `static` or `fn` in `stall-ebpf`. [`MAPS`], [`PROGRAMS`] and
//! [`GLOBALS`] list every name the object defines, for a check against the
//! built object.

/// The `static CONFIG: Config` global (main.rs), set at load time.
pub const CONFIG: &str = "CONFIG";

// Maps (maps.rs).
pub const THREADS: &str = "THREADS";
pub const CGROUPS: &str = "CGROUPS";
pub const FILES: &str = "FILES";
pub const INODE_BYTES: &str = "INODE_BYTES";
pub const FILE_WINDOWS: &str = "FILE_WINDOWS";
pub const URING_PENDING: &str = "URING_PENDING";
pub const URING_READS: &str = "URING_READS";
/// Kernel-side only: the agent never opens it.
pub const URING_FD: &str = "URING_FD";
pub const WAKES: &str = "WAKES";
pub const WAKES_BY_PROC: &str = "WAKES_BY_PROC";
pub const WAKE_CACHE: &str = "WAKE_CACHE";
pub const FD_WAITS: &str = "FD_WAITS";
pub const GPU_CALLS: &str = "GPU_CALLS";
pub const NCCL_COMMS: &str = "NCCL_COMMS";
pub const NCCL_INITS: &str = "NCCL_INITS";
pub const NCCL_SCRATCH: &str = "NCCL_SCRATCH";
pub const CPU_SLOT: &str = "CPU_SLOT";
/// The object's `.bss`, which holds the `TRACK_GEN` global alone.
pub const TRACK_GEN: &str = ".bss";
pub const TIMELINE_JOB: &str = "TIMELINE_JOB";
/// Kernel-side only: the agent never opens it.
pub const UNTRACKED: &str = "UNTRACKED";
/// Kernel-side only.
pub const OURS: &str = "OURS";
/// Kernel-side only: the agent never opens it.
pub const MIGRATIONS: &str = "MIGRATIONS";
/// The ring buffer; also resized by name (`EbpfLoader::map_max_entries`).
pub const EVENTS: &str = "EVENTS";
pub const COUNTERS: &str = "COUNTERS";
/// Kernel-side only: the agent never opens it.
pub const FILE_SEQ: &str = "FILE_SEQ";

// Scheduler and task programs (stall-ebpf's sched/). `*_STACK`: the variant
// for kernels without `bpf_task_pt_regs`; `SCHED_SWITCH_DIRECT`: the one
// that loads the current task's fields directly, where the verifier takes
// it; `SCHED_SWITCH_QUEUED`: that one, taking a woken task's wait for a CPU
// from the kernel, loaded with `SCHED_WAKING_MARKED`, or where EEVDF delays
// dequeues as `SCHED_SWITCH_QUEUED_CAST` (no helper call to find the task
// and its registers) with `SCHED_WAKING_CHECKED`. The agent loads one of
// each kind.
pub const SCHED_SWITCH_QUEUED: &str = "sched_switch_queued";
pub const SCHED_SWITCH_QUEUED_CAST: &str = "sched_switch_queued_cast";
pub const SCHED_SWITCH_DIRECT: &str = "sched_switch_direct";
pub const SCHED_SWITCH: &str = "sched_switch";
pub const SCHED_SWITCH_STACK: &str = "sched_switch_stack";
pub const SCHED_WAKING: &str = "sched_waking";
pub const SCHED_WAKING_MARKED: &str = "sched_waking_marked";
pub const SCHED_WAKING_CHECKED: &str = "sched_waking_checked";
pub const TASK_NEWTASK: &str = "task_newtask";
pub const SCHED_PROCESS_EXEC: &str = "sched_process_exec";
pub const SCHED_PROCESS_EXIT: &str = "sched_process_exit";
/// Cgroup mode only.
pub const CGROUP_ATTACH_TASK: &str = "cgroup_attach_task";

// Page cache and mappings (pagecache/).
pub const PAGE_CACHE_FILL: &str = "page_cache_fill";
pub const PAGE_CACHE_FILL_STACK: &str = "page_cache_fill_stack";
pub const MAPPED_WINDOW: &str = "mapped_window";
pub const MAPPED_PAGE: &str = "mapped_page";
pub const FENTRY_MAP_PAGES: &str = "fentry_map_pages";
pub const FENTRY_FILEMAP_FAULT: &str = "fentry_filemap_fault";

// io_uring (uring/).
pub const URING_SUBMIT: &str = "uring_submit";
pub const URING_FILE_GET: &str = "uring_file_get";
pub const URING_COMPLETE: &str = "uring_complete";

// Syscall hooks as raw tracepoints (syscalls.rs).
pub const SYS_ENTER: &str = "sys_enter";
pub const SYS_EXIT: &str = "sys_exit";
/// `sys_exit` reading the registers through `bpf_rdonly_cast` (`kfunc`).
pub const SYS_EXIT_CAST: &str = "sys_exit_cast";

// Syscall hooks as trampolines (syscalls/trampoline.rs): one per hooked function and
// side (copy_file_range is "cfr").
pub const FENTRY_READ: &str = "fentry_read";
pub const FENTRY_PREAD64: &str = "fentry_pread64";
pub const FENTRY_READV: &str = "fentry_readv";
pub const FENTRY_PREADV: &str = "fentry_preadv";
pub const FENTRY_PREADV2: &str = "fentry_preadv2";
pub const FENTRY_SENDFILE: &str = "fentry_sendfile";
pub const FENTRY_SPLICE: &str = "fentry_splice";
pub const FENTRY_CFR: &str = "fentry_cfr";
pub const FENTRY_CLOSE: &str = "fentry_close";
pub const FEXIT_READ: &str = "fexit_read";
pub const FEXIT_PREAD64: &str = "fexit_pread64";
pub const FEXIT_READV: &str = "fexit_readv";
pub const FEXIT_PREADV: &str = "fexit_preadv";
pub const FEXIT_PREADV2: &str = "fexit_preadv2";
pub const FEXIT_SENDFILE: &str = "fexit_sendfile";
pub const FEXIT_SPLICE: &str = "fexit_splice";
pub const FEXIT_CFR: &str = "fexit_cfr";
pub const FEXIT_WRITE: &str = "fexit_write";
pub const FEXIT_PWRITE64: &str = "fexit_pwrite64";
pub const FEXIT_WRITEV: &str = "fexit_writev";
pub const FEXIT_PWRITEV: &str = "fexit_pwritev";
pub const FEXIT_PWRITEV2: &str = "fexit_pwritev2";
pub const FEXIT_OPEN: &str = "fexit_open";
pub const FEXIT_OPENAT: &str = "fexit_openat";
pub const FEXIT_OPENAT2: &str = "fexit_openat2";
pub const FEXIT_CREAT: &str = "fexit_creat";
pub const FEXIT_DUP: &str = "fexit_dup";
pub const FEXIT_DUP2: &str = "fexit_dup2";
pub const FEXIT_DUP3: &str = "fexit_dup3";
pub const FEXIT_FCNTL: &str = "fexit_fcntl";
pub const FENTRY_RECVFROM: &str = "fentry_recvfrom";
pub const FEXIT_RECVFROM: &str = "fexit_recvfrom";
pub const FENTRY_RECVMSG: &str = "fentry_recvmsg";
pub const FEXIT_RECVMSG: &str = "fexit_recvmsg";
pub const FEXIT_SENDTO: &str = "fexit_sendto";
pub const FEXIT_SENDMSG: &str = "fexit_sendmsg";
pub const FEXIT_CONNECT: &str = "fexit_connect";

/// Every map the object defines.
// The GPU library family's uprobes (gpu/), attached per library.
pub const GPU_SYNC_ENTER: &str = "gpu_sync_enter";
pub const GPU_COPY_ENTER: &str = "gpu_copy_enter";
/// The uretprobe on every timed call (synchronizations and copies).
pub const GPU_CALL_RETURN: &str = "gpu_call_return";
pub const GPU_LAUNCH: &str = "gpu_launch";
// Its NCCL probes: communicators as they are made, collectives as ranks
// call them (by where the communicator argument is).
pub const NCCL_INIT_ENTER: &str = "nccl_init_enter";
pub const NCCL_SPLIT_ENTER: &str = "nccl_split_enter";
pub const NCCL_INIT_RETURN: &str = "nccl_init_return";
pub const NCCL_COLLECTIVE_COMM4: &str = "nccl_collective_comm4";
pub const NCCL_COLLECTIVE_COMM5: &str = "nccl_collective_comm5";
pub const NCCL_COLLECTIVE_COMM6: &str = "nccl_collective_comm6";
pub const NCCL_P2P: &str = "nccl_p2p";

pub const MAPS: &[&str] = &[
    THREADS,
    FD_WAITS,
    GPU_CALLS,
    NCCL_COMMS,
    NCCL_INITS,
    NCCL_SCRATCH,
    CGROUPS,
    FILES,
    INODE_BYTES,
    FILE_WINDOWS,
    URING_PENDING,
    URING_READS,
    URING_FD,
    WAKES,
    WAKES_BY_PROC,
    WAKE_CACHE,
    CPU_SLOT,
    TRACK_GEN,
    UNTRACKED,
    OURS,
    MIGRATIONS,
    EVENTS,
    COUNTERS,
    FILE_SEQ,
];

/// Every program the object defines.
pub const PROGRAMS: &[&str] = &[
    SCHED_SWITCH_QUEUED,
    SCHED_SWITCH_QUEUED_CAST,
    SCHED_SWITCH_DIRECT,
    SCHED_SWITCH,
    SCHED_SWITCH_STACK,
    SCHED_WAKING,
    SCHED_WAKING_MARKED,
    SCHED_WAKING_CHECKED,
    TASK_NEWTASK,
    SCHED_PROCESS_EXEC,
    SCHED_PROCESS_EXIT,
    CGROUP_ATTACH_TASK,
    PAGE_CACHE_FILL,
    PAGE_CACHE_FILL_STACK,
    MAPPED_WINDOW,
    MAPPED_PAGE,
    FENTRY_MAP_PAGES,
    FENTRY_FILEMAP_FAULT,
    URING_SUBMIT,
    URING_FILE_GET,
    URING_COMPLETE,
    SYS_ENTER,
    SYS_EXIT,
    SYS_EXIT_CAST,
    FENTRY_READ,
    FENTRY_PREAD64,
    FENTRY_READV,
    FENTRY_PREADV,
    FENTRY_PREADV2,
    FENTRY_SENDFILE,
    FENTRY_SPLICE,
    FENTRY_CFR,
    FENTRY_CLOSE,
    FEXIT_READ,
    FEXIT_PREAD64,
    FEXIT_READV,
    FEXIT_PREADV,
    FEXIT_PREADV2,
    FEXIT_SENDFILE,
    FEXIT_SPLICE,
    FEXIT_CFR,
    FEXIT_WRITE,
    FEXIT_PWRITE64,
    FEXIT_WRITEV,
    FEXIT_PWRITEV,
    FEXIT_PWRITEV2,
    FEXIT_OPEN,
    FEXIT_OPENAT,
    FEXIT_OPENAT2,
    FEXIT_CREAT,
    FEXIT_DUP,
    FEXIT_DUP2,
    FEXIT_DUP3,
    FEXIT_FCNTL,
    FENTRY_RECVFROM,
    FEXIT_RECVFROM,
    FENTRY_RECVMSG,
    FEXIT_RECVMSG,
    FEXIT_SENDTO,
    FEXIT_SENDMSG,
    FEXIT_CONNECT,
    GPU_SYNC_ENTER,
    GPU_COPY_ENTER,
    GPU_CALL_RETURN,
    GPU_LAUNCH,
    NCCL_INIT_ENTER,
    NCCL_SPLIT_ENTER,
    NCCL_INIT_RETURN,
    NCCL_COLLECTIVE_COMM4,
    NCCL_COLLECTIVE_COMM5,
    NCCL_COLLECTIVE_COMM6,
    NCCL_P2P,
];

/// Every global the agent sets by name.
pub const GLOBALS: &[&str] = &[CONFIG];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_listed_once() {
        let all = || MAPS.iter().chain(PROGRAMS).chain(GLOBALS);
        for (i, a) in all().enumerate() {
            assert_eq!(all().skip(i + 1).filter(|b| b == &a).count(), 0, "{a} listed twice");
        }
    }
}
