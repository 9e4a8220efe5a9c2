//! Hangs: a job that no longer moves. Nothing on CPU and nothing read or
//! written is a hang whatever the GPU says; a GPU that reports busy is
//! only believed while the job progresses or the GPU draws real power.
use stall_common::reason;

use super::{rules, shares::Shares};
use crate::{
    aggregate::{ProcWindow, ThreadWindow, Window},
    gpu::GpuWindow,
    progress::ProgressView,
};

/// A busy GPU behind a job that stopped moving.
pub(in crate::verdict) struct BehindBusyGpu<'a> {
    pub gpu: &'a GpuWindow,
    /// Where the trainer's main thread waits most (reason, share).
    pub wait: (u8, f64),
}

/// Everyone blocked: the threads, as they wait now.
pub(in crate::verdict) struct NoProgress {
    pub blocked: Vec<BlockedThread>,
}

pub(in crate::verdict) struct BlockedThread {
    pub comm: String,
    pub tid: u32,
    pub reason: u8,
    /// The syscall it waits in (-1: none known).
    pub syscall: i32,
}

/// A GPU reports busy, but the job has not moved for much longer than its
/// own rhythm, the trainer waits off-CPU, and the GPU draws little power
/// (or does not say): a kernel spinning or wedged, or a collective waiting
/// for a peer, keeps utilization at 100 % while nothing gets done.
pub(in crate::verdict) fn behind_busy_gpu<'a>(
    g: &'a GpuWindow,
    main: &ThreadWindow,
    tm: &Shares,
    progress: &ProgressView,
) -> Option<BehindBusyGpu<'a>> {
    if g.power_share().is_some_and(|s| s >= rules::GPU_WORKING_POWER) {
        return None;
    }
    let needed = if progress.known {
        rules::SILENT_MIN_S.max(progress.rhythm_s.unwrap_or(0.0) * rules::SILENT_RHYTHMS)
    } else {
        rules::SILENT_UNKNOWN_S
    };
    if progress.silent_s < needed || main.now.running || tm.on > rules::HANG_MAX_ON_CPU {
        return None;
    }
    Some(BehindBusyGpu { gpu: g, wait: tm.top_wait() })
}

/// Nobody is on CPU: the trainer and its workers are blocked, nobody reads
/// a file, nobody wakes the trainer. For a GPU that is idle or absent.
pub(in crate::verdict) fn no_progress(
    w: &Window,
    trainer: &ProcWindow,
    main: &ThreadWindow,
    tm: &Shares,
    workers: &[&ProcWindow],
    secs: f64,
) -> Option<NoProgress> {
    if secs < rules::HANG_MIN_S || main.now.running || tm.on > rules::HANG_MAX_ON_CPU {
        return None;
    }
    // Sleeping on purpose is idleness, not a hang; a long write or sync
    // (a checkpoint to slow storage) moves data all along.
    let writing = tm.r(reason::WRITE) + tm.r(reason::SYNC);
    if tm.r(reason::SLEEP) >= 0.5 || writing >= 0.5 || tm.blocked() < 0.9 {
        return None;
    }
    let ipc: u64 = w.procs.iter().map(|p| p.other_read_bytes).sum();
    // Writes are not asked about: with the GPU idle and everyone blocked, a
    // line written now and then is a heartbeat, not a training step.
    let file_bytes: u64 = w.procs.iter().map(ProcWindow::file_read_bytes).sum();
    // Pages faulted in (from storage or the page cache) are work too: a
    // process blocked on its faults (an import, a teardown unmapping its
    // libraries from a cold cache) moves, however slowly. A few pages now
    // and then are not: a heartbeat rewriting a status file reads a
    // directory block.
    let paged: u64 = w.procs.iter().map(|p| p.storage_bytes.unwrap_or(0) + p.mmap_bytes.unwrap_or(0)).sum();
    if file_bytes > 0
        || paged as f64 / secs > rules::HANG_MAX_PAGED_BYTES_PER_S
        || ipc as f64 / secs > rules::HANG_MAX_IPC_BYTES_PER_S
    {
        return None;
    }
    let worker_tgids: Vec<u32> = workers.iter().map(|p| p.tgid).collect();
    if main.woken_by.iter().any(|b| worker_tgids.contains(&b.tgid) && b.count > 0) {
        return None;
    }
    for p in workers {
        if p.threads.iter().any(|t| Shares::of(t, secs).on > rules::HANG_MAX_ON_CPU) {
            return None;
        }
    }
    let mut blocked = Vec::new();
    for p in std::iter::once(trainer).chain(workers.iter().copied()) {
        for t in p.threads.iter().filter(|t| t.alive && !t.now.running) {
            blocked.push(BlockedThread {
                comm: t.comm.clone(),
                tid: t.tid,
                reason: t.now.reason,
                syscall: t.now.syscall,
            });
        }
    }
    Some(NoProgress { blocked })
}
