//! `cargo xtask demo`: start a training job whose input pipeline waits on
//! the disk (demo/workload.py), attach stall to it while it runs, and show
//! stall's report (the verdict should be `input-io-bound`).

use std::env;
use std::io::{self, BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use crate::{build, cmd, setup};

/// Starts a training job and prints `PID <n>` (its trainer) as its first line.
const WORKLOAD: &str = "demo/workload.py";
/// Extra options for the workload, split on whitespace (see its --help).
const WORKLOAD_ARGS_ENV: &str = "STALL_DEMO_ARGS";
/// The workload's default --cache-dir, for the intro line.
const DEFAULT_CACHE_DIR: &str = "/var/tmp/stall-demo-cache";
/// How long stall gets to notice the workload is gone and report by itself.
const GRACE: Duration = Duration::from_secs(5);
/// How long stall gets to print its report once interrupted.
const REPORT_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);

/// Runs setup, builds the release agent and runs the demo; `stall_args` are
/// passed on to stall.
pub fn run(stall_args: &[String]) -> Result<()> {
    cmd::require_root("the demo loads eBPF programs and needs root")?;
    setup::ensure()?;
    let stall = build::agent(true)?;
    let workload = cmd::workspace_root().join(WORKLOAD);
    ensure!(workload.is_file(), "{} not found", workload.display());
    let started = Instant::now();
    attach_demo(&stall, &workload, stall_args)?;
    println!("demo: done in {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Starts the workload, attaches stall to its trainer, and waits for both.
fn attach_demo(stall: &Path, workload: &Path, stall_args: &[String]) -> Result<()> {
    let extra: Vec<String> = env::var(WORKLOAD_ARGS_ENV)
        .map(|v| v.split_whitespace().map(String::from).collect())
        .unwrap_or_default();
    println!(
        "demo: starting a training job shaped like a PyTorch DataLoader one ({WORKLOAD}): a trainer \
         and 4 worker processes that read ~100 MB sample files (made once in {DEFAULT_CACHE_DIR})"
    );
    println!(
        "demo: each file is evicted from the page cache before it is read, and the job's disk reads \
         are capped with a cgroup (100 MB/s) to stand in for slow storage; its lines below say what it did"
    );
    println!(
        "demo: other sizes: {WORKLOAD_ARGS_ENV}=\"--files N --file-mb M --throttle-mbps R\" \
         (all options: python3 {WORKLOAD} --help)"
    );
    let mut start = cmd::command("python3");
    start.arg(workload).args(&extra).stdout(Stdio::piped());
    let mut workload = Guard::spawn(start, "the workload")?;
    let (pid, echo) = trainer_pid(&mut workload.child)?;
    workload.inner = Some(pid);
    println!("demo: the job is running; attaching stall to its trainer, pid {pid}");
    let mut attach = cmd::command(stall);
    attach.args(["attach", "--pid", &pid.to_string()]).args(stall_args);
    let mut stall = Guard::spawn(attach, "stall")?;
    let workload_status = wait_workload(&mut workload.child, &mut stall.child)?;
    // Its last line (the summary) before stall's report, when the pipe closes.
    let deadline = Instant::now() + GRACE;
    while !echo.is_finished() && Instant::now() < deadline {
        thread::sleep(POLL);
    }
    let stall_status = finish_stall(&mut stall.child)?;
    ensure!(stall_status.success(), "stall attach failed ({stall_status})");
    ensure!(workload_status.success(), "{WORKLOAD} failed ({workload_status})");
    Ok(())
}

/// Reads the workload's stdout up to its `PID <n>` line, then keeps echoing
/// the rest of it in the background (the returned thread).
fn trainer_pid(workload: &mut Child) -> Result<(u32, JoinHandle<io::Result<u64>>)> {
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
            let echo = thread::spawn(move || io::copy(&mut reader, &mut io::stdout()));
            return Ok((pid, echo));
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
    signal(stall.id(), "INT")?;
    wait_timeout(stall, REPORT_TIMEOUT)?
        .with_context(|| format!("stall did not exit within {REPORT_TIMEOUT:?} of SIGINT"))
}

/// Sends `sig` (a name for `kill -SIG`) to `pid`.
fn signal(pid: u32, sig: &str) -> Result<()> {
    let pid = pid.to_string();
    // sh's builtin kill: no procps or libc needed.
    let out = cmd::output(cmd::command("sh").args(["-c", &format!("kill -{sig} \"$1\""), "sh", &pid]))?;
    ensure!(out.status.success(), "could not send SIG{sig} to pid {pid}");
    Ok(())
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
    /// The process that really runs the job, where the child is only a
    /// wrapper around it (python3 may be a pyenv shim that does not exec).
    inner: Option<u32>,
}

impl Guard {
    fn spawn(mut command: Command, name: &'static str) -> Result<Self> {
        let shown = cmd::describe(&command);
        println!("xtask: $ {shown}");
        let child = command.spawn().with_context(|| format!("could not start `{shown}`"))?;
        Ok(Self { child, name, inner: None })
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let pid = self.inner.unwrap_or(self.child.id());
            eprintln!("demo: stopping {} (pid {pid})", self.name);
            // SIGTERM first: the workload then stops its workers and removes
            // its cgroup.
            let stopped =
                signal(pid, "TERM").is_ok() && matches!(wait_timeout(&mut self.child, GRACE), Ok(Some(_)));
            if !stopped {
                if let Some(inner) = self.inner {
                    let _ = signal(inner, "KILL");
                }
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
    }
}
