//! Bad input: one clear line on stderr and a distinct exit code; nothing
//! crashes.
use std::{process::Command, time::Duration};

use stall_tests::*;

fn stall_raw(args: &[&str]) -> (i32, String) {
    require_root();
    let mut cmd = Command::new(stall_bin());
    cmd.args(args);
    let out = run_with_timeout(cmd, Duration::from_secs(30));
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn one_line(stderr: &str) -> &str {
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.contains("no NVML")).collect();
    assert_eq!(lines.len(), 1, "expected one line, got: {stderr}");
    lines[0]
}

#[test]
fn unknown_pid() {
    let (code, err) = stall_raw(&["attach", "--pid", "999999999", "--gpu", "off"]);
    assert_eq!(code, 4, "{err}");
    assert!(one_line(&err).contains("no process with PID 999999999"), "{err}");
}

#[test]
fn bad_cgroup() {
    let (code, err) = stall_raw(&["attach", "--cgroup", "/definitely/not/a/cgroup", "--gpu", "off"]);
    assert_eq!(code, 4, "{err}");
    assert!(one_line(&err).contains("not a cgroup v2 directory"), "{err}");
    // A real directory that is not on cgroup2.
    let (code, err) = stall_raw(&["attach", "--cgroup", "/tmp", "--gpu", "off"]);
    assert_eq!(code, 4, "{err}");
}

#[test]
fn not_root() {
    require_root();
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"])
        .arg(stall_bin())
        .args(["run", "--gpu", "off", "--", "true"]);
    let out = run_with_timeout(cmd, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(one_line(&err).starts_with("stall: missing capabilities CAP_BPF (to "), "{err}");
}

#[test]
fn explicit_gpu_without_nvml_is_an_error_but_default_is_not() {
    if std::path::Path::new("/dev/nvidiactl").exists() {
        return; // a GPU machine: nothing to check here
    }
    let (code, err) = stall_raw(&["run", "--gpu", "0", "--", "true"]);
    assert_eq!(code, 6, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("stall: no NVML"), "{err}");
    let (code, err) = stall_raw(&["run", "-q", "--", "true"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("no NVML: GPU side not sampled"), "{err}");
}

#[test]
fn usage_errors_exit_2() {
    let (code, _) = stall_raw(&["attach"]);
    assert_eq!(code, 2);
    let (code, _) = stall_raw(&["run", "--interval", "-1", "--", "true"]);
    assert_eq!(code, 2);
}
