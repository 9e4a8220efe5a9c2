//! Faults: stall killed mid-run, two stalls on one job, a target that exits
//! while stall attaches, a PID reused during a run, a fork storm and a
//! process of 1000 threads. Only this test binary's own stalls are counted
//! (by their PIDs): other stalls may run on the machine meanwhile.
use std::{
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use serde_json::Value;
use stall_tests::procs::{spawn_announcing, wait_until};
use stall_tests::scratch::Scratch;
use stall_tests::stall::{bpf_programs_of, require_root, stall, stall_bin, Run, STALL_PROGRAMS};
use stall_tests::workload::{jobs_py, python, truth};

const T: Duration = Duration::from_secs(120);

fn bpftool() -> &'static str {
    for p in ["/usr/sbin/bpftool", "/sbin/bpftool", "/usr/bin/bpftool"] {
        if Path::new(p).exists() {
            return p;
        }
    }
    panic!("bpftool is missing: `cargo xtask test` installs it (Debian package bpftool)");
}

/// Is program `id` loaded, as bpftool sees it?
fn loaded(id: u32) -> bool {
    Command::new(bpftool())
        .args(["prog", "show", "id", &id.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

/// Waits until process `pid` holds all of stall's programs; returns their ids.
fn programs_loaded_by(pid: u32) -> Vec<u32> {
    let mut ids = Vec::new();
    wait_until("stall's programs", T, || {
        ids = bpf_programs_of(pid);
        ids.len() >= STALL_PROGRAMS
    });
    ids
}

/// JSON Lines written so far to `path`.
fn lines_of(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// `stall attach --pid PID -q --json FILE --interval 0.2` in the background.
fn attach(pid: u32, json: &Path) -> Child {
    require_root();
    Command::new(stall_bin())
        .args(["attach", "-q", "--gpu", "off", "--interval", "0.2", "--pid", &pid.to_string(), "--json"])
        .arg(json)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn stall")
}

/// Waits for a child, killing it after `T`; its status code and stderr.
fn wait_for(mut child: Child) -> (i32, String) {
    let deadline = Instant::now() + T;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            return (st.code().unwrap_or_else(|| panic!("killed by a signal: {st}; {err}")), err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("did not exit within {T:?}");
        }
        sleep(Duration::from_millis(20));
    }
}

fn summary_of(json: &Path) -> Run {
    Run { status: 0, stdout: String::new(), stderr: String::new(), records: lines_of(json) }
}

#[test]
fn kill_9_mid_run_leaves_no_program_behind() {
    require_root();
    let s = Scratch::new("fault-kill9");
    let data = s.file("data.bin", 1 << 20);
    // A busy job (reads in a loop), so the kill lands while events flow.
    let mut stall = Command::new(stall_bin())
        .args(["run", "-q", "--gpu", "off", "--", python()])
        .arg(jobs_py())
        .args(["reader-loop", data.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(stall.stdout.as_mut().unwrap()).read_line(&mut first).unwrap();
    let job: i32 = first.trim().parse().unwrap();
    let ids = programs_loaded_by(stall.id());
    assert!(ids.iter().all(|&id| loaded(id)), "bpftool sees stall's programs {ids:?}");
    sleep(Duration::from_millis(500));
    stall.kill().unwrap(); // SIGKILL
    stall.wait().unwrap();
    let mut left: Vec<u32> = ids.clone();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !left.is_empty() && Instant::now() < deadline {
        sleep(Duration::from_millis(50));
        left.retain(|&id| loaded(id));
    }
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(job), nix::sys::signal::Signal::SIGKILL);
    assert!(left.is_empty(), "still loaded after kill -9 of stall: {left:?} (of {ids:?})");
}

#[test]
fn two_stalls_on_one_job_both_get_exact_bytes() {
    let s = Scratch::new("fault-two");
    let size = 2_345_679;
    let data = s.file("data.bin", size);
    let truth_path = s.path("truth.json");
    // It forks its reader once both stalls have attached, however long
    // their start-up takes (trampolines under emulation: many seconds).
    let go = s.path("go");
    let (mut job, pid) = spawn_announcing(
        Command::new(python())
            .arg(jobs_py())
            .args(["idle-then-read", data.to_str().unwrap(), go.to_str().unwrap()])
            .env("TRUTH", &truth_path),
    );
    let jsons = [s.path("a.json"), s.path("b.json")];
    let stalls: Vec<Child> = jsons.iter().map(|j| attach(pid, j)).collect();
    for j in &jsons {
        wait_until("both stalls attached (an interval written)", T, || !lines_of(j).is_empty());
    }
    assert!(job.try_wait().unwrap().is_none(), "the job ended before both stalls were attached");
    std::fs::write(&go, "").unwrap();
    for st in stalls {
        let (code, err) = wait_for(st);
        assert_eq!(code, 0, "{err}");
    }
    job.wait().unwrap();
    let reader = truth(&truth_path)["reader"].as_u64().unwrap();
    for j in &jsons {
        let run = summary_of(j);
        assert_eq!(run.file(reader, &data)["read_bytes"], size as u64, "{}", j.display());
        assert_eq!(run.summary()["lost_events"], 0, "{}", j.display());
    }
}

#[test]
fn a_target_exiting_while_stall_attaches_ends_cleanly() {
    let s = Scratch::new("fault-brief");
    let mut outcomes = Vec::new();
    for (i, life) in ["0", "0.02", "0.05", "0.1", "0.2", "0.3", "0.5", "0.8", "1.2"].iter().enumerate() {
        let target = Command::new(python()).arg(jobs_py()).args(["brief", life]).spawn().unwrap();
        let pid = target.id();
        // Reap it as soon as it exits, as its parent would.
        let reaper = std::thread::spawn(move || {
            let mut t = target;
            t.wait()
        });
        let json = s.path(&format!("{i}.json"));
        let (code, err) = wait_for(attach(pid, &json));
        reaper.join().unwrap().unwrap();
        match code {
            4 => assert_eq!(err.lines().collect::<Vec<_>>(), [format!("stall: no process with PID {pid}")]),
            0 => {
                let run = summary_of(&json);
                assert!(run.records.iter().any(|r| r["type"] == "summary"), "life {life}: no summary: {err}");
            }
            other => panic!("life {life}s: exit {other}: {err}"),
        }
        outcomes.push((*life, code));
    }
    eprintln!("target lifetime → stall's exit: {outcomes:?}");
}

#[test]
fn a_reused_pid_is_not_the_old_process() {
    let s = Scratch::new("fault-reuse");
    let (a_size, b_size) = (1_111_111, 777_777);
    let a = s.file("a.bin", a_size);
    let b = s.file("b.bin", b_size);
    let mut job = Command::new(python())
        .arg(jobs_py())
        .args(["fork-on-cue", a.to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(job.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let pid: u32 = line.trim().parse().unwrap();
    let json = s.path("out.json");
    let stall = attach(pid, &json);
    wait_until("stall attached", T, || !lines_of(&json).is_empty());
    let mut stdin = job.stdin.take().unwrap();
    writeln!(stdin, "fork").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    let child: u32 = line.trim().parse().unwrap();
    // Outside the job, a new process takes the child's PID and reads b.
    let truth_path = s.path("taken.json");
    let st = Command::new(python())
        .arg(jobs_py())
        .args(["take-pid", &child.to_string(), b.to_str().unwrap()])
        .env("TRUTH", &truth_path)
        .status()
        .unwrap();
    assert!(st.success());
    let taken = truth(&truth_path);
    assert_eq!(taken["pid"], child, "could not reuse PID {child}: {taken}");
    assert_eq!(taken["bytes"], b_size as u64);
    // Let stall see an interval with the newcomer alive, then end the job.
    sleep(Duration::from_millis(600));
    writeln!(stdin, "exit").unwrap();
    drop(stdin);
    job.wait().unwrap();
    let (code, err) = wait_for(stall);
    assert_eq!(code, 0, "{err}");
    let run = summary_of(&json);
    let with_pid: Vec<&Value> = run.processes().iter().filter(|p| p["pid"] == child).collect();
    assert_eq!(with_pid.len(), 1, "one process {child}: {with_pid:?}");
    assert_eq!(run.file(u64::from(child), &a)["read_bytes"], a_size as u64);
    assert!(run.readers_of(&b).is_empty(), "the newcomer's reads were counted: {:?}", run.readers_of(&b));
    assert_eq!(run.summary()["lost_events"], 0);
}

/// `stall run -q -- jobs.py WORKLOAD DATA N` on a 4 KiB data file: the
/// run, its truth and the data file's path (removed with the scratch by
/// then: the run names it).
fn run_jobs_py(tag: &str, workload: &str, n: usize) -> (Run, Value, PathBuf) {
    let s = Scratch::new(tag);
    let data = s.file("data.bin", 4096);
    let truth_path = s.path("truth.json");
    let run = stall(
        &[
            "run",
            "-q",
            "--",
            python(),
            jobs_py().to_str().unwrap(),
            workload,
            data.to_str().unwrap(),
            &n.to_string(),
        ],
        &[("TRUTH", &truth_path)],
        T,
    );
    assert_eq!(run.status, 0, "{}", run.stderr);
    (run, truth(&truth_path), data)
}

#[test]
fn a_fork_storm_is_traced_without_losses() {
    let n = 400;
    let (run, t, data) = run_jobs_py("fault-storm", "fork-storm", n);
    assert_eq!(t["bad"], serde_json::json!([]), "{t}");
    let children = t["children"].as_object().unwrap();
    assert_eq!(children.len(), n);
    assert_eq!(run.summary()["lost_events"], 0, "{}", run.summary()["lost_by_cause"]);
    for (pid, k) in children {
        let f = run.file(pid.parse().unwrap(), &data);
        assert_eq!(f["read_bytes"], *k, "child {pid}: {f}");
        assert_eq!(f["read_calls"], 1, "child {pid}: {f}");
    }
}

#[test]
fn a_process_of_1000_threads_is_traced_without_losses() {
    let n = 1000;
    let (run, t, data) = run_jobs_py("fault-threads", "threads", n);
    let threads = t["threads"].as_object().unwrap();
    assert_eq!(threads.len(), n);
    assert_eq!(run.summary()["lost_events"], 0, "{}", run.summary()["lost_by_cause"]);
    let pid = t["pid"].as_u64().unwrap();
    let mut sum = 0;
    let mut off = Vec::new();
    for (tid, want) in threads {
        let th = run.thread(tid.parse().unwrap());
        // Everything the thread read (its own accounting), glibc's reads included.
        let extra = th["read_bytes"].as_i64().unwrap() - want["read"].as_i64().unwrap();
        if extra != 0 {
            // The files that could hold the extra: the process's shared ones
            // and this thread's own /proc entry.
            let p = run.process(t["pid"].as_u64().unwrap());
            let files: Vec<&Value> = p["files"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|f| {
                    let path = f["path"].as_str().unwrap_or("");
                    !path.contains("/task/") || path.contains(&format!("/{tid}/"))
                })
                .collect();
            off.push((
                extra,
                format!(
                    "thread {tid}: {th}; truth {want}; process ipc_read_bytes {}, files {files:?}",
                    p["ipc_read_bytes"]
                ),
            ));
        }
        sum += want["data"].as_u64().unwrap();
    }
    // Every thread exact. (A stray byte on one thread now and then was
    // glibc's own read of /proc/sys/vm/overcommit_memory, made once per
    // process by whichever thread first trims its malloc arena, after that
    // thread had taken its count: the job now never trims.)
    assert!(off.is_empty(), "{off:#?}");
    assert_eq!(run.file(pid, &data)["read_bytes"], sum);
    let traced = run.process(pid)["threads"].as_array().unwrap().len();
    assert!(traced > n, "{traced} threads traced");
}
