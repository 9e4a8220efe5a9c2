//! `cargo xtask bench`: what tracing costs the traced job, and what stall
//! itself costs, written to docs/PERFORMANCE.md.
//!
//! Each workload (`bench-workloads`, binary `bench-wl`) times its own loop
//! and writes `ops=N ns=T`; it runs under four modes, interleaved run by run:
//! no tracer, `stall run`, `strace -f` on the same syscalls, and `stall run
//! --floor` (the same programs attached, each returning at once). The agent's
//! own CPU time and peak RSS come from `wait4` on `stall attach` (through
//! `bench-wl rusage`), lost events from its `--json` summary.
//!
//! `--before REV` builds stall as of REV beside the current one and runs it
//! as one more mode, and its programs beside the current ones: a change's
//! before and after, side by side in one run.

mod before;
mod daemon;
mod profile;
mod pystacks;
mod report;

use std::{
    cell::Cell,
    ffi::OsString,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::atomic::{AtomicUsize, Ordering},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};

use crate::{build, cmd, setup};

/// `cargo xtask bench` options.
pub struct Options {
    pub quick: bool,
    pub runs: Option<usize>,
    pub no_build: bool,
    /// Only the daemon's section, printed, not written.
    pub daemon_only: bool,
    /// A revision whose stall runs beside the current one.
    pub before: Option<String>,
}

/// The syscalls strace is told to trace: what stall's read-side programs see.
const STRACE_FILTER: &str = "trace=openat,read,pread64,readv,preadv";
/// The traced job beside the untraced neighbour reads at this rate.
const NEIGHBOUR_JOB_RATE: u64 = 50_000;
const RUN_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    Baseline,
    Stall,
    /// `stall run --timeline`: a record per context switch on top.
    Timeline,
    Strace,
    Floor,
    /// `stall run` as built from `--before REV`.
    Before,
}

impl Mode {
    pub const ALL: [Mode; 6] =
        [Mode::Baseline, Mode::Stall, Mode::Timeline, Mode::Strace, Mode::Floor, Mode::Before];

    pub fn label(self) -> &'static str {
        match self {
            Mode::Baseline => "baseline (no tracer)",
            Mode::Stall => "stall",
            Mode::Timeline => "stall --timeline",
            Mode::Strace => "strace -f",
            Mode::Floor => "floor (stall --floor)",
            Mode::Before => "stall, before (--before)",
        }
    }
}

/// One timed loop: `ops` operations in `ns` nanoseconds.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub ops: u64,
    pub ns: u64,
}

impl Sample {
    pub fn ns_per_op(self) -> f64 {
        self.ns as f64 / self.ops.max(1) as f64
    }
}

pub struct Workload {
    pub key: &'static str,
    pub title: &'static str,
    pub what: String,
    /// What one op is ("read", "switch", "fork").
    pub unit: &'static str,
    /// `bench-wl` arguments (without `--out`).
    args: Vec<String>,
    /// The same with fewer ops, for strace.
    strace_args: Vec<String>,
    /// The neighbour workload: `args` run untraced while the traced job runs under the mode.
    neighbour: bool,
    /// Rounds per `--runs`: more for the short loops whose targets are a
    /// few points of their baseline, where one round's noise is several.
    pub rounds_per_run: usize,
    pub samples: Vec<(Mode, Sample)>,
}

/// `rounds_per_run` of the workloads with a target of a few points above
/// the floor (pread-4k, futex-pingpong) and of copy-4k beside them.
const PER_CALL_ROUNDS: usize = 3;

pub struct CostRow {
    pub label: String,
    /// Requested reads (or open/read/close iterations) per second; None: unpaced.
    pub rate: Option<u64>,
    /// Achieved ops per second over the job's loop.
    pub achieved: f64,
    /// stall's kernel-side events per op (programs hit for a tracked thread).
    pub events_per_op: f64,
    /// Ring-buffer records per op.
    pub records_per_op: f64,
    pub traced_s: f64,
    pub cpu_s: f64,
    /// stall's CPU over the middle of its run, once loaded and attached,
    /// as % of one core: what the events cost it, without the start-up and
    /// the final report that `cpu_s` includes (None: not measured).
    pub steady_pct: Option<f64>,
    pub rss_kb: u64,
    pub lost: u64,
}

impl CostRow {
    pub fn events_per_s(&self) -> f64 {
        self.achieved * self.events_per_op
    }
    pub fn core_pct(&self) -> f64 {
        100.0 * self.cpu_s / self.traced_s.max(1e-9)
    }
    pub fn cpu_per_million(&self) -> f64 {
        let events = self.events_per_s() * self.traced_s;
        if events <= 0.0 {
            f64::NAN
        } else {
            self.cpu_s / events * 1e6
        }
    }
}

struct Env {
    dir: PathBuf,
    wl: PathBuf,
    stall: PathBuf,
    /// The scripted NVML library (the daemon bench's GPU job).
    nvml_lib: PathBuf,
    strace: Option<PathBuf>,
    /// `--before`: that revision's stall.
    before: Option<before::Build>,
    quiet: Cell<Quiet>,
}

/// Other tracers (another stall, a test run) make every mode slower, the
/// baseline included: each sample waits for them to be gone, within a budget.
#[derive(Clone, Copy, Default)]
pub struct Quiet {
    pub waited: Duration,
    pub samples: usize,
    /// Samples that started with someone else's tracing programs loaded.
    pub contaminated: usize,
}

const QUIET_BUDGET: Duration = Duration::from_secs(180);
const QUIET_WAIT: Duration = Duration::from_secs(20);

impl Env {
    fn foreign_progs(&self) -> usize {
        let out = Command::new(&self.wl).arg("bpf-progs").output();
        out.ok()
            .and_then(|o| kv(&String::from_utf8_lossy(&o.stdout), "tracing_progs")?.parse().ok())
            .unwrap_or(0)
    }

    /// Waits (up to [`QUIET_WAIT`], within [`QUIET_BUDGET`] for the whole bench) until no other
    /// tracing programs are loaded; counts the sample as contaminated if they stay.
    fn wait_quiet(&self) {
        let mut q = self.quiet.get();
        q.samples += 1;
        let t0 = Instant::now();
        let mut said = false;
        loop {
            let n = self.foreign_progs();
            if n == 0 {
                break;
            }
            if t0.elapsed() > QUIET_WAIT || q.waited + t0.elapsed() > QUIET_BUDGET {
                q.contaminated += 1;
                break;
            }
            if !said {
                println!("  (waiting for {n} tracing BPF programs of another process to go away)");
                said = true;
            }
            thread::sleep(Duration::from_millis(250));
        }
        q.waited += t0.elapsed();
        self.quiet.set(q);
    }
}

pub fn run(opts: &Options) -> Result<()> {
    cmd::require_root("the bench loads stall's eBPF programs")?;
    let started = Instant::now();
    let target = cmd::target_dir();
    let (stall, wl, nvml_lib, stand_ins) = if opts.no_build {
        let stall = target.join("release/stall");
        let nvml = build::nvml_script_next_to(&stall)?;
        let gpu = (build::cuda_stub_next_to(&stall)?, build::nccl_stub_next_to(&stall)?);
        (stall, target.join("release/bench-wl"), nvml, gpu)
    } else {
        setup::ensure()?;
        let stall = build::agent(true)?;
        cmd::run(cmd::cargo().args(["build", "--release", "-p", "bench-workloads"]))?;
        let gpu = (build::cuda_stub(true)?, build::nccl_stub(true)?);
        (stall, target.join("release/bench-wl"), build::nvml_script(true)?, gpu)
    };
    let dir = target.join("bench");
    let bin = dir.join("bin");
    fs::create_dir_all(&bin).with_context(|| format!("creating {}", bin.display()))?;
    // Private copies: a rebuild elsewhere during the bench must not swap them.
    let (stall, wl, nvml_lib) =
        (private_copy(&stall, &bin)?, private_copy(&wl, &bin)?, private_copy(&nvml_lib, &bin)?);
    let strace = which("strace");
    if strace.is_none() {
        println!("xtask bench: strace is not installed; its mode is skipped (apt-get install strace)");
    }
    let before = match &opts.before {
        Some(rev) => {
            let built = before::build(rev)?;
            let dir = bin.join("before");
            fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            Some(before::Build { stall: private_copy(&built.stall, &dir)?, rev: built.rev })
        }
        None => None,
    };
    let env = Env { dir, wl, stall, nvml_lib, strace, before, quiet: Cell::new(Quiet::default()) };

    let runs = opts.runs.unwrap_or(if opts.quick { 3 } else { 5 });
    ensure!(runs >= 1, "--runs must be at least 1");
    let load_before = loadavg();
    let files = prepare_files(&env.dir, &stand_ins, opts.quick)?;
    if opts.daemon_only {
        let daemon = daemon::run(&env, &files.small, &env.nvml_lib, runs, opts.quick)?;
        print!("{}", report::daemon_text(&daemon, env.before.as_ref().map(|b| b.rev.as_str())));
        return Ok(());
    }
    let mut workloads = workloads(&files, opts.quick);
    let modes: Vec<Mode> = Mode::ALL
        .into_iter()
        .filter(|m| *m != Mode::Strace || env.strace.is_some())
        .filter(|m| *m != Mode::Before || env.before.is_some())
        .collect();

    for w in &mut workloads {
        let runs = runs * w.rounds_per_run;
        println!("xtask bench: {}: {} — {runs} runs × {} modes", w.key, w.title, modes.len());
        warm(&files)?;
        for run in 0..runs {
            // Rotate the order so that no mode always runs first (or last).
            for k in 0..modes.len() {
                let mode = modes[(run + k) % modes.len()];
                let s = sample(&env, mode, w)
                    .with_context(|| format!("workload {} under {}", w.key, mode.label()))?;
                println!(
                    "  run {}/{runs} {:<22} {:>9} ops {:>9.3} s {:>10.1} ns/{}",
                    run + 1,
                    mode.label(),
                    s.ops,
                    s.ns as f64 / 1e9,
                    s.ns_per_op(),
                    w.unit
                );
                w.samples.push((mode, s));
            }
        }
    }

    println!("xtask bench: in-kernel cost (BPF run-time statistics while stall is attached)");
    let profiles = profile::run(&env, &files, if opts.quick { 1.5 } else { 2.0 })?;

    println!("xtask bench: agent cost (stall attach --pid, CPU and peak RSS from wait4)");
    let cost = agent_cost(&env, &files, opts.quick)?;

    println!("xtask bench: stall daemon on a node (a watched GPU job's reads and an untraced neighbour's)");
    let daemon = daemon::run(&env, &files.small, &env.nvml_lib, runs, opts.quick)?;

    println!("xtask bench: Python stacks (a tight Python loop's iterations per second)");
    let py = pystacks::run(&env, runs, opts.quick)?;

    let meta = report::Meta {
        quick: opts.quick,
        runs,
        strace: env.strace.is_some(),
        minutes: started.elapsed().as_secs_f64() / 60.0,
        quiet: env.quiet.get(),
        load: (load_before, loadavg()),
        before: env.before.as_ref().map(|b| b.rev.clone()),
    };
    let doc = report::render(&meta, &workloads, &profiles, &cost, &daemon, &py);
    let path = cmd::workspace_root().join("docs/PERFORMANCE.md");
    fs::write(&path, &doc).with_context(|| format!("writing {}", path.display()))?;
    println!("{}", report::targets_text(&workloads, &cost, &daemon));
    println!("xtask bench: wrote {} ({:.1} min)", path.display(), meta.minutes);
    Ok(())
}

struct Files {
    /// 64 MiB, the 4 KiB read loops.
    small: PathBuf,
    /// One per DataLoader-like worker.
    shards: Vec<PathBuf>,
    /// Where copy-4k writes.
    copy_to: PathBuf,
    /// The stand-in CUDA library under the runtime's name, `cuda/libcudart.so.13`:
    /// stall probes a library by its file name.
    cudart: PathBuf,
    /// The stand-in NCCL, `cuda/libnccl.so.2`.
    nccl: PathBuf,
}

/// Creates the files once (deterministic content) and leaves them cached;
/// copies the stand-in CUDA and NCCL libraries (`stand_ins`) in under the
/// real libraries' names.
fn prepare_files(dir: &Path, stand_ins: &(PathBuf, PathBuf), quick: bool) -> Result<Files> {
    let shard_mib = if quick { 64 } else { 128 };
    let small = dir.join("pread-64m");
    make_file(&small, 64 << 20, 1)?;
    let shards: Vec<PathBuf> = (0..4)
        .map(|i| {
            let p = dir.join(format!("shard-{i}"));
            make_file(&p, shard_mib << 20, 2 + i as u64).map(|()| p)
        })
        .collect::<Result<_>>()?;
    let cuda = dir.join("cuda");
    fs::create_dir_all(&cuda).with_context(|| format!("creating {}", cuda.display()))?;
    let (cudart, nccl) = (cuda.join("libcudart.so.13"), cuda.join("libnccl.so.2"));
    for (from, to) in [(&stand_ins.0, &cudart), (&stand_ins.1, &nccl)] {
        let _ = fs::remove_file(to);
        fs::copy(from, to).with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    }
    Ok(Files { small, shards, copy_to: dir.join("copy-1m"), cudart, nccl })
}

fn make_file(path: &Path, len: u64, seed: u64) -> Result<()> {
    if fs::metadata(path).is_ok_and(|m| m.len() == len) {
        return Ok(());
    }
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ seed;
    let mut data = Vec::with_capacity(len as usize);
    while (data.len() as u64) < len {
        // xorshift64: incompressible, reproducible.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(&x.to_le_bytes());
    }
    fs::write(path, &data).with_context(|| format!("writing {}", path.display()))
}

/// Reads every file once so that the loops hit the page cache.
fn warm(files: &Files) -> Result<()> {
    for p in std::iter::once(&files.small).chain(&files.shards) {
        let _ = fs::read(p).with_context(|| format!("reading {}", p.display()))?;
    }
    Ok(())
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn workloads(files: &Files, quick: bool) -> Vec<Workload> {
    let small = files.small.display().to_string();
    let shards: Vec<String> = files.shards.iter().map(|p| p.display().to_string()).collect();
    let (reads, passes, iters, forks) =
        if quick { (131_072u64, 6u64, 50_000u64, 2_000u64) } else { (262_144, 12, 100_000, 5_000) };
    let pread = |n: u64| strs(&["pread", "--file", &small, "--ops", &n.to_string()]);
    let copy_to = files.copy_to.display().to_string();
    let copy = |n: u64| strs(&["pread", "--file", &small, "--ops", &n.to_string(), "--copy-to", &copy_to]);
    let loader = |p: u64| strs(&["loader", "--files", &shards.join(","), "--passes", &p.to_string()]);
    let cold_loader =
        |p: u64| strs(&["loader", "--files", &shards.join(","), "--passes", &p.to_string(), "--cold", "1"]);
    let mapped_loader =
        |p: u64| strs(&["loader", "--files", &shards.join(","), "--passes", &p.to_string(), "--mmap", "1"]);
    let futex = |n: u64| strs(&["futex", "--iters", &n.to_string(), "--cpu", "1"]);
    let fork = |n: u64| strs(&["fork", "--n", &n.to_string()]);
    let cudart = files.cudart.display().to_string();
    let cuda =
        |call: &str, n: u64| strs(&["cuda", "--lib", &cudart, "--call", call, "--ops", &n.to_string()]);
    let nccl_lib = files.nccl.display().to_string();
    let nccl = |n: u64| strs(&["nccl", "--lib", &cudart, "--nccl-lib", &nccl_lib, "--ops", &n.to_string()]);
    // Each op hands the all-reduce to the stand-ins' threads and back (some
    // tens of µs bare): far fewer.
    let all_reduces = if quick { 5_000u64 } else { 20_000 };
    // A few hundred ns per launch and tens per idle sync bare, but a
    // uprobe's trap per call under stall: sized for the traced loop, which
    // is tens of times the bare one, to stay near ten seconds.
    let (launches, syncs) = if quick { (500_000u64, 2_000_000u64) } else { (1_000_000, 4_000_000) };
    let w = |key, title, what: String, unit, args, strace_args, neighbour| Workload {
        key,
        title,
        what,
        unit,
        args,
        strace_args,
        neighbour,
        rounds_per_run: if matches!(key, "pread-4k" | "copy-4k" | "futex-pingpong") {
            PER_CALL_ROUNDS
        } else {
            1
        },
        samples: Vec::new(),
    };
    vec![
        w(
            "pread-4k",
            "4 KiB page-cache reads (worst case)",
            format!(
                "{reads} `pread`s of 4 KiB walking a cached 64 MiB file, one thread (strace: {} reads)",
                reads / 16
            ),
            "read",
            pread(reads),
            pread(reads / 16),
            false,
        ),
        w(
            "copy-4k",
            "4 KiB read + 4 KiB write per block (dd bs=4k)",
            format!(
                "{} blocks: a `pread` of 4 KiB from the cached 64 MiB file, then a `pwrite` of it into a 1 MiB \
                 file beside it (overwritten in turn: its pages stay in memory), one thread; strace traces the \
                 reads only (strace: {} blocks)",
                reads / 2,
                reads / 32
            ),
            "block",
            copy(reads / 2),
            copy(reads / 32),
            false,
        ),
        w(
            "loader",
            "DataLoader-like: 4 worker processes, 1 MiB reads",
            format!(
                "4 forked workers, each reading its own cached {} MiB file in 1 MiB `read`s, {passes} passes \
                 (open, read to EOF, close); timed from all workers ready to the last exit",
                if quick { 64 } else { 128 }
            ),
            "1 MiB read",
            loader(passes),
            loader(passes),
            false,
        ),
        w(
            "loader-cold",
            "DataLoader-like from storage: the same, page cache evicted",
            format!(
                "as loader, but each pass evicts its file first (POSIX_FADV_DONTNEED): every read goes to \
                 storage and fills the page cache, which stall counts as storage bytes; {} passes",
                passes / 4
            ),
            "1 MiB read",
            cold_loader(passes / 4),
            cold_loader(passes / 4),
            false,
        ),
        w(
            "loader-mmap",
            "DataLoader-like through mappings: the same files mapped, page cache warm",
            format!(
                "as loader, but each pass maps its file, touches every page and unmaps it (as \
                 `torch.load(mmap=True)` or an Arrow dataset would): the bytes arrive by page faults, \
                 which stall counts as mapped bytes; {} passes (a fault maps up to a large folio: \
                 few faults per pass)",
                passes * 16
            ),
            "1 MiB mapped",
            mapped_loader(passes * 16),
            mapped_loader(passes * 16),
            false,
        ),
        w(
            "futex-pingpong",
            "futex ping-pong (context switches)",
            format!(
                "two threads pinned to CPU 1 hand a futex word back and forth {iters} times; ops = the \
                 process's context switches (getrusage) (strace: {} iterations)",
                iters / 10
            ),
            "switch",
            futex(iters),
            futex(iters / 10),
            false,
        ),
        w(
            "fork-storm",
            "fork/exit storm",
            format!("`fork`, child `_exit(0)`, `waitpid`, {forks} times (strace: {} times)", forks / 10),
            "fork",
            fork(forks),
            fork(forks / 10),
            false,
        ),
        w(
            "cuda-launch",
            "CUDA kernel launches through the job's libcudart (stand-in library)",
            format!(
                "{launches} `cudaLaunchKernel`s on the legacy stream, one thread, with a \
                 `cudaStreamSynchronize` after every 1,000 (timed, not counted as launches), through the \
                 stand-in CUDA library (`tests/cuda-stub`, kernels set to take no time) copied in as \
                 `libcudart.so.13` and `dlopen`ed: under stall each launch hits an entry uprobe that counts it \
                 (no clock read); the clock starts once the probes are in. The floor attaches no GPU probes: \
                 its row is the cost of the rest of stall's programs, without the uprobe's trap"
            ),
            "launch",
            cuda("launch", launches),
            cuda("launch", launches),
            false,
        ),
        w(
            "cuda-sync",
            "CUDA stream synchronizations, stream idle",
            format!(
                "{syncs} `cudaStreamSynchronize`s of the idle legacy stream, one thread, through the same \
                 stand-in `libcudart.so.13`: under stall each hits an entry and a return uprobe, which time \
                 it; the clock starts once the probes are in. The floor attaches no GPU probes: its row is the \
                 cost of the rest of stall's programs, without the uprobes' traps"
            ),
            "sync",
            cuda("sync", syncs),
            cuda("sync", syncs),
            false,
        ),
        w(
            "nccl-allreduce",
            "NCCL all-reduces through the job's libnccl (stand-in library)",
            format!(
                "{all_reduces} `ncclAllReduce`s of one float on a one-rank communicator, each followed by the \
                 `cudaStreamSynchronize` that waits for it, one thread, through the stand-in NCCL \
                 (`tests/nccl-stub`, completing on the stand-in CUDA stream) copied in as `libnccl.so.2`: under \
                 stall each all-reduce hits an entry uprobe that stamps its arrival in the communicator's ring, \
                 and the synchronization its two; the clock starts once the probes are in. The floor \
                 attaches no GPU probes"
            ),
            "all-reduce",
            nccl(all_reduces),
            nccl(all_reduces / 10),
            false,
        ),
        w(
            "neighbour",
            "untraced neighbour",
            format!(
                "an untraced process does {reads} 4 KiB `pread`s (as in pread-4k) while the mode traces another job \
                 reading 4 KiB at {NEIGHBOUR_JOB_RATE} reads/s; the neighbour's time is measured"
            ),
            "read",
            pread(reads),
            pread(reads),
            true,
        ),
    ]
}

/// The command line for `args` under `mode`.
fn wrap(env: &Env, mode: Mode, args: &[String], out: &Path) -> Command {
    let mut all: Vec<OsString> = args.iter().map(OsString::from).collect();
    all.push("--out".into());
    all.push(out.into());
    let mut c = match mode {
        Mode::Baseline => return with_args(Command::new(&env.wl), all),
        Mode::Stall | Mode::Floor | Mode::Timeline | Mode::Before => {
            let stall = match (mode, &env.before) {
                (Mode::Before, Some(b)) => &b.stall,
                _ => &env.stall,
            };
            let mut c = Command::new(stall);
            c.arg("run");
            if mode == Mode::Floor {
                c.arg("--floor");
            }
            if mode == Mode::Timeline {
                c.arg("--timeline").arg(env.dir.join("timeline.json.gz"));
            }
            c.args(["--gpu", "off", "-q", "--"]);
            c
        }
        Mode::Strace => {
            let mut c = Command::new(env.strace.as_ref().expect("strace mode without strace"));
            c.args(["-f", "-qq", "-o", "/dev/null", "-e", STRACE_FILTER, "--"]);
            c
        }
    };
    c.arg(&env.wl);
    with_args(c, all)
}

fn with_args(mut c: Command, args: Vec<OsString>) -> Command {
    c.args(args);
    c
}

fn sample(env: &Env, mode: Mode, w: &Workload) -> Result<Sample> {
    env.wait_quiet();
    let out = env.dir.join("out");
    let _ = fs::remove_file(&out);
    let args = if mode == Mode::Strace { &w.strace_args } else { &w.args };
    if w.neighbour {
        return neighbour(env, mode, args, &out);
    }
    run_timed(env, wrap(env, mode, args, &out), RUN_TIMEOUT)?;
    let s = parse_sample(&out)?;
    // The cuda workloads say whether the library's calls carried probes
    // when their clock started: under stall (as built now) they must.
    if matches!(mode, Mode::Stall | Mode::Timeline) {
        let line = fs::read_to_string(&out).unwrap_or_default();
        ensure!(kv(&line, "probed") != Some("0"), "stall's uprobes were not in place when the loop started");
    }
    Ok(s)
}

/// The neighbour workload: the traced job runs under `mode` while `args` run untraced beside it.
fn neighbour(env: &Env, mode: Mode, args: &[String], out: &Path) -> Result<Sample> {
    let (ready, stop) = (env.dir.join("ready"), env.dir.join("stop"));
    let _ = fs::remove_file(&ready);
    let _ = fs::remove_file(&stop);
    let small = env.dir.join("pread-64m").display().to_string();
    let job_args = strs(&[
        "pread",
        "--file",
        &small,
        "--rate",
        &NEIGHBOUR_JOB_RATE.to_string(),
        "--ready-file",
        &ready.display().to_string(),
        "--stop-file",
        &stop.display().to_string(),
    ]);
    let mut job = Spawned::start(env, wrap(env, mode, &job_args, &env.dir.join("job.out")))?;
    // `stall run` starts the command only once it is tracked: ready means traced.
    let t0 = Instant::now();
    while !ready.exists() {
        if let Some(st) = job.child.try_wait()? {
            bail!("the traced job exited early ({st}): {}", job.stderr());
        }
        ensure!(t0.elapsed() < Duration::from_secs(60), "the traced job did not start within 60 s");
        thread::sleep(Duration::from_millis(10));
    }
    thread::sleep(Duration::from_millis(200));
    let r = run_timed(env, wrap(env, Mode::Baseline, args, out), RUN_TIMEOUT);
    fs::write(&stop, "stop")?;
    job.wait(Duration::from_secs(60))?;
    r?;
    parse_sample(out)
}

/// A child with its stderr in a file (no pipe to fill up).
struct Spawned {
    child: Child,
    err: PathBuf,
    shown: String,
}

impl Spawned {
    fn start(env: &Env, mut c: Command) -> Result<Self> {
        let shown = cmd::describe(&c);
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let err = env.dir.join(format!("stderr-{}", SEQ.fetch_add(1, Ordering::Relaxed)));
        let file = fs::File::create(&err)?;
        let child = c
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .with_context(|| format!("could not start `{shown}`"))?;
        Ok(Self { child, err, shown })
    }

    fn stderr(&self) -> String {
        let s = fs::read_to_string(&self.err).unwrap_or_default();
        let tail: Vec<&str> = s.lines().rev().take(5).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }

    /// Waits; past `limit` asks it to stop (SIGTERM: `stall run` passes it
    /// on to the command), then kills it.
    fn wait(&mut self, limit: Duration) -> Result<ExitStatus> {
        let t0 = Instant::now();
        let mut termed = false;
        loop {
            if let Some(st) = self.child.try_wait()? {
                ensure!(st.success(), "`{}` failed ({st}): {}", self.shown, self.stderr());
                return Ok(st);
            }
            if t0.elapsed() > limit && !termed {
                let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
                termed = true;
            }
            if t0.elapsed() > limit + Duration::from_secs(10) {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!("`{}` ran past {} s and was killed", self.shown, limit.as_secs());
            }
            thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Spawned {
    /// On an early return: stop what is still running (our own child, by PID).
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
            let t0 = Instant::now();
            while matches!(self.child.try_wait(), Ok(None)) && t0.elapsed() < Duration::from_secs(5) {
                thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = fs::remove_file(&self.err);
    }
}

fn run_timed(env: &Env, c: Command, limit: Duration) -> Result<ExitStatus> {
    Spawned::start(env, c)?.wait(limit)
}

fn kv<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|f| f.strip_prefix(key)?.strip_prefix('='))
}

fn parse_sample(out: &Path) -> Result<Sample> {
    let s = fs::read_to_string(out).with_context(|| format!("the workload wrote no {}", out.display()))?;
    let ops = kv(&s, "ops").and_then(|v| v.parse().ok());
    let ns = kv(&s, "ns").and_then(|v| v.parse().ok());
    match (ops, ns) {
        (Some(ops), Some(ns)) if ops > 0 => Ok(Sample { ops, ns }),
        _ => bail!("unexpected workload output {s:?}"),
    }
}

/// stall's own cost while attached to a job at a given rate.
fn agent_cost(env: &Env, files: &Files, quick: bool) -> Result<Vec<CostRow>> {
    let secs: f64 = if quick { 3.0 } else { 8.0 };
    let small = files.small.display().to_string();
    // (label, workload, rate, threads, events per op, ring-buffer records per op)
    let reads =
        |label: &str, rate: Option<u64>, threads: u32| (label.to_string(), "pread", rate, threads, 2.0, 0.0);
    let mut plan = vec![
        reads("idle job (100 reads/s)", Some(100), 1),
        reads("50k reads/s (≈100k events/s)", Some(50_000), 1),
    ];
    if !quick {
        plan.push(reads("100k reads/s", Some(100_000), 1));
        plan.push(reads("250k reads/s", Some(250_000), 1));
        plan.push(reads("500k reads/s", Some(500_000), 2));
    }
    plan.push(reads("1M reads/s (2 threads)", Some(1_000_000), 2));
    if !quick {
        plan.push(reads("unpaced reads (2 threads)", None, 2));
    }
    // openat enter+exit, pread enter+exit, close enter; an open and a close record.
    plan.push(("open+read+close, unpaced".to_string(), "openclose", None, 1, 5.0, 2.0));
    if !quick {
        // Counted: the task-creation and exit records only (switches and
        // wakeups of the short-lived children come on top).
        plan.push(("fork/exit storm, unpaced (events: records only)".to_string(), "fork", None, 1, 2.0, 2.0));
    }

    let mut rows = Vec::new();
    for (label, kind, rate, threads, events_per_op, records_per_op) in plan {
        env.wait_quiet();
        let (ready, stop) = (env.dir.join("ready"), env.dir.join("stop"));
        let _ = fs::remove_file(&ready);
        let _ = fs::remove_file(&stop);
        let mut args = strs(&[kind, "--file", &small, "--stop-file", &stop.display().to_string()]);
        if kind == "pread" {
            args.extend(strs(&["--threads", &threads.to_string()]));
            args.extend(strs(&["--ready-file", &ready.display().to_string()]));
        }
        // A safety net: the job ends on its own if anything below hangs.
        args.extend(strs(&["--secs", &(secs + 60.0).to_string()]));
        if let Some(r) = rate {
            args.extend(strs(&["--rate", &r.to_string()]));
        }
        let job_out = env.dir.join("job.out");
        let _ = fs::remove_file(&job_out);
        let mut job = Spawned::start(env, wrap(env, Mode::Baseline, &args, &job_out))?;
        thread::sleep(Duration::from_millis(300));
        let (ru, json) = (env.dir.join("rusage"), env.dir.join("stall.json"));
        let _ = fs::remove_file(&ru);
        let _ = fs::remove_file(&json);
        let mut attach = Command::new(&env.wl);
        attach.arg("rusage").arg("--out").arg(&ru).arg("--").arg(&env.stall);
        attach.args(["attach", "--pid", &job.child.id().to_string(), "--duration", &secs.to_string()]);
        attach.args(["--gpu", "off", "-q", "--json"]).arg(&json);
        let started = Instant::now();
        let mut wrapper = Spawned::start(env, attach)?;
        let steady_pct = steady_cpu_pct(wrapper.child.id(), started, secs);
        let r = wrapper.wait(RUN_TIMEOUT);
        fs::write(&stop, "stop")?;
        job.wait(Duration::from_secs(90))?;
        r.with_context(|| format!("stall attach to {label}"))?;
        let job = parse_sample(&job_out)?;
        let ru = fs::read_to_string(&ru)?;
        let f = |k: &str| kv(&ru, k).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        let summary = fs::read_to_string(&json)?
            .lines()
            .find(|l| l.contains("\"type\":\"summary\""))
            .map(str::to_string)
            .with_context(|| format!("no summary record in {}", json.display()))?;
        let row = CostRow {
            label,
            rate,
            achieved: job.ops as f64 / (job.ns as f64 / 1e9),
            events_per_op,
            records_per_op,
            traced_s: json_num(&summary, "elapsed_s").unwrap_or(secs),
            cpu_s: f("utime_s") + f("stime_s"),
            steady_pct,
            rss_kb: f("maxrss_kb") as u64,
            lost: json_num(&summary, "lost_events").unwrap_or(f64::NAN) as u64,
        };
        println!(
            "  {:<32} {:>10.0} ops/s  stall {:.3} CPU s over {:.1} s ({:.2}% of a core; once attached {}), peak RSS \
             {:.1} MiB, lost {}",
            row.label,
            row.achieved,
            row.cpu_s,
            row.traced_s,
            row.core_pct(),
            row.steady_pct.map_or("—".into(), |p| format!("{p:.2}%")),
            row.rss_kb as f64 / 1024.0,
            row.lost
        );
        rows.push(row);
    }
    Ok(rows)
}

/// The CPU that stall (the child of the `bench-wl rusage` at `wrapper`,
/// started at `started` for `secs`) uses once it has loaded its programs
/// and made its first look, over the middle of its run, as % of one core:
/// the sum of its threads' on-CPU time (`schedstat`, in ns) at both ends.
/// None where it cannot be read (no schedstat, or stall not found in time).
fn steady_cpu_pct(wrapper: u32, started: Instant, secs: f64) -> Option<f64> {
    let end = started + Duration::from_secs_f64((secs - 0.5).max(0.0));
    let stall = loop {
        let children =
            fs::read_to_string(format!("/proc/{wrapper}/task/{wrapper}/children")).unwrap_or_default();
        if let Some(pid) = children.split_whitespace().next().and_then(|p| p.parse::<u32>().ok()) {
            if profile::prog_count(pid) >= profile::LOADED {
                break pid;
            }
        }
        if Instant::now() >= end {
            return None;
        }
        thread::sleep(Duration::from_millis(20));
    };
    thread::sleep(Duration::from_millis(700));
    let (t0, cpu0) = (Instant::now(), on_cpu_ns(stall)?);
    let left = end.checked_duration_since(t0).filter(|d| *d >= Duration::from_secs(1))?;
    thread::sleep(left);
    let (t1, cpu1) = (Instant::now(), on_cpu_ns(stall)?);
    Some(100.0 * cpu1.saturating_sub(cpu0) as f64 / (t1 - t0).as_nanos() as f64)
}

/// The on-CPU time of all of `pid`'s threads so far, ns (`schedstat`).
fn on_cpu_ns(pid: u32) -> Option<u64> {
    let mut sum = 0;
    for t in fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
        // A thread that ended meanwhile takes its time with it.
        let Ok(s) = fs::read_to_string(t.path().join("schedstat")) else { continue };
        sum += s.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    }
    Some(sum)
}

/// A top-level number in one JSON record (the first occurrence of the key).
fn json_num(record: &str, key: &str) -> Option<f64> {
    let at = record.find(&format!("\"{key}\":"))? + key.len() + 3;
    let rest = record[at..].trim_start();
    let end = rest.find(|c: char| !(c.is_ascii_digit() || "+-.eE".contains(c))).unwrap_or(rest.len());
    rest[..end].parse().ok()
}

fn private_copy(b: &Path, dir: &Path) -> Result<PathBuf> {
    ensure!(b.is_file(), "{} is missing (run without --no-build)", b.display());
    let to = dir.join(b.file_name().context("a binary without a name")?);
    let _ = fs::remove_file(&to);
    fs::copy(b, &to).with_context(|| format!("copying {} to {}", b.display(), to.display()))?;
    Ok(to)
}

/// The 1-minute load average.
fn loadavg() -> f64 {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::split_paths(cmd::tool_path()).map(|d| d.join(name)).find(|p| p.is_file())
}

/// Shell output of a small command, trimmed; empty if it fails.
pub fn sh(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_workload_lines_and_json_numbers() {
        let line = "ops=200011 ns=436763173 handoffs=200000\n";
        assert_eq!(kv(line, "ops"), Some("200011"));
        assert_eq!(kv(line, "ns"), Some("436763173"));
        assert_eq!(kv(line, "handoffs"), Some("200000"));
        let rec = r#"{"type":"summary","elapsed_s":1.0953,"lost_events":0,"lost_by_cause":{}}"#;
        assert_eq!(json_num(rec, "elapsed_s"), Some(1.0953));
        assert_eq!(json_num(rec, "lost_events"), Some(0.0));
        assert_eq!(json_num(rec, "missing"), None);
    }
}
