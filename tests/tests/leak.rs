//! No BPF program outlives stall: not after a normal exit, not after
//! SIGTERM, not after SIGKILL. (Its own test binary: cargo runs test
//! binaries one at a time, so no other stall is loaded meanwhile.)
use std::{
    process::{Command, Stdio},
    thread::sleep,
    time::Duration,
};

use stall_tests::stall::{bpf_programs_of, require_root, stall_bin, still_loaded, STALL_PROGRAMS};

#[test]
fn nothing_is_left_behind() {
    require_root();
    for signal in ["INT", "TERM", "KILL"] {
        let child = Command::new(stall_bin())
            .args(["attach", "--gpu", "off", "-q", "--pid", &std::process::id().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Wait until its programs are in (all held through the process's
        // descriptors).
        let mut ours = Vec::new();
        for _ in 0..100 {
            ours = bpf_programs_of(child.id());
            if ours.len() >= STALL_PROGRAMS {
                break;
            }
            sleep(Duration::from_millis(50));
        }
        assert!(ours.len() >= STALL_PROGRAMS, "stall never loaded its programs ({ours:?})");
        Command::new("kill").arg(format!("-{signal}")).arg(child.id().to_string()).status().unwrap();
        let out = child.wait_with_output().unwrap();
        if signal != "KILL" {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success(),
                "stall exits cleanly on SIG{signal}: {}; stderr: {err}",
                out.status
            );
        }
        let mut left = still_loaded(&ours);
        for _ in 0..40 {
            if left.is_empty() {
                break;
            }
            sleep(Duration::from_millis(50));
            left = still_loaded(&ours);
        }
        assert!(left.is_empty(), "after SIG{signal}, still loaded: {left:?}");
    }
}
