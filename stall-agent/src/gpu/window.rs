//! A GPU over a window of the job: what its utilization and power samples
//! say, for the verdict, the report and the metrics.
use serde::Serialize;

/// A GPU sample at or below this utilization counts as idle.
pub const IDLE_UTIL_PCT: f64 = 5.0;

/// A GPU over the window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuWindow {
    pub index: u32,
    pub name: String,
    pub util_mean_pct: f64,
    /// Share of samples at or below `IDLE_UTIL_PCT`.
    pub idle_fraction: f64,
    pub samples: usize,
    /// The longest stretch without a sample, seconds (driver gaps).
    pub max_gap_s: f64,
    /// Mean board power draw, and the enforced limit, watts (when the
    /// device says): utilization counts time with a kernel resident, power
    /// tells computing from spinning.
    pub power_w: Option<f64>,
    pub power_limit_w: Option<f64>,
    /// Mean SM utilization of the processes on the device, summed over
    /// them (when per-process accounting works).
    pub sm_util_pct: Option<f64>,
    /// The processes NVML saw on the device (which rank's GPU it is).
    #[serde(skip)]
    pub pids: Vec<u32>,
}

impl GpuWindow {
    /// Power draw as a share of the limit, when both are known.
    pub fn power_share(&self) -> Option<f64> {
        Some(self.power_w? / self.power_limit_w.filter(|l| *l > 0.0)?)
    }
}

/// GPU utilization samples over a window → [`GpuWindow`].
pub fn gpu_window(index: u32, name: &str, samples: &[(u64, f64)], start_ns: u64, end_ns: u64) -> GpuWindow {
    let inside: Vec<&(u64, f64)> = samples.iter().filter(|(t, _)| *t >= start_ns && *t <= end_ns).collect();
    let n = inside.len();
    let mean = if n == 0 { 0.0 } else { inside.iter().map(|s| s.1).sum::<f64>() / n as f64 };
    let idle =
        if n == 0 { 0.0 } else { inside.iter().filter(|s| s.1 <= IDLE_UTIL_PCT).count() as f64 / n as f64 };
    let mut edges: Vec<u64> = vec![start_ns];
    edges.extend(inside.iter().map(|s| s.0));
    edges.push(end_ns);
    let max_gap = edges.windows(2).map(|p| p[1].saturating_sub(p[0])).max().unwrap_or(0) as f64 / 1e9;
    GpuWindow {
        index,
        name: name.to_string(),
        util_mean_pct: mean,
        idle_fraction: idle,
        samples: n,
        max_gap_s: max_gap,
        power_w: None,
        power_limit_w: None,
        sm_util_pct: None,
        pids: Vec::new(),
    }
}
