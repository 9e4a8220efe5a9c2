//! GPU samples kept for the session: running totals for the whole run and
//! the recent samples for the live windows, so memory stays flat however
//! long it runs.
use std::collections::{HashSet, VecDeque};

use crate::{
    gpu::{GpuSnapshot, GpuSource},
    verdict::{self, rules::IDLE_UTIL_PCT, GpuWindow},
};

/// Recent samples kept per device (NVML gives about 6 per second).
const RECENT: usize = 600;

/// Polls `src` once into `tracks` (one per device, added as seen) and
/// prints the driver's notices.
pub fn poll_into(tracks: &mut Vec<GpuTrack>, src: &mut dyn GpuSource, start_ns: u64) {
    for s in src.poll() {
        let i = match tracks.iter().position(|g| g.index == s.index) {
            Some(i) => i,
            None => {
                tracks.push(GpuTrack::new(s.index, &s.name));
                tracks.len() - 1
            }
        };
        tracks[i].add(&s, start_ns);
    }
    for w in src.take_warnings() {
        eprintln!("stall: {w}");
    }
}

#[derive(Debug, Default)]
pub struct GpuTrack {
    pub index: u32,
    pub name: String,
    n: usize,
    sum: f64,
    idle: usize,
    last_ts: Option<u64>,
    max_gap_ns: u64,
    recent: VecDeque<(u64, f64)>,
    pub pids: HashSet<u32>,
    pub mem_used: u64,
    pub mem_total: u64,
}

impl GpuTrack {
    pub fn new(index: u32, name: &str) -> Self {
        Self { index, name: name.to_string(), ..Default::default() }
    }

    pub fn add(&mut self, s: &GpuSnapshot, start_ns: u64) {
        for x in s.samples.iter().filter(|x| x.ts_ns >= start_ns) {
            self.n += 1;
            self.sum += x.util_pct;
            self.idle += usize::from(x.util_pct <= IDLE_UTIL_PCT);
            let prev = self.last_ts.unwrap_or(start_ns);
            self.max_gap_ns = self.max_gap_ns.max(x.ts_ns.saturating_sub(prev));
            self.last_ts = Some(x.ts_ns);
            if self.recent.len() == RECENT {
                self.recent.pop_front();
            }
            self.recent.push_back((x.ts_ns, x.util_pct));
        }
        self.pids.extend(s.processes.iter().map(|p| p.pid));
        self.mem_used = s.mem_used_bytes;
        self.mem_total = s.mem_total_bytes;
    }

    pub fn window(&self, start_ns: u64, end_ns: u64) -> GpuWindow {
        let samples: Vec<(u64, f64)> = self.recent.iter().copied().collect();
        verdict::gpu_window(self.index, &self.name, &samples, start_ns, end_ns)
    }

    pub fn summary(&self, end_ns: u64) -> GpuWindow {
        let n = self.n.max(1) as f64;
        let tail = end_ns.saturating_sub(self.last_ts.unwrap_or(end_ns));
        GpuWindow {
            index: self.index,
            name: self.name.clone(),
            util_mean_pct: if self.n == 0 { 0.0 } else { self.sum / n },
            idle_fraction: if self.n == 0 { 0.0 } else { self.idle as f64 / n },
            samples: self.n,
            max_gap_s: self.max_gap_ns.max(tail) as f64 / 1e9,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::GpuSample;

    #[test]
    fn totals_and_windows_agree() {
        let mut t = GpuTrack::new(0, "H200");
        let snap = |from: u64| GpuSnapshot {
            samples: (0..10)
                .map(|i| GpuSample { ts_ns: from + i * 100, util_pct: if i < 8 { 0.0 } else { 50.0 } })
                .collect(),
            ..Default::default()
        };
        t.add(&snap(0), 0);
        t.add(&snap(1000), 0);
        let s = t.summary(2000);
        assert_eq!(s.samples, 20);
        assert!((s.idle_fraction - 0.8).abs() < 1e-9);
        assert!((s.util_mean_pct - 10.0).abs() < 1e-9);
        let w = t.window(1000, 2000);
        assert_eq!(w.samples, 10);
    }
}
