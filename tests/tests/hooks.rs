//! The syscall hooks' backends: `auto` picks trampolines (fentry/fexit on
//! the hooked syscalls) where the kernel allows them and the raw syscall
//! tracepoints elsewhere, says which, and a refused `trampoline` exits 5;
//! under trampolines an untraced process's other syscalls run none of
//! stall's programs (BPF run counts, `kernel.bpf_stats_enabled`).
//!
//! The VM suite runs these with trampolines forced (`STALL_SYSCALL_HOOKS`)
//! where the kernel allows them (6.1, 6.12), then on the tracepoints; the
//! host and 5.10 with whatever `auto` finds.
use std::{
    collections::BTreeMap,
    io::Write,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use stall_tests::procs::wait_until;
use stall_tests::scratch::Scratch;
use stall_tests::stall::{require_root, stall, stall_bin};
use stall_tests::workload::python;

/// `bpf_prog_type` values (uapi/linux/bpf.h).
const BPF_PROG_TYPE_RAW_TRACEPOINT: u32 = 17;
const BPF_PROG_TYPE_TRACING: u32 = 26;

/// Numbers for the log even when the test passes (libtest captures only
/// the print macros).
fn note(text: &str) {
    let _ = writeln!(std::io::stderr(), "{text}");
}

#[test]
fn auto_picks_trampolines_where_allowed_and_a_refused_trampoline_exits_5() {
    let forced =
        stall(&["run", "--syscall-hooks", "trampoline", "--", "true"], &[], Duration::from_secs(120));
    let auto = stall(&["run", "--syscall-hooks", "auto", "--", "true"], &[], Duration::from_secs(120));
    assert_eq!(auto.status, 0, "{}", auto.stderr);
    let picked =
        auto.summary()["syscall_backend"].as_str().expect("syscall_backend in the summary").to_string();
    let header = format!("syscall hooks: {picked}");
    assert!(auto.stdout.contains(&header), "the report names the backend: {}", auto.stdout);
    if forced.status == 0 {
        assert_eq!(forced.summary()["syscall_backend"], "trampoline");
        assert_eq!(picked, "trampoline", "auto uses the trampolines the kernel allows");
    } else {
        assert_eq!(forced.status, 5, "a refused trampoline is an unsupported kernel: {}", forced.stderr);
        let lines: Vec<&str> = forced.stderr.lines().filter(|l| !l.contains("no NVML")).collect();
        assert_eq!(lines.len(), 1, "one line: {}", forced.stderr);
        assert!(lines[0].contains("syscall trampolines"), "{}", lines[0]);
        assert_eq!(picked, "tracepoint", "auto falls back where trampolines are refused");
        assert!(auto.stdout.contains("syscall trampolines"), "and says why: {}", auto.stdout);
        assert!(!auto.stdout.contains("Operation not permitted"), "as a fact: {}", auto.stdout);
    }
    let tracepoint =
        stall(&["run", "--syscall-hooks", "tracepoint", "--", "true"], &[], Duration::from_secs(120));
    assert_eq!(tracepoint.status, 0, "{}", tracepoint.stderr);
    assert_eq!(tracepoint.summary()["syscall_backend"], "tracepoint");
    note(&format!("hooks: trampoline forced exits {}, auto picks {picked}", forced.status));
}

/// Run counts of process `pid`'s BPF programs, summed by program type
/// (from /proc/PID/fdinfo: `prog_type`, `run_cnt`), and how many of each.
fn run_counts(pid: u32) -> BTreeMap<u32, (u64, u32)> {
    let mut out: BTreeMap<u32, (u64, u32)> = BTreeMap::new();
    let mut seen = std::collections::HashSet::new();
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else { return out };
    for e in rd.filter_map(Result::ok) {
        let Ok(text) = std::fs::read_to_string(e.path()) else { continue };
        let field = |name: &str| -> Option<u64> {
            text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
        };
        let (Some(id), Some(kind), Some(runs)) = (field("prog_id"), field("prog_type"), field("run_cnt"))
        else {
            continue;
        };
        if seen.insert(id) {
            let slot = out.entry(kind as u32).or_default();
            slot.0 += runs;
            slot.1 += 1;
        }
    }
    out
}

fn grown(before: &BTreeMap<u32, (u64, u32)>, after: &BTreeMap<u32, (u64, u32)>, kind: u32) -> u64 {
    let get = |m: &BTreeMap<u32, (u64, u32)>| m.get(&kind).map_or(0, |v| v.0);
    get(after).saturating_sub(get(before))
}

/// Restores `kernel.bpf_stats_enabled` when dropped.
struct BpfStats(String);

impl BpfStats {
    const PATH: &'static str = "/proc/sys/kernel/bpf_stats_enabled";

    fn enable() -> Self {
        let old = std::fs::read_to_string(Self::PATH).expect("kernel.bpf_stats_enabled").trim().to_string();
        std::fs::write(Self::PATH, "1").expect("enabling BPF run counts");
        BpfStats(old)
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::PATH, &self.0);
    }
}

const CALLS: u64 = 100_000;

#[test]
fn untraced_getpid_runs_no_trampoline_but_every_raw_tracepoint() {
    require_root();
    let s = Scratch::new("runcnt");
    let ready = s.path("ready");
    let json = s.path("out.json");
    let _stats = BpfStats::enable();
    let mut cmd = Command::new(stall_bin());
    cmd.args(["run", "-q", "--gpu", "off", "--json"])
        .arg(&json)
        .args(["--", "sh", "-c", &format!("echo up > {}; exec sleep 120", ready.display())])
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    let mut stall = cmd.spawn().expect("start stall");
    let pid = stall.id();
    // The command runs once stall has attached everything.
    wait_until("the traced command", Duration::from_secs(120), || ready.exists());
    let before = run_counts(pid);
    let untraced = Command::new(python())
        .args(["-c", &format!("import os\nfor _ in range({CALLS}): os.getpid()")])
        .status()
        .expect("the untraced process");
    assert!(untraced.success());
    let after = run_counts(pid);
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM);
    // `stall run` exits with the command's status: 143 for the TERM it forwards.
    let status = stall.wait().unwrap();
    assert!(matches!(status.code(), Some(0 | 143)), "stall: {status}");
    let text = std::fs::read_to_string(&json).unwrap();
    let summary: serde_json::Value = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .rfind(|r| r["type"] == "summary")
        .expect("a summary");
    let backend = summary["syscall_backend"].as_str().unwrap().to_string();
    let tracing = grown(&before, &after, BPF_PROG_TYPE_TRACING);
    let raw = grown(&before, &after, BPF_PROG_TYPE_RAW_TRACEPOINT);
    note(&format!(
        "run counts ({backend}) over {CALLS} getpid() of an untraced process: \
         trampoline programs +{tracing}, raw tracepoint programs +{raw}; before {before:?}, after {after:?} \
         (type: (runs, programs))"
    ));
    match backend.as_str() {
        "trampoline" => {
            // And two on the mapping-fault functions where the kernel lacks
            // their tracepoints.
            let fault_trampolines = if summary["mmap_hooks"] == "trampoline" { 2 } else { 0 };
            let programs = after.get(&BPF_PROG_TYPE_TRACING).map_or(0, |v| v.1);
            // 37: the read, write, open, dup, close and socket families'
            // functions, per side (capture/hooks/syscalls.rs).
            assert_eq!(programs, 37 + fault_trampolines, "stall holds its 37 syscall trampolines: {after:?}");
            // Only the hooked syscalls of the machine run them (the agent's
            // own reads, the test harness): not one per getpid.
            assert!(tracing < CALLS / 10, "trampolines ran {tracing} times over {CALLS} getpid()");
            assert!(raw < CALLS / 10, "raw tracepoints ran {raw} times over {CALLS} getpid()");
        }
        "tracepoint" => {
            // sys_enter and sys_exit run for every syscall of the machine.
            assert!(raw >= 2 * CALLS, "raw tracepoints ran only {raw} times over {CALLS} getpid()");
        }
        other => panic!("unknown backend {other}"),
    }
    if let Ok(want) = std::env::var("STALL_SYSCALL_HOOKS") {
        if want != "auto" {
            assert_eq!(backend, want, "the backend asked for through STALL_SYSCALL_HOOKS");
        }
    }
    assert!(Path::new(&json).exists());
}
