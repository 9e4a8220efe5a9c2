//! Causes beyond the local DataLoader, with real PyTorch (and Hugging Face
//! `datasets`) where the cause involves them: a trainer stalled by its
//! synchronous checkpoints, a dataset mapped before the DataLoader forks.
//!
//! Needs root; PyTorch and datasets come from `$STALL_TORCH_PATH` and
//! `$STALL_DATASETS_PATH` (`cargo xtask test` installs them). The mapped
//! table's standard-library twin needs neither (it runs in the VMs).

use std::{path::Path, process::Command, time::Duration};

use serde_json::Value;
use stall_tests::procs::{run_with_timeout, stop, wait_child, wait_until, Killer};
use stall_tests::scratch::{disk_scratch, Scratch};
use stall_tests::stall::{require_root, stall, Attached, Run};
use stall_tests::torch::{torch_and_datasets_path, torch_path};
use stall_tests::workload::{python, secs, truth};

fn workload(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads").join(name).display().to_string()
}

fn kind(run: &Run) -> &str {
    run.summary()["verdict"]["kind"].as_str().unwrap()
}

fn summary_line(run: &Run) -> &str {
    run.summary()["verdict"]["summary"].as_str().unwrap()
}

/// torch.save of a ~25 MB state every 10 steps, fsync'd, to storage whose
/// writes are throttled to 12 MB/s, while the DataLoader keeps up: the
/// trainer is output-io-bound, the checkpoint's bytes exact, its fsync time
/// as the trainer measured it.
#[test]
fn torch_save_checkpoints_to_slow_storage_are_output_io_bound() {
    require_root();
    let torch = torch_path();
    let dir = disk_scratch("torch-ckpt");
    let truth_path = dir.path("truth.json");
    let dir_arg = dir.0.display().to_string();
    let script = workload("torch_checkpoint.py");
    let argv = [
        "run",
        "-q",
        "--",
        python(),
        script.as_str(),
        "--dir",
        dir_arg.as_str(),
        "--truth",
        truth_path.to_str().unwrap(),
        "--state-mb",
        "24",
        "--write-mbps",
        "12",
    ];
    // PyTorch's files in the page cache first, as on any machine that ran
    // it before. From a cold cache the trainer's own imports read ~65 MB
    // from storage (2.7 MB/s here under a concurrent test), longer than its
    // checkpoints wait, and stall rightly calls that run input-bound.
    let warm = Command::new(python())
        .args(["-c", "import torch, torch.optim; from torch.utils.data import DataLoader"])
        .env("PYTHONPATH", &torch)
        .status()
        .unwrap();
    assert!(warm.success(), "importing PyTorch from {}", torch.display());
    let run = stall(&argv, &[("PYTHONPATH", &torch)], Duration::from_secs(240));
    assert_eq!(run.status, 0, "stall run failed:\n{}", run.stderr);
    let t: Value = truth(&truth_path);
    assert!(t["throttle"].as_str().unwrap().starts_with("throttled"), "{t}");
    assert_eq!(t["saves"], 4, "{t}");
    let trainer = t["trainer"].as_u64().unwrap();
    let tmp = t["tmp"].as_str().unwrap();
    let f = run.file(trainer, Path::new(tmp));
    assert_eq!(f["write_bytes"], t["bytes"], "torch.save's bytes: {f}");
    let by = &run.thread(trainer)["off_cpu_by_reason"];
    let (sync, want) = (secs(&by["sync"]), secs(&t["sync_s"]));
    eprintln!(
        "torch checkpoint: sync {sync:.3}s (own clock {want:.3}s), write {:.3}s, io {:.3}s (torch.save {:.3}s); {}",
        secs(&by["write"]),
        secs(&by["io"]),
        secs(&t["save_s"]),
        summary_line(&run)
    );
    assert!(want >= 4.0 * 25.0 / 12.0 * 0.8, "the fsyncs waited for the throttle: {t}");
    assert!(sync <= want * 1.02 && sync >= want * 0.9, "sync {sync:.3}s vs {want:.3}s");
    assert_eq!(kind(&run), "output-io-bound", "{}", summary_line(&run));
    assert!(summary_line(&run).contains(&format!("writing {tmp} (")), "{}", summary_line(&run));
}

/// A table of `rows` rows of 4 KiB saved with `datasets` (untraced), then
/// read by hf_arrow.py's `mode` with `workers` DataLoader workers under
/// `stall run`, its disk reads capped at `mbps` MB/s: the run and the truth.
fn datasets_job(tag: &str, rows: u32, mode: &str, workers: u32, mbps: u32) -> (Run, Value) {
    table_job(tag, "hf_arrow.py", Some(&torch_and_datasets_path()), &[&rows.to_string()], mode, workers, mbps)
}

/// A table written by `script`'s `prepare` (untraced, with `pythonpath`
/// if any; `table`: its arguments after the directory, the rows of 4 KiB
/// first), then read by its `mode` with
/// `workers` workers under `stall run`, its disk reads capped at `mbps`
/// MB/s: the run and the truth.
fn table_job(
    tag: &str,
    script: &str,
    pythonpath: Option<&Path>,
    table: &[&str],
    mode: &str,
    workers: u32,
    mbps: u32,
) -> (Run, Value) {
    require_root();
    let env: Vec<(&str, &Path)> = pythonpath.map(|p| ("PYTHONPATH", p)).into_iter().collect();
    let dir = disk_scratch(tag);
    let data = dir.path("ds");
    let script = workload(script);
    let mut prepare = std::process::Command::new(python());
    prepare.args([script.as_str(), "prepare", data.to_str().unwrap()]).args(table).envs(env.iter().copied());
    let out = run_with_timeout(prepare, Duration::from_secs(180));
    assert!(out.status.success(), "preparing the table: {}", String::from_utf8_lossy(&out.stderr));
    let truth_path = dir.path("truth.json");
    let (workers, mbps) = (workers.to_string(), mbps.to_string());
    let argv = [
        "run",
        "-q",
        "--",
        python(),
        script.as_str(),
        mode,
        data.to_str().unwrap(),
        truth_path.to_str().unwrap(),
        &workers,
        &mbps,
    ];
    let run = stall(&argv, &env, Duration::from_secs(240));
    assert_eq!(run.status, 0, "stall run failed:\n{}", run.stderr);
    (run, truth(&truth_path))
}

/// A Hugging Face `datasets` table memory-mapped by the trainer
/// (`load_from_disk`) before its DataLoader forks two workers, which fault
/// the rows in without ever opening the Arrow file: each worker's pages are
/// named by the Arrow file's path, in its own file list and the evidence,
/// and almost none of its mapped bytes are left without a file. The large
/// folios their batches share are mapped into both, counted as mapped for
/// the one that faulted first (a race) and as shared for the other: each
/// worker's own part is the two together, the first-come parts add up to
/// the file once.
#[test]
fn pages_of_a_dataset_mapped_before_fork_are_named_in_each_worker() {
    let (run, t) = datasets_job("hf-arrow", 24576, "run", 2, 40);
    let (arrow, size) = t["files"].as_object().unwrap().iter().next().expect("an Arrow file");
    let size = size.as_u64().unwrap();
    let evidence = run.summary()["verdict"]["evidence"].as_array().unwrap().clone();
    let bytes = |v: &Value, key: &str| v[key].as_u64().unwrap_or_else(|| panic!("no {key}: {v}"));
    let mut first_come = 0;
    for w in t["workers"].as_array().unwrap() {
        let pid = w.as_u64().unwrap();
        let p = run.process(pid);
        assert_eq!(p["role"], "worker", "{p}");
        let f = run.file(pid, Path::new(arrow));
        let (mapped, shared) = (bytes(f, "mmap_bytes"), bytes(f, "mmap_shared_bytes"));
        first_come += mapped;
        let all = bytes(p, "mmap_bytes") + bytes(p, "mmap_shared_bytes");
        let named: u64 = p["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["mmap_bytes"].as_u64().unwrap_or(0) + f["mmap_shared_bytes"].as_u64().unwrap_or(0))
            .sum();
        eprintln!(
            "worker {pid}: {mapped} + {shared} shared bytes of {arrow} ({size}) mapped, {all} in all, {named} under a path"
        );
        // Each worker reads half the rows; the folios at its batches' ends
        // hold its neighbour's rows too.
        assert!(mapped + shared >= size * 2 / 5 && mapped + shared <= size * 51 / 50, "worker {pid}: {f}");
        assert!(all - named <= all / 20, "worker {pid}: {} mapped bytes under no path: {p}", all - named);
        assert!(
            evidence.iter().any(|e| {
                let e = e.as_str().unwrap();
                e.starts_with(&format!("file {arrow}: ")) && e.contains(&format!("mapped by pid {pid}"))
            }),
            "worker {pid} not in the evidence: {evidence:?}"
        );
    }
    assert!(
        first_come >= size * 19 / 20 && first_come <= size * 21 / 20,
        "the workers' first-come mapped bytes, {first_come}, are not the file's {size} once"
    );
}

/// A Hugging Face table saved in shards (`save_to_disk` with a
/// `max_shard_size`: 7 Arrow files of 23 MB), all mapped by the trainer's
/// `load_from_disk` before its DataLoader forks 4 workers, which read
/// every row once: each shard is named in the workers' files, what they
/// mapped of it first its size within 5 %, and no shard's pages count
/// under another file (a descriptor number that another open took before
/// the lookup named a shard by a semaphore's temporary file).
#[test]
fn every_shard_of_a_sharded_datasets_table_is_named_in_the_workers() {
    let path = torch_and_datasets_path();
    let (run, t) = table_job("hf-shards", "hf_arrow.py", Some(&path), &["40000", "24"], "loader", 4, 100);
    let shards = t["files"].as_object().unwrap();
    assert_eq!(shards.len(), 7, "{t}");
    for (shard, size) in shards {
        let size = size.as_u64().unwrap();
        let mut first_come = 0;
        for w in t["workers"].as_array().unwrap() {
            let pid = w.as_u64().unwrap();
            assert_eq!(run.process(pid)["role"], "worker", "{}", run.process(pid));
            first_come += run.file(pid, Path::new(shard))["mmap_bytes"].as_u64().unwrap();
        }
        eprintln!("{shard}: {first_come} of {size} bytes mapped first by the workers");
        assert!(
            first_come >= size * 19 / 20 && first_come <= size * 21 / 20,
            "{shard}: the workers mapped {first_come} bytes of its {size} first"
        );
    }
    for w in t["workers"].as_array().unwrap() {
        let p = run.process(w.as_u64().unwrap());
        for f in p["files"].as_array().unwrap() {
            let mapped = f["mmap_bytes"].as_u64().unwrap_or(0) + f["mmap_shared_bytes"].as_u64().unwrap_or(0);
            let path = f["path"].as_str().unwrap();
            assert!(!path.starts_with("/dev/shm/") || mapped < 1 << 20, "{path}: {mapped} bytes mapped: {f}");
        }
    }
}

/// The ordinary Hugging Face `datasets` job: `load_from_disk` (pyarrow reads
/// the Arrow file ahead into the page cache), `.with_format("torch")` handed
/// straight to a DataLoader of 4 workers, and a trainer that takes a CPU
/// step per batch: `trainer-host-bound`, its line naming the Arrow file and
/// what the workers took of it after the startup, the rows received since
/// within 5 % of its size; all they mapped, the file's size within 5 %
/// (each row is read once, by one worker, though the kernel maps the large
/// folios at the ends of each worker's batches into its neighbour too).
#[test]
fn a_datasets_table_under_a_dataloader_names_what_the_workers_read() {
    // 62,000 rows of 4 KiB: a 255 MB table.
    // pyarrow's read-ahead at 100 MB/s (2.5 s): the steady state after it
    // is judged only where it ended in the first half of the run since the
    // trainer began to read, and at 40 MB/s (6.4 s) the workers' 7-10 s
    // came out as short as that beside another test.
    let (run, t) = datasets_job("hf-loader", 62000, "loader", 4, 100);
    workers_read_the_table("datasets loader", &run, &t, 4);
}

/// The same shape with the standard library alone, so that it runs in the
/// kernel VMs too (tests/workloads/mapped_table.py): a table file the
/// trainer maps and reads ahead before it forks 4 multiprocessing workers,
/// which fault their batches' rows in through that mapping and send a few
/// bytes back over a queue, while the trainer takes a pure-Python step per
/// batch: `trainer-host-bound`, its line naming the table and what the
/// workers took of it after the startup, as the datasets job's.
#[test]
fn a_table_mapped_before_fork_under_process_workers_names_what_they_read() {
    // 6,144 rows of 4 KiB: a 25 MB table.
    let (run, t) = table_job("mapped-table", "mapped_table.py", None, &["6144"], "run", 4, 40);
    workers_read_the_table("mapped table", &run, &t, 4);
}

/// What a job of `table_job` with `workers` workers must show: each worker
/// a worker; the bytes they mapped of the truth's one table file summing to
/// its size within 5 %; `trainer-host-bound`, its line naming the file and
/// the workers' MB of it in the steady state it judges: the rows the
/// trainer received after the startup set apart (`startup_s`; the trainer's
/// first steps may load code a second or two after the workers started),
/// within 5 % of the table's size (the workers read two batches ahead, and
/// the truth's clock starts with the interpreter, some 50 ms after stall's).
fn workers_read_the_table(what: &str, run: &Run, t: &Value, n: usize) {
    let (table, size) = t["files"].as_object().unwrap().iter().next().expect("a table file");
    let size = size.as_u64().unwrap() as f64;
    let workers = t["workers"].as_array().unwrap();
    assert_eq!(workers.len(), n, "{t}");
    let mut mapped = 0;
    for w in workers {
        let pid = w.as_u64().unwrap();
        assert_eq!(run.process(pid)["role"], "worker", "{}", run.process(pid));
        mapped += run.file(pid, Path::new(table))["mmap_bytes"].as_u64().unwrap();
    }
    let line = summary_line(run);
    let startup = run.summary()["startup_s"].as_f64().unwrap_or(0.0);
    let rows = t["rows"].as_u64().unwrap() as f64;
    let received_by = |secs: f64| {
        t["received"]
            .as_array()
            .unwrap()
            .iter()
            .take_while(|r| r[0].as_f64().unwrap() <= secs)
            .last()
            .map_or(0.0, |r| r[1].as_f64().unwrap())
    };
    let steady = size * (rows - received_by(startup)) / rows;
    eprintln!(
        "{what}: the workers mapped {mapped} bytes of {table} ({size} bytes); startup {startup} s, \
         {steady} bytes of rows received after it; {line}"
    );
    assert!((mapped as f64 - size).abs() <= 0.05 * size, "the workers mapped {mapped} bytes of {size}");
    assert_eq!(kind(run), "trainer-host-bound", "{line}");
    // Set-up ends in the first half of the run after the pipeline started.
    assert!(steady >= size / 2.0, "startup set apart at {startup} s, after most rows: {}", t["received"]);
    // "…; its 4 workers read 255 MB meanwhile (/…/data-00000-of-00001.arrow 255 MB)"
    assert!(line.contains(&format!("; its {n} workers read ")), "{line}");
    let named = line
        .split_once(&format!("({table} "))
        .and_then(|(_, rest)| rest.split_once(" MB"))
        .and_then(|(n, _)| n.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("the line names no bytes of {table}: {line}"));
    assert!(
        (named * 1e6 - steady).abs() <= 0.05 * size,
        "the line says {named} MB of {table} ({size} bytes), {steady} bytes of rows came after the startup"
    );
}

/// Four workers fetch their 4 MiB samples over HTTP (one connection per
/// sample, as urlopen does) from a server outside the job paced to 8 MB/s:
/// input-io-bound, naming the server; the bytes the workers received from
/// it match what it sent, per connection and in all.
#[test]
fn workers_fetching_samples_from_a_slow_server_are_input_io_bound_naming_it() {
    require_root();
    let dir = Scratch::new("net");
    let script = workload("net_loader.py");
    let truth_path = dir.path("truth.json");
    let server = Server::start(&dir);
    let port = server.port.clone();
    let (workers, samples) = (4, 16);
    let argv = [
        "run",
        "-q",
        "--",
        python(),
        script.as_str(),
        "load",
        port.as_str(),
        &workers.to_string(),
        &samples.to_string(),
        truth_path.to_str().unwrap(),
    ];
    let run = stall(&argv, &[], Duration::from_secs(240));
    let sent = server.sent_bytes();
    assert_eq!(run.status, 0, "stall run failed:\n{}", run.stderr);
    let t: Value = truth(&truth_path);
    let peer = format!("127.0.0.1:{port}");
    let mut received = 0;
    for (pid, body) in t["workers"].as_object().unwrap() {
        let p = run.process(pid.parse().unwrap());
        assert_eq!(p["role"], "worker", "{p}");
        let s = p["sockets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["peer"] == peer.as_str())
            .unwrap_or_else(|| panic!("worker {pid}: no socket to {peer}: {}", p["sockets"]));
        assert_eq!(s["ipc"], false, "{s}");
        assert_eq!(s["connects"], samples / workers, "{s}");
        let got = s["read_bytes"].as_u64().unwrap();
        assert!(got >= body.as_u64().unwrap(), "worker {pid}: {got} bytes received, its bodies alone {body}");
        assert!(p["read_bytes"].as_u64().unwrap() < got / 100, "socket bytes are not file reads: {p}");
        received += got;
    }
    let line = run.summary()["verdict"]["summary"].as_str().unwrap();
    eprintln!("network: workers received {received} bytes, the server sent {sent}; {line}");
    assert!((received as f64 - sent as f64).abs() <= 0.05 * sent as f64, "received {received}, sent {sent}");
    assert_eq!(run.summary()["verdict"]["kind"], "input-io-bound", "{line}");
    assert!(line.contains(&format!(" from {peer} at ")) && line.contains("waiting on it"), "{line}");
}

/// The same workers with a pooled keep-alive connection each, connected
/// (and used once) before `stall attach` comes: the connections are found
/// at attach and named by their peer, and what the workers receive on them
/// afterwards matches what the server sent for the samples.
#[test]
fn connections_made_before_attach_are_followed() {
    require_root();
    let dir = Scratch::new("net-attach");
    let script = workload("net_loader.py");
    let (truth_path, gate) = (dir.path("truth.json"), dir.path("go"));
    let server = Server::start(&dir);
    let port = server.port.clone();
    let mut job = std::process::Command::new(python())
        .args([
            script.as_str(),
            "load",
            port.as_str(),
            "2",
            "8",
            truth_path.to_str().unwrap(),
            gate.to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(job.stdout.take().unwrap()), &mut line).unwrap();
    let trainer = line.trim().strip_prefix("PID ").expect("the job's PID line").to_string();
    let mut job = Killer(vec![job]);
    let mut attached = Attached::start(&["--pid", trainer.as_str()]);
    attached.wait_tracing();
    std::fs::write(&gate, "").unwrap();
    let run = attached.finish(Duration::from_secs(120));
    assert!(wait_child(&mut job.0[0], Duration::from_secs(10)).is_some_and(|s| s.success()));
    let sent = server.sent_bytes();
    let t: Value = truth(&truth_path);
    let peer = format!("127.0.0.1:{port}");
    let mut received = 0;
    for pid in t["workers"].as_object().unwrap().keys() {
        let p = run.process(pid.parse().unwrap());
        let s = p["sockets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["peer"] == peer.as_str())
            .unwrap_or_else(|| panic!("worker {pid}: its connection to {peer} not found: {p}"));
        // One connection, found at attach, whatever number of samples.
        assert_eq!(s["connects"], 1, "{s}");
        received += s["read_bytes"].as_u64().unwrap();
    }
    eprintln!(
        "pooled: workers received {received} bytes after attach, the server sent {sent} for the samples"
    );
    assert!((received as f64 - sent as f64).abs() <= 0.05 * sent as f64, "received {received}, sent {sent}");
}

/// The paced HTTP server of tests/workloads/net_loader.py (8 MB/s), standing
/// for an object store: outside the job, not traced.
struct Server {
    child: Killer,
    port: String,
    stats: std::path::PathBuf,
}

impl Server {
    fn start(dir: &Scratch) -> Self {
        let (port_file, stats) = (dir.path("port"), dir.path("stats.json"));
        let child = Killer(vec![std::process::Command::new(python())
            .args([workload("net_loader.py").as_str(), "serve", port_file.to_str().unwrap(), "8"])
            .arg(&stats)
            .spawn()
            .unwrap()]);
        wait_until("the server's port", Duration::from_secs(30), || port_file.exists());
        let port = std::fs::read_to_string(&port_file).unwrap();
        Self { child, port, stats }
    }

    /// Stops it; the bytes it sent for samples (warm-ups apart).
    fn sent_bytes(mut self) -> u64 {
        stop(&mut self.child.0[0], nix::sys::signal::Signal::SIGTERM);
        wait_until("the server's count", Duration::from_secs(10), || self.stats.exists());
        truth(&self.stats)["sent_bytes"].as_u64().unwrap()
    }
}

/// A mounted stall-slowfs (a read-only FUSE filesystem that answers at a
/// set pace, as s3fs, gcsfuse or a cluster's FUSE client does), unmounted
/// and stopped when dropped.
struct SlowFs {
    server: std::process::Child,
    pid: u64,
    mountpoint: std::path::PathBuf,
}

impl SlowFs {
    fn mount(source: &Path, mountpoint: &Path, mbps: u32) -> Self {
        use std::io::{BufRead, BufReader};
        std::fs::create_dir_all(mountpoint).unwrap();
        let mut server = Command::new(env!("CARGO_BIN_EXE_stall-slowfs"))
            .arg(source)
            .arg(mountpoint)
            .arg(mbps.to_string())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("stall-slowfs");
        let mut line = String::new();
        BufReader::new(server.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        let pid = line.trim().strip_prefix("ready ").and_then(|p| p.parse().ok());
        let pid = pid.unwrap_or_else(|| panic!("stall-slowfs did not mount: {line:?}"));
        Self { server, pid, mountpoint: mountpoint.to_path_buf() }
    }
}

impl Drop for SlowFs {
    fn drop(&mut self) {
        stop(&mut self.server, nix::sys::signal::Signal::SIGTERM);
        // Where the server could not unmount (killed), nobody else will.
        let _ = nix::mount::umount2(&self.mountpoint, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// DataLoader workers read 4 shards of 8 MB from a FUSE filesystem that
/// answers at 8 MB/s. None of the bytes pass the block layer, so none
/// count as read from storage; that is no page cache serving them: the
/// verdict names the FUSE filesystem, and its server as what answered the
/// workers' reads, and each file is marked with its filesystem.
#[test]
fn workers_reading_a_slow_fuse_mount_name_the_filesystem_and_its_server() {
    require_root();
    let s = disk_scratch("fuse");
    let source = s.path("source");
    let _ = stall_tests::workload::shards(&source, 4, 8, 8);
    let fs = SlowFs::mount(&source, &s.path("mnt"), 8);
    let t_path = s.path("truth.json");
    let mnt = fs.mountpoint.to_str().unwrap().to_string();
    let job = stall_tests::workload::workload(&[
        "--mode",
        "io",
        "--cache-dir",
        &mnt,
        "--files",
        "4",
        "--file-mb",
        "8",
        "--workers",
        "2",
        "--throttle-mbps",
        "0",
        "--start-delay",
        "0",
        "--truth",
        t_path.to_str().unwrap(),
    ]);
    let mut argv = vec!["run", "-q", "--"];
    argv.extend(job.iter().map(String::as_str));
    let run = stall(&argv, &[], Duration::from_secs(180));
    assert_eq!(run.status, 0, "stall run failed:\n{}", run.stderr);
    let t = truth(&t_path);
    let line = summary_line(&run);
    eprintln!("fuse: {}: {line}", kind(&run));
    let want = t["read_bytes"].as_u64().unwrap();
    assert_eq!(want, 32_000_000, "4 shards of 8 MB: {t}");
    // The mount's type as the kernel shows it (`fuse`, or `fuse.slowfs`
    // where the mount gave a subtype).
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let fstype = mountinfo
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some(mnt.as_str()))
        .and_then(|l| l.split_once(" - ")?.1.split_whitespace().next())
        .unwrap_or_else(|| panic!("{mnt} not in the mount table"))
        .to_string();
    assert!(fstype.starts_with("fuse"), "{fstype}");
    // Every byte, in files marked as the FUSE filesystem's.
    let on_fuse: u64 = run
        .processes()
        .iter()
        .flat_map(|p| p["files"].as_array().unwrap())
        .filter(|f| f["path"].as_str().is_some_and(|p| p.starts_with(&mnt)))
        .map(|f| {
            assert_eq!(f["filesystem"], fstype.as_str(), "{f}");
            f["read_bytes"].as_u64().unwrap()
        })
        .sum();
    assert_eq!(on_fuse, want, "bytes read from the mount");
    assert_eq!(kind(&run), "input-io-bound", "{line}");
    assert!(line.contains(&format!("from {fstype}, a FUSE filesystem")), "{line}");
    assert!(line.contains(&format!("the reads answered by pid {} (", fs.pid)), "{line}");
    assert!(!line.contains("page cache,") && !line.contains("from the page cache"), "{line}");
}
