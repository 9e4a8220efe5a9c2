//! `cargo xtask demo`: run a workload under stall and show stall's report.

use std::io::{self, BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use crate::{build, cmd, setup};

/// Starts a training job and prints `PID <n>` (its trainer) as its first line.
const WORKLOAD: &str = "demo/workload.py";
/// How long stall gets to notice the workload is gone and report by itself.
const GRACE: Duration = Duration::from_secs(5);
/// How long stall gets to print its report once interrupted.
const REPORT_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);

/// Used until demo/workload.py exists: two forked workers read separate
/// on-disk files in odd-sized chunks while the parent waits on them.
const FALLBACK_WORKLOAD: &str = r#"
import os, sys, tempfile

SIZE = 8 << 20         # bytes per worker
CHUNKS = (4093, 65537) # odd read sizes, one per worker
TMP = "/var/tmp" if os.path.isdir("/var/tmp") else None  # /tmp may be RAM

def make_file():
    fd, path = tempfile.mkstemp(prefix="stall-demo-", dir=TMP)
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(SIZE))
        f.flush()
        os.fsync(f.fileno())
        # Drop it from the page cache so the workers wait on the disk.
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return path

def work(path, chunk):
    total = 0
    with open(path, "rb", buffering=0) as f:
        while data := f.read(chunk):
            total += len(data)
    print(f"worker {os.getpid()}: read {total} bytes in {chunk}-byte chunks", flush=True)

paths = [make_file() for _ in CHUNKS]
try:
    pids = []
    for path, chunk in zip(paths, CHUNKS):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                work(path, chunk)
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    failed = [pid for pid in pids if os.waitpid(pid, 0)[1] != 0]
finally:
    for path in paths:
        os.unlink(path)
sys.exit(1 if failed else 0)
"#;

/// Runs setup, builds the release agent and runs the demo; `stall_args` are
/// passed on to stall.
pub fn run(stall_args: &[String]) -> Result<()> {
    cmd::require_root("the demo loads eBPF programs and needs root")?;
    setup::ensure()?;
    let stall = build::agent(true)?;
    let workload = cmd::workspace_root().join(WORKLOAD);
    if workload.is_file() {
        attach_demo(&stall, &workload, stall_args)
    } else {
        println!("demo: {WORKLOAD} not found; running a built-in workload under `stall run`");
        let mut run = cmd::command(&stall);
        run.arg("run").args(stall_args).args(["--", "python3", "-c", FALLBACK_WORKLOAD]);
        cmd::run(&mut run)
    }
}

/// Starts the workload, attaches stall to its trainer, and waits for both.
fn attach_demo(stall: &Path, workload: &Path, stall_args: &[String]) -> Result<()> {
    let mut start = cmd::command("python3");
    start.arg(workload).stdout(Stdio::piped());
    let mut workload = Guard::spawn(start, "the workload")?;
    let pid = trainer_pid(&mut workload.child)?;
    println!("demo: trainer is pid {pid}; attaching stall");
    let mut attach = cmd::command(stall);
    attach.args(["attach", "--pid", &pid.to_string()]).args(stall_args);
    let mut stall = Guard::spawn(attach, "stall")?;
    let workload_status = wait_workload(&mut workload.child, &mut stall.child)?;
    let stall_status = finish_stall(&mut stall.child)?;
    ensure!(stall_status.success(), "stall attach failed ({stall_status})");
    ensure!(workload_status.success(), "{WORKLOAD} failed ({workload_status})");
    Ok(())
}

/// Reads the workload's stdout up to its `PID <n>` line, then keeps echoing
/// the rest of it in the background.
fn trainer_pid(workload: &mut Child) -> Result<u32> {
    let stdout = workload.stdout.take().context("workload stdout not piped")?;
    let mut reader = BufReader::new(stdout);
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).context("reading the workload's stdout")? == 0 {
            bail!("{WORKLOAD} exited without printing `PID <n>`");
        }
        if let Some(pid) = line.trim().strip_prefix("PID ") {
            let pid =
                pid.trim().parse().with_context(|| format!("bad PID line from {WORKLOAD}: {line:?}"))?;
            thread::spawn(move || io::copy(&mut reader, &mut io::stdout()));
            return Ok(pid);
        }
        print!("{line}");
    }
}

/// Waits for the workload to exit; gives up early if stall fails meanwhile.
fn wait_workload(workload: &mut Child, stall: &mut Child) -> Result<ExitStatus> {
    loop {
        if let Some(status) = workload.try_wait()? {
            return Ok(status);
        }
        if let Some(status) = stall.try_wait()? {
            ensure!(status.success(), "stall exited ({status}) while the workload was still running");
        }
        thread::sleep(POLL);
    }
}

/// Lets stall finish on its own; if it does not, SIGINT asks it to report and exit.
fn finish_stall(stall: &mut Child) -> Result<ExitStatus> {
    if let Some(status) = wait_timeout(stall, GRACE)? {
        return Ok(status);
    }
    println!("demo: workload finished; interrupting stall for its report");
    let pid = stall.id().to_string();
    // sh's builtin kill: no procps or libc needed.
    let out = cmd::output(cmd::command("sh").args(["-c", "kill -INT \"$1\"", "sh", &pid]))?;
    ensure!(out.status.success(), "could not send SIGINT to stall (pid {pid})");
    wait_timeout(stall, REPORT_TIMEOUT)?
        .with_context(|| format!("stall did not exit within {REPORT_TIMEOUT:?} of SIGINT"))
}

fn wait_timeout(child: &mut Child, timeout: Duration) -> Result<Option<ExitStatus>> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        thread::sleep(POLL);
    }
    Ok(child.try_wait()?)
}

/// A child process that is killed if the demo bails out while it still runs.
struct Guard {
    child: Child,
    name: &'static str,
}

impl Guard {
    fn spawn(mut command: Command, name: &'static str) -> Result<Self> {
        let shown = cmd::describe(&command);
        println!("xtask: $ {shown}");
        let child = command.spawn().with_context(|| format!("could not start `{shown}`"))?;
        Ok(Self { child, name })
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            eprintln!("demo: stopping {} (pid {})", self.name, self.child.id());
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
