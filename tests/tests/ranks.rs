//! Distributed runs (tests/workloads/ranks.py): a launcher, four ranks with
//! the environment torchrun or mp.spawn gives them, two DataLoader-like
//! workers each, and a TCP all-reduce ending every step. Checked against the
//! pids the job reports: the launcher is no trainer, each rank is its own
//! trainer, each worker belongs to its rank, and the rank whose workers are
//! slow is named as the one the others wait for — by `stall run`, and by
//! Prometheus across two daemons each watching the ranks of its own "node".
use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Mutex,
    thread::sleep,
    time::{Duration, Instant},
};

use serde_json::Value;
use stall_tests::cgroup::Cgroup;
use stall_tests::http::{encode, free_port, http_get, query, start_prometheus};
use stall_tests::procs::{wait_until, Killer};
use stall_tests::scratch::{disk_scratch, Scratch};
use stall_tests::stall::run_label;
use stall_tests::stall::{require_root, stall, stall_bin, Run};
use stall_tests::torch::torch_path;
use stall_tests::workload::{python, truth};

/// One run at a time: a straggler is a matter of CPU shares, which another
/// run beside it would change.
static SERIAL: Mutex<()> = Mutex::new(());

fn ranks_py() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/ranks.py").display().to_string()
}

/// What rank `r` of a run in `dir` said of itself: its pid and its workers'.
fn rank_report(dir: &Scratch, r: u32) -> Value {
    let path = dir.path(&format!("rank_{r}.json"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
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
fn check_roles(run: &Run, truth: &Value, run_id: &str) {
    let launcher = run.process(pid(&truth["launcher"]));
    // Every process as the summary has it, for a failure to show.
    let all: Vec<String> = run
        .processes()
        .iter()
        .map(|p| {
            format!(
                "{} (ppid {}) {} rank {} from {}: {}",
                p["pid"], p["ppid"], p["role"], p["rank"], p["rank_from"], p["cmdline"]
            )
        })
        .collect();
    assert_eq!(
        launcher["role"],
        "other",
        "the launcher {} {}; run_id {}; truth {truth}; processes:\n{}",
        launcher["pid"],
        launcher["cmdline"],
        run.summary()["run_id"],
        all.join("\n")
    );
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
    assert_eq!(run.summary()["run_id"], run_id);
}

/// The run id each launch of ranks.py gives its ranks.
fn run_id_of(launch: &str) -> &'static str {
    if launch == "srun" {
        "slurm-4242"
    } else {
        "stall-test-run"
    }
}

/// A run of `ranks` ranks with `workers` workers each, launched as `launch`,
/// whose last-but-one rank has slow workers: that rank is named, and every
/// other rank waits for it.
fn straggler_named(launch: &str, port: &str, ranks: u32, workers: u32) {
    let slow_rank = ranks - 2;
    let (ranks_arg, workers_arg, slow_arg) = (ranks.to_string(), workers.to_string(), slow_rank.to_string());
    let (run, truth) = traced_run(
        launch,
        &[
            "--launch",
            launch,
            "--port",
            port,
            "--ranks",
            &ranks_arg,
            "--workers",
            &workers_arg,
            "--slow-rank",
            &slow_arg,
            "--seconds",
            "8",
        ],
    );
    check_roles(&run, &truth, run_id_of(launch));
    let v = &run.summary()["verdict"];
    let slow = &truth["ranks"][slow_rank as usize];
    let s = &v["straggler"];
    assert_eq!((&s["rank"], &s["pid"]), (&Value::from(slow_rank), &slow["pid"]), "{v:#}");
    assert_eq!(s["kind"], "input-cpu-bound", "{v:#}");
    assert_eq!(v["kind"], "input-cpu-bound");
    let waiting: Vec<u32> = (0..ranks).filter(|&r| r != slow_rank).collect();
    assert_eq!(s["waiting_ranks"], serde_json::json!(waiting), "{v:#}");
    assert!(s["peer_wait"].as_f64().unwrap() >= 0.5, "{v:#}");
    assert!(v["summary"]
        .as_str()
        .unwrap()
        .starts_with(&format!("rank {slow_rank} (pid {}) holds the run", slow["pid"])));
    let judged = v["ranks"].as_array().unwrap();
    assert_eq!(judged.len(), ranks as usize);
    // Against what each rank measured of its own time in the collective:
    // the others waited for the slow rank, which hardly waited itself.
    let waited =
        |r: u64| truth["ranks"][r as usize]["in_collective_s"].as_f64().expect("its time in the collective");
    assert!(waited(slow_rank.into()) < 0.2 * 8.0, "the slow rank waited {} s", waited(slow_rank.into()));
    let summary = run.summary();
    let judged_s = summary["elapsed_s"].as_f64().unwrap() - summary["startup_s"].as_f64().unwrap_or(0.0);
    for r in judged.iter().filter(|r| r["rank"] != slow_rank) {
        let rank = r["rank"].as_u64().unwrap();
        assert!(waited(rank) > 0.4 * 8.0, "rank {rank} hardly waited: {} s", waited(rank));
        let stall_s = r["peer_wait"].as_f64().unwrap() * judged_s;
        assert!(
            stall_s >= 0.7 * waited(rank),
            "rank {rank}: stall saw {stall_s:.1} s of waiting for peers, the rank measured {:.1} s in the collective",
            waited(rank)
        );
    }
    // The report groups the threads by rank.
    for r in 0..ranks {
        assert!(run.stderr.contains(&format!("-- rank {r}")) || run.stdout.contains(&format!("-- rank {r}")));
    }
}

#[test]
fn torchrun_like_run_names_the_slow_rank() {
    straggler_named("torchrun", "29611", 4, 2);
}

#[test]
fn mp_spawn_like_run_names_the_slow_rank() {
    straggler_named("spawn", "29612", 4, 2);
}

/// Slurm's `srun` starts the tasks with `SLURM_PROCID` and no torch
/// variables; the run is the Slurm job.
#[test]
fn srun_like_run_names_the_slow_rank() {
    straggler_named("srun", "29617", 4, 2);
}

/// Open MPI's `mpirun`: `OMPI_COMM_WORLD_RANK`, the run its PMIx namespace.
#[test]
fn mpirun_like_run_names_the_slow_rank() {
    straggler_named("mpirun", "29618", 4, 2);
}

/// The smallest run: two ranks of one worker each. Few enough processes
/// that the VMs run it too, where sixteen Python processes share two
/// emulated CPUs.
#[test]
fn a_two_rank_run_names_its_slow_rank() {
    straggler_named("spawn", "29616", 2, 1);
}

/// The same with PyTorch itself: torchrun starts four ranks (its agent
/// waits for them), each trains on batches from a DataLoader with two
/// workers and all-reduces its gradients with gloo; rank 2's dataset costs
/// CPU per sample.
#[test]
fn torchrun_gloo_run_names_the_slow_rank() {
    let torch = torch_path();
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Scratch::new("torch");
    let dir_arg = dir.0.display().to_string();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/torch_ranks.py").display().to_string();
    let argv = [
        "run",
        "-q",
        "--",
        python(),
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "4",
        script.as_str(),
        "--dir",
        dir_arg.as_str(),
        "--slow-rank",
        "2",
        "--slow-ms",
        "30",
        "--seconds",
        "12",
    ];
    let run = stall(&argv, &[("PYTHONPATH", &torch)], Duration::from_secs(240));
    assert_eq!(run.status, 0, "stall run failed:\n{}", run.stderr);
    let ranks: Vec<Value> = (0..4).map(|r| rank_report(&dir, r)).collect();
    for r in &ranks {
        let trainer = run.process(pid(&r["pid"]));
        assert_eq!(
            (&trainer["role"], &trainer["rank"]),
            (&Value::from("trainer"), &r["rank"]),
            "pid {}",
            r["pid"]
        );
        for w in r["workers"].as_array().unwrap() {
            let worker = run.process(pid(w));
            assert_eq!((&worker["role"], &worker["rank"]), (&Value::from("worker"), &r["rank"]), "pid {w}");
        }
        // torchrun's agent started it and is no trainer.
        let agent = run.process(pid(&trainer["ppid"]));
        assert_eq!(
            (&agent["role"], &agent["rank"]),
            (&Value::from("other"), &Value::Null),
            "pid {}",
            agent["pid"]
        );
    }
    assert!(run.summary()["run_id"].is_string());
    let v = &run.summary()["verdict"];
    let s = &v["straggler"];
    assert_eq!((&s["rank"], &s["pid"]), (&Value::from(2), &ranks[2]["pid"]), "{v:#}");
    assert_eq!(s["kind"], "input-cpu-bound", "{v:#}");
    assert_eq!(s["waiting_ranks"], serde_json::json!([0, 1, 3]), "{v:#}");
}

/// A real PyTorch run that `torch.multiprocessing.spawn` starts: four ranks,
/// two DataLoader workers each started by `worker_start`, rank 2's shards
/// read from storage throttled to 2 MB/s. With `launch` "spawn" each rank
/// is only its argument to `init_process_group` (no `RANK` anywhere); with
/// "spawn-environ" each rank puts `RANK` and the rendezvous into
/// `os.environ` after it started. Checked against what the job wrote: the
/// ranks are the trainers, each worker carries its rank, the launcher is
/// none, and rank 2 is named as the straggler, held by its input's
/// storage, while the others wait for it as long as they measured
/// themselves waiting in the all-reduce.
/// Seconds each spawned run trains: long enough that its training, not
/// the ranks' setup and teardown after their workers start, is most of
/// what is judged (twelve processes share two CPUs in CI).
const SPAWN_RUN_S: f64 = 14.0;

fn torch_spawn_names_the_slow_rank(launch: &str, worker_start: &str, port: &str, found: &str) {
    let torch = torch_path();
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Scratch::new(&format!("{launch}-{worker_start}"));
    let data = disk_scratch(&format!("ranks-{launch}-{worker_start}"));
    let (dir_arg, data_arg) = (dir.0.display().to_string(), data.0.display().to_string());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/torch_ranks.py").display().to_string();
    let argv = [
        "run",
        "-q",
        "--",
        python(),
        script.as_str(),
        "--dir",
        dir_arg.as_str(),
        "--data-dir",
        data_arg.as_str(),
        "--launch",
        launch,
        "--worker-start",
        worker_start,
        "--port",
        port,
        "--slow-rank",
        "2",
        "--slow-mbps",
        "2",
        "--seconds",
        &SPAWN_RUN_S.to_string(),
    ];
    let run = stall(&argv, &[("PYTHONPATH", &torch)], Duration::from_secs(240));
    let _ = std::fs::remove_dir_all(&data.0);
    assert_eq!(run.status, 0, "stall run failed:\n{}", run.stderr);
    let ranks: Vec<Value> = (0..4).map(|r| rank_report(&dir, r)).collect();
    let launcher: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path("launcher_0.json")).unwrap()).unwrap();
    let l = run.process(pid(&launcher["pid"]));
    assert_eq!((&l["role"], &l["rank"]), (&Value::from("other"), &Value::Null), "the launcher");
    for r in &ranks {
        let trainer = run.process(pid(&r["pid"]));
        assert_eq!(
            (&trainer["role"], &trainer["rank"], &trainer["rank_from"]),
            (&Value::from("trainer"), &r["rank"], &Value::from(found)),
            "pid {}",
            r["pid"]
        );
        for w in r["workers"].as_array().unwrap() {
            let worker = run.process(pid(w));
            assert_eq!((&worker["role"], &worker["rank"]), (&Value::from("worker"), &r["rank"]), "pid {w}");
        }
    }
    // What each rank measured of its own time in the all-reduce: the
    // others waited for rank 2, rank 2 hardly waited.
    let waited = |r: u32| -> f64 {
        let c: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path(&format!("collective_{r}.json"))).unwrap(),
        )
        .unwrap();
        c["in_collective_s"].as_f64().unwrap()
    };
    eprintln!("in the all-reduce: {:?} s", (0..4).map(waited).collect::<Vec<_>>());
    assert!(waited(2) < 0.2 * SPAWN_RUN_S, "rank 2 waited {} s in the all-reduce", waited(2));
    let summary = run.summary();
    let v = &summary["verdict"];
    let s = &v["straggler"];
    assert_eq!((&s["rank"], &s["pid"]), (&Value::from(2), &ranks[2]["pid"]), "{v:#}");
    assert_eq!(s["kind"], "input-io-bound", "{v:#}");
    assert_eq!(s["waiting_ranks"], serde_json::json!([0, 1, 3]), "{v:#}");
    let judged_s = summary["elapsed_s"].as_f64().unwrap() - summary["startup_s"].as_f64().unwrap_or(0.0);
    for r in v["ranks"].as_array().unwrap().iter().filter(|r| r["rank"] != 2) {
        let rank = r["rank"].as_u64().unwrap() as u32;
        assert!(waited(rank) > 0.4 * SPAWN_RUN_S, "rank {rank} hardly waited: {} s", waited(rank));
        let stall_s = r["peer_wait"].as_f64().unwrap() * judged_s;
        assert!(
            stall_s >= 0.7 * waited(rank),
            "rank {rank}: stall saw {stall_s:.1} s of waiting for peers, the rank measured {:.1} s in the all-reduce",
            waited(rank)
        );
    }
}

/// An mp.spawn run whose ranks keep pace: every rank found, none named.
#[test]
fn mp_spawn_ranks_that_keep_pace_name_no_straggler() {
    ranks_that_keep_pace_are_found("spawn", "29626", "spawn-even");
}

/// A launcher that starts its ranks last first (as one starting them in
/// parallel may), with torch's own wrapper: the index each was given is
/// read from the wrapper's arguments, not taken from the start order.
#[test]
fn ranks_started_last_first_are_the_index_they_were_given() {
    ranks_that_keep_pace_are_found("spawn-reversed", "29627", "spawn-reversed");
}

/// `start_processes(start_method="forkserver")` with
/// `TORCH_MP_PARALLEL_START=1`: a fork server forks the ranks from a pool
/// of threads.
#[test]
fn ranks_a_fork_server_started_in_parallel_are_found() {
    ranks_that_keep_pace_are_found("forkserver-parallel", "29628", "forkserver-parallel");
}

fn ranks_that_keep_pace_are_found(launch: &str, port: &str, scratch: &str) {
    let torch = torch_path();
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Scratch::new(scratch);
    let dir_arg = dir.0.display().to_string();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/torch_ranks.py").display().to_string();
    let argv = ["run", "-q", "--", python(), &script, "--dir", &dir_arg, "--launch", launch];
    let argv: Vec<&str> = argv.into_iter().chain(["--port", port, "--seconds", "8"]).collect();
    let run = stall(&argv, &[("PYTHONPATH", &torch)], Duration::from_secs(240));
    assert_eq!(run.status, 0, "stall run failed:\n{}", run.stderr);
    for r in 0..4 {
        let trainer = run.process(pid(&rank_report(&dir, r)["pid"]));
        assert_eq!(
            (&trainer["role"], &trainer["rank"], &trainer["rank_from"]),
            (&Value::from("trainer"), &Value::from(r), &Value::from("spawn-index")),
            "rank {r}"
        );
    }
    let v = &run.summary()["verdict"];
    assert!(v["straggler"].is_null(), "{v:#}");
    assert_eq!(v["ranks"].as_array().unwrap().len(), 4, "{v:#}");
}

#[test]
fn mp_spawn_rank_as_argument_with_forked_workers() {
    torch_spawn_names_the_slow_rank("spawn", "fork", "29621", "spawn-index");
}

#[test]
fn mp_spawn_rank_as_argument_with_forkserver_workers() {
    torch_spawn_names_the_slow_rank("spawn", "forkserver", "29622", "spawn-index");
}

#[test]
fn mp_spawn_rank_in_os_environ_with_forked_workers() {
    torch_spawn_names_the_slow_rank("spawn-environ", "fork", "29623", "live-environ");
}

#[test]
fn mp_spawn_rank_in_os_environ_with_forkserver_workers() {
    torch_spawn_names_the_slow_rank("spawn-environ", "forkserver", "29624", "live-environ");
}

/// Rank 2 stops for good before a collective (a deadlock of its own) and
/// every other rank waits in the all-reduce forever: every rank looks hung;
/// what their trainers wait on (the sockets to rank 0, and rank 0's to rank
/// 2; the function is named as no collective library names one) tells the
/// three inside the collective from the one that never reached it, which
/// the hang names.
#[test]
fn a_rank_that_never_reaches_the_collective_is_named_in_the_hang() {
    use std::os::unix::process::CommandExt;
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Scratch::new("hung");
    let truth_path = dir.path("truth.json");
    let dir_arg = dir.0.display().to_string();
    // Its own process group: the hung run is ended with one kill.
    let job = Command::new(python())
        .arg(ranks_py())
        .args([
            "--dir",
            &dir_arg,
            "--port",
            "29615",
            "--hang-rank",
            "2",
            "--hang-after",
            "2",
            "--seconds",
            "600",
        ])
        .env("TRUTH", &truth_path)
        .process_group(0)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let launcher = job.id();
    struct EndGroup(std::process::Child);
    impl Drop for EndGroup {
        fn drop(&mut self) {
            let group = nix::unistd::Pid::from_raw(self.0.id() as i32);
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
            let _ = self.0.wait();
        }
    }
    let _job = EndGroup(job);
    wait_until("the ranks", Duration::from_secs(90), || {
        (0..4).all(|r| dir.path(&format!("rank_{r}.json")).exists())
    });
    let launcher_arg = launcher.to_string();
    let run =
        stall(&["attach", "-q", "--pid", &launcher_arg, "--duration", "12"], &[], Duration::from_secs(60));
    assert_eq!(run.status, 0, "stall attach failed:\n{}", run.stderr);
    let rank = |r: u32| rank_report(&dir, r);
    let v = &run.summary()["verdict"];
    assert_eq!(v["kind"], "hang", "{v:#}");
    let s = &v["straggler"];
    assert_eq!(
        (&s["rank"], &s["pid"], &s["kind"]),
        (&Value::from(2), &rank(2)["pid"], &Value::from("hang")),
        "{v:#}"
    );
    assert_eq!(s["waiting_ranks"], serde_json::json!([0, 1, 3]), "{v:#}");
    let stacks = v["python_stacks"].as_array().expect("the ranks' stacks");
    let stack_of = |pid: &Value| stacks.iter().find(|st| &st["pid"] == pid && &st["tid"] == pid).cloned();
    let in_fn = |st: Option<Value>, f: &str| {
        st.is_some_and(|st| st["frames"].as_array().unwrap().iter().any(|fr| fr["function"] == f))
    };
    assert!(in_fn(stack_of(&rank(2)["pid"]), "stuck"), "{v:#}");
    assert!(in_fn(stack_of(&rank(0)["pid"]), "reduce_through_root"), "{v:#}");
}

#[test]
fn ranks_that_keep_pace_name_no_straggler() {
    let (run, truth) = traced_run("even", &["--port", "29613", "--seconds", "6"]);
    check_roles(&run, &truth, "stall-test-run");
    let v = &run.summary()["verdict"];
    assert!(v["straggler"].is_null(), "{v:#}");
    assert_eq!(v["ranks"].as_array().unwrap().len(), 4);
}

/// Two "nodes" for a run: each a cgroup root watched by its own daemon,
/// with a pod inside it; a real Prometheus scrapes both daemons and
/// evaluates deploy/stall-alerts.yml.
struct TwoNodes {
    // Dropped in this order: the processes, then the pods' tasks, then
    // the cgroups.
    guard: Killer,
    _evict: Evict,
    pods: [Cgroup; 2],
    _nodes: [Cgroup; 2],
    ports: [u16; 2],
    prom_port: u16,
    /// Each daemon's stderr.
    logs: [PathBuf; 2],
}

impl TwoNodes {
    fn start(dir: &Scratch) -> Self {
        require_root();
        let nodes = [Cgroup::new("node-a"), Cgroup::new("node-b")];
        let pods = [nodes[0].child("pod"), nodes[1].child("pod")];
        let mut guard = Killer(vec![]);
        let ports = [free_port(), free_port()];
        let logs = [dir.path("daemon-a.log"), dir.path("daemon-b.log")];
        for ((node, port), log) in nodes.iter().zip(ports).zip(&logs) {
            let daemon = Command::new(stall_bin())
                .args([
                    "daemon",
                    "--cgroup-root",
                    &node.name,
                    "--all-jobs",
                    "--interval",
                    "1",
                    "--gpu",
                    "off",
                ])
                .args(["--listen", &format!("127.0.0.1:{port}")])
                .stderr(std::fs::File::create(log).unwrap())
                .spawn()
                .unwrap();
            guard.0.push(daemon);
            wait_until("a daemon's /metrics", Duration::from_secs(20), || {
                http_get(port, "/metrics").is_some()
            });
        }
        let rules = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join("deploy/stall-alerts.yml");
        let (prom, prom_port) = start_prometheus(
            dir,
            &format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: ['{}']\nscrape_configs:\n  - job_name: stall\n    static_configs:\n      - targets: ['127.0.0.1:{}', '127.0.0.1:{}']\n",
                rules.display(),
                ports[0],
                ports[1]
            ),
        );
        guard.0.push(prom);
        let evict = Evict(pods.iter().map(|p| p.dir.clone()).collect());
        Self { guard, _evict: evict, pods, _nodes: nodes, ports, prom_port, logs }
    }

    /// What each daemon said and exports of its jobs and ranks: for a
    /// failure's message.
    fn daemons_said(&self) -> String {
        let mut out = String::new();
        for (i, (log, port)) in self.logs.iter().zip(self.ports).enumerate() {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(20)..].join("\n");
            let metrics = http_get(port, "/metrics").unwrap_or_default();
            let series: Vec<&str> = metrics
                .lines()
                .filter(|l| {
                    l.starts_with("stall_rank_") || l.starts_with("stall_verdict{") && l.ends_with(" 1")
                })
                .collect();
            out += &format!(
                "\n--- node {i} daemon's stderr (last 20 lines):\n{tail}\n--- its series:\n{}",
                series.join("\n")
            );
        }
        out
    }

    /// Waits until `StallStragglerRank` names `straggler` of `run_id` on
    /// the node `node_of(rank)` and rank 0 waits for its peers; then checks
    /// that no other rank is named.
    fn straggler_alerted(&self, run_id: &str, straggler: u32, node_of: impl Fn(u32) -> usize) {
        let run_id = run_label(run_id);
        let alert = |rank: u32| {
            format!(
                r#"ALERTS{{alertname="StallStragglerRank",run_id="{run_id}",rank="{rank}",instance="127.0.0.1:{}"}}"#,
                self.ports[node_of(rank)]
            )
        };
        let waits = |rank: u32| {
            query(
                self.prom_port,
                &format!(r#"stall_rank_peer_wait_ratio{{run_id="{run_id}",rank="{rank}"}}"#),
            )
        };
        let others: Vec<u32> = (0..4).filter(|r| *r != straggler).collect();
        // Each node's daemon finds its ranks on its own: the alert may be
        // pending on node b's waiting rank before node a's ranks are
        // exported, and a rank may look held while the run starts (its
        // pending alert is what the rule's `for` rides out).
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline
            && (query(self.prom_port, &alert(straggler)).is_none()
                || !waits(0).is_some_and(|w| w > 0.5)
                || others.iter().any(|r| query(self.prom_port, &alert(*r)).is_some()))
        {
            sleep(Duration::from_millis(500));
        }
        assert_eq!(
            query(self.prom_port, &alert(straggler)),
            Some(1.0),
            "no StallStragglerRank for rank {straggler}; peer waits of the others: {:?}{}",
            others.iter().map(|r| waits(*r)).collect::<Vec<_>>(),
            self.daemons_said()
        );
        assert!(waits(0).is_some_and(|w| w > 0.5), "rank 0 on node a waits: {:?}", waits(0));
        let verdicts =
            http_get(self.prom_port, &format!("/api/v1/query?query={}", encode("stall_rank_verdict == 1")));
        for other in others {
            assert_eq!(
                query(self.prom_port, &alert(other)),
                None,
                "rank {other} is no straggler: {verdicts:?}"
            );
            // Every rank's own verdict is exported, on its own node.
            let verdict = format!(
                r#"max(stall_rank_verdict{{run_id="{run_id}",rank="{other}",instance="127.0.0.1:{}"}})"#,
                self.ports[node_of(other)]
            );
            assert_eq!(query(self.prom_port, &verdict), Some(1.0), "{verdict}");
        }
    }

    /// Waits until `StallLateRank` names `late` of `run_id` on its node
    /// (`node_of`), valued within `late_s()`, the bounds of the lateness
    /// the ranks measured themselves meanwhile; then checks no other rank
    /// is.
    fn late_rank_alerted(
        &self,
        run_id: &str,
        late: u32,
        late_s: impl Fn() -> (f64, f64),
        node_of: impl Fn(u32) -> usize,
    ) {
        let run_id = run_label(run_id);
        let alert = |rank: u32| {
            format!(
                r#"ALERTS{{alertname="StallLateRank",run_id="{run_id}",rank="{rank}",instance="127.0.0.1:{}"}}"#,
                self.ports[node_of(rank)]
            )
        };
        let waits = || {
            http_get(
                self.prom_port,
                &format!("/api/v1/query?query={}", encode("stall_rank_collective_wait_seconds")),
            )
        };
        let others: Vec<u32> = (0..4).filter(|r| *r != late).collect();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline
            && (query(self.prom_port, &alert(late)).is_none()
                || others.iter().any(|r| query(self.prom_port, &alert(*r)).is_some()))
        {
            sleep(Duration::from_millis(500));
        }
        assert_eq!(
            query(self.prom_port, &alert(late)),
            Some(1.0),
            "no StallLateRank for rank {late}: {:?}{}",
            waits(),
            self.daemons_said()
        );
        for other in others {
            assert_eq!(query(self.prom_port, &alert(other)), None, "rank {other} is not late: {:?}", waits());
        }
        // The alert's value: how much more the others wait for each.
        let lateness = format!(
            r#"max by (run_id) (stall_rank_collective_wait_seconds{{run_id="{run_id}"}}) - on (run_id) stall_rank_collective_wait_seconds{{run_id="{run_id}",rank="{late}"}}"#
        );
        let got = query(self.prom_port, &lateness).expect("the late rank's lateness");
        // Python's side of each call and the windows' edges: a few ms.
        let (lo, hi) = late_s();
        eprintln!("lateness {got:.3} s; the ranks' own between {lo:.3} and {hi:.3} s");
        assert!(
            lo - 0.02 <= got && got <= hi + 0.02,
            "lateness {got} s, the ranks' own between {lo:.3} and {hi:.3} s: {:?}",
            waits()
        );
    }
}

/// An NCCL run over the two "nodes" (the stand-in libraries, ranks 0 and 1
/// on node a, 2 and 3 on node b), rank 2 calling each all-reduce 200 ms
/// late, the others blocked in their synchronizations meanwhile:
/// `StallLateRank` names rank 2 on node b from the ranks' waits alone (no
/// clocks compared across the nodes), valued at its lateness.
#[test]
fn prometheus_names_the_late_nccl_rank_across_two_nodes() {
    use stall_tests::gpu::{cuda_stub_lib, nccl_stub_lib};
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Scratch::new("nccl-nodes");
    let mut nodes = TwoNodes::start(&dir);
    let p = &nodes.pods;
    let cgroups = [&p[0], &p[0], &p[1], &p[1]].map(|c| c.dir.display().to_string()).join(",");
    let (cuda, nccl) = (dir.path("libcudart.so.13"), dir.path("libnccl.so.2"));
    std::fs::copy(cuda_stub_lib(), &cuda).unwrap();
    std::fs::copy(nccl_stub_lib(), &nccl).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/nccl_job.py");
    let job = Command::new(python())
        .arg(&script)
        .args(["launch", "--ranks", "4", "--dir"])
        .arg(&dir.0)
        .arg("--cuda-lib")
        .arg(&cuda)
        .arg("--nccl-lib")
        .arg(&nccl)
        .args(["--late-rank", "2", "--late-ms", "200", "--schedule", "block", "--seconds", "60"])
        .args(["--port", "29543", "--cgroups", &cgroups])
        .arg("--log")
        .arg(dir.path("rank_{rank}.log"))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let run_id = format!("stall-nccl-{}", job.id());
    nodes.guard.0.insert(0, job);
    // What the ranks measured of their last all-reduces (the last 5 s of
    // each rank's log, which hold the daemons' last windows), from the call
    // to the return of the synchronization after it: the least and the
    // most the one waiting most can have waited more than rank 2 on
    // average over any of them. Natively a few ms apart around 200 ms; a
    // slow VM stretches the late rank's sleep and spreads the waits.
    let measured = || {
        let waits = |rank: u32| {
            let text = std::fs::read_to_string(dir.path(&format!("rank_{rank}.log"))).unwrap_or_default();
            let field = |l: &str, name: &str| -> Option<f64> {
                l.split(name).nth(1)?.split_whitespace().next()?.parse().ok()
            };
            let steps: Vec<(f64, f64)> =
                text.lines().filter_map(|l| Some((field(l, "t=")?, field(l, "wait_ms=")? / 1e3))).collect();
            let last_t = steps.last().map_or(0.0, |s| s.0);
            let recent: Vec<f64> = steps.iter().filter(|s| s.0 >= last_t - 5.0).map(|s| s.1).collect();
            let least = recent.iter().copied().fold(f64::INFINITY, f64::min);
            (least, recent.iter().copied().fold(0.0, f64::max))
        };
        let late = waits(2);
        let others = [0, 1, 3].map(waits);
        let lo = others.iter().map(|w| w.0).fold(f64::NEG_INFINITY, f64::max) - late.1;
        let hi = others.iter().map(|w| w.1).fold(0.0, f64::max) - late.0;
        (lo, hi)
    };
    nodes.late_rank_alerted(&run_id, 2, measured, |rank| rank as usize / 2);
}

/// Two daemons, each watching its own cgroup root as if it were a node,
/// ranks 0 and 1 on node a and ranks 2 and 3 on node b, started as Slurm's
/// `srun` starts tasks (the run is the Slurm job): `StallStragglerRank` (pending within its `for`)
/// names rank 2 and node b's daemon, joined with the waiting ranks of node
/// a by `run_id`.
#[test]
fn prometheus_names_the_straggler_across_two_nodes() {
    straggler_alerted_across_two_nodes("srun", "29614");
}

/// The same with Open MPI's `mpirun`: the ranks and the run come from
/// `OMPI_COMM_WORLD_RANK` and the PMIx namespace.
#[test]
fn prometheus_names_the_straggler_of_an_mpirun_run_across_two_nodes() {
    straggler_alerted_across_two_nodes("mpirun", "29619");
}

fn straggler_alerted_across_two_nodes(launch: &str, port: &str) {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Scratch::new(&format!("nodes-{launch}"));
    let mut nodes = TwoNodes::start(&dir);
    let p = &nodes.pods;
    let cgroups = [&p[0], &p[0], &p[1], &p[1]].map(|c| c.dir.display().to_string()).join(",");
    let dir_arg = dir.0.display().to_string();
    let job = Command::new(python())
        .arg(ranks_py())
        .args(["--dir", &dir_arg, "--port", port, "--launch", launch, "--slow-rank", "2", "--seconds", "40"])
        .args(["--cgroups", &cgroups])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    nodes.guard.0.insert(0, job);
    nodes.straggler_alerted(run_id_of(launch), 2, |rank| rank as usize / 2);
}

/// The same run as PyTorch's own multi-node `mp.spawn` script has it: on
/// each node a launcher (its `NODE_RANK` in its environment) spawns two
/// ranks that join with `init_process_group(rank=NODE_RANK*2+i)`, gloo,
/// one DataLoader worker each; rank 2's dataset costs CPU per sample.
#[test]
fn prometheus_names_the_straggler_of_an_mp_spawn_run_across_two_nodes() {
    let torch = torch_path();
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Scratch::new("spawn-nodes");
    let mut nodes = TwoNodes::start(&dir);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/torch_ranks.py");
    let dir_arg = dir.0.display().to_string();
    for (node, pod) in nodes.pods.iter().enumerate() {
        // Into the pod before it runs: `echo $$` is the launcher's pid.
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(r#"echo $$ > "$0" && exec "$@""#)
            .arg(pod.dir.join("cgroup.procs"))
            .arg(python())
            .arg(&script)
            .args([
                "--dir", &dir_arg, "--launch", "spawn", "--nprocs", "2", "--world", "4", "--port", "29625",
            ])
            .args(["--workers", "1", "--slow-rank", "2", "--slow-ms", "40", "--seconds", "60"])
            .env("PYTHONPATH", &torch)
            .env("NODE_RANK", node.to_string())
            .stdout(Stdio::null());
        nodes.guard.0.insert(0, cmd.spawn().unwrap());
    }
    nodes.straggler_alerted("127.0.0.1:29625", 2, |rank| rank as usize / 2);
}

/// Kills every task of the cgroups (by directory) when dropped (the ranks
/// outlive their launcher), so that the cgroups can go.
struct Evict(Vec<std::path::PathBuf>);

impl Drop for Evict {
    fn drop(&mut self) {
        for dir in &self.0 {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}
