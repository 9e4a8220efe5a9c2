//! Bad input: one clear line on stderr and a distinct exit code; nothing
//! crashes.
use std::{process::Command, time::Duration};

use stall_tests::procs::run_with_timeout;
use stall_tests::scratch::Scratch;
use stall_tests::stall::{require_root, stall_bin};

fn stall_raw(args: &[&str]) -> (i32, String) {
    require_root();
    let mut cmd = Command::new(stall_bin());
    cmd.args(args);
    let out = run_with_timeout(cmd, Duration::from_secs(30));
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// An error exit prints the error and nothing else: no notes, no usage.
fn one_line(stderr: &str) -> &str {
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "expected one line, got: {stderr}");
    lines[0]
}

#[test]
fn unknown_pid() {
    let (code, err) = stall_raw(&["attach", "--pid", "999999999", "--gpu", "off"]);
    assert_eq!(code, 4, "{err}");
    assert!(one_line(&err).contains("no process with PID 999999999"), "{err}");
    // With the GPU side on by default: the "no NVML" note is for runs that
    // proceed, not for this one.
    let (code, err) = stall_raw(&["attach", "--pid", "999999999"]);
    assert_eq!(code, 4, "{err}");
    assert_eq!(one_line(&err), "stall: no process with PID 999999999");
    // A --json file the failed run never wrote to is not left behind.
    let s = Scratch::new("unknown-pid");
    let json = s.path("out.json");
    let (code, err) = stall_raw(&["attach", "--pid", "999999999", "--json", json.to_str().unwrap()]);
    assert_eq!(code, 4, "{err}");
    assert!(!json.exists(), "an empty {} was left behind", json.display());
}

#[test]
fn json_path_problems_are_usage_errors_before_attaching() {
    let s = Scratch::new("json-errors");
    let cases = [(s.path("no-such-dir/out.json"), "no directory"), (s.0.clone(), "it is a directory")];
    for (path, why) in cases {
        // A command that would leave a trace if it ran: it must not.
        let marker = s.path("ran");
        let (code, err) =
            stall_raw(&["run", "--json", path.to_str().unwrap(), "--", "touch", marker.to_str().unwrap()]);
        assert_eq!(code, 2, "{err}");
        assert!(one_line(&err).starts_with(&format!("stall: --json {}: {why}", path.display())), "{err}");
        assert!(!marker.exists(), "the command ran");
        let (code, err) = stall_raw(&["attach", "--pid", "1", "--json", path.to_str().unwrap()]);
        assert_eq!(code, 2, "{err}");
        one_line(&err);
    }
    // Not writable: a read-only directory, as nobody (root writes anywhere).
    let ro = s.path("ro");
    std::fs::create_dir(&ro).unwrap();
    let out = run_with_timeout(
        {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(stall_bin())
                .args(["run", "--json"])
                .arg(ro.join("x.json"))
                .args(["--", "true"]);
            c
        },
        Duration::from_secs(30),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(one_line(&err).ends_with("not writable (permission denied)"), "{err}");
}

/// A device node made for the test in its scratch directory (mknod):
/// `name` with the kernel's `major:minor`.
fn device(s: &Scratch, name: &str, major: u32, minor: u32) -> std::path::PathBuf {
    use std::os::unix::fs::FileTypeExt;
    let p = s.path(name);
    let out =
        Command::new("mknod").arg(&p).args(["c", &major.to_string(), &minor.to_string()]).output().unwrap();
    assert!(out.status.success(), "mknod: {}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::metadata(&p).unwrap().file_type().is_char_device());
    p
}

/// A file of the kernel's own filesystems takes no output: refused before
/// anything is attached. A write that fails once running (a device that is
/// always full, as /dev/full) names the option and the path and exits 2,
/// the same every time. An output that was there before (a device) is
/// never removed by a run that failed.
#[test]
fn outputs_that_cannot_take_the_writes_name_their_path_and_exit_2() {
    use std::os::unix::fs::FileTypeExt;
    let s = Scratch::new("output-writes");
    for option in ["--json", "--timeline"] {
        let marker = s.path("ran");
        let (code, err) =
            stall_raw(&["run", option, "/proc/version", "--", "touch", marker.to_str().unwrap()]);
        assert_eq!(code, 2, "{option}: {err}");
        assert_eq!(
            one_line(&err),
            format!("stall: {option} /proc/version: a file of the kernel's proc filesystem, not an output")
        );
        assert!(!marker.exists(), "the command ran");
    }
    let full = device(&s, "full", 1, 7);
    for option in ["--json", "--timeline", "--timeline-svg"] {
        for _ in 0..3 {
            let (code, err) =
                stall_raw(&["run", "-q", "--gpu", "off", option, full.to_str().unwrap(), "--", "true"]);
            assert_eq!(code, 2, "{option}: {err}");
            let last = err.lines().last().unwrap_or_default();
            assert_eq!(
                last,
                format!("stall: writing {option} {}: No space left on device (os error 28)", full.display()),
                "{err}"
            );
            assert!(
                std::fs::metadata(&full).unwrap().file_type().is_char_device(),
                "{} was replaced",
                full.display()
            );
        }
    }
    let null = device(&s, "null", 1, 3);
    let (code, err) = stall_raw(&["attach", "--pid", "999999999", "--json", null.to_str().unwrap()]);
    assert_eq!(code, 4, "{err}");
    assert!(
        std::fs::metadata(&null).is_ok_and(|m| m.file_type().is_char_device()),
        "a failed run removed {}",
        null.display()
    );
}

#[test]
fn timeline_path_problems_are_usage_errors_like_json() {
    let s = Scratch::new("timeline-errors");
    let bad = s.path("no-such-dir/t.json");
    for option in ["--timeline", "--timeline-svg"] {
        let marker = s.path("ran");
        let (code, err) =
            stall_raw(&["run", option, bad.to_str().unwrap(), "--", "touch", marker.to_str().unwrap()]);
        assert_eq!(code, 2, "{option}: {err}");
        assert!(
            one_line(&err).starts_with(&format!("stall: {option} {}: no directory", bad.display())),
            "{err}"
        );
        assert!(!marker.exists(), "the command ran");
    }
}

#[test]
fn durations_take_units_and_bad_ones_are_one_line() {
    let (code, err) =
        stall_raw(&["run", "-q", "--gpu", "off", "--interval", "0.5s", "--duration", "1m", "--", "true"]);
    assert_eq!(code, 0, "{err}");
    for (opt, bad) in [("--duration", "2x"), ("--interval", "-1"), ("--interval", "0")] {
        let (code, err) = stall_raw(&["run", opt, bad, "--", "true"]);
        assert_eq!(code, 2, "{err}");
        let line = one_line(&err);
        assert!(line.starts_with(&format!("stall: invalid value '{bad}' for '{opt}")), "{err}");
    }
    let (code, err) = stall_raw(&["daemon", "--cgroup-root", "x", "--interval", "5 min"]);
    assert_eq!(code, 2, "{err}");
    assert!(one_line(&err).contains("is not a duration"), "{err}");
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
    // An NVML that does not load, on any host (a GPU machine's own would).
    let nvml = "/nonexistent/libnvidia-ml.so.1";
    let (code, err) = stall_raw(&["run", "--nvml-lib", nvml, "--gpu", "0", "--", "true"]);
    assert_eq!(code, 6, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    // An error, not the note a run that goes on prints, with both ways out.
    assert!(err.starts_with("stall: cannot sample the GPUs --gpu asks for: no NVML ("), "{err}");
    assert!(err.contains("--nvml-lib") && err.contains("--gpu off"), "{err}");
    let (code, err) = stall_raw(&["run", "-q", "--nvml-lib", nvml, "--", "true"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("no NVML: GPU side not sampled"), "{err}");
}

#[test]
fn usage_errors_exit_2() {
    let (code, err) = stall_raw(&["attach"]);
    assert_eq!(code, 2);
    assert!(
        one_line(&err).contains("required arguments were not provided: <--pid <PID>|--cgroup <PATH>>"),
        "{err}"
    );
    let (code, err) = stall_raw(&["run", "--interval", "-1", "--", "true"]);
    assert_eq!(code, 2);
    one_line(&err);
    let (code, err) = stall_raw(&["attach", "--pid", "1", "--bogus"]);
    assert_eq!(code, 2);
    assert!(one_line(&err).contains("unexpected argument '--bogus'"), "{err}");
}

/// The daemon's own bad inputs: a web config it cannot use is a usage
/// error, and `--require-gpu` without NVML a GPU error, each one line.
#[test]
fn daemon_web_config_and_required_gpu_errors_are_one_line() {
    let s = Scratch::new("daemon-errors");
    let (code, err) = stall_raw(&["daemon", "--cgroup-root", "/", "--web-config", "/nonexistent/web.yml"]);
    assert_eq!(code, 2, "{err}");
    assert!(one_line(&err).contains("--web-config: cannot read /nonexistent/web.yml"), "{err}");
    let bad = s.path("web.yml");
    std::fs::write(&bad, "basic_auth_users:\n  prometheus: not-a-hash\n").unwrap();
    let (code, err) = stall_raw(&["daemon", "--cgroup-root", "/", "--web-config", bad.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(one_line(&err).contains("not a bcrypt hash"), "{err}");
    let (code, err) = stall_raw(&["daemon", "--cgroup-root", "/", "--gpu", "off", "--require-gpu"]);
    assert_eq!(code, 6, "{err}");
    assert!(one_line(&err).contains("--require-gpu"), "{err}");
    // No kubelet's cgroups on this machine (the kube test says so too).
    let (code, err) = stall_raw(&["daemon", "--kubernetes", "--gpu", "off"]);
    assert_eq!(code, 4, "{err}");
    assert!(one_line(&err).contains("no Kubernetes pods under"), "{err}");
    let (code, err) = stall_raw(&["daemon"]);
    assert_eq!(code, 2, "neither roots nor --kubernetes: {err}");
}
