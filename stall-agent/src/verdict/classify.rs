//! The rules: from a window of the job, its roles and its GPUs to a
//! [`Finding`], the kind with the facts that decided it. No words here; see
//! `words` for how a finding is told.
use std::collections::HashSet;

use stall_common::reason;

use super::{hang, rules, shares::Shares, Kind};
use crate::{
    aggregate::{ProcWindow, ThreadWindow, Window},
    correlate::Roles,
    gpu::GpuWindow,
    progress::ProgressView,
};

/// What the rules look at: the window, and the job's parts found in it.
pub(super) struct Scene<'a> {
    pub w: &'a Window,
    pub gpus: &'a [GpuWindow],
    pub progress: &'a ProgressView,
    pub secs: f64,
    /// The first GPU busy at least `GPU_BUSY_PCT`.
    pub busy: Option<&'a GpuWindow>,
    /// The trainer's process, once the window is long enough to judge.
    pub trainer: Option<&'a ProcWindow>,
    /// The trainer's main thread, and its shares of the window.
    pub main: Option<(&'a ThreadWindow, Shares)>,
    pub workers: Vec<&'a ProcWindow>,
}

impl<'a> Scene<'a> {
    pub fn of(w: &'a Window, roles: &Roles, gpus: &'a [GpuWindow], progress: &'a ProgressView) -> Self {
        let secs = w.secs();
        let trainer = roles.trainers.iter().find_map(|t| w.proc(*t)).filter(|_| secs >= rules::MIN_WINDOW_S);
        let main = trainer.and_then(ProcWindow::main_thread).map(|m| (m, Shares::of(m, secs)));
        let worker_set: HashSet<u32> = roles.workers.iter().copied().collect();
        Self {
            w,
            gpus,
            progress,
            secs,
            busy: gpus.iter().find(|g| g.util_mean_pct >= rules::GPU_BUSY_PCT),
            trainer,
            main,
            workers: w.procs.iter().filter(|p| worker_set.contains(&p.tgid)).collect(),
        }
    }

    pub fn host_only(&self) -> bool {
        self.gpus.is_empty()
    }

    /// Bytes the workers took in (read and mapped).
    pub fn reader_bytes(&self) -> u64 {
        self.workers.iter().map(|p| p.input_bytes()).sum()
    }
}

/// A kind and the facts that decided it.
pub(super) enum Finding<'a> {
    GpuBusy(&'a GpuWindow),
    /// The window is too short, or has no trainer.
    NotEnoughData,
    /// The trainer is known, but none of its threads was traced.
    TrainerUntraced,
    HangBehindBusyGpu(hang::BehindBusyGpu<'a>),
    HangNoProgress(hang::NoProgress),
    /// The trainer waits, its workers wait on file reads.
    InputIo {
        waits: f64,
        worker_io: f64,
    },
    /// The trainer waits, its workers wait on peers outside the job that
    /// send them their samples (an object store, an HTTP server).
    InputNet {
        waits: f64,
        worker_wait: f64,
    },
    /// The trainer waits, its workers want the CPU (on it, waiting for
    /// one, or held back by a CPU limit).
    InputCpu {
        waits: f64,
    },
    /// The trainer waits on its own file reads, without workers.
    TrainerReads {
        own_io: f64,
    },
    /// The trainer is blocked writing or syncing files (checkpoints, logs)
    /// more than it waits for its input.
    OutputIo {
        /// Its share blocked writing and syncing, and syncing alone.
        out: f64,
        sync: f64,
    },
    /// The trainer's main thread is on CPU (or waiting for one).
    TrainerBusy {
        cpu: f64,
    },
    /// Nobody uses a CPU or reads a file.
    Idle {
        job_cpu: f64,
    },
    NoSingleBottleneck,
}

impl Finding<'_> {
    pub fn kind(&self) -> Kind {
        match self {
            Finding::GpuBusy(_) => Kind::GpuBusy,
            Finding::NotEnoughData | Finding::TrainerUntraced | Finding::NoSingleBottleneck => Kind::Unknown,
            Finding::HangBehindBusyGpu(_) | Finding::HangNoProgress(_) => Kind::Hang,
            Finding::InputIo { .. } | Finding::InputNet { .. } | Finding::TrainerReads { .. } => {
                Kind::InputIoBound
            }
            Finding::InputCpu { .. } => Kind::InputCpuBound,
            Finding::OutputIo { .. } => Kind::OutputIoBound,
            Finding::TrainerBusy { .. } => Kind::TrainerHostBound,
            Finding::Idle { .. } => Kind::Idle,
        }
    }
}

/// The rules, in order (docs/VERDICTS.md): a busy GPU, a hang, then what
/// the trainer waits for.
pub(super) fn classify<'a>(s: &Scene<'a>) -> Finding<'a> {
    let (Some(trainer), Some((main, tm))) = (s.trainer, s.main) else {
        if let Some(busy) = s.busy {
            return Finding::GpuBusy(busy);
        }
        return if s.trainer.is_some() { Finding::TrainerUntraced } else { Finding::NotEnoughData };
    };
    if let Some(busy) = s.busy {
        if let Some(h) = hang::behind_busy_gpu(busy, main, &tm, s.progress) {
            return Finding::HangBehindBusyGpu(h);
        }
        return Finding::GpuBusy(busy);
    }
    if let Some(h) = hang::no_progress(s.w, trainer, main, &tm, &s.workers, s.secs) {
        return Finding::HangNoProgress(h);
    }

    let waits = tm.r(reason::FUTEX) + tm.r(reason::POLL);
    let own_io = tm.r(reason::IO);
    let out = tm.r(reason::WRITE) + tm.r(reason::SYNC);
    if out >= rules::TRAINER_OUTPUT && out >= waits + own_io {
        return Finding::OutputIo { out, sync: tm.r(reason::SYNC) };
    }
    let (worker_io, worker_cpu) = worker_shares(&s.workers, s.secs);
    // Of the time it could act (throttled by its CPU limit or waiting for
    // a CPU, it can do nothing, wait or work): a trainer held back by the
    // same quota as its workers, or crowded off a host they keep busy,
    // still waits on them for most of what it was given.
    let free = (1.0 - tm.r(reason::THROTTLED) - tm.r(reason::RUNQUEUE)).max(0.1);
    if (waits + own_io) / free >= rules::TRAINER_WAITS {
        let waits = waits + own_io;
        if !s.workers.is_empty() && worker_io >= rules::WORKER_SHARE && worker_io >= worker_cpu {
            return Finding::InputIo { waits, worker_io };
        }
        // Waiting on sockets to peers outside the job that carry more than
        // the files do: the samples come over the network.
        let worker_poll = mean_share(&s.workers, s.secs, reason::POLL);
        let net: u64 = s.workers.iter().map(|p| p.network_in()).sum();
        if !s.workers.is_empty()
            && net > 0
            && net >= s.reader_bytes()
            && worker_poll >= rules::WORKER_SHARE
            && worker_poll >= worker_cpu
        {
            return Finding::InputNet { waits, worker_wait: worker_poll };
        }
        if !s.workers.is_empty() && worker_cpu >= rules::WORKER_SHARE && worker_cpu > worker_io {
            return Finding::InputCpu { waits };
        }
        if own_io >= rules::WORKER_SHARE {
            return Finding::TrainerReads { own_io };
        }
    }
    if tm.cpu() >= rules::TRAINER_BUSY {
        return Finding::TrainerBusy { cpu: tm.cpu() };
    }
    let job_cpu: f64 = s.w.procs.iter().map(|p| p.sum().on_cpu_ns as f64).sum::<f64>() / 1e9 / s.secs;
    let file_bytes: u64 = s.w.procs.iter().map(ProcWindow::input_bytes).sum();
    if job_cpu < rules::IDLE_MAX_CPU && file_bytes == 0 {
        return Finding::Idle { job_cpu };
    }
    Finding::NoSingleBottleneck
}

/// A reason's share of the workers' main threads, averaged.
fn mean_share(workers: &[&ProcWindow], secs: f64, r: u8) -> f64 {
    let shares: Vec<f64> =
        workers.iter().filter_map(|p| p.main_thread()).map(|t| Shares::of(t, secs).r(r)).collect();
    if shares.is_empty() {
        return 0.0;
    }
    shares.iter().sum::<f64>() / shares.len() as f64
}

/// I/O and CPU shares of the workers' main threads, averaged.
fn worker_shares(workers: &[&ProcWindow], secs: f64) -> (f64, f64) {
    let shares: Vec<Shares> =
        workers.iter().filter_map(|p| p.main_thread()).map(|t| Shares::of(t, secs)).collect();
    if shares.is_empty() {
        return (0.0, 0.0);
    }
    let n = shares.len() as f64;
    (shares.iter().map(|s| s.r(reason::IO)).sum::<f64>() / n, shares.iter().map(Shares::cpu).sum::<f64>() / n)
}
