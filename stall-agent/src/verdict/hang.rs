//! Hangs: a job that no longer moves. Nothing on CPU and nothing read or
//! written is a hang whatever the GPU says; a GPU that reports busy is
//! only believed while the job progresses or the GPU draws real power.
use stall_common::reason;

use super::{
    power_share, power_words, reason_name, rules, workers_word, GpuWindow, ProcWindow, Shares, ThreadWindow,
    Window,
};
use crate::{capture::syscalls, progress::ProgressView, units};

/// A GPU reports busy, but the job has not moved for much longer than its
/// own rhythm, the trainer waits off-CPU, and the GPU draws little power
/// (or does not say): a kernel spinning or wedged, or a collective waiting
/// for a peer, keeps utilization at 100 % while nothing gets done.
pub(super) fn behind_busy_gpu(
    g: &GpuWindow,
    trainer: &ProcWindow,
    main: &ThreadWindow,
    tm: &Shares,
    progress: &ProgressView,
) -> Option<String> {
    if power_share(g).is_some_and(|s| s >= rules::GPU_WORKING_POWER) {
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
    let (r, share) = tm.top_wait();
    let rhythm = match progress.rhythm_s {
        Some(r) => format!(" (it used to move at least every {})", units::span(r)),
        None => String::new(),
    };
    Some(format!(
        "GPU{} reports {:.0}% busy{}, but nothing progressed for {}{rhythm}{}; trainer main thread (pid {}) blocked in {} {}: utilization is not progress, the job is hung (a kernel spinning or wedged, or a collective waiting for a peer)",
        g.index,
        g.util_mean_pct,
        power_words(g),
        units::span(progress.silent_s),
        stale_output(progress),
        trainer.tgid,
        reason_name(r, main),
        units::pct(share),
    ))
}

/// ": train.log last written 8 min ago", when an output is known.
fn stale_output(progress: &ProgressView) -> String {
    match &progress.last_output {
        Some(o) => format!(": {} last written {} ago", o.path, units::span(o.ago_s)),
        None => String::new(),
    }
}

/// Nobody is on CPU: the trainer and its workers are blocked, nobody reads
/// a file, nobody wakes the trainer. For a GPU that is idle or absent.
pub(super) fn no_progress(
    w: &Window,
    trainer: &ProcWindow,
    main: &ThreadWindow,
    tm: &Shares,
    workers: &[&ProcWindow],
    secs: f64,
    progress: &ProgressView,
) -> Option<String> {
    if secs < rules::HANG_MIN_S || main.now.running || tm.on > rules::HANG_MAX_ON_CPU {
        return None;
    }
    // Sleeping on purpose is idleness, not a hang.
    if tm.r(reason::SLEEP) >= 0.5 || tm.blocked() < 0.9 {
        return None;
    }
    let ipc: u64 = w.procs.iter().map(|p| p.other_read_bytes).sum();
    // Writes are not asked about: with the GPU idle and everyone blocked, a
    // line written now and then is a heartbeat, not a training step.
    let file_bytes: u64 = w.procs.iter().map(ProcWindow::file_read_bytes).sum();
    if file_bytes > 0 || ipc as f64 / secs > rules::HANG_MAX_IPC_BYTES_PER_S {
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
    let mut blocked: Vec<String> = Vec::new();
    for p in std::iter::once(trainer).chain(workers.iter().copied()) {
        for t in p.threads.iter().filter(|t| t.alive && !t.now.running) {
            let r = t.now.reason;
            let what = if r == reason::OTHER || t.now.syscall >= 0 && r != reason::IO {
                format!(
                    "{} in {}",
                    reason::NAMES[usize::from(r).min(5)],
                    syscalls::name(i64::from(t.now.syscall))
                )
            } else {
                reason::NAMES[usize::from(r).min(5)].to_string()
            };
            blocked.push(format!("{} {} ({})", t.comm, t.tid, what));
        }
    }
    let shown = blocked.len().min(8);
    let more =
        if blocked.len() > shown { format!(" and {} more", blocked.len() - shown) } else { String::new() };
    let silent = if progress.known && progress.silent_s > secs {
        format!("for {}", units::span(progress.silent_s))
    } else {
        format!("in the last {}", units::secs(secs))
    };
    Some(format!(
        "No progress {silent}: trainer (pid {}) and {} blocked, no file reads, nobody wakes the trainer{}: the job is hung. Blocked: {}{more}",
        trainer.tgid,
        workers_word(workers.len()),
        stale_output(progress),
        blocked[..shown].join(", ")
    ))
}
