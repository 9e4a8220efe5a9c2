//! Distributed runs (tests/workloads/ranks.py): a launcher, four ranks with
//! the environment torchrun or mp.spawn gives them, two DataLoader-like
//! workers each, and a TCP all-reduce ending every step. Checked against the
//! pids the job reports: the launcher is no trainer, each rank is its own
//! trainer, each worker belongs to its rank, and the rank whose workers are
//! slow is named as the one the others wait for — by `stall run`, and by
//! Prometheus across two daemons each watching the ranks of its own "node".
use std::{
    path::Path,
    process::{Command, Stdio},
    sync::Mutex,
    thread::sleep,
    time::{Duration, Instant},
};

use serde_json::Value;
use stall_tests::*;

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
    check_roles(&run, &truth);
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
    for r in judged.iter().filter(|r| r["rank"] != slow_rank) {
        assert!(
            r["peer_wait"].as_f64().unwrap() >= 0.5,
            "rank {} does not wait for its peers: {r}",
            r["rank"]
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

/// Rank 2 stops for good before a collective (a deadlock of its own) and
/// every other rank waits in the all-reduce forever: every rank looks hung;
/// their trainers' Python stacks tell the three inside the collective from
/// the one that never reached it, which the hang names.
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
    assert!(in_fn(stack_of(&rank(0)["pid"]), "all_reduce"), "{v:#}");
}

#[test]
fn ranks_that_keep_pace_name_no_straggler() {
    let (run, truth) = traced_run("even", &["--port", "29613", "--seconds", "6"]);
    check_roles(&run, &truth);
    let v = &run.summary()["verdict"];
    assert!(v["straggler"].is_null(), "{v:#}");
    assert_eq!(v["ranks"].as_array().unwrap().len(), 4);
}

/// Two daemons, each watching its own cgroup root as if it were a node,
/// ranks 0 and 1 on node a and ranks 2 and 3 on node b; a real Prometheus
/// scrapes both and evaluates deploy/stall-alerts.yml: `StallStragglerRank`
/// (pending within its `for`) names rank 2 and node b's daemon, joined with
/// the waiting ranks of node a by `run_id`.
#[test]
fn prometheus_names_the_straggler_across_two_nodes() {
    require_root();
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Scratch::new("nodes");
    let nodes = [Cgroup::new("node-a"), Cgroup::new("node-b")];
    let pods = [nodes[0].child("pod"), nodes[1].child("pod")];
    // Dropped before the cgroups: the ranks and workers in them end first.
    let _evict = Evict(&pods);
    let mut guard = Killer(vec![]);
    let ports = [free_port(), free_port()];
    for (node, port) in nodes.iter().zip(ports) {
        let daemon = Command::new(stall_bin())
            .args(["daemon", "--cgroup-root", &node.name, "--all-jobs", "--interval", "1", "--gpu", "off"])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        guard.0.push(daemon);
        wait_until("a daemon's /metrics", Duration::from_secs(20), || http_get(port, "/metrics").is_some());
    }
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join("deploy/stall-alerts.yml");
    let (prom, prom_port) = start_prometheus(
        &dir,
        &format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: ['{}']\nscrape_configs:\n  - job_name: stall\n    static_configs:\n      - targets: ['127.0.0.1:{}', '127.0.0.1:{}']\n",
            rules.display(),
            ports[0],
            ports[1]
        ),
    );
    guard.0.push(prom);

    let cgroups = [&pods[0], &pods[0], &pods[1], &pods[1]].map(|c| c.dir.display().to_string()).join(",");
    let dir_arg = dir.0.display().to_string();
    let job = Command::new(python())
        .arg(ranks_py())
        .args([
            "--dir",
            &dir_arg,
            "--port",
            "29614",
            "--slow-rank",
            "2",
            "--seconds",
            "40",
            "--cgroups",
            &cgroups,
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    guard.0.insert(0, job);

    let alert = |rank: u32| {
        format!(
            r#"ALERTS{{alertname="StallStragglerRank",run_id="stall-test-run",rank="{rank}",instance="127.0.0.1:{}"}}"#,
            ports[rank as usize / 2]
        )
    };
    let waits = |rank: u32| {
        query(prom_port, &format!(r#"stall_rank_peer_wait_ratio{{run_id="stall-test-run",rank="{rank}"}}"#))
    };
    // Each node's daemon finds its ranks on its own: the alert may be
    // pending on node b's waiting rank before node a's ranks are exported.
    let deadline = Instant::now() + Duration::from_secs(40);
    while Instant::now() < deadline
        && (query(prom_port, &alert(2)).is_none() || !waits(0).is_some_and(|w| w > 0.5))
    {
        sleep(Duration::from_millis(500));
    }
    assert_eq!(
        query(prom_port, &alert(2)),
        Some(1.0),
        "no StallStragglerRank for rank 2; peer waits of ranks 0, 1, 3: {:?} {:?} {:?}",
        waits(0),
        waits(1),
        waits(3)
    );
    assert!(waits(0).is_some_and(|w| w > 0.5), "rank 0 on node a waits: {:?}", waits(0));
    for other in [0, 1, 3] {
        assert_eq!(query(prom_port, &alert(other)), None, "rank {other} is no straggler");
    }
}

/// Kills every task of the cgroups when dropped (the ranks outlive their
/// launcher), so that the cgroups can go.
struct Evict<'a>(&'a [Cgroup]);

impl Drop for Evict<'_> {
    fn drop(&mut self) {
        for c in self.0 {
            let procs = std::fs::read_to_string(c.dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}
