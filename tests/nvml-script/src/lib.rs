//! `libstall_nvml_script.so`: a stand-in for `libnvidia-ml.so.1` whose GPUs
//! do what a JSON script says, so that stall's GPU side can be tested on
//! machines without an NVIDIA driver (`stall run --nvml-lib
//! target/release/libstall_nvml_script.so ...`).
//!
//! It exports, with NVML's C ABI, the entry points stall reaches through the
//! `nvml-wrapper` crate (see [`EXPORTED`]); any other symbol is absent, which
//! the wrapper reports as `FailedToLoadSymbol` only when it is called.
//!
//! # The script
//!
//! The file named by the environment variable `STALL_NVML_SCRIPT` (read by
//! the process that loads the library). It is read at `nvmlInit` and read
//! again whenever its modification time, size or inode changes, so a test
//! can change a GPU's state while stall runs: write a new file next to it
//! and rename it over the old one. A file that does not parse at a reload
//! is ignored (the previous script stays). No variable, no file or a bad
//! file at `nvmlInit`: init fails with `NVML_ERROR_LIBRARY_NOT_FOUND`
//! (missing) or `NVML_ERROR_UNKNOWN` (unreadable, bad JSON), which stall
//! reports as "no NVML".
//!
//! ```json
//! {"devices": [{"name": "Scripted H200", "mem_total_bytes": 150000000000, "power_limit_mw": 700000,
//!    "phases": [{"for_s": 5.0, "util_pct": 0, "power_mw": 80000, "mem_used_bytes": 1000000000,
//!                "processes": [{"pid": 1234, "used_mem_bytes": 1000000000, "sm_util_pct": 0}]},
//!               {"util_pct": 100, "power_mw": 650000, "processes": [{"pid_file": "/tmp/x/trainer.pid"}]}],
//!    "lost_after_s": null}]}
//! ```
//!
//! Device `i` of `devices` is NVML index `i`. Per device (all but `phases`
//! optional):
//! - `name` (default `"Scripted GPU"`), `mem_total_bytes` (default 80 GB);
//! - `power_limit_mw`: what `nvmlDeviceGetEnforcedPowerLimit` and
//!   `nvmlDeviceGetPowerManagementLimit` return; absent: `NOT_SUPPORTED`;
//! - `lost_after_s`: from that many seconds after the first `nvmlInit` on,
//!   every call about this device (its handle included) returns
//!   `NVML_ERROR_GPU_IS_LOST`, as a GPU fallen off the bus does;
//! - `phases`: run in order, timed from the library's first `nvmlInit`
//!   (CLOCK_MONOTONIC); a phase lasts `for_s` seconds, the last one (or the
//!   first without `for_s`) forever. Per phase: `util_pct` (0..=100, default
//!   0), `power_mw` (absent: `nvmlDeviceGetPowerUsage` is `NOT_SUPPORTED`),
//!   `mem_used_bytes` (default: the sum of the processes' memory),
//!   `processes`.
//!
//! A process entry names its pid with one of `pid` (a number), `pid_file`
//! (a file holding the pid, read at each call: a test learns its trainer's
//! pid only once it started it; while the file is missing or empty the
//! process is not listed) or `pid_of` (`"env:NAME"`: the loading process's
//! environment variable `NAME`; `"file:PATH"`: as `pid_file`). Optional:
//! `used_mem_bytes` (absent: `NVML_VALUE_NOT_AVAILABLE`) and `sm_util_pct`
//! (default: the phase's `util_pct`).
//!
//! # Samples
//!
//! `nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES)` behaves like the
//! driver's buffer: one sample every [`SAMPLE_PERIOD_US`] (about 166 ms) on a
//! grid that starts at the first `nvmlInit`, each with the utilization of the
//! phase it falls in, stamped in CLOCK_REALTIME microseconds; a call returns
//! those newer than `lastSeenTimeStamp` (at most [`BUFFER_SAMPLES`], the
//! newest), or `NVML_ERROR_NOT_FOUND` when there is none.
//! `nvmlDeviceGetProcessUtilization` returns one row per listed process with
//! a non-zero `sm_util_pct`, stamped with the newest grid point, when that
//! point is newer than `lastSeenTimeStamp` (else `NOT_FOUND`).
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_uint, c_ulonglong, c_void, CStr};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Deserialize;

/// The environment variable naming the script.
pub const SCRIPT_ENV: &str = "STALL_NVML_SCRIPT";
/// Spacing of utilization samples, µs (NVIDIA drivers sample about 6 times
/// a second).
pub const SAMPLE_PERIOD_US: u64 = 166_667;
/// How many samples the simulated driver buffer keeps.
pub const BUFFER_SAMPLES: usize = 120;
/// Every NVML function this library exports.
pub const EXPORTED: [&str; 25] = [
    "nvmlInit",
    "nvmlInit_v2",
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlErrorString",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetName",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetSamples",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetPowerManagementDefaultLimit",
];

// nvmlReturn_t values (nvml.h).
type Ret = c_uint;
const SUCCESS: Ret = 0;
const ERROR_UNINITIALIZED: Ret = 1;
const ERROR_INVALID_ARGUMENT: Ret = 2;
const ERROR_NOT_SUPPORTED: Ret = 3;
const ERROR_NOT_FOUND: Ret = 6;
const ERROR_INSUFFICIENT_SIZE: Ret = 7;
const ERROR_LIBRARY_NOT_FOUND: Ret = 12;
const ERROR_GPU_IS_LOST: Ret = 15;
const ERROR_UNKNOWN: Ret = 999;

const GPU_UTILIZATION_SAMPLES: c_uint = 1;
const VALUE_TYPE_UNSIGNED_INT: c_uint = 1;
/// NVML_VALUE_NOT_AVAILABLE as an unsigned long long.
const VALUE_NOT_AVAILABLE_U64: u64 = u64::MAX;
/// gpuInstanceId / computeInstanceId outside MIG.
const NO_INSTANCE: c_uint = 0xFFFF_FFFF;
const DRIVER_VERSION: &str = "570.86.15";

// ---- C layouts (nvml.h, as in nvml-wrapper-sys's bindings) ----

/// nvmlDevice_t: an opaque pointer; here `index + 1`.
pub type Handle = *mut c_void;

#[repr(C)]
#[derive(Clone, Copy)]
pub union Value {
    pub dVal: f64,
    pub siVal: i32,
    pub uiVal: c_uint,
    pub ulVal: u64,
    pub ullVal: c_ulonglong,
    pub sllVal: i64,
    pub usVal: u16,
}

/// nvmlSample_t.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Sample {
    pub timeStamp: c_ulonglong,
    pub sampleValue: Value,
}

/// nvmlUtilization_t.
#[repr(C)]
pub struct Utilization {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// nvmlMemory_t.
#[repr(C)]
pub struct Memory {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// nvmlMemory_v2_t.
#[repr(C)]
pub struct MemoryV2 {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// nvmlProcessInfo_t (v2 layout, used by the _v2 and _v3 process lists).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProcessInfo {
    pub pid: c_uint,
    pub usedGpuMemory: c_ulonglong,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
}

/// nvmlProcessUtilizationSample_t.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProcessUtilizationSample {
    pub pid: c_uint,
    pub timeStamp: c_ulonglong,
    pub smUtil: c_uint,
    pub memUtil: c_uint,
    pub encUtil: c_uint,
    pub decUtil: c_uint,
}

// ---- The script ----

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct Script {
    devices: Vec<DeviceSpec>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct DeviceSpec {
    #[serde(default = "default_name")]
    name: String,
    #[serde(default = "default_mem_total")]
    mem_total_bytes: u64,
    #[serde(default)]
    power_limit_mw: Option<u32>,
    phases: Vec<Phase>,
    #[serde(default)]
    lost_after_s: Option<f64>,
}

fn default_name() -> String {
    "Scripted GPU".into()
}

fn default_mem_total() -> u64 {
    80_000_000_000
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct Phase {
    #[serde(default)]
    for_s: Option<f64>,
    #[serde(default)]
    util_pct: u32,
    #[serde(default)]
    power_mw: Option<u32>,
    #[serde(default)]
    mem_used_bytes: Option<u64>,
    #[serde(default)]
    processes: Vec<ProcSpec>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct ProcSpec {
    #[serde(default)]
    pid: Option<u32>,
    #[serde(default)]
    pid_file: Option<PathBuf>,
    #[serde(default)]
    pid_of: Option<String>,
    #[serde(default)]
    used_mem_bytes: Option<u64>,
    #[serde(default)]
    sm_util_pct: Option<u32>,
}

impl Script {
    fn parse(text: &str) -> Result<Script, String> {
        let s: Script = serde_json::from_str(text).map_err(|e| e.to_string())?;
        for (i, d) in s.devices.iter().enumerate() {
            if d.phases.is_empty() {
                return Err(format!("device {i} has no phases"));
            }
            for p in &d.phases {
                for q in &p.processes {
                    let ways = [q.pid.is_some(), q.pid_file.is_some(), q.pid_of.is_some()];
                    if ways.iter().filter(|w| **w).count() != 1 {
                        return Err(format!("device {i}: a process needs one of pid, pid_file, pid_of"));
                    }
                }
            }
        }
        Ok(s)
    }
}

impl DeviceSpec {
    /// The phase in force `t` after the first init.
    fn phase_at(&self, t: Duration) -> &Phase {
        let t = t.as_secs_f64();
        let mut end = 0.0;
        for p in &self.phases {
            match p.for_s {
                Some(d) => {
                    end += d.max(0.0);
                    if t < end {
                        return p;
                    }
                }
                None => return p,
            }
        }
        self.phases.last().expect("checked at parse")
    }

    fn lost_at(&self, t: Duration) -> bool {
        self.lost_after_s.is_some_and(|s| t.as_secs_f64() >= s)
    }
}

impl Phase {
    fn util(&self) -> u32 {
        self.util_pct.min(100)
    }

    /// `(pid, used memory, SM utilization)` of the processes whose pid is
    /// known now.
    fn processes(&self) -> Vec<(u32, u64, u32)> {
        self.processes
            .iter()
            .filter_map(|p| {
                let pid = p.resolve_pid()?;
                let mem = p.used_mem_bytes.unwrap_or(VALUE_NOT_AVAILABLE_U64);
                Some((pid, mem, p.sm_util_pct.unwrap_or(self.util_pct).min(100)))
            })
            .collect()
    }

    fn mem_used(&self) -> u64 {
        self.mem_used_bytes.unwrap_or_else(|| {
            self.processes.iter().filter_map(|p| p.used_mem_bytes).fold(0u64, u64::saturating_add)
        })
    }
}

impl ProcSpec {
    fn resolve_pid(&self) -> Option<u32> {
        if let Some(pid) = self.pid {
            return Some(pid);
        }
        if let Some(f) = &self.pid_file {
            return pid_from_file(f);
        }
        let of = self.pid_of.as_deref()?;
        if let Some(var) = of.strip_prefix("env:") {
            return std::env::var(var).ok()?.trim().parse().ok();
        }
        if let Some(f) = of.strip_prefix("file:") {
            return pid_from_file(Path::new(f));
        }
        None
    }
}

fn pid_from_file(f: &Path) -> Option<u32> {
    std::fs::read_to_string(f).ok()?.trim().parse().ok()
}

// ---- Library state ----

/// What identifies one version of the script file.
type FileKey = (i64, i64, u64, u64);

struct State {
    /// nvmlInit calls not yet matched by nvmlShutdown.
    inits: u32,
    /// The first successful init: phases and the sample grid start here.
    epoch: Option<Instant>,
    script: Option<Script>,
    key: Option<FileKey>,
}

static STATE: Mutex<State> = Mutex::new(State { inits: 0, epoch: None, script: None, key: None });

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

fn file_key(path: &Path) -> Option<FileKey> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.mtime(), m.mtime_nsec(), m.size(), m.ino()))
}

impl State {
    /// Re-reads the script if the file changed. Err: no usable script at all.
    fn refresh(&mut self) -> Result<(), Ret> {
        let Some(path) = std::env::var_os(SCRIPT_ENV).map(PathBuf::from) else {
            return self.script.as_ref().map(|_| ()).ok_or(ERROR_LIBRARY_NOT_FOUND);
        };
        let key = file_key(&path);
        if key.is_some() && key != self.key {
            if let Ok(s) =
                std::fs::read_to_string(&path).map_err(|e| e.to_string()).and_then(|t| Script::parse(&t))
            {
                self.script = Some(s);
                self.key = key;
            } else if self.script.is_none() {
                return Err(ERROR_UNKNOWN);
            }
        }
        match (&self.script, key) {
            (Some(_), _) => Ok(()),
            (None, None) => Err(ERROR_LIBRARY_NOT_FOUND),
            (None, Some(_)) => Err(ERROR_UNKNOWN),
        }
    }

    fn elapsed(&self) -> Duration {
        self.epoch.map(|e| e.elapsed()).unwrap_or_default()
    }

    /// The script, once initialized and refreshed.
    fn ready(&mut self) -> Result<&Script, Ret> {
        if self.inits == 0 {
            return Err(ERROR_UNINITIALIZED);
        }
        self.refresh()?;
        self.script.as_ref().ok_or(ERROR_UNKNOWN)
    }
}

/// Runs `f` on the device behind `handle` with the time since the epoch,
/// unless NVML is not initialized, the handle is bad or the GPU is lost.
fn with_device(
    handle: Handle,
    f: impl FnOnce(&DeviceSpec, u32, Duration, Instant) -> Result<(), Ret>,
) -> Ret {
    let mut st = state();
    let epoch = st.epoch;
    let t = st.elapsed();
    let script = match st.ready() {
        Ok(s) => s,
        Err(e) => return e,
    };
    let index = (handle as usize).wrapping_sub(1);
    let Some(dev) = script.devices.get(index) else {
        return ERROR_INVALID_ARGUMENT;
    };
    if dev.lost_at(t) {
        return ERROR_GPU_IS_LOST;
    }
    match f(dev, index as u32, t, epoch.unwrap_or_else(Instant::now)) {
        Ok(()) => SUCCESS,
        Err(e) => e,
    }
}

// ---- Sample grid ----

/// Microseconds since the Unix epoch of a monotonic instant.
fn realtime_us(at: Instant) -> u64 {
    let now_mono = Instant::now();
    let now_real = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let real =
        if at <= now_mono { now_real.saturating_sub(now_mono - at) } else { now_real + (at - now_mono) };
    real.as_micros() as u64
}

/// Grid points `k >= 1` (times `k * SAMPLE_PERIOD_US` after the epoch) that
/// have passed at `t`, as `(k, realtime stamp)`, newer than `last_seen_us`,
/// the newest `max` of them, oldest first.
fn grid_points(epoch: Instant, t: Duration, last_seen_us: u64, max: usize) -> Vec<(u64, u64)> {
    let passed = t.as_micros() as u64 / SAMPLE_PERIOD_US;
    let epoch_us = realtime_us(epoch);
    let mut out = Vec::new();
    let mut k = passed;
    while k >= 1 && out.len() < max {
        let ts = epoch_us + k * SAMPLE_PERIOD_US;
        if ts <= last_seen_us {
            break;
        }
        out.push((k, ts));
        k -= 1;
    }
    out.reverse();
    out
}

fn grid_time(k: u64) -> Duration {
    Duration::from_micros(k * SAMPLE_PERIOD_US)
}

/// Utilization samples newer than `last_seen_us`, as `(stamp, util)`.
fn util_samples(dev: &DeviceSpec, epoch: Instant, t: Duration, last_seen_us: u64) -> Vec<(u64, u32)> {
    grid_points(epoch, t, last_seen_us, BUFFER_SAMPLES)
        .into_iter()
        .map(|(k, ts)| (ts, dev.phase_at(grid_time(k)).util()))
        .collect()
}

/// Per-process rows of the newest grid point if newer than `last_seen_us`:
/// `(pid, stamp, sm util)`, non-zero utilization only.
fn proc_samples(dev: &DeviceSpec, epoch: Instant, t: Duration, last_seen_us: u64) -> Vec<(u32, u64, u32)> {
    let Some(&(k, ts)) = grid_points(epoch, t, last_seen_us, 1).last() else {
        return Vec::new();
    };
    dev.phase_at(grid_time(k))
        .processes()
        .into_iter()
        .filter(|&(_, _, sm)| sm > 0)
        .map(|(pid, _, sm)| (pid, ts, sm))
        .collect()
}

/// Copies `s` NUL-terminated into a C buffer of `len` bytes.
unsafe fn write_cstr(s: &str, buf: *mut c_char, len: c_uint) -> Ret {
    if buf.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    let bytes = s.as_bytes();
    if bytes.len() + 1 > len as usize {
        return ERROR_INSUFFICIENT_SIZE;
    }
    std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, bytes.len());
    *buf.add(bytes.len()) = 0;
    SUCCESS
}

/// The count-then-fill protocol of NVML's list calls: with no buffer (or
/// one too small) `*count` learns the size needed.
unsafe fn fill<T: Copy>(rows: &[T], count: *mut c_uint, buf: *mut T, empty_ok_without_buf: bool) -> Ret {
    if count.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    let cap = *count as usize;
    *count = rows.len() as c_uint;
    if buf.is_null() || cap < rows.len() {
        if rows.is_empty() && empty_ok_without_buf {
            return SUCCESS;
        }
        return ERROR_INSUFFICIENT_SIZE;
    }
    std::ptr::copy_nonoverlapping(rows.as_ptr(), buf, rows.len());
    SUCCESS
}

// ---- Exported NVML API ----

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> Ret {
    let mut st = state();
    if let Err(e) = st.refresh() {
        return e;
    }
    st.inits += 1;
    st.epoch.get_or_insert_with(Instant::now);
    SUCCESS
}

#[no_mangle]
pub extern "C" fn nvmlInit() -> Ret {
    nvmlInit_v2()
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    nvmlInit_v2()
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> Ret {
    let mut st = state();
    if st.inits == 0 {
        return ERROR_UNINITIALIZED;
    }
    st.inits -= 1;
    SUCCESS
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(result: Ret) -> *const c_char {
    let s: &'static CStr = match result {
        SUCCESS => c"Success",
        ERROR_UNINITIALIZED => c"Uninitialized",
        ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        ERROR_NOT_SUPPORTED => c"Not Supported",
        ERROR_NOT_FOUND => c"Not Found",
        ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        ERROR_LIBRARY_NOT_FOUND => c"NVML Shared Library Not Found (scripted: no STALL_NVML_SCRIPT file)",
        ERROR_GPU_IS_LOST => c"GPU is lost",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> Ret {
    if state().inits == 0 {
        return ERROR_UNINITIALIZED;
    }
    write_cstr(DRIVER_VERSION, version, length)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> Ret {
    if count.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    let mut st = state();
    match st.ready() {
        Ok(s) => {
            *count = s.devices.len() as c_uint;
            SUCCESS
        }
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> Ret {
    nvmlDeviceGetCount_v2(count)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut Handle) -> Ret {
    if device.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    let handle = (index as usize + 1) as Handle;
    with_device(handle, |_, _, _, _| {
        *device = handle;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(index: c_uint, device: *mut Handle) -> Ret {
    nvmlDeviceGetHandleByIndex_v2(index, device)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(device: Handle, name: *mut c_char, length: c_uint) -> Ret {
    with_device(device, |d, _, _, _| match write_cstr(&d.name, name, length) {
        SUCCESS => Ok(()),
        e => Err(e),
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: Handle, index: *mut c_uint) -> Ret {
    if index.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    with_device(device, |_, i, _, _| {
        *index = i;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSamples(
    device: Handle,
    kind: c_uint,
    last_seen_time_stamp: c_ulonglong,
    value_type: *mut c_uint,
    sample_count: *mut c_uint,
    samples: *mut Sample,
) -> Ret {
    if sample_count.is_null() || value_type.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    with_device(device, |d, _, t, epoch| {
        if kind != GPU_UTILIZATION_SAMPLES {
            return Err(ERROR_NOT_SUPPORTED);
        }
        let rows = util_samples(d, epoch, t, last_seen_time_stamp);
        if rows.is_empty() {
            return Err(ERROR_NOT_FOUND);
        }
        *value_type = VALUE_TYPE_UNSIGNED_INT;
        if samples.is_null() {
            *sample_count = rows.len() as c_uint;
            return Ok(());
        }
        // Time may have moved since the caller sized its buffer: the oldest
        // fit, the rest come with the next call.
        let n = rows.len().min(*sample_count as usize);
        for (i, &(ts, util)) in rows.iter().take(n).enumerate() {
            *samples.add(i) = Sample { timeStamp: ts, sampleValue: Value { ullVal: 0 } };
            (*samples.add(i)).sampleValue.uiVal = util;
        }
        *sample_count = n as c_uint;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(device: Handle, utilization: *mut Utilization) -> Ret {
    if utilization.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    with_device(device, |d, _, t, _| {
        *utilization = Utilization { gpu: d.phase_at(t).util(), memory: 0 };
        Ok(())
    })
}

fn memory(d: &DeviceSpec, t: Duration) -> (u64, u64) {
    let used = d.phase_at(t).mem_used().min(d.mem_total_bytes);
    (d.mem_total_bytes, used)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: Handle, memory_out: *mut Memory) -> Ret {
    if memory_out.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    with_device(device, |d, _, t, _| {
        let (total, used) = memory(d, t);
        *memory_out = Memory { total, free: total - used, used };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(device: Handle, memory_out: *mut MemoryV2) -> Ret {
    if memory_out.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    with_device(device, |d, _, t, _| {
        let (total, used) = memory(d, t);
        let version = (*memory_out).version;
        *memory_out = MemoryV2 { version, total, reserved: 0, free: total - used, used };
        Ok(())
    })
}

unsafe fn compute_processes(device: Handle, count: *mut c_uint, infos: *mut ProcessInfo) -> Ret {
    with_device(device, |d, _, t, _| {
        let rows: Vec<ProcessInfo> = d
            .phase_at(t)
            .processes()
            .into_iter()
            .map(|(pid, mem, _)| ProcessInfo {
                pid,
                usedGpuMemory: mem,
                gpuInstanceId: NO_INSTANCE,
                computeInstanceId: NO_INSTANCE,
            })
            .collect();
        match fill(&rows, count, infos, true) {
            SUCCESS => Ok(()),
            e => Err(e),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: Handle,
    info_count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    compute_processes(device, info_count, infos)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: Handle,
    info_count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    compute_processes(device, info_count, infos)
}

/// Scripted GPUs run compute jobs only: the graphics list is empty.
unsafe fn graphics_processes(device: Handle, count: *mut c_uint, infos: *mut ProcessInfo) -> Ret {
    with_device(device, |_, _, _, _| match fill::<ProcessInfo>(&[], count, infos, true) {
        SUCCESS => Ok(()),
        e => Err(e),
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: Handle,
    info_count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    graphics_processes(device, info_count, infos)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v2(
    device: Handle,
    info_count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    graphics_processes(device, info_count, infos)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: Handle,
    utilization: *mut ProcessUtilizationSample,
    process_samples_count: *mut c_uint,
    last_seen_time_stamp: c_ulonglong,
) -> Ret {
    if process_samples_count.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    with_device(device, |d, _, t, epoch| {
        let rows: Vec<ProcessUtilizationSample> = proc_samples(d, epoch, t, last_seen_time_stamp)
            .into_iter()
            .map(|(pid, ts, sm)| ProcessUtilizationSample {
                pid,
                timeStamp: ts,
                smUtil: sm,
                memUtil: 0,
                encUtil: 0,
                decUtil: 0,
            })
            .collect();
        if rows.is_empty() {
            *process_samples_count = 0;
            return Err(ERROR_NOT_FOUND);
        }
        if utilization.is_null() {
            *process_samples_count = rows.len() as c_uint;
            return Ok(());
        }
        match fill(&rows, process_samples_count, utilization, false) {
            SUCCESS => Ok(()),
            e => Err(e),
        }
    })
}

unsafe fn write_u32(out: *mut c_uint, v: Option<u32>) -> Result<(), Ret> {
    if out.is_null() {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    *out = v.ok_or(ERROR_NOT_SUPPORTED)?;
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(device: Handle, power: *mut c_uint) -> Ret {
    with_device(device, |d, _, t, _| write_u32(power, d.phase_at(t).power_mw))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(device: Handle, limit: *mut c_uint) -> Ret {
    with_device(device, |d, _, _, _| write_u32(limit, d.power_limit_mw))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimit(device: Handle, limit: *mut c_uint) -> Ret {
    with_device(device, |d, _, _, _| write_u32(limit, d.power_limit_mw))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementDefaultLimit(device: Handle, limit: *mut c_uint) -> Ret {
    with_device(device, |d, _, _, _| write_u32(limit, d.power_limit_mw))
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"{"devices": [{"name": "Scripted H200", "mem_total_bytes": 150000000000, "power_limit_mw": 700000,
        "phases": [{"for_s": 5.0, "util_pct": 0, "power_mw": 80000, "mem_used_bytes": 1000000000,
                    "processes": [{"pid": 1234, "used_mem_bytes": 1000000000, "sm_util_pct": 0}]},
                   {"for_s": 2.5, "util_pct": 40},
                   {"util_pct": 100, "power_mw": 650000, "processes": [{"pid_of": "env:STALL_NVML_TEST_PID"}]}],
        "lost_after_s": null}]}"#;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn parses_the_documented_shape() {
        let s = Script::parse(EXAMPLE).unwrap();
        let d = &s.devices[0];
        assert_eq!(d.name, "Scripted H200");
        assert_eq!(d.power_limit_mw, Some(700_000));
        assert_eq!(d.phases.len(), 3);
        assert_eq!(d.lost_after_s, None);
        // Defaults.
        let s = Script::parse(r#"{"devices": [{"phases": [{}]}]}"#).unwrap();
        assert_eq!(s.devices[0].name, "Scripted GPU");
        assert_eq!(s.devices[0].phases[0].util(), 0);
        // Mistakes are refused, not guessed.
        assert!(Script::parse(r#"{"devices": [{"phases": []}]}"#).is_err());
        assert!(Script::parse(r#"{"devices": [{"phases": [{"util": 3}]}]}"#).is_err());
        assert!(Script::parse(r#"{"devices": [{"phases": [{"processes": [{}]}]}]}"#).is_err());
        assert!(Script::parse(
            r#"{"devices": [{"phases": [{"processes": [{"pid": 1, "pid_file": "x"}]}]}]}"#
        )
        .is_err());
        assert!(Script::parse("not json").is_err());
    }

    #[test]
    fn phases_follow_each_other_and_the_last_lasts() {
        let s = Script::parse(EXAMPLE).unwrap();
        let d = &s.devices[0];
        assert_eq!(d.phase_at(secs(0.0)).util_pct, 0);
        assert_eq!(d.phase_at(secs(4.999)).util_pct, 0);
        assert_eq!(d.phase_at(secs(5.0)).util_pct, 40);
        assert_eq!(d.phase_at(secs(7.49)).util_pct, 40);
        assert_eq!(d.phase_at(secs(7.5)).util_pct, 100);
        assert_eq!(d.phase_at(secs(1e6)).util_pct, 100);
        // All phases timed: the last one stays once they are over.
        let s = Script::parse(
            r#"{"devices": [{"phases": [{"for_s": 1, "util_pct": 10}, {"for_s": 1, "util_pct": 20}]}]}"#,
        )
        .unwrap();
        assert_eq!(s.devices[0].phase_at(secs(0.5)).util_pct, 10);
        assert_eq!(s.devices[0].phase_at(secs(30.0)).util_pct, 20);
        // Lost from lost_after_s on.
        let s = Script::parse(r#"{"devices": [{"phases": [{}], "lost_after_s": 1.5}]}"#).unwrap();
        assert!(!s.devices[0].lost_at(secs(1.49)));
        assert!(s.devices[0].lost_at(secs(1.5)));
    }

    #[test]
    fn processes_resolve_their_pids() {
        let dir = std::env::temp_dir().join(format!("nvml-script-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pid_file = dir.join("pid");
        let text = format!(
            r#"{{"devices": [{{"phases": [{{"util_pct": 70, "processes": [
                {{"pid": 7, "used_mem_bytes": 100}},
                {{"pid_file": "{0}", "used_mem_bytes": 200, "sm_util_pct": 30}},
                {{"pid_of": "file:{0}"}},
                {{"pid_of": "env:STALL_NVML_TEST_NO_SUCH_VAR"}}]}}]}}]}}"#,
            pid_file.display()
        );
        let s = Script::parse(&text).unwrap();
        let p = &s.devices[0].phases[0];
        // The pid file is not there yet: only the fixed pid.
        assert_eq!(p.processes(), vec![(7, 100, 70)]);
        std::fs::write(&pid_file, "4242\n").unwrap();
        assert_eq!(p.processes(), vec![(7, 100, 70), (4242, 200, 30), (4242, VALUE_NOT_AVAILABLE_U64, 70)]);
        assert_eq!(p.mem_used(), 300);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn samples_come_one_per_period_and_only_new_ones() {
        let s = Script::parse(EXAMPLE).unwrap();
        let d = &s.devices[0];
        let epoch = Instant::now();
        let epoch_us = realtime_us(epoch);
        // 1 s in: 6 grid points (166.667 ms apart), all in the idle phase.
        let rows = util_samples(d, epoch, secs(1.01), 0);
        assert_eq!(rows.len(), 6);
        for (i, &(ts, util)) in rows.iter().enumerate() {
            let want = epoch_us + (i as u64 + 1) * SAMPLE_PERIOD_US;
            assert!(ts.abs_diff(want) <= 2, "{ts} vs {want}");
            assert_eq!(util, 0);
        }
        // Stamps are CLOCK_REALTIME µs: close to the wall clock.
        let now_us = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as u64;
        assert!(rows[0].0.abs_diff(now_us) < 5_000_000);
        // Incremental: after the newest seen, nothing new until a period passes.
        let last = rows.last().unwrap().0;
        assert!(util_samples(d, epoch, secs(1.1), last).is_empty());
        let more = util_samples(d, epoch, secs(1.6), last);
        assert_eq!(more.len(), 3);
        assert!(more[0].0 > last);
        // Across the phase change at 5 s and 7.5 s: values follow the phase
        // of each sample's own time.
        let rows = util_samples(d, epoch, secs(8.0), realtime_us(epoch + secs(4.5)));
        let utils: Vec<u32> = rows.iter().map(|r| r.1).collect();
        assert_eq!(utils.first(), Some(&0));
        assert!(utils.contains(&40));
        assert_eq!(utils.last(), Some(&100));
        // The buffer keeps only the newest BUFFER_SAMPLES.
        let rows = util_samples(d, epoch, secs(100.0), 0);
        assert_eq!(rows.len(), BUFFER_SAMPLES);
        assert!(rows.windows(2).all(|w| w[0].0 < w[1].0));
        // Nothing before the first period.
        assert!(util_samples(d, epoch, secs(0.1), 0).is_empty());
    }

    #[test]
    fn process_samples_are_the_newest_window() {
        std::env::set_var("STALL_NVML_TEST_PID", "99");
        let s = Script::parse(EXAMPLE).unwrap();
        let d = &s.devices[0];
        let epoch = Instant::now();
        // Idle phase: the process has 0 % and is not listed.
        assert!(proc_samples(d, epoch, secs(1.0), 0).is_empty());
        let rows = proc_samples(d, epoch, secs(10.0), 0);
        assert_eq!(rows.len(), 1);
        assert_eq!((rows[0].0, rows[0].2), (99, 100));
        // Already seen: nothing.
        assert!(proc_samples(d, epoch, secs(10.0), rows[0].1).is_empty());
    }

    #[test]
    fn c_layouts_match_nvml() {
        use std::mem::size_of;
        assert_eq!(size_of::<Sample>(), 16);
        assert_eq!(size_of::<ProcessInfo>(), 24);
        assert_eq!(size_of::<ProcessUtilizationSample>(), 32);
        assert_eq!(size_of::<MemoryV2>(), 40);
        assert_eq!(size_of::<Memory>(), 24);
        assert_eq!(size_of::<Utilization>(), 8);
    }

    #[test]
    fn list_protocol() {
        let rows = [1u32, 2, 3];
        let mut count = 0;
        unsafe {
            assert_eq!(fill(&rows, &mut count, std::ptr::null_mut(), true), ERROR_INSUFFICIENT_SIZE);
            assert_eq!(count, 3);
            let mut buf = [0u32; 5];
            count = 5;
            assert_eq!(fill(&rows, &mut count, buf.as_mut_ptr(), true), SUCCESS);
            assert_eq!((count, &buf[..3]), (3, &rows[..]));
            count = 0;
            assert_eq!(fill::<u32>(&[], &mut count, std::ptr::null_mut(), true), SUCCESS);
            assert_eq!(count, 0);
        }
        let mut buf = [0 as c_char; 4];
        unsafe {
            assert_eq!(write_cstr("abcd", buf.as_mut_ptr(), 4), ERROR_INSUFFICIENT_SIZE);
            assert_eq!(write_cstr("abc", buf.as_mut_ptr(), 4), SUCCESS);
            assert_eq!(CStr::from_ptr(buf.as_ptr()).to_str().unwrap(), "abc");
        }
    }
}
