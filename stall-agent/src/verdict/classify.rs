//! The rules: from a window of the job, its roles and its GPUs to a
//! [`Finding`], the kind with the facts that decided it. No words here; see
//! `words` for how a finding is told.
use std::collections::HashSet;

use stall_common::reason;

use super::{
    child::{self, ChildWait},
    hang, rules,
    shares::{self, Shares},
    Kind,
};
use crate::{
    aggregate::{ProcWindow, ThreadWindow, Waker, Window},
    correlate::Roles,
    gpu::GpuWindow,
    progress::ProgressView,
    wait::Party,
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
    /// The trainer waits for a child process (`wait4`, `waitid`), followed
    /// to the children that do the work (`child::follow`).
    Child(ChildWait<'a>),
    /// The trainer waits on its own file reads, without workers.
    TrainerReads {
        own_io: f64,
    },
    /// The trainer's main thread waits reading a socket or a pipe that
    /// programs outside the job feed (a data server streaming samples, a
    /// decoder writing into a pipe), woken by them or the network: its
    /// input comes in slowly. `bytes` it read from it in the window.
    TrainerStream {
        wait: f64,
        bytes: u64,
        /// A socket's peer (input-io-bound), else a pipe's writers
        /// (input-wait-bound: the writer's pace).
        network: bool,
        /// The process at the other end, on this host, and what it did.
        peer: Option<&'a Party>,
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
    /// The trainer waits on another thread of its own that is neither
    /// busy nor reading input for it, nor woken by its workers: the
    /// trainer waits on what that thread waits for. Writing (an upload, a
    /// checkpoint saved in the background): output-bound; asleep (a rate
    /// limit, a poll interval): a wait on its sleeps; else on something
    /// outside the process (a peer's socket, a remote service), no input
    /// stall, and in a run a wait for peers.
    OwnThreadWaits {
        waits: f64,
        thread: &'a ThreadWindow,
        /// The thread's longest wait and its share of the window.
        state: u8,
        share: f64,
        /// As [`Finding::OwnThreadBusy`]'s.
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
            Finding::OwnThreadWaits { state, .. } | Finding::Child(ChildWait { state: Some(state), .. }) => {
                followed_wait(*state)
            }
            Finding::Child(ChildWait { state: None, .. }) => Kind::TrainerHostBound,
            // A process seen on this host doing neither sends at its own
            // pace (a rate limit, a wait of its own): no network is slow.
            Finding::TrainerStream { peer: Some(p @ Party { activity: Some(_), .. }), .. } => {
                match peer_work(p) {
                    Some(PeerWork::Cpu) => Kind::InputCpuBound,
                    Some(PeerWork::Storage) => Kind::InputIoBound,
                    None => Kind::InputWaitBound,
                }
            }
            Finding::TrainerStream { network: true, .. } => Kind::InputIoBound,
            Finding::TrainerStream { network: false, .. } => Kind::InputWaitBound,
            Finding::HangBehindBusyGpu(_) | Finding::HangNoProgress(_) => Kind::Hang,
            Finding::InputIo { .. } | Finding::InputNet { .. } | Finding::TrainerReads { .. } => {
                Kind::InputIoBound
            }
            Finding::InputCpu { .. } => Kind::InputCpuBound,
            Finding::InputWait { .. } => Kind::InputWaitBound,
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

    /// Threads the finding names besides the trainer's main thread, by
    /// process, and as what.
    pub fn named_threads(&self, trainer: u32) -> Vec<(u32, u32, &'static str)> {
        match self {
            Finding::LoaderThreads { threads, .. } => {
                threads.iter().map(|t| (trainer, t.tid, "loader thread")).collect()
            }
            Finding::OwnThreadBusy { thread, .. } => {
                vec![(trainer, thread.tid, "busy thread of the trainer")]
            }
            Finding::OwnThreadWaits { thread, .. } => {
                vec![(trainer, thread.tid, "thread the trainer waits for")]
            }
            Finding::Child(c) => {
                let via = c.via.iter().flatten().map(|p| (*p, "child the wait goes through"));
                let end = c.children.iter().map(|p| (*p, "child the trainer waits for"));
                via.chain(end).filter_map(|(p, what)| Some((p.tgid, p.main_thread()?.tid, what))).collect()
            }
            _ => Vec::new(),
        }
    }
}

/// What a process outside the job that feeds the trainer spends its time
/// on, where that is its own work: the CPU, or reads from storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PeerWork {
    Cpu,
    Storage,
}

pub(super) fn peer_work(p: &Party) -> Option<PeerWork> {
    let a = p.activity?;
    if a.cpu() >= rules::PEER_BUSY {
        return Some(PeerWork::Cpu);
    }
    (a.storage_read_bytes >= crate::aggregate::DATA_MIN_BYTES).then_some(PeerWork::Storage)
}

/// The kind of a wait the trainer's wait leads to, in a thread of its own
/// or a child: writing (an upload, a checkpoint): output-bound; asleep (a
/// rate limit, a poll interval): a wait on those sleeps; reading files:
/// input-bound on storage; else outside the job (a peer, a service).
fn followed_wait(state: u8) -> Kind {
    match state {
        reason::SEND | reason::WRITE | reason::SYNC => Kind::OutputIoBound,
        reason::SLEEP => Kind::InputWaitBound,
        reason::IO => Kind::InputIoBound,
        _ => Kind::Unknown,
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
    if let Some(c) = child::follow(s.w, trainer, main, tm.r(reason::OTHER), s.secs) {
        return Finding::Child(c);
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
        // Waiting for a CPU on a crowded host is none of the workers' own
        // work: reads that take at least as long as their time on a CPU
        // (and under their CPU limit) hold them, whatever the host's queue
        // adds (a throttled rank among busy ones on few CPUs).
        let worker_queue = mean_share(&s.workers, s.secs, reason::RUNQUEUE);
        if !s.workers.is_empty() && worker_io >= rules::WORKER_SHARE && worker_io >= worker_cpu - worker_queue
        {
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
        if let Some(f) = streamed_in(s, trainer, main, &tm) {
            return f;
        }
    }
    // Its time split between its own work and waits that a busy thread of
    // its own ends (the GIL's holder, on a slow CPU, takes the GIL back
    // as often as the main thread's own bytecode runs): host-bound all the
    // same.
    if waits >= rules::WORKER_SHARE && tm.cpu() + waits >= rules::TRAINER_HOST {
        if let Some(f @ Finding::OwnThreadBusy { .. }) = own_threads(trainer, main, &s.workers, s.secs, waits)
        {
            return f;
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

/// How much of `t`'s waiting a waker ended: the blocked time it ended
/// where the kernel timed `t`'s waits, else how often it woke `t`.
fn waker_weight(t: &ThreadWindow) -> impl Fn(&Waker) -> u64 {
    let timed = t.woken_by.iter().any(|b| b.blocked_ns > 0);
    move |b| if timed { b.blocked_ns } else { b.count }
}

/// The part of `t`'s waiting that the wakers `pick` chooses ended, and
/// the whole, weighed by [`waker_weight`].
fn ended_by(t: &ThreadWindow, pick: impl Fn(&Waker) -> bool) -> (u64, u64) {
    let weight = waker_weight(t);
    let all = t.woken_by.iter().map(&weight).sum();
    (t.woken_by.iter().filter(|b| pick(b)).map(&weight).sum(), all)
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
    let weight = waker_weight(main);
    let (by_workers, _) = ended_by(main, |b| worker_tgids.contains(&b.tgid));
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
    }
    let (thread, by) = own.iter().max_by_key(|(t, b)| (weight(b), std::cmp::Reverse(t.tid)))?;
    let share = Shares::of(thread, secs);
    let waited = timed.then(|| Shares::part(main, secs, by.blocked_ns));
    if readers.is_empty() && share.cpu() >= rules::TRAINER_BUSY {
        let all: u64 = main.woken_by.iter().map(|b| b.count).sum();
        let wakes = by.count as f64 / all.max(1) as f64;
        return Some(Finding::OwnThreadBusy { waits, thread, cpu: share.cpu(), wakes, waited });
    }
    // Follow the wait one more step: a thread the workers wake (PyTorch's
    // pin-memory thread, a queue's feeder) hands on what they deliver, and
    // they are what the trainer waits for.
    let (fed, all) = ended_by(thread, |b| worker_tgids.contains(&b.tgid));
    let (state, blocked) = share.top_wait();
    if (all > 0 && fed * 2 >= all) || blocked < rules::WORKER_SHARE {
        return None;
    }
    // A wait that leaves the trainer (a collective's thread on its peers'
    // sockets) outweighs the workers only clearly: where they ended at
    // least half as much of its waiting, they are a cause of their own,
    // for the worker rules to judge (a rank whose input is slow waits on
    // both).
    if followed_wait(state) == Kind::Unknown && by_own < 2 * by_workers {
        return None;
    }
    Some(Finding::OwnThreadWaits { waits, thread, state, share: blocked, waited })
}

/// The trainer's main thread waits ≥ 30 % reading a socket or pipe that
/// brought it ≥ [`crate::aggregate::DATA_MIN_BYTES`], and what ended most
/// of its blocked time came from outside the job (the network's
/// interrupts, the program writing the pipe): its input streams in.
fn streamed_in<'a>(
    s: &Scene<'a>,
    trainer: &ProcWindow,
    main: &'a ThreadWindow,
    tm: &Shares,
) -> Option<Finding<'a>> {
    use crate::wait::WaitObject;
    let wait = tm.r(reason::POLL);
    if wait < rules::WORKER_SHARE {
        return None;
    }
    let job: HashSet<u32> = s.w.procs.iter().map(|p| p.tgid).collect();
    let outside = |others: &'a [Party]| {
        (!others.is_empty() && others.iter().all(|p| !job.contains(&p.pid))).then(|| &others[0])
    };
    let (network, bytes, peer) = match main.wait_object(reason::POLL)? {
        // From that peer, where it is outside the job (a job's peer is IPC).
        WaitObject::Socket { peer: Some(peer), others, .. } => {
            let from = trainer.sockets.iter().find(|x| x.path == peer.value())?;
            (true, if from.ipc { 0 } else { from.read_bytes }, outside(others))
        }
        // A Unix socket to a process outside the job (a feature server).
        WaitObject::Socket { peer: None, others, .. } => {
            let peer = outside(others)?;
            (true, main.delta.other_read_bytes, Some(peer))
        }
        WaitObject::Pipe { writing: false, others, .. } if others.iter().all(|p| !job.contains(&p.pid)) => {
            (false, main.delta.other_read_bytes, outside(others))
        }
        _ => return None,
    };
    // A process on this host seen doing its own work feeds the trainer
    // whatever the size of its answers (a model server's scores).
    let fed = bytes >= crate::aggregate::DATA_MIN_BYTES || peer.is_some_and(|p| peer_work(p).is_some());
    let (from_outside, all) = ended_by(main, |b| !job.contains(&b.tgid));
    (fed && from_outside * 2 > all).then_some(Finding::TrainerStream { wait, bytes, network, peer })
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
