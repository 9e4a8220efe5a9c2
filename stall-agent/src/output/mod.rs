//! What people read: the live view, the final report, and JSON Lines.
pub mod json;
pub mod live;
pub mod report;

use crate::{
    aggregate::Window,
    correlate::Roles,
    verdict::{GpuWindow, Verdict},
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
}
