//! What the running kernel is and keeps: its release, and the schedstat
//! totals (with their clock's precision) that stall's figures are checked
//! against.

/// Whether the running kernel is `major.minor` or later (its release, as
/// `uname -r` prints it).
pub fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("the kernel release");
    let mut parts = release.trim().split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (major, minor)
}

/// How closely a thread's schedstat totals can match stall's: 2 % where the
/// clock source is the TSC. Elsewhere (an emulated machine whose TSC the
/// kernel marked unstable: HPET), the scheduler's clock is only kept within
/// a tick of the wall clock stall reads, and every span schedstat sums can
/// be off by up to a tick: 5 %.
pub fn schedstat_tolerance() -> f64 {
    let source = std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
        .unwrap_or_default();
    if source.trim() == "tsc" {
        0.02
    } else {
        0.05
    }
}

/// A thread's totals as the kernel keeps them now (`/proc/PID/task/TID/schedstat`):
/// seconds on CPU and waiting for one.
pub fn thread_schedstat(pid: u32, tid: u32) -> (f64, f64) {
    let path = format!("/proc/{pid}/task/{tid}/schedstat");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut fields =
        text.split_whitespace().map(|f| f.parse::<u64>().expect("a schedstat number") as f64 / 1e9);
    (fields.next().expect("on-CPU ns"), fields.next().expect("runqueue ns"))
}
