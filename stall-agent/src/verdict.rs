//! Why is the GPU idle? One verdict with numbers, from a window of the job
//! (roles assigned) and what the GPUs did meanwhile. Pure; see
//! docs/VERDICTS.md for the kinds and their rules.
//!
//! `classify` applies the rules and finds a kind with its facts; `words`
//! tells that finding with numbers; `kind` holds all a kind is.
use serde::Serialize;

use crate::{
    aggregate::Window, correlate::Roles, detail::Text, gpu, progress::ProgressView, pystack::PyStack,
};

mod child;
mod classify;
mod hang;
mod kind;
mod path;
mod run;
mod shares;
mod trainer;
mod words;

pub use kind::Kind;
pub use path::PathStep;
pub use run::{collective_waits, Collectives, RankVerdict, RunVerdict, Straggler};
// Until every user imports it from `gpu`.
pub use gpu::GpuWindow;

#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct Verdict {
    pub kind: Kind,
    /// Words with their details marked ([`crate::detail`]).
    pub summary: Text,
    pub evidence: Vec<Text>,
    /// The path followed from the trainer's main thread to where its time
    /// goes, each step with its share (empty: no trainer to start from).
    pub path: Vec<PathStep>,
    /// No GPU data: the verdict is about the host side only.
    pub host_only: bool,
    /// The threads the verdict names (whose Python stacks are worth reading).
    #[serde(skip)]
    pub blamed: Vec<Blamed>,
    /// Python stacks of the blamed threads, when read (see `pystack`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub python_stacks: Vec<PyStack>,
    /// Why some blamed processes' stacks could not be read, one line each.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub python_notes: Vec<String>,
    /// A distributed run: its ranks' verdicts and its straggler (`ranks`,
    /// `straggler` beside the other fields; absent for one trainer).
    #[serde(flatten)]
    pub run: Option<RunVerdict>,
}

/// A thread a verdict names, and as what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blamed {
    pub pid: u32,
    pub tid: u32,
    pub what: &'static str,
}

/// Thresholds, in one place so docs and tests can name them.
pub mod rules {
    pub use crate::gpu::IDLE_UTIL_PCT;
    /// Mean utilization at or above this: the GPU is doing its job.
    pub const GPU_BUSY_PCT: f64 = 60.0;
    /// Below this the window says too little.
    pub const MIN_WINDOW_S: f64 = 0.5;
    /// Trainer waiting (futex + poll + its own file I/O) at least this share.
    pub const TRAINER_WAITS: f64 = 0.5;
    /// Workers' I/O or CPU share that names the bottleneck.
    pub const WORKER_SHARE: f64 = 0.3;
    /// Trainer blocked writing and syncing files at least this share (and
    /// more than it waits for input): output-I/O-bound.
    pub const TRAINER_OUTPUT: f64 = 0.3;
    /// Trainer on CPU at least this share: host-bound.
    pub const TRAINER_BUSY: f64 = 0.5;
    /// Trainer on CPU and waiting for a busy thread of its own (a GIL
    /// holder) together at least this share, neither alone enough:
    /// host-bound all the same.
    pub const TRAINER_HOST: f64 = 0.8;
    /// Hang: the trainer and its workers show no progress for this long.
    pub const HANG_MIN_S: f64 = 4.0;
    /// Hang: at most this on-CPU share for each of them.
    pub const HANG_MAX_ON_CPU: f64 = 0.05;
    /// Hang: pipe/socket bytes below this are status checks, not batches.
    pub const HANG_MAX_IPC_BYTES_PER_S: f64 = 16_384.0;
    /// Hang: pages brought in below this are a heartbeat's (the directory
    /// and inode blocks a status file rewritten now and then reads), not
    /// work: an import or teardown faulting its libraries in reads
    /// hundreds of pages a second.
    pub const HANG_MAX_PAGED_BYTES_PER_S: f64 = 16_384.0;
    /// Idle: the whole job uses less than this share of one CPU.
    pub const IDLE_MAX_CPU: f64 = 0.05;
    /// Hang behind a busy GPU: silent for this many times the job's own
    /// rhythm (its longest gap between reads and writes while it ran)...
    pub const SILENT_RHYTHMS: f64 = 3.0;
    /// ...and for at least this long.
    pub const SILENT_MIN_S: f64 = 10.0;
    /// ...or, for a job never seen to move and with no output open at
    /// attach (no rhythm to go by), this long.
    pub const SILENT_UNKNOWN_S: f64 = 60.0;
    /// A GPU drawing at least this share of its power limit is computing,
    /// however long the job is silent (a long step, an evaluation).
    pub const GPU_WORKING_POWER: f64 = 0.5;
    /// A busy GPU below this share of its power limit has a kernel resident
    /// but barely computes (a spinning collective, a wedged kernel).
    pub const GPU_LOW_POWER: f64 = 0.25;
    /// The share of its window a main thread waited for one thread, in
    /// waits that thread ended, from which the line says how long.
    pub const WAITED_NAMED: f64 = 0.1;
    /// Share of the window a trainer's main thread spent inside CUDA's
    /// synchronizations (uprobes) from which it waits for its GPU, on CPU
    /// or not (CUDA's default schedule spins).
    pub const GPU_SYNC_WAIT: f64 = 0.5;
    /// Share of the window inside synchronous host↔device copies from
    /// which they are what holds the trainer.
    pub const GPU_COPY_SHARE: f64 = 0.3;
    /// Kernel launches per second of a busy trainer from which its line
    /// names them: a host that cannot launch fast enough.
    pub const LAUNCHES_NAMED_PER_S: f64 = 1000.0;
    /// NCCL collectives a rank must have made (compared with other ranks'
    /// where their arrivals were) before its lateness says anything.
    pub const COLLECTIVES_COMPARED: u64 = 3;
    /// A rank calling the collectives this much later than the first rank
    /// on average (or waiting this much less than the others)...
    pub const COLLECTIVE_LATE_S: f64 = 0.02;
    /// ...and last at this share of them holds the run.
    pub const COLLECTIVE_LAST_SHARE: f64 = 0.5;
    /// A process outside the job that feeds the trainer (a server it asks,
    /// a program writing its pipe), on CPU this much of its recent past
    /// (in CPUs), is what the trainer's input waits for.
    pub const PEER_BUSY: f64 = 0.5;
}

/// `w`: the window judged (the last few seconds live, the whole run at the
/// end); `progress`: when the job last moved, which spans more than `w`.
pub fn judge(w: &Window, roles: &Roles, gpus: &[gpu::GpuWindow], progress: &ProgressView) -> Verdict {
    if roles.ranks.len() > 1 {
        return run::judge(w, roles, gpus, progress, &Default::default());
    }
    trainer::judge(w, roles, gpus, progress)
}

/// A run judged again once its trainers' Python stacks say which ranks wait
/// inside a collective ([`collective_waits`]).
pub fn judge_placed(
    w: &Window,
    roles: &Roles,
    gpus: &[gpu::GpuWindow],
    progress: &ProgressView,
    in_collective: &std::collections::HashMap<u32, bool>,
) -> Verdict {
    run::judge(w, roles, gpus, progress, in_collective)
}

/// Worker lines in the evidence, and workers blamed, at most.
const MAX_WORKER_LINES: usize = 8;

#[cfg(test)]
mod tests;
