//! What `stall daemon` costs a node, side by side in one run: 4 KiB page-cache
//! reads by a process of a watched GPU job and by an untraced neighbour, and
//! an untraced neighbour that switches often (futex ping-pong pinned to one
//! CPU: a wakeup and a context switch per hand-off, what NCCL proxies, data
//! loaders and RPC servers do), with no daemon, with the daemon in its
//! cheap tier (the job's scripted GPU busy: no scheduler or syscall hook is
//! attached, the job's threads are read from /proc), and with the job
//! escalated to the full capture (its GPU idle).

use std::{
    fs,
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};

use super::{
    kv, parse_sample,
    profile::{self, Profile},
    run_timed, strs, wrap, Env, Mode, Sample, Spawned, RUN_TIMEOUT,
};

/// How the node is watched while a sample runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Watch {
    NoDaemon,
    Cheap,
    Escalated,
}

impl Watch {
    pub const ALL: [Watch; 3] = [Watch::NoDaemon, Watch::Cheap, Watch::Escalated];

    pub fn label(self) -> &'static str {
        match self {
            Watch::NoDaemon => "no daemon",
            Watch::Cheap => "daemon, job healthy (cheap tier)",
            Watch::Escalated => "daemon, job escalated (full capture)",
        }
    }
}

/// Samples of the job's own reads, the neighbour's, and the switching
/// neighbour's context switches, per watch.
pub struct DaemonBench {
    pub reads: u64,
    pub rounds: usize,
    pub job: Vec<(Watch, Sample)>,
    pub neighbour: Vec<(Watch, Sample)>,
    pub switches: u64,
    pub switcher: Vec<(Watch, Sample)>,
    /// The daemon's programs per switch of the switching neighbour, in the
    /// cheap tier and escalated (and under the `--before` build).
    pub profiles: Vec<Profile>,
}

/// Rounds of the watches: more than the other workloads' runs, as the
/// differences to resolve are a few percent.
const MIN_ROUNDS: usize = 6;

pub fn run(env: &Env, small: &Path, nvml_lib: &Path, runs: usize, quick: bool) -> Result<DaemonBench> {
    let reads: u64 = if quick { 131_072 } else { 262_144 };
    // Round trips (two switches each), on the last CPU.
    let handoffs: u64 = if quick { 100_000 } else { 250_000 };
    let cpu = std::thread::available_parallelism().map_or(1, |n| n.get()) - 1;
    let rounds = runs.max(MIN_ROUNDS);
    let mut out = DaemonBench {
        reads,
        rounds,
        job: Vec::new(),
        neighbour: Vec::new(),
        switches: 2 * handoffs,
        switcher: Vec::new(),
        profiles: Vec::new(),
    };
    let node = Node::new(env, nvml_lib)?;
    let pread = strs(&["pread", "--file", &small.display().to_string(), "--ops", &reads.to_string()]);
    let futex = strs(&["futex", "--iters", &handoffs.to_string(), "--cpu", &cpu.to_string()]);
    for run in 0..rounds {
        for k in 0..Watch::ALL.len() {
            let watch = Watch::ALL[(run + k) % Watch::ALL.len()];
            env.wait_quiet();
            let (mut holder, daemon) = node.watch(env, watch, &Stall::now(env))?;
            // The job's own reads, from inside its cgroup (the shell moves
            // itself there, then becomes the workload).
            let job_out = env.dir.join("daemon-job.out");
            let _ = fs::remove_file(&job_out);
            let mut job = Command::new("sh");
            job.arg("-c")
                .arg(r#"echo $$ > "$0" && exec "$@""#)
                .arg(node.job.0.join("cgroup.procs"))
                .arg(&env.wl)
                .args(&pread)
                .arg("--out")
                .arg(&job_out);
            let r = run_timed(env, job, RUN_TIMEOUT).and_then(|_| parse_sample(&job_out));
            let n_out = env.dir.join("daemon-neighbour.out");
            let _ = fs::remove_file(&n_out);
            let n = run_timed(env, wrap(env, Mode::Baseline, &pread, &n_out), RUN_TIMEOUT)
                .and_then(|_| parse_sample(&n_out));
            let f_out = env.dir.join("daemon-switcher.out");
            let _ = fs::remove_file(&f_out);
            let f = run_timed(env, wrap(env, Mode::Baseline, &futex, &f_out), RUN_TIMEOUT)
                .and_then(|_| parse_sample(&f_out));
            if let Some(d) = &daemon {
                // Still in the tier asked for at the end of the sample?
                d.wait_hooks(watch == Watch::Escalated).with_context(|| {
                    format!("the daemon left its tier during the {} sample", watch.label())
                })?;
            }
            drop(daemon);
            let _ = holder.child.kill();
            let _ = holder.child.wait();
            let (j, n, f) = (r?, n?, f?);
            println!(
                "  run {}/{rounds} {:<52} job {:>7.1} ns/read, neighbour {:>7.1} ns/read, switcher {:>7.1} ns/switch",
                run + 1,
                watch.label(),
                j.ns_per_op(),
                n.ns_per_op(),
                f.ns_per_op()
            );
            out.job.push((watch, j));
            out.neighbour.push((watch, n));
            out.switcher.push((watch, f));
        }
    }
    let mut builds = vec![Stall::now(env)];
    if let Some(b) = &env.before {
        builds.push(Stall { path: b.stall.clone(), before: true });
    }
    for (watch, label) in [
        (Watch::Cheap, "daemon, job healthy (cheap tier): an untraced neighbour's futex ping-pong"),
        (Watch::Escalated, "daemon, job escalated (full capture): an untraced neighbour's futex ping-pong"),
    ] {
        for stall in &builds {
            env.wait_quiet();
            let secs = if quick { 1.5 } else { 2.0 };
            let prof = node
                .profile(env, watch, stall, label, cpu, secs)
                .with_context(|| format!("profiling {label}"))?;
            println!(
                "  {:<76} {:>7.0} ns of BPF programs per switch ({:.0} switches/s){}",
                prof.label,
                prof.total_ns() as f64 / prof.ops().max(1.0),
                prof.ops_per_s,
                if stall.before { " (before)" } else { "" }
            );
            out.profiles.push(prof);
        }
    }
    Ok(out)
}

/// Which build of stall runs the daemon.
struct Stall {
    path: PathBuf,
    /// The `--before` build: it exports no `stall_scheduler_hooks_attached`.
    before: bool,
}

impl Stall {
    fn now(env: &Env) -> Self {
        Self { path: env.stall.clone(), before: false }
    }
}

/// The node of the bench: a root cgroup for the daemon, with the GPU job's
/// cgroup in it, and the job's scripted GPU.
struct Node {
    mount: PathBuf,
    // Fields drop in this order: the job's cgroup must go before the root
    // that holds it, or the root cannot be removed and is left behind.
    job: Cg,
    root: Cg,
    script: PathBuf,
    pid_file: PathBuf,
    nvml_lib: PathBuf,
}

impl Node {
    fn new(env: &Env, nvml_lib: &Path) -> Result<Self> {
        let mount = cgroup2_mount()?;
        let root = Cg::create(&mount.join(format!("stall-bench-{}", std::process::id())))?;
        let job = Cg::create(&root.0.join("job"))?;
        Ok(Self {
            mount,
            job,
            root,
            script: env.dir.join("nvml-script.json"),
            pid_file: env.dir.join("gpu-holder.pid"),
            nvml_lib: nvml_lib.to_path_buf(),
        })
    }

    /// The GPU job (a process holding the scripted GPU, in the job's
    /// cgroup) and the daemon `watch` asks for (run by `stall`), in its tier.
    fn watch(&self, env: &Env, watch: Watch, stall: &Stall) -> Result<(Spawned, Option<Daemon>)> {
        let holder = Spawned::start(env, {
            let mut c = Command::new("sleep");
            c.arg("600");
            c
        })?;
        self.job.add(holder.child.id())?;
        fs::write(&self.pid_file, holder.child.id().to_string())?;
        write_script(&self.script, &self.pid_file, watch != Watch::Escalated)?;
        let daemon = match watch {
            Watch::NoDaemon => None,
            _ => Some(Daemon::start(env, self, stall)?),
        };
        if let Some(d) = &daemon {
            d.wait_hooks(watch == Watch::Escalated)?;
        }
        Ok((holder, daemon))
    }

    /// The daemon's programs (kernel run-time statistics) while an untraced
    /// neighbour hands a futex back and forth on `cpu`, for `secs`.
    fn profile(
        &self,
        env: &Env,
        watch: Watch,
        stall: &Stall,
        label: &'static str,
        cpu: usize,
        secs: f64,
    ) -> Result<Profile> {
        let (mut holder, daemon) = self.watch(env, watch, stall)?;
        let daemon = daemon.context("a watch with a daemon")?;
        let f_out = env.dir.join("daemon-profile-switcher.out");
        let _ = fs::remove_file(&f_out);
        let futex = strs(&["futex", "--secs", &(secs + 1.0).to_string(), "--cpu", &cpu.to_string()]);
        let mut switcher = Spawned::start(env, wrap(env, Mode::Baseline, &futex, &f_out))?;
        thread::sleep(Duration::from_millis(300));
        let prof_out = env.dir.join("daemon-prof.out");
        let _ = fs::remove_file(&prof_out);
        let mut cmd = Command::new(&env.wl);
        cmd.args([
            "bpf-prof",
            "--pid",
            &daemon.proc.child.id().to_string(),
            "--secs",
            &secs.to_string(),
            "--out",
        ]);
        cmd.arg(&prof_out);
        let r = run_timed(env, cmd, RUN_TIMEOUT);
        switcher.wait(Duration::from_secs(60))?;
        drop(daemon);
        let _ = holder.child.kill();
        let _ = holder.child.wait();
        r?;
        let counted = parse_sample(&f_out)?;
        let text = fs::read_to_string(&prof_out)?;
        Ok(Profile {
            label,
            unit: "switch",
            floor: false,
            secs: kv(&text, "secs").and_then(|v| v.parse().ok()).unwrap_or(secs),
            ops_per_s: counted.ops as f64 / (counted.ns as f64 / 1e9),
            progs: profile::parse_progs(&text),
            before: stall.before,
        })
    }
}

fn write_script(script: &Path, pid_file: &Path, busy: bool) -> Result<()> {
    let (util, power) = if busy { (100, 650_000) } else { (0, 60_000) };
    let text = serde_json::json!({"devices": [{"name": "Scripted H200", "power_limit_mw": 700_000,
        "phases": [{"util_pct": util, "power_mw": power,
                    "processes": [{"pid_file": pid_file, "used_mem_bytes": 1_000_000_000u64}]}]}]});
    let tmp = script.with_extension("tmp");
    fs::write(&tmp, text.to_string())?;
    fs::rename(&tmp, script)?;
    Ok(())
}

/// A `stall daemon` of the bench, stopped (SIGTERM) when dropped.
struct Daemon {
    proc: Spawned,
    port: u16,
    /// It exports `stall_scheduler_hooks_attached`.
    sched_gauge: bool,
}

impl Daemon {
    /// A daemon watching `node`'s root.
    fn start(env: &Env, node: &Node, stall: &Stall) -> Result<Self> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let root = &node.root.0;
        let mut c = Command::new(&stall.path);
        c.arg("daemon").arg("--cgroup-root").arg(root.strip_prefix(&node.mount).unwrap_or(root));
        c.args(["--interval", "1", "--escalate-idle", "1", "--full-window", "600", "--listen"]);
        c.arg(format!("127.0.0.1:{port}")).arg("--nvml-lib").arg(&node.nvml_lib);
        c.env("STALL_NVML_SCRIPT", &node.script);
        Ok(Self { proc: Spawned::start(env, c)?, port, sched_gauge: !stall.before })
    }

    /// Waits until the job is watched and the full capture's hooks (syscall
    /// and scheduler) are `on` (or off).
    fn wait_hooks(&self, on: bool) -> Result<()> {
        let gauges = ["stall_syscall_hooks_attached", "stall_scheduler_hooks_attached"];
        let want: Vec<String> = gauges[..if self.sched_gauge { 2 } else { 1 }]
            .iter()
            .map(|name| format!("{name} {}", u8::from(on)))
            .collect();
        let t0 = Instant::now();
        loop {
            let text = http_get(self.port, "/metrics").unwrap_or_default();
            if text.contains("stall_capture_tier{") && want.iter().all(|w| text.lines().any(|l| l == w)) {
                return Ok(());
            }
            ensure!(
                t0.elapsed() < Duration::from_secs(60),
                "the daemon did not reach `{want:?}` within 60 s"
            );
            thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.proc.child.id().to_string()]).status();
        let _ = self.proc.wait(Duration::from_secs(20));
    }
}

fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    Some(text)
}

/// A cgroup of the bench, removed when dropped.
struct Cg(PathBuf);

impl Cg {
    fn create(path: &Path) -> Result<Self> {
        let _ = fs::remove_dir(path);
        fs::create_dir(path).with_context(|| format!("creating cgroup {}", path.display()))?;
        Ok(Self(path.to_path_buf()))
    }

    fn add(&self, pid: u32) -> Result<()> {
        fs::write(self.0.join("cgroup.procs"), pid.to_string())
            .with_context(|| format!("moving {pid} into {}", self.0.display()))
    }
}

impl Drop for Cg {
    fn drop(&mut self) {
        for _ in 0..100 {
            if fs::remove_dir(&self.0).is_ok() || !self.0.exists() {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

fn cgroup2_mount() -> Result<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo")?;
    for line in info.lines() {
        let (pre, post) = line.split_once(" - ").unwrap_or((line, ""));
        if post.starts_with("cgroup2 ") {
            if let Some(mnt) = pre.split_whitespace().nth(4) {
                return Ok(PathBuf::from(mnt));
            }
        }
    }
    bail!("no cgroup2 mount: the daemon bench needs one")
}
