//! How a hang is told: the GPU busy while nothing progresses, or every
//! thread of the job blocked with nobody waking the trainer, naming the
//! blocked threads, what they wait on and the stale output.
use stall_common::reason;

use crate::detail::Name;

use super::{power_words, reason_name, workers_word};
use crate::{
    aggregate::{ProcWindow, ThreadWindow},
    progress::ProgressView,
    syscalls, units,
    verdict::hang::{BehindBusyGpu, NoProgress},
};

pub(super) fn behind_busy_gpu(
    h: &BehindBusyGpu,
    trainer: &ProcWindow,
    main: &ThreadWindow,
    progress: &ProgressView,
) -> String {
    let g = h.gpu;
    let (r, share) = h.wait;
    let rhythm = match progress.rhythm_s {
        Some(r) => format!(" (it used to move at least every {})", units::span(r)),
        None => String::new(),
    };
    format!(
        "GPU{} reports {:.0}% busy{}, but nothing progressed for {}{rhythm}{}; trainer main thread (pid {}) blocked in {} {}: utilization is not progress, the job is hung (a kernel spinning or wedged, or a collective waiting for a peer)",
        g.index,
        g.util_mean_pct,
        power_words(g),
        units::span(progress.silent_s),
        stale_output(progress),
        trainer.tgid,
        reason_name(r, main),
        units::pct(share),
    )
}

pub(super) fn no_progress(
    h: &NoProgress,
    trainer: &ProcWindow,
    workers: usize,
    secs: f64,
    progress: &ProgressView,
) -> String {
    let blocked: Vec<String> = h
        .blocked
        .iter()
        .map(|t| {
            let r = t.reason;
            let call = syscalls::name(i64::from(t.syscall));
            // "futex in futex" says it twice.
            let what = if (r == reason::OTHER || t.syscall >= 0 && r != reason::IO) && call != reason::name(r)
            {
                format!("{} in {call}", reason::name(r))
            } else {
                reason::name(r).to_string()
            };
            let since = if t.for_s >= 1.0 { format!(" for {}", units::span(t.for_s)) } else { String::new() };
            match &t.object {
                Some(o) => {
                    format!("{} {} ({what}{since}: {})", Name::from(t.comm.as_str()), t.tid, o.describe())
                }
                None => format!("{} {} ({what}{since})", Name::from(t.comm.as_str()), t.tid),
            }
        })
        .collect();
    let shown = blocked.len().min(8);
    let more =
        if blocked.len() > shown { format!(" and {} more", blocked.len() - shown) } else { String::new() };
    let silent = if progress.known && progress.silent_s > secs {
        format!("for {}", units::span(progress.silent_s))
    } else {
        format!("in the last {}", units::secs(secs))
    };
    // A trainer without workers is blocked alone ("and 0 workers" said
    // nothing).
    let with = if workers == 0 { String::new() } else { format!(" and {}", workers_word(workers)) };
    let list = if blocked.is_empty() {
        String::new()
    } else {
        format!(". Blocked: {}", blocked[..shown].join(", "))
    };
    format!(
        "No progress {silent}: trainer (pid {}){with} blocked, no file reads, nobody wakes the trainer{}: the job is hung{list}{more}",
        trainer.tgid,
        stale_output(progress),
    )
}

/// ": train.log last written 8 min ago", when an output is known.
fn stale_output(progress: &ProgressView) -> String {
    match &progress.last_output {
        Some(o) => format!(": {} last written {} ago", o.path, units::span(o.ago_s)),
        None => String::new(),
    }
}
