//! Jobs of shapes no rule was written for, judged by what the trainer
//! waits on and who ends its waits (tests/workloads/waits.py): loader
//! threads instead of worker processes, a thread holding the GIL, workers
//! that sleep, stdout into a slow pipe, an upload to a slow peer, a lock
//! another program holds, an evaluation subprocess (through a shell, too),
//! an upload by a subprocess, a deadlock. Each workload writes
//! what it did; the verdict must name the other party and the bytes.
//!
//! Needs root.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use serde_json::Value;
use stall_tests::procs::{spawn_announcing, stop, wait_until};
use stall_tests::scratch::{disk_scratch, Scratch};
use stall_tests::stall::{stall, stall_with_stdout, Attached, Background, Run};
use stall_tests::workload::{python, secs, shards, truth};

fn waits_py() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/waits.py")
}

fn job(args: &[&str]) -> Vec<String> {
    let mut v = vec![python().to_string(), waits_py().display().to_string()];
    v.extend(args.iter().map(|s| s.to_string()));
    v
}

/// `stall run -q -- <job>`; the run and the job's truth.
fn run(args: &[&str], truth: &Path, timeout: Duration) -> (Run, Value) {
    let cmd = job(args);
    let mut argv = vec!["run", "-q", "--"];
    argv.extend(cmd.iter().map(String::as_str));
    argv.extend(["--truth", truth.to_str().unwrap()]);
    let run = stall(&argv, &[], timeout);
    assert_eq!(run.status, 0, "stall run failed:\n{}", run.stderr);
    (run, truth_of(truth))
}

fn truth_of(path: &Path) -> Value {
    wait_until("the workload's truth", Duration::from_secs(30), || path.exists());
    truth(path)
}

fn verdict(run: &Run) -> (&str, &str) {
    let v = &run.summary()["verdict"];
    (v["kind"].as_str().unwrap(), v["summary"].as_str().unwrap())
}

/// A helper outside the job (a log shipper, an object store, a lock
/// holder), killed by its PID when the test ends.
struct Outside(Child);

impl Drop for Outside {
    fn drop(&mut self) {
        stop(&mut self.0, nix::sys::signal::Signal::SIGKILL);
    }
}

/// Four loader threads of the trainer read 8 shards of 8 MB from storage
/// throttled to 16 MB/s and hand it 1 MiB batches: input-io-bound, the
/// threads named as its input with their bytes, no worker process at all.
#[test]
fn loader_threads_reading_storage_are_the_input() {
    let s = disk_scratch("loader-threads");
    let cache = s.path("shards");
    shards(&cache, 8, 8, 16);
    let t_path = s.path("truth.json");
    let (run, t) = run(
        &["loader-threads", "--dir", cache.to_str().unwrap(), "--files", "8", "--mbps", "16"],
        &t_path,
        Duration::from_secs(120),
    );
    let (kind, line) = verdict(&run);
    eprintln!("loader threads: {kind}: {line}");
    assert!(t["throttle"].as_str().unwrap().starts_with("throttled"), "{t}");
    let want: u64 = t["files"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(want, 64_000_000, "8 shards of 8 MB");
    // Every byte, per file, in the trainer's own file list.
    let trainer = t["trainer"].as_u64().unwrap();
    for (path, bytes) in t["files"].as_object().unwrap() {
        assert_eq!(run.file(trainer, Path::new(path))["read_bytes"], *bytes, "{path}");
    }
    let threads: Vec<String> = run.process(trainer)["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| format!("{} {} {}", t["tid"], t["comm"], t["read_bytes"]))
        .collect();
    eprintln!("threads: {threads:?}");
    assert_eq!(kind, "input-io-bound", "{line}");
    assert!(line.contains("4 loader threads of the trainer read 64.0 MB at"), "{line}");
}

/// A pure-Python metrics thread of the trainer keeps the GIL; the main
/// thread, which logs a line per step, waits for it: trainer-host-bound
/// naming that thread — never a hang while its log moves.
#[test]
fn a_thread_holding_the_gil_is_named_and_no_hang() {
    let s = Scratch::new("gil");
    let t_path = s.path("truth.json");
    let log = s.path("train.log");
    let (run, t) =
        run(&["gil", "--log", log.to_str().unwrap(), "--seconds", "4"], &t_path, Duration::from_secs(90));
    let (kind, line) = verdict(&run);
    eprintln!("gil: {kind}: {line}");
    assert!(t["steps"].as_u64().unwrap() > 10, "{t}");
    for r in &run.records {
        assert_ne!(r["verdict"]["kind"], "hang", "a job logging every step is never hung: {r}");
    }
    assert_eq!(kind, "trainer-host-bound", "{line}");
    let metrics = t["metrics"].as_u64().unwrap();
    // "waiting for thread …", or "waits 80% of the time for thread …"
    // where the waits it ended were long enough to say.
    assert!(line.contains(&format!("for thread {metrics} (metrics) of the trainer")), "{line}");
}

/// Two forked workers whose `__getitem__` sleeps 100 ms feed the trainer:
/// input-wait-bound, their sleep named.
#[test]
fn workers_that_sleep_are_named_asleep() {
    let s = Scratch::new("sleepy");
    let t_path = s.path("truth.json");
    let (run, t) =
        run(&["sleepy-workers", "--items", "30", "--nap", "0.1"], &t_path, Duration::from_secs(90));
    let (kind, line) = verdict(&run);
    eprintln!("sleepy workers: {kind}: {line}");
    assert_eq!(t["batches"], 60, "{t}");
    assert_eq!(kind, "input-wait-bound", "{line}");
    assert!(line.contains("2 workers spend") && line.contains("of their time asleep"), "{line}");
}

/// The trainer prints 64 KiB per step into a pipe that a reader outside
/// the job drains at 1.6 MB/s: output-io-bound, blocked writing stdout,
/// the reader named with the pipe's rate.
#[test]
fn stdout_into_a_slow_pipe_names_its_reader() {
    let s = Scratch::new("pipe");
    let r_truth = s.path("reader.json");
    let mut reader = Command::new(python())
        .args([
            waits_py().to_str().unwrap(),
            "slow-reader",
            "--kbps",
            "1600",
            "--truth",
            r_truth.to_str().unwrap(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("the slow reader");
    let into_reader = Stdio::from(reader.stdin.take().unwrap());
    let reader = Outside(reader);
    let r = truth_of(&r_truth)["reader"].as_u64().unwrap();
    assert_eq!(u64::from(reader.0.id()), r);
    let t_path = s.path("truth.json");
    let cmd = job(&["pipe-writer", "--steps", "64", "--truth", t_path.to_str().unwrap()]);
    let mut args = vec!["run", "-q", "--"];
    args.extend(cmd.iter().map(String::as_str));
    let run = stall_with_stdout(&args, &[], Duration::from_secs(90), Some(into_reader));
    assert_eq!(run.status, 0, "{}", run.stderr);
    let t = truth_of(&t_path);
    let (kind, line) = verdict(&run);
    eprintln!("slow pipe: {kind}: {line}; truth {t}");
    let trainer = t["trainer"].as_u64().unwrap();
    let stdout = &run.process(trainer)["stdio_write_bytes"];
    assert_eq!(stdout, &t["bytes"], "bytes to stdout");
    let send = secs(&run.thread(trainer)["off_cpu_by_reason"]["send"]);
    let wall = secs(&t["secs"]);
    // 4.2 MB at 1.6 MB/s is 2.6 s; the trainer's own work is 0.06 s.
    assert!(send >= wall * 0.7 && send <= wall * 1.02, "blocked sending {send:.2}s of {wall:.2}s");
    assert_eq!(kind, "output-io-bound", "{line}");
    assert!(line.contains(&format!("writing stdout, a pipe read by pid {r} (")), "{line}");
}

/// A server outside the job, started with `args` (its mode and rate),
/// and the port its truth names.
fn outside_server(s: &Scratch, args: &[&str]) -> (Outside, String) {
    let (server, truth) = outside(s, args);
    (server, truth["port"].as_u64().unwrap().to_string())
}

/// A program outside the job, started with `args`, once it has written
/// its truth (a server: once it listens), and that truth.
fn outside(s: &Scratch, args: &[&str]) -> (Outside, Value) {
    let truth_path = s.path(&format!("{}.json", args[0]));
    let child = Command::new(python())
        .arg(waits_py())
        .args(args)
        .args(["--truth", truth_path.to_str().unwrap()])
        .stdout(Stdio::null())
        .spawn()
        .expect("the program outside the job");
    let program = Outside(child);
    (program, truth_of(&truth_path))
}

/// What the trainer's main thread was last seen waiting on, the process
/// at its other end (checked to be `pid`), and that process's CPU share
/// and storage bytes over the span stall sampled it.
fn other_end(run: &Run, trainer: u64, pid: u64) -> (f64, u64, f64) {
    let on = &run.thread(trainer)["waits_on"];
    let party = &on["others"][0];
    assert_eq!(party["pid"], pid, "the other end of {on}");
    let a = &party["activity"];
    let span = a["span_ns"].as_u64().unwrap_or_else(|| panic!("no activity in {on}"));
    assert!(span >= 1_000_000_000, "sampled over {span} ns: {on}");
    (
        a["cpu_ns"].as_u64().unwrap() as f64 / span as f64,
        a["storage_read_bytes"].as_u64().unwrap(),
        span as f64 / 1e9,
    )
}

/// The verdict's step past the job: the peer's pid and state.
fn peer_step(run: &Run) -> (u64, String, f64) {
    let path = run.summary()["verdict"]["path"].as_array().unwrap().clone();
    let peer = path.iter().find(|p| p["who"] == "peer").unwrap_or_else(|| panic!("no peer step in {path:?}"));
    (
        peer["pids"][0].as_u64().unwrap(),
        peer["state"].as_str().unwrap().to_string(),
        peer["share"].as_f64().unwrap_or(0.0),
    )
}

/// The trainer asking a feature server outside the job over `to`
/// (`--unix PATH` or `--port N`) with the client's `extra` flags: the run,
/// its truth, and the verdict's kind and line.
fn ask_features(s: &Scratch, to: &[&str], extra: &[&str]) -> (Run, Value, String, String) {
    let t_path = s.path("truth.json");
    let log = s.path("train.log");
    let mut args = vec!["feature-client"];
    args.extend(to.iter().chain(extra));
    args.extend(["--log", log.to_str().unwrap()]);
    let (run, t) = run(&args, &t_path, Duration::from_secs(120));
    let (kind, line) = verdict(&run);
    let (kind, line) = (kind.to_string(), line.to_string());
    eprintln!("feature server {to:?}: {kind}: {line}; truth {t}");
    (run, t, kind, line)
}

/// A feature server outside the job computes each 16 KiB answer for 40 ms
/// in Python; the trainer asks it for each step's features over a Unix
/// socket and waits. The server is the input, on CPU: input-cpu-bound,
/// naming it, with its CPU share as /proc counts it.
#[test]
fn a_feature_server_on_cpu_behind_a_unix_socket_is_the_input() {
    let s = Scratch::new("featsrv-unix");
    let sock = s.path("features.sock");
    let sock = sock.to_str().unwrap();
    let (_server, st) = outside(&s, &["feature-server", "--unix", sock, "--answer-ms", "40"]);
    let server = st["server"].as_u64().unwrap();
    let (run, t, kind, line) = ask_features(&s, &["--unix", sock], &["--steps", "120"]);
    let trainer = t["trainer"].as_u64().unwrap();
    let (cpu, storage, _) = other_end(&run, trainer, server);
    // 40 ms of Python per answer, a millisecond of the trainer's between.
    assert!((0.7..=1.05).contains(&cpu), "the server on CPU {cpu:.2}");
    assert_eq!(storage, 0, "the server reads no files");
    assert_eq!(kind, "input-cpu-bound", "{line}");
    assert!(line.contains(&format!("reading a socket to pid {server} (")), "{line}");
    assert!(line.contains(&format!("pid {server} (python3) at its other end was on CPU")), "{line}");
    let (pid, state, share) = peer_step(&run);
    assert_eq!((pid, state.as_str()), (server, "on-cpu"));
    assert!((share - cpu.min(1.0)).abs() < 0.02, "{share} against {cpu}");
}

/// The same server on 127.0.0.1: the network is not what is slow, the
/// server's CPU is.
#[test]
fn a_feature_server_on_cpu_on_localhost_is_no_network_input() {
    let s = Scratch::new("featsrv-tcp");
    let (_server, st) = outside(&s, &["feature-server", "--answer-ms", "40"]);
    let (server, port) = (st["server"].as_u64().unwrap(), st["port"].as_u64().unwrap().to_string());
    let (run, t, kind, line) = ask_features(&s, &["--port", &port], &["--steps", "120"]);
    let trainer = t["trainer"].as_u64().unwrap();
    let (cpu, _, _) = other_end(&run, trainer, server);
    assert!(cpu >= 0.7, "the server on CPU {cpu:.2}");
    assert_eq!(kind, "input-cpu-bound", "{line}");
    assert!(line.contains(&format!("reading the socket to 127.0.0.1:{port} of pid {server} (")), "{line}");
    assert_eq!(peer_step(&run).0, server);
}

/// The server reads each 512 KiB answer from cold files on storage
/// throttled to 8 MB/s: input-io-bound, naming it and what it read, which
/// is what it sent the trainer, at the throttle's rate.
#[test]
fn a_feature_server_reading_cold_files_is_named_with_its_storage_reads() {
    let s = disk_scratch("featsrv-cold");
    let cache = s.path("shards");
    shards(&cache, 8, 8, 8);
    let sock = s.path("features.sock");
    let sock = sock.to_str().unwrap();
    let server_args = ["feature-server", "--unix", sock, "--dir", cache.to_str().unwrap(), "--files", "8"];
    let (_server, st) = outside(&s, &[&server_args[..], &["--mbps", "8", "--answer-kib", "512"]].concat());
    let server = st["server"].as_u64().unwrap();
    let (run, t, kind, line) = ask_features(&s, &["--unix", sock], &["--answer-kib", "512", "--steps", "70"]);
    let trainer = t["trainer"].as_u64().unwrap();
    let (cpu, storage, span) = other_end(&run, trainer, server);
    let sent = t["bytes"].as_u64().unwrap();
    assert_eq!(sent, 70 * 512 * 1024);
    // Over the span sampled (part of the run), the server's storage reads
    // are its answers' bytes at the throttle's pace.
    let rate = storage as f64 / span / 1e6;
    assert!((4.0..=9.2).contains(&rate), "{storage} bytes from storage in {span:.1}s: {rate:.1} MB/s");
    assert!(storage as f64 <= sent as f64 * 1.15, "{storage} of {sent}");
    assert!(cpu < 0.5, "the server on CPU {cpu:.2}");
    assert_eq!(kind, "input-io-bound", "{line}");
    assert!(line.contains(&format!("pid {server} (python3) at its other end read ")), "{line}");
    assert!(line.contains("from storage in its last"), "{line}");
    assert_eq!(peer_step(&run).1, "io");
}

/// A preprocessor outside the job writes 64 KiB records into a named pipe
/// after 30 ms of Python each; the trainer reads the FIFO: the writer on
/// CPU is the input, not the pipe.
#[test]
fn a_fifo_writer_on_cpu_is_the_input() {
    let s = Scratch::new("fifo");
    let fifo = s.path("records.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let fifo = fifo.to_str().unwrap();
    let p_truth = s.path("produce.json");
    // Started first, it blocks opening the FIFO until the trainer opens it.
    let producer = Outside(
        Command::new(python())
            .arg(waits_py())
            .args(["produce", "--fifo", fifo, "--records", "150", "--record-ms", "30"])
            .args(["--truth", p_truth.to_str().unwrap()])
            .spawn()
            .unwrap(),
    );
    let t_path = s.path("truth.json");
    let log = s.path("train.log");
    let (run, t) =
        run(&["consume", "--fifo", fifo, "--log", log.to_str().unwrap()], &t_path, Duration::from_secs(120));
    let (kind, line) = verdict(&run);
    eprintln!("fifo: {kind}: {line}; truth {t}");
    let writer = u64::from(producer.0.id());
    let trainer = t["trainer"].as_u64().unwrap();
    assert_eq!(t["bytes"].as_u64().unwrap(), 150 * 64 * 1024);
    let (cpu, _, _) = other_end(&run, trainer, writer);
    assert!(cpu >= 0.7, "the writer on CPU {cpu:.2}");
    assert_eq!(kind, "input-cpu-bound", "{line}");
    assert!(line.contains(&format!("a pipe written by pid {writer} (")), "{line}");
    assert_eq!(peer_step(&run).0, writer);
}

/// The main thread joins a thread that PUTs a 12 MiB checkpoint to an
/// object store outside the job taking 4 MB/s: the trainer's own waits are
/// futex ones, and following them leads to the thread's sends, so the job
/// is output-io-bound, naming the thread and the peer.
#[test]
fn a_checkpoint_uploaded_by_a_thread_the_trainer_joins_is_output_bound() {
    let s = Scratch::new("upload-thread");
    let (_server, port) = outside_server(&s, &["slow-server", "--kbps", "4000"]);
    let t_path = s.path("truth.json");
    let (run, t) = run(&["upload-thread", "--port", &port, "--mb", "12"], &t_path, Duration::from_secs(120));
    let (kind, line) = verdict(&run);
    eprintln!("upload thread: {kind}: {line}; truth {t}");
    let uploader = t["uploader"].as_u64().unwrap();
    let send = secs(&run.thread(uploader)["off_cpu_by_reason"]["send"]);
    assert!(send >= 0.6 * secs(&t["upload_s"]), "the uploader blocked sending {send:.2}s: {t}");
    assert_eq!(kind, "output-io-bound", "{line}");
    let want = format!("thread {uploader} (");
    assert!(line.contains(&want) && line.contains("of the trainer, which is blocked"), "{line}");
    assert!(line.contains(&format!("writing the socket to 127.0.0.1:{port}")), "{line}");
}

/// No workers: the trainer reads its samples from a socket that a source
/// outside the job, on this host, feeds at 2 MB/s, sleeping between
/// chunks. Its main thread waits in `poll` (its receives), woken from
/// outside the job: the source is named, and seen idle it is its pace the
/// trainer waits for (input-wait-bound), not the network; the bytes
/// received are the source's.
#[test]
fn a_trainer_streaming_from_a_slow_source_is_input_bound_naming_it() {
    let s = Scratch::new("stream");
    let (_source, st) = outside(&s, &["slow-source", "--kbps", "2000", "--chunks", "120"]);
    let (source, port) = (st["source"].as_u64().unwrap(), st["port"].as_u64().unwrap());
    let t_path = s.path("truth.json");
    let (run, t) = run(&["stream-reader", "--port", &port.to_string()], &t_path, Duration::from_secs(120));
    let (kind, line) = verdict(&run);
    eprintln!("stream: {kind}: {line}; truth {t}");
    let trainer = t["trainer"].as_u64().unwrap();
    let peer = format!("127.0.0.1:{port}");
    let received: u64 = run.process(trainer)["sockets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["peer"] == peer.as_str())
        .map(|p| p["read_bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(received, t["bytes"].as_u64().unwrap(), "bytes received from {peer}");
    let (cpu, storage, _) = other_end(&run, trainer, source);
    assert!(cpu < 0.3 && storage == 0, "the source sleeps: on CPU {cpu:.2}, {storage} bytes from storage");
    assert_eq!(kind, "input-wait-bound", "{line}");
    assert!(line.contains(&format!("reading the socket to {peer} of pid {source} (")), "{line}");
    assert!(line.contains("it sends at its own pace"), "{line}");
}

/// Every 4th step the trainer PUTs 8 MiB to an object store outside the
/// job that takes 4 MB/s: output-io-bound naming the peer; never a hang,
/// though each upload is one call that blocks for seconds.
#[test]
fn an_upload_to_a_slow_peer_names_it_and_is_no_hang() {
    let s = Scratch::new("upload");
    let (_server, port) = outside_server(&s, &["slow-server", "--kbps", "4000"]);
    let t_path = s.path("truth.json");
    let log = s.path("train.log");
    let (run, t) = run(
        &[
            "upload",
            "--port",
            &port,
            "--log",
            log.to_str().unwrap(),
            "--mb",
            "8",
            "--steps",
            "8",
            "--every",
            "4",
        ],
        &t_path,
        Duration::from_secs(120),
    );
    let (kind, line) = verdict(&run);
    eprintln!("upload: {kind}: {line}; truth {t}");
    for r in &run.records {
        assert_ne!(r["verdict"]["kind"], "hang", "an upload moves data: {r}");
    }
    let trainer = t["trainer"].as_u64().unwrap();
    let peer = format!("127.0.0.1:{port}");
    let sent: u64 = run.process(trainer)["sockets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["peer"] == peer.as_str())
        .map(|p| p["write_bytes"].as_u64().unwrap())
        .sum();
    // The body and each request's headers.
    let body = t["bytes"].as_u64().unwrap();
    assert!(sent >= body && sent <= body + 4096, "sent {sent} to {peer}, body {body}");
    assert_eq!(kind, "output-io-bound", "{line}");
    assert!(line.contains(&format!("writing the socket to {peer}")), "{line}");
}

/// Every 4th step the trainer uploads 16 MiB with a subprocess it waits
/// for (a CLI uploader), to a store outside the job that takes 4 MB/s: the
/// wait is followed into the child, output-io-bound, naming the child and
/// the peer; never a hang.
#[test]
fn a_checkpoint_uploaded_by_a_subprocess_is_output_bound_naming_it() {
    // 16 MiB each: a slow VM spends seconds starting Python in the child,
    // which the upload must outlast to be the child's largest state.
    checkpoint_uploaded_by_a_subprocess("upload-child", 1, 16);
}

/// The same upload in two parts, sent by two threads of the subprocess
/// that its main thread joins (a multipart upload, as boto3's transfer
/// manager does): the wait is followed through the child's main thread to
/// those threads.
#[test]
fn a_checkpoint_a_subprocess_uploads_from_threads_is_output_bound() {
    // The store takes 4 MB/s per connection: twice the bytes for two.
    checkpoint_uploaded_by_a_subprocess("upload-parts", 2, 32);
}

fn checkpoint_uploaded_by_a_subprocess(scratch: &str, parts: u32, mb: u32) {
    let s = Scratch::new(scratch);
    let (_server, port) = outside_server(&s, &["slow-server", "--kbps", "4000"]);
    let t_path = s.path("truth.json");
    let log = s.path("train.log");
    let (parts, mb) = (parts.to_string(), mb.to_string());
    let args = ["upload-child", "--port", &port, "--log", log.to_str().unwrap(), "--mb", &mb, "--steps", "8"];
    let args: Vec<&str> = args.into_iter().chain(["--parts", parts.as_str()]).collect();
    let (run, t) = run(&args, &t_path, Duration::from_secs(120));
    let (kind, line) = verdict(&run);
    eprintln!("upload child: {kind}: {line}; truth {t}");
    for r in &run.records {
        assert_ne!(r["verdict"]["kind"], "hang", "an upload moves data: {r}");
    }
    let children: Vec<u64> = t["children"].as_array().unwrap().iter().map(|c| c.as_u64().unwrap()).collect();
    assert_eq!(children.len(), 2, "{t}");
    let peer = format!("127.0.0.1:{port}");
    let sent: u64 = children
        .iter()
        .flat_map(|c| run.process(*c)["sockets"].as_array().unwrap().clone())
        .filter(|p| p["peer"] == peer.as_str())
        .map(|p| p["write_bytes"].as_u64().unwrap())
        .sum();
    let body = t["bytes"].as_u64().unwrap();
    let heads = 8192 * parts.parse::<u64>().unwrap();
    assert!(sent >= body && sent <= body + heads, "the children sent {sent} to {peer}, bodies {body}");
    assert_eq!(kind, "output-io-bound", "{line}");
    assert!(children.iter().any(|c| line.contains(&format!("pid {c} ("))), "{line}");
    assert!(line.contains(&format!("writing the socket to {peer}")), "{line}");
    let last = run.summary()["verdict"]["path"].as_array().unwrap().last().cloned().unwrap();
    assert_eq!((last["who"].as_str(), last["state"].as_str()), (Some("children"), Some("send")), "{last}");
}

/// The trainer waits in `flock` on a lock another program holds (a build
/// lock): a hang, naming the call, the lock file and its holder — attached
/// to, and the same under `stall run` once the operator kills the job,
/// the final report saying what the live view last saw.
#[test]
fn a_lock_held_by_another_program_is_named_with_its_holder() {
    let s = Scratch::new("flock");
    let lock = s.path("ext.lock");
    let h_truth = s.path("holder.json");
    let (holder, holder_pid) = spawn_announcing(
        Command::new(python())
            .args([waits_py().to_str().unwrap(), "hold-lock", "--lock", lock.to_str().unwrap()])
            .args(["--truth", h_truth.to_str().unwrap()]),
    );
    let _holder = Outside(holder);
    let log = s.path("train.log");
    let (job_child, pid) = spawn_announcing(
        Command::new(python())
            .args([waits_py().to_str().unwrap(), "flock", "--lock", lock.to_str().unwrap()])
            .args(["--log", log.to_str().unwrap()]),
    );
    let _job = Outside(job_child);
    let pid = pid.to_string();
    let mut stall = Attached::start(&["--pid", &pid, "--duration", "7", "--interval", "0.5"]);
    stall.wait_tracing();
    let run = stall.finish(Duration::from_secs(60));
    assert_eq!(run.status, 0, "{}", run.stderr);
    let (kind, line) = verdict(&run);
    eprintln!("flock, attached: {kind}: {line}");
    assert_eq!(kind, "hang", "{line}");
    assert!(line.contains("in flock for "), "{line}");
    let held = format!("the lock on {}, held by pid {holder_pid} (", lock.display());
    assert!(line.contains(&held), "{line}");
    drop(_job);
    // The same job under `stall run`, killed once the live view says hang.
    let cmd = job(&["flock", "--lock", lock.to_str().unwrap(), "--log", log.to_str().unwrap()]);
    let mut argv = vec!["run", "-q", "--interval", "0.5", "--"];
    argv.extend(cmd.iter().map(String::as_str));
    let bg = Background::start(&argv);
    let json = bg.json().to_path_buf();
    wait_until("a live hang", Duration::from_secs(60), || {
        std::fs::read_to_string(&json).is_ok_and(|t| t.contains(r#""kind":"hang""#))
    });
    let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", bg.pid())).unwrap();
    let job_pid: i32 = children.split_whitespace().next().expect("the job").parse().unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(job_pid), nix::sys::signal::Signal::SIGTERM).unwrap();
    let run = bg.finish(Duration::from_secs(60));
    let (kind, line) = verdict(&run);
    eprintln!("flock, run and killed: {kind}: {line}");
    assert_eq!(kind, "hang", "{line}");
    assert!(line.contains(&held) && line.contains("as last seen live, before the job ended"), "{line}");
}

/// Every 4th step the trainer runs a 1 s CPU-bound evaluation as a
/// subprocess and waits for it: trainer-host-bound, naming the children.
#[test]
fn an_evaluation_subprocess_the_trainer_waits_for_is_named() {
    let s = Scratch::new("eval");
    let t_path = s.path("truth.json");
    let (run, t) = run(
        &["eval-child", "--steps", "12", "--every", "4", "--step-ms", "50", "--eval-s", "1"],
        &t_path,
        Duration::from_secs(120),
    );
    let (kind, line) = verdict(&run);
    eprintln!("eval child: {kind}: {line}; truth {t}");
    assert_eq!(t["children"].as_array().unwrap().len(), 3, "{t}");
    assert_eq!(kind, "trainer-host-bound", "{line}");
    let named = t["children"].as_array().unwrap().iter().any(|c| line.contains(&format!("pid {c} (")));
    assert!(named, "{line}");
}

/// The same evaluations started through `/bin/sh -c` (as `os.system` or a
/// launcher script runs them): each shell only waits for its evaluation.
/// The trainer is still the trainer, and its wait is followed through the
/// shells to the evaluations, on CPU.
#[test]
fn an_evaluation_run_through_a_shell_is_followed_through_it() {
    let s = Scratch::new("eval-shell");
    let t_path = s.path("truth.json");
    let (run, t) = run(
        &["eval-child", "--steps", "12", "--every", "4", "--step-ms", "50", "--eval-s", "1", "--shell"],
        &t_path,
        Duration::from_secs(120),
    );
    let (kind, line) = verdict(&run);
    eprintln!("eval through a shell: {kind}: {line}; truth {t}");
    let shells: Vec<u64> = t["children"].as_array().unwrap().iter().map(|c| c.as_u64().unwrap()).collect();
    assert_eq!(shells.len(), 3, "{t}");
    let trainer = t["trainer"].as_u64().unwrap();
    assert_eq!(run.process(trainer)["role"], "trainer", "{line}");
    assert_eq!(kind, "trainer-host-bound", "{line}");
    let path = run.summary()["verdict"]["path"].as_array().unwrap().clone();
    let steps: Vec<(&str, &str)> =
        path.iter().map(|p| (p["who"].as_str().unwrap(), p["state"].as_str().unwrap())).collect();
    assert_eq!(
        steps,
        [("trainer main thread", "other"), ("children", "other"), ("children", "on-cpu")],
        "{path:?}"
    );
    let pids = |step: &Value| -> Vec<u64> {
        step["pids"].as_array().unwrap().iter().map(|p| p.as_u64().unwrap()).collect()
    };
    // The steady-state window starts at an interval's end, which may fall
    // after the first evaluation ended but before its shell did: that
    // shell is in the window, its child is not. Each level is counted as
    // the window holds it, and is at least the two later rounds.
    let (via, evaluations) = (pids(&path[1]), pids(&path[2]));
    assert!(
        via.len() >= 2 && via.iter().all(|p| shells.contains(p)),
        "{via:?} are not the shells {shells:?}"
    );
    assert!(evaluations.len() >= 2, "{path:?}");
    let first = format!("its {} children, one after another (the longest pid ", via.len());
    assert!(line.contains(&first), "{line}");
    assert!(shells.iter().any(|c| line.contains(&format!("pid {c} (/bin/sh -c"))), "{line}");
    let second = format!("), which wait for their {} children, one after another", evaluations.len());
    assert!(line.contains(&second), "{line}");
    // The evaluations are the shells' children.
    for pid in evaluations {
        let ppid = run.process(pid)["ppid"].as_u64().unwrap();
        assert!(shells.contains(&ppid), "pid {pid}'s parent {ppid} is no shell of {shells:?}");
    }
}

/// A thread that sleeps 2 ms at a time is woken by a timer interrupt,
/// which lands on whatever runs on that CPU (here, often one of two
/// spinning processes of the job): its wakers are the kernel's
/// interrupts, never the task the interrupt landed on.
#[test]
fn a_wakeup_in_an_interrupt_is_the_kernels_not_the_interrupted_tasks() {
    let s = Scratch::new("timer");
    let t_path = s.path("truth.json");
    let (run, t) =
        run(&["timer-sleeper", "--sleeps", "500", "--spinners", "2"], &t_path, Duration::from_secs(90));
    let sleeper = run.thread(t["sleeper"].as_u64().unwrap());
    let wakers = sleeper["woken_by"].as_array().unwrap();
    eprintln!("timer wakeups: {wakers:?}");
    let spinners: Vec<&Value> = t["spinners"].as_array().unwrap().iter().collect();
    for w in wakers {
        assert!(!spinners.contains(&&w["pid"]), "a spinner named as waker of a timer's wakeup: {w}");
    }
    let by_kernel: u64 = wakers.iter().filter(|w| w["pid"] == 0).map(|w| w["count"].as_u64().unwrap()).sum();
    assert!(wakers.iter().filter(|w| w["pid"] == 0).all(|w| w["comm"] == "[interrupt]"), "{wakers:?}");
    assert!(
        // Each sleep ends in one (the job's start-up adds a few more).
        by_kernel >= 450,
        "{by_kernel} wakeups by interrupts of 500 sleeps: {wakers:?}"
    );
}

/// Two threads of the job deadlock over two locks while the main thread
/// joins one of them: hung, in the final report too, however the job then
/// ends — its own exit (a watchdog thread's `os._exit`) or `kill -9` from
/// outside — and nobody named for the waits that ended so: a signal or
/// its process's death hands a thread nothing it waited for.
#[test]
fn a_deadlock_ended_by_its_exit_or_a_kill_is_hung_and_its_waits_woken_by_nobody() {
    let s = Scratch::new("deadlock");
    let log = s.path("train.log");
    for killed in [false, true] {
        let t_path = s.path(if killed { "killed.json" } else { "exited.json" });
        // Killed from outside, the job would otherwise wait for good.
        let hang_s = if killed { "600" } else { "10" };
        let cmd = job(&["deadlock", "--log", log.to_str().unwrap(), "--hang-s", hang_s]);
        let mut argv = vec!["run", "-q", "--"];
        argv.extend(cmd.iter().map(String::as_str));
        argv.extend(["--truth", t_path.to_str().unwrap()]);
        let bg = Background::start(&argv);
        // Written as the job hangs.
        let t = truth_of(&t_path);
        let trainer = t["trainer"].as_u64().unwrap();
        if killed {
            std::thread::sleep(Duration::from_secs(10));
            let pid = nix::unistd::Pid::from_raw(trainer as i32);
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).expect("kill the job");
        }
        let run = bg.finish(Duration::from_secs(120));
        let how = if killed { "killed" } else { "exited" };
        let (kind, line) = verdict(&run);
        eprintln!("deadlock, {how}: {kind}: {line}");
        assert_eq!(kind, "hang", "{how}: {line}");
        assert!(
            run.records.iter().any(|r| r["type"] == "interval" && r["verdict"]["kind"] == "hang"),
            "{how}"
        );
        for tid in [trainer, t["prefetch"].as_u64().unwrap(), t["writer"].as_u64().unwrap()] {
            let wakers = &run.thread(tid)["woken_by"];
            let long = wakers.as_array().into_iter().flatten().find(|b| b["blocked_s"].as_f64() > Some(5.0));
            assert!(long.is_none(), "{how}: a waker ended thread {tid}'s deadlocked wait: {wakers}");
        }
    }
}
