//! `stall run`: the command must be traced from its first instruction. stall
//! starts itself as a gate (`stall __exec-gate -- CMD`), tracks the gate's
//! PID, then lets it exec CMD: the exec keeps the PID, so nothing of CMD
//! runs untraced and no fork of it escapes.
//!
//! Signals: SIGINT, SIGTERM and SIGHUP sent to stall reach the command once,
//! as with `timeout` or tini. On a terminal (stall in its foreground process
//! group) the command stays in stall's group, so job control (Ctrl-Z, `fg`)
//! works as before and Ctrl-C reaches both from the kernel: signals the
//! kernel sent (`SI_KERNEL`: the terminal's Ctrl-C, Ctrl-\, hangup) are not
//! passed on again. Anywhere else (CI, containers, `timeout stall run ...`)
//! the command gets a process group of its own, like tini's child, so a
//! signal to stall's whole group reaches it once, through stall.
use std::{
    ffi::OsString,
    io,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::process::CommandExt,
    },
};

use nix::{fcntl::OFlag, unistd::Pid};

use crate::job::Received;

pub const GATE_ARG: &str = "__exec-gate";
const GATE_ENV: &str = "STALL_GATE_FD";

pub struct Gate {
    pub child: tokio::process::Child,
    pub pid: u32,
    release: Option<OwnedFd>,
}

impl Gate {
    /// `stdout_to_stderr`: the command writes its standard output to
    /// stall's standard error (stall's stdout carries JSON).
    pub fn spawn(cmd: &[OsString], stdout_to_stderr: bool) -> io::Result<Self> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
        let read_fd = read.as_raw_fd();
        let mut c = tokio::process::Command::new(std::env::current_exe()?);
        c.arg(GATE_ARG).arg("--").args(cmd).env(GATE_ENV, read_fd.to_string());
        if stdout_to_stderr {
            c.stdout(std::process::Stdio::from(io::stderr()));
        }
        if !in_terminal_foreground() {
            c.process_group(0);
        }
        // SAFETY: fcntl is async-signal-safe; only the read end must survive
        // the gate's exec.
        unsafe {
            c.pre_exec(move || {
                if libc::fcntl(read_fd, libc::F_SETFD, 0) == -1 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = c.spawn()?;
        drop(read);
        let pid = child.id().ok_or_else(|| io::Error::other("child vanished"))?;
        Ok(Self { child, pid, release: Some(write) })
    }

    /// Passes a signal stall received on to the command, unless the kernel
    /// already delivered it to the command's process group (a terminal's
    /// Ctrl-C reaches stall and the command alike).
    pub fn pass_on(&self, r: Received) {
        let child = Pid::from_raw(self.pid as i32);
        let same_group = nix::unistd::getpgid(Some(child)).is_ok_and(|g| g == nix::unistd::getpgrp());
        if should_pass_on(r, same_group) {
            let _ = nix::sys::signal::kill(child, r.signal);
        }
    }

    /// Stops the command: SIGTERM to its process group (its own, or it
    /// alone where it shares stall's), SIGKILL after `grace`; its status.
    pub async fn stop(&mut self, grace: std::time::Duration) -> io::Result<std::process::ExitStatus> {
        let child = Pid::from_raw(self.pid as i32);
        let own_group = nix::unistd::getpgid(Some(child)).is_ok_and(|g| g == child);
        let send = |sig| {
            let _ = if own_group {
                nix::sys::signal::killpg(child, sig)
            } else {
                nix::sys::signal::kill(child, sig)
            };
        };
        send(nix::sys::signal::Signal::SIGTERM);
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => status,
            Err(_) => {
                send(nix::sys::signal::Signal::SIGKILL);
                self.child.wait().await
            }
        }
    }

    /// Lets the gate exec the command (call once it is tracked).
    pub fn release(&mut self) -> io::Result<()> {
        if let Some(w) = self.release.take() {
            nix::unistd::write(&w, b"g")?;
        }
        Ok(())
    }
}

/// Whether a signal stall got must be sent to the command: always, except
/// one the kernel sent to the process group they share.
pub fn should_pass_on(r: Received, same_group: bool) -> bool {
    !(r.by_kernel && same_group)
}

/// Is stall in the foreground process group of its terminal (on stdin,
/// stdout or stderr)? Then the terminal signals its whole group.
fn in_terminal_foreground() -> bool {
    let me = nix::unistd::getpgrp();
    [libc::STDIN_FILENO, libc::STDOUT_FILENO, libc::STDERR_FILENO].into_iter().any(|fd| {
        // SAFETY: isatty and tcgetpgrp only query the descriptor.
        unsafe { libc::isatty(fd) == 1 && libc::tcgetpgrp(fd) == me.as_raw() }
    })
}

/// Finds CMD as exec will (on PATH unless it names a path) and says, in one
/// line, when it cannot be run: checked before anything is attached, so a
/// typo costs no report about stall's own gate.
pub fn check_command(prog: &std::ffi::OsStr) -> Result<(), crate::error::Error> {
    use std::os::unix::{ffi::OsStrExt, fs::PermissionsExt};
    let name = prog.to_string_lossy().into_owned();
    let candidates: Vec<std::path::PathBuf> = if prog.as_bytes().contains(&b'/') {
        vec![prog.into()]
    } else {
        let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
        std::env::split_paths(&path).map(|d| d.join(prog)).collect()
    };
    let mut not_executable = None;
    for c in candidates {
        match std::fs::metadata(&c) {
            Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => return Ok(()),
            Ok(m) if m.is_dir() => not_executable = Some("Is a directory".to_string()),
            Ok(_) => not_executable = Some("Permission denied".to_string()),
            Err(_) => {}
        }
    }
    Err(match not_executable {
        Some(why) => crate::error::Error::NotExecutable(name, why),
        None => crate::error::Error::CommandNotFound(name),
    })
}

/// The gate side, in the child: wait for the word, then become CMD.
/// Exit codes follow the shell: 127 not found, 126 not executable.
pub fn exec_gate(cmd: &[OsString]) -> ! {
    let Some(fd) = std::env::var(GATE_ENV).ok().and_then(|v| v.parse::<i32>().ok()) else {
        eprintln!("stall: {GATE_ARG} is internal to `stall run`");
        std::process::exit(2);
    };
    // SAFETY: the fd was handed down by the parent for this purpose only.
    let pipe = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut byte = [0u8; 1];
    let got = nix::unistd::read(pipe.as_raw_fd(), &mut byte);
    drop(pipe);
    if got != Ok(1) {
        // stall went away before tracing started: do not run untraced.
        std::process::exit(1);
    }
    let Some((prog, args)) = cmd.split_first() else {
        eprintln!("stall: no command given");
        std::process::exit(2);
    };
    // The command runs with its user's privileges, not the tracer's: the
    // capabilities stall was given as ambient ones (capsh --addamb, systemd's
    // AmbientCapabilities) would otherwise pass to it over exec.
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) };
    let err = std::process::Command::new(prog).args(args).env_remove(GATE_ENV).exec();
    let name = prog.to_string_lossy();
    match err.kind() {
        io::ErrorKind::NotFound => {
            eprintln!("stall: {name}: command not found");
            std::process::exit(127);
        }
        _ => {
            eprintln!("stall: {name}: cannot execute: {err}");
            std::process::exit(126);
        }
    }
}

#[cfg(test)]
mod tests {
    use nix::sys::signal::Signal;

    use super::*;

    #[test]
    fn a_signal_reaches_the_command_once() {
        let tty_ctrl_c = Received { signal: Signal::SIGINT, by_kernel: true };
        let kill = Received { signal: Signal::SIGTERM, by_kernel: false };
        // Ctrl-C on the terminal: the kernel signalled the shared group.
        assert!(!should_pass_on(tty_ctrl_c, true));
        // The command has a group of its own: it got nothing from the kernel.
        assert!(should_pass_on(tty_ctrl_c, false));
        // kill(1), docker stop, timeout: only stall got it.
        assert!(should_pass_on(kill, true));
        assert!(should_pass_on(kill, false));
    }
}
