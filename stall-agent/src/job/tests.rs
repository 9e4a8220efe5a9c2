//! A job driven the way session and daemon drive it — events, snapshots,
//! GPU polls, ticks — on a scripted host and a scripted GPU, without root.
use std::collections::{HashMap, HashSet};

use stall_common::reason;

use super::*;
use crate::{
    capture::procfs::Opened,
    decode::{FileCounters, FileSnap, Inode, JobEvent, ThreadCounters, ThreadNow, ThreadSnap, WakeSnap},
    gpu::{FakeGpu, GpuProcUse, GpuSample, GpuSnapshot},
    pystack::PyStack,
};

const S: u64 = 1_000_000_000;
const TRAINER: u32 = 100;
const WORKERS: [u32; 2] = [201, 202];
const LOG: &str = "/runs/train.log";
/// A program the trainer runs to feed it (a video decoder).
const DECODER: u32 = 300;
const LOG_ID: u64 = 7;

/// /proc as a script: which processes exist, what each descriptor is.
#[derive(Default)]
struct ScriptedHost {
    procs: HashMap<u32, ProcInfo>,
    regular: HashSet<String>,
    marked_not_file: Vec<(u32, i32)>,
    retired: HashSet<u32>,
    /// (pid, path, last write) of files open for writing.
    outputs: Vec<(u32, String, u64)>,
    /// /proc I/O counters by pid.
    io: HashMap<u32, u64>,
    /// The listed variables of each process's environment at exec, and
    /// now (where it set some since).
    exec_env: HashMap<u32, crate::rank::Env>,
    live_env: HashMap<u32, crate::rank::Env>,
    /// Each process's main Python stack.
    main_threads: HashMap<u32, crate::pystack::MainThread>,
    /// Command lines, where not the trainer's.
    cmdlines: HashMap<u32, String>,
    /// The cgroup capping each process's CPU, and each such cgroup now.
    cpu_limits: HashMap<u32, String>,
    cpu_readings: HashMap<String, crate::cpulimit::Reading>,
    /// Files mapped by each process, by inode.
    mapped: HashMap<(u32, Inode), String>,
    /// Peers that are processes of the job.
    job_peers: HashSet<String>,
    /// What a thread blocked in a syscall waits on, by (tid, syscall).
    waits_on: HashMap<(u32, i64), crate::wait::WaitObject>,
    /// What each process's descriptors are, as objects waited on.
    descriptors: HashMap<(u32, i32), crate::wait::WaitObject>,
    /// Mount types of the files a server serves, by path.
    remote: HashMap<String, String>,
}

impl Host for ScriptedHost {
    fn classify_open(&mut self, _tgid: u32, _fd: i32, path: &str) -> Option<Opened> {
        let regular = self.regular.contains(path);
        // Inode numbers from the path, so that page-cache fills can name it.
        let ino = path.bytes().fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
        Some(Opened {
            target: path.to_string(),
            regular,
            inode: regular.then_some(Inode { dev: 8 << 20, ino }),
        })
    }
    fn mark_not_file(&mut self, tgid: u32, fd: i32, _file_id: u64) {
        self.marked_not_file.push((tgid, fd));
    }
    fn inherited_files(&mut self, _pid: u32, _job: u32) -> Vec<JobEvent> {
        Vec::new()
    }
    fn retire(&mut self, tgids: &HashSet<u32>, _tids: &HashSet<u32>) -> Vec<FileSnap> {
        self.retired.extend(tgids);
        Vec::new()
    }
    fn forget_files(&mut self, _tgids: &HashSet<u32>) -> Vec<FileSnap> {
        Vec::new()
    }
    fn io_chars(&self, pid: u32) -> Option<u64> {
        self.io.get(&pid).copied()
    }
    fn python_stacks(&mut self, _threads: &[(u32, u32, String)]) -> (Vec<PyStack>, Vec<String>) {
        (Vec::new(), Vec::new())
    }
    fn python_stacks_due(&self, _every: std::time::Duration) -> bool {
        false
    }
    fn process(&self, tgid: u32) -> Option<ProcInfo> {
        self.procs.get(&tgid).cloned()
    }
    fn cmdline(&self, tgid: u32) -> Option<String> {
        // DataLoader workers are forks: the trainer's command line.
        let own = self.cmdlines.get(&tgid).cloned();
        self.procs.get(&tgid).map(|_| own.unwrap_or_else(|| "python train.py".to_string()))
    }
    fn exec_environ(&self, tgid: u32) -> Option<crate::rank::Env> {
        self.procs.get(&tgid).map(|_| self.exec_env.get(&tgid).cloned().unwrap_or_default())
    }
    fn live_environ(&mut self, tgid: u32) -> Option<crate::rank::Env> {
        self.live_env.get(&tgid).or(self.exec_env.get(&tgid)).cloned()
    }
    fn main_python_thread(&mut self, tgid: u32) -> Option<crate::pystack::MainThread> {
        self.main_threads.get(&tgid).cloned()
    }
    fn thread_comm(&self, tgid: u32, _tid: u32) -> Option<String> {
        self.procs.get(&tgid).map(|p| p.comm.clone())
    }
    fn outputs(&self, pid: u32) -> Vec<(String, u64)> {
        self.outputs.iter().filter(|o| o.0 == pid).map(|o| (o.1.clone(), o.2)).collect()
    }
    fn cpu_limit(&self, tgid: u32) -> Option<Option<String>> {
        Some(self.cpu_limits.get(&tgid).cloned())
    }
    fn read_cpu_limit(&self, cgroup: &str) -> Option<crate::cpulimit::Reading> {
        self.cpu_readings.get(cgroup).cloned()
    }
    fn usable_cpus(&self) -> u32 {
        2
    }
    fn mapped_path(&self, tgid: u32, inode: Inode) -> Option<String> {
        self.mapped.get(&(tgid, inode)).cloned()
    }
    fn peer_in(&self, _tgid: u32, peer: &str, _pids: &[u32]) -> bool {
        self.job_peers.contains(peer)
    }
    fn socket_holder(&self, _tgid: u32, _peer: &str, _pids: &[u32]) -> Option<u32> {
        None
    }
    fn waits_on(&mut self, _tgid: u32, tid: u32, nr: i64) -> Option<crate::wait::WaitObject> {
        self.waits_on.get(&(tid, nr)).cloned()
    }
    fn descriptor(&mut self, tgid: u32, fd: i32, _writing: bool) -> Option<crate::wait::WaitObject> {
        self.descriptors.get(&(tgid, fd)).cloned()
    }
    fn remote_filesystem(&mut self, _tgid: u32, path: &str) -> Option<String> {
        self.remote.get(path).cloned()
    }
}

/// A trainer on GPU 0 with two DataLoader workers, one second per tick.
struct Sim {
    host: ScriptedHost,
    job: Job,
    gpus: GpuFleet,
    now: u64,
    threads: HashMap<u32, ThreadCounters>,
    files: HashMap<u32, FileCounters>,
    /// The trainer's log.
    log: Option<FileCounters>,
    /// Wakeups of the trainer by each worker (batches delivered).
    fed: HashMap<u32, u64>,
    alive: HashSet<u32>,
    /// The trainer's calls into its CUDA library so far.
    gpu_calls: crate::decode::GpuCounters,
    /// The trainer's state at each tick, where not blocked in futex.
    trainer_now: Option<ThreadNow>,
    /// Blocked time so far on each descriptor, by process.
    fd_waits: HashMap<(u32, i32), u64>,
    /// Threads other than processes' main ones, with their process.
    helpers: HashMap<u32, u32>,
}

impl Sim {
    fn new(gpu: FakeGpu) -> Self {
        let mut sim = Self::without_workers(gpu);
        sim.start_workers();
        sim
    }

    /// The trainer alone, its workers not started yet.
    fn without_workers(gpu: FakeGpu) -> Self {
        let mut host = ScriptedHost::default();
        host.procs.insert(TRAINER, ProcInfo { ppid: 1, comm: "python".into(), state: 'S', started_ns: 0 });
        let mut job = Job::new(1, 0, Some(TRAINER), GpuScope::All);
        host.regular.insert(LOG.into());
        let log = Event::Open {
            ts: 0,
            tid: TRAINER,
            tgid: TRAINER,
            fd: 7,
            file_id: LOG_ID,
            path: LOG.into(),
            dfd: -100,
            dup_of: None,
        };
        job.observe(&mut host, [log]);
        let alive = std::iter::once(TRAINER).collect();
        Self {
            host,
            job,
            gpus: GpuFleet::with_source(Some(Box::new(gpu)), 0),
            now: 0,
            threads: HashMap::new(),
            files: HashMap::new(),
            log: None,
            fed: HashMap::new(),
            alive,
            gpu_calls: Default::default(),
            trainer_now: None,
            fd_waits: HashMap::new(),
            helpers: HashMap::new(),
        }
    }

    /// The trainer alone, no GPU: it opens its data, imports for 2 s, then
    /// reads the data on its own for 3 s (a dataset read ahead before it
    /// starts anything to feed it).
    fn having_read_ahead() -> Self {
        let mut sim = Self::without_workers(gpu_at(&[]));
        sim.trainer_opens_its_data();
        for _ in 0..2 {
            sim.importing_second();
        }
        for _ in 0..3 {
            sim.reading_alone_second();
        }
        sim
    }

    /// The trainer forks its workers, each opening its shard.
    fn start_workers(&mut self) {
        for w in WORKERS {
            self.host.procs.insert(
                w,
                ProcInfo { ppid: TRAINER, comm: "pt_data_worker".into(), state: 'D', started_ns: self.now },
            );
            self.host.regular.insert(shard(w));
            self.alive.insert(w);
        }
        let events = WORKERS.iter().map(|&w| Event::Open {
            ts: self.now,
            tid: w,
            tgid: w,
            fd: 5,
            file_id: u64::from(w),
            path: shard(w),
            dfd: -100,
            dup_of: None,
        });
        self.job.observe(&mut self.host, events);
    }

    /// One second of a pyenv shim: the trainer's process is still the shim
    /// (bash), whose subshell hands it a path through a pipe, waking it
    /// some 20 times, and ends; after the tick the shim execs the
    /// interpreter (until then the subshell looks like a forked worker).
    fn shim_second(&mut self) -> Tick {
        const SUBSHELL: u32 = 150;
        let shim = "bash /root/.pyenv/shims/python3 train.py";
        self.host.cmdlines.insert(TRAINER, shim.into());
        self.host.cmdlines.insert(SUBSHELL, shim.into());
        self.host.procs.insert(
            SUBSHELL,
            ProcInfo { ppid: TRAINER, comm: "bash".into(), state: 'S', started_ns: self.now },
        );
        let fork = Event::NewTask {
            ts: self.now + 1,
            parent_tid: TRAINER,
            parent_tgid: TRAINER,
            child_tid: SUBSHELL,
            child_tgid: SUBSHELL,
            comm: "bash".into(),
        };
        self.job.observe(&mut self.host, [fork]);
        self.alive.insert(SUBSHELL);
        self.threads.entry(SUBSHELL).or_default().on_cpu_ns += S / 100;
        self.threads.entry(TRAINER).or_default().on_cpu_ns += S;
        *self.fed.entry(SUBSHELL).or_default() += 20;
        self.now += S;
        self.exit(SUBSHELL);
        let tick = self.tick();
        self.host.cmdlines.remove(&TRAINER);
        let exec = Event::Exec { ts: self.now + 1, tid: TRAINER, tgid: TRAINER, comm: "python".into() };
        self.job.observe(&mut self.host, [exec]);
        tick
    }

    /// Half a second on, the trainer starts a decoder program (its child,
    /// exec'd) that reads `/data/clips.mp4` on descriptor 5.
    fn start_decoder(&mut self) {
        let path = "/data/clips.mp4";
        self.host.regular.insert(path.into());
        self.host.cmdlines.insert(DECODER, "ffmpeg -i /data/clips.mp4 -f rawvideo -".into());
        self.host.procs.insert(
            DECODER,
            ProcInfo { ppid: TRAINER, comm: "ffmpeg".into(), state: 'S', started_ns: self.now + S / 2 },
        );
        let ts = self.now + S / 2;
        let events = [
            Event::NewTask {
                ts,
                parent_tid: TRAINER,
                parent_tgid: TRAINER,
                child_tid: DECODER,
                child_tgid: DECODER,
                comm: "python".into(),
            },
            Event::Exec { ts: ts + 1, tid: DECODER, tgid: DECODER, comm: "ffmpeg".into() },
            Event::Open {
                ts: ts + 2,
                tid: DECODER,
                tgid: DECODER,
                fd: 5,
                file_id: u64::from(DECODER),
                path: path.into(),
                dfd: -100,
                dup_of: None,
            },
        ];
        self.job.observe(&mut self.host, events);
        self.alive.insert(DECODER);
    }

    /// One second of the decoder reading 8 MiB and handing the trainer 10
    /// frames through a pipe; the trainer waits for them 90 % of it.
    fn decoding_second(&mut self) -> Tick {
        let t = self.threads.entry(TRAINER).or_default();
        t.on_cpu_ns += S / 10;
        t.off_ns[usize::from(reason::FUTEX)] += S - S / 10;
        let d = self.threads.entry(DECODER).or_default();
        d.on_cpu_ns += S / 2;
        d.off_ns[usize::from(reason::IO)] += S / 2;
        self.reads(DECODER, 8 << 20, 128);
        *self.fed.entry(DECODER).or_default() += 10;
        self.now += S;
        self.tick()
    }

    /// One second in which the trainer alone reads its data file, blocked
    /// in file reads 80 % of it.
    fn reading_alone_second(&mut self) -> Tick {
        let t = self.threads.entry(TRAINER).or_default();
        t.on_cpu_ns += S / 5;
        t.off_ns[usize::from(reason::IO)] += S - S / 5;
        self.reads(TRAINER, 8 << 20, 128);
        self.now += S;
        self.tick()
    }

    /// Process `pid` (its main thread) reads `bytes` in `calls` from the
    /// file on its descriptor 5.
    fn reads(&mut self, pid: u32, bytes: u64, calls: u64) {
        let t = self.threads.entry(pid).or_default();
        t.file_read_bytes += bytes;
        t.file_read_calls += calls;
        let f = self.files.entry(pid).or_default();
        f.read_bytes += bytes;
        f.read_calls += calls;
    }

    /// The trainer opens `/data/train.bin` on descriptor 5.
    fn trainer_opens_its_data(&mut self) {
        let path = "/data/train.bin";
        self.host.regular.insert(path.into());
        let open = Event::Open {
            ts: self.now,
            tid: TRAINER,
            tgid: TRAINER,
            fd: 5,
            file_id: u64::from(TRAINER),
            path: path.into(),
            dfd: -100,
            dup_of: None,
        };
        self.job.observe(&mut self.host, [open]);
    }

    /// One second: the trainer waits in futex `trainer_wait` of it, each
    /// worker sits in file reads `worker_io` of it and reads `bytes`.
    fn second(&mut self, trainer_wait: f64, worker_io: f64, bytes: u64) -> Tick {
        let ns = |share: f64| (share * S as f64) as u64;
        let t = self.threads.entry(TRAINER).or_default();
        t.on_cpu_ns += ns(1.0 - trainer_wait);
        t.off_ns[usize::from(reason::FUTEX)] += ns(trainer_wait);
        for w in WORKERS {
            let c = self.threads.entry(w).or_default();
            c.on_cpu_ns += ns(1.0 - worker_io);
            c.off_ns[usize::from(reason::IO)] += ns(worker_io);
            self.reads(w, bytes, bytes / 65536);
        }
        self.now += S;
        self.tick()
    }

    /// One second of `import torch`: the trainer on CPU, nothing else.
    fn importing_second(&mut self) -> Tick {
        self.threads.entry(TRAINER).or_default().on_cpu_ns += S;
        self.now += S;
        self.tick()
    }

    /// [`Self::feeding_second`], in which the trainer also imports a
    /// module of `bytes` (its first optimizer step importing the compiler
    /// stack lazily).
    fn lazily_importing_second(&mut self, bytes: u64) -> Tick {
        let path = format!("/venv/lib/python3.11/site-packages/torch/_dynamo/m{}.pyc", self.now / S);
        self.host.regular.insert(path.clone());
        let file_id = 1000 + self.now / S;
        let open = Event::Open {
            ts: self.now,
            tid: TRAINER,
            tgid: TRAINER,
            fd: 11,
            file_id,
            path,
            dfd: -100,
            dup_of: None,
        };
        let counters = FileCounters { read_bytes: bytes, read_calls: 2, ..Default::default() };
        let close = Event::Close { ts: self.now + 1, tgid: TRAINER, fd: 11, file_id, counters };
        self.job.observe(&mut self.host, [open, close]);
        self.feeding_second(0.9, 0.85, 8 << 20)
    }

    /// [`Self::second`], with each worker handing the trainer 10 batches.
    fn feeding_second(&mut self, trainer_wait: f64, worker_io: f64, bytes: u64) -> Tick {
        for w in WORKERS {
            *self.fed.entry(w).or_default() += 10;
        }
        self.second(trainer_wait, worker_io, bytes)
    }

    /// One second in which the trainer only waits (in futex), after
    /// writing `log_bytes` to its log.
    fn trainer_second(&mut self, log_bytes: u64) -> Tick {
        let t = self.threads.entry(TRAINER).or_default();
        t.off_ns[usize::from(reason::FUTEX)] += S;
        t.file_write_bytes += log_bytes;
        let f = self.log.get_or_insert_with(FileCounters::default);
        f.write_bytes += log_bytes;
        f.write_calls += u64::from(log_bytes > 0);
        self.now += S;
        self.tick()
    }

    fn tick(&mut self) -> Tick {
        let now = ThreadNow { running: false, reason: reason::FUTEX, syscall: 202, for_ns: 1 };
        let snap = Snapshot {
            ts: self.now,
            threads: self
                .threads
                .iter()
                .filter(|(tid, _)| self.alive.contains(tid))
                .map(|(&tid, &counters)| {
                    let now = self.trainer_now.filter(|_| tid == TRAINER).unwrap_or(now);
                    let tgid = self.helpers.get(&tid).copied().unwrap_or(tid);
                    ThreadSnap { tid, tgid, job: 1, counters, now, other_nr: -1 }
                })
                .collect(),
            fd_waits: self
                .fd_waits
                .iter()
                .map(|(&(tgid, fd), &blocked_ns)| crate::decode::FdWaitSnap { tgid, fd, blocked_ns })
                .collect(),
            files: self
                .files
                .iter()
                .filter(|(pid, _)| self.alive.contains(pid))
                .map(|(&pid, &counters)| FileSnap {
                    tgid: pid,
                    fd: 5,
                    file_id: u64::from(pid),
                    kind: stall_common::fd_kind::REGULAR,
                    counters,
                })
                .chain(self.log.map(|counters| FileSnap {
                    tgid: TRAINER,
                    fd: 7,
                    file_id: LOG_ID,
                    kind: stall_common::fd_kind::REGULAR,
                    counters,
                }))
                .collect(),
            wakes: self
                .fed
                .iter()
                .map(|(&w, &count)| WakeSnap {
                    wakee: TRAINER,
                    waker: w,
                    waker_tgid: w,
                    waker_comm: "pt_data_worker".into(),
                    count,
                    blocked_ns: 0,
                })
                .collect(),
            gpu_calls: vec![(TRAINER, self.gpu_calls)],
            ..Default::default()
        };
        let warnings = self.gpus.poll();
        assert!(warnings.is_empty() || warnings.iter().all(|w| w.contains("lost")), "{warnings:?}");
        self.job.tick(&mut self.host, &snap, &self.gpus)
    }

    fn exit(&mut self, pid: u32) {
        self.alive.remove(&pid);
        self.host.procs.remove(&pid);
        let counters = self.threads.get(&pid).copied().unwrap_or_default();
        let exit = Event::Exit {
            ts: self.now,
            tid: pid,
            tgid: pid,
            comm: "x".into(),
            counters: Box::new(counters),
            other_nr: -1,
        };
        self.job.observe(&mut self.host, [exit]);
    }
}

fn shard(pid: u32) -> String {
    format!("/data/shard_{pid}.arrow")
}

/// One poll per second of the simulation: six samples at `util`, from
/// `from_s`, with the trainer holding a context.
fn gpu_second(from_s: u64, util: f64) -> GpuSnapshot {
    GpuSnapshot {
        index: 0,
        name: "Scripted H200".into(),
        samples: (0..6).map(|i| GpuSample { ts_ns: from_s * S + i * S / 6 + 1, util_pct: util }).collect(),
        mem_used_bytes: 1 << 30,
        mem_total_bytes: 141 << 30,
        processes: vec![GpuProcUse { pid: TRAINER, used_mem_bytes: Some(1 << 30), sm_util_pct: Some(util) }],
        power_mw: Some(80_000 + (util * 6_000.0) as u32),
        power_limit_mw: Some(700_000),
    }
}

/// A GPU at `util` drawing `watts` (of 700 W) for `secs` polls.
fn gpu_at_power(util: f64, watts: u32, secs: usize) -> FakeGpu {
    FakeGpu::one_per_poll(
        (0..secs)
            .map(|s| GpuSnapshot { power_mw: Some(watts * 1000), ..gpu_second(s as u64, util) })
            .collect(),
    )
}

fn gpu_at(utils: &[f64]) -> FakeGpu {
    FakeGpu::one_per_poll(utils.iter().enumerate().map(|(s, &u)| gpu_second(s as u64, u)).collect())
}

#[test]
fn an_idle_gpu_while_workers_wait_on_storage_is_input_io_bound() {
    let mut sim = Sim::new(gpu_at(&[0.0; 8]));
    let mut last = None;
    for _ in 0..8 {
        last = Some(sim.second(0.9, 0.85, 8 << 20));
    }
    let tick = last.unwrap();
    assert_eq!(tick.verdict.kind, Kind::InputIoBound, "{:?}", tick.verdict);
    assert_eq!(tick.roles.trainers, vec![TRAINER]);
    let mut workers = tick.roles.workers.clone();
    workers.sort_unstable();
    assert_eq!(workers, WORKERS);
    assert_eq!(tick.gpus.len(), 1);
    assert!(tick.gpus[0].idle_fraction > 0.99, "{:?}", tick.gpus[0]);
    // The interval is one second's worth, the recent window at least five.
    assert_eq!(tick.interval.proc(WORKERS[0]).unwrap().file_read_bytes(), 8 << 20);
    assert!(tick.recent.secs() >= 5.0);
    assert!(tick.interval_gpus[0].samples >= 5, "{:?}", tick.interval_gpus);
    assert!(
        tick.verdict.summary.contains(&shard(WORKERS[0]))
            || tick.verdict.evidence.iter().any(|e| e.contains("shard"))
    );
}

#[test]
fn a_busy_gpu_with_a_fed_trainer_is_gpu_busy() {
    let mut sim = Sim::new(gpu_at(&[97.0; 8]));
    let mut last = None;
    for _ in 0..8 {
        last = Some(sim.second(0.7, 0.1, 1 << 20));
    }
    let tick = last.unwrap();
    assert_eq!(tick.verdict.kind, Kind::GpuBusy, "{:?}", tick.verdict);
    assert!(!tick.verdict.host_only);
    assert!(tick.gpus[0].util_mean_pct > 90.0);
    let g = &tick.gpus[0];
    assert!((g.power_w.unwrap() - 662.0).abs() < 1.0, "{g:?}");
    assert_eq!(g.power_limit_w, Some(700.0));
    assert!((g.sm_util_pct.unwrap() - 97.0).abs() < 1e-6, "{g:?}");
    assert!(sim.job.devices.contains(&0));
}

#[test]
fn a_job_that_ends_keeps_its_counts_and_frees_its_entries() {
    let mut sim = Sim::new(gpu_at(&[0.0; 6]));
    for _ in 0..3 {
        sim.second(0.9, 0.85, 4 << 20);
    }
    assert!(!sim.job.root_gone(&sim.host));
    for w in WORKERS {
        sim.exit(w);
    }
    let tick = sim.second(0.0, 0.0, 0);
    assert_eq!(sim.host.retired, WORKERS.into_iter().collect(), "ended workers' kernel entries freed");
    assert!(tick.interval.proc(WORKERS[0]).is_none_or(|p| !p.alive));
    sim.exit(TRAINER);
    assert!(sim.job.root_gone(&sim.host), "the trainer is gone");
    let report = sim.job.finish(&mut sim.host, sim.now, &sim.gpus);
    for w in WORKERS {
        assert_eq!(report.summary.proc(w).unwrap().file_read_bytes(), 12 << 20, "ended workers' bytes stay");
    }
    assert_eq!(report.gpus.len(), 1);
    sim.job.prune();
    assert!(sim.job.model.procs.is_empty() && sim.job.model.files.is_empty(), "nothing ended is kept");
}

#[test]
fn a_gpu_that_stops_answering_leaves_a_warning_and_no_busy_verdict() {
    // Busy for three seconds, then the device is lost: polls return nothing.
    let gpu = gpu_at(&[100.0; 3]).with_warnings(vec!["GPU 0 lost: GPU is lost".into()]);
    let mut sim = Sim::new(gpu);
    let first = sim.second(0.9, 0.85, 4 << 20);
    assert!(first.gpus[0].samples > 0);
    let mut last = None;
    for _ in 0..9 {
        last = Some(sim.second(0.9, 0.85, 4 << 20));
    }
    let tick = last.unwrap();
    assert_eq!(tick.gpus.len(), 1, "the device stays listed");
    assert!(tick.gpus[0].samples < 10, "{:?}", tick.gpus[0]);
    assert!(tick.gpus[0].max_gap_s >= 4.0, "{:?}", tick.gpus[0]);
    assert_ne!(tick.verdict.kind, Kind::GpuBusy, "{:?}", tick.verdict);
}

#[test]
fn non_files_are_told_to_the_kernel_side() {
    let mut sim = Sim::new(gpu_at(&[]));
    let pipe = Event::Open {
        ts: 1,
        tid: TRAINER,
        tgid: TRAINER,
        fd: 9,
        file_id: 77,
        path: "/tmp/fifo".into(),
        dfd: -100,
        dup_of: None,
    };
    sim.job.observe(&mut sim.host, [pipe]);
    assert_eq!(sim.host.marked_not_file, vec![(TRAINER, 9)]);
    assert_eq!(sim.job.model.files[&77].kind, stall_common::fd_kind::OTHER);
}

/// A trainer blocked 70 % of each second writing stdout into a slow pipe,
/// but on CPU whenever a tick looks: the kernel's blocked time per
/// descriptor names the pipe and its reader all the same.
#[test]
fn a_wait_no_tick_catches_is_named_by_its_descriptor() {
    let mut sim = Sim::new(gpu_at(&[0.0; 8]));
    for w in WORKERS {
        sim.exit(w);
    }
    let reader = crate::wait::Party::new(812, "fluent-bit");
    let pipe = crate::wait::WaitObject::Pipe { fd: 1, writing: true, others: vec![reader] };
    sim.host.descriptors.insert((TRAINER, 1), pipe);
    sim.trainer_now = Some(ThreadNow { running: true, reason: 0, syscall: -1, for_ns: 0 });
    let mut last = None;
    for _ in 0..6 {
        let t = sim.threads.entry(TRAINER).or_default();
        t.on_cpu_ns += 3 * S / 10;
        t.off_ns[usize::from(reason::SEND)] += 7 * S / 10;
        t.other_write_bytes += 1 << 20;
        t.stdio_write_bytes += 1 << 20;
        *sim.fd_waits.entry((TRAINER, 1)).or_default() += 7 * S / 10;
        sim.now += S;
        last = Some(sim.tick());
    }
    let v = last.unwrap().verdict;
    assert_eq!(v.kind, Kind::OutputIoBound, "{v:?}");
    assert!(v.summary.contains("writing stdout, a pipe read by pid 812 (fluent-bit)"), "{}", v.summary);
}

/// Descriptor waits belong to the process: where two of its threads block
/// as long for the same reason, neither is given the process's descriptor.
#[test]
fn a_descriptor_wait_shared_by_two_threads_names_neither() {
    let mut sim = Sim::new(gpu_at(&[0.0; 8]));
    sim.host
        .descriptors
        .insert((TRAINER, 9), crate::wait::WaitObject::File { fd: 9, path: "/ckpt/a.pt".into() });
    sim.trainer_now = Some(ThreadNow { running: true, reason: 0, syscall: -1, for_ns: 0 });
    let helper = TRAINER + 50;
    let spawn = Event::NewTask {
        ts: 0,
        parent_tid: TRAINER,
        parent_tgid: TRAINER,
        child_tid: helper,
        child_tgid: TRAINER,
        comm: "pt_checkpoint".into(),
    };
    sim.job.observe(&mut sim.host, [spawn]);
    sim.helpers.insert(helper, TRAINER);
    sim.alive.insert(helper);
    let mut last = None;
    for _ in 0..6 {
        for tid in [TRAINER, helper] {
            let t = sim.threads.entry(tid).or_default();
            t.on_cpu_ns += 4 * S / 10;
            t.off_ns[usize::from(reason::WRITE)] += 6 * S / 10;
        }
        *sim.fd_waits.entry((TRAINER, 9)).or_default() += 12 * S / 10;
        sim.now += S;
        last = Some(sim.tick());
    }
    let tick = last.unwrap();
    let named = tick.recent.procs.iter().flat_map(|p| &p.threads).filter(|t| !t.waits_on.is_empty()).count();
    assert_eq!(named, 0, "{:?}", tick.recent.proc(TRAINER));
}

#[test]
fn a_job_that_stops_logging_behind_a_busy_gpu_is_hung() {
    // Logs every second for 6 s, then waits in futex forever; the GPU says
    // 100 % at 95 W throughout.
    let mut sim = Sim::new(gpu_at_power(100.0, 95, 30));
    for _ in 0..6 {
        let tick = sim.trainer_second(120);
        assert_eq!(tick.verdict.kind, Kind::GpuBusy, "{:?}", tick.verdict);
    }
    let mut ticks = Vec::new();
    for _ in 0..14 {
        ticks.push(sim.trainer_second(0));
    }
    let at = ticks.iter().position(|t| t.verdict.kind == Kind::Hang).expect("called a hang");
    // Its rhythm is 1 s: the floor of 10 s of silence applies.
    assert!((9..=11).contains(&at), "hang after {} silent seconds", at + 1);
    let last = ticks.last().unwrap();
    assert_eq!(last.verdict.kind, Kind::Hang);
    assert!(last.verdict.summary.contains(LOG), "{}", last.verdict.summary);
    assert!(last.verdict.summary.contains("95 W of 700 W"), "{}", last.verdict.summary);
    assert!((last.progress.silent_s - 14.0).abs() < 1e-6, "{:?}", last.progress);
    assert_eq!(last.progress.last_output.as_ref().unwrap().path.value(), LOG);
}

#[test]
fn a_job_silent_between_log_lines_at_high_power_stays_gpu_busy() {
    // A log line every 4 s, the trainer waiting on the GPU in between, the
    // GPU at 650 W: working.
    let mut sim = Sim::new(gpu_at_power(100.0, 650, 40));
    for s in 0..40 {
        let tick = sim.trainer_second(if s % 4 == 0 { 200 } else { 0 });
        assert_eq!(tick.verdict.kind, Kind::GpuBusy, "second {s}: {:?}", tick.verdict);
    }
}

#[test]
fn outputs_open_at_attach_date_the_silence() {
    let mut sim = Sim::new(gpu_at_power(100.0, 95, 20));
    // The log was last written 8 minutes before stall started (at 600 s).
    sim.now = 600 * S;
    sim.job = Job::new(1, 600 * S, Some(TRAINER), GpuScope::All);
    sim.host.outputs.push((TRAINER, LOG.into(), 120 * S));
    let trainer = ThreadSnap { tid: TRAINER, tgid: TRAINER, job: 1, ..Default::default() };
    let snap = Snapshot { ts: 600 * S, threads: vec![trainer], ..Default::default() };
    sim.job.absorb(&mut sim.host, &snap);
    sim.gpus = GpuFleet::with_source(Some(Box::new(gpu_at_power(100.0, 95, 0))), 0);
    let tick = sim.trainer_second(0);
    assert!((tick.progress.silent_s - 481.0).abs() < 1e-6, "{:?}", tick.progress);
    assert_eq!(tick.progress.last_output.as_ref().map(|o| o.path.value()), Some(LOG));
}

#[test]
fn the_final_verdict_is_on_the_steady_state_after_startup() {
    // Four seconds of imports on CPU, then three of workers waiting on
    // storage and feeding the trainer: over the whole run the trainer was
    // on CPU most of the time, but the job's steady state is I/O-bound.
    let mut sim = Sim::new(gpu_at(&[]));
    for _ in 0..4 {
        sim.importing_second();
    }
    for _ in 0..3 {
        sim.feeding_second(0.9, 0.85, 8 << 20);
    }
    let report = sim.job.finish(&mut sim.host, sim.now, &sim.gpus);
    assert_eq!(report.verdict.kind, Kind::InputIoBound, "{:?}", report.verdict);
    let startup = report.startup_s.expect("a startup set apart");
    assert!((startup - 4.0).abs() < 1e-6, "{startup}");
    // The numbers of the report stay the whole run's.
    assert_eq!(report.summary.secs(), 7.0);
    assert_eq!(report.summary.proc(WORKERS[0]).unwrap().file_read_bytes(), 24 << 20);
}

/// The modules a trainer imports at its first steps (after the pipeline
/// ran) are startup too, where a steady state follows them; imports late
/// in the run (an evaluation, a teardown) are the run's.
#[test]
fn lazy_imports_after_the_first_batches_stay_in_the_startup() {
    let mut sim = Sim::new(gpu_at(&[]));
    for _ in 0..4 {
        sim.importing_second();
    }
    sim.feeding_second(0.9, 0.85, 8 << 20);
    for _ in 0..2 {
        sim.lazily_importing_second(60 << 20);
    }
    sim.lazily_importing_second(64 << 10);
    for _ in 0..3 {
        sim.feeding_second(0.9, 0.85, 8 << 20);
    }
    let report = sim.job.finish(&mut sim.host, sim.now, &sim.gpus);
    assert_eq!(report.startup_s, Some(7.0), "the last second importing ends at 7 s");
    assert_eq!(report.verdict.kind, Kind::InputIoBound, "{:?}", report.verdict);
    // A stretch of imports later in the run leaves the first one's end.
    sim.lazily_importing_second(60 << 20);
    for _ in 0..3 {
        sim.feeding_second(0.9, 0.85, 8 << 20);
    }
    let report = sim.job.finish(&mut sim.host, sim.now, &sim.gpus);
    assert_eq!(report.startup_s, Some(7.0));
}

#[test]
fn imports_late_in_the_run_are_no_startup() {
    let mut sim = Sim::new(gpu_at(&[]));
    for _ in 0..4 {
        sim.importing_second();
    }
    for _ in 0..6 {
        sim.feeding_second(0.9, 0.85, 8 << 20);
    }
    sim.lazily_importing_second(60 << 20);
    sim.feeding_second(0.9, 0.85, 8 << 20);
    let report = sim.job.finish(&mut sim.host, sim.now, &sim.gpus);
    assert_eq!(report.startup_s, Some(4.0), "the pipeline started at 4 s");
}

/// A trainer without workers that launches GPU kernels and waits for them
/// (seen by the GPU library probes, with no NVML): its pipeline runs.
#[test]
fn a_trainer_launching_kernels_has_started() {
    let mut sim = Sim::new(gpu_at(&[]));
    for _ in 0..2 {
        assert!(sim.importing_second().starting_up);
    }
    sim.gpu_calls.launches += 800;
    sim.gpu_calls.sync_calls += 100;
    assert!(!sim.importing_second().starting_up, "launching kernels: started");
    let report = sim.job.finish(&mut sim.host, sim.now + S, &sim.gpus);
    assert_eq!(report.startup_s, Some(2.0));
}

/// A trainer whose steps copy to and from its GPU (synchronous
/// `cudaMemcpy`, no kernel launched through the probed library): started.
#[test]
fn a_trainer_copying_to_its_gpu_has_started() {
    let mut sim = Sim::new(gpu_at(&[]));
    for _ in 0..2 {
        assert!(sim.importing_second().starting_up);
    }
    sim.gpu_calls.copy_calls += 50;
    sim.gpu_calls.copy_bytes += 50 << 26;
    sim.gpu_calls.copy_ns += S / 2;
    assert!(!sim.importing_second().starting_up, "copying: started");
    let report = sim.job.finish(&mut sim.host, sim.now + S, &sim.gpus);
    assert_eq!(report.startup_s, Some(2.0));
}

/// A trainer without workers that reads its input itself: its pipeline
/// runs from the first interval it reads data, and its imports before
/// that are no part of the verdict.
#[test]
fn a_trainer_reading_its_own_input_has_started() {
    let mut sim = Sim::without_workers(gpu_at(&[]));
    sim.trainer_opens_its_data();
    for _ in 0..3 {
        assert!(sim.importing_second().starting_up, "importing is starting up");
    }
    for _ in 0..3 {
        assert!(!sim.reading_alone_second().starting_up, "reading its input: started");
    }
    let report = sim.job.finish(&mut sim.host, sim.now, &sim.gpus);
    assert_eq!(report.startup_s, Some(3.0), "the pipeline started at 3 s");
    assert_eq!(report.verdict.kind, Kind::InputIoBound, "{:?}", report.verdict);
}

/// A trainer that reads a dataset ahead on its own, then hands it to
/// workers: what it read alone was its set-up, and the steady state is
/// the workers' (the trainer waiting on its own reads is not its cause).
#[test]
fn a_dataset_read_ahead_before_the_workers_start_is_set_up() {
    let mut sim = Sim::having_read_ahead();
    sim.start_workers();
    for _ in 0..8 {
        sim.feeding_second(0.9, 0.2, 1 << 20);
    }
    let report = sim.job.finish(&mut sim.host, sim.now, &sim.gpus);
    assert_eq!(report.startup_s, Some(5.0), "the workers started at 5 s");
    assert_eq!(report.verdict.kind, Kind::InputCpuBound, "{:?}", report.verdict);
}

/// A trainer that reads an index on its own, then starts a decoder that
/// feeds it through a pipe: a program it ran is told a worker only once it
/// has woken the trainer often enough, a tick after it started reading;
/// the set-up still ends at the last tick before it was forked.
#[test]
fn a_set_up_ends_where_a_worker_told_late_was_forked() {
    let mut sim = Sim::having_read_ahead();
    sim.start_decoder();
    let first = sim.decoding_second();
    assert_eq!(first.roles.of(DECODER), crate::correlate::Role::Other, "10 wakeups: not yet a feeder");
    for _ in 0..7 {
        sim.decoding_second();
    }
    let report = sim.job.finish(&mut sim.host, sim.now, &sim.gpus);
    assert_eq!(report.roles.of(DECODER), crate::correlate::Role::Worker);
    assert_eq!(report.startup_s, Some(5.0), "the decoder was forked at 5.5 s");
}

/// A helper process the trainer ran as it started (a pyenv shim's
/// subshell, `uname` at `import`) and that woke it is no sign of the
/// pipeline: the startup set apart runs on until the workers deliver.
#[test]
fn a_helper_that_woke_the_trainer_as_it_started_is_no_pipeline() {
    let mut sim = Sim::without_workers(gpu_at(&[]));
    sim.shim_second();
    for _ in 0..3 {
        assert!(sim.importing_second().starting_up, "importing is starting up");
    }
    sim.start_workers();
    for _ in 0..4 {
        sim.feeding_second(0.9, 0.85, 8 << 20);
    }
    let report = sim.job.finish(&mut sim.host, sim.now, &sim.gpus);
    assert_eq!(report.startup_s, Some(4.0), "the workers delivered from 4 s");
    assert_eq!(report.verdict.kind, Kind::InputIoBound, "{:?}", report.verdict);
}

#[test]
fn ticks_say_the_job_starts_up_until_its_pipeline_runs() {
    let mut sim = Sim::new(gpu_at(&[]));
    for _ in 0..4 {
        assert!(sim.importing_second().starting_up, "importing is starting up");
    }
    assert!(!sim.feeding_second(0.9, 0.85, 8 << 20).starting_up, "fed: started");
    assert!(!sim.importing_second().starting_up, "once started, for good");
}

#[test]
fn a_job_fed_from_its_first_interval_has_no_startup_to_set_apart() {
    let mut sim = Sim::new(gpu_at(&[]));
    for _ in 0..3 {
        sim.feeding_second(0.9, 0.85, 8 << 20);
    }
    let report = sim.job.finish(&mut sim.host, sim.now, &sim.gpus);
    assert_eq!(report.startup_s, None);
    assert_eq!(report.verdict.kind, Kind::InputIoBound, "{:?}", report.verdict);
}

/// Processes of a run launched some way, driven through the job's events on
/// a scripted host: fork, exec (with the environment a launcher gives),
/// connect; then each process's rank as the model holds it.
struct Launch {
    host: ScriptedHost,
    job: Job,
    now: u64,
}

const LAUNCHER: u32 = 10;
const SPAWN_MAIN: &str =
    "python3 -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7) --multiprocessing-fork";

fn frame(function: &str, file: &str) -> crate::pystack::PyFrame {
    crate::pystack::PyFrame { function: function.into(), file: file.into(), line: 1, own: false }
}

fn env(vars: &[(&str, &str)]) -> crate::rank::Env {
    crate::rank::Env::from_pairs(vars.iter().copied())
}

impl Launch {
    fn new(launcher_env: &[(&str, &str)]) -> Self {
        let mut host = ScriptedHost::default();
        host.procs.insert(LAUNCHER, ProcInfo { ppid: 1, comm: "python3".into(), state: 'S', started_ns: 0 });
        host.exec_env.insert(LAUNCHER, env(launcher_env));
        let mut launch = Self { host, job: Job::new(1, 0, Some(LAUNCHER), GpuScope::All), now: S };
        let started = Event::NewTask {
            ts: S,
            parent_tid: 1,
            parent_tgid: 1,
            child_tid: LAUNCHER,
            child_tgid: LAUNCHER,
            comm: "python3".into(),
        };
        let exec = Event::Exec { ts: S, tid: LAUNCHER, tgid: LAUNCHER, comm: "python3".into() };
        launch.job.observe(&mut launch.host, [started, exec]);
        launch
    }

    /// `parent` forks `child`, which execs `cmdline` with `exec_env` when
    /// given (else stays a fork).
    fn start(&mut self, parent: u32, child: u32, exec: Option<(&str, &[(&str, &str)])>) {
        self.start_seen(parent, child, exec, false);
    }

    /// As [`Launch::start`]; `snapshot_first`: a map snapshot holds the
    /// child's thread before its fork event is read (the ring buffer and
    /// the maps are read apart).
    fn start_seen(
        &mut self,
        parent: u32,
        child: u32,
        exec: Option<(&str, &[(&str, &str)])>,
        snapshot_first: bool,
    ) {
        self.now += 1_000_000;
        // /proc tells a start in clock ticks (10 ms), cut down.
        let started_ns = self.now / 10_000_000 * 10_000_000;
        self.host
            .procs
            .insert(child, ProcInfo { ppid: parent, comm: "python3".into(), state: 'S', started_ns });
        let inherited = self.host.live_env.get(&parent).or(self.host.exec_env.get(&parent)).cloned();
        self.host.exec_env.insert(child, self.host.exec_env.get(&parent).cloned().unwrap_or_default());
        if let Some(live) = inherited {
            self.host.live_env.insert(child, live);
        }
        let mut events = vec![Event::NewTask {
            ts: self.now,
            parent_tid: parent,
            parent_tgid: parent,
            child_tid: child,
            child_tgid: child,
            comm: "python3".into(),
        }];
        if exec.is_none() {
            // A fork runs its parent's program, from where its parent was.
            if let Some(c) = self.host.cmdlines.get(&parent).cloned() {
                self.host.cmdlines.insert(child, c);
            }
            if let Some(m) = self.host.main_threads.get(&parent).cloned() {
                self.host.main_threads.insert(child, m);
            }
        }
        if let Some((cmdline, vars)) = exec {
            self.host.cmdlines.insert(child, cmdline.into());
            // The environment the parent passes: what it has now.
            let mut passed = self.host.live_environ(parent).unwrap_or_default();
            if !vars.is_empty() {
                passed = env(vars);
            }
            self.host.exec_env.insert(child, passed);
            self.host.live_env.remove(&child);
            events.push(Event::Exec { ts: self.now, tid: child, tgid: child, comm: "python3".into() });
        }
        if snapshot_first {
            let thread = ThreadSnap { tid: child, tgid: child, job: 1, ..Default::default() };
            let snap = Snapshot { ts: self.now, threads: vec![thread], ..Default::default() };
            self.job.absorb(&mut self.host, &snap);
        }
        self.job.observe(&mut self.host, events);
    }

    /// The process sets `vars` in its environment, as `os.environ[...]`.
    fn sets(&mut self, tgid: u32, vars: &[(&str, &str)]) {
        let mut all: Vec<(String, String)> = Vec::new();
        let now = self.host.live_environ(tgid).unwrap_or_default();
        for k in crate::rank::ENV_KEYS {
            if let Some(v) = now.get(k) {
                all.push((k.to_string(), v.to_string()));
            }
        }
        all.extend(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let pairs: Vec<(&str, &str)> = all.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        self.host.live_env.insert(tgid, env(&pairs));
    }

    fn connects(&mut self, tgid: u32) {
        self.now += 1_000_000;
        let ev = Event::Connect {
            ts: self.now,
            tgid,
            fd: 3,
            file_id: u64::from(tgid) << 8,
            peer: "127.0.0.1:29500".into(),
        };
        self.job.observe(&mut self.host, [ev]);
    }

    /// The process now runs `torch.multiprocessing.spawn`'s wrapper, whose
    /// arguments could not be read.
    fn runs_wrapper(&mut self, tgid: u32) {
        self.runs_wrapper_given(tgid, None);
    }

    /// ... given index `index` (read from its arguments).
    fn runs_wrapper_given(&mut self, tgid: u32, index: Option<u32>) {
        let frames = vec![
            frame("train", "/job/train.py"),
            frame("_wrap", "torch/multiprocessing/spawn.py"),
            frame("BaseProcess._bootstrap", "multiprocessing/process.py"),
        ];
        self.host.main_threads.insert(tgid, crate::pystack::MainThread { frames, spawn_index: index });
    }

    fn runs_worker_loop(&mut self, tgid: u32) {
        let frames = vec![
            frame("_worker_loop", "torch/utils/data/_utils/worker.py"),
            frame("BaseProcess._bootstrap", "multiprocessing/process.py"),
        ];
        self.host.main_threads.insert(tgid, crate::pystack::MainThread { frames, spawn_index: None });
    }

    /// The process exits, and the next snapshot takes its end.
    fn ends(&mut self, tgid: u32) {
        self.now += 1_000_000;
        self.host.procs.remove(&tgid);
        let exit = Event::Exit {
            ts: self.now,
            tid: tgid,
            tgid,
            comm: "python3".into(),
            counters: Box::default(),
            other_nr: -1,
        };
        self.job.observe(&mut self.host, [exit]);
        self.job.absorb(&mut self.host, &Snapshot { ts: self.now, ..Default::default() });
    }

    fn rank(&self, tgid: u32) -> Option<(u32, crate::rank::Found)> {
        self.job.model.procs.get(&tgid)?.rank.as_ref().map(|r| (r.rank, r.found))
    }
}

/// Rank `r` of an mp.spawn run is pid 100 + r; its two workers 100 + 10r
/// + 10 + w.
fn rank_pid(r: u32) -> u32 {
    100 + r
}
fn worker_pid(r: u32, w: u32) -> u32 {
    200 + 10 * r + w
}

#[test]
fn mp_spawn_ranks_are_the_launchers_children_in_start_order() {
    use crate::rank::Found;
    let mut l = Launch::new(&[("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")]);
    for r in 0..4 {
        l.start(LAUNCHER, rank_pid(r), Some((SPAWN_MAIN, &[])));
    }
    // Still unpickling: nothing is a rank yet.
    assert_eq!((0..4).filter_map(|r| l.rank(rank_pid(r))).count(), 0);
    for r in 0..4 {
        l.runs_wrapper(rank_pid(r));
        l.connects(rank_pid(r));
        for w in 0..2 {
            l.start(rank_pid(r), worker_pid(r, w), None);
        }
    }
    for r in 0..4 {
        assert_eq!(l.rank(rank_pid(r)), Some((r, Found::SpawnIndex)));
        let p = &l.job.model.procs[&rank_pid(r)];
        assert_eq!(p.rank.as_ref().unwrap().run_id.as_deref(), Some("127.0.0.1:29500"));
        // Forked workers inherit no rank variable: their rank is their
        // nearest rank's (correlate), not one of their own.
        assert_eq!(l.rank(worker_pid(r, 0)), None);
    }
    assert_eq!(l.rank(LAUNCHER), None);
}

/// A rank first seen in a map snapshot, before its fork event, is dated
/// by /proc (10 ms ticks) as its siblings are: on one clock their order
/// holds (a fork event's exact time beside a tick cut down put rank 1
/// before rank 0).
#[test]
fn mp_spawn_ranks_keep_their_order_whichever_way_they_are_first_seen() {
    use crate::rank::Found;
    let mut l = Launch::new(&[("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")]);
    for r in 0..4 {
        l.start_seen(LAUNCHER, rank_pid(r), Some((SPAWN_MAIN, &[])), r == 1);
    }
    for r in 0..4 {
        l.runs_wrapper(rank_pid(r));
        l.connects(rank_pid(r));
    }
    for r in 0..4 {
        assert_eq!(l.rank(rank_pid(r)), Some((r, Found::SpawnIndex)), "rank {r}");
    }
}

/// A launcher that starts its ranks in parallel starts them in any order:
/// the index each was given, read from its wrapper's arguments, is its
/// rank.
#[test]
fn mp_spawn_ranks_started_out_of_order_are_the_index_they_were_given() {
    use crate::rank::Found;
    let mut l = Launch::new(&[("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")]);
    for r in (0..4).rev() {
        l.start(LAUNCHER, rank_pid(r), Some((SPAWN_MAIN, &[])));
    }
    for r in 0..4 {
        l.runs_wrapper_given(rank_pid(r), Some(r));
        l.connects(rank_pid(r));
    }
    for r in 0..4 {
        assert_eq!(l.rank(rank_pid(r)), Some((r, Found::SpawnIndex)), "rank {r}");
    }
}

/// `start_processes(start_method="forkserver")`: a fork server forks the
/// ranks (in any order, from a pool of threads); the ranks' own forked
/// workers run the same command line from inside the wrapper and are no
/// ranks, nor is the server.
#[test]
fn ranks_a_fork_server_forked_are_the_index_they_were_given() {
    use crate::rank::Found;
    const SERVER: u32 = 50;
    const FORKSERVER_MAIN: &str =
        "python3 -c from multiprocessing.forkserver import main; main(8, 9, ['__main__'], **{})";
    let mut l = Launch::new(&[("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")]);
    l.start(LAUNCHER, SERVER, Some((FORKSERVER_MAIN, &[])));
    for r in [2, 0, 3, 1] {
        l.start(SERVER, rank_pid(r), None);
    }
    for r in 0..4 {
        l.runs_wrapper_given(rank_pid(r), Some(r));
        l.connects(rank_pid(r));
        for w in 0..2 {
            l.start(rank_pid(r), worker_pid(r, w), None);
        }
    }
    for r in 0..4 {
        assert_eq!(l.rank(rank_pid(r)), Some((r, Found::SpawnIndex)), "rank {r}");
        assert_eq!(l.rank(worker_pid(r, 0)), None);
    }
    assert_eq!((l.rank(SERVER), l.rank(LAUNCHER)), (None, None));
}

/// A rank's DataLoader workers started by spawn run another target: once
/// they end they are forgotten (re-spawned every epoch, a daemon would
/// keep them all). A rank that ended is kept while its launcher lives (its
/// place among its siblings may be a rank), and forgotten with it.
#[test]
fn ended_spawned_processes_are_kept_only_while_they_can_be_ranks() {
    use crate::rank::Found;
    let mut l = Launch::new(&[("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")]);
    for r in 0..2 {
        l.start(LAUNCHER, rank_pid(r), Some((SPAWN_MAIN, &[])));
        l.runs_wrapper(rank_pid(r));
        l.connects(rank_pid(r));
    }
    let worker = worker_pid(1, 0);
    l.start(rank_pid(1), worker, Some((SPAWN_MAIN, &[])));
    l.runs_worker_loop(worker);
    l.connects(worker);
    l.ends(worker);
    assert!(!l.job.identities.knows(worker));
    l.ends(rank_pid(0));
    assert!(l.job.identities.knows(rank_pid(0)));
    assert_eq!(l.rank(rank_pid(1)), Some((1, Found::SpawnIndex)));
    l.ends(rank_pid(1));
    l.ends(LAUNCHER);
    assert!(!(0..2).any(|r| l.job.identities.knows(rank_pid(r))) && !l.job.identities.knows(LAUNCHER));
}

#[test]
fn a_launcher_first_met_as_it_execs_names_its_node() {
    use crate::rank::Found;
    // As in a watched cgroup: the launcher's first event is its exec.
    let mut host = ScriptedHost::default();
    host.procs.insert(LAUNCHER, ProcInfo { ppid: 1, comm: "python3".into(), state: 'S', started_ns: 0 });
    host.exec_env.insert(LAUNCHER, env(&[("NODE_RANK", "1")]));
    let mut l = Launch { host, job: Job::new(1, 0, None, GpuScope::Held), now: S };
    let exec = Event::Exec { ts: S, tid: LAUNCHER, tgid: LAUNCHER, comm: "python3".into() };
    l.job.observe(&mut l.host, [exec]);
    for r in 0..2 {
        l.start(LAUNCHER, rank_pid(r), Some((SPAWN_MAIN, &[])));
        l.runs_wrapper(rank_pid(r));
        l.connects(rank_pid(r));
        l.start(rank_pid(r), worker_pid(r, 0), None);
    }
    assert_eq!(l.rank(rank_pid(0)), Some((2, Found::SpawnIndex)));
    assert_eq!(l.rank(rank_pid(1)), Some((3, Found::SpawnIndex)));
    // A rank's forked worker runs the same command line, from inside the
    // wrapper: it is not a spawned rank of its own.
    assert_eq!(l.rank(worker_pid(1, 0)), None);
}

#[test]
fn a_rank_set_in_os_environ_after_start_is_read_when_it_connects() {
    use crate::rank::Found;
    let mut l = Launch::new(&[]);
    for r in 0..2 {
        l.start(LAUNCHER, rank_pid(r), Some((SPAWN_MAIN, &[])));
    }
    // Rank 1 sets its variables and joins the rendezvous; its stack is not
    // readable (another interpreter), so only its environment tells.
    let (r1, r0) = (rank_pid(1), rank_pid(0));
    l.sets(r1, &[("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1")]);
    assert_eq!(l.rank(r1), None, "read only at its moments");
    l.connects(r1);
    assert_eq!(l.rank(r1), Some((1, Found::LiveEnviron)));
    // Its DataLoader workers started by spawn carry the variables in their
    // exec-time environment: the same rank as their parent.
    l.start(r1, worker_pid(1, 0), Some((SPAWN_MAIN, &[])));
    l.runs_worker_loop(worker_pid(1, 0));
    assert_eq!(l.rank(worker_pid(1, 0)), Some((1, Found::ExecEnviron)));
    // Rank 0 sets its variables, connects nowhere first, and forks.
    l.sets(r0, &[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1")]);
    l.start(r0, worker_pid(0, 0), None);
    assert_eq!(l.rank(r0), Some((0, Found::LiveEnviron)));
    // A forked worker has its parent's environment as it was at the fork.
    assert_eq!(l.rank(worker_pid(0, 0)), Some((0, Found::LiveEnviron)));
}

#[test]
fn a_trainers_spawned_dataloader_workers_are_no_ranks() {
    let mut l = Launch::new(&[]);
    // A single trainer (the launcher here) with spawned workers.
    for w in 0..2 {
        l.start(LAUNCHER, worker_pid(0, w), Some((SPAWN_MAIN, &[])));
        l.runs_worker_loop(worker_pid(0, w));
        l.connects(worker_pid(0, w));
    }
    // Looked at again later: still no rank.
    l.now += 5 * S;
    let snap = Snapshot { ts: l.now, ..Default::default() };
    l.job.absorb(&mut l.host, &snap);
    assert_eq!((0..2).filter_map(|w| l.rank(worker_pid(0, w))).count(), 0);
}

#[test]
fn a_spawned_process_is_looked_at_again_until_its_target_shows() {
    use crate::rank::Found;
    let mut l = Launch::new(&[("NODE_RANK", "1")]);
    for r in 0..2 {
        l.start(LAUNCHER, rank_pid(r), Some((SPAWN_MAIN, &[])));
    }
    // No child, no connection (a rank without workers over a Unix socket):
    // the periodic look finds the wrapper once it runs.
    for r in 0..2 {
        l.runs_wrapper(rank_pid(r));
    }
    l.now += identity::LOOK_EVERY_NS;
    let snap = Snapshot { ts: l.now, ..Default::default() };
    l.job.absorb(&mut l.host, &snap);
    // The launcher is node 1 of a two-node run: ranks 2 and 3.
    assert_eq!(l.rank(rank_pid(0)), Some((2, Found::SpawnIndex)));
    assert_eq!(l.rank(rank_pid(1)), Some((3, Found::SpawnIndex)));
}

/// Four ranks a launcher started as plain subprocesses, no rank variable
/// anywhere: each created its NCCL communicator (and a two-rank one for a
/// point-to-point link, and rank 3 a sub-group of its own numbering). The
/// world's communicator names each rank, and the unique id the run.
#[test]
fn ranks_no_variable_names_are_their_nccl_communicators() {
    use crate::{decode::CommSnap, rank::Found};
    let mut l = Launch::new(&[]);
    for r in 0..4 {
        l.start(LAUNCHER, rank_pid(r), Some(("python3 rank.py", &[])));
    }
    assert_eq!((0..4).filter_map(|r| l.rank(rank_pid(r))).count(), 0);
    let comm = |tgid: u32, comm: u64, id: u64, nranks: u32, rank: u32| CommSnap {
        tgid,
        comm,
        id: Some(id),
        nranks: Some(nranks),
        rank: Some(rank),
        ..Default::default()
    };
    let mut comms: Vec<CommSnap> =
        (0..4).map(|r| comm(rank_pid(r), 0xa0 + u64::from(r), 0x5eed, 4, r)).collect();
    comms.push(comm(rank_pid(1), 0xb1, 0x1111, 2, 0));
    comms.push(comm(rank_pid(3), 0xb3, 0x3333, 2, 1));
    // Created before stall's probes: no identity, no rank.
    comms.push(CommSnap { tgid: rank_pid(2), comm: 0xc2, ..Default::default() });
    l.now += S;
    l.job.absorb(&mut l.host, &Snapshot { ts: l.now, communicators: comms, ..Default::default() });
    for r in 0..4 {
        assert_eq!(l.rank(rank_pid(r)), Some((r, Found::Communicator)), "rank {r}");
        let p = &l.job.model.procs[&rank_pid(r)];
        let rank = p.rank.as_ref().unwrap();
        assert_eq!((rank.world_size, rank.run_id.as_deref()), (Some(4), Some("nccl:0000000000005eed")));
    }
    assert_eq!(l.rank(LAUNCHER), None);
}

/// A launcher's variable comes first: the communicator only fills in.
#[test]
fn a_rank_variable_wins_over_the_communicator() {
    use crate::{decode::CommSnap, rank::Found};
    let mut l = Launch::new(&[]);
    l.start(LAUNCHER, rank_pid(0), Some(("python3 rank.py", &[("RANK", "5"), ("WORLD_SIZE", "8")])));
    let c = CommSnap {
        tgid: rank_pid(0),
        comm: 1,
        id: Some(9),
        nranks: Some(2),
        rank: Some(1),
        ..Default::default()
    };
    l.now += S;
    l.job.absorb(&mut l.host, &Snapshot { ts: l.now, communicators: vec![c], ..Default::default() });
    assert_eq!(l.rank(rank_pid(0)), Some((5, Found::ExecEnviron)));
}
