//! What people read: the live view, the final report, JSON Lines, and the
//! daemon's `/jobs`.
pub mod jobs;
pub mod json;
pub mod live;
pub mod report;

use crate::{
    aggregate::Window,
    correlate::{RoleChange, Roles},
    gpu::GpuWindow,
    progress::ProgressView,
    units,
    verdict::Verdict,
};

/// Everything an output needs about one window.
pub struct View<'a> {
    pub window: &'a Window,
    pub roles: &'a Roles,
    pub gpus: &'a [GpuWindow],
    pub verdict: &'a Verdict,
    /// Seconds since tracing started, at the window's end.
    pub elapsed_s: f64,
    /// What is traced, for headers ("pid 1234", "cgroup /x", "python train.py").
    pub target: &'a str,
    pub gpu_note: Option<&'a str>,
    /// When the job last moved (reads, writes), at the window's end.
    pub progress: &'a ProgressView,
    /// What only the final report says (None: a live view).
    pub ending: Option<Ending<'a>>,
    /// The live view: the job is still starting up (its input pipeline has
    /// not run), when a verdict on its imports would mislead.
    pub starting_up: bool,
}

/// What the final report says beyond a window's view.
pub struct Ending<'a> {
    /// How long the startup before the input pipeline took, when the
    /// verdict is on the steady state after it.
    pub startup_s: Option<f64>,
    /// The syscall hooks' backend (`trampoline`, `tracepoint`), how they
    /// read a returning call's registers (`cast`, `probe`) and the line
    /// that says so for people.
    pub syscall_backend: (&'static str, &'static str, &'a str),
    /// The CUDA libraries the GPU library probes went on, in words (None:
    /// not asked for).
    pub gpu_probes: Option<&'a str>,
    /// How faults on file mappings were followed (`tracepoint`,
    /// `trampoline`, `none`).
    pub mmap_hooks: &'static str,
    /// How `sched_switch` read the task going off-CPU (`direct`, `probe`,
    /// `probe-stack`).
    pub switch_reads: &'static str,
    /// `stall run`'s command's exit status, shell-style (128 + N: killed
    /// by signal N); None when it was not stall's to wait for.
    pub exit_status: Option<i32>,
    /// Blocked threads whose /proc syscall file could not be read when
    /// tracing began (their first wait's reason is a guess).
    pub unreadable_threads: u32,
    /// Each time the trainers changed while tracing, and why.
    pub role_changes: &'a [RoleChange],
}

/// "status 7", "status 143 (killed by SIGTERM)".
pub fn exit_words(status: i32) -> String {
    match nix::sys::signal::Signal::try_from(status - 128) {
        Ok(sig) if status > 128 => format!("status {status} (killed by {sig})"),
        _ => format!("status {status}"),
    }
}

/// "last progress 3 s ago (/runs/train.log written 3 s ago)", for the
/// report and the live view.
pub fn progress_line(p: &ProgressView) -> String {
    let mut line = if p.known {
        format!("last progress {} ago", units::span(p.silent_s))
    } else {
        format!("no progress seen in {} (no reads, no writes)", units::span(p.silent_s))
    };
    if let Some(r) = p.rhythm_s {
        line.push_str(&format!(", usually every {} or less", units::span(r)));
    }
    if let Some(o) = &p.last_output {
        line.push_str(&format!("; {} written {} ago", o.path.value(), units::span(o.ago_s)));
    }
    line
}

/// " at 95 W of 700 W, SM 40%": what the device says beyond utilization.
pub fn gpu_power(g: &GpuWindow) -> String {
    let mut s = String::new();
    match (g.power_w, g.power_limit_w) {
        (Some(p), Some(l)) => s.push_str(&format!(" at {p:.0} W of {l:.0} W")),
        (Some(p), None) => s.push_str(&format!(" at {p:.0} W")),
        _ => {}
    }
    if let Some(sm) = g.sm_util_pct {
        s.push_str(&format!(", processes' SM {sm:.0}%"));
    }
    s
}
