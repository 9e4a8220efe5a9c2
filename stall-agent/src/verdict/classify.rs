//! The rules: from a window of the job, its roles and its GPUs to a
//! [`Finding`], the kind with the facts that decided it. No words here; see
//! `words` for how a finding is told.
use std::collections::HashSet;

use stall_common::reason;

use super::{
    hang, rules,
    shares::{self, Shares},
    Kind,
};
use crate::{
    aggregate::{ProcWindow, ThreadWindow, Waker, Window},
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
    /// The trainer waits, its workers wake it but spend their time waiting
    /// on something that is neither storage, the network nor the CPU:
    /// asleep (`reason` sleep) or in another call (`other`, named).
    InputWait {
        waits: f64,
        reason: u8,
        share: f64,
    },
    /// The trainer waits for a child process (`wait4`, `waitid`) that is
    /// on CPU: an evaluation, a conversion run as a subprocess.
    ChildBusy {
        waits: f64,
        child: &'a ProcWindow,
        cpu: f64,
    },
    /// The trainer waits on its own file reads, without workers.
    TrainerReads {
        own_io: f64,
    },
    /// The trainer is blocked writing or syncing files (checkpoints, logs),
    /// or writing into a pipe or socket whose reader is slow (stdout into a
    /// log shipper, an upload), more than it waits for its input.
    OutputIo {
        /// Its share blocked writing, syncing and sending; syncing alone;
        /// sending alone (pipes and sockets).
        out: f64,
        sync: f64,
        send: f64,
    },
    /// The trainer waits on threads of its own that read its input (loader
    /// threads: a thread pool, tf.data-style readers): `io` and `cpu` are
    /// their mean shares in file reads and wanting the CPU.
    LoaderThreads {
        waits: f64,
        threads: Vec<&'a ThreadWindow>,
        io: f64,
        cpu: f64,
    },
    /// The trainer waits on another thread of its own that is on CPU and
    /// reads no input (one holding Python's GIL, a metrics or logging
    /// thread): the trainer process is what is busy.
    OwnThreadBusy {
        waits: f64,
        thread: &'a ThreadWindow,
        cpu: f64,
        /// Share of the trainer's wakeups it made.
        wakes: f64,
        /// Share of the window the main thread was blocked in waits it
        /// ended, where the kernel timed them.
        waited: Option<f64>,
    },
    /// The trainer's main thread spends its time inside CUDA's
    /// synchronizations (seen by the GPU library probes): it waits for its
    /// GPU, spinning or not.
    GpuWait {
        sync: f64,
    },
    /// The trainer's main thread spends its time in synchronous copies
    /// between host and device memory.
    GpuCopies {
        copy: f64,
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
            Finding::GpuBusy(_) | Finding::GpuWait { .. } => Kind::GpuBusy,
            Finding::GpuCopies { .. } => Kind::TrainerHostBound,
            Finding::NotEnoughData | Finding::TrainerUntraced | Finding::NoSingleBottleneck => Kind::Unknown,
            Finding::HangBehindBusyGpu(_) | Finding::HangNoProgress(_) => Kind::Hang,
            Finding::InputIo { .. } | Finding::InputNet { .. } | Finding::TrainerReads { .. } => {
                Kind::InputIoBound
            }
            Finding::InputCpu { .. } => Kind::InputCpuBound,
            Finding::InputWait { .. } => Kind::InputWaitBound,
            Finding::ChildBusy { .. } => Kind::TrainerHostBound,
            Finding::LoaderThreads { io, cpu, .. } => {
                if io >= cpu {
                    Kind::InputIoBound
                } else {
                    Kind::InputCpuBound
                }
            }
            Finding::OutputIo { .. } => Kind::OutputIoBound,
            Finding::TrainerBusy { .. } | Finding::OwnThreadBusy { .. } => Kind::TrainerHostBound,
            Finding::Idle { .. } => Kind::Idle,
        }
    }

    /// Threads of the trainer the finding names besides its main thread,
    /// and as what.
    pub fn named_threads(&self) -> Vec<(u32, &'static str)> {
        match self {
            Finding::LoaderThreads { threads, .. } => {
                threads.iter().map(|t| (t.tid, "loader thread")).collect()
            }
            Finding::OwnThreadBusy { thread, .. } => vec![(thread.tid, "busy thread of the trainer")],
            Finding::ChildBusy { child, .. } => {
                child.main_thread().map(|t| vec![(t.tid, "child the trainer waits for")]).unwrap_or_default()
            }
            _ => Vec::new(),
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
    if let Some(h) = hang::no_progress(s.w, trainer, main, &tm, &s.workers, s.secs, s.progress) {
        return Finding::HangNoProgress(h);
    }
    // Inside the job's own CUDA calls: a thread spinning in a stream
    // synchronization is on CPU, and waits for its GPU all the same.
    let in_gpu = |ns: u64| ns as f64 / 1e9 / s.secs;
    let (sync, copy) = (in_gpu(main.delta.gpu.sync_ns), in_gpu(main.delta.gpu.copy_ns));
    if sync >= rules::GPU_SYNC_WAIT && sync >= copy {
        return Finding::GpuWait { sync };
    }
    if copy >= rules::GPU_COPY_SHARE {
        return Finding::GpuCopies { copy };
    }

    let waits = tm.r(reason::FUTEX) + tm.r(reason::POLL);
    let own_io = tm.r(reason::IO);
    let out = tm.r(reason::WRITE) + tm.r(reason::SYNC) + tm.r(reason::SEND);
    if out >= rules::TRAINER_OUTPUT && out >= waits + own_io {
        return Finding::OutputIo { out, sync: tm.r(reason::SYNC), send: tm.r(reason::SEND) };
    }
    if let Some(f) = busy_child(s, trainer, main, &tm) {
        return f;
    }
    let (worker_io, worker_cpu) = worker_shares(&s.workers, s.secs);
    // Of the time it could act (throttled by its CPU limit or waiting for
    // a CPU, it can do nothing, wait or work): a trainer held back by the
    // same quota as its workers, or crowded off a host they keep busy,
    // still waits on them for most of what it was given.
    let free = (1.0 - tm.r(reason::THROTTLED) - tm.r(reason::RUNQUEUE)).max(0.1);
    if (waits + own_io) / free >= rules::TRAINER_WAITS {
        let waits = waits + own_io;
        // Follow the wait: when the trainer's own threads end more of its
        // waits than the worker processes do, they are what it waits for.
        if let Some(f) = own_threads(trainer, main, &s.workers, s.secs, waits) {
            return f;
        }
        // Workers that feed the trainer but spend their time asleep (a rate
        // limit, a retry back-off) or in another named call (a lock).
        let fed = main.woken_by.iter().any(|b| b.count > 0 && s.workers.iter().any(|w| w.tgid == b.tgid));
        if fed {
            let (reason, share) = [reason::SLEEP, reason::OTHER]
                .into_iter()
                .map(|r| (r, mean_share(&s.workers, s.secs, r)))
                .fold((reason::SLEEP, 0.0), |a, b| if b.1 > a.1 { b } else { a });
            let poll = mean_share(&s.workers, s.secs, reason::POLL);
            if share >= rules::WORKER_SHARE && share >= worker_io.max(worker_cpu).max(poll) {
                return Finding::InputWait { waits, reason, share };
            }
        }
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
        // Of its own time in file reads, what loaded its code from storage
        // (a lazy `import` at the first step, a library mapped at first
        // use) was no wait for input.
        let own_input_io = own_io * (1.0 - trainer.code_storage_share());
        if own_input_io >= rules::WORKER_SHARE {
            return Finding::TrainerReads { own_io: own_input_io };
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

/// The trainer's own threads as what its main thread waits for: they woke
/// it more often than the worker processes did, and either read input and
/// spend their time in it (loader threads) or hold the CPU without input
/// (a thread holding the GIL). None: the workers (or nobody) end its waits.
fn own_threads<'a>(
    trainer: &'a ProcWindow,
    main: &ThreadWindow,
    workers: &[&ProcWindow],
    secs: f64,
    waits: f64,
) -> Option<Finding<'a>> {
    let worker_tgids: HashSet<u32> = workers.iter().map(|p| p.tgid).collect();
    // Who ended more of its waiting: by the blocked time each ended where
    // the kernel timed it, else by how often each woke it.
    let timed = main.woken_by.iter().any(|b| b.blocked_ns > 0);
    let weight = |b: &Waker| if timed { b.blocked_ns } else { b.count };
    let by_workers: u64 = main.woken_by.iter().filter(|b| worker_tgids.contains(&b.tgid)).map(weight).sum();
    let own: Vec<(&ThreadWindow, &Waker)> = main
        .woken_by
        .iter()
        .filter(|b| b.tgid == trainer.tgid && b.count > 0)
        .filter_map(|b| {
            let tid = b.thread().filter(|t| *t != main.tid)?;
            Some((trainer.threads.iter().find(|t| t.tid == tid)?, b))
        })
        .collect();
    let by_own: u64 = own.iter().map(|(_, b)| weight(b)).sum();
    if own.is_empty() || by_own <= by_workers {
        return None;
    }
    let readers: Vec<&ThreadWindow> = own
        .iter()
        .map(|(t, _)| *t)
        .filter(|t| t.delta.file_read_bytes + t.delta.other_read_bytes > 0)
        .collect();
    if !readers.is_empty() {
        let io = shares::mean(readers.iter().copied(), secs, |s| s.r(reason::IO));
        let cpu = shares::mean(readers.iter().copied(), secs, Shares::cpu);
        if io.max(cpu) >= rules::WORKER_SHARE {
            return Some(Finding::LoaderThreads { waits, threads: readers, io, cpu });
        }
        return None;
    }
    let (thread, by) = own.iter().max_by_key(|(t, b)| (weight(b), std::cmp::Reverse(t.tid)))?;
    let cpu = Shares::of(thread, secs).cpu();
    let all: u64 = main.woken_by.iter().map(|b| b.count).sum();
    (cpu >= rules::TRAINER_BUSY).then(|| Finding::OwnThreadBusy {
        waits,
        thread,
        cpu,
        wakes: by.count as f64 / all.max(1) as f64,
        waited: timed.then(|| Shares::part(main, secs, by.blocked_ns)),
    })
}

/// The trainer's main thread waits for a child (`wait4`, `waitid`) most
/// of the window, and the child it waits for is on CPU.
fn busy_child<'a>(
    s: &Scene<'a>,
    trainer: &ProcWindow,
    main: &ThreadWindow,
    tm: &Shares,
) -> Option<Finding<'a>> {
    let waits = tm.r(reason::OTHER);
    let waiting = ["wait4", "waitid"].contains(&crate::syscalls::name(i64::from(main.other_nr)).as_str());
    if !waiting || waits < rules::TRAINER_WAITS {
        return None;
    }
    // The one /proc named, else the busiest of its children in the window.
    let named: Vec<u32> = match &main.waits_on {
        Some((_, crate::wait::WaitObject::Child { children })) => children.iter().map(|c| c.pid).collect(),
        _ => Vec::new(),
    };
    let (child, cpu) =
        s.w.procs
            .iter()
            .filter(|p| p.ppid == Some(trainer.tgid) && (named.is_empty() || named.contains(&p.tgid)))
            .filter_map(|p| Some((p, Shares::of(p.main_thread()?, s.secs).cpu())))
            .max_by(|a, b| a.1.total_cmp(&b.1))?;
    (cpu >= rules::TRAINER_BUSY).then_some(Finding::ChildBusy { waits, child, cpu })
}

/// A reason's share of the workers' main threads, averaged.
fn mean_share(workers: &[&ProcWindow], secs: f64, r: u8) -> f64 {
    shares::mean(workers.iter().filter_map(|p| p.main_thread()), secs, |s| s.r(r))
}

/// I/O and CPU shares of the workers' main threads, averaged.
fn worker_shares(workers: &[&ProcWindow], secs: f64) -> (f64, f64) {
    let mains = || workers.iter().filter_map(|p| p.main_thread());
    (shares::mean(mains(), secs, |s| s.r(reason::IO)), shares::mean(mains(), secs, Shares::cpu))
}
