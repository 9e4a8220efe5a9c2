//! A run's NCCL collectives, seen through uprobes on the libraries its
//! ranks load: a stand-in NCCL (tests/nccl-stub: the real exported names and
//! C signatures; collectives over TCP between the ranks, completed on the
//! caller's CUDA stream) and the stand-in CUDA runtime, which nccl_job.py
//! loads through ctypes as PyTorch does. One rank calls each all-reduce
//! late; every other rank then waits in its next synchronization, spinning
//! on CPU as CUDA's default schedule does, so that on the host side every
//! rank looks busy. The truth is each rank's own clock before each call.
use std::{path::Path, process::Command, time::Duration};

use serde_json::Value;
use stall_tests::gpu::{cuda_stub_lib, nccl_stub_lib};
use stall_tests::procs::{wait_child, wait_until};
use stall_tests::scratch::Scratch;
use stall_tests::stall::{bpf_programs_of, require_root, stall, still_loaded, Background, Run};
use stall_tests::workload::{python, truth};

fn nccl_job_py() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/nccl_job.py").display().to_string()
}

/// A scratch directory holding the stand-ins under the real libraries'
/// file names (how stall recognises the libraries it probes).
fn libraries(tag: &str) -> (Scratch, String, String) {
    let dir = Scratch::new(tag);
    let (cuda, nccl) = (dir.path("libcudart.so.13"), dir.path("libnccl.so.2"));
    std::fs::copy(cuda_stub_lib(), &cuda).expect("copy the stand-in CUDA library");
    std::fs::copy(nccl_stub_lib(), &nccl).expect("copy the stand-in NCCL library");
    (dir, cuda.display().to_string(), nccl.display().to_string())
}

/// Per rank, from the truth: its mean time after the first rank's call,
/// over the all-reduces every rank made.
fn truth_lateness(t: &Value) -> Vec<f64> {
    let ranks = t["ranks"].as_array().expect("the ranks' truths");
    let arrivals: Vec<Vec<u64>> = ranks
        .iter()
        .map(|r| r["arrive_ns"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect())
        .collect();
    let n = arrivals.iter().map(Vec::len).min().unwrap_or(0);
    assert!(n >= 5, "too few all-reduces to compare: {n}");
    let mut late = vec![0.0; ranks.len()];
    for seq in 0..n {
        let first = arrivals.iter().map(|a| a[seq]).min().unwrap();
        for (r, a) in arrivals.iter().enumerate() {
            late[r] += (a[seq] - first) as f64 / 1e9 / n as f64;
        }
    }
    late
}

fn rank_truth(t: &Value, rank: u64) -> &Value {
    t["ranks"].as_array().unwrap().iter().find(|r| r["rank"] == rank).expect("the rank's truth")
}

/// `stall run` of four ranks (`nccl_job.py launch`, with `extra`), rank 2
/// calling each all-reduce 200 ms late while spinning on CPU (as a rank
/// busy on its host would), the others spinning in their
/// synchronizations, each logging its steps; every rank saw the probes
/// before it made its communicator. The run and the ranks' truth.
/// Rank 2 must be named the straggler (see [`rank_2_is_the_straggler`]).
fn four_ranks_rank_2_late(tag: &str, port: &str, extra: &[&str]) -> (Run, Value) {
    require_root();
    let (dir, cuda, nccl) = libraries(tag);
    let truth_path = dir.path("truth.json").display().to_string();
    let log = dir.path("steps_{rank}.log").display().to_string();
    let (script, dir_arg) = (nccl_job_py(), dir.0.display().to_string());
    let mut argv = vec!["run", "-q", "--", python(), &script, "launch"];
    argv.extend(extra);
    argv.extend([
        "--ranks",
        "4",
        "--dir",
        &dir_arg,
        "--cuda-lib",
        &cuda,
        "--nccl-lib",
        &nccl,
        "--truth",
        &truth_path,
        "--seconds",
        "8",
        "--late-rank",
        "2",
        "--late-ms",
        "200",
        "--late-how",
        "spin",
        "--schedule",
        "spin",
        "--port",
        port,
        "--log",
        &log,
        // The communicator is made once the probes are in, so stall sees
        // it made (under TCG the probes take a while).
        "--wait-probed",
        "60",
        "--probed",
        "ncclAllReduce,cudaStreamSynchronize",
    ]);
    let run = stall(&argv, &[], Duration::from_secs(180));
    assert_eq!(run.status, 0, "stall run failed:\n{}", run.stderr);
    let t = truth(Path::new(&truth_path));
    for r in 0..4 {
        assert_eq!(rank_truth(&t, r)["probed"], true, "rank {r} never saw the probes: {t}\n{}", run.stderr);
    }
    rank_2_is_the_straggler(&run, &t);
    (run, t)
}

/// Each process's pid, role and rank, and where the rank came from.
fn roles(run: &Run) -> Vec<String> {
    run.processes()
        .iter()
        .map(|p| format!("{} {} rank {} from {}", p["pid"], p["role"], p["rank"], p["rank_from"]))
        .collect()
}

/// Rank 2 named the straggler by its arrivals, within 20 ms of the ranks'
/// own clocks, the others waiting for it.
fn rank_2_is_the_straggler(run: &Run, t: &Value) {
    let v = &run.summary()["verdict"];
    let s = &v["straggler"];
    assert_eq!((&s["rank"], &s["pid"]), (&Value::from(2), &rank_truth(t, 2)["pid"]), "{v:#}");
    assert_eq!(s["waiting_ranks"], serde_json::json!([0, 1, 3]), "{v:#}");
    let late = s["late_s"].as_f64().expect("named by its arrivals");
    let want = truth_lateness(t)[2];
    assert!((late - want).abs() < 0.02, "stall says {late} s late, the ranks' clocks {want:.3} s: {v:#}");
}

/// The run's four ranks, rank 2 calling each all-reduce 200 ms late while
/// spinning on CPU (as a rank busy on its host would), the others spinning
/// in their synchronizations: every rank on CPU, and rank 2 named by its
/// lateness, from stall's own comparison of the arrivals, with each rank's
/// collectives counted to the call.
#[test]
fn a_rank_calling_each_all_reduce_late_is_named_by_its_lateness() {
    let (run, t) = four_ranks_rank_2_late("nccl-late", "29541", &[]);
    let v = &run.summary()["verdict"];
    let want = truth_lateness(&t);
    assert!(v["summary"].as_str().unwrap().contains("calls the collectives late: last at"), "{v:#}");
    for r in v["ranks"].as_array().unwrap() {
        let rank = r["rank"].as_u64().unwrap();
        let own = rank_truth(&t, rank);
        let c = &r["collectives"];
        // Every all-reduce the rank made, counted by the probe.
        assert_eq!(c["calls"], own["collectives"], "rank {rank}: {r:#}");
        let compared = c["compared"].as_u64().unwrap();
        assert!(
            compared + 3 >= own["collectives"].as_u64().unwrap(),
            "rank {rank} compared {compared}: {r:#}"
        );
        if rank == 2 {
            assert!(c["last"].as_u64().unwrap() + 2 >= compared, "rank 2 last at each: {r:#}");
        } else {
            assert!((c["late_s"].as_f64().unwrap() - want[rank as usize]).abs() < 0.02, "rank {rank}: {r:#}");
        }
    }
    // The others' waits go to rank 2: each waits about its lateness per step.
    let main = run.thread(rank_truth(&t, 0)["tid_main"].as_u64().unwrap());
    let g = &main["gpu_calls"];
    let per_wait = g["collective_wait_s"].as_f64().unwrap() / g["collective_waits"].as_f64().unwrap();
    assert!(per_wait > 0.15, "rank 0 waits {per_wait} s per all-reduce: {g}");
}

/// Four ranks a launcher starts as plain subprocesses with no rank
/// variable anywhere (each rank on its command line, as a launcher of its
/// own passes it): each is named by the NCCL communicator it creates, the
/// launcher is none, rank 2 (200 ms late at each all-reduce) holds the
/// run by its lateness, and a run whose ranks log every step is never
/// called hung.
#[test]
fn ranks_no_variable_names_are_found_by_their_communicators() {
    let (run, t) = four_ranks_rank_2_late("nccl-no-env", "29543", &["--no-rank-env"]);
    let roles = roles(&run);
    for r in 0..4 {
        let own = rank_truth(&t, r);
        let p = run.process(own["pid"].as_u64().unwrap());
        assert_eq!(
            (&p["role"], &p["rank"], &p["rank_from"]),
            (&Value::from("trainer"), &Value::from(r), &Value::from("nccl-communicator")),
            "rank {r}: {roles:?}"
        );
    }
    assert_eq!(run.process(t["launcher"].as_u64().unwrap())["role"], "other", "{roles:?}");
    for rec in &run.records {
        assert_ne!(
            rec["verdict"]["kind"], "hang",
            "ranks logging every step are not hung: {}",
            rec["verdict"]
        );
    }
}

/// The ranks' NCCL job (`nccl_job.py launch`, with `extra`), `late` ms
/// late at each all-reduce on rank `late_rank`, attached by the
/// launcher's pid once every rank has made its communicator and stepped,
/// for 6 s. The run, stall's programs while attached, and the ranks'
/// truth once the job ended unharmed.
fn attached_after_the_communicators(
    tag: &str,
    port: &str,
    ranks: usize,
    late_rank: usize,
    extra: &[&str],
) -> (Run, Vec<(u32, String)>, Value) {
    require_root();
    let (dir, cuda, nccl) = libraries(tag);
    let truth_path = dir.path("truth.json");
    let (ranks_arg, late_arg) = (ranks.to_string(), late_rank.to_string());
    let mut job = Command::new(python());
    job.args([&nccl_job_py(), "launch"])
        .args(extra)
        .args(["--ranks", &ranks_arg, "--dir"])
        .arg(&dir.0)
        .args(["--cuda-lib", &cuda, "--nccl-lib", &nccl, "--seconds", "14", "--late-rank", &late_arg])
        .args(["--late-ms", "200", "--late-how", "sleep", "--port", port, "--truth"])
        .arg(&truth_path)
        .arg("--log")
        .arg(dir.path("steps_{rank}.log"))
        .stdout(std::process::Stdio::null());
    let mut job = job.spawn().expect("start the NCCL job");
    wait_until("the ranks run their steps", Duration::from_secs(60), || {
        (0..ranks).all(|r| {
            std::fs::read_to_string(dir.path(&format!("steps_{r}.log"))).is_ok_and(|l| l.lines().count() >= 2)
        })
    });
    let mut bg = Background::start(&["attach", "--pid", &job.id().to_string(), "-q", "--duration", "6"]);
    bg.wait_attached(Duration::from_secs(30));
    let ids = bpf_programs_of(bg.pid());
    let ours: Vec<(u32, String)> = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| ids.contains(&p.id()))
        .map(|p| (p.id(), p.name_as_str().unwrap_or("").to_string()))
        .collect();
    let run: Run = bg.finish(Duration::from_secs(60));
    assert_eq!(run.status, 0, "stall attach failed:\n{}", run.stderr);
    wait_until("stall's programs are unloaded", Duration::from_secs(5), || still_loaded(&ids).is_empty());
    let status = wait_child(&mut job, Duration::from_secs(60)).expect("the job ends");
    assert!(status.success(), "the job was harmed: {status}");
    let t = truth(&truth_path);
    for r in t["ranks"].as_array().unwrap() {
        assert_eq!(r["results_ok"], r["collectives"], "a wrong all-reduce: {r}");
    }
    (run, ours, t)
}

/// stall attached after the communicator was made (no identity to match
/// the ranks' calls by) still names the late rank, from the waits: it waits
/// least from each call to the synchronization after it. Its probes go
/// with it, and the run goes on unharmed.
#[test]
fn attached_mid_run_the_waits_name_the_late_rank_and_the_probes_go_with_stall() {
    let (run, ours, _) = attached_after_the_communicators("nccl-attach", "29542", 3, 1, &[]);
    // Its own NCCL programs (another test's stall may run beside it), as
    // they were while it was attached.
    let nccl = ours.iter().filter(|(_, name)| name.starts_with("nccl_")).count();
    assert_eq!(nccl, 7, "the NCCL probes' seven programs: {ours:?}");
    let v = &run.summary()["verdict"];
    let s = &v["straggler"];
    assert_eq!(s["rank"], 1, "{v:#}");
    assert!(s["late_s"].as_f64().is_some_and(|l| (0.12..0.3).contains(&l)), "{v:#}");
    assert!(v["summary"].as_str().unwrap().contains("per NCCL collective where the others wait"), "{v:#}");
}

/// Ranks no variable names, attached after they made their communicators
/// (`stall attach --pid <launcher>`): no communicator was seen made, so no
/// rank number is known, but the processes calling the collectives are
/// the run's ranks, the launcher none of them, the late one named by its
/// pid and lateness from the waits, and the run, logging every step, is
/// never hung.
#[test]
fn ranks_no_variable_names_attached_after_their_communicators_are_found_by_their_calls() {
    let (run, _, t) =
        attached_after_the_communicators("nccl-attach-no-env", "29544", 4, 2, &["--no-rank-env"]);
    let roles = roles(&run);
    for r in 0..4 {
        let p = run.process(rank_truth(&t, r)["pid"].as_u64().unwrap());
        assert_eq!(p["role"], "trainer", "rank {r}: {roles:?}");
    }
    assert_eq!(run.process(t["launcher"].as_u64().unwrap())["role"], "other", "{roles:?}");
    let v = &run.summary()["verdict"];
    eprintln!("attached, no rank named: {}", v["summary"]);
    let s = &v["straggler"];
    assert_eq!(s["pid"], rank_truth(&t, 2)["pid"], "{v:#}");
    // No number is made up for a rank that says none.
    assert_eq!(s["rank"], Value::Null, "{v:#}");
    assert!(s["late_s"].as_f64().is_some_and(|l| (0.12..0.3).contains(&l)), "{v:#}");
    for rec in &run.records {
        assert_ne!(
            rec["verdict"]["kind"], "hang",
            "ranks logging every step are not hung: {}",
            rec["verdict"]
        );
    }
}
