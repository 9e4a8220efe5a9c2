//! Causes beyond the local DataLoader, with real PyTorch where the cause
//! involves it: a trainer stalled by its synchronous checkpoints.
//!
//! Needs root; PyTorch comes from `$STALL_TORCH_PATH` (`cargo xtask test`
//! installs it).

use std::{path::Path, time::Duration};

use serde_json::Value;
use stall_tests::*;

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
