//! `stall daemon` scraped by a real Prometheus (Debian's `prometheus`,
//! installed by `cargo xtask test`): a job in a cgroup reads a file of known
//! size; Prometheus's query API must show the job's bytes within 1 % and a
//! verdict series; promtool must accept the exposition; SIGTERM must leave no
//! program behind. (Its own test binary: cargo runs binaries one at a time.)
use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::Path,
    process::{Child, Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use stall_tests::*;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.1 200") {
        return None;
    }
    // Decode a chunked body (axum streams it so).
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        let mut out = String::new();
        let mut rest = body;
        while let Some((size, tail)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).ok()?;
            if n == 0 {
                break;
            }
            out.push_str(tail.get(..n)?);
            rest = tail.get(n + 2..)?;
        }
        return Some(out);
    }
    Some(body.to_string())
}

fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A scalar from Prometheus's instant query API, if the query has a result.
fn query(port: u16, q: &str) -> Option<f64> {
    let body = http_get(port, &format!("/api/v1/query?query={}", encode(q)))?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let r = v["data"]["result"].as_array()?.first()?.clone();
    r["value"][1].as_str()?.parse().ok()
}

/// Ends the processes a test started (before its cgroups are removed).
struct Killer(Vec<Child>);

impl Drop for Killer {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn prometheus_scrapes_the_daemon() {
    require_root();
    let prometheus = Path::new("/usr/bin/prometheus");
    assert!(prometheus.exists(), "Debian's prometheus is needed (cargo xtask test installs it)");
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

    let prom_port = free_port();
    let config = s.path("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: stall\n    static_configs:\n      - targets: ['127.0.0.1:{daemon_port}']\n"
        ),
    )
    .unwrap();
    let prom = Command::new(prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", s.path("tsdb").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    guard.0.push(prom);
    wait_until("prometheus", Duration::from_secs(30), || http_get(prom_port, "/-/ready").is_some());

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
    assert!(jobs.as_array().unwrap().iter().any(|j| j["job"] == rel.as_str()), "{jobs}");

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
    assert!(String::from_utf8_lossy(&out.stdout).contains("SUCCESS: 4 rules found"));
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
