//! The workloads stall is tested against: the Python that runs them, their
//! scripts and arguments, and the ground truth they write.

use crate::procs::run_with_timeout;
use serde_json::Value;
use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
    time::Duration,
};

/// A Python interpreter that is a real binary (not a shell shim), so the
/// traced tree holds only the workload.
pub fn python() -> &'static str {
    static PY: OnceLock<String> = OnceLock::new();
    PY.get_or_init(|| {
        for p in ["/usr/bin/python3", "/usr/local/bin/python3"] {
            if Path::new(p).exists() {
                return p.to_string();
            }
        }
        let out = Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .expect("python3 is needed by the workloads");
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    })
}

pub fn jobs_py() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/jobs.py")
}

/// The demo job (`demo/workload.py`), for scenarios.
pub fn workload_py() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join("demo/workload.py")
}

/// `python3 demo/workload.py ARGS...`
pub fn workload(args: &[impl AsRef<str>]) -> Vec<String> {
    let mut v = vec![python().to_string(), workload_py().to_str().unwrap().to_string()];
    v.extend(args.iter().map(|s| s.as_ref().to_string()));
    v
}

/// Generates the job's sample files (untraced), so that a traced run only
/// reads them, and returns the workload arguments that read them at `mbps`:
/// one place for the numbers, so the files and the run always agree.
pub fn shards(cache: &Path, files: u32, mb: u32, mbps: u32) -> Vec<String> {
    let shard = [
        "--cache-dir".to_string(),
        cache.to_str().unwrap().to_string(),
        "--files".into(),
        files.to_string(),
        "--file-mb".into(),
        mb.to_string(),
    ];
    let mut cmd = Command::new(python());
    cmd.arg(workload_py()).arg("--prepare-only").args(&shard);
    let out = run_with_timeout(cmd, Duration::from_secs(120));
    assert!(out.status.success(), "preparing files: {}", String::from_utf8_lossy(&out.stderr));
    let mut args = shard.to_vec();
    args.extend(["--throttle-mbps".to_string(), mbps.to_string()]);
    args
}

/// Lets a workload waiting on `go` (see jobs.py `wait_go`) proceed.
pub fn release(go: &Path) {
    std::fs::write(go, b"go").unwrap();
}

/// Reads the truth file a workload wrote.
pub fn truth(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("workload wrote no truth at {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

pub fn secs(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// A wait's time as the `waits` workload measured it, less the kernel's
/// runqueue wait over the same span (`NAME_blocked_s`, where the kernel
/// keeps schedstats; else the wall time `NAME_s`): what stall counts as
/// that wait, the rest being runqueue time.
pub fn blocked_s(truth: &Value, name: &str) -> f64 {
    match truth.get(format!("{name}_blocked_s")) {
        Some(v) => secs(v),
        None => secs(&truth[format!("{name}_s")]),
    }
}
