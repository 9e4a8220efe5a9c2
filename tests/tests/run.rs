//! `stall run`: trace a command from its first instruction, on the real kernel.
use std::time::Duration;

use stall_tests::procs::{drain, on_new_terminal, wait_child};
use stall_tests::scratch::Scratch;
use stall_tests::stall::{require_root, stall, stall_bin, Background};
use stall_tests::workload::{jobs_py, python, truth};

const T: Duration = Duration::from_secs(60);

#[test]
fn exact_path_and_bytes_in_odd_chunks_and_exit_status() {
    let s = Scratch::new("exact");
    let size = 3_000_017;
    let data = s.file("data.bin", size);
    let truth_path = s.path("truth.json");
    let run = stall(
        &[
            "run",
            "-q",
            "--",
            python(),
            jobs_py().to_str().unwrap(),
            "exact",
            data.to_str().unwrap(),
            "4099",
            "7",
        ],
        &[("TRUTH", &truth_path)],
        T,
    );
    assert_eq!(run.status, 7, "stall's exit status is the command's; stderr: {}", run.stderr);
    let t = truth(&truth_path);
    assert_eq!(t["bytes"], size as u64);
    let pid = t["pid"].as_u64().unwrap();
    let f = run.file(pid, &data);
    assert_eq!(f["read_bytes"], size as u64, "{f}");
    // ceil(size / 4099) reads with data, plus the read that returns 0.
    assert_eq!(f["read_calls"], (size as u64).div_ceil(4099) + 1, "{f}");
    assert_eq!(f["opens"], 1);
    assert_eq!(run.summary()["lost_events"], 0);
    assert!(run.stdout.contains("verdict:"), "the human report is printed: {}", run.stdout);
    // The command's status, in the report and the JSON.
    assert!(run.stdout.contains("The command exited with status 7."), "{}", run.stdout);
    assert_eq!(run.summary()["exit_status"], 7);
    // The gate maps stall's own binary before it execs the command: not
    // one of the job's files.
    let own = stall_bin().canonicalize().unwrap();
    let top = run.stdout.split("Top files by bytes read:").nth(1).unwrap_or("");
    assert!(!top.contains(own.to_str().unwrap()), "stall's own binary among the job's files: {top}");
    assert!(top.contains(data.to_str().unwrap()), "{top}");
}

#[test]
fn grandchild_forked_after_start_is_traced() {
    let s = Scratch::new("grandchild");
    let size = 1_234_567;
    let data = s.file("gc.bin", size);
    let truth_path = s.path("truth.json");
    let run = stall(
        &["run", "-q", "--", python(), jobs_py().to_str().unwrap(), "grandchild", data.to_str().unwrap()],
        &[("TRUTH", &truth_path)],
        T,
    );
    assert_eq!(run.status, 0, "{}", run.stderr);
    let gc = truth(&truth_path)["grandchild"].as_u64().unwrap();
    assert_eq!(run.file(gc, &data)["read_bytes"], size as u64);
    let p = run.process(gc);
    let parent = p["ppid"].as_u64().unwrap();
    assert!(run.processes().iter().any(|q| q["pid"] == parent), "the child in between is traced too");
}

/// A command that cannot run is one line before anything is attached: no
/// report about stall's own gate, the shell's exit codes.
#[test]
fn missing_command_exits_127_with_one_line() {
    let s = Scratch::new("noexec");
    let plain = s.file("not-executable", 10);
    for (cmd, code, says) in [
        ("/nonexistent/stall-no-such-cmd", 127, "/nonexistent/stall-no-such-cmd: command not found"),
        ("stall-no-such-cmd-on-path", 127, "stall-no-such-cmd-on-path: command not found"),
        (plain.to_str().unwrap(), 126, "cannot execute: Permission denied"),
    ] {
        let run = stall(&["run", "-q", "--", cmd], &[], T);
        assert_eq!(run.status, code, "{cmd}: {}", run.stderr);
        assert_eq!(run.stderr.lines().count(), 1, "{cmd}: {}", run.stderr);
        assert!(run.stderr.starts_with("stall: ") && run.stderr.contains(says), "{cmd}: {}", run.stderr);
        assert!(run.stdout.is_empty() && run.records.is_empty(), "{cmd}: nothing else: {}", run.stdout);
    }
}

/// `--json -`: stdout carries JSON only; the command's own output goes to
/// stderr with stall's human output, so `| jq` works.
#[test]
fn json_to_stdout_keeps_the_commands_output_out_of_it() {
    require_root();
    let out = std::process::Command::new(stall_bin())
        .args(["run", "--gpu", "off", "--interval", "0.2", "--json", "-", "--"])
        // 2 s: intervals of 0.2 s come while it runs, even where loading
        // stall's programs takes most of a second (a VM without KVM).
        .args(["sh", "-c", "for i in 1 2 3 4 5; do echo training step $i; sleep 0.4; done"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut records = 0;
    for line in stdout.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}\n{stdout}"));
        assert!(v["type"].is_string(), "{line}");
        records += 1;
    }
    assert!(records >= 2, "{stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    for i in 1..=5 {
        let line = format!("training step {i}");
        assert!(stderr.lines().any(|l| l == line), "{line:?}, the command's, not on stderr: {stderr}");
    }
}

/// `--duration` ends the tracing, not the command: stall says it goes on;
/// with `--stop` the command is stopped and stall exits with its status.
#[test]
fn duration_says_the_command_goes_on_and_stop_stops_it() {
    // Its own stdio elsewhere: a command left running must not keep the
    // test's pipes to stall open.
    let quiet_sleep = "exec sleep 30 </dev/null >/dev/null 2>&1";
    let run = stall(&["run", "-q", "--duration", "1", "--", "sh", "-c", quiet_sleep], &[], T);
    assert_eq!(run.status, 0, "{}", run.stderr);
    let note = run
        .stderr
        .lines()
        .find(|l| l.contains("--duration is up"))
        .unwrap_or_else(|| panic!("{}", run.stderr));
    let pid: i32 = note.split("(pid ").nth(1).and_then(|r| r.split(')').next()).unwrap().parse().unwrap();
    let alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    assert!(alive, "the command goes on after --duration: {note}");
    assert!(note.contains("--stop"), "{note}");
    let run = stall(&["run", "-q", "--duration", "1", "--stop", "--", "sh", "-c", quiet_sleep], &[], T);
    assert_eq!(run.status, 128 + 15, "sleep's status after SIGTERM: {}", run.stderr);
    assert!(!run.stderr.contains("--duration is up"), "{}", run.stderr);
    assert_eq!(run.summary()["type"], "summary");
}

/// `stall run CMD | head`: the reader going away ends stall's output, not
/// the run; stall still exits with the command's status, without an error.
#[test]
fn a_closed_stdout_ends_the_output_not_the_run() {
    require_root();
    let mut child = std::process::Command::new(stall_bin())
        .args(["run", "--gpu", "off", "--interval", "0.2", "--", "sh", "-c", "sleep 1; exit 7"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let err = drain(child.stderr.take().unwrap());
    let status = wait_child(&mut child, T).expect("stall ended");
    let err = err.join().unwrap();
    assert_eq!(status.code(), Some(7), "{err}");
    assert!(!err.contains("Broken pipe") && !err.contains("internal error"), "{err}");
}

#[test]
fn help_lists_exit_codes() {
    let out = std::process::Command::new(stall_bin()).arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    for code in ["127", "126", "3 ", "4 ", "5 ", "6 "] {
        assert!(text.contains(&format!("    {code}")), "--help lacks exit code {code}: {text}");
    }
}

/// On a terminal, `stall run`'s live view prints a line per interval
/// beside the command's own output, which shares the terminal: it never
/// clears the screen the command writes to.
#[test]
fn the_live_view_on_a_terminal_keeps_the_commands_output() {
    use std::io::Read;
    require_root();
    let mut cmd = std::process::Command::new(stall_bin());
    cmd.args(["run", "--gpu", "off", "--interval", "0.2", "--", "sh", "-c"])
        .arg("for i in 1 2 3 4 5 6; do echo job line $i; sleep 0.2; done");
    let master = on_new_terminal(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    // Every copy of the terminal's slave side closed here, so that reading
    // the master ends once stall and its command have.
    drop(cmd);
    let mut reader = std::fs::File::from(master);
    let screen = std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            all.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&all).into_owned()
    });
    let status = wait_child(&mut child, T).expect("stall ended");
    assert!(status.success());
    let screen = screen.join().unwrap();
    assert!(!screen.contains("\x1b[2J") && !screen.contains("\x1b[H"), "the screen was cleared: {screen:?}");
    for i in 1..=6 {
        assert!(screen.contains(&format!("job line {i}")), "job line {i} lost: {screen}");
    }
    assert!(screen.lines().filter(|l| l.starts_with('[') && l.contains("s] ")).count() >= 3, "{screen}");
}

/// Shell completions for the three shells, and a version that names the
/// commit and what the kernel offers.
#[test]
fn completions_and_version() {
    for (shell, marker) in [("bash", "_stall()"), ("zsh", "#compdef stall"), ("fish", "complete -c stall")] {
        let out = std::process::Command::new(stall_bin()).args(["completions", shell]).output().unwrap();
        assert!(out.status.success(), "{shell}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(marker) && text.contains("attach"), "{shell}: {text}");
    }
    let out = std::process::Command::new(stall_bin()).arg("--version").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.starts_with("stall ") && text.contains("(commit "), "{text}");
    let out = std::process::Command::new(stall_bin()).arg("version").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert!(text.contains(&format!("kernel: {}", release.trim())), "{text}");
    assert!(text.contains("BTF: /sys/kernel/btf/vmlinux"), "{text}");
}

/// `attach --pid 1`: stall is itself a descendant of the target and must
/// not trace itself; where /proc hides which syscall pid 1's threads wait
/// in (a ptrace check even root fails here), the summary says so and those
/// threads are not counted on-CPU for the whole run.
#[test]
fn attach_to_pid_1_leaves_stall_out_and_names_an_unreadable_proc() {
    let stall = Background::start(&["attach", "--pid", "1", "--duration", "2s"]);
    let own = stall.pid();
    let run = stall.finish(T);
    assert_eq!(run.status, 0, "{}", run.stderr);
    // Other stall processes (tests beside this one) are pid 1's
    // descendants like any other; this one is not in its own job.
    let traced = |pid: u32| run.processes().iter().any(|p| p["pid"] == pid);
    assert!(!traced(own), "stall traced itself (pid {own})");
    let unreadable = std::fs::read_to_string("/proc/1/task/1/syscall").is_err();
    let init = run.processes().iter().find(|p| p["pid"] == 1).expect("pid 1 traced").clone();
    if unreadable && init["off_cpu_s"].as_f64().unwrap() + init["on_cpu_s"].as_f64().unwrap() > 0.0 {
        assert!(run.summary()["unreadable_threads"].as_u64() >= Some(1), "{}", run.summary());
        // Summed over its threads, mostly asleep: before, each counted
        // on-CPU for the whole run.
        let on = init["on_cpu_s"].as_f64().unwrap();
        let all = on + init["off_cpu_s"].as_f64().unwrap();
        assert!(on < all / 2.0, "pid 1's threads counted {on:.1} s on-CPU of {all:.1} s");
    } else {
        assert!(run.summary().get("unreadable_threads").is_none(), "{}", run.summary());
    }
}

/// On a terminal, a job whose input pipeline has not run yet (here: one
/// that only sleeps, as one importing would before its loader starts) is
/// said to be starting up, not judged as if its steady state had begun.
#[test]
fn the_live_view_says_starting_up_before_the_pipeline_runs() {
    use std::io::Read;
    require_root();
    let mut cmd = std::process::Command::new(stall_bin());
    cmd.args(["run", "--gpu", "off", "--interval", "0.2", "--", "sh", "-c", "sleep 2.5"]);
    let master = on_new_terminal(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    drop(cmd);
    let mut reader = std::fs::File::from(master);
    let screen = std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            all.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&all).into_owned()
    });
    let status = wait_child(&mut child, T).expect("stall ended");
    assert!(status.success());
    let screen = screen.join().unwrap();
    let live: Vec<&str> = screen.lines().filter(|l| l.starts_with('[') && l.contains("s] ")).collect();
    assert!(live.len() >= 3, "{screen}");
    assert!(
        live.iter().all(|l| l.contains("s] starting up: the input pipeline has not run yet")),
        "{screen}"
    );
}

/// A job that reads no data: the report's TOP FILE says "none", and no
/// "Top files" section lists what the interpreter (or pyenv's shim, or
/// the C library's charset tables) read to start.
#[test]
fn a_job_that_reads_no_data_names_no_top_file() {
    let run = stall(&["run", "--", python(), "-c", "import time; time.sleep(2)"], &[], T);
    assert_eq!(run.status, 0, "{}", run.stderr);
    let report = format!("{}{}", run.stdout, run.stderr);
    let trainer = report
        .lines()
        .find(|l| l.starts_with("trainer "))
        .unwrap_or_else(|| panic!("no trainer row in:\n{report}"));
    assert!(trainer.trim_end().ends_with(" none"), "{trainer}");
    assert!(!report.contains("Top files by bytes read"), "{report}");
}
