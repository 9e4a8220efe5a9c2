//! `stall run` passes SIGINT, SIGTERM and SIGHUP to the command exactly
//! once, waits for it and exits with its status: sent to stall, sent to
//! stall's process group, and Ctrl-C typed on a terminal (which the kernel
//! already delivers to the command).
use std::{
    io::Read,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use nix::{sys::signal::Signal, unistd::Pid};
use stall_tests::procs::{on_new_terminal, wait_until};
use stall_tests::scratch::Scratch;
use stall_tests::stall::{require_root, stall_bin};
use stall_tests::workload::{jobs_py, python};

const T: Duration = Duration::from_secs(60);

/// `stall run -q -- python jobs.py signals`, set up by `prepare`.
fn start(s: &Scratch, prepare: impl FnOnce(&mut Command)) -> (Child, PathBuf) {
    require_root();
    let truth = s.path("truth.json");
    let mut cmd = Command::new(stall_bin());
    cmd.args(["run", "-q", "--gpu", "off", "--", python()])
        .arg(jobs_py())
        .arg("signals")
        .env("TRUTH", &truth);
    prepare(&mut cmd);
    let child = cmd.spawn().expect("spawn stall");
    let ready = PathBuf::from(format!("{}.ready", truth.display()));
    wait_until("the command's signal handlers", T, || ready.exists());
    (child, truth)
}

/// stall's exit status (killed if it outlives `T`).
fn finish(mut child: Child) -> i32 {
    let deadline = std::time::Instant::now() + T;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st.code().unwrap_or_else(|| panic!("stall died: {st}"));
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("stall did not exit after the command did");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn counts(truth: &Path) -> (u64, u64, u64, serde_json::Value) {
    let t = stall_tests::workload::truth(truth);
    let c = &t["counts"];
    (c["INT"].as_u64().unwrap(), c["TERM"].as_u64().unwrap(), c["HUP"].as_u64().unwrap(), t)
}

fn kill(pid: i32, sig: Signal) {
    nix::sys::signal::kill(Pid::from_raw(pid), sig).unwrap();
}

#[test]
fn signals_sent_to_stall_reach_the_command_once() {
    let s = Scratch::new("sig-pid");
    let (child, truth) = start(&s, |c| {
        c.process_group(0).stdout(Stdio::null()).stderr(Stdio::null());
    });
    let pid = child.id() as i32;
    kill(pid, Signal::SIGHUP);
    std::thread::sleep(Duration::from_millis(300));
    kill(pid, Signal::SIGINT);
    assert_eq!(finish(child), 3, "stall exits with the command's status");
    let (int, term, hup, t) = counts(&truth);
    assert_eq!((int, term, hup), (1, 0, 1), "{t}");
    // No terminal: the command has a process group of its own.
    assert_eq!(t["pgid"], t["pid"], "{t}");
}

#[test]
fn a_signal_to_stalls_group_reaches_the_command_once() {
    let s = Scratch::new("sig-group");
    let (child, truth) = start(&s, |c| {
        c.process_group(0).stdout(Stdio::null()).stderr(Stdio::null());
    });
    // As `timeout` does when time is up, or a CI runner cancelling a job.
    kill(-(child.id() as i32), Signal::SIGTERM);
    assert_eq!(finish(child), 3);
    let (int, term, hup, t) = counts(&truth);
    assert_eq!((int, term, hup), (0, 1, 0), "{t}");
}

#[test]
fn ctrl_c_on_a_terminal_reaches_the_command_once() {
    let s = Scratch::new("sig-tty");
    let mut terminal = None;
    let (child, truth) = start(&s, |c| terminal = Some(on_new_terminal(c)));
    let master = terminal.unwrap();
    // Keep the terminal drained.
    let mut reader = std::fs::File::from(master.try_clone().unwrap());
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while reader.read(&mut buf).is_ok_and(|n| n > 0) {}
    });
    // Ctrl-C: the terminal's line discipline signals the foreground group.
    nix::unistd::write(&master, b"\x03").unwrap();
    assert_eq!(finish(child), 3);
    let (int, term, hup, t) = counts(&truth);
    assert_eq!((int, term, hup), (1, 0, 0), "Ctrl-C reaches the command once: {t}");
    // On a terminal the command stays in stall's group (job control).
    assert_ne!(t["pgid"], t["pid"], "{t}");
}
