//! The GPUs as a job sees them: one [`GpuFleet`] per stall process (the
//! NVML source and a track per device), running totals for the whole run
//! and the recent samples for the live windows, so memory stays flat however
//! long it runs.
use std::{
    collections::{HashSet, VecDeque},
    ffi::OsStr,
    path::Path,
};

use crate::gpu::{
    self, gpu_window, GpuError, GpuSelect, GpuSnapshot, GpuSource, GpuWindow, DEFAULT_NVML_LIB, IDLE_UTIL_PCT,
};

/// Recent samples kept per device (NVML gives about 6 per second).
const RECENT: usize = 600;

/// Every sampled device, and where the samples come from.
pub struct GpuFleet {
    source: Option<Box<dyn GpuSource>>,
    pub tracks: Vec<GpuTrack>,
    /// Why there is no GPU data (one line), when there is none.
    pub note: Option<String>,
    start_ns: u64,
}

impl GpuFleet {
    /// The one GPU policy of `run`, `attach` and the daemon: `--gpu off`
    /// samples nothing; devices named by index must be there (an error);
    /// otherwise NVML is used when it loads and its absence is a note.
    pub fn open(select: Option<&GpuSelect>, lib: Option<&Path>, start_ns: u64) -> Result<Self, GpuError> {
        let lib = lib.map_or(OsStr::new(DEFAULT_NVML_LIB), Path::as_os_str);
        let opened = match select {
            Some(GpuSelect::Off) => Ok(None),
            Some(sel @ GpuSelect::Indices(_)) => Ok(gpu::open_with_library(sel, lib)?),
            Some(sel) => gpu::open_with_library(sel, lib),
            None => gpu::open_with_library(&GpuSelect::All, lib),
        };
        Ok(match opened {
            Ok(source) => Self::with_source(source, start_ns),
            Err(e) => Self { note: Some(e.to_string()), ..Self::with_source(None, start_ns) },
        })
    }

    /// Samples from `source` (none: no GPU side), counted from `start_ns`.
    pub fn with_source(source: Option<Box<dyn GpuSource>>, start_ns: u64) -> Self {
        Self { source, tracks: Vec::new(), note: None, start_ns }
    }

    /// Polls the source once (one track per device, added as seen) and
    /// returns the driver's new notices.
    pub fn poll(&mut self) -> Vec<String> {
        let Some(src) = self.source.as_mut() else { return Vec::new() };
        for s in src.poll() {
            let i = match self.tracks.iter().position(|g| g.index == s.index) {
                Some(i) => i,
                None => {
                    self.tracks.push(GpuTrack::new(s.index, &s.name));
                    self.tracks.len() - 1
                }
            };
            self.tracks[i].add(&s, self.start_ns);
        }
        src.take_warnings()
    }

    /// Whether there is a GPU source at all (NVML loaded, `--gpu` not off).
    pub fn sampling(&self) -> bool {
        self.source.is_some()
    }

    /// Processes that have held a context on any device.
    pub fn holders(&self) -> HashSet<u32> {
        self.tracks.iter().flat_map(|g| g.pids.iter().copied()).collect()
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
    /// What each poll said beyond utilization, newest last.
    readings: VecDeque<Reading>,
    /// Whole-run sums of the readings that had a value.
    power_sum_mw: f64,
    power_n: usize,
    sm_sum: f64,
    sm_n: usize,
    pub power_limit_mw: Option<u32>,
}

/// One poll's power draw and per-process SM utilization (summed over the
/// processes on the device), at the newest sample's time.
#[derive(Debug, Clone, Copy)]
struct Reading {
    ts: u64,
    power_mw: Option<u32>,
    sm_pct: Option<f64>,
}

/// Readings kept per device (one per poll).
const RECENT_READINGS: usize = 120;

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
        self.power_limit_mw = s.power_limit_mw.or(self.power_limit_mw);
        let sm = s
            .processes
            .iter()
            .filter_map(|p| p.sm_util_pct)
            .fold(None, |a: Option<f64>, v| Some(a.unwrap_or(0.0) + v));
        let Some(ts) = s.samples.iter().map(|x| x.ts_ns).max().or(self.last_ts) else { return };
        let r = Reading { ts, power_mw: s.power_mw, sm_pct: sm.map(|v| v.min(100.0)) };
        if let Some(mw) = r.power_mw {
            self.power_sum_mw += f64::from(mw);
            self.power_n += 1;
        }
        if let Some(v) = r.sm_pct {
            self.sm_sum += v;
            self.sm_n += 1;
        }
        if self.readings.len() == RECENT_READINGS {
            self.readings.pop_front();
        }
        self.readings.push_back(r);
    }

    /// The utilization samples in [start_ns, end_ns], kept for the live
    /// windows (the timeline's counters).
    pub fn samples(&self, start_ns: u64, end_ns: u64) -> impl Iterator<Item = (u64, f64)> + '_ {
        self.recent.iter().copied().filter(move |(t, _)| *t >= start_ns && *t <= end_ns)
    }

    pub fn window(&self, start_ns: u64, end_ns: u64) -> GpuWindow {
        let samples: Vec<(u64, f64)> = self.recent.iter().copied().collect();
        let mut w = gpu_window(self.index, &self.name, &samples, start_ns, end_ns);
        let inside: Vec<&Reading> =
            self.readings.iter().filter(|r| r.ts >= start_ns && r.ts <= end_ns).collect();
        let mean = |v: Vec<f64>| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
        w.power_w = mean(inside.iter().filter_map(|r| r.power_mw).map(|mw| f64::from(mw) / 1e3).collect());
        w.sm_util_pct = mean(inside.iter().filter_map(|r| r.sm_pct).collect());
        w.power_limit_w = self.power_limit_mw.map(|mw| f64::from(mw) / 1e3);
        w.pids = self.pids.iter().copied().collect();
        w
    }

    /// From `start_ns` on: the recent samples when they reach that far
    /// back, else the whole run.
    pub fn since(&self, start_ns: u64, end_ns: u64) -> GpuWindow {
        match self.recent.front() {
            Some((first, _)) if *first <= start_ns || self.recent.len() == self.n => {
                self.window(start_ns, end_ns)
            }
            _ => self.summary(end_ns),
        }
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
            power_w: (self.power_n > 0).then(|| self.power_sum_mw / self.power_n as f64 / 1e3),
            power_limit_w: self.power_limit_mw.map(|mw| f64::from(mw) / 1e3),
            sm_util_pct: (self.sm_n > 0).then(|| self.sm_sum / self.sm_n as f64),
            pids: self.pids.iter().copied().collect(),
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
