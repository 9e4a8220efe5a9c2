//! Why capture failed, as callers branch on it (each cause has its own exit
//! code), with the kernel's answer kept as the source.
use std::path::PathBuf;

use aya::programs::ProgramError;

use super::btf;

/// Errors callers branch on (each has its own exit code).
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// Capabilities stall needs are not effective (see `caps`).
    #[error("{}", crate::caps::explain(.0))]
    MissingCaps(Vec<crate::caps::Need>),
    /// The kernel said EPERM although every capability was there.
    #[error("the kernel refused stall's eBPF programs: operation not permitted although {} are effective (a security module or kernel lockdown?)", crate::caps::names())]
    NotPrivileged,
    /// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK, which only
    /// CAP_SYS_RESOURCE may raise past its hard limit.
    #[error("the kernel refused stall's eBPF maps: kernels before 5.11 charge them to RLIMIT_MEMLOCK, which is {0} KiB here and stall may not raise; raise it (ulimit -l unlimited, LimitMEMLOCK=infinity in a systemd unit) or add CAP_SYS_RESOURCE")]
    MemlockTooLow(u64),
    #[error("tracefs is not mounted and could not be mounted at /sys/kernel/tracing")]
    NoTracefs,
    #[error("this kernel has no tracepoint {name} (stall needs it)")]
    MissingTracepoint { name: String },
    #[error("this kernel has no BTF at {} (stall needs CONFIG_DEBUG_INFO_BTF)", btf::VMLINUX)]
    NoBtf,
    #[error("this kernel's BTF has no {field} (stall reads it)")]
    MissingKernelField { field: String },
    #[error("this kernel lacks {0} (stall needs it)")]
    MissingFeature(String),
    #[error("no cgroup v2 hierarchy is mounted")]
    NoCgroup2,
    #[error("{} is not a cgroup v2 directory (cgroup2 is mounted at {})", path.display(), mount.display())]
    BadCgroup { path: PathBuf, mount: PathBuf },
    #[error("no process with PID {0}")]
    NoSuchProcess(u32),
    #[error(
        "no Kubernetes pods under {}: neither kubepods.slice (systemd cgroup driver) nor kubepods (cgroupfs); name the roots with --cgroup-root",
        mount.display()
    )]
    NoKubepods { mount: PathBuf },
    #[error(
        "this stall was built without its kernel side (STALL_BPF_STUB); build it with `cargo xtask build`"
    )]
    Stub,
    #[error(
        "the kernel refused stall's syscall trampolines (fentry/fexit): {0}; \
         --syscall-hooks tracepoint (or auto) uses the raw syscall tracepoints"
    )]
    NoTrampolines(String),
    /// The verifier refused a program: its name and reason, from its log.
    #[error("the kernel refused stall's eBPF programs: program {program}: {reason}")]
    Verifier { program: String, reason: String },
    /// A refusal already put in one line (a trampoline's attach).
    #[error("the kernel refused stall's eBPF programs: {0}")]
    Refused(String),
    /// Loading or attaching failed; the kernel's answer is the source.
    #[error("the kernel refused stall's eBPF programs")]
    Load(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The object lacks a program or map the agent expects (a build mismatch).
    #[error("the eBPF object has no {0}")]
    NotInObject(String),
    #[error("BPF map {name}")]
    Map {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("the ring buffer cannot be polled")]
    Ring(#[source] std::io::Error),
    /// A bad option value (its own line).
    #[error("{0}")]
    Config(String),
}

/// The verifier's reason, in one line: the last line of its log that is
/// not a statistic ("processed N insns", "verification time"...).
pub(super) fn verifier_reason(log: &str) -> Option<String> {
    log.lines()
        .rev()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .find(|l| {
            !["processed ", "verification time", "stack depth", "-- END", "mark_precise", "max_states"]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .map(|l| l.chars().take(200).collect())
}

/// A program the kernel refused, in one line naming it and the reason.
pub(super) fn program_load_err(name: &str, e: ProgramError) -> CaptureError {
    if let ProgramError::LoadError { io_error, verifier_log } = &e {
        if io_error.raw_os_error() == Some(libc::EPERM) {
            return not_permitted();
        }
        let log = verifier_log.to_string();
        let reason = verifier_reason(&log).unwrap_or_else(|| io_error.to_string());
        return CaptureError::Verifier { program: name.to_string(), reason };
    }
    load_err(e)
}

/// EPERM with every capability there: on kernels before 5.11 a memlock
/// limit stall could not raise is the likely cause.
fn not_permitted() -> CaptureError {
    use nix::sys::resource::{getrlimit, Resource, RLIM_INFINITY};
    let old_kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").is_ok_and(|release| {
        let mut parts = release.split(['.', '-']).map(|x| x.parse::<u32>().unwrap_or(0));
        (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) < (5, 11)
    });
    match getrlimit(Resource::RLIMIT_MEMLOCK) {
        Ok((soft, _)) if old_kernel && soft != RLIM_INFINITY => CaptureError::MemlockTooLow(soft / 1024),
        _ => CaptureError::NotPrivileged,
    }
}

/// A load or attach failure, kept as the source; EPERM anywhere in aya's
/// nested answer means privileges.
pub(super) fn load_err(e: impl std::error::Error + Send + Sync + 'static) -> CaptureError {
    let eperm = std::iter::successors(Some(&e as &dyn std::error::Error), |e| e.source()).any(|e| {
        let text = e.to_string();
        text.contains("Operation not permitted") || text.contains("EPERM")
    });
    if eperm {
        not_permitted()
    } else {
        CaptureError::Load(Box::new(e))
    }
}

/// A map operation that failed, naming the map.
pub(super) fn map_err(name: &'static str) -> impl Fn(aya::maps::MapError) -> CaptureError {
    move |source| CaptureError::Map { name, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verifier_reason_is_the_last_meaningful_line() {
        let log = "0: R1=ctx() R10=fp0\n0: (85) call bpf_task_pt_regs#175\nunknown func bpf_task_pt_regs#175\nprocessed 1 insns (limit 1000000) max_states_per_insn 0\n\n";
        assert_eq!(verifier_reason(log).as_deref(), Some("unknown func bpf_task_pt_regs#175"));
        assert_eq!(verifier_reason("\n  \n"), None);
    }
}
