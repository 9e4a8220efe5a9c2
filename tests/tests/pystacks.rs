//! Where in Python: the stacks of the threads a verdict blames, read with
//! py-spy while the job runs, in the report and the JSON.
use std::{
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use serde_json::Value;
use stall_tests::procs::{run_with_timeout, spawn_announcing, wait_until};
use stall_tests::scratch::{disk_scratch, Scratch};
use stall_tests::stall::{require_root, stall, stall_bin};
use stall_tests::workload::{jobs_py, python, shards, workload, workload_py};

const T: Duration = Duration::from_secs(120);

/// The 1-based number of the line of `file` that contains `marker`.
fn line_of(file: &Path, marker: &str) -> i64 {
    let text = std::fs::read_to_string(file).unwrap();
    let i =
        text.lines().position(|l| l.contains(marker)).unwrap_or_else(|| panic!("no {marker:?} in {file:?}"));
    i as i64 + 1
}

fn stacks(v: &Value) -> Vec<&Value> {
    v["verdict"]["python_stacks"].as_array().map(|a| a.iter().collect()).unwrap_or_default()
}

fn notes(v: &Value) -> Vec<String> {
    v["verdict"]["python_notes"]
        .as_array()
        .map(|a| a.iter().map(|n| n.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

fn has_frame(stack: &Value, file_suffix: &str, line: Option<i64>) -> bool {
    stack["frames"].as_array().unwrap().iter().any(|f| {
        f["file"].as_str().unwrap().ends_with(file_suffix)
            && line.is_none_or(|l| f["line"].as_i64() == Some(l))
    })
}

/// A trainer hung on a known line: the line is in the report and the JSON.
#[test]
fn a_hung_trainer_shows_the_line_it_waits_on() {
    require_root();
    let s = Scratch::new("pystack-hang");
    let truth_path = s.path("truth.json");
    let (mut job, pid) = spawn_announcing(
        Command::new(python())
            .arg(jobs_py())
            .args(["log-then-hang", s.path("train.log").to_str().unwrap(), "2", "0.1"])
            .env("TRUTH", &truth_path),
    );
    wait_until("the job to hang", Duration::from_secs(30), || truth_path.exists());
    let run = stall(&["attach", "--pid", &pid.to_string(), "--duration", "6"], &[], T);
    let _ = job.kill();
    let _ = job.wait();
    assert_eq!(run.status, 0, "{}", run.stderr);
    let sum = run.summary();
    assert_eq!(sum["verdict"]["kind"], "hang", "{}", sum["verdict"]);
    let line = line_of(&jobs_py(), "the hang: Python stack tests look for this line");
    let main = stacks(sum)
        .into_iter()
        .find(|s| s["tid"] == u64::from(pid))
        .unwrap_or_else(|| panic!("no stack of the trainer's main thread: {}", sum["verdict"]));
    assert_eq!(main["what"], "trainer main thread");
    assert!(has_frame(main, "jobs.py", Some(line)), "jobs.py:{line} not in {main}");
    assert!(has_frame(main, "threading.py", None), "the Event.wait it sits in: {main}");
    assert!(notes(sum).is_empty(), "{:?}", notes(sum));
    assert!(run.stdout.contains(&format!("jobs.py:{line})")), "the report shows the line:\n{}", run.stdout);
}

/// A DataLoader-like job (demo/workload.py: workers reading throttled
/// shards, the trainer waiting on its result queue): the trainer's stack
/// shows the multiprocessing queue wait, a worker's the line that reads.
#[test]
fn an_input_bound_job_shows_the_queue_wait_and_the_read() {
    require_root();
    let s = disk_scratch("pystack-io");
    // 6 MB/s: I/O-bound even where Python runs slowly (an emulated CPU).
    let mut args = shards(&s.path("cache"), 6, 8, 6);
    args.extend(["--workers", "3", "--start-delay", "0"].map(String::from));
    let mut v: Vec<String> = vec!["run".into(), "--interval".into(), "1".into(), "--".into()];
    v.extend(workload(&args));
    let refs: Vec<&str> = v.iter().map(String::as_str).collect();
    let run = stall(&refs, &[], T);
    assert_eq!(run.status, 0, "{}", run.stderr);
    let read_line = line_of(&workload_py(), "f.readinto(view[: min(CHUNK, batch_bytes - got)])  # read(2)");
    let input: Vec<&Value> = run
        .records
        .iter()
        .filter(|r| r["type"] == "interval" && r["verdict"]["kind"] == "input-io-bound")
        .collect();
    assert!(!input.is_empty(), "no interval says input-io-bound");
    let all: Vec<&Value> = input.iter().flat_map(|r| stacks(r)).collect();
    let said: Vec<String> = input.iter().flat_map(|r| notes(r)).collect();
    assert!(
        all.iter().any(|s| s["what"] == "trainer main thread" && has_frame(s, "queues.py", None)),
        "no trainer stack waiting in multiprocessing's queue: {all:?}; notes {said:?}"
    );
    assert!(
        all.iter().any(|s| s["what"] == "worker" && has_frame(s, "workload.py", Some(read_line))),
        "no worker stack at workload.py:{read_line}: {all:?}"
    );
}

/// Not Python: one note, the report otherwise as before.
#[test]
fn a_non_python_job_gets_one_note() {
    require_root();
    let mut job = Command::new("sleep").arg("30").stdout(Stdio::null()).spawn().unwrap();
    let pid = job.id();
    let run = stall(&["attach", "--pid", &pid.to_string(), "--duration", "2"], &[], T);
    let _ = job.kill();
    let _ = job.wait();
    assert_eq!(run.status, 0, "{}", run.stderr);
    let sum = run.summary();
    assert!(stacks(sum).is_empty());
    let n = notes(sum);
    assert_eq!(n.len(), 1, "{n:?}");
    // `sleep`, or busybox's applet in the test VMs.
    assert!(n[0].starts_with(&format!("Python stacks of pid {pid}: not a Python process (")), "{n:?}");
    assert_eq!(run.stdout.matches("note: Python stacks").count(), 1, "{}", run.stdout);
    assert!(run.stdout.contains("verdict: "), "{}", run.stdout);
}

/// A read the host denies (a seccomp policy against reading another
/// process's memory, as hardened hosts have, whatever stall's
/// capabilities): one note, the rest of the report still there.
#[test]
fn a_denied_read_gets_one_note() {
    require_root();
    let s = Scratch::new("pystack-denied");
    let truth_path = s.path("truth.json");
    let (mut job, pid) = spawn_announcing(
        Command::new(python())
            .arg(jobs_py())
            .args(["log-then-hang", s.path("n.log").to_str().unwrap(), "1", "0.1"])
            .env("TRUTH", &truth_path),
    );
    wait_until("the job to hang", Duration::from_secs(30), || truth_path.exists());
    let json = s.path("out.json");
    let mut c = Command::new(python());
    c.arg(jobs_py())
        .args(["deny-memory-reads", "--"])
        .arg(stall_bin())
        .args(["attach", "--pid", &pid.to_string(), "--duration", "5", "--gpu", "off", "--json"])
        .arg(&json);
    let out = run_with_timeout(c, T);
    let _ = job.kill();
    let _ = job.wait();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let sum: Value = std::fs::read_to_string(&json)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|r| r["type"] == "summary")
        .unwrap();
    assert_eq!(sum["verdict"]["kind"], "hang", "the rest of the report: {}", sum["verdict"]);
    assert!(stacks(&sum).is_empty());
    let n = notes(&sum);
    assert_eq!(n.len(), 1, "{n:?}");
    assert!(n[0].contains("permission denied"), "{n:?}");
    assert_eq!(stdout.matches("note: Python stacks").count(), 1, "{stdout}");
}
