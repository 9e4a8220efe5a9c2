//! A ring buffer too small for the job's events: stall counts what it lost
//! and says so. A binary of its own: the flood (200000 opens, a ring-buffer
//! wakeup per record) must not run beside the capture suite's timing checks
//! (see docs/KERNELS.md, "Known problems").
use std::time::Duration;

use stall_tests::scratch::Scratch;
use stall_tests::stall::stall;
use stall_tests::workload::{jobs_py, python};

#[test]
fn tiny_ring_buffer_loses_events_and_says_so() {
    let s = Scratch::new("overflow");
    let f = s.file("o.bin", 10);
    let truth_path = s.path("truth.json");
    let (py, jobs) = (python().to_string(), jobs_py().to_str().unwrap().to_string());
    let args = [
        "run",
        "-q",
        "--ringbuf-bytes",
        "4096",
        "--",
        &py,
        &jobs,
        "many-opens",
        f.to_str().unwrap(),
        "200000",
    ];
    let run = stall(&args, &[("TRUTH", truth_path.as_path())], Duration::from_secs(90));
    assert_eq!(run.status, 0, "{}", run.stderr);
    let sum = run.summary();
    assert!(sum["lost_events"].as_u64().unwrap() > 0, "{}", sum["lost_by_cause"]);
    assert!(sum["lost_by_cause"]["ringbuf_full"].as_u64().unwrap() > 0);
    assert_eq!(sum["partial"], true);
    assert!(sum["verdict"]["summary"].as_str().unwrap().contains("partial"));
    assert!(run.stdout.contains("events were lost"), "{}", run.stdout);
}
