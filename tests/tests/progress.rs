//! Progress, not utilization: jobs whose GPU (scripted NVML) reports busy,
//! one hung, one working; stall must tell them apart from what the job
//! reads and writes, its own rhythm, and the GPU's power.
use std::{
    path::Path,
    process::Command,
    thread::sleep,
    time::{Duration, SystemTime},
};

use serde_json::{json, Value};
use stall_tests::gpu::ScriptedGpu;
use stall_tests::procs::{run_with_timeout, spawn_announcing, wait_until};
use stall_tests::scratch::Scratch;
use stall_tests::stall::require_root;
use stall_tests::workload::{jobs_py, python, secs, truth};

/// One 700 W device at `util` % drawing `power_mw`, held by the process
/// whose pid is in `pid_file`.
fn busy_gpu(gpu: &ScriptedGpu, util: u32, power_mw: u32, pid_file: &Path) {
    gpu.update(&json!({"devices": [{
        "name": "Scripted H200",
        "mem_total_bytes": 150_000_000_000u64,
        "power_limit_mw": 700_000,
        "phases": [{"util_pct": util, "power_mw": power_mw, "mem_used_bytes": 40_000_000_000u64,
                    "processes": [{"pid_file": pid_file, "used_mem_bytes": 40_000_000_000u64, "sm_util_pct": util}]}],
    }]}));
}

fn records(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("each JSON line parses"))
        .collect()
}

fn kind(r: &Value) -> &str {
    r["verdict"]["kind"].as_str().unwrap()
}

/// The DFlash incident: a trainer logged its steps, then sat in a futex
/// forever while NVML said 100 % busy (at 95 W of 700 W). stall attaches
/// after the log went stale.
#[test]
fn a_job_hung_behind_a_busy_gpu_is_a_hang_naming_its_stale_log() {
    require_root();
    let s = Scratch::new("dflash");
    let log = s.path("train.log");
    let truth_path = s.path("truth.json");
    let gpu = ScriptedGpu::new(&json!(null));
    let pid_file = gpu.path("trainer.pid");
    busy_gpu(&gpu, 100, 95_000, &pid_file);
    let (mut job, pid) = spawn_announcing(
        Command::new(python())
            .arg(jobs_py())
            .args(["log-then-hang", log.to_str().unwrap(), "6", "0.2"])
            .env("PID_FILE", &pid_file)
            .env("TRUTH", &truth_path),
    );
    wait_until("the job to write its last line", Duration::from_secs(30), || truth_path.exists());
    // The log goes stale for a while before anyone looks.
    sleep(Duration::from_secs(3));
    let mut c = gpu.command("attach");
    c.args(["--pid", &pid.to_string(), "--duration", "12", "--interval", "1", "--json", "-"]);
    let out = run_with_timeout(c, Duration::from_secs(60));
    let _ = job.kill();
    let _ = job.wait();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let recs = records(&out.stdout);
    let summary = recs.iter().rev().find(|r| r["type"] == "summary").expect("a summary");
    let verdict = &summary["verdict"];
    assert_eq!(kind(summary), "hang", "{verdict}");
    let text = verdict["summary"].as_str().unwrap();
    let log_path = log.to_str().unwrap();
    for want in
        ["reports 100% busy at 95 W of 700 W", "nothing progressed for", log_path, "last written", "futex"]
    {
        assert!(text.contains(want), "{want:?} not in: {text}");
    }
    // The silence is dated from the log's mtime, from before stall came.
    let last_write = truth(&truth_path)["last_write"].as_f64().unwrap();
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs_f64();
    let progress = &summary["progress"];
    assert_eq!(progress["known"], true, "{progress}");
    assert_eq!(progress["last_output"]["path"], log_path, "{progress}");
    assert_eq!(progress["last_output"]["pid"], u64::from(pid), "{progress}");
    let silent = secs(&progress["silent_s"]);
    assert!(
        silent >= 14.0 && silent <= now - last_write + 0.5,
        "silent {silent} s, log written {:.1} s ago",
        now - last_write
    );
    assert!((secs(&progress["last_output"]["ago_s"]) - silent).abs() < 0.5, "{progress}");
    // Called out once the silence passed 10 s (within two intervals), and
    // not before: until then the busy GPU is believed.
    let intervals: Vec<&Value> = recs.iter().filter(|r| r["type"] == "interval").collect();
    for r in &intervals {
        let silent = secs(&r["progress"]["silent_s"]);
        if silent < 10.0 {
            assert_eq!(kind(r), "gpu-busy", "silent {silent} s: {}", r["verdict"]);
        }
    }
    let first_hang = intervals.iter().find(|r| kind(r) == "hang").expect("a live hang verdict");
    let at = secs(&first_hang["progress"]["silent_s"]);
    assert!((10.0..13.0).contains(&at), "hang called at {at} s of silence");
    // The GPU's power is in the JSON.
    let g = &summary["gpus"][0];
    assert!((secs(&g["power_w"]) - 95.0).abs() < 1.0 && secs(&g["power_limit_w"]) == 700.0, "{g}");
}

/// A healthy trainer that waits on its GPU and logs only every 12 s, with
/// the GPU at 650 W: gpu-busy throughout, never a hang, though it is
/// silent longer than the 10 s floor.
#[test]
fn a_job_silent_between_log_lines_on_a_gpu_at_high_power_stays_gpu_busy() {
    require_root();
    let s = Scratch::new("sync");
    let log = s.path("train.log");
    let gpu = ScriptedGpu::new(&json!(null));
    let pid_file = gpu.path("trainer.pid");
    busy_gpu(&gpu, 100, 650_000, &pid_file);
    let mut c = gpu.command("run");
    c.args(["--interval", "1", "--json", "-", "--"])
        .arg(python())
        .arg(jobs_py())
        .args(["log-every", log.to_str().unwrap(), "12", "26"])
        .env("PID_FILE", &pid_file);
    let out = run_with_timeout(c, Duration::from_secs(90));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let recs = records(&out.stdout);
    let summary = recs.iter().rev().find(|r| r["type"] == "summary").expect("a summary");
    assert_eq!(kind(summary), "gpu-busy", "{}", summary["verdict"]);
    assert!(
        summary["verdict"]["summary"].as_str().unwrap().contains("at 650 W of 700 W"),
        "{}",
        summary["verdict"]
    );
    let intervals: Vec<&Value> = recs.iter().filter(|r| r["type"] == "interval").collect();
    assert!(intervals.len() >= 20, "{} intervals", intervals.len());
    let max_silence = intervals.iter().map(|r| secs(&r["progress"]["silent_s"])).fold(0.0, f64::max);
    assert!(max_silence > 10.5, "the job was silent {max_silence} s at most: the test needs more than 10");
    for r in &intervals {
        assert_ne!(kind(r), "hang", "at {} s: {}", r["elapsed_s"], r["verdict"]);
    }
    // The log's writes are counted per file, and its rhythm learnt.
    let trainer = summary["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["files"].as_array().unwrap().iter().any(|f| f["path"] == log.to_str().unwrap()))
        .expect("the trainer with its log");
    let f = trainer["files"].as_array().unwrap().iter().find(|f| f["path"] == log.to_str().unwrap()).unwrap();
    let on_disk = std::fs::metadata(&log).unwrap().len();
    assert_eq!(f["write_bytes"], on_disk, "{f}");
    assert_eq!(f["write_calls"], 3, "{f}");
    assert!((secs(&summary["progress"]["rhythm_s"]) - 12.0).abs() < 1.5, "{}", summary["progress"]);
}
