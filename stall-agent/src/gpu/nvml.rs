//! NVML-backed [`GpuSource`].
//!
//! Utilization comes from the driver's sample buffer
//! (`nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES)`): several samples per
//! second, each stamped by the driver, fetched incrementally with the newest
//! stamp seen as `lastSeenTimeStamp`. When the buffer is unsupported, or has
//! produced nothing for a couple of its sample periods (drivers stop filling
//! it while the GPU idles, which is exactly when stall needs data), one
//! instantaneous `nvmlDeviceGetUtilizationRates` reading stands in.
//!
//! Nothing here panics or returns an error once opened: a failing query
//! degrades that field for that poll and leaves a one-line warning.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsStr;

use nvml_wrapper::enum_wrappers::device::Sampling;
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::{ProcessInfo, ProcessUtilizationSample, Sample};
use nvml_wrapper::{Device, Nvml};

use super::{
    monotonic_ns, one_line, ClockSnapshot, GpuError, GpuProcUse, GpuSample, GpuSelect, GpuSnapshot, GpuSource,
};

/// The soname the driver package installs (the unversioned `.so` comes only
/// with development packages).
pub const DEFAULT_NVML_LIB: &str = "libnvidia-ml.so.1";

const MS: u64 = 1_000_000;
/// Gaps between buffered samples longer than this are pauses (idle GPU, dry
/// buffer), not the sampling period.
const MAX_PERIOD_NS: u64 = 5_000 * MS;
/// Bounds on how long the buffer may stay silent before an instantaneous
/// reading stands in; without a period estimate the upper bound is used.
const MIN_STALE_NS: u64 = 200 * MS;
const MAX_STALE_NS: u64 = 2_000 * MS;
/// Keeps the warning dedup set bounded if a driver produces endless variety.
const MAX_DISTINCT_WARNINGS: usize = 256;

/// Samples every selected device through NVML. Create with
/// [`NvmlGpu::open`] (or [`super::open`] for a boxed source).
pub struct NvmlGpu {
    nvml: Nvml,
    devs: Vec<DevState>,
    warnings: Warnings,
}

impl std::fmt::Debug for NvmlGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlGpu").field("devices", &self.devices()).finish_non_exhaustive()
    }
}

impl NvmlGpu {
    /// Loads [`DEFAULT_NVML_LIB`] and opens the selected devices.
    pub fn open(select: &GpuSelect) -> Result<Self, GpuError> {
        Self::open_with_library(select, OsStr::new(DEFAULT_NVML_LIB))
    }

    /// Loads NVML from `lib` and opens the selected devices. `All` skips
    /// (with a warning) devices that cannot be opened as long as one can;
    /// explicit indices must all open. `Off` is refused: it means "do not
    /// load NVML", which [`super::open`] honours by returning `None`.
    pub fn open_with_library(select: &GpuSelect, lib: &OsStr) -> Result<Self, GpuError> {
        let explicit = match select {
            GpuSelect::Off => {
                return Err(GpuError::BadSelect {
                    input: select.to_string(),
                    reason: "GPU sampling is off".into(),
                })
            }
            GpuSelect::Indices(v) if v.is_empty() => {
                return Err(GpuError::BadSelect { input: String::new(), reason: "no device index".into() })
            }
            GpuSelect::All => false,
            GpuSelect::Indices(_) => true,
        };

        let lib_name = lib.to_string_lossy();
        let nvml = Nvml::builder().lib_path(lib).init().map_err(|e| init_error(&lib_name, &e))?;
        let count = nvml
            .device_count()
            .map_err(|e| GpuError::NoNvml { reason: format!("cannot count devices: {}", reason(&e)) })?;
        if count == 0 {
            return Err(GpuError::NoDevices);
        }
        let indices: Vec<u32> = match select {
            GpuSelect::Indices(v) => {
                if let Some(&index) = v.iter().find(|&&i| i >= count) {
                    return Err(GpuError::NoSuchDevice { index, count });
                }
                v.clone()
            }
            _ => (0..count).collect(),
        };

        let mut warnings = Warnings::default();
        let mut devs = Vec::with_capacity(indices.len());
        let mut first_err = None;
        for index in indices {
            match nvml.device_by_index(index) {
                Ok(dev) => {
                    let name = dev.name().unwrap_or_else(|_| format!("GPU {index}"));
                    let mut st = DevState::new(index, name, monotonic_ns());
                    st.prime(&dev, &mut warnings);
                    devs.push(st);
                }
                Err(e) => {
                    let err = GpuError::Device { index, reason: reason(&e) };
                    if explicit {
                        return Err(err);
                    }
                    warnings.warn(err.to_string());
                    first_err.get_or_insert(err);
                }
            }
        }
        if devs.is_empty() {
            return Err(first_err.unwrap_or(GpuError::NoDevices));
        }
        Ok(NvmlGpu { nvml, devs, warnings })
    }
}

impl GpuSource for NvmlGpu {
    fn poll(&mut self) -> Vec<GpuSnapshot> {
        let NvmlGpu { nvml, devs, warnings } = self;
        let mut out = Vec::with_capacity(devs.len());
        for st in devs.iter_mut() {
            // Handles are re-fetched (a cheap table lookup once NVML has
            // attached the device) because `Device` borrows `Nvml`.
            match nvml.device_by_index(st.index) {
                Ok(dev) => out.push(st.poll(&dev, warnings)),
                Err(e) => warnings.warn(format!("GPU {} not sampled this poll: {}", st.index, reason(&e))),
            }
        }
        out
    }

    fn devices(&self) -> Vec<(u32, String)> {
        self.devs.iter().map(|d| (d.index, d.name.clone())).collect()
    }

    fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings.pending)
    }
}

/// Each distinct warning once.
#[derive(Debug, Default)]
struct Warnings {
    pending: Vec<String>,
    seen: HashSet<String>,
}

impl Warnings {
    fn warn(&mut self, msg: String) {
        let msg = one_line(&msg);
        if self.seen.len() >= MAX_DISTINCT_WARNINGS || !self.seen.insert(msg.clone()) {
            return;
        }
        self.pending.push(msg);
    }
}

/// Per-device sampling state. Raw `*_us` stamps are in NVML's own clock and
/// only ever fed back to NVML; everything handed out is CLOCK_MONOTONIC.
#[derive(Debug, Clone)]
struct DevState {
    index: u32,
    name: String,
    /// `nvmlDeviceGetSamples` usable (cleared on a permanent error).
    buffered: bool,
    /// Newest buffered GPU-utilization stamp seen: the next `lastSeenTimeStamp`.
    last_raw_us: u64,
    /// When the newest buffered sample was taken (monotonic), to notice a
    /// silent buffer.
    last_buffered_mono_ns: Option<u64>,
    /// Estimated driver sampling period (median spacing of buffered samples).
    period_ns: Option<u64>,
    /// Newest sample handed out; older or equal ones are dropped so that the
    /// timeline stays strictly increasing across polls and fallbacks. Starts
    /// at open time, so the first poll does not return history.
    last_emitted_mono_ns: u64,
    /// `nvmlDeviceGetProcessUtilization` usable (cleared on a permanent error).
    proc_util: bool,
    /// Newest per-process sample stamp seen.
    last_proc_raw_us: u64,
    /// When that sample was taken (monotonic).
    last_proc_mono_ns: Option<u64>,
    /// Per-pid SM utilization of the newest per-process window, carried
    /// over polls that fall between two driver samples.
    proc_util_last: HashMap<u32, f64>,
    /// `nvmlDeviceGetPowerUsage` usable (cleared on a permanent error).
    power: bool,
    /// `nvmlDeviceGetEnforcedPowerLimit` usable (cleared on a permanent error).
    power_limit: bool,
}

impl DevState {
    fn new(index: u32, name: String, open_mono_ns: u64) -> Self {
        DevState {
            index,
            name,
            buffered: true,
            last_raw_us: 0,
            last_buffered_mono_ns: None,
            period_ns: None,
            last_emitted_mono_ns: open_mono_ns,
            proc_util: true,
            last_proc_raw_us: 0,
            last_proc_mono_ns: None,
            proc_util_last: HashMap::new(),
            power: true,
            power_limit: true,
        }
    }

    /// Reads both sample buffers once at open so that later polls fetch only
    /// what is newer (`lastSeenTimeStamp` must be in NVML's clock, which is
    /// learnt from its own stamps), and finds out what the device supports.
    fn prime(&mut self, dev: &Device<'_>, warnings: &mut Warnings) {
        let res = dev.samples(Sampling::GpuUtilization, 0u64);
        let clock = ClockSnapshot::now();
        match res {
            // Everything is older than open time, so nothing is emitted; this
            // only seeds the stamp, the silence timer and the period.
            Ok(v) => drop(self.absorb_buffered(util_rows(v), &clock)),
            Err(NvmlError::NotFound) => {} // empty buffer
            Err(e) => self.buffered_failed(&e, warnings),
        }
        if let Err(e) = self.poll_proc_util(dev) {
            self.proc_util_failed(&e, warnings);
        }
    }

    fn poll(&mut self, dev: &Device<'_>, warnings: &mut Warnings) -> GpuSnapshot {
        let samples = self.poll_util(dev, warnings);
        let (mem_used_bytes, mem_total_bytes) = match dev.memory_info() {
            Ok(m) => (m.used, m.total),
            Err(e) => {
                warnings.warn(format!("GPU {}: memory info unavailable: {}", self.index, reason(&e)));
                (0, 0)
            }
        };
        let processes = self.poll_processes(dev, warnings);
        let power_mw =
            read_optional(self.index, &mut self.power, "power draw", || dev.power_usage(), warnings);
        let power_limit_mw = read_optional(
            self.index,
            &mut self.power_limit,
            "power limit",
            || dev.enforced_power_limit(),
            warnings,
        );
        GpuSnapshot {
            index: self.index,
            name: self.name.clone(),
            samples,
            mem_used_bytes,
            mem_total_bytes,
            processes,
            power_mw,
            power_limit_mw,
        }
    }

    fn poll_util(&mut self, dev: &Device<'_>, warnings: &mut Warnings) -> Vec<GpuSample> {
        if self.buffered {
            let res = dev.samples(Sampling::GpuUtilization, self.last_raw_us);
            // Clocks read after the call, so every returned sample predates
            // the snapshot (conversions clamp to its "now").
            let clock = ClockSnapshot::now();
            match res {
                Ok(v) => {
                    let out = self.absorb_buffered(util_rows(v), &clock);
                    if !out.is_empty() {
                        return out;
                    }
                }
                // Nothing newer than last_raw_us: normal between samples and
                // while the GPU idles.
                Err(NvmlError::NotFound) => {}
                Err(e) => self.buffered_failed(&e, warnings),
            }
        }
        let now = monotonic_ns();
        if !self.needs_instant(now) {
            return Vec::new();
        }
        match dev.utilization_rates() {
            Ok(u) => self.emit(vec![GpuSample { ts_ns: now, util_pct: clamp_pct(f64::from(u.gpu)) }]),
            Err(e) => {
                warnings.warn(format!("GPU {}: utilization unavailable: {}", self.index, reason(&e)));
                Vec::new()
            }
        }
    }

    fn buffered_failed(&mut self, e: &NvmlError, warnings: &mut Warnings) {
        if is_permanent(e) {
            self.buffered = false;
            warnings.warn(format!(
                "GPU {}: buffered utilization samples unavailable ({}); using one instantaneous reading per poll",
                self.index,
                reason(e)
            ));
        } else {
            warnings.warn(format!(
                "GPU {}: reading utilization samples failed ({}); instantaneous reading used",
                self.index,
                reason(e)
            ));
        }
    }

    fn proc_util_failed(&mut self, e: &NvmlError, warnings: &mut Warnings) {
        if is_permanent(e) {
            self.proc_util = false;
        }
        warnings.warn(format!("GPU {}: per-process SM utilization unavailable: {}", self.index, reason(e)));
    }

    /// Takes buffered `(raw stamp, value)` rows (any order, possibly with
    /// already-seen ones), advances `last_raw_us`, updates the period
    /// estimate, and returns the new samples as monotonic, oldest first.
    /// (Should NVML's clock step back, e.g. a wall-clock NTP step, its new
    /// stamps look old and are skipped; the instantaneous fallback covers the
    /// gap.)
    fn absorb_buffered(&mut self, mut rows: Vec<(u64, f64)>, clock: &ClockSnapshot) -> Vec<GpuSample> {
        rows.retain(|&(ts, _)| ts > self.last_raw_us);
        rows.sort_by_key(|&(ts, _)| ts);
        rows.dedup_by_key(|&mut (ts, _)| ts);
        let Some(&(newest, _)) = rows.last() else {
            return Vec::new();
        };

        let mut gaps = Vec::with_capacity(rows.len());
        let mut prev = self.last_raw_us;
        for &(ts, _) in &rows {
            let gap = ts.saturating_sub(prev).saturating_mul(1000);
            if prev != 0 && gap <= MAX_PERIOD_NS {
                gaps.push(gap);
            }
            prev = ts;
        }
        if !gaps.is_empty() {
            gaps.sort_unstable();
            self.period_ns = Some(gaps[gaps.len() / 2]);
        }
        self.last_raw_us = newest;

        let samples: Vec<GpuSample> = rows
            .iter()
            .map(|&(ts, v)| GpuSample { ts_ns: clock.nvml_us_to_mono_ns(ts), util_pct: clamp_pct(v) })
            .collect();
        self.last_buffered_mono_ns = samples.last().map(|s| s.ts_ns);
        self.emit(samples)
    }

    /// True when an instantaneous reading should stand in: no buffer, or it
    /// has been silent for about two sampling periods.
    fn needs_instant(&self, now_mono_ns: u64) -> bool {
        if !self.buffered {
            return true;
        }
        match self.last_buffered_mono_ns {
            None => true,
            Some(t) => now_mono_ns.saturating_sub(t) > stale_after_ns(self.period_ns),
        }
    }

    /// Keeps samples strictly newer than anything handed out before.
    fn emit(&mut self, samples: Vec<GpuSample>) -> Vec<GpuSample> {
        let mut out = Vec::with_capacity(samples.len());
        for s in samples {
            if s.ts_ns > self.last_emitted_mono_ns {
                self.last_emitted_mono_ns = s.ts_ns;
                out.push(s);
            }
        }
        out
    }

    /// Per-process SM utilization, by pid, of the newest driver window.
    fn poll_proc_util(&mut self, dev: &Device<'_>) -> Result<HashMap<u32, f64>, NvmlError> {
        let res = dev.process_utilization_stats(self.last_proc_raw_us);
        let clock = ClockSnapshot::now();
        let rows = match res {
            Ok(v) => v.iter().map(proc_util_row).collect(),
            // No sample newer than last_proc_raw_us.
            Err(NvmlError::NotFound) => Vec::new(),
            Err(e) => return Err(e),
        };
        Ok(self.absorb_proc_util(rows, &clock))
    }

    /// NVML lists only processes with non-zero utilization since
    /// `lastSeenTimeStamp` (NotFound when none), so a pid missing from a
    /// fresh window is idle. No new row at all is ambiguous: the poll may
    /// just fall between two driver samples. The previous window is then
    /// carried over until it is older than the device's staleness threshold
    /// (the per-process figures come from the same periodic driver sampling),
    /// after which every pid reads 0%.
    fn absorb_proc_util(&mut self, rows: Vec<(u32, u64, u32)>, clock: &ClockSnapshot) -> HashMap<u32, f64> {
        let mut sums: HashMap<u32, (f64, u32)> = HashMap::new();
        let mut newest = self.last_proc_raw_us;
        for (pid, ts, sm) in rows {
            if ts <= self.last_proc_raw_us {
                continue;
            }
            newest = newest.max(ts);
            let e = sums.entry(pid).or_insert((0.0, 0));
            e.0 += clamp_pct(f64::from(sm));
            e.1 += 1;
        }
        if newest > self.last_proc_raw_us {
            self.last_proc_raw_us = newest;
            self.last_proc_mono_ns = Some(clock.nvml_us_to_mono_ns(newest));
            self.proc_util_last = sums.into_iter().map(|(pid, (sum, n))| (pid, sum / f64::from(n))).collect();
        } else {
            let stale = self
                .last_proc_mono_ns
                .is_none_or(|t| clock.mono_ns.saturating_sub(t) > stale_after_ns(self.period_ns));
            if stale {
                self.proc_util_last.clear();
            }
        }
        self.proc_util_last.clone()
    }

    fn poll_processes(&mut self, dev: &Device<'_>, warnings: &mut Warnings) -> Vec<GpuProcUse> {
        let mut rows = Vec::new();
        for (kind, list) in
            [("compute", dev.running_compute_processes()), ("graphics", dev.running_graphics_processes())]
        {
            match list {
                Ok(v) => rows.extend(v.iter().map(proc_row)),
                // Graphics lists are unsupported on some compute-only parts.
                Err(NvmlError::NotSupported) if kind == "graphics" => {}
                Err(e) => warnings.warn(format!(
                    "GPU {}: {kind} process list unavailable: {}",
                    self.index,
                    reason(&e)
                )),
            }
        }
        let util = if self.proc_util {
            match self.poll_proc_util(dev) {
                Ok(m) => Some(m),
                Err(e) => {
                    self.proc_util_failed(&e, warnings);
                    None
                }
            }
        } else {
            None
        };
        merge_processes(rows, util.as_ref())
    }
}

/// One optional reading: `None` (and a warning, once) when it fails, and not
/// asked again once the device said it never will.
fn read_optional(
    index: u32,
    usable: &mut bool,
    what: &str,
    read: impl FnOnce() -> Result<u32, NvmlError>,
    warnings: &mut Warnings,
) -> Option<u32> {
    if !*usable {
        return None;
    }
    match read() {
        Ok(v) => Some(v),
        Err(e) => {
            if is_permanent(&e) {
                *usable = false;
            }
            warnings.warn(format!("GPU {index}: {what} unavailable: {}", reason(&e)));
            None
        }
    }
}

/// One row of NVML's process lists: pid, GPU instance, compute instance
/// (both set only under MIG), used memory.
type ProcRow = (u32, Option<u32>, Option<u32>, Option<u64>);

fn proc_row(p: &ProcessInfo) -> ProcRow {
    let mem = match p.used_gpu_memory {
        UsedGpuMemory::Used(b) => Some(b),
        UsedGpuMemory::Unavailable => None,
    };
    (p.pid, p.gpu_instance_id, p.compute_instance_id, mem)
}

fn proc_util_row(s: &ProcessUtilizationSample) -> (u32, u64, u32) {
    (s.pid, s.timestamp, s.sm_util)
}

fn util_rows(v: Vec<Sample>) -> Vec<(u64, f64)> {
    v.into_iter().map(|s| (s.timestamp, sample_value(&s.value))).collect()
}

/// One entry per pid, by pid. A context listed as both compute and graphics
/// (same pid and instances) is counted once; a pid with contexts in several
/// MIG instances gets their sum. Memory is `None` only if no row knew it.
fn merge_processes(
    rows: impl IntoIterator<Item = ProcRow>,
    util: Option<&HashMap<u32, f64>>,
) -> Vec<GpuProcUse> {
    let mut contexts: BTreeMap<(u32, Option<u32>, Option<u32>), Option<u64>> = BTreeMap::new();
    for (pid, gi, ci, mem) in rows {
        let e = contexts.entry((pid, gi, ci)).or_insert(mem);
        // Option's order puts None below Some, so this keeps the known value.
        *e = (*e).max(mem);
    }
    let mut by_pid: BTreeMap<u32, Option<u64>> = BTreeMap::new();
    for ((pid, _, _), mem) in contexts {
        let e = by_pid.entry(pid).or_insert(None);
        *e = match (*e, mem) {
            (Some(a), Some(b)) => Some(a.saturating_add(b)),
            (a, b) => a.or(b),
        };
    }
    by_pid
        .into_iter()
        .map(|(pid, used_mem_bytes)| GpuProcUse {
            pid,
            used_mem_bytes,
            sm_util_pct: util.map(|m| m.get(&pid).copied().unwrap_or(0.0)),
        })
        .collect()
}

fn sample_value(v: &SampleValue) -> f64 {
    match *v {
        SampleValue::F64(x) => x,
        SampleValue::U32(x) => f64::from(x),
        SampleValue::U64(x) => x as f64,
        SampleValue::I64(x) => x as f64,
    }
}

/// Utilization is a percentage; anything outside 0..=100 (or NaN) is a
/// driver glitch, not a measurement.
fn clamp_pct(x: f64) -> f64 {
    if x.is_nan() {
        0.0
    } else {
        x.clamp(0.0, 100.0)
    }
}

fn stale_after_ns(period_ns: Option<u64>) -> u64 {
    match period_ns {
        Some(p) => p.saturating_mul(2).saturating_add(50 * MS).clamp(MIN_STALE_NS, MAX_STALE_NS),
        None => MAX_STALE_NS,
    }
}

/// Errors that will not go away by asking again.
fn is_permanent(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::NotSupported
            | NvmlError::NoPermission
            | NvmlError::FunctionNotFound
            | NvmlError::FailedToLoadSymbol(_)
            | NvmlError::UnexpectedVariant(_)
    )
}

fn reason(e: &NvmlError) -> String {
    one_line(&e.to_string())
}

/// Init failures, phrased for someone who just wants to know why the GPU
/// column is empty.
fn init_error(lib: &str, e: &NvmlError) -> GpuError {
    let reason = match e {
        NvmlError::LibloadingError(le) => {
            let msg = le.to_string();
            if msg.contains("No such file") || msg.contains("cannot open shared object") {
                format!("{lib} not found")
            } else {
                format!("cannot load {lib}: {msg}")
            }
        }
        NvmlError::LibraryNotFound => format!("{lib} not found"),
        NvmlError::FailedToLoadSymbol(s) => format!("{lib} lacks nvmlInit_v2: {s}"),
        NvmlError::DriverNotLoaded => "NVIDIA driver not loaded".into(),
        NvmlError::NoPermission => "no permission to talk to the NVIDIA driver".into(),
        NvmlError::LibRmVersionMismatch => {
            format!("{lib} does not match the loaded kernel driver version")
        }
        other => format!("NVML init failed: {other}"),
    };
    GpuError::NoNvml { reason: one_line(&reason) }
}

#[cfg(test)]
mod tests;
