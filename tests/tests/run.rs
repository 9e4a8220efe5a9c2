//! `stall run`: trace a command from its first instruction, on the real kernel.
use std::time::Duration;

use stall_tests::*;

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

#[test]
fn missing_command_exits_127_with_one_line() {
    let run = stall(&["run", "-q", "--", "/nonexistent/stall-no-such-cmd"], &[], T);
    assert_eq!(run.status, 127, "{}", run.stderr);
    let lines: Vec<&str> = run.stderr.lines().filter(|l| l.contains("not found")).collect();
    assert_eq!(lines.len(), 1, "{}", run.stderr);
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
