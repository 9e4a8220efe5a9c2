//! Where a job is in its startup (imports, spawning workers) and where
//! its steady state starts: the final verdict judges what came after.
use std::collections::{HashSet, VecDeque};

use super::Job;
use crate::{aggregate::Window, correlate::Roles, gpu::GpuWindow};

/// The shortest steady state the final verdict is given alone.
pub(super) const MIN_STEADY_NS: u64 = 1_000_000_000;
/// Stretches of set-up after the pipeline started that are kept.
const SET_UP_PHASES: usize = 4;
/// Ticks of a trainer's reading alone kept to find the one before its
/// workers started: a fresh fork may be told a worker only a tick or two
/// after it began to read (its command line, its first wakeups).
const ALONE_TICKS: usize = 4;
/// Code a trainer loads in one interval that marks an `import` at work
/// (PyTorch's first optimizer step imports some 100 MB of modules); a
/// steady training step loads none.
const IMPORT_BURST_BYTES: u64 = 4 << 20;

/// Where the job is in its startup (imports, spawning workers) before its
/// input pipeline runs.
#[derive(Debug)]
pub(super) enum Startup {
    /// The pipeline has not run everywhere yet; the whole run as of the
    /// last tick before any of it ran.
    Watching { before: Window },
    /// The pipeline started after `before` (the whole run until then).
    /// `phases`: the whole run at the end of each later stretch of set-up,
    /// the first [`SET_UP_PHASES`] of them: intervals in which a trainer
    /// loaded code (the lazy imports of its first steps; the modules a
    /// job's teardown or evaluation imports later), or its own reading
    /// before it started workers (a dataset loaded ahead, then handed to a
    /// DataLoader). `alone`: while the pipeline runs with no worker alive,
    /// the whole run as of each of the last [`ALONE_TICKS`] ticks.
    Done { before: Window, phases: Vec<Window>, importing: bool, alone: Option<VecDeque<Window>> },
}

impl Job {
    /// Startup ends when the input pipeline runs: the first interval by
    /// which every worker has read data or woken a trainer (a DataLoader
    /// queue delivering; a worker started by spawn or a forkserver imports
    /// its libraries first), or a trainer without workers is woken by its
    /// own loader threads or reads data itself (files that are not code,
    /// a stream from a peer outside the job), or a GPU of the job runs kernels (NVML says so,
    /// or a trainer launches or waits for them, or copies to or from it); in a run, once
    /// that holds for every rank; never while a spawned process may yet
    /// turn out to be a rank. The whole run up to the interval before the
    /// pipeline's first sign (a worker's data or delivery) is the baseline
    /// the final verdict subtracts (`import torch` and friends are not the
    /// job's steady state); until then, the last tick's whole-run window is
    /// kept for that purpose. After it, an interval in which a trainer
    /// loads [`IMPORT_BURST_BYTES`] of code (modules read, libraries faulted
    /// in: the lazy imports of its first steps) may move that baseline on
    /// ([`past_set_up`]); so may the start of workers after a trainer
    /// without them read data of its own.
    pub(super) fn watch_startup(
        &mut self,
        summary: Window,
        interval: &Window,
        roles: &Roles,
        gpus: &[GpuWindow],
    ) {
        if let Startup::Done { phases, importing: was, alone, .. } = &mut self.startup {
            // A trainer that ended is no longer importing (its mappings are
            // counted as it exits).
            let alive = |t: &u32| self.model.procs.get(t).is_some_and(|p| p.alive);
            if alone.is_some() && roles.workers.iter().any(alive) {
                // Workers came after the trainer read on its own: what it
                // read was its set-up, up to the tick before they came
                // (where their fork was seen).
                let came = roles
                    .workers
                    .iter()
                    .filter_map(|w| self.model.procs.get(w))
                    .filter(|p| p.alive && p.born_ns > 0)
                    .map(|p| p.born_ns)
                    .min()
                    .unwrap_or(u64::MAX);
                let ticks = alone.take().unwrap_or_default();
                let before_they_came =
                    ticks.iter().rev().find(|w| w.end_ns <= came).or(ticks.front()).cloned();
                if let Some(last) = before_they_came.filter(|_| phases.len() < SET_UP_PHASES) {
                    phases.push(last);
                }
                *was = false;
                return;
            }
            let importing = roles
                .trainers
                .iter()
                .filter(|t| alive(t))
                .any(|t| interval.proc(*t).is_some_and(|p| p.code_bytes() >= IMPORT_BURST_BYTES));
            *was = match (importing, *was) {
                // The same stretch goes on: its end moves.
                (true, true) => {
                    if let Some(last) = phases.last_mut() {
                        *last = summary.clone();
                    }
                    true
                }
                (true, false) if phases.len() < SET_UP_PHASES => {
                    phases.push(summary.clone());
                    true
                }
                _ => false,
            };
            if let Some(ticks) = alone {
                if ticks.len() == ALONE_TICKS {
                    ticks.pop_front();
                }
                ticks.push_back(summary);
            }
            return;
        }
        // The GPU works: NVML says so, or a trainer launches kernels, waits
        // for them or copies to or from its GPU (the GPU library probes).
        let launched = roles.trainers.iter().filter_map(|t| interval.proc(*t)).any(|p| {
            p.threads.iter().any(|t| {
                let g = &t.delta.gpu;
                g.launches > 0 || g.sync_calls > 0 || g.copy_calls > 0
            })
        });
        let gpu_ran =
            launched || gpus.iter().any(|g| g.samples > 0 && g.util_mean_pct > crate::gpu::IDLE_UTIL_PCT);
        if self.identities.settling(interval.end_ns) && !gpu_ran {
            // Spawned processes that may be ranks still import: who is a
            // worker is not known yet.
            self.startup = Startup::Watching { before: summary };
            return;
        }
        let woke_a_trainer = |w: u32| {
            roles.trainers.iter().any(|t| {
                interval.proc(*t).is_some_and(|p| {
                    p.threads.iter().any(|th| th.woken_by.iter().any(|b| b.count > 0 && b.tgid == w))
                })
            })
        };
        for &w in &roles.workers {
            if interval.proc(w).is_some_and(|p| p.reads_data()) || woke_a_trainer(w) {
                self.workers_ran.insert(w);
            }
        }
        // Woken by a thread of its own that read input (loader threads; not
        // the few bytes a collective library's thread reads as it joins).
        let fed_by_threads = |t: u32| {
            interval.proc(t).is_some_and(|p| {
                let loaders: HashSet<u32> = p
                    .threads
                    .iter()
                    .filter(|t| {
                        t.tid != p.tgid
                            && t.delta.file_read_bytes + t.delta.other_read_bytes
                                >= crate::aggregate::DATA_MIN_BYTES
                    })
                    .map(|t| t.tid)
                    .collect();
                p.threads.iter().any(|t| {
                    t.woken_by
                        .iter()
                        .any(|w| w.count > 0 && w.thread().is_some_and(|tid| loaders.contains(&tid)))
                })
            })
        };
        // A trainer without workers that reads its input itself: data
        // files, or a stream from a peer outside the job.
        let reads_itself = |t: u32| interval.proc(t).is_some_and(|p| p.reads_data());
        let alive = |w: &u32| self.model.procs.get(w).is_some_and(|p| p.alive);
        // The pipeline of these trainers and workers has run.
        let ran = |trainers: &[u32], workers: &[u32]| {
            if workers.iter().any(alive) {
                workers.iter().filter(|w| alive(w)).all(|w| self.workers_ran.contains(w))
            } else {
                trainers.iter().any(|t| fed_by_threads(*t) || reads_itself(*t))
            }
        };
        let started = if roles.ranks.len() > 1 {
            // A run's ranks import and start at their own pace.
            gpu_ran
                || roles.ranks.iter().all(|&(rank, trainer)| {
                    let workers: Vec<u32> =
                        roles.workers.iter().copied().filter(|w| roles.rank_of(*w) == Some(rank)).collect();
                    ran(&[trainer], &workers)
                })
        } else {
            gpu_ran || ran(&roles.trainers, &roles.workers)
        };
        if !started {
            // The baseline stops at the first sign of the pipeline: what
            // the first workers read while the others still start is the
            // job's input, not its startup. Roles are provisional while the
            // job starts (a pyenv shim's subshell looks like a forked worker
            // until the shim execs the interpreter): only what is still a
            // worker counts.
            let began = self.workers_ran.iter().any(|w| roles.of(*w) == crate::correlate::Role::Worker)
                || roles
                    .trainers
                    .iter()
                    .any(|t| fed_by_threads(*t) || (!roles.workers.iter().any(alive) && reads_itself(*t)));
            if !began {
                self.startup = Startup::Watching { before: summary };
            }
            return;
        }
        let before =
            match std::mem::replace(&mut self.startup, Startup::Watching { before: Window::default() }) {
                Startup::Watching { before } if before.end_ns > 0 => before,
                // The first interval already delivered: no startup to set apart.
                _ => Window {
                    start_ns: self.model.start_ns,
                    end_ns: self.model.start_ns,
                    ..Default::default()
                },
            };
        let alone = (!roles.workers.iter().any(alive)).then(|| VecDeque::from([summary]));
        self.startup = Startup::Done { before, phases: Vec::new(), importing: false, alone };
    }
}

/// Where the steady state starts: after the last stretch of set-up
/// (`phases`, each the whole run at its end: a trainer's imports, its own
/// reading before its workers came) that ended in the first half of the
/// time since the pipeline started (`before`), with at least
/// [`MIN_STEADY_NS`] after it; later ones (a teardown, an evaluation) are
/// part of the job's run, not of its start.
pub(super) fn past_set_up<'a>(before: &'a Window, phases: &'a [Window], end_ns: u64) -> &'a Window {
    let since_pipeline = end_ns.saturating_sub(before.end_ns);
    phases
        .iter()
        .rev()
        .find(|i| {
            let after = end_ns.saturating_sub(i.end_ns);
            after >= MIN_STEADY_NS && after.saturating_mul(2) >= since_pipeline
        })
        .unwrap_or(before)
}
