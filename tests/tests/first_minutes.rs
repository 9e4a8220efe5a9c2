//! The README's "Use" section as a new user runs it in a first ten
//! minutes, on a job of this test's own: every command it shows, with its
//! exit code and the first line it prints, then `--help` and a mistyped
//! option. The commands are read from the README: it and the binary
//! cannot drift apart.
//!
//! Needs root.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Command, Output, Stdio},
    time::Duration,
};

use stall_tests::cgroup::Cgroup;
use stall_tests::procs::{run_with_timeout, Killer};
use stall_tests::scratch::Scratch;
use stall_tests::stall::{require_root, stall_bin};

/// The commands of the README's first code block under "## Use", each as
/// its words, comments cut.
fn use_commands() -> Vec<Vec<String>> {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).unwrap();
    let use_section = &readme[readme.find("\n## Use\n").expect("a Use section")..];
    let block = use_section.split("```sh\n").nth(1).expect("a sh block").split("```").next().unwrap();
    block
        .lines()
        .map(|l| l.split(" #").next().unwrap().split_whitespace().map(String::from).collect::<Vec<_>>())
        .filter(|w| !w.is_empty())
        .collect()
}

/// A training job of its own: `--epochs N` passes over a data file, a
/// line of output each.
const TRAIN_PY: &str = r#"
import sys, time
epochs = int(sys.argv[sys.argv.index("--epochs") + 1])
data = sys.argv[1]
for epoch in range(epochs):
    with open(data, "rb") as f:
        while f.read(1 << 20):
            time.sleep(0.02)
    print(f"epoch {epoch} done", flush=True)
"#;

/// "[   1.0s] unknown: No single bottleneck: …": a live line, one per
/// interval, its time and a verdict kind.
fn interval_line(line: &str) -> bool {
    let Some((time, rest)) = line.strip_prefix('[').and_then(|l| l.split_once("s] ")) else { return false };
    time.trim().parse::<f64>().is_ok() && rest.split_once(": ").is_some_and(|(kind, _)| !kind.contains(' '))
}

fn first_line(text: &[u8]) -> String {
    String::from_utf8_lossy(text).lines().next().unwrap_or_default().to_string()
}

fn stall(args: &[String]) -> Output {
    let mut cmd = Command::new(stall_bin());
    cmd.args(args).stdin(Stdio::null());
    run_with_timeout(cmd, Duration::from_secs(120))
}

/// The daemon's exit code once it exits, or None once it serves /metrics.
fn exited_or_serving(daemon: &mut std::process::Child, port: u16) -> Option<i32> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        if let Some(status) = daemon.try_wait().unwrap() {
            return status.code();
        }
        if stall_tests::http::http_get(port, "/metrics").is_some() {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the daemon neither exited nor served /metrics in 30 s");
}

#[test]
fn the_readmes_use_section_works_as_written() {
    require_root();
    let s = Scratch::new("first-minutes");
    let script = s.path("train.py");
    std::fs::write(&script, TRAIN_PY).unwrap();
    let data = s.file("data.bin", 4 << 20);
    let commands = use_commands();
    let shown: Vec<String> = commands.iter().map(|c| c[..c.len().min(3)].join(" ")).collect();
    assert_eq!(
        shown,
        ["stall run --", "stall attach --pid", "stall attach --cgroup", "stall daemon --kubernetes"],
        "the README's Use section changed: this test runs each of its commands"
    );
    // The interpreter as the user's shell finds it (pyenv's shim here).
    let python = if Command::new("python").arg("-V").output().is_ok_and(|o| o.status.success()) {
        "python"
    } else {
        "python3"
    };
    // A job to attach to, in a cgroup of its own (made first, so that it is
    // removed after the job is killed: drops run in reverse).
    let cg = Cgroup::new("first-minutes");
    let mut guard = Killer(vec![]);
    let job = Command::new(python)
        .arg(&script)
        .arg(&data)
        .args(["--epochs", "1000"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let job_pid = job.id();
    guard.0.push(job);
    cg.add(job_pid);

    for words in &commands {
        let mut args: Vec<String> = words[1..].to_vec();
        match (args[0].as_str(), args.get(1).map(String::as_str)) {
            ("run", _) => {
                // `python train.py --epochs 3`: this job, three epochs.
                let dash = args.iter().position(|a| a == "--").unwrap();
                args.truncate(dash + 1);
                args.extend([python.to_string(), script.display().to_string(), data.display().to_string()]);
                args.extend(["--epochs".to_string(), "3".to_string()]);
                let out = stall(&args);
                let text = String::from_utf8_lossy(&out.stdout);
                assert_eq!(
                    out.status.code(),
                    Some(0),
                    "stall {args:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                // The command's output first, then stall's report.
                assert_eq!(first_line(&out.stdout), "epoch 0 done", "{text}");
                assert!(text.contains("\nstall report: ") && text.contains("\nverdict: "), "{text}");
            }
            ("attach", Some(flag)) => {
                // The job by its PID, or by its cgroup.
                args[2] = if flag == "--pid" { job_pid.to_string() } else { cg.name.clone() };
                args.extend(["--duration".to_string(), "3".to_string()]);
                let out = stall(&args);
                let text = format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                assert_eq!(out.status.code(), Some(0), "stall {args:?}: {text}");
                assert!(interval_line(&first_line(&out.stdout)), "{text}");
                assert!(text.contains("\nverdict: "), "{text}");
                assert!(text.contains(&format!(" {job_pid} ")), "the job's process in the report: {text}");
            }
            ("daemon", _) => {
                // A node without Kubernetes: one line and exit code 4;
                // with it, the daemon serves its metrics until SIGTERM.
                let port = stall_tests::http::free_port();
                args.extend(["--gpu".into(), "off".into(), "--listen".into(), format!("127.0.0.1:{port}")]);
                let mut daemon =
                    Command::new(stall_bin()).args(&args).stderr(Stdio::piped()).spawn().unwrap();
                let mut lines = BufReader::new(daemon.stderr.take().unwrap()).lines();
                let first = lines.next().and_then(Result::ok).unwrap_or_default();
                match exited_or_serving(&mut daemon, port) {
                    Some(code) => {
                        assert_eq!(code, 4, "{first}");
                        assert!(lines.next().is_none(), "one line: {first}");
                        assert!(first.starts_with("stall: ") && first.contains("kubepods"), "{first}");
                    }
                    None => {
                        assert!(first.starts_with("stall daemon: "), "{first}");
                        stall_tests::procs::stop(&mut daemon, nix::sys::signal::Signal::SIGTERM);
                    }
                }
            }
            _ => panic!("a command this test does not know: {words:?}"),
        }
    }

    // `--help` says what stall is; a mistyped option is a usage error that
    // names the right one, whatever follows it.
    let out = stall(&["--help".to_string()]);
    assert_eq!(out.status.code(), Some(0));
    assert!(first_line(&out.stdout).starts_with("Why is the GPU idle?"), "{}", first_line(&out.stdout));
    let typo: Vec<String> = ["run", "--durration", "5", "--", "true"].iter().map(|s| s.to_string()).collect();
    let out = stall(&typo);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--duration"), "{err}");
}
