//! Hangs: a job that no longer moves. Nothing on CPU and nothing read or
//! written is a hang whatever the GPU says; a GPU that reports busy is
//! only believed while the job progresses or the GPU draws real power.
use stall_common::reason;

use super::{rules, shares::Shares};
use crate::{
    aggregate::{ProcWindow, ThreadWindow, Window},
    gpu::GpuWindow,
    progress::ProgressView,
    wait::WaitObject,
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
    /// How long it has waited so far.
    pub for_s: f64,
    /// What it waits on, and who holds the other end, where /proc said.
    pub object: Option<WaitObject>,
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

/// How long a job must have been silent to be hung: three of its own
/// gaps between moves, and never less than [`rules::HANG_MIN_S`]. A job
/// whose output moved within its rhythm is not hung, whatever its threads
/// wait in.
pub(in crate::verdict) fn silent_enough(progress: &ProgressView) -> bool {
    !progress.known
        || progress.silent_s
            >= rules::HANG_MIN_S.max(progress.rhythm_s.unwrap_or(0.0) * rules::SILENT_RHYTHMS)
}

/// Nobody is on CPU: the trainer and its workers are blocked, nobody reads
/// a file, nobody wakes the trainer, and the job has been silent beyond its
/// rhythm. For a GPU that is idle or absent.
pub(in crate::verdict) fn no_progress(
    w: &Window,
    trainer: &ProcWindow,
    main: &ThreadWindow,
    tm: &Shares,
    workers: &[&ProcWindow],
    secs: f64,
    progress: &ProgressView,
) -> Option<NoProgress> {
    if secs < rules::HANG_MIN_S || main.now.running || tm.on > rules::HANG_MAX_ON_CPU {
        return None;
    }
    if !silent_enough(progress) {
        return None;
    }
    // Sleeping on purpose is idleness, not a hang; a long write, sync or
    // send (a checkpoint to slow storage, an upload, stdout into a slow
    // pipe) moves data all along.
    let writing = tm.r(reason::WRITE) + tm.r(reason::SYNC) + tm.r(reason::SEND);
    if tm.r(reason::SLEEP) >= 0.5 || writing >= 0.5 || tm.blocked() < 0.9 {
        return None;
    }
    // So does any process of the job blocked half the window on a socket
    // to a peer outside it (a child or a thread uploading a checkpoint in
    // one long send, whose bytes are counted as the call returns). A pipe
    // inside the job is no such thing: a child blocked writing into the
    // pipe its waiting parent never reads is the classic deadlock.
    // What started the trainer (a shell script, a Python parent, a
    // launcher) is no part of its progress: a shell reading its script's
    // next line, or a parent unmapping its libraries, after the trainer
    // ended hung moves nothing.
    let parent = w.procs.iter().filter_map(|p| Some((p.tgid, p.ppid?))).collect();
    let above = crate::correlate::ancestors(std::iter::once(trainer.tgid), &parent);
    let procs = || w.procs.iter().filter(|p| !above.contains(&p.tgid));
    let half = (secs * 0.5 * 1e9) as u64;
    if procs().flat_map(|p| &p.fd_waits).any(|f| f.outside && f.blocked_ns >= half) {
        return None;
    }
    // Bytes through pipes and sockets, either way: batches, an upload.
    let ipc: u64 = procs().map(|p| p.other_read_bytes + p.sum().other_write_bytes).sum();
    // File writes are not asked about here: `silent_enough` has judged
    // them against the job's rhythm (a heartbeat line within it is not a
    // hang; one that stopped three rhythms ago no longer moves anything).
    let file_bytes: u64 = procs().map(ProcWindow::file_read_bytes).sum();
    // Pages faulted in (from storage or the page cache) are work too: a
    // process blocked on its faults (an import, a teardown unmapping its
    // libraries from a cold cache) moves, however slowly. A few pages now
    // and then are not: a heartbeat rewriting a status file reads a
    // directory block.
    let paged: u64 = procs()
        .map(|p| p.storage_bytes.unwrap_or(0) + p.mmap_bytes.unwrap_or(0) + p.mmap_shared_bytes.unwrap_or(0))
        .sum();
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
    // Any thread at work, the trainer's own included (a loader thread, one
    // holding Python's GIL), is no hang.
    for p in std::iter::once(trainer).chain(workers.iter().copied()) {
        if p.threads.iter().any(|t| Shares::of(t, secs).on > rules::HANG_MAX_ON_CPU) {
            return None;
        }
    }
    let mut blocked = Vec::new();
    for p in std::iter::once(trainer).chain(workers.iter().copied()) {
        // Of a process that ended (killed at last, hung) nothing is said
        // now: what its threads' state was at the end is not kept.
        for t in p.threads.iter().filter(|t| t.alive && !t.now.running) {
            blocked.push(BlockedThread {
                comm: t.comm.clone(),
                tid: t.tid,
                reason: t.now.reason,
                syscall: t.now.syscall,
                for_s: t.now.for_ns as f64 / 1e9,
                object: t.wait_object(t.now.reason).cloned(),
            });
        }
    }
    Some(NoProgress { blocked })
}
