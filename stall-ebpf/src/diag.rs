//! The kernel side's rare diagnostics, sent through aya-log to the agent's
//! log at debug level: a map full (a count lost), a switch repaired from
//! the kernel's counters. Called only on those rare branches, never on a
//! hot path, and not inlined: a program carries one call, not the logging
//! code. The agent sets `AYA_LOG_LEVEL` to 0 unless its log is asked for,
//! and then each costs a load and a compare. Not called from what the exit
//! program inlines (a cgroup adoption, a thread's last descriptor wait): a
//! call there moved LLVM's registers so that the verifier lost the bound
//! of a reason index in `sched_process_exit`, and refused it.
use aya_log_ebpf::debug;
use stall_common::counter;

/// A map had no room: the count of `cause` (a `counter::LOST_*`) was lost.
#[inline(never)]
pub(crate) fn map_full(cause: u32) {
    // The context is unused by this aya-log-ebpf's macros.
    match cause {
        counter::LOST_THREAD_MAP => debug!(&(), "THREADS full: a task is not tracked"),
        counter::LOST_FD_MAP => debug!(&(), "FILES full: a descriptor's counts are lost"),
        counter::LOST_WAKE_MAP => debug!(&(), "WAKES_BY_PROC full: a wakeup is not counted"),
        counter::LOST_INODE_MAP => debug!(&(), "INODE_BYTES full: a file's storage bytes are lost"),
        counter::LOST_URING_MAP => debug!(&(), "URING_PENDING or URING_READS full: an io_uring read is lost"),
        counter::LOST_GPU_MAP => {
            debug!(&(), "GPU_CALLS or NCCL_COMMS full: a thread's GPU calls or a communicator are lost")
        }
        _ => debug!(&(), "a map is full: a count is lost"),
    }
}

/// A task's switch-in was never delivered; its span was split by the
/// kernel's counters (`counter::SCHED_REPAIRED`).
#[inline(never)]
pub(crate) fn switch_repaired() {
    debug!(&(), "a switch-in was never delivered: its span repaired from the kernel's counters");
}
