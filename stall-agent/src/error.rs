//! Errors that end stall with their own exit code (see `exit`); every
//! other failure is an internal error. One type for `run`, `attach` and the
//! daemon, so `main` maps each cause to its code in one place.
use std::net::SocketAddr;

use crate::{capture::CaptureError, exit, gpu::GpuError};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Capture(#[from] CaptureError),
    /// `--gpu` named devices that cannot be sampled.
    #[error("cannot sample the GPUs --gpu asks for: {}; name NVML's library with --nvml-lib PATH, or trace the CPU side only with --gpu off", .0.cause())]
    Gpu(GpuError),
    /// `stall daemon --require-gpu` without GPU data.
    #[error("--require-gpu, but {0}; name NVML's library with --nvml-lib PATH, or leave --require-gpu out")]
    RequireGpu(String),
    /// `stall run` could not start its exec gate.
    #[error("{0}")]
    Spawn(String),
    /// A bad option found after parsing (e.g. a --json path that cannot be written).
    #[error("{0}")]
    Usage(String),
    #[error("cannot listen on {addr}: {reason}")]
    Listen { addr: SocketAddr, reason: String },
    /// `stall run`'s command is not on PATH (or not there), as a shell says.
    #[error("{0}: command not found")]
    CommandNotFound(String),
    #[error("{0}: cannot execute: {1}")]
    NotExecutable(String, String),
}

// By hand, not `#[from]`: that would make the GpuError the source too, and
// the one-line chain would say the cause twice.
impl From<GpuError> for Error {
    fn from(e: GpuError) -> Self {
        Error::Gpu(e)
    }
}

impl Error {
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Capture(c) => match c {
                CaptureError::MissingCaps(_)
                | CaptureError::NotPrivileged
                | CaptureError::MemlockTooLow(_) => exit::NOT_PRIVILEGED,
                CaptureError::NoSuchProcess(_)
                | CaptureError::BadCgroup { .. }
                | CaptureError::NoCgroup2
                | CaptureError::NoKubepods { .. } => exit::NO_TARGET,
                CaptureError::NoTracefs
                | CaptureError::MissingTracepoint { .. }
                | CaptureError::NoBtf
                | CaptureError::MissingKernelField { .. }
                | CaptureError::MissingFeature(_)
                | CaptureError::Load(_)
                | CaptureError::Verifier { .. }
                | CaptureError::Refused(_)
                | CaptureError::NoTrampolines(_)
                | CaptureError::Stub => exit::KERNEL,
                CaptureError::Map { .. } | CaptureError::Ring(_) | CaptureError::NotInObject(_) => {
                    exit::INTERNAL
                }
                CaptureError::Config(_) => exit::USAGE,
            },
            Error::Gpu(_) | Error::RequireGpu(_) => exit::GPU,
            Error::Spawn(_) => exit::INTERNAL,
            Error::Usage(_) => exit::USAGE,
            Error::Listen { .. } => exit::LISTEN,
            Error::CommandNotFound(_) => exit::NOT_FOUND,
            Error::NotExecutable(..) => exit::NOT_EXECUTABLE,
        }
    }
}

/// An error and its causes on one line ("a: b: c"), for messages that go on
/// after it (the daemon's) as well as the one that ends stall.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Creates the file an output option names, or says in one line why it
/// cannot: a usage error (exit 2), the same for --json and --timeline. A
/// file of the kernel's own filesystems (/proc, /sys, cgroups, tracefs)
/// takes no output: refused here, before anything is attached.
pub fn create_output(option: &str, p: &std::path::Path) -> Result<Output, Error> {
    let existed = std::fs::symlink_metadata(p).is_ok();
    let file = std::fs::File::create(p).map_err(|e| {
        let parent = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
        let why = match e.kind() {
            _ if p.is_dir() => "it is a directory".to_string(),
            std::io::ErrorKind::NotFound if !parent.is_dir() => format!("no directory {}", parent.display()),
            std::io::ErrorKind::PermissionDenied => "not writable (permission denied)".to_string(),
            _ => e.to_string(),
        };
        Error::Usage(format!("{option} {}: {why}", p.display()))
    })?;
    if let Some(fs) = kernel_filesystem(&file) {
        return Err(Error::Usage(format!(
            "{option} {}: a file of the kernel's {fs}, not an output",
            p.display()
        )));
    }
    Ok(Output { file, created: !existed })
}

/// An output file [`create_output`] opened.
pub struct Output {
    pub file: std::fs::File,
    /// It did not exist before: stall may remove it (never a file or a
    /// device it only opened).
    pub created: bool,
}

/// The kernel filesystem `file` lies on, if it is one that takes no
/// output (writes there configure the kernel, or fail).
fn kernel_filesystem(file: &std::fs::File) -> Option<&'static str> {
    use std::os::fd::AsRawFd;
    // SAFETY: fstatfs writes into the zeroed struct it is given, on a
    // descriptor this function borrows.
    let magic = unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        if libc::fstatfs(file.as_raw_fd(), &mut st) != 0 {
            return None;
        }
        st.f_type as u64
    };
    Some(match magic {
        0x9fa0 => "proc filesystem",
        0x6265_6572 => "sysfs",
        0x6367_7270 | 0x0027_e0eb => "cgroup filesystem",
        0x7472_6163 => "tracefs",
        0x6462_6720 => "debugfs",
        0xcafe_4a11 => "BPF filesystem",
        0x7363_6673 => "securityfs",
        _ => return None,
    })
}

/// A write to an output option's file that failed once running (a full
/// disk, a device that refuses): a usage error naming the option and the
/// path, as when it cannot be created.
pub fn output_failed(option: &str, p: &std::path::Path, e: &std::io::Error) -> Error {
    Error::Usage(format!("writing {option} {}: {e}", p.display()))
}
