//! Scenario suite: the demo job (demo/workload.py) in each of its
//! modes on the real kernel, no GPU; each scenario checks the verdict kind and
//! its key numbers against the ground truth the job writes (--truth):
//!
//! 1. I/O-bound input under `stall run` (reads throttled with a blkio cgroup);
//! 2. CPU-bound transforms in the workers;
//! 3. a hang, reported within 10 s of `stall attach`;
//! 4. a healthy job (the trainer is the bottleneck): no input verdict;
//! 5. workers respawned every epoch: every one of them, exact bytes;
//! 6. attach in the middle of a run, (a) to the trainer's PID, (b) to a cgroup.
//!
//! Each scenario takes seconds: small files, throttled reads of ~4 s. The
//! files live in $STALL_TEST_TMP or /var/tmp, which must be on a block device
//! (the throttle needs one): an unthrottled job fails the test.
use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    thread::{sleep, JoinHandle},
    time::{Duration, Instant},
};

use nix::{
    sys::signal::Signal,
    time::{clock_gettime, ClockId},
};
use serde_json::Value;
use stall_tests::assert::assert_close;
use stall_tests::cgroup::Cgroup;
use stall_tests::gpu::ScriptedGpu;
use stall_tests::procs::{drain, stop, wait_child, wait_until};
use stall_tests::scratch::disk_scratch;
use stall_tests::stall::{stall, Attached, Run};
use stall_tests::workload::{secs, shards, truth, workload};

const T: Duration = Duration::from_secs(60);

/// Prints how long a scenario took (see them with --nocapture).
struct Timed(&'static str, Instant);

impl Timed {
    fn start(name: &'static str) -> Self {
        Self(name, Instant::now())
    }
}

impl Drop for Timed {
    fn drop(&mut self) {
        eprintln!("scenario {}: {:.1}s", self.0, self.1.elapsed().as_secs_f64());
    }
}

/// Verdicts that blame the input pipeline (or say nothing moves).
const INPUT_KINDS: [&str; 3] = ["input-io-bound", "input-cpu-bound", "hang"];

/// `stall run -q -- python3 demo/workload.py ARGS...`
fn stall_run(args: &[impl AsRef<str>]) -> Run {
    let mut v: Vec<String> = vec!["run".into(), "-q".into(), "--".into()];
    v.extend(workload(args));
    let refs: Vec<&str> = v.iter().map(String::as_str).collect();
    stall(&refs, &[], T)
}

/// CLOCK_MONOTONIC in seconds, the clock of the truth's times.
fn monotonic_s() -> f64 {
    let ts = clock_gettime(ClockId::CLOCK_MONOTONIC).unwrap();
    ts.tv_sec() as f64 + ts.tv_nsec() as f64 / 1e9
}

/// The demo job running in the background; stopped (SIGTERM: it stops its
/// workers and removes its blkio cgroup) when dropped.
struct Job {
    child: Child,
    pid: u32,
    stderr: Option<JoinHandle<String>>,
}

impl Job {
    /// Starts it and reads its first stdout line, `PID <trainer pid>`.
    fn start(args: &[impl AsRef<str>]) -> Self {
        let argv = workload(args);
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting the workload");
        let stderr = Some(drain(child.stderr.take().unwrap()));
        let mut job = Self { pid: child.id(), child, stderr };
        let mut out = BufReader::new(job.child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let Some(pid) = line.trim().strip_prefix("PID ") else {
            stop(&mut job.child, Signal::SIGKILL);
            panic!("workload's first line is not `PID <n>`: {line:?}; stderr:\n{}", job.stderr());
        };
        assert_eq!(pid.parse::<u32>().unwrap(), job.pid, "the trainer is the process we started");
        drain(out);
        job
    }

    /// Stops it (if need be) and returns what it wrote on stderr.
    fn stderr(&mut self) -> String {
        stop(&mut self.child, Signal::SIGTERM);
        self.stderr.take().map(|h| h.join().unwrap()).unwrap_or_default()
    }

    /// Waits for it to finish by itself, successfully.
    fn finish(&mut self, timeout: Duration) {
        match wait_child(&mut self.child, timeout) {
            Some(s) if s.success() => {}
            s => panic!("workload: {s:?} within {timeout:?}; stderr:\n{}", self.stderr()),
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        stop(&mut self.child, Signal::SIGTERM);
    }
}

// ------------------------------------------------------------ ground truth

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not an integer: {v}"))
}

fn workers(t: &Value) -> &Vec<Value> {
    t["workers"].as_array().expect("truth: workers[]")
}

fn kind(v: &Value) -> &str {
    v["verdict"]["kind"].as_str().unwrap()
}

fn verdict_summary(run: &Run) -> &str {
    run.summary()["verdict"]["summary"].as_str().unwrap()
}

fn evidence(run: &Run) -> Vec<&str> {
    run.summary()["verdict"]["evidence"].as_array().unwrap().iter().map(|e| e.as_str().unwrap()).collect()
}

/// The truth of a finished job, checked for consistency.
fn finished_truth(path: &Path, mode: &str) -> Value {
    let t = truth(path);
    assert_eq!(t["mode"], mode);
    assert_eq!(t["stopped"], "completed", "the job did not complete: {t}");
    for w in workers(&t) {
        let per_file: u64 = w["files"].as_array().unwrap().iter().map(|f| u(&f["bytes"])).sum();
        assert_eq!(u(&w["read_bytes"]), per_file, "truth: a worker's bytes are its files' bytes: {w}");
    }
    t
}

/// An io job's reads must really have been throttled (else it need not wait).
fn assert_throttled(t: &Value) {
    let note = t["throttle"].as_str().unwrap();
    assert!(note.starts_with("throttled"), "the job's reads were not throttled: {note}");
}

/// Every worker process of the truth: in the summary, role worker, and
/// exactly the bytes it read, per file too.
fn assert_workers_exact(run: &Run, t: &Value) {
    for w in workers(t) {
        let pid = u(&w["pid"]);
        let p = run.process(pid);
        assert_eq!(p["role"], "worker", "worker {pid}: {}", brief(p));
        assert_eq!(p["read_bytes"], w["read_bytes"], "worker {pid} (truth {w}): {}", brief(p));
        for f in w["files"].as_array().unwrap() {
            let path = Path::new(f["path"].as_str().unwrap());
            assert_eq!(run.file(pid, path)["read_bytes"], f["bytes"], "worker {pid}, {}", path.display());
        }
    }
}

/// What stall counted for `path` in process `pid` (0 if it is not listed).
fn counted(run: &Run, pid: u64, path: &str) -> u64 {
    let files = run.process(pid)["files"].as_array().unwrap();
    files.iter().filter(|f| f["path"] == path).map(|f| u(&f["read_bytes"])).sum()
}

/// On-CPU seconds vs a thread's own clock, read by the job a little before
/// the thread ended: within `rel` and 50 ms (the rest of its life).
fn assert_cpu_close(what: &str, got: f64, want: f64, rel: f64) {
    assert!(
        (got - want).abs() <= 0.05 + rel * want,
        "{what}: got {got:.3}s, its own clock {want:.3}s (tolerance {:.0}% + 50 ms)",
        rel * 100.0
    );
}

/// A process record without its thread and file lists (for messages).
fn brief(p: &Value) -> Value {
    let mut p = p.clone();
    if let Some(o) = p.as_object_mut() {
        o.remove("threads");
        o.remove("files");
    }
    p
}

/// The trainer's record: pid from the truth, role trainer.
fn assert_trainer(run: &Run, t: &Value) {
    let p = run.process(u(&t["trainer"]));
    assert_eq!(p["role"], "trainer", "{}", brief(p));
}

/// stall's byte counts as its reports print them (units::bytes).
fn human_bytes(n: u64) -> String {
    let units = ["B", "KB", "MB", "GB", "TB"];
    let (mut v, mut i) = (n as f64, 0);
    while v >= 1000.0 && i < units.len() - 1 {
        v /= 1000.0;
        i += 1;
    }
    match i {
        0 => format!("{n} B"),
        _ if v >= 100.0 => format!("{v:.0} {}", units[i]),
        _ => format!("{v:.1} {}", units[i]),
    }
}

/// The number just before `unit` after `after` in `text`, e.g. the 19.5 of
/// "read 128 MB at 19.5 MB/s".
fn number_before(text: &str, after: &str, unit: &str) -> f64 {
    let rest = &text[text.find(after).unwrap_or_else(|| panic!("{after:?} not in {text:?}")) + after.len()..];
    let end = rest.find(unit).unwrap_or_else(|| panic!("{unit:?} not after {after:?} in {text:?}"));
    rest[..end].trim().rsplit(' ').next().unwrap().parse().unwrap_or_else(|_| panic!("no number in {text:?}"))
}

/// The io-bound line: "N workers read <bytes> at <rate> MB/s": the bytes are
/// the truth's; the rate is those bytes over the window, and near the job's own;
/// and the evidence.
fn assert_io_numbers(run: &Run, t: &Value) {
    let line = verdict_summary(run);
    let total: u64 = workers(t).iter().map(|w| u(&w["read_bytes"])).sum();
    let n = workers(t).len();
    let read = format!("{n} workers read {} at ", human_bytes(total));
    assert!(line.contains(&read), "{read:?} not in {line:?}");
    let rate = number_before(line, &read, "MB/s");
    // The verdict judges the steady state: the run less its startup.
    let startup = run.summary()["startup_s"].as_f64().unwrap_or(0.0);
    let window = secs(&run.summary()["duration_s"]) - startup;
    assert_close("MB/s in the verdict vs truth bytes / window", rate, total as f64 / 1e6 / window, 0.02);
    let own = total as f64 / 1e6 / (secs(&t["end"]) - secs(&t["start"]));
    eprintln!("io: verdict says {rate} MB/s over {window:.2}s; the job read at {own:.1} MB/s");
    assert_close("MB/s in the verdict vs the job's own rate", rate, own, 0.3);
    assert_worker_evidence(run, t);
}

/// Each worker's evidence line says what it read; the job's files are named.
fn assert_worker_evidence(run: &Run, t: &Value) {
    let ev = evidence(run);
    for w in workers(t) {
        let head = format!("worker {} ", w["pid"]);
        let line =
            ev.iter().find(|e| e.starts_with(&head)).unwrap_or_else(|| panic!("no {head:?} in {ev:?}"));
        let want = format!("read {} at ", human_bytes(u(&w["read_bytes"])));
        assert!(line.contains(&want), "{want:?} not in {line:?}");
    }
    let files: Vec<&str> = t["files"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
    assert!(
        ev.iter()
            .any(|e| e.starts_with("file ") && files.iter().any(|f| e.contains(f)) && e.contains("MB/s")),
        "no evidence names the job's files: {ev:?}"
    );
}

// --------------------------------------------------------------- scenarios

/// 1. A throttled DataLoader-style job under `stall run`: input-io-bound,
///    every worker's exact bytes.
#[test]
fn io_bound_job_under_run() {
    let _t = Timed::start("io_bound_job_under_run");
    let s = disk_scratch("io");
    let cache = s.path("cache");
    let truth_path = s.path("truth.json");
    // 8 MB/s: I/O-bound even where Python runs slowly (an emulated CPU, a busy host).
    let mut args = shards(&cache, 8, 8, 8);
    args.extend(
        ["--workers", "4", "--start-delay", "0", "--truth", truth_path.to_str().unwrap()].map(String::from),
    );
    // The trainer holds a GPU that idles at 60 W (scripted NVML): it waits
    // for batches.
    let gpu = ScriptedGpu::new(&serde_json::json!(null));
    let pid_file = gpu.path("trainer.pid");
    gpu.update(&serde_json::json!({"devices": [{
        "name": "Scripted H200", "power_limit_mw": 700_000,
        "phases": [{"util_pct": 0, "power_mw": 60_000, "processes": [{"pid_file": pid_file, "used_mem_bytes": 1_000_000_000u64}]}],
    }]}));
    // The shell's pid is the trainer's: it execs the workload.
    let script = format!("echo $$ > {}; exec \"$@\"", pid_file.display());
    let mut v: Vec<String> = vec!["run".into(), "-q".into()];
    v.extend(gpu.args().iter().map(|a| a.to_string_lossy().into_owned()));
    v.extend(["--".into(), "sh".into(), "-c".into(), script, "sh".into()]);
    v.extend(workload(&args));
    let refs: Vec<&str> = v.iter().map(String::as_str).collect();
    let run = stall(&refs, &[gpu.env()], T);
    assert_eq!(run.status, 0, "{}", run.stderr);
    let t = finished_truth(&truth_path, "io");
    assert_throttled(&t);
    assert_eq!(workers(&t).len(), 4);
    assert_eq!(kind(run.summary()), "input-io-bound", "{}", verdict_summary(&run));
    let g = &run.summary()["gpus"][0];
    assert!(secs(&g["idle_fraction"]) > 0.9, "{g}");
    assert!(verdict_summary(&run).starts_with("GPU0 idle"), "{}", verdict_summary(&run));
    assert!(!verdict_summary(&run).contains("no GPU data"), "{}", verdict_summary(&run));
    assert_trainer(&run, &t);
    assert_workers_exact(&run, &t);
    assert_io_numbers(&run, &t);
    assert_eq!(run.summary()["lost_events"], 0);
}

/// 1b. The same job with workers that map their shards and copy batches
///     out of the mappings (torch.load(mmap=True), safetensors, Arrow):
///     no read(2), the bytes arrive by page faults from throttled storage.
///     input-io-bound, the bytes (mapped, and from storage) within 5 % of
///     the shards, the shards named with where their bytes came from, and
///     exactly the workers as workers.
#[test]
fn mapped_shards_are_read_from_storage() {
    let _t = Timed::start("mapped_shards_are_read_from_storage");
    mapped_shards(false);
}

/// 1c. The same with the shards mapped by the trainer before the workers
///     fork (Hugging Face datasets' `load_from_disk`): the workers never
///     open a shard, yet each shard's pages are named, per worker, by the
///     shard's path, with the same exact bytes.
#[test]
fn shards_mapped_before_fork_are_named_in_each_worker() {
    let _t = Timed::start("shards_mapped_before_fork_are_named_in_each_worker");
    mapped_shards(true);
}

fn mapped_shards(before_fork: bool) {
    let s = disk_scratch(if before_fork { "premap" } else { "mmap" });
    let cache = s.path("cache");
    let truth_path = s.path("truth.json");
    // 8 MB/s: I/O-bound even where faults are slow to emulate on a busy
    // host (at 12 MB/s, a loaded 6.12 VM made the workers CPU-bound).
    let mut args = shards(&cache, 8, 8, 8);
    args.extend(
        ["--mode", "mmap", "--workers", "4", "--start-delay", "0", "--truth", truth_path.to_str().unwrap()]
            .map(String::from),
    );
    if before_fork {
        args.push("--map-before-fork".into());
    }
    let run = stall_run(&args);
    assert_eq!(run.status, 0, "{}", run.stderr);
    let t = finished_truth(&truth_path, "mmap");
    assert_throttled(&t);
    assert_eq!(kind(run.summary()), "input-io-bound", "{}", verdict_summary(&run));
    assert_trainer(&run, &t);
    let want: Vec<u64> = workers(&t).iter().map(|w| u(&w["pid"])).collect();
    let mut got: Vec<u64> =
        run.processes().iter().filter(|p| p["role"] == "worker").map(|p| u(&p["pid"])).collect();
    got.sort_unstable();
    let mut sorted = want.clone();
    sorted.sort_unstable();
    assert_eq!(got, sorted, "the DataLoader's workers, and only they, are workers");
    let mut total = 0;
    for w in workers(&t) {
        let pid = u(&w["pid"]);
        for f in w["files"].as_array().unwrap() {
            let path = Path::new(f["path"].as_str().unwrap());
            let f_run = run.file(pid, path);
            assert_eq!(f_run["read_bytes"], 0, "worker {pid}: no read(2) of {}: {f_run}", path.display());
            if before_fork {
                assert_eq!(f_run["opens"], 0, "worker {pid} never opened {}: {f_run}", path.display());
            }
            let storage = u(&f_run["storage_bytes"]);
            assert_close(
                &format!("worker {pid}: {} from storage", path.display()),
                storage as f64,
                u(&f["bytes"]) as f64,
                0.05,
            );
            assert_close(
                &format!("worker {pid}: {} through the mapping", path.display()),
                u(&f_run["mmap_bytes"]) as f64,
                u(&f["bytes"]) as f64,
                0.05,
            );
        }
        total += u(&w["read_bytes"]);
    }
    let line = verdict_summary(&run);
    let read = number_before(line, "workers read ", "MB");
    assert_close("MB in the verdict vs the shards' bytes", read, total as f64 / 1e6, 0.05);
    let files: Vec<&str> = t["files"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
    let ev = evidence(&run);
    assert!(
        ev.iter().any(|e| e.starts_with("file ")
            && files.iter().any(|f| e.contains(f))
            && e.contains("through a mapping, from storage")),
        "no evidence names the shards: {ev:?}"
    );
}

/// The demo job's cpu mode: 4 workers decoding `batches` batches of 50 ms.
fn cpu_job(batches: u32, truth: &Path, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = ["--mode", "cpu", "--workers", "4", "--decode-ms", "50", "--start-delay", "0"]
        .map(String::from)
        .to_vec();
    v.extend(["--batches".into(), batches.to_string(), "--truth".into(), truth.to_str().unwrap().into()]);
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// 2. Workers that spend their time decoding in memory: input-cpu-bound;
///    their on-CPU time is their own.
#[test]
fn cpu_bound_transforms() {
    let _t = Timed::start("cpu_bound_transforms");
    let s = disk_scratch("cpu");
    let truth_path = s.path("truth.json");
    let run = stall_run(&cpu_job(60, &truth_path, &[]));
    assert_eq!(run.status, 0, "{}", run.stderr);
    let t = finished_truth(&truth_path, "cpu");
    assert_eq!(kind(run.summary()), "input-cpu-bound", "{}", verdict_summary(&run));
    assert_trainer(&run, &t);
    assert_workers_exact(&run, &t); // role worker, 0 bytes from files
    let line = verdict_summary(&run);
    assert!(line.contains("4 workers on CPU"), "{line}");
    for w in workers(&t) {
        let pid = u(&w["pid"]);
        let main = run.thread(pid);
        // The worker measured its CPU time at its last batch; it then only exits.
        let want = secs(&w["cpu_s"]);
        assert!(want >= 0.1, "truth: worker {pid} did little: {w}");
        assert_cpu_close(&format!("worker {pid} on-CPU ({main})"), secs(&main["on_cpu_s"]), want, 0.05);
    }
}

/// 2a. The same workers in a cgroup limited to 0.6 CPU (a Kubernetes CPU
///     limit): input-cpu-bound because of the limit, which the verdict
///     names with its throttling; the throttled time matches cpu.stat, and
///     each worker's on-CPU time is its own CPU time, never its waiting.
#[test]
fn a_cpu_limit_throttling_the_workers_is_named() {
    let _t = Timed::start("a_cpu_limit_throttling_the_workers_is_named");
    let s = disk_scratch("cpulimit");
    let truth_path = s.path("truth.json");
    let run = stall_run(&cpu_job(150, &truth_path, &["--cpu-limit", "0.6"]));
    assert_eq!(run.status, 0, "{}", run.stderr);
    let t = finished_truth(&truth_path, "cpu");
    let limit = &t["cpu_limit"];
    assert!(limit.is_object(), "the job ran without its CPU limit: {t}");
    let cgroup = limit["cgroup"].as_str().unwrap();
    let sum = run.summary();
    let got = sum["cpu_limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["cgroup"] == cgroup)
        .unwrap_or_else(|| panic!("{cgroup} not among {}", sum["cpu_limits"]));
    eprintln!("cpu limit: stall {got}; cpu.stat at the end {limit}; {}", verdict_summary(&run));
    assert_eq!(got["cpu_limit_cpus"], 0.6);
    // stall reads cpu.stat once per interval: the last second (after its
    // last reading, before the job removed its cgroup) is missing.
    let want_s = u(&limit["throttled_ns"]) as f64 / 1e9;
    assert!(want_s >= 5.0, "the limit throttled the job: {limit}");
    assert_cpu_close("throttled seconds", secs(&got["throttled_s"]), want_s, 0.15);
    assert_cpu_close(
        "throttled periods",
        u(&got["throttled_periods"]) as f64,
        u(&limit["throttled_periods"]) as f64,
        0.15,
    );
    assert_eq!(kind(sum), "input-cpu-bound", "{}", verdict_summary(&run));
    let line = verdict_summary(&run);
    assert!(
        line.contains(&format!("the cgroup's CPU limit (0.6 CPU, {cgroup}) throttled them in ")),
        "{line}"
    );
    for w in workers(&t) {
        let pid = u(&w["pid"]);
        assert_eq!(run.process(pid)["cpu_limit_cgroup"], cgroup);
        let main = run.thread(pid);
        let want = secs(&w["cpu_s"]);
        assert_cpu_close(&format!("worker {pid} on-CPU ({main})"), secs(&main["on_cpu_s"]), want, 0.05);
        let by = &main["off_cpu_by_reason"];
        assert!(
            secs(&by["throttled"]) > secs(&main["on_cpu_s"]),
            "worker {pid} held back by the limit: {main}"
        );
    }
}

/// 2b. A short run whose trainer first spends longer importing (on CPU)
///     than its CPU-bound pipeline then runs: the verdict is on the steady
///     state after the workers start, and the report says how long startup
///     took.
#[test]
fn a_short_run_is_judged_after_its_startup() {
    let _t = Timed::start("a_short_run_is_judged_after_its_startup");
    let s = disk_scratch("startup");
    let truth_path = s.path("truth.json");
    let run = stall_run(&cpu_job(60, &truth_path, &["--import-s", "2.5"]));
    assert_eq!(run.status, 0, "{}", run.stderr);
    let t = finished_truth(&truth_path, "cpu");
    let sum = run.summary();
    assert_eq!(kind(sum), "input-cpu-bound", "{}", verdict_summary(&run));
    let startup = secs(&sum["startup_s"]);
    // Imports, then the workers start; startup ends with the last interval
    // (1 s) before that.
    assert!((1.4..5.0).contains(&startup), "startup {startup} s");
    // The whole run's numbers stay whole: the trainer's time on (or waiting
    // for) a CPU includes the 2.5 s of imports.
    let trainer = run.thread(u(&t["trainer"]));
    let cpu = secs(&trainer["on_cpu_s"]) + secs(&trainer["off_cpu_by_reason"]["runqueue"]);
    assert!(cpu >= 2.4, "{trainer}");
}

/// 3. Workers blocked forever before reading anything: `hang` within 10 s
///    of attaching, naming the blocked threads and what they wait in.
#[test]
fn hang_is_reported_within_ten_seconds_of_attach() {
    let _t = Timed::start("hang_is_reported_within_ten_seconds_of_attach");
    let s = disk_scratch("hang");
    let truth_path = s.path("truth.json");
    let mut job = Job::start(&[
        "--mode",
        "hang",
        "--workers",
        "2",
        "--start-delay",
        "0",
        "--max-seconds",
        "60",
        "--truth",
        truth_path.to_str().unwrap(),
    ]);
    // The truth is written once the workers are started.
    wait_until("the workers to start", Duration::from_secs(20), || truth_path.exists());
    let run = stall(&["attach", "--pid", &job.pid.to_string(), "--duration", "9", "-q"], &[], T);
    let alive = job.child.try_wait().unwrap().is_none();
    drop(job); // SIGTERM to the trainer; its workers die with it (PDEATHSIG)
    assert!(alive, "the hung job ended by itself");
    assert_eq!(run.status, 0, "{}", run.stderr);
    let t = truth(&truth_path);
    assert_eq!(t["mode"], "hang");
    assert_eq!(t["batches"], 0, "{t}");

    let intervals: Vec<&Value> = run.records.iter().filter(|r| r["type"] == "interval").collect();
    let first = intervals.iter().find(|r| kind(r) == "hang").unwrap_or_else(|| {
        panic!("no interval says hang: {:?}", intervals.iter().map(|r| kind(r)).collect::<Vec<_>>())
    });
    assert!(secs(&first["elapsed_s"]) <= 10.0, "hang first reported at {}", first["elapsed_s"]);
    let sum = run.summary();
    let last = intervals.last().unwrap();
    assert_eq!(
        kind(sum),
        "hang",
        "{}\nintervals: {:?}\nlast interval: {}",
        verdict_summary(&run),
        intervals.iter().map(|r| kind(r)).collect::<Vec<_>>(),
        last["verdict"]
    );
    let line = verdict_summary(&run);
    let trainer = u(&t["trainer"]);
    assert!(line.contains(&format!("trainer (pid {trainer})")), "{line}");
    // The trainer's main thread waits in poll on its result queue; its queue
    // feeder threads in futex.
    assert!(line.contains(&format!("{trainer} (poll")), "the trainer main thread is not named: {line}");
    assert!(line.contains("futex"), "{line}");
    let stalled = number_before(line, "No progress in the last", "s:");
    assert!(stalled >= 4.0, "{line}");
    let n = workers(&t).len();
    assert!(line.contains(&format!("and {n} workers blocked")), "{line}");
    // The workers are traced, hold still in futex (the Event), read nothing,
    // and are named among the blocked threads with their wait.
    for w in workers(&t) {
        let pid = u(&w["pid"]);
        // "(futex for 9 s)": the wait (its call named once), and how long
        // it has lasted.
        assert!(line.contains(&format!("{pid} (futex for ")), "worker {pid} not named: {line}");
        let p = run.process(pid);
        assert_eq!(p["role"], "worker", "{}", brief(p));
        assert_eq!(p["read_bytes"], 0, "{}", brief(p));
        assert!(secs(&p["on_cpu_s"]) < 0.2, "{}", brief(p));
        assert_eq!(run.thread(pid)["state"], "futex", "worker {pid}: {}", run.thread(pid));
    }
}

/// 4. The trainer is the bottleneck: not an input verdict, trainer-host-bound;
///    its on-CPU time is its own.
#[test]
fn healthy_job_is_not_input_bound() {
    let _t = Timed::start("healthy_job_is_not_input_bound");
    let s = disk_scratch("healthy");
    let truth_path = s.path("truth.json");
    let run = stall_run(&[
        "--mode",
        "healthy",
        "--workers",
        "4",
        "--batches",
        "15",
        "--compute-ms",
        "200",
        // Near-idle workers (the trainer wakes them more than they wake it):
        // the trainer must still be recognised as the trainer.
        "--decode-ms",
        "2",
        "--start-delay",
        "0",
        "--truth",
        truth_path.to_str().unwrap(),
    ]);
    assert_eq!(run.status, 0, "{}", run.stderr);
    let t = finished_truth(&truth_path, "healthy");
    let k = kind(run.summary());
    assert!(!INPUT_KINDS.contains(&k), "{k}: {}", verdict_summary(&run));
    assert_eq!(k, "trainer-host-bound", "{}", verdict_summary(&run));
    let trainer = u(&t["trainer"]);
    assert_eq!(run.process(trainer)["role"], "trainer");
    let main = run.thread(trainer);
    // Its CPU time, as the trainer measured it itself.
    let want = secs(&t["trainer_cpu_s"]);
    assert!(want >= 0.1, "truth: {t}");
    eprintln!(
        "healthy: trainer main thread on CPU {:.3}s (own clock {want:.3}s), off CPU {:.3}s, window {:.3}s",
        secs(&main["on_cpu_s"]),
        secs(&main["off_cpu_s"]),
        secs(&run.summary()["duration_s"])
    );
    // 15%: under load (several stall instances, CPU-bound jobs) a context
    // switch can be missed (counted as sched_gaps) and its span lost.
    assert_cpu_close(&format!("trainer main thread on-CPU ({main})"), secs(&main["on_cpu_s"]), want, 0.15);
    // 15 steps of 200 ms (wall time): on CPU, or runnable when others hold the CPUs.
    let busy = secs(&main["on_cpu_s"]) + secs(&main["off_cpu_by_reason"]["runqueue"]);
    assert!(busy >= 0.8 * 15.0 * 0.2, "trainer main thread on CPU or runnable {busy:.2}s: {main}");
    for w in workers(&t) {
        assert_eq!(run.process(u(&w["pid"]))["read_bytes"], 0);
    }
}

/// A trainer whose input keeps up but that saves a 24 MiB checkpoint every
/// 10 steps (write, fsync, rename) to storage whose writes are throttled to
/// 12 MB/s: blocked mostly in fsync, it is output-io-bound, with the
/// checkpoint's bytes exact and its time in sync and write as it measured
/// them.
#[test]
fn checkpoints_to_slow_storage_are_output_io_bound() {
    let _t = Timed::start("checkpoints_to_slow_storage_are_output_io_bound");
    let s = disk_scratch("checkpoint");
    let truth_path = s.path("truth.json");
    let run = stall_run(&[
        "--mode",
        "checkpoint",
        "--cache-dir",
        s.path("ckpt").to_str().unwrap(),
        "--workers",
        "2",
        "--batches",
        "40",
        "--checkpoint-every",
        "10",
        "--checkpoint-mb",
        "24",
        "--throttle-mbps",
        "12",
        "--start-delay",
        "0",
        "--truth",
        truth_path.to_str().unwrap(),
    ]);
    assert_eq!(run.status, 0, "{}", run.stderr);
    let t = truth(&truth_path);
    assert_eq!(t["stopped"], "completed", "{t}");
    assert_throttled(&t);
    let c = &t["checkpoint"];
    assert_eq!(u(&c["count"]), 4, "{t}");
    let trainer = u(&t["trainer"]);
    let tmp = format!("{}.tmp", c["path"].as_str().unwrap());
    let f = run.file(trainer, Path::new(&tmp));
    assert_eq!(u(&f["write_bytes"]), u(&c["bytes"]), "checkpoint bytes: {f}");
    assert_eq!(u(&f["write_calls"]), 4 * 24, "{f}");
    let main = run.thread(trainer);
    let by = &main["off_cpu_by_reason"];
    eprintln!(
        "checkpoint: trainer sync {:.3}s (own clock {:.3}s), write {:.3}s (own clock {:.3}s, control files {:.3}s), io {:.3}s; {}",
        secs(&by["sync"]),
        secs(&c["sync_s"]),
        secs(&by["write"]),
        secs(&c["write_s"]),
        secs(&t["control_writes"]["s"]),
        secs(&by["io"]),
        verdict_summary(&run)
    );
    // Blocked in fsync for all but the fsync's own CPU time.
    let want = secs(&c["sync_s"]);
    assert!(want >= 4.0 * 24.0 * 1.048 / 12.0 * 0.8, "the fsyncs waited for the throttle: {t}");
    assert!(secs(&by["sync"]) <= want * 1.02 && secs(&by["sync"]) >= want * 0.9, "sync: {main}");
    // Writes into the page cache block little; what does is counted as write.
    // So do the writes that move the trainer in and out of the throttling
    // cgroup (an RCU grace period each, 7-15 ms here, more under load).
    let control = secs(&t["control_writes"]["s"]);
    let own_writes = secs(&c["write_s"]) + control;
    assert!(secs(&by["write"]) <= own_writes * 1.05 + 0.01, "write (control files {control:.3}s): {main}");
    assert!(secs(&by["io"]) < 0.1 * want, "a sync is not a read: {main}");
    assert_eq!(kind(run.summary()), "output-io-bound", "{}", verdict_summary(&run));
    let line = verdict_summary(&run);
    assert!(line.contains(&format!("writing {tmp} (")), "{line}");
    assert!(line.contains(&format!("{} at ", human_bytes(u(&c["bytes"])))), "{line}");
    assert!(evidence(&run).iter().any(|e| e.starts_with(&format!("file {tmp}: "))), "{:?}", evidence(&run));
}

/// 5. Non-persistent workers, new ones every epoch: every worker of every
///    epoch is in the summary with its exact bytes.
#[test]
fn respawned_workers_every_epoch() {
    let _t = Timed::start("respawned_workers_every_epoch");
    let s = disk_scratch("respawn");
    let cache = s.path("cache");
    let truth_path = s.path("truth.json");
    // 4 MB/s: I/O-bound even where Python runs slowly. Under CI's emulated
    // CPU with the host loaded, forked workers spent 38% of their lives on
    // CPU and 11% waiting for one at 8 MB/s, more than in their reads.
    let mut args = shards(&cache, 4, 3, 4);
    args.extend(
        [
            "--workers",
            "2",
            "--respawn",
            "--epochs",
            "3",
            "--start-delay",
            "0",
            "--truth",
            truth_path.to_str().unwrap(),
        ]
        .map(String::from),
    );
    let run = stall_run(&args);
    assert_eq!(run.status, 0, "{}", run.stderr);
    let t = finished_truth(&truth_path, "io");
    assert_throttled(&t);
    assert_eq!(t["epochs_done"], 3);
    let pids: std::collections::BTreeSet<u64> = workers(&t).iter().map(|w| u(&w["pid"])).collect();
    assert_eq!(pids.len(), 6, "2 new workers per epoch: {t}");
    for e in 0..3 {
        let n = workers(&t).iter().filter(|w| w["epoch"] == e && u(&w["read_bytes"]) > 0).count();
        assert_eq!(n, 2, "epoch {e}: {t}");
    }
    assert_trainer(&run, &t);
    assert_workers_exact(&run, &t);
    for w in workers(&t) {
        let p = run.process(u(&w["pid"]));
        assert_eq!(p["alive"], false, "{}", brief(p));
        assert_eq!(p["ppid"], t["trainer"], "{}", brief(p));
    }
    // Each worker is judged over its own epoch, not the whole run.
    assert_eq!(kind(run.summary()), "input-io-bound", "{}", verdict_summary(&run));
    assert_io_numbers(&run, &t);
}

/// 6a. Attach to the trainer's PID while its workers read: what is read
///     after attach is counted (exactly, for files opened after it), what was
///     read before is not invented.
#[test]
fn attach_to_pid_mid_run() {
    let _t = Timed::start("attach_to_pid_mid_run");
    let s = disk_scratch("midrun");
    let cache = s.path("cache");
    let truth_path = s.path("truth.json");
    let mut args = shards(&cache, 16, 6, 24);
    args.extend(
        [
            "--workers",
            "4",
            "--start-delay",
            "0",
            "--max-seconds",
            "60",
            "--truth",
            truth_path.to_str().unwrap(),
        ]
        .map(String::from),
    );
    let mut job = Job::start(&args);
    wait_until("the workers to start", Duration::from_secs(20), || truth_path.exists());
    sleep(Duration::from_secs(1)); // reading is under way
    let spawned = monotonic_s();
    let mut stall = Attached::start(&["--pid", &job.pid.to_string(), "--interval", "0.25"]);
    stall.wait_tracing();
    let tracing = monotonic_s();
    eprintln!(
        "midrun: stall attached {:.2}s after the workers started",
        tracing - secs(&truth(&truth_path)["start"])
    );
    job.finish(Duration::from_secs(30));
    // It ends with its target.
    let run = stall.finish(Duration::from_secs(15));
    assert_eq!(run.status, 0, "{}", run.stderr);
    let t = finished_truth(&truth_path, "io");
    assert_throttled(&t);
    assert_eq!(kind(run.summary()), "input-io-bound", "{}", verdict_summary(&run));
    assert_trainer(&run, &t);

    let (mut after, mut during, mut before) = (0, 0, 0);
    let (mut got_total, mut truth_total) = (0, 0);
    for w in workers(&t) {
        let pid = u(&w["pid"]);
        let p = run.process(pid);
        assert_eq!(p["role"], "worker", "{}", brief(p));
        let (got, want) = (u(&p["read_bytes"]), u(&w["read_bytes"]));
        assert!(got > 0 && got <= want, "worker {pid}: stall {got} B, truth {want} B");
        got_total += got;
        truth_total += want;
        for f in w["files"].as_array().unwrap() {
            let path = f["path"].as_str().unwrap();
            let (open_t, close_t, bytes) = (secs(&f["open_t"]), secs(&f["close_t"]), u(&f["bytes"]));
            let n = counted(&run, pid, path);
            if open_t > tracing {
                // Opened once stall was tracing: every byte.
                assert_eq!(n, bytes, "worker {pid}, {path} opened after attach");
                after += 1;
            } else if close_t < spawned {
                // Read and closed before stall started: nothing to count.
                assert_eq!(n, 0, "worker {pid}, {path} read before attach");
                before += 1;
            } else {
                // Open at attach: what was read since, at most the whole file.
                assert!(n <= bytes, "worker {pid}, {path} open at attach: stall {n} B, truth {bytes} B");
                during += 1;
            }
        }
    }
    eprintln!(
        "midrun: files opened after attach {after}, open at attach {during}, read before {before}; \
         stall counted {got_total} of {truth_total} B"
    );
    assert!(after >= 4, "too few files opened after attach to check ({after}): attach was late");
    // About a second of reading happened before stall started.
    assert!(got_total < truth_total, "stall counted bytes read before it attached");
}

/// 6b. Attach to the job's cgroup v2 before its workers start: verdict and
///     every worker's exact bytes.
#[test]
fn attach_to_cgroup() {
    let _t = Timed::start("attach_to_cgroup");
    let s = disk_scratch("cgroup");
    let cache = s.path("cache");
    let truth_path = s.path("truth.json");
    let go = s.path("go");
    let cg = Cgroup::new("cg");
    let mut args = shards(&cache, 8, 8, 16);
    args.extend(
        [
            "--workers",
            "4",
            "--start-delay",
            "0",
            "--start-after",
            go.to_str().unwrap(),
            "--max-seconds",
            "60",
            "--truth",
            truth_path.to_str().unwrap(),
        ]
        .map(String::from),
    );
    let mut job = Job::start(&args);
    // The trainer waits for `go`; its workers will be forked into the cgroup.
    cg.add(job.pid);
    let mut stall = Attached::start(&["--cgroup", &cg.name, "--duration", "40", "--interval", "0.25"]);
    stall.wait_tracing();
    std::fs::write(&go, "").unwrap();
    job.finish(Duration::from_secs(30));
    // stall ends at its next interval once the cgroup is gone.
    assert!(cg.remove(), "could not remove {}", cg.dir.display());
    let run = stall.finish(Duration::from_secs(15));
    assert_eq!(run.status, 0, "{}", run.stderr);
    assert!(secs(&run.summary()["elapsed_s"]) < 30.0, "stall did not end with its cgroup");
    let t = finished_truth(&truth_path, "io");
    assert_throttled(&t);
    assert_eq!(kind(run.summary()), "input-io-bound", "{}", verdict_summary(&run));
    assert_trainer(&run, &t);
    assert_workers_exact(&run, &t);
    assert_io_numbers(&run, &t);
}
