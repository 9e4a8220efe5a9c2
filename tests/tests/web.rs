//! The daemon's HTTP surface, with a real client (curl) and a real TLS
//! setup (a test CA made here with openssl): passwords and TLS guard every
//! endpoint, details stay out unless asked for, and a capture asked for
//! over HTTP escalates the job and returns its timeline while scrapes stay
//! fast.
use std::{
    io::{Read, Write},
    net::TcpStream,
    path::Path,
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use serde_json::Value;
use stall_tests::cgroup::Cgroup;
use stall_tests::gpu::ScriptedGpu;
use stall_tests::http::{free_port, http_get};
use stall_tests::kernel::{schedstat_tolerance, thread_schedstat};
use stall_tests::procs::{spawn_announcing, wait_until, Killer};
use stall_tests::scratch::Scratch;
use stall_tests::stall::{require_root, stall_bin};
use stall_tests::workload::python;

/// A test CA and a certificate for 127.0.0.1 signed by it, in `dir`.
fn make_certificates(dir: &Scratch) {
    // openssl's own configuration, so that no system one is needed (the
    // VM images have none).
    let config = dir.path("openssl.cnf");
    std::fs::write(
        &config,
        "[req]\ndistinguished_name = dn\nx509_extensions = ca\n[dn]\n[ca]\nbasicConstraints = critical,CA:TRUE\nkeyUsage = critical,keyCertSign,cRLSign\nsubjectKeyIdentifier = hash\n",
    )
    .unwrap();
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .env("OPENSSL_CONF", &config)
            .current_dir(&dir.0)
            .output()
            .expect("openssl");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=stall test CA",
    ]);
    run(&[
        "req",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=stall test server",
    ]);
    std::fs::write(dir.path("san.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n").unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "san.ext",
    ]);
}

/// curl's answer: (HTTP status, 0 if none; body).
fn curl(args: &[&str]) -> (u32, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "30", "-o", "-", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// A job in `cg` running `script` (Python), which prints its pid first.
fn job(cg: &Cgroup, script: &str) -> (Child, u32) {
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(r#"echo $$ > "$0" && exec "$@""#).arg(cg.dir.join("cgroup.procs")).args([
        python(),
        "-u",
        "-c",
        script,
    ]);
    spawn_announcing(&mut cmd)
}

/// Reads `path` over and over, with a pause: a job that moves.
fn reader(path: &Path) -> String {
    format!(
        "import os, time\nprint('PID', os.getpid(), flush=True)\nwhile True:\n    with open({:?}, 'rb') as f:\n        f.read()\n    time.sleep(0.2)\n",
        path.display().to_string()
    )
}

fn start_daemon(root: &Cgroup, port: u16, extra: &[&str]) -> Child {
    Command::new(stall_bin())
        .args(["daemon", "--cgroup-root", &root.name, "--all-jobs", "--interval", "1", "--gpu", "off"])
        .args(["--listen", &format!("127.0.0.1:{port}"), "--node-name", "node-a"])
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn tls_and_passwords_guard_every_endpoint() {
    require_root();
    let s = Scratch::new("web-tls");
    make_certificates(&s);
    let hash = bcrypt::hash("s3cret", 6).unwrap();
    std::fs::write(
        s.path("web.yml"),
        format!(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\nbasic_auth_users:\n  prometheus: '{hash}'\n"
        ),
    )
    .unwrap();
    let data = s.file("data.bin", 1_000_000);
    let root = Cgroup::new("web-tls");
    let cg = root.child("job1");
    let port = free_port();
    let health = std::iter::repeat_with(free_port).find(|p| *p != port).unwrap();
    let web = s.path("web.yml");
    let health_listen = format!("127.0.0.1:{health}");
    let mut guard = Killer(vec![start_daemon(
        &root,
        port,
        &["--web-config", web.to_str().unwrap(), "--expose-details", "--health-listen", &health_listen],
    )]);
    let (job, _) = job(&cg, &reader(&data));
    guard.0.push(job);

    let ca = s.path("ca.crt");
    let ca = ca.to_str().unwrap();
    let url = |path: &str| format!("https://127.0.0.1:{port}{path}");
    wait_until("the daemon over TLS", Duration::from_secs(30), || {
        curl(&["--cacert", ca, &url("/healthz")]).0 == 200
    });
    // The probes' port: /healthz in plain HTTP without a password, and
    // nothing else.
    let probe = |path: &str| curl(&[&format!("http://127.0.0.1:{health}{path}")]);
    assert_eq!(probe("/healthz"), (200, "ok\n".to_string()));
    for path in ["/metrics", "/jobs", "/jobs/0"] {
        assert_eq!(probe(path).0, 404, "{path} on the health port");
    }

    // No password, a wrong one, another user: 401 on every endpoint.
    for path in ["/metrics", "/jobs"] {
        assert_eq!(curl(&["--cacert", ca, &url(path)]).0, 401, "{path} without a password");
        assert_eq!(curl(&["--cacert", ca, "-u", "prometheus:wrong", &url(path)]).0, 401, "{path}");
        assert_eq!(curl(&["--cacert", ca, "-u", "someone:s3cret", &url(path)]).0, 401, "{path}");
    }
    let (code, _) = curl(&["--cacert", ca, "-X", "POST", &url("/jobs/0/capture?seconds=1")]);
    assert_eq!(code, 401, "capture without a password");
    // An authenticated scrape gets the metrics.
    let (code, metrics) = curl(&["--cacert", ca, "-u", "prometheus:s3cret", &url("/metrics")]);
    assert_eq!(code, 200);
    assert!(metrics.contains("stall_agent_jobs"), "{metrics}");
    // Plain HTTP to the TLS port gets no HTTP answer at all.
    let mut plain = TcpStream::connect(("127.0.0.1", port)).unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(plain, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer);
    assert!(!String::from_utf8_lossy(&answer).contains("HTTP/1.1"), "plain HTTP was answered: {answer:?}");
    assert_eq!(curl(&[&format!("http://127.0.0.1:{port}/metrics")]).0, 0, "curl over plain HTTP");
    // A client that does not trust the CA does not connect.
    assert_eq!(curl(&["-u", "prometheus:s3cret", &url("/metrics")]).0, 0);

    // Authenticated, with --expose-details: the job's files by path.
    let data_path = data.display().to_string();
    wait_until("the job's file in /jobs", Duration::from_secs(30), || {
        let (code, body) = curl(&["--cacert", ca, "-u", "prometheus:s3cret", &url("/jobs")]);
        code == 200 && body.contains(&data_path)
    });
    let (_, body) = curl(&["--cacert", ca, "-u", "prometheus:s3cret", &url("/jobs")]);
    let jobs: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(jobs["node"], "node-a");
    assert_eq!(jobs["schema"], 3);
    assert!(jobs["time"].as_f64().unwrap() > 1.7e9);
}

#[test]
fn details_stay_out_without_the_flag() {
    require_root();
    let s = Scratch::new("web-plain");
    let data = s.file("secret-dataset.bin", 1_000_000);
    let root = Cgroup::new("web-plain");
    let cg = root.child("job1");
    let port = free_port();
    let mut daemon = start_daemon(&root, port, &[]);
    let stderr = daemon.stderr.take().unwrap();
    let mut guard = Killer(vec![daemon]);
    let (job, pid) = job(&cg, &reader(&data));
    guard.0.push(job);
    wait_until("the daemon's /healthz", Duration::from_secs(30), || http_get(port, "/healthz").is_some());

    // The job with a verdict and its reads counted, but no path, no
    // command line, no stack.
    let jobs = || -> Value {
        serde_json::from_str(&http_get(port, "/jobs").unwrap_or_default()).unwrap_or_default()
    };
    let ours = |v: &Value| {
        v["jobs"].as_array().and_then(|a| a.iter().find(|j| j["cgroup"] == cg.name.as_str()).cloned())
    };
    wait_until("the job's reads in /jobs", Duration::from_secs(30), || {
        ours(&jobs()).is_some_and(|j| {
            j["processes"].as_array().is_some_and(|p| p.iter().any(|p| p["read_bytes"].as_u64() > Some(0)))
        })
    });
    let list = jobs();
    let text = list.to_string();
    assert!(!text.contains("secret-dataset"), "a file path in /jobs: {text}");
    let j = ours(&list).unwrap();
    let me = j["processes"].as_array().unwrap().iter().find(|p| p["pid"] == pid).unwrap().clone();
    assert!(me["cmdline"].is_null(), "{me}");
    assert!(me["files"].as_array().unwrap().iter().all(|f| f["path"].is_null()), "{me}");
    // The reader sleeps between its reads: no cause holds it, and the
    // verdict says where its time goes.
    assert_eq!(j["verdict"]["kind"], "unknown", "{j}");
    let asleep_pct = j["verdict"]["summary"]
        .as_str()
        .and_then(|s| s.split("(sleep ").nth(1)?.split('%').next()?.parse::<u32>().ok());
    assert!(asleep_pct.is_some_and(|p| p >= 90), "{j}");
    let id = j["id"].as_str().unwrap().to_string();

    // The job by its id: the same, with its verdict history.
    let one: Value = serde_json::from_str(&http_get(port, &format!("/jobs/{id}")).unwrap()).unwrap();
    assert_eq!(one["id"], id.as_str());
    let history = one["history"].as_array().unwrap();
    assert!(!history.is_empty() && history[0]["kind"].is_string(), "{one}");
    assert!(!one.to_string().contains("secret-dataset"));
    // An unknown id is a 404; a capture is refused without the flag.
    let (code, _) = curl(&[&format!("http://127.0.0.1:{port}/jobs/0123456789abcdef")]);
    assert_eq!(code, 404);
    let (code, body) = curl(&["-X", "POST", &format!("http://127.0.0.1:{port}/jobs/{id}/capture?seconds=1")]);
    assert_eq!(code, 403, "{body}");

    // Each change of verdict is one JSON line on stderr, without paths.
    drop(guard);
    let mut log = String::new();
    let mut stderr = stderr;
    let _ = stderr.read_to_string(&mut log);
    let change = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["msg"] == "verdict changed" && v["job"] == id.as_str())
        .unwrap_or_else(|| panic!("no verdict change logged:\n{log}"));
    assert!(change["kind"].is_string() && change["time"].as_f64().unwrap() > 1.7e9, "{change}");
    assert!(!log.contains("secret-dataset"), "{log}");
}

/// A job behind a busy scripted GPU, in the cheap tier; a capture asked
/// for over HTTP escalates it (the syscall hooks attach) and returns its
/// timeline: the job's main thread spins 100 ms and sleeps 100 ms in turn,
/// and the trace's slices say so. Scrapes meanwhile stay fast.
#[test]
fn a_capture_escalates_the_job_and_returns_its_timeline() {
    require_root();
    let s = Scratch::new("web-capture");
    let data = s.file("data.bin", 200_000);
    let gpu = ScriptedGpu::new(&serde_json::json!(null));
    let pid_file = gpu.path("job.pid");
    gpu.update(&serde_json::json!({"devices": [{"name": "Scripted H200", "power_limit_mw": 700_000,
        "phases": [{"util_pct": 100, "power_mw": 650_000,
                    "processes": [{"pid_file": pid_file, "used_mem_bytes": 1_000_000_000u64}]}]}]}));
    let root = Cgroup::new("web-capture");
    let cg = root.child("job1");
    let port = free_port();
    let mut daemon = gpu.command("daemon");
    daemon
        .args(["--cgroup-root", &root.name, "--interval", "1", "--expose-details"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .stderr(Stdio::inherit());
    let mut guard = Killer(vec![daemon.spawn().unwrap()]);
    let script = format!(
        "import os, time\nprint('PID', os.getpid(), flush=True)\nwhile True:\n    end = time.perf_counter() + 0.1\n    while time.perf_counter() < end:\n        pass\n    time.sleep(0.1)\n    with open({:?}, 'rb') as f:\n        f.read()\n",
        data.display().to_string()
    );
    let (job, pid) = job(&cg, &script);
    guard.0.push(job);
    std::fs::write(&pid_file, pid.to_string()).unwrap();
    let jobs = || -> Value {
        serde_json::from_str(&http_get(port, "/jobs").unwrap_or_default()).unwrap_or_default()
    };
    let mut id = String::new();
    wait_until("the job watched, in the cheap tier", Duration::from_secs(30), || {
        let list = jobs();
        let Some(j) =
            list["jobs"].as_array().and_then(|a| a.iter().find(|j| j["cgroup"] == cg.name.as_str()).cloned())
        else {
            return false;
        };
        id = j["id"].as_str().unwrap_or_default().to_string();
        j["tier"] == "cheap" && j["verdict"]["kind"] == "gpu-busy"
    });
    assert!(http_get(port, "/metrics").unwrap().contains("stall_syscall_hooks_attached 0"));

    // Scrape every 20 ms while the capture runs.
    let stop = Arc::new(AtomicBool::new(false));
    let scraper = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut took = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                assert!(http_get(port, "/metrics").is_some(), "a scrape failed during the capture");
                took.push(t.elapsed());
                std::thread::sleep(Duration::from_millis(20));
            }
            took
        })
    };
    let out = s.path("capture.json.gz");
    // The kernel's totals for the main thread around the capture: what it
    // ran (and waited for a CPU) in the window is within what moved here.
    let before = thread_schedstat(pid, pid);
    let asked = Instant::now();
    let curl = Command::new("curl")
        .args(["-sS", "--max-time", "60", "-X", "POST", "-w", "%{http_code}", "-o"])
        .arg(&out)
        .arg(format!("http://127.0.0.1:{port}/jobs/{id}/capture?seconds=4"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&curl.stdout), "200", "{}", String::from_utf8_lossy(&curl.stderr));
    let around = asked.elapsed().as_secs_f64();
    let after = thread_schedstat(pid, pid);
    assert!(around >= 4.0, "answered before the window passed");
    stop.store(true, Ordering::Relaxed);
    let mut took = scraper.join().unwrap();
    took.sort();
    let p99 = took[(took.len() * 99 / 100).min(took.len() - 1)];
    eprintln!("capture: {} scrapes, p99 {:?}, max {:?}", took.len(), p99, took.last().unwrap());
    assert!(took.len() >= 50, "{} scrapes", took.len());
    assert!(p99 < Duration::from_millis(100), "scrape p99 {p99:?} while the job was escalated");

    // The trace: the main thread spinning (on CPU, or preempted: a loaded
    // machine, an emulated one above all, runs it less than its wall time;
    // or its virtual CPU stolen by the host) about half the time, asleep
    // the other half; its time on CPU and in the runqueue as the kernel
    // counted them; and the file's reads.
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&out).unwrap()).read_to_string(&mut text).unwrap();
    let trace: Value = serde_json::from_str(&text).unwrap();
    let events = trace["traceEvents"].as_array().or(trace.as_array()).expect("trace events");
    let of_main = |state: &str| -> f64 {
        events
            .iter()
            .filter(|e| e["ph"] == "X" && e["tid"] == pid && e["pid"] == pid && e["name"] == state)
            .map(|e| e["dur"].as_f64().unwrap())
            .sum::<f64>()
            / 1e6
    };
    let (on, sleep, runqueue, io) = (of_main("on-cpu"), of_main("sleep"), of_main("runqueue"), of_main("io"));
    let stolen = of_main("stolen");
    let total = on + sleep + runqueue + io + stolen;
    let (ran, waited) = (after.0 - before.0, after.1 - before.1);
    let slices = format!(
        "on CPU {on:.2} s, runqueue {runqueue:.2} s, asleep {sleep:.2} s, io {io:.2} s, stolen {stolen:.2} s of {total:.2} s; \
         the kernel's counters moved by {ran:.2} s on CPU and {waited:.2} s in the runqueue over the {around:.2} s around it"
    );
    eprintln!("capture: the main thread's {slices}");
    assert!(total > 2.5, "the main thread's slices span {total:.2} s of a 4 s capture: {slices}");
    assert!((0.3..=0.8).contains(&((on + runqueue + stolen) / total)), "spinning: {slices}");
    assert!((0.3..=0.7).contains(&(sleep / total)), "asleep: {slices}");
    // A slice at each end of the window may reach past it by up to a spin.
    let (tol, edge) = (schedstat_tolerance(), 0.25);
    let outside = (around - total).max(0.0);
    assert!(on <= ran * (1.0 + tol) + edge && on >= (ran - outside) * (1.0 - tol) - edge, "on CPU: {slices}");
    assert!(runqueue <= waited * (1.0 + tol) + edge, "runqueue: {slices}");
    let file = data.display().to_string();
    assert!(
        events
            .iter()
            .any(|e| e["cat"] == "reads" && e["pid"] == pid && e["args"]["files"].get(&file).is_some()),
        "no read of {file} in the trace"
    );
    // The job went back to the cheap tier's rules afterwards (the GPU is busy).
    wait_until("the syscall hooks detached after the capture", Duration::from_secs(20), || {
        http_get(port, "/metrics").is_some_and(|m| m.contains("stall_syscall_hooks_attached 0"))
    });
}
