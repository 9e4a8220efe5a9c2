//! Distributed runs (tests/workloads/ranks.py): a launcher, four ranks with
//! the environment torchrun or mp.spawn gives them, two DataLoader-like
//! workers each, and a TCP all-reduce ending every step. Checked against the
//! pids the job reports: the launcher is no trainer, each rank is its own
//! trainer, each worker belongs to its rank, and the rank whose workers are
//! slow is named as the one the others wait for.
use std::{path::Path, sync::Mutex, time::Duration};

use serde_json::Value;
use stall_tests::*;

/// One run at a time: a straggler is a matter of CPU shares, which another
/// run beside it would change.
static SERIAL: Mutex<()> = Mutex::new(());

fn ranks_py() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/ranks.py").display().to_string()
}

/// `stall run` on the run; returns stall's run and the job's truth.
fn traced_run(tag: &str, args: &[&str]) -> (Run, Value) {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Scratch::new(tag);
    let truth_path = dir.path("truth.json");
    let dir_arg = dir.0.display().to_string();
    let py = ranks_py();
    let mut argv = vec!["run", "-q", "--", python(), py.as_str(), "--dir", dir_arg.as_str()];
    argv.extend_from_slice(args);
    let run = stall(&argv, &[("TRUTH", &truth_path)], Duration::from_secs(120));
    assert_eq!(run.status, 0, "stall run failed:\n{}", run.stderr);
    (run, truth(&truth_path))
}

fn pid(v: &Value) -> u64 {
    v.as_u64().expect("a pid")
}

/// The roles and ranks of every process the job reports.
fn check_roles(run: &Run, truth: &Value) {
    let launcher = run.process(pid(&truth["launcher"]));
    assert_eq!(launcher["role"], "other", "the launcher {} {}", launcher["pid"], launcher["cmdline"]);
    assert!(launcher["rank"].is_null());
    for r in truth["ranks"].as_array().unwrap() {
        let rank = &r["rank"];
        let trainer = run.process(pid(&r["pid"]));
        assert_eq!(
            (&trainer["role"], &trainer["rank"]),
            (&Value::from("trainer"), rank),
            "pid {}",
            trainer["pid"]
        );
        for w in r["workers"].as_array().unwrap() {
            let worker = run.process(pid(w));
            assert_eq!(
                (&worker["role"], &worker["rank"]),
                (&Value::from("worker"), rank),
                "pid {}",
                worker["pid"]
            );
        }
    }
    assert_eq!(run.summary()["run_id"], "stall-test-run");
}

fn straggler_named(launch: &str, port: &str) {
    let (run, truth) =
        traced_run(launch, &["--launch", launch, "--port", port, "--slow-rank", "2", "--seconds", "8"]);
    check_roles(&run, &truth);
    let v = &run.summary()["verdict"];
    let slow = &truth["ranks"][2];
    let s = &v["straggler"];
    assert_eq!((&s["rank"], &s["pid"]), (&Value::from(2), &slow["pid"]), "{v:#}");
    assert_eq!(s["kind"], "input-cpu-bound", "{v:#}");
    assert_eq!(v["kind"], "input-cpu-bound");
    assert_eq!(s["waiting_ranks"], serde_json::json!([0, 1, 3]), "{v:#}");
    assert!(s["peer_wait"].as_f64().unwrap() >= 0.5, "{v:#}");
    assert!(v["summary"]
        .as_str()
        .unwrap()
        .starts_with(&format!("rank 2 (pid {}) holds the run", slow["pid"])));
    let ranks = v["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 4);
    for r in ranks.iter().filter(|r| r["rank"] != 2) {
        assert!(
            r["peer_wait"].as_f64().unwrap() >= 0.5,
            "rank {} does not wait for its peers: {r}",
            r["rank"]
        );
    }
    // The report groups the threads by rank.
    for r in 0..4 {
        assert!(run.stderr.contains(&format!("-- rank {r}")) || run.stdout.contains(&format!("-- rank {r}")));
    }
}

#[test]
fn torchrun_like_run_names_the_slow_rank() {
    straggler_named("torchrun", "29611");
}

#[test]
fn mp_spawn_like_run_names_the_slow_rank() {
    straggler_named("spawn", "29612");
}

#[test]
fn ranks_that_keep_pace_name_no_straggler() {
    let (run, truth) = traced_run("even", &["--port", "29613", "--seconds", "6"]);
    check_roles(&run, &truth);
    let v = &run.summary()["verdict"];
    assert!(v["straggler"].is_null(), "{v:#}");
    assert_eq!(v["ranks"].as_array().unwrap().len(), 4);
}
