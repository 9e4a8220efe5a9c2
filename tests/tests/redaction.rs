//! What the daemon serves and logs without `--expose-details` holds nothing
//! a job's processes named. A job (tests/workloads/leak_job.py) in a
//! cgroup reads a data file, waits on a lock another program holds, runs a
//! child, uploads to a local server and writes into a pipe another program
//! reads; each of those names — the data path, its command line, its
//! thread's name, the lock file, the lock's holder, the pipe's reader, the
//! child's command line, the server's address — carries a marker. The
//! daemon watches it on a scripted idle GPU, so the job goes through every
//! tier (cheap, escalated to the full capture, cooldown); every byte of
//! `/jobs`, `/jobs/{id}`, `/metrics`, `/healthz` (on both ports), a refused capture and the
//! daemon's own log is scanned for the markers: none may appear. With
//! `--expose-details` every one appears (so the scan can fail).
//!
//! Needs root.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use stall_tests::cgroup::Cgroup;
use stall_tests::gpu::ScriptedGpu;
use stall_tests::http::{free_port, http_get};
use stall_tests::procs::{wait_until, Killer};
use stall_tests::scratch::Scratch;
use stall_tests::stall::require_root;
use stall_tests::workload::python;

fn leak_job_py() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/leak_job.py")
}

/// The whole response to a POST on the loopback (status line, headers,
/// body), or what the connection gave.
fn http_post(port: u16, path: &str) -> String {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else { return String::new() };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    let mut bytes = Vec::new();
    let _ = s.read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A helper outside the job, started with `args`, once it printed its
/// first line (or at once, for one that prints nothing).
fn outside(args: &[&str], stdin: Stdio, wait_line: bool) -> Child {
    let mut child = Command::new(python())
        .arg(leak_job_py())
        .args(args)
        .stdin(stdin)
        .stdout(Stdio::piped())
        .spawn()
        .expect("a helper of the leak job");
    if wait_line {
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    }
    child
}

/// What one run under the daemon served and logged, every byte, and the
/// markers its job's names carry; and whether the job was seen in the
/// full capture.
struct Served {
    texts: Vec<String>,
    markers: Vec<String>,
    escalated: bool,
}

fn watched(expose: bool) -> Served {
    require_root();
    let s = Scratch::new(if expose { "redaction-shown" } else { "redaction" });
    let m = format!("zq{}{}k", std::process::id() % 100_000, u8::from(expose));
    let dir = s.path("d");
    std::fs::create_dir_all(dir.join(format!("{m}data"))).unwrap();
    std::fs::write(dir.join(format!("{m}data/shard.bin")), vec![7u8; 4 << 20]).unwrap();
    let (dir_arg, port) = (dir.display().to_string(), free_port());
    let common = ["--marker", m.as_str(), "--dir", dir_arg.as_str()];
    let mut helpers = Killer(Vec::new());
    let port_arg = port.to_string();
    helpers.0.push(outside(&[&["serve"][..], &common, &["--port", &port_arg]].concat(), Stdio::null(), true));
    let mut reader = outside(&[&["read"][..], &common].concat(), Stdio::piped(), false);
    let into_reader = Stdio::from(reader.stdin.take().unwrap());
    helpers.0.push(reader);

    let gpu = ScriptedGpu::new(&serde_json::json!(null));
    let pid_file = gpu.path("job.pid");
    gpu.update(&serde_json::json!({"devices": [{"name": "Scripted H200", "power_limit_mw": 700_000,
        "phases": [{"util_pct": 0, "power_mw": 60_000,
                    "processes": [{"pid_file": pid_file, "used_mem_bytes": 1_000_000_000u64}]}]}]}));
    // Its own: the two tests run side by side.
    let root = Cgroup::new(if expose { "redaction-shown" } else { "redaction" });
    let job_cg = root.child("job");
    let daemon_log = s.path("daemon.log");
    let http = free_port();
    let health = std::iter::repeat_with(free_port).find(|p| *p != http).unwrap();
    let mut daemon = gpu.command("daemon");
    daemon
        .args(["--cgroup-root", &root.name, "--interval", "1", "--escalate-idle", "2", "--cooldown", "4"])
        .args(["--listen", &format!("127.0.0.1:{http}"), "--health-listen", &format!("127.0.0.1:{health}")])
        .stderr(std::fs::File::create(&daemon_log).unwrap());
    if expose {
        daemon.arg("--expose-details");
    }
    let mut guard = Killer(vec![daemon.spawn().unwrap()]);
    wait_until("the daemon's /metrics", Duration::from_secs(30), || http_get(http, "/metrics").is_some());

    // The lock is taken just before the job starts, and held 8 s.
    helpers.0.push(outside(&[&["hold"][..], &common, &["--phase-s", "8"]].concat(), Stdio::null(), true));
    let tag = format!("{m}cmd");
    let mut job = Command::new("sh");
    job.arg("-c")
        .arg(r#"echo $$ > "$0" && exec "$@""#)
        .arg(job_cg.dir.join("cgroup.procs"))
        .arg(python())
        .arg(leak_job_py())
        .args(["job", "--port", &port_arg, "--phase-s", "6", "--tag", &tag])
        .args(common)
        .stdout(into_reader);
    let mut job = job.spawn().expect("the leak job");
    std::fs::write(&pid_file, job.id().to_string()).unwrap();

    let mut texts = Vec::new();
    let mut escalated = false;
    let start = Instant::now();
    while job.try_wait().unwrap().is_none() {
        assert!(start.elapsed() < Duration::from_secs(120), "the leak job did not end");
        let jobs = http_get(http, "/jobs").unwrap_or_default();
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&jobs) {
            for j in v["jobs"].as_array().into_iter().flatten() {
                escalated |= j["tier"] == "full";
                let id = j["id"].as_str().unwrap_or_default();
                texts.push(http_get(http, &format!("/jobs/{id}")).unwrap_or_default());
                if !expose {
                    texts.push(http_post(http, &format!("/jobs/{id}/capture?seconds=1")));
                }
            }
        }
        texts.push(jobs);
        texts.push(http_get(http, "/metrics").unwrap_or_default());
        texts.push(http_get(http, "/healthz").unwrap_or_default());
        texts.push(http_get(health, "/healthz").unwrap_or_default());
        std::thread::sleep(Duration::from_millis(700));
    }
    assert!(job.wait().unwrap().success(), "the leak job failed");
    // The daemon ends cleanly on SIGTERM; then its whole log is read.
    let d = &mut guard.0[0];
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(d.id() as i32), nix::sys::signal::Signal::SIGTERM)
        .unwrap();
    let _ = d.wait();
    texts.push(std::fs::read_to_string(&daemon_log).unwrap());
    let markers = ["data", "cmd", "thr", "lock", "hold", "pipe", "child"]
        .iter()
        .map(|k| format!("{m}{k}"))
        .chain([format!("127.0.0.1:{port}")])
        .collect();
    Served { texts, markers, escalated }
}

#[test]
fn without_details_no_name_of_the_job_leaves_the_daemon() {
    let served = watched(false);
    assert!(served.escalated, "the job never reached the full capture");
    let mut found = Vec::new();
    for text in &served.texts {
        for m in served.markers.iter().filter(|m| text.contains(m.as_str())) {
            let at = text.find(m.as_str()).unwrap();
            let from = text[..at].char_indices().rev().nth(120).map_or(0, |(i, _)| i);
            let to = (at + m.len() + 120).min(text.len());
            found.push(format!("{m}: …{}…", text.get(from..to).unwrap_or(&text[from..])));
        }
    }
    assert!(found.is_empty(), "details left the daemon without --expose-details:\n{}", found.join("\n"));
    // The scan saw the job's verdicts and processes, not empty answers.
    let jobs = served.texts.iter().filter(|t| t.contains("\"processes\"")).count();
    assert!(jobs > 5, "too few answers with the job's processes: {jobs}");
}

#[test]
fn with_details_every_name_is_served() {
    let served = watched(true);
    let all = served.texts.join("\n");
    let missing: Vec<&String> = served.markers.iter().filter(|m| !all.contains(m.as_str())).collect();
    assert!(missing.is_empty(), "--expose-details did not show {missing:?}");
}
