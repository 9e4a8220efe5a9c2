//! `stall daemon` scraped by a real Prometheus (Debian's `prometheus`,
//! installed by `cargo xtask test`): a job in a cgroup reads a file of known
//! size; Prometheus's query API must show the job's bytes within 1 % and a
//! verdict series; promtool must accept the exposition; SIGTERM must leave no
//! program behind. (Its own test binary: cargo runs binaries one at a time.)
use std::{
    io::Write,
    path::Path,
    process::{Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use stall_tests::assert::assert_close;
use stall_tests::cgroup::{cgroup2_mount, holds_tasks, remove_tree, Cgroup};
use stall_tests::gpu::ScriptedGpu;
use stall_tests::http::{free_port, http_get, query, start_prometheus};
use stall_tests::procs::{spawn_announcing, wait_until, Killer};
use stall_tests::scratch::{disk_scratch, tempfile_path, Scratch};
use stall_tests::stall::{bpf_programs_of, require_root, stall_bin, still_loaded, STALL_PROGRAMS};
use stall_tests::workload::{jobs_py, python, shards, truth, workload};

#[test]
fn prometheus_scrapes_the_daemon() {
    require_root();
    let s = Scratch::new("daemon");
    let size = 8_000_033usize;
    let data = s.file("d.bin", size);
    let truth_path = s.path("truth.json");
    let root = Cgroup::new("daemon");
    let job_cg = root.child("job1");
    let root_name = root.name.clone();
    let mut guard = Killer(vec![]);

    let daemon_port = free_port();
    let daemon = Command::new(stall_bin())
        .args(["daemon", "--cgroup-root", &root_name, "--all-jobs", "--interval", "1", "--gpu", "off"])
        .args(["--listen", &format!("127.0.0.1:{daemon_port}")])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let daemon_pid = daemon.id();
    guard.0.push(daemon);
    wait_until("the daemon's /metrics", Duration::from_secs(20), || {
        http_get(daemon_port, "/metrics").is_some()
    });

    // A second daemon on the same port: one clear line, exit code 7.
    let out = Command::new(stall_bin())
        .args(["daemon", "--cgroup-root", &root_name, "--all-jobs", "--gpu", "off"])
        .args(["--listen", &format!("127.0.0.1:{daemon_port}")])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(7), "{err}");
    assert!(err.lines().any(|l| l.contains("cannot listen on") && l.contains("in use")), "{err}");

    let (prom, prom_port) = start_prometheus(
        &s,
        &format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: stall\n    static_configs:\n      - targets: ['127.0.0.1:{daemon_port}']\n"
        ),
    );
    guard.0.push(prom);

    // The job: announces itself, is moved into the job's cgroup, then forks
    // a reader of the data file.
    let (mut job, job_pid) = spawn_announcing(
        Command::new(python())
            .arg(jobs_py())
            .args(["idle-then-read", data.to_str().unwrap(), "2.0"])
            .env("TRUTH", &truth_path),
    );
    job_cg.add(job_pid);
    assert!(job.wait().unwrap().success());
    assert_eq!(truth(&truth_path)["bytes"], size as u64);

    let rel = format!("{root_name}/job1");
    let q = format!("sum(stall_read_bytes_total{{cgroup=\"{rel}\"}})");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = None;
    while Instant::now() < deadline {
        got = query(prom_port, &q);
        if got.is_some_and(|v| (v - size as f64).abs() <= 0.01 * size as f64) {
            break;
        }
        sleep(Duration::from_millis(300));
    }
    let got = got.unwrap_or_else(|| panic!("no {q} in Prometheus"));
    assert_close("bytes read, as Prometheus stored them", got, size as f64, 0.01);
    let verdicts = query(prom_port, &format!("sum(stall_verdict{{cgroup=\"{rel}\"}})"));
    assert_eq!(verdicts, Some(1.0), "exactly one verdict kind is current");
    assert!(query(prom_port, "stall_agent_jobs").is_some_and(|v| v >= 1.0));

    let exposition = http_get(daemon_port, "/metrics").unwrap();
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    promtool.stdin.take().unwrap().write_all(exposition.as_bytes()).unwrap();
    let out = promtool.wait_with_output().unwrap();
    assert!(out.status.success(), "promtool: {}\n{exposition}", String::from_utf8_lossy(&out.stderr));
    let jobs: serde_json::Value = serde_json::from_str(&http_get(daemon_port, "/jobs").unwrap()).unwrap();
    assert!(jobs["jobs"].as_array().unwrap().iter().any(|j| j["cgroup"] == rel.as_str()), "{jobs}");

    // Clean shutdown on SIGTERM: exit 0, nothing left loaded.
    let ours = bpf_programs_of(daemon_pid);
    assert!(ours.len() >= STALL_PROGRAMS, "the daemon holds its programs: {ours:?}");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(daemon_pid as i32), nix::sys::signal::Signal::SIGTERM)
        .unwrap();
    let status = guard.0[0].wait().unwrap();
    assert!(status.success(), "daemon exit: {status}");
    wait_until("the daemon's programs to go", Duration::from_secs(5), || still_loaded(&ours).is_empty());
}

/// The alerting rules shipped in deploy/ load in Prometheus and fire on the
/// series the daemon exports (tests/alerts/ feeds them synthetic series).
#[test]
fn alert_rules_pass_promtool() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let rules = root.join("deploy/stall-alerts.yml");
    let out = Command::new("promtool").args(["check", "rules"]).arg(&rules).output().unwrap();
    assert!(out.status.success(), "promtool check rules: {}", String::from_utf8_lossy(&out.stdout));
    // Every alert in the file, none dropped.
    let alerts = std::fs::read_to_string(&rules).unwrap().matches("- alert: ").count();
    assert!(alerts >= 6, "{alerts} alerts in {}", rules.display());
    let found = format!("SUCCESS: {alerts} rules found");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&found),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("alerts");
    let out = Command::new("promtool")
        .args(["test", "rules", "stall-alerts.test.yml"])
        .current_dir(&tests)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool test rules: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A series' value in a classic-format exposition: the line of `name` whose
/// labels include all of `labels`.
fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let (n, rest) = series.split_once('{').unwrap_or((series, ""));
        (n == name && labels.iter().all(|(k, v)| rest.contains(&format!("{k}=\"{v}\""))))
            .then(|| value.parse().ok())?
    })
}

/// One scripted H200 (700 W limit) at `util` % and `power_mw`, held by the
/// process whose pid is in `pid_file`.
fn one_gpu(pid_file: &Path, util: u32, power_mw: u32) -> serde_json::Value {
    serde_json::json!({"devices": [{"name": "Scripted H200", "power_limit_mw": 700_000,
        "phases": [{"util_pct": util, "power_mw": power_mw,
                    "processes": [{"pid_file": pid_file, "used_mem_bytes": 1_000_000_000u64}]}]}]})
}

/// `stall daemon` (default tiers, 1-s interval) on `root`, seeing `gpu`,
/// first in `guard` (killed before the job), once it serves /metrics; its
/// port.
fn tiered_daemon(gpu: &ScriptedGpu, root: &Cgroup, guard: &mut Killer) -> u16 {
    let port = free_port();
    let daemon = gpu
        .command("daemon")
        .args(["--cgroup-root", &root.name, "--interval", "1"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    guard.0.insert(0, daemon);
    // Trampolines are loaded, attached and detached at start (the probe of
    // `auto`): seconds under emulation.
    wait_until("the daemon's /metrics", Duration::from_secs(60), || http_get(port, "/metrics").is_some());
    port
}

/// The daemon's tiers on a GPU job (scripted NVML): while its GPU is busy
/// no syscall hook runs; once the GPU idles while the workers wait on
/// storage, the full capture starts and `/metrics` says `input-io-bound`
/// within 30 s; once the GPU is busy again, the hooks go.
#[test]
fn a_gpu_job_gets_the_full_capture_while_its_gpu_idles() {
    require_root();
    let s = disk_scratch("tiers");
    let start = s.path("go");
    let mut args = shards(&s.path("cache"), 8, 16, 8);
    args.extend(
        ["--workers", "4", "--start-delay", "0", "--epochs", "20", "--max-seconds", "150", "--start-after"]
            .map(String::from),
    );
    args.push(start.to_str().unwrap().to_string());
    let gpu = ScriptedGpu::new(&serde_json::json!(null));
    let pid_file = gpu.path("trainer.pid");
    let gpu_at = |util: u32, power_mw: u32| one_gpu(&pid_file, util, power_mw);
    gpu.update(&gpu_at(100, 650_000));
    let root = Cgroup::new("tiers");
    let job_cg = root.child("job1");
    // The job's processes in a leaf below the job, so that the job can
    // throttle its reads in a cgroup beside them (cgroup v2).
    let main_cg = job_cg.child("main");
    let rel = job_cg.name.clone();
    let port = free_port();
    let mut daemon = gpu.command("daemon");
    daemon
        .args(["--cgroup-root", &root.name, "--interval", "1", "--escalate-idle", "3", "--cooldown", "300"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .stderr(Stdio::inherit());
    let mut guard = Killer(vec![daemon.spawn().unwrap()]);
    wait_until("the daemon's /metrics", Duration::from_secs(20), || http_get(port, "/metrics").is_some());

    // Started inside its cgroup: the job sets up its read throttle (a
    // cgroup beside its own, on cgroup v2) as it starts.
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(r#"echo $$ > "$0" && exec "$@""#)
        .arg(main_cg.dir.join("cgroup.procs"))
        .args(workload(&args));
    let (job, pid) = spawn_announcing(&mut cmd);
    guard.0.push(job);
    std::fs::write(&pid_file, pid.to_string()).unwrap();
    std::fs::write(&start, "").unwrap();
    let job_labels = [("cgroup", rel.as_str())];
    let scrape = || http_get(port, "/metrics").unwrap_or_default();
    let verdict = |text: &str, kind: &str| metric(text, "stall_verdict", &[("cgroup", &rel), ("kind", kind)]);

    // Healthy: the cheap tier, no syscall hook.
    wait_until("the job watched, GPU busy, in the cheap tier", Duration::from_secs(30), || {
        let t = scrape();
        verdict(&t, "gpu-busy") == Some(1.0) && metric(&t, "stall_capture_tier", &job_labels) == Some(0.0)
    });
    let t = scrape();
    assert_eq!(metric(&t, "stall_syscall_hooks_attached", &[]), Some(0.0), "{t}");

    // The GPU idles while the workers wait on storage.
    gpu.update(&gpu_at(0, 60_000));
    let idle_at = Instant::now();
    wait_until("input-io-bound within 30 s of the GPU going idle", Duration::from_secs(30), || {
        verdict(&scrape(), "input-io-bound") == Some(1.0)
    });
    eprintln!("tiers: input-io-bound {:.1} s after the GPU went idle", idle_at.elapsed().as_secs_f64());
    let t = scrape();
    assert_eq!(metric(&t, "stall_capture_tier", &job_labels), Some(1.0), "{t}");
    assert_eq!(metric(&t, "stall_syscall_hooks_attached", &[]), Some(1.0), "{t}");
    assert!(metric(&t, "stall_escalations_total", &job_labels).unwrap_or(0.0) >= 1.0, "{t}");
    let worker_bytes =
        metric(&t, "stall_read_bytes_total", &[("cgroup", &rel), ("role", "worker")]).unwrap_or(0.0);
    assert!(worker_bytes > 1e6, "the workers' reads are counted in the full tier: {t}");

    // Busy again: back to the cheap tier.
    gpu.update(&gpu_at(100, 650_000));
    wait_until("back in the cheap tier once the GPU is busy", Duration::from_secs(20), || {
        let t = scrape();
        metric(&t, "stall_capture_tier", &job_labels) == Some(0.0)
            && metric(&t, "stall_syscall_hooks_attached", &[]) == Some(0.0)
            && verdict(&t, "gpu-busy") == Some(1.0)
    });

    // Idle again within the cooldown (300 s): no blind spell, one short
    // capture explains it.
    gpu.update(&gpu_at(0, 60_000));
    let again_at = Instant::now();
    wait_until("input-io-bound again, within the cooldown", Duration::from_secs(30), || {
        verdict(&scrape(), "input-io-bound") == Some(1.0)
    });
    eprintln!(
        "tiers: input-io-bound again {:.1} s after the GPU idled again",
        again_at.elapsed().as_secs_f64()
    );
    let t = scrape();
    assert!(metric(&t, "stall_escalations_total", &job_labels).unwrap_or(0.0) >= 2.0, "{t}");
}

/// The sum of every series of `name` whose labels include all of `labels`.
fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            (n == name && labels.iter().all(|(k, v)| rest.contains(&format!("{k}=\"{v}\""))))
                .then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

/// Scrapes until `ready` holds of the exposition; on a timeout, fails with
/// the last one.
fn scrape_until(what: &str, timeout: Duration, scrape: &dyn Fn() -> String, ready: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + timeout;
    loop {
        let text = scrape();
        if ready(&text) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}; last scrape:\n{text}"
        );
        sleep(Duration::from_millis(200));
    }
}

/// The CPU time of a cgroup and all below it so far, s (cgroup v2's
/// `cpu.stat`, kept whether or not the cpu controller is enabled).
fn cgroup_cpu_s(dir: &Path) -> f64 {
    let text = std::fs::read_to_string(dir.join("cpu.stat")).unwrap();
    let usec = text.lines().find_map(|l| l.strip_prefix("usage_usec ")).unwrap();
    usec.trim().parse::<f64>().unwrap() / 1e6
}

/// A healthy GPU job (scripted NVML, busy) in the cheap tier: no scheduler
/// or syscall hook is attached, yet the job's time on CPU is its cgroup's
/// (`cpu.stat`, over the same window), a process sleeping is counted as
/// sleeping, and a process moved into the job's cgroup from outside is
/// adopted (nothing in the kernel would adopt it without the hooks).
#[test]
fn the_cheap_tier_counts_a_jobs_threads_without_scheduler_hooks() {
    require_root();
    let gpu = ScriptedGpu::new(&serde_json::json!(null));
    let pid_file = gpu.path("holder.pid");
    gpu.update(&one_gpu(&pid_file, 100, 650_000));
    let root = Cgroup::new("cheap");
    let job_cg = root.child("job1");
    let rel = job_cg.name.clone();
    let mut guard = Killer(vec![]);
    let mut in_job = |argv: &[&str]| {
        let child = Command::new(argv[0]).args(&argv[1..]).spawn().unwrap();
        job_cg.add(child.id());
        let pid = child.id();
        guard.0.push(child);
        pid
    };
    let holder = in_job(&["sleep", "600"]);
    std::fs::write(&pid_file, holder.to_string()).unwrap();
    in_job(&["sh", "-c", "while :; do :; done"]);
    let port = tiered_daemon(&gpu, &root, &mut guard);
    let scrape = || http_get(port, "/metrics").unwrap_or_default();
    let job = [("cgroup", rel.as_str())];
    scrape_until("the job watched, GPU busy, in the cheap tier", Duration::from_secs(30), &scrape, |t| {
        metric(t, "stall_verdict", &[("cgroup", &rel), ("kind", "gpu-busy")]) == Some(1.0)
            && metric(t, "stall_capture_tier", &job) == Some(0.0)
            && metric_sum(t, "stall_processes", &job) == 2.0
    });

    // One more process, moved in from outside: adopted at the next look.
    let outside = Command::new("sleep").arg("600").spawn().unwrap();
    let outside_pid = outside.id();
    guard.0.push(outside);
    job_cg.add(outside_pid);
    scrape_until("the process moved into the job counted", Duration::from_secs(10), &scrape, |t| {
        metric_sum(t, "stall_processes", &job) == 3.0
    });

    let (t0, cpu0, at0) = (scrape(), cgroup_cpu_s(&job_cg.dir), Instant::now());
    sleep(Duration::from_secs(8));
    let (t1, cpu1, at1) = (scrape(), cgroup_cpu_s(&job_cg.dir), Instant::now());
    for t in [&t0, &t1] {
        assert_eq!(metric(t, "stall_scheduler_hooks_attached", &[]), Some(0.0), "{t}");
        assert_eq!(metric(t, "stall_syscall_hooks_attached", &[]), Some(0.0), "{t}");
        assert_eq!(metric(t, "stall_capture_tier", &job), Some(0.0), "{t}");
    }
    let on = |t: &str| metric_sum(t, "stall_on_cpu_seconds_total", &job);
    let slept =
        |t: &str| metric_sum(t, "stall_off_cpu_seconds_total", &[("cgroup", &rel), ("reason", "sleep")]);
    let (stall_on, truth_on) = (on(&t1) - on(&t0), cpu1 - cpu0);
    let window = (at1 - at0).as_secs_f64();
    eprintln!(
        "cheap tier: on CPU {stall_on:.2} s by stall, {truth_on:.2} s by cpu.stat; asleep {:.2} s in {window:.1} s",
        slept(&t1) - slept(&t0)
    );
    // Each series moves once per interval (1 s): the two windows may be
    // one interval apart at either end.
    assert!(truth_on > 2.0, "the busy loop ran: {truth_on:.2} s on CPU in {window:.1} s");
    assert!(
        (stall_on - truth_on).abs() <= 2.0 + 0.05 * truth_on,
        "on CPU: stall {stall_on:.2} s, cpu.stat {truth_on:.2} s"
    );
    // Two processes asleep all along (the holder and the one moved in).
    let asleep = slept(&t1) - slept(&t0);
    assert!(
        asleep >= 2.0 * (window - 2.0) && asleep <= 2.0 * (window + 2.0),
        "asleep {asleep:.2} s in {window:.1} s, two sleepers:\n{t1}"
    );
}

/// A hang behind a busy GPU, told from the cheap tier (no scheduler or
/// syscall hook attached): the job logged a line a second, then its main
/// thread blocked on a lock forever while the (scripted) GPU reports 100 %
/// at low power. The daemon publishes `hang` within 40 s of the last line,
/// naming the futex the thread waits in, read from /proc; silent for three
/// of its 1 s rhythms (the 10 s floor), the job is escalated at once, and
/// the full capture keeps the verdict.
#[test]
fn a_hang_behind_a_busy_gpu_is_told_in_the_cheap_tier() {
    require_root();
    let s = Scratch::new("cheap-hang");
    let log = s.path("train.log");
    let gpu = ScriptedGpu::new(&serde_json::json!(null));
    let pid_file = gpu.path("trainer.pid");
    gpu.update(&one_gpu(&pid_file, 100, 90_000));
    let root = Cgroup::new("cheap-hang");
    let job_cg = root.child("job1");
    let rel = job_cg.name.clone();
    let mut guard = Killer(vec![]);
    let port = tiered_daemon(&gpu, &root, &mut guard);
    // Lines for a while (a rhythm of 1 s), then a lock taken twice.
    let trainer = r#"
import sys, threading, time
with open(sys.argv[1], "a", buffering=1) as log:
    for step in range(8):
        log.write(f"step {step}\n")
        time.sleep(1)
lock = threading.Lock()
lock.acquire()
lock.acquire()
"#;
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(r#"echo $$ > "$0" && exec python3 -c "$1" "$2""#)
        .arg(job_cg.dir.join("cgroup.procs"))
        .args([trainer, log.to_str().unwrap()]);
    let job = cmd.spawn().unwrap();
    std::fs::write(&pid_file, job.id().to_string()).unwrap();
    guard.0.push(job);
    let started = Instant::now();
    let scrape = || http_get(port, "/metrics").unwrap_or_default();
    let labels = [("cgroup", rel.as_str())];
    scrape_until("hang, in the cheap tier", Duration::from_secs(50), &scrape, |t| {
        metric(t, "stall_verdict", &[("cgroup", &rel), ("kind", "hang")]) == Some(1.0)
    });
    eprintln!(
        "cheap tier: hang published {:.1} s after the trainer started",
        started.elapsed().as_secs_f64()
    );
    scrape_until("the silent job escalated, still hang", Duration::from_secs(20), &scrape, |t| {
        metric(t, "stall_capture_tier", &labels) == Some(1.0)
            && metric(t, "stall_syscall_hooks_attached", &[]) == Some(1.0)
            && metric(t, "stall_verdict", &[("cgroup", &rel), ("kind", "hang")]) == Some(1.0)
    });
    eprintln!("full capture on the silent job {:.1} s after it started", started.elapsed().as_secs_f64());
    let jobs: serde_json::Value = serde_json::from_str(&http_get(port, "/jobs").unwrap_or_default()).unwrap();
    let v = jobs["jobs"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|j| j["cgroup"] == rel.as_str())
        .map(|j| j["verdict"].clone());
    let v = v.unwrap_or_else(|| panic!("the job in /jobs: {jobs}"));
    assert_eq!(v["kind"], "hang", "{v}");
    assert!(v.to_string().contains("futex"), "the wait read from /proc is named: {v}");
}

/// `--kubernetes` finds the kubelet's pod cgroups under either cgroup
/// driver (cgroupfs: `kubepods/burstable/pod<uid>/<container>`, systemd:
/// `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/
/// cri-containerd-<id>.scope`): a process in a container's cgroup is the
/// pod's job, named by the pod's UID; the QoS levels are not jobs.
#[test]
fn the_kubelets_pods_are_found_under_either_cgroup_driver() {
    require_root();
    let mount = cgroup2_mount();
    for top in ["kubepods", "kubepods.slice"] {
        let dir = mount.join(top);
        assert!(
            !holds_tasks(&dir),
            "{} holds tasks: a kubelet runs here, and this test would mix with its pods",
            dir.display()
        );
        // An earlier run's, left empty.
        remove_tree(&dir);
    }
    const UID: &str = "6f1c2b3a-4d5e-4f60-8a7b-9c0d1e2f3a4b";
    const CID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let systemd_uid = UID.replace('-', "_");
    let layouts = [
        ("cgroupfs", vec!["kubepods".to_string(), "kubepods/burstable".into(), format!("kubepods/burstable/pod{UID}"), format!("kubepods/burstable/pod{UID}/{CID}")]),
        (
            "systemd",
            vec![
                "kubepods.slice".to_string(),
                "kubepods.slice/kubepods-burstable.slice".into(),
                format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{systemd_uid}.slice"),
                format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{systemd_uid}.slice/cri-containerd-{CID}.scope"),
            ],
        ),
    ];
    for (driver, dirs) in layouts {
        let cgroups = Nested(dirs.iter().map(|d| Cgroup::at(d)).collect());
        let mut guard = Killer(vec![]);
        let sleeper = Command::new("sleep").arg("120").spawn().unwrap();
        cgroups.0[3].add(sleeper.id());
        guard.0.push(sleeper);
        let port = free_port();
        let mut daemon = Command::new(stall_bin())
            .args(["daemon", "--kubernetes", "--all-jobs", "--interval", "1", "--gpu", "off"])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = daemon.stderr.take().unwrap();
        guard.0.insert(0, daemon);
        let mut jobs = serde_json::Value::Null;
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            jobs = http_get(port, "/jobs").and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default();
            if jobs["jobs"].as_array().is_some_and(|a| !a.is_empty()) {
                break;
            }
            sleep(Duration::from_millis(200));
        }
        assert!(jobs["jobs"].as_array().is_some_and(|a| !a.is_empty()), "{driver}: no job in /jobs: {jobs}");
        let list = jobs["jobs"].as_array().unwrap();
        assert_eq!(list.len(), 1, "{driver}: the pod is the one job (its QoS levels are not): {jobs}");
        assert_eq!(list[0]["cgroup"], dirs[2].as_str(), "{driver}: {jobs}");
        assert_eq!(list[0]["pod_uid"], UID, "{driver}: {jobs}");
        let metrics = http_get(port, "/metrics").unwrap();
        assert!(metrics.contains(&format!("pod_uid=\"{UID}\"")), "{driver}: no series of the pod: {metrics}");
        let pid = guard.0[0].id() as i32;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM).unwrap();
        assert!(guard.0[0].wait().unwrap().success(), "{driver}: the daemon's exit");
        let mut said = String::new();
        std::io::Read::read_to_string(&mut { stderr }, &mut said).unwrap();
        assert!(said.contains(&format!("Kubernetes pods under the {driver} cgroup driver")), "{said}");
        drop(guard);
        drop(cgroups);
    }
}

/// Cgroups made parent first, removed child first (even when a test fails).
struct Nested(Vec<Cgroup>);

impl Drop for Nested {
    fn drop(&mut self) {
        while let Some(c) = self.0.pop() {
            drop(c);
        }
    }
}

/// Which cgroups are GPU jobs: a process with a CUDA context NVML lists;
/// one holding an NVIDIA device open only with `--device-holders`, or when
/// there is no NVML to ask; GPU infrastructure (here a program named as
/// DCGM's host engine, holding the device) never; a cgroup touching no GPU
/// never. The device is a character device named like NVIDIA's.
#[test]
fn gpu_jobs_are_cuda_contexts_and_device_holders_where_asked() {
    require_root();
    let device = DeviceNode::new(&format!("/dev/nvidia-stall-it-{}", std::process::id()));
    let root = Cgroup::new("gpu-jobs");
    let cgroups: Vec<Cgroup> = ["cuda", "holder", "infra", "idle"].iter().map(|n| root.child(n)).collect();
    let mut guard = Killer(vec![]);
    // Python asleep, the device open on its stdin (except the idle one);
    // the infrastructure one runs as `nv-hostengine` (its argv[0]).
    for (cg, (name, holds)) in
        cgroups.iter().zip([(None, true), (None, true), (Some("nv-hostengine"), true), (None, false)])
    {
        let mut cmd = Command::new(python());
        cmd.args(["-c", "import time; time.sleep(120)"]);
        if let Some(name) = name {
            std::os::unix::process::CommandExt::arg0(&mut cmd, name);
        }
        cmd.stdin(if holds { Stdio::from(std::fs::File::open(&device.0).unwrap()) } else { Stdio::null() });
        let child = cmd.spawn().unwrap();
        cg.add(child.id());
        guard.0.push(child);
    }
    let cuda_pid = guard.0[0].id();
    let gpu = ScriptedGpu::new(&serde_json::json!(null));
    let pid_file = gpu.path("cuda.pid");
    std::fs::write(&pid_file, cuda_pid.to_string()).unwrap();
    gpu.update(&one_gpu(&pid_file, 90, 600_000));

    // The jobs a daemon watches, once the one it must watch is there.
    let jobs_of = |mut daemon: Command, must: &str| -> Vec<String> {
        let port = free_port();
        let mut d = Killer(vec![daemon
            .args(["--cgroup-root", &root.name, "--interval", "1"])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .stderr(Stdio::null())
            .spawn()
            .unwrap()]);
        let want = format!("{}/{must}", root.name);
        let mut names = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline && !names.contains(&want) {
            let jobs: serde_json::Value =
                http_get(port, "/jobs").and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default();
            names = jobs["jobs"]
                .as_array()
                .map(|a| a.iter().filter_map(|j| j["cgroup"].as_str().map(String::from)).collect())
                .unwrap_or_default();
            sleep(Duration::from_millis(200));
        }
        // Two more intervals: nothing else joins later.
        sleep(Duration::from_secs(2));
        let jobs: serde_json::Value = serde_json::from_str(&http_get(port, "/jobs").unwrap()).unwrap();
        d.0[0].kill().unwrap();
        let mut names: Vec<String> = jobs["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|j| j["cgroup"].as_str().and_then(|c| c.rsplit('/').next()).map(String::from))
            .collect();
        names.sort();
        names
    };
    let mut plain = gpu.command("daemon");
    assert_eq!(jobs_of(plain, "cuda"), ["cuda"], "NVML's processes only");
    plain = gpu.command("daemon");
    plain.arg("--device-holders");
    assert_eq!(jobs_of(plain, "holder"), ["cuda", "holder"], "with --device-holders");
    let mut no_nvml = Command::new(stall_bin());
    no_nvml.args(["daemon", "--gpu", "off"]);
    assert_eq!(
        jobs_of(no_nvml, "holder"),
        ["cuda", "holder"],
        "without NVML, holding the device is the sign"
    );
}

/// A character device node, removed when dropped.
struct DeviceNode(std::path::PathBuf);

impl DeviceNode {
    /// `path`, a character device with /dev/null's numbers (reads nothing).
    fn new(path: &str) -> Self {
        let path = std::path::PathBuf::from(path);
        let _ = std::fs::remove_file(&path);
        nix::sys::stat::mknod(
            &path,
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
            nix::sys::stat::makedev(1, 3),
        )
        .unwrap_or_else(|e| panic!("mknod {}: {e}", path.display()));
        Self(path)
    }
}

impl Drop for DeviceNode {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Without GPU data, on a node whose only cgroup runs no GPU process: the
/// daemon watches nothing, says once why (and in `/jobs`, as a count), and
/// attaches neither the syscall nor the scheduler hooks — nothing taxes
/// the node for nobody. A job that holds a GPU device comes: the hooks go
/// on; it goes: they come off.
#[test]
fn a_daemon_watching_nothing_says_why_and_attaches_nothing() {
    require_root();
    let root = Cgroup::new("nothing");
    let idle = root.child("idle");
    let mut guard = Killer(vec![]);
    let sleeper = Command::new(python()).args(["-c", "import time; time.sleep(120)"]).spawn().unwrap();
    idle.add(sleeper.id());
    guard.0.push(sleeper);
    let port = free_port();
    let log = tempfile_path("daemon-stderr");
    let daemon = Command::new(stall_bin())
        .args(["daemon", "--cgroup-root", &root.name, "--interval", "1", "--gpu", "off"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    guard.0.push(daemon);
    let jobs = || -> serde_json::Value {
        http_get(port, "/jobs").and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default()
    };
    wait_until("the daemon's /jobs to count the idle cgroup", Duration::from_secs(20), || {
        jobs()["not_watched"]["cgroups"] == 1
    });
    let j = jobs();
    assert_eq!(j["jobs"].as_array().map(Vec::len), Some(0), "{j}");
    assert!(j["not_watched"]["why"].as_str().is_some_and(|w| w.contains("--all-jobs")), "{j}");
    // Two more intervals, still nothing attached.
    sleep(Duration::from_secs(2));
    let t = http_get(port, "/metrics").unwrap();
    assert_eq!(metric(&t, "stall_syscall_hooks_attached", &[]), Some(0.0), "{t}");
    assert_eq!(metric(&t, "stall_scheduler_hooks_attached", &[]), Some(0.0), "{t}");

    // A job holding a GPU device (without NVML, the sign of a GPU job).
    let device = DeviceNode::new(&format!("/dev/nvidia-stall-it-w{}", std::process::id()));
    let gpu_job = root.child("gpu");
    let holder = Command::new(python())
        .args(["-c", "import time; time.sleep(120)"])
        .stdin(Stdio::from(std::fs::File::open(&device.0).unwrap()))
        .spawn()
        .unwrap();
    gpu_job.add(holder.id());
    guard.0.push(holder);
    // /metrics and /jobs are published one after the other at the end of
    // an interval (and attaching takes seconds under emulation): both.
    wait_until("the GPU job watched and the hooks attached", Duration::from_secs(30), || {
        let t = http_get(port, "/metrics").unwrap_or_default();
        metric(&t, "stall_syscall_hooks_attached", &[]) == Some(1.0)
            && jobs()["jobs"].as_array().map(Vec::len) == Some(1)
    });
    // It ends, its cgroup goes: nothing watched, nothing attached.
    let mut holder = guard.0.pop().unwrap();
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert!(gpu_job.remove(), "the GPU job's cgroup");
    wait_until("the hooks detached with no job left", Duration::from_secs(30), || {
        let t = http_get(port, "/metrics").unwrap_or_default();
        metric(&t, "stall_syscall_hooks_attached", &[]) == Some(0.0)
            && metric(&t, "stall_scheduler_hooks_attached", &[]) == Some(0.0)
    });
    let said = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = said.lines().filter(|l| l.contains("not watching")).collect();
    assert_eq!(lines.len(), 1, "said once: {said}");
    assert!(lines[0].contains("1 cgroup under the roots") && lines[0].contains("--all-jobs"), "{said}");
}
