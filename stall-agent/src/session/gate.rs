//! `stall run`: the command must be traced from its first instruction. stall
//! starts itself as a gate (`stall __exec-gate -- CMD`), tracks the gate's
//! PID, then lets it exec CMD: the exec keeps the PID, so nothing of CMD
//! runs untraced and no fork of it escapes.
use std::{
    ffi::OsString,
    io,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::process::CommandExt,
    },
};

use nix::fcntl::OFlag;

pub const GATE_ARG: &str = "__exec-gate";
const GATE_ENV: &str = "STALL_GATE_FD";

pub struct Gate {
    pub child: tokio::process::Child,
    pub pid: u32,
    release: Option<OwnedFd>,
}

impl Gate {
    pub fn spawn(cmd: &[OsString]) -> io::Result<Self> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
        let read_fd = read.as_raw_fd();
        let mut c = tokio::process::Command::new(std::env::current_exe()?);
        c.arg(GATE_ARG).arg("--").args(cmd).env(GATE_ENV, read_fd.to_string());
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

    /// Lets the gate exec the command (call once it is tracked).
    pub fn release(&mut self) -> io::Result<()> {
        if let Some(w) = self.release.take() {
            nix::unistd::write(&w, b"g")?;
        }
        Ok(())
    }
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
