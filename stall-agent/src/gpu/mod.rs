//! GPU side of stall: per-device utilization timeline, memory, and the
//! processes that hold a context on each device.
//!
//! Every timestamp here is CLOCK_MONOTONIC nanoseconds, the clock
//! `bpf_ktime_get_ns()` reads, so GPU samples and the kernel events of the
//! training job share one time axis without any further conversion.
//!
//! The real source is NVML (`libnvidia-ml.so.1`, loaded at run time, see
//! [`NvmlGpu`]); [`FakeGpu`] replays scripted snapshots for tests of code that
//! consumes GPU data on machines (and CI) without a GPU.

mod fake;
mod nvml;
mod select;
mod window;

use std::ffi::OsStr;
use std::path::Path;

use serde::{Deserialize, Serialize};

pub use crate::clock::{monotonic_ns, ClockSnapshot};
pub use fake::FakeGpu;
pub use nvml::{NvmlGpu, DEFAULT_NVML_LIB};
pub use select::GpuSelect;
pub use window::{gpu_window, GpuWindow, IDLE_UTIL_PCT};

/// One device-utilization sample.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct GpuSample {
    /// CLOCK_MONOTONIC nanoseconds (same clock as `bpf_ktime_get_ns`).
    pub ts_ns: u64,
    /// Percent of the driver's sample period during which at least one
    /// kernel was running on the device (NVML "GPU utilization"), 0..=100.
    pub util_pct: f64,
}

/// One process holding a context on a device.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct GpuProcUse {
    /// Host (init pid namespace) pid, as NVML reports it; the eBPF side sees
    /// the same numbers.
    pub pid: u32,
    /// Device memory held by the process; `None` when the driver does not
    /// say (e.g. NVML_VALUE_NOT_AVAILABLE).
    pub used_mem_bytes: Option<u64>,
    /// SM utilization of the process in the driver's newest per-process
    /// window (carried over between driver samples, 0 once that window is
    /// stale); `None` when per-process accounting is unsupported or failed.
    pub sm_util_pct: Option<f64>,
}

/// One poll of one device.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct GpuSnapshot {
    /// NVML device index.
    pub index: u32,
    pub name: String,
    /// New utilization samples since the previous poll, oldest first.
    pub samples: Vec<GpuSample>,
    /// 0 (with `mem_total_bytes` 0) when the driver did not answer.
    pub mem_used_bytes: u64,
    pub mem_total_bytes: u64,
    /// Compute (and graphics) processes running on the device, by pid.
    pub processes: Vec<GpuProcUse>,
    /// Board power draw at poll time, milliwatts (`nvmlDeviceGetPowerUsage`);
    /// `None` when the device does not say. Utilization counts time with a
    /// kernel running, so a spinning collective reads ~100 %; power against
    /// the limit tells busy from stuck.
    pub power_mw: Option<u32>,
    /// Enforced power limit, milliwatts; `None` when the device does not say.
    pub power_limit_mw: Option<u32>,
}

/// Something that can be polled for GPU snapshots.
///
/// `poll` makes blocking driver calls (typically well under a millisecond
/// per device, more with many processes): from async code call it via
/// `tokio::task::spawn_blocking` or from a dedicated thread.
pub trait GpuSource: Send {
    /// One snapshot per sampled device (devices whose handle cannot be read
    /// this time are left out). Never panics.
    fn poll(&mut self) -> Vec<GpuSnapshot>;

    /// `(index, name)` of every device this source samples.
    fn devices(&self) -> Vec<(u32, String)>;

    /// One-line notices gathered since the last call (a device lost, a
    /// feature unsupported and replaced by a fallback, ...), each distinct
    /// notice reported once so the agent can log them without flooding.
    fn take_warnings(&mut self) -> Vec<String> {
        Vec::new()
    }
}

/// Why the GPU side cannot be sampled. `Display` is always a single line, fit
/// to print as is next to the CPU-side results.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuError {
    /// The library is missing, the driver is not loaded, no permission, or
    /// NVML failed to initialize.
    #[error("no NVML: GPU side not sampled ({reason})")]
    NoNvml { reason: String },
    /// NVML works but reports no device.
    #[error("no GPU: NVML reports no NVIDIA device; GPU side not sampled")]
    NoDevices,
    /// `--gpu` named an index NVML does not have.
    #[error("no GPU {index}: NVML reports {count} device(s) (indices start at 0); GPU side not sampled")]
    NoSuchDevice { index: u32, count: u32 },
    /// A selected device exists but cannot be opened.
    #[error("GPU {index} not sampled: {reason}")]
    Device { index: u32, reason: String },
    /// `--gpu` value that is neither `off`, `all` nor a list of indices.
    #[error("invalid --gpu value {input:?}: {reason} (expected off, all, or device indices like 0,2)")]
    BadSelect { input: String, reason: String },
}

impl GpuError {
    /// What is missing, worded for an error that ends stall (the `Display`
    /// form is a note that stall goes on after).
    pub fn cause(&self) -> String {
        match self {
            GpuError::NoNvml { reason } => format!("no NVML ({reason})"),
            GpuError::NoDevices => "NVML reports no NVIDIA device".into(),
            GpuError::NoSuchDevice { index, count } => {
                format!("no GPU {index}: NVML reports {count} device(s) (indices start at 0)")
            }
            GpuError::Device { index, reason } => format!("GPU {index} cannot be opened: {reason}"),
            GpuError::BadSelect { .. } => self.to_string(),
        }
    }
}

/// Opens the GPU source chosen on the command line.
///
/// `Off` gives `Ok(None)`. A missing library/driver, an NVML failure or an
/// absent device gives an `Err` whose `Display` is one line that the agent can
/// print before going on with the CPU side only.
pub fn open(select: &GpuSelect) -> Result<Option<Box<dyn GpuSource>>, GpuError> {
    open_with_library(select, OsStr::new(DEFAULT_NVML_LIB))
}

/// Like [`open`], loading NVML from `lib` (a file name searched the `dlopen`
/// way, or a path), e.g. for drivers installed outside the loader path.
pub fn open_with_library(select: &GpuSelect, lib: &OsStr) -> Result<Option<Box<dyn GpuSource>>, GpuError> {
    if *select == GpuSelect::Off {
        return Ok(None);
    }
    let gpu = NvmlGpu::open_with_library(select, lib)?;
    Ok(Some(Box::new(gpu)))
}

/// The library to load: `path` if given, else [`DEFAULT_NVML_LIB`] (for
/// `--nvml-lib`).
pub fn library(path: Option<&Path>) -> &OsStr {
    path.map_or(OsStr::new(DEFAULT_NVML_LIB), Path::as_os_str)
}

/// Collapses a message to one line: driver/loader strings are not ours and
/// could in principle carry newlines, and `GpuError` promises a single line.
pub(crate) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_one_line(msg: &str) {
        assert!(!msg.is_empty());
        assert!(!msg.contains('\n') && !msg.contains('\r'), "{msg:?}");
    }

    #[test]
    fn off_opens_nothing() {
        assert!(open(&GpuSelect::Off).unwrap().is_none());
        // Off never touches the library, even a bogus one.
        let r = open_with_library(&GpuSelect::Off, OsStr::new("/nonexistent/libnvml.so"));
        assert!(r.unwrap().is_none());
    }

    #[test]
    fn open_all_without_driver_is_one_line_no_nvml() {
        // This machine (and CI) has no NVIDIA driver, so this must be a clean
        // error; on a GPU host Ok is fine too.
        match open(&GpuSelect::All) {
            Ok(src) => {
                let src = src.expect("All must give a source");
                assert!(!src.devices().is_empty());
            }
            Err(e) => {
                let msg = e.to_string();
                assert_one_line(&msg);
                match e {
                    GpuError::NoNvml { .. } => assert!(msg.starts_with("no NVML"), "{msg}"),
                    // A host with the driver installed but no device left.
                    GpuError::NoDevices => {}
                    other => panic!("unexpected error: {other}"),
                }
            }
        }
    }

    #[test]
    fn missing_library_is_no_nvml_everywhere() {
        // Deterministic on every host: the library path does not exist.
        let lib = "/nonexistent/dir/libnvidia-ml.so.1";
        let err = match open_with_library(&GpuSelect::All, OsStr::new(lib)) {
            Err(e) => e,
            Ok(_) => panic!("a nonexistent library cannot open"),
        };
        let msg = err.to_string();
        assert_one_line(&msg);
        assert_eq!(msg, format!("no NVML: GPU side not sampled ({lib} not found)"));
        let err = match open_with_library(&GpuSelect::Indices(vec![3]), OsStr::new(lib)) {
            Err(e) => e,
            Ok(_) => panic!("a nonexistent library cannot open"),
        };
        assert!(matches!(err, GpuError::NoNvml { .. }));
    }

    #[test]
    fn wrong_library_is_no_nvml() {
        // A library that loads but is not NVML (no nvmlInit_v2): still a
        // clean one-line error, no panic.
        match open_with_library(&GpuSelect::All, OsStr::new("libc.so.6")) {
            Err(e @ GpuError::NoNvml { .. }) => {
                let msg = e.to_string();
                assert_one_line(&msg);
                assert!(msg.starts_with("no NVML: GPU side not sampled ("), "{msg}");
            }
            Err(other) => panic!("unexpected error: {other}"),
            Ok(_) => panic!("libc is not NVML"),
        }
    }

    #[test]
    fn error_messages_are_single_lines() {
        let errs = [
            GpuError::NoNvml { reason: one_line("a\nb\r\n c") },
            GpuError::NoDevices,
            GpuError::NoSuchDevice { index: 4, count: 2 },
            GpuError::Device { index: 1, reason: "GPU is lost".into() },
            "0,\nx".parse::<GpuSelect>().unwrap_err(),
        ];
        for e in errs {
            assert_one_line(&e.to_string());
        }
        assert_eq!(
            GpuError::NoSuchDevice { index: 4, count: 2 }.to_string(),
            "no GPU 4: NVML reports 2 device(s) (indices start at 0); GPU side not sampled"
        );
        assert_eq!(one_line("a\nb\r\n c"), "a b c");
    }

    #[test]
    fn sources_are_send() {
        fn is_send<T: Send>() {}
        is_send::<NvmlGpu>();
        is_send::<FakeGpu>();
        is_send::<Box<dyn GpuSource>>();
    }
}
