//! Scripted [`GpuSource`] for tests of GPU-data consumers without a GPU.

use std::collections::{BTreeMap, VecDeque};

use super::{GpuSnapshot, GpuSource};

/// Replays a script: poll *n* returns the *n*-th scripted poll, and once the
/// script is exhausted every poll returns an empty `Vec`.
#[derive(Debug, Clone, Default)]
pub struct FakeGpu {
    devices: Vec<(u32, String)>,
    script: VecDeque<Vec<GpuSnapshot>>,
    warnings: Vec<String>,
    polls: usize,
}

impl FakeGpu {
    /// `polls[n]` is what poll *n* returns (one snapshot per device). The
    /// device list is every `(index, name)` appearing in the script, by index.
    pub fn new(polls: Vec<Vec<GpuSnapshot>>) -> Self {
        let mut devices = BTreeMap::new();
        for snap in polls.iter().flatten() {
            devices.entry(snap.index).or_insert_with(|| snap.name.clone());
        }
        FakeGpu { devices: devices.into_iter().collect(), script: polls.into(), ..Default::default() }
    }

    /// One snapshot per poll, in order (the single-device case).
    pub fn one_per_poll(snapshots: Vec<GpuSnapshot>) -> Self {
        Self::new(snapshots.into_iter().map(|s| vec![s]).collect())
    }

    /// Overrides the device list `devices()` reports, e.g. to model a device
    /// that is selected but never answers.
    pub fn with_devices(mut self, devices: Vec<(u32, String)>) -> Self {
        self.devices = devices;
        self
    }

    /// Warnings handed out by the next `take_warnings()`.
    pub fn with_warnings(mut self, warnings: Vec<String>) -> Self {
        self.warnings = warnings;
        self
    }

    /// Appends one more scripted poll.
    pub fn push_poll(&mut self, snapshots: Vec<GpuSnapshot>) {
        for s in &snapshots {
            if !self.devices.iter().any(|(i, _)| *i == s.index) {
                self.devices.push((s.index, s.name.clone()));
                self.devices.sort();
            }
        }
        self.script.push_back(snapshots);
    }

    /// Scripted polls not yet returned.
    pub fn remaining(&self) -> usize {
        self.script.len()
    }

    /// Polls made so far (including those past the end of the script).
    pub fn polls(&self) -> usize {
        self.polls
    }
}

impl GpuSource for FakeGpu {
    fn poll(&mut self) -> Vec<GpuSnapshot> {
        self.polls += 1;
        self.script.pop_front().unwrap_or_default()
    }

    fn devices(&self) -> Vec<(u32, String)> {
        self.devices.clone()
    }

    fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{GpuProcUse, GpuSample};
    use super::*;

    fn snap(index: u32, ts_ns: u64, util_pct: f64) -> GpuSnapshot {
        GpuSnapshot {
            index,
            name: format!("Fake H200 #{index}"),
            samples: vec![GpuSample { ts_ns, util_pct }],
            mem_used_bytes: 1 << 30,
            mem_total_bytes: 141 << 30,
            processes: vec![GpuProcUse {
                pid: 4242,
                used_mem_bytes: Some(1 << 30),
                sm_util_pct: Some(util_pct),
            }],
            power_mw: Some(650_000),
            power_limit_mw: Some(700_000),
        }
    }

    #[test]
    fn returns_script_in_order_then_empty() {
        let polls = vec![vec![snap(0, 10, 90.0), snap(2, 11, 80.0)], vec![], vec![snap(0, 30, 0.0)]];
        let mut g = FakeGpu::new(polls.clone());
        assert_eq!(g.devices(), vec![(0, "Fake H200 #0".into()), (2, "Fake H200 #2".into())]);
        assert_eq!(g.remaining(), 3);
        for expected in &polls {
            assert_eq!(&g.poll(), expected);
        }
        // Power readings come back as scripted.
        let mut g2 = FakeGpu::one_per_poll(vec![snap(0, 1, 100.0)]);
        let got = g2.poll();
        assert_eq!((got[0].power_mw, got[0].power_limit_mw), (Some(650_000), Some(700_000)));
        assert_eq!(g.remaining(), 0);
        assert!(g.poll().is_empty());
        assert!(g.poll().is_empty());
        assert_eq!(g.polls(), 5);
    }

    #[test]
    fn one_per_poll_and_push() {
        let mut g = FakeGpu::one_per_poll(vec![snap(1, 1, 50.0), snap(1, 2, 60.0)]);
        assert_eq!(g.devices(), vec![(1, "Fake H200 #1".into())]);
        g.push_poll(vec![snap(0, 3, 70.0)]);
        assert_eq!(g.devices().len(), 2);
        assert_eq!(g.devices()[0].0, 0);
        let ts: Vec<u64> = (0..4).flat_map(|_| g.poll()).flat_map(|s| s.samples).map(|s| s.ts_ns).collect();
        assert_eq!(ts, vec![1, 2, 3]);
    }

    #[test]
    fn works_as_boxed_source() {
        let mut src: Box<dyn GpuSource> = Box::new(
            FakeGpu::new(vec![])
                .with_devices(vec![(0, "absent".into())])
                .with_warnings(vec!["GPU 0: lost".into()]),
        );
        assert_eq!(src.devices(), vec![(0, "absent".into())]);
        assert!(src.poll().is_empty());
        assert_eq!(src.take_warnings(), vec!["GPU 0: lost".to_string()]);
        assert!(src.take_warnings().is_empty());
    }
}
