//! Processes a test starts: running with a timeout, waiting, stopping by
//! PID, reading their pipes, and giving them a terminal.

use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};
use std::{
    io::Read,
    process::{Child, Command, ExitStatus, Output, Stdio},
    thread::{sleep, JoinHandle},
    time::{Duration, Instant},
};

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
