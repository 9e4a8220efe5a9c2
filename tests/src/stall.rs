//! Finding and running the stall binary under test: one run to its end
//! ([`stall`] → [`Run`]), one in the background ([`Background`], [`Attached`]),
//! and the BPF programs a running stall holds.

use crate::{
    procs::{drain, run_with_timeout, run_with_timeout_as_is, stop, wait_child, wait_until},
    scratch::tempfile_path,
};
use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};
use serde_json::Value;
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::OnceLock,
    thread::JoinHandle,
    time::Duration,
};

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

/// The `run_id` label the daemon's metrics give a run: a hash of its id
/// (FNV-1a, 64 bits, hex), which joins a run's ranks across nodes without
/// telling its id (an environment value: docs/DAEMON.md).
pub fn run_label(run_id: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in run_id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
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
/// going to `stdout` (a file, a pipe to a reader) instead of a pipe the
/// test reads; `Run::stdout` is then empty.
pub fn stall_with_stdout(
    args: &[&str],
    env: &[(&str, &Path)],
    timeout: Duration,
    stdout: Option<Stdio>,
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
        Some(to) => {
            cmd.stdout(to);
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

    /// Where it writes its JSON Lines.
    pub fn json(&self) -> &std::path::Path {
        &self.json
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

/// How many BPF programs a running stall holds at least: five scheduler
/// and task raw tracepoint programs (sched_switch or sched_switch_stack,
/// sched_waking, task_newtask, sched_process_exec/exit) and the syscall
/// hooks: two raw syscall tracepoint programs (sys_enter, sys_exit), or 30
/// fentry/fexit programs on the trampoline backend.
pub const STALL_PROGRAMS: usize = 7;

/// Ids of the BPF programs process `pid` holds (from /proc/PID/fdinfo), to
/// check later that exactly these are gone — whatever else is loaded.
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
