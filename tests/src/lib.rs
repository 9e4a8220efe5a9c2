//! Helpers for stall's privileged integration tests: they run the real
//! `stall` binary on the running kernel against workloads whose ground truth
//! is known, and read its JSON summary.
//!
//! They need root (to load eBPF programs). Without it they fail loudly:
//! a skipped kernel test would hide exactly what CI is for.
use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Output, Stdio},
    sync::OnceLock,
    thread::{sleep, JoinHandle},
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};
use serde_json::Value;

/// The stall binary: $STALL_BIN (set by `cargo xtask test`), else the
/// workspace's release or debug build.
pub fn stall_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("STALL_BIN") {
        return PathBuf::from(p);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    for profile in ["release", "debug"] {
        let p = root.join("target").join(profile).join("stall");
        if p.exists() {
            return p;
        }
    }
    panic!("no stall binary: run `cargo xtask build --release` or set STALL_BIN");
}

/// Fails the test unless we can load BPF: never a silent skip.
pub fn require_root() {
    static CHECKED: OnceLock<()> = OnceLock::new();
    CHECKED.get_or_init(|| {
        assert!(
            nix::unistd::geteuid().is_root(),
            "stall's integration tests load eBPF programs and must run as root (refusing to skip them)"
        );
    });
}

/// A Python interpreter that is a real binary (not a shell shim), so the
/// traced tree holds only the workload.
pub fn python() -> &'static str {
    static PY: OnceLock<String> = OnceLock::new();
    PY.get_or_init(|| {
        for p in ["/usr/bin/python3", "/usr/local/bin/python3"] {
            if Path::new(p).exists() {
                return p.to_string();
            }
        }
        let out = Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .expect("python3 is needed by the workloads");
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    })
}

pub fn jobs_py() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/jobs.py")
}

/// A scratch directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Self {
        let base = std::env::var_os("STALL_TEST_TMP").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
        let dir = base.join(format!("stall-it-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
    /// A file of `size` random-ish bytes.
    pub fn file(&self, name: &str, size: usize) -> PathBuf {
        let p = self.path(name);
        let mut data = vec![0u8; size];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ size as u64;
        for b in data.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        std::fs::write(&p, data).unwrap();
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What one stall run produced.
pub struct Run {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
    /// All JSON records (intervals, then the summary).
    pub records: Vec<Value>,
}

impl Run {
    pub fn summary(&self) -> &Value {
        self.records.iter().rev().find(|r| r["type"] == "summary").unwrap_or_else(|| {
            panic!("no summary record; stderr:\n{}\nstdout:\n{}", self.stderr, self.stdout)
        })
    }

    pub fn processes(&self) -> &Vec<Value> {
        self.summary()["processes"].as_array().expect("processes[]")
    }

    pub fn process(&self, pid: u64) -> &Value {
        self.processes()
            .iter()
            .find(|p| p["pid"] == pid)
            .unwrap_or_else(|| panic!("pid {pid} not in the summary: {}", self.pids()))
    }

    fn pids(&self) -> String {
        self.processes().iter().map(|p| format!("{} {}", p["pid"], p["comm"])).collect::<Vec<_>>().join(", ")
    }

    /// The file entry for `path` in process `pid`.
    pub fn file(&self, pid: u64, path: &Path) -> &Value {
        let p = self.process(pid);
        p["files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["path"] == path.to_str().unwrap())
            .unwrap_or_else(|| panic!("{} not among pid {pid}'s files: {}", path.display(), p["files"]))
    }

    /// Every process that has this path among its files.
    pub fn readers_of(&self, path: &Path) -> Vec<u64> {
        self.processes()
            .iter()
            .filter(|p| p["files"].as_array().unwrap().iter().any(|f| f["path"] == path.to_str().unwrap()))
            .map(|p| p["pid"].as_u64().unwrap())
            .collect()
    }

    pub fn thread(&self, tid: u64) -> &Value {
        self.processes()
            .iter()
            .flat_map(|p| p["threads"].as_array().unwrap())
            .find(|t| t["tid"] == tid)
            .unwrap_or_else(|| panic!("tid {tid} not in the summary"))
    }
}

/// Runs stall with `args`, JSON Lines into a file, and a hard timeout.
pub fn stall(args: &[&str], env: &[(&str, &Path)], timeout: Duration) -> Run {
    stall_with_stdout(args, env, timeout, None)
}

/// [`stall`], with stall's stdout (which `stall run` hands to the command)
/// going to the file `stdout` instead of a pipe; `Run::stdout` is then empty.
pub fn stall_with_stdout(
    args: &[&str],
    env: &[(&str, &Path)],
    timeout: Duration,
    stdout: Option<&Path>,
) -> Run {
    require_root();
    let json = tempfile_path("json");
    let mut cmd = Command::new(stall_bin());
    let (sub, rest) = args.split_first().expect("a subcommand");
    cmd.arg(sub).arg("--json").arg(&json);
    // No GPU unless the test brings one (a scripted NVML, or `--gpu`).
    if !rest.iter().any(|a| *a == "--gpu" || *a == "--nvml-lib") {
        cmd.arg("--gpu").arg("off");
    }
    cmd.args(rest);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = match stdout {
        None => run_with_timeout(cmd, timeout),
        Some(path) => {
            cmd.stdout(std::fs::File::create(path).expect("stdout file"));
            run_with_timeout_as_is(cmd, timeout)
        }
    };
    let text = std::fs::read_to_string(&json).unwrap_or_default();
    let _ = std::fs::remove_file(&json);
    let records = text.lines().map(|l| serde_json::from_str(l).expect("each JSON line parses")).collect();
    Run {
        status: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        records,
    }
}

/// A stall started in the background (JSON Lines into a file), for tests
/// whose workload must wait until stall has attached: [`Self::wait_attached`]
/// returns once stall wrote its first interval record, which it does only
/// after the target is tracked (pass a short `--interval`).
pub struct Background {
    child: std::process::Child,
    json: PathBuf,
}

impl Background {
    pub fn start(args: &[&str]) -> Self {
        require_root();
        let json = tempfile_path("json");
        let (sub, rest) = args.split_first().expect("a subcommand");
        let child = Command::new(stall_bin())
            .arg(sub)
            .arg("--json")
            .arg(&json)
            .args(["--gpu", "off"])
            .args(rest)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start stall");
        Self { child, json }
    }

    pub fn wait_attached(&mut self, timeout: Duration) {
        let json = self.json.clone();
        let child = &mut self.child;
        wait_until("stall's first interval record", timeout, || {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("stall exited before attaching: {status}");
            }
            std::fs::read_to_string(&json).is_ok_and(|t| t.contains('\n'))
        });
    }

    /// The stall process's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for stall to end (killing it after `timeout`) and reads its output.
    pub fn finish(self, timeout: Duration) -> Run {
        let pid = self.child.id();
        let (tx, rx) = std::sync::mpsc::channel();
        let child = self.child;
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        let out = match rx.recv_timeout(timeout) {
            Ok(out) => out.expect("wait"),
            Err(_) => {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
                panic!("stall did not finish within {timeout:?}");
            }
        };
        let text = std::fs::read_to_string(&self.json).unwrap_or_default();
        let _ = std::fs::remove_file(&self.json);
        Run {
            status: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            records: text.lines().map(|l| serde_json::from_str(l).expect("each JSON line parses")).collect(),
        }
    }
}

/// Lets a workload waiting on `go` (see jobs.py `wait_go`) proceed.
pub fn release(go: &Path) {
    std::fs::write(go, b"go").unwrap();
}

pub fn tempfile_path(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    std::env::temp_dir().join(format!(
        "stall-it-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Runs a command; kills it (by its own PID) if it outlives `timeout`.
pub fn run_with_timeout(mut cmd: Command, timeout: Duration) -> Output {
    cmd.stdout(Stdio::piped());
    run_with_timeout_as_is(cmd, timeout)
}

/// [`run_with_timeout`] with stdout as the caller set it.
pub fn run_with_timeout_as_is(mut cmd: Command, timeout: Duration) -> Output {
    let child = cmd.stdin(Stdio::null()).stderr(Stdio::piped()).spawn().expect("spawn");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(out) => out.expect("wait"),
        Err(_) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!("command did not finish within {timeout:?}: {cmd:?}");
        }
    }
}

/// Reads the truth file a workload wrote.
pub fn truth(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("workload wrote no truth at {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

pub fn secs(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// A wait's time as the `waits` workload measured it, less the kernel's
/// runqueue wait over the same span (`NAME_blocked_s`, where the kernel
/// keeps schedstats; else the wall time `NAME_s`): what stall counts as
/// that wait, the rest being runqueue time.
pub fn blocked_s(truth: &Value, name: &str) -> f64 {
    match truth.get(format!("{name}_blocked_s")) {
        Some(v) => secs(v),
        None => secs(&truth[format!("{name}_s")]),
    }
}

/// |got - want| <= tol * want
pub fn assert_close(what: &str, got: f64, want: f64, tol: f64) {
    assert!(
        (got - want).abs() <= tol * want,
        "{what}: got {got:.4}, want {want:.4} within {:.0}%",
        tol * 100.0
    );
}

/// The futex off-CPU time stall counts for the `waits` job's futexer:
/// its measured wait within `tol`, plus at most what its whole life held
/// outside the measured window (the GIL is a futex too: the thread waits
/// for it before the window opens and after it closes).
pub fn assert_futex_wait(what: &str, got: f64, truth: &Value, tol: f64) {
    let want = blocked_s(truth, "futex");
    let outside = (secs(&truth["futex_life_s"]) - secs(&truth["futex_s"])).max(0.0);
    assert!(
        got >= want * (1.0 - tol) && got <= want * (1.0 + tol) + outside,
        "{what}: got {got:.4}, want {want:.4} within {:.0}% (+ up to {outside:.4} of the thread's life outside its wait)",
        tol * 100.0
    );
}

/// Whether the running kernel is `major.minor` or later (its release, as
/// `uname -r` prints it).
pub fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("the kernel release");
    let mut parts = release.trim().split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (major, minor)
}

/// How closely a thread's schedstat totals can match stall's: 2 % where the
/// clock source is the TSC. Elsewhere (an emulated machine whose TSC the
/// kernel marked unstable: HPET), the scheduler's clock is only kept within
/// a tick of the wall clock stall reads, and every span schedstat sums can
/// be off by up to a tick: 5 %.
pub fn schedstat_tolerance() -> f64 {
    let source = std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
        .unwrap_or_default();
    if source.trim() == "tsc" {
        0.02
    } else {
        0.05
    }
}

/// A thread's totals as the kernel keeps them now (`/proc/PID/task/TID/schedstat`):
/// seconds on CPU and waiting for one.
pub fn thread_schedstat(pid: u32, tid: u32) -> (f64, f64) {
    let path = format!("/proc/{pid}/task/{tid}/schedstat");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut fields =
        text.split_whitespace().map(|f| f.parse::<u64>().expect("a schedstat number") as f64 / 1e9);
    (fields.next().expect("on-CPU ns"), fields.next().expect("runqueue ns"))
}

/// A whole thread's total that stall counts to the thread's end, against
/// the kernel's figure read by the thread shortly before it ended: `got`
/// is at least `at_read` and at most `at_read` plus the `tail` the thread
/// lived on after the read, each within `tol`.
pub fn assert_thread_total(what: &str, got: f64, at_read: f64, tail: f64, tol: f64) {
    assert!(
        got >= at_read * (1.0 - tol) && got <= (at_read + tail) * (1.0 + tol),
        "{what}: got {got:.4}, want {at_read:.4} (+ up to {tail:.4} after the read) within {:.0}%",
        tol * 100.0
    );
}

/// Where cgroup v2 is mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified on
/// hybrid systems). Panics without one: the cgroup tests cannot run.
pub fn cgroup2_mount() -> PathBuf {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    text.lines()
        .find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            if post.split_whitespace().next()? != "cgroup2" {
                return None;
            }
            Some(PathBuf::from(pre.split_whitespace().nth(4)?))
        })
        .expect("no cgroup2 mount on this machine")
}

/// Ids of the BPF programs process `pid` holds (from /proc/PID/fdinfo), to
/// check later that exactly these are gone — whatever else is loaded.
/// How many BPF programs a running stall holds at least: five scheduler
/// and task raw tracepoint programs (sched_switch or sched_switch_stack,
/// sched_waking, task_newtask, sched_process_exec/exit) and the syscall
/// hooks: two raw syscall tracepoint programs (sys_enter, sys_exit), or 30
/// fentry/fexit programs on the trampoline backend.
pub const STALL_PROGRAMS: usize = 7;

pub fn bpf_programs_of(pid: u32) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else { return Vec::new() };
    let mut ids: Vec<u32> = rd
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .filter_map(|text| text.lines().find_map(|l| l.strip_prefix("prog_id:")?.trim().parse().ok()))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Which of `ids` are still loaded in the kernel.
pub fn still_loaded(ids: &[u32]) -> Vec<u32> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .map(|p| p.id())
        .filter(|id| ids.contains(id))
        .collect()
}

/// Starts a workload whose first stdout line is its PID (as the attach
/// workloads print it); returns the child and that PID.
pub fn spawn_announcing(cmd: &mut Command) -> (std::process::Child, u32) {
    use std::io::{BufRead, BufReader};
    let mut child = cmd.stdout(Stdio::piped()).spawn().expect("spawn the workload");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    let pid =
        line.trim().trim_start_matches("PID ").parse().unwrap_or_else(|_| panic!("no PID line: {line:?}"));
    (child, pid)
}

/// Polls `ready` every 20 ms until it holds; fails the test after `timeout`.
pub fn wait_until(what: &str, timeout: std::time::Duration, mut ready: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + timeout;
    while !ready() {
        assert!(std::time::Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A cgroup v2 directory for one test, removed when dropped (once its
/// tasks are gone; children first, as they drop first).
pub struct Cgroup {
    pub dir: PathBuf,
    /// Relative to the cgroup2 mount, as users type it.
    pub name: String,
}

impl Cgroup {
    /// `stall-it-TAG-PID` at the top of the cgroup2 mount.
    pub fn new(tag: &str) -> Self {
        Self::create(cgroup2_mount(), format!("stall-it-{tag}-{}", std::process::id()))
    }

    /// `name` (a path relative to the cgroup2 mount), exactly so named.
    pub fn at(name: &str) -> Self {
        Self::create(cgroup2_mount(), name.to_string())
    }

    /// A cgroup inside this one.
    pub fn child(&self, name: &str) -> Self {
        Self::create(cgroup2_mount(), format!("{}/{name}", self.name))
    }

    fn create(mount: PathBuf, name: String) -> Self {
        let dir = mount.join(&name);
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("creating cgroup {}: {e}", dir.display()));
        Self { dir, name }
    }

    pub fn add(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .unwrap_or_else(|e| panic!("moving {pid} into {}: {e}", self.dir.display()));
    }

    /// Removes it, retrying while its last tasks are being torn down.
    pub fn remove(&self) -> bool {
        for _ in 0..100 {
            if !self.dir.exists() || std::fs::remove_dir(&self.dir).is_ok() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Whether a cgroup or any below it holds a task.
pub fn holds_tasks(dir: &Path) -> bool {
    let here = std::fs::read_to_string(dir.join("cgroup.procs")).is_ok_and(|t| !t.trim().is_empty());
    here || std::fs::read_dir(dir)
        .map(|entries| entries.flatten().any(|e| e.path().is_dir() && holds_tasks(&e.path())))
        .unwrap_or(false)
}

/// Removes an empty cgroup tree, children first.
pub fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.path().is_dir() {
                remove_tree(&e.path());
            }
        }
        let _ = std::fs::remove_dir(dir);
    }
}

/// File name of the scripted NVML library (crate `tests/nvml-script`).
pub const NVML_SCRIPT_LIB: &str = "libstall_nvml_script.so";

/// The scripted NVML library: see [`stand_in_lib`].
pub fn nvml_script_lib() -> PathBuf {
    stand_in_lib(NVML_SCRIPT_LIB, "STALL_NVML_SCRIPT_LIB", "stall-nvml-script")
}

/// File name of the stand-in CUDA library (crate `tests/cuda-stub`).
pub const CUDA_STUB_LIB: &str = "libstall_cuda_stub.so";

/// The stand-in CUDA library the CUDA jobs load (tests/workloads/cuda_job.py
/// `--lib`): see [`stand_in_lib`].
pub fn cuda_stub_lib() -> PathBuf {
    stand_in_lib(CUDA_STUB_LIB, "STALL_CUDA_STUB_LIB", "stall-cuda-stub")
}

/// A library the tests load in place of a GPU's own (`file`, built by
/// crate `package`): $`env` (set by `cargo xtask test` and by the test
/// VMs' /init), else next to the stall binary (cargo builds both into
/// target/PROFILE), else the workspace's release or debug build.
fn stand_in_lib(file: &str, env: &str, package: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env) {
        return PathBuf::from(p);
    }
    let next_to_stall = stall_bin().with_file_name(file);
    if next_to_stall.exists() {
        return next_to_stall;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    for profile in ["release", "debug"] {
        let p = root.join("target").join(profile).join(file);
        if p.exists() {
            return p;
        }
    }
    panic!("no {file}: run `cargo build --release -p {package}` (`cargo xtask test` does) or set {env}");
}

/// GPUs for stall to sample without a driver: a script for the scripted
/// NVML library (its format: tests/nvml-script/src/lib.rs) in a scratch
/// directory of its own. Run stall with [`Self::args`] after the subcommand
/// and [`Self::env`] in its environment, or start from [`Self::command`].
pub struct ScriptedGpu {
    dir: Scratch,
    script: PathBuf,
}

impl ScriptedGpu {
    /// Writes `script` (e.g. `json!({"devices": [...]})`).
    pub fn new(script: &Value) -> Self {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = Scratch::new(&format!("nvml-{}", N.fetch_add(1, Ordering::Relaxed)));
        let script_path = dir.path("nvml-script.json");
        let gpu = Self { dir, script: script_path };
        gpu.update(script);
        gpu
    }

    /// Replaces the script atomically (temp file + rename): the library
    /// picks the change up at its next call, so the GPU changes state live.
    pub fn update(&self, script: &Value) {
        let tmp = self.dir.path("nvml-script.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(script).unwrap()).unwrap();
        std::fs::rename(&tmp, &self.script).unwrap();
    }

    /// The script's path (what `STALL_NVML_SCRIPT` names).
    pub fn script(&self) -> &Path {
        &self.script
    }

    /// A path in this GPU's scratch directory, e.g. for a `pid_file`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path(name)
    }

    /// stall's arguments that load the scripted library.
    pub fn args(&self) -> Vec<std::ffi::OsString> {
        vec!["--nvml-lib".into(), nvml_script_lib().into_os_string()]
    }

    /// The environment variable the library reads its script from.
    pub fn env(&self) -> (&'static str, &Path) {
        ("STALL_NVML_SCRIPT", &self.script)
    }

    /// `stall SUBCOMMAND --nvml-lib LIB` with the script in its environment;
    /// add the rest of the arguments.
    pub fn command(&self, subcommand: &str) -> Command {
        let mut cmd = Command::new(stall_bin());
        cmd.arg(subcommand).args(self.args());
        let (k, v) = self.env();
        cmd.env(k, v);
        cmd
    }
}

/// The demo job (`demo/workload.py`), for scenarios.
pub fn workload_py() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join("demo/workload.py")
}

/// `python3 demo/workload.py ARGS...`
pub fn workload(args: &[impl AsRef<str>]) -> Vec<String> {
    let mut v = vec![python().to_string(), workload_py().to_str().unwrap().to_string()];
    v.extend(args.iter().map(|s| s.as_ref().to_string()));
    v
}

/// A scratch directory on a block device, so that blkio can throttle reads of
/// the files in it: $STALL_TEST_TMP, else /var/tmp (not a tmpfs).
pub fn disk_scratch(tag: &str) -> Scratch {
    let base = std::env::var_os("STALL_TEST_TMP").map(PathBuf::from).unwrap_or_else(|| "/var/tmp".into());
    let dir = base.join(format!("stall-it-scn-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

/// Generates the job's sample files (untraced), so that a traced run only
/// reads them, and returns the workload arguments that read them at `mbps`:
/// one place for the numbers, so the files and the run always agree.
pub fn shards(cache: &Path, files: u32, mb: u32, mbps: u32) -> Vec<String> {
    let shard = [
        "--cache-dir".to_string(),
        cache.to_str().unwrap().to_string(),
        "--files".into(),
        files.to_string(),
        "--file-mb".into(),
        mb.to_string(),
    ];
    let mut cmd = Command::new(python());
    cmd.arg(workload_py()).arg("--prepare-only").args(&shard);
    let out = run_with_timeout(cmd, Duration::from_secs(120));
    assert!(out.status.success(), "preparing files: {}", String::from_utf8_lossy(&out.stderr));
    let mut args = shard.to_vec();
    args.extend(["--throttle-mbps".to_string(), mbps.to_string()]);
    args
}

pub fn wait_child(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        if Instant::now() >= deadline {
            return None;
        }
        sleep(Duration::from_millis(20));
    }
}

/// Stops a child we started, by its PID: `sig` first, SIGKILL if it lingers.
pub fn stop(child: &mut Child, sig: Signal) {
    if child.try_wait().ok().flatten().is_some() {
        return;
    }
    let _ = kill(Pid::from_raw(child.id() as i32), sig);
    if wait_child(child, Duration::from_secs(5)).is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Collects a pipe's text in the background.
pub fn drain(mut r: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

/// `stall attach` running in the background, JSON Lines into a file; killed
/// (by its PID) if the test gives up on it.
pub struct Attached {
    child: Child,
    json: PathBuf,
    out: Option<(JoinHandle<String>, JoinHandle<String>)>,
}

impl Attached {
    pub fn start(args: &[&str]) -> Self {
        require_root();
        let json = tempfile_path("scn-json");
        let mut child = Command::new(stall_bin())
            .arg("attach")
            .arg("--json")
            .arg(&json)
            .args(["--gpu", "off", "-q"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting stall");
        let out = Some((drain(child.stdout.take().unwrap()), drain(child.stderr.take().unwrap())));
        Self { child, json, out }
    }

    /// Waits for its first JSON record: by then it is attached and tracing.
    pub fn wait_tracing(&mut self) {
        let json = self.json.clone();
        let child = &mut self.child;
        wait_until("stall's first JSON record", Duration::from_secs(120), || {
            if let Some(s) = child.try_wait().unwrap() {
                panic!("stall exited ({s}) before its first record");
            }
            std::fs::read_to_string(&json).is_ok_and(|t| t.contains('\n'))
        });
    }

    /// Ctrl-C (it reports and exits), then [`Self::finish`].
    pub fn interrupt_and_finish(self, timeout: Duration) -> Run {
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGINT);
        self.finish(timeout)
    }

    pub fn finish(mut self, timeout: Duration) -> Run {
        let Some(status) = wait_child(&mut self.child, timeout) else {
            stop(&mut self.child, Signal::SIGKILL);
            panic!("stall attach did not finish within {timeout:?}");
        };
        let (o, e) = self.out.take().unwrap();
        let text = std::fs::read_to_string(&self.json).unwrap_or_default();
        Run {
            status: status.code().unwrap_or(-1),
            stdout: o.join().unwrap(),
            stderr: e.join().unwrap(),
            records: text.lines().map(|l| serde_json::from_str(l).expect("each JSON line parses")).collect(),
        }
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        stop(&mut self.child, Signal::SIGKILL);
        let _ = std::fs::remove_file(&self.json);
    }
}

/// A TCP port free on the loopback now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The body of a GET on the loopback, if it answered 200.
pub fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.1 200") {
        return None;
    }
    // Decode a chunked body (axum streams it so).
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        let mut out = String::new();
        let mut rest = body;
        while let Some((size, tail)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).ok()?;
            if n == 0 {
                break;
            }
            out.push_str(tail.get(..n)?);
            rest = tail.get(n + 2..)?;
        }
        return Some(out);
    }
    Some(body.to_string())
}

/// `q` percent-encoded for a URL's query.
pub fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A scalar from Prometheus's instant query API, if the query has a result.
pub fn query(port: u16, q: &str) -> Option<f64> {
    let body = http_get(port, &format!("/api/v1/query?query={}", encode(q)))?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let r = v["data"]["result"].as_array()?.first()?.clone();
    r["value"][1].as_str()?.parse().ok()
}

/// Ends the processes a test started (before its cgroups are removed).
pub struct Killer(pub Vec<Child>);

impl Drop for Killer {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// PyTorch for the distributed-run tests, a directory for `PYTHONPATH`:
/// $STALL_TORCH_PATH (`cargo xtask test` installs it and sets it).
pub fn torch_path() -> PathBuf {
    let dir = std::env::var_os("STALL_TORCH_PATH").map(PathBuf::from).unwrap_or_else(|| {
        panic!("STALL_TORCH_PATH is not set: run the tests with `cargo xtask test`, which installs PyTorch")
    });
    assert!(dir.join("torch/__init__.py").exists(), "no PyTorch in {} (STALL_TORCH_PATH)", dir.display());
    dir
}

/// PyTorch and Hugging Face `datasets`, as one `PYTHONPATH`: the datasets
/// directory ($STALL_DATASETS_PATH, `cargo xtask test` installs it) before
/// PyTorch's.
pub fn torch_and_datasets_path() -> PathBuf {
    let dir = std::env::var_os("STALL_DATASETS_PATH").map(PathBuf::from).unwrap_or_else(|| {
        panic!("STALL_DATASETS_PATH is not set: run the tests with `cargo xtask test`, which installs it")
    });
    assert!(
        dir.join("datasets/__init__.py").exists(),
        "no datasets in {} (STALL_DATASETS_PATH)",
        dir.display()
    );
    PathBuf::from(format!("{}:{}", dir.display(), torch_path().display()))
}

/// A real Prometheus (Debian's, which `cargo xtask test` installs) on a free
/// loopback port, with `config` (YAML) and its data in `dir`; returns it once
/// it is ready, and its port.
pub fn start_prometheus(dir: &Scratch, config: &str) -> (Child, u16) {
    let prometheus = Path::new("/usr/bin/prometheus");
    assert!(prometheus.exists(), "Debian's prometheus is needed (cargo xtask test installs it)");
    let path = dir.path("prometheus.yml");
    std::fs::write(&path, config).unwrap();
    let port = free_port();
    let child = Command::new(prometheus)
        .arg(format!("--config.file={}", path.display()))
        .arg(format!("--storage.tsdb.path={}", dir.path("tsdb").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Ended if it never gets ready.
    let mut started = Killer(vec![child]);
    wait_until("prometheus", Duration::from_secs(30), || http_get(port, "/-/ready").is_some());
    (started.0.pop().expect("the child"), port)
}

/// Gives `cmd` a new terminal as its stdin, stdout and stderr, as the
/// leader of a session whose controlling terminal it is (so stall sees a
/// terminal, in its foreground); returns the terminal's master side. The
/// slave side stays open in `cmd` until it is dropped: drop it after the
/// spawn, so that reading the master ends when the processes do.
pub fn on_new_terminal(cmd: &mut Command) -> std::os::fd::OwnedFd {
    use std::os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::process::CommandExt,
    };
    let (mut master, mut slave) = (-1, -1);
    // SAFETY: openpty fills two descriptors.
    let rc = unsafe {
        libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), std::ptr::null())
    };
    assert_eq!(rc, 0, "openpty");
    // SAFETY: both are fresh descriptors we own.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    for stdio in 0..3 {
        let fd = nix::unistd::dup(slave.as_raw_fd()).unwrap();
        // SAFETY: a fresh duplicate handed to the child.
        let f = unsafe { std::fs::File::from_raw_fd(fd) };
        match stdio {
            0 => cmd.stdin(f),
            1 => cmd.stdout(f),
            _ => cmd.stderr(f),
        };
    }
    // SAFETY: setsid and ioctl are async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() == -1 || libc::ioctl(0, libc::TIOCSCTTY, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    master
}
