//! No BPF program outlives stall: not after a normal exit, not after
//! SIGTERM, not after SIGKILL. (Its own test binary: cargo runs test
//! binaries one at a time, so no other stall is loaded meanwhile.)
use std::{
    process::{Command, Stdio},
    thread::sleep,
    time::Duration,
};

use stall_tests::*;

/// Names of loaded programs that are stall's (names are cut at 15 bytes).
fn stall_programs() -> Vec<String> {
    const OURS: [&str; 8] = [
        "sched_switch",
        "sched_waking",
        "task_newtask",
        "sched_process_e",
        "sys_enter_opena",
        "sys_exit_openat",
        "sys_enter_close",
        "sys_enter_read_",
    ];
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter_map(|p| p.name_as_str().map(str::to_string))
        .filter(|n| OURS.iter().any(|o| n.starts_with(o)) || n.starts_with("sys_exit_read_f"))
        .collect()
}

#[test]
fn nothing_is_left_behind() {
    require_root();
    assert!(stall_programs().is_empty(), "stall programs loaded before the test: {:?}", stall_programs());
    for signal in [None, Some("TERM"), Some("KILL")] {
        let mut child = Command::new(stall_bin())
            .args(["attach", "--gpu", "off", "-q", "--pid", &std::process::id().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Wait until its programs are in.
        let mut loaded = false;
        for _ in 0..100 {
            if stall_programs().len() >= 8 {
                loaded = true;
                break;
            }
            sleep(Duration::from_millis(50));
        }
        assert!(loaded, "stall never loaded its programs ({:?})", stall_programs());
        match signal {
            Some(sig) => {
                Command::new("kill").arg(format!("-{sig}")).arg(child.id().to_string()).status().unwrap();
            }
            None => {
                Command::new("kill").arg("-INT").arg(child.id().to_string()).status().unwrap();
            }
        }
        let status = child.wait().unwrap();
        if signal != Some("KILL") {
            assert!(status.success(), "stall exits cleanly on {signal:?}: {status}");
        }
        let mut left = stall_programs();
        for _ in 0..40 {
            if left.is_empty() {
                break;
            }
            sleep(Duration::from_millis(50));
            left = stall_programs();
        }
        assert!(left.is_empty(), "after {signal:?}, still loaded: {left:?}");
    }
}
