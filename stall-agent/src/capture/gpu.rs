//! The GPU library family (stall-ebpf's gpu.rs), seen from the agent:
//! uprobes on the CUDA runtime's and driver's exported calls, attached to
//! each such library a job process maps, once per file (as a process opens
//! it, `dlopen` at first use included, or from /proc/PID/maps for a process
//! running before stall started), and the per-thread counters they keep.
//! The probes detach with the [`aya::Ebpf`] that holds them.
use std::{collections::HashSet, os::unix::fs::MetadataExt, path::Path};

use aya::{
    maps::{HashMap, MapData},
    programs::{uprobe::UProbeScope, UProbe},
    Ebpf,
};
use stall_common::{gpu_symbols, names, GpuCalls};

use super::{
    error::CaptureError,
    object::{program, take},
};

/// The timed calls: the probe on each one's entry (the return probe ends
/// them all).
const TIMED: [(&str, &[&str]); 2] =
    [(names::GPU_SYNC_ENTER, &gpu_symbols::SYNC), (names::GPU_COPY_ENTER, &gpu_symbols::COPY)];

/// Whether a path names a library the probes go on (`libcudart.so.13`,
/// `libcuda.so.1`).
pub fn is_gpu_library(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    gpu_symbols::LIBRARIES.iter().any(|l| name.starts_with(l))
}

pub struct GpuProbes {
    calls: HashMap<MapData, u32, GpuCalls>,
    /// The library files probed (device, inode), and those that had none
    /// of the functions.
    seen: HashSet<(u64, u64)>,
    /// The libraries probed, and how many functions of each.
    pub attached: Vec<(String, usize)>,
}

impl GpuProbes {
    /// Loads the probes' programs; nothing is attached until a library is
    /// found.
    pub fn load(ebpf: &mut Ebpf) -> Result<Self, CaptureError> {
        for name in [names::GPU_SYNC_ENTER, names::GPU_COPY_ENTER, names::GPU_CALL_RETURN, names::GPU_LAUNCH]
        {
            program(ebpf, name, UProbe::load)?;
        }
        Ok(Self { calls: take(ebpf, names::GPU_CALLS)?, seen: HashSet::new(), attached: Vec::new() })
    }

    /// Probes the library at `path` once (a file already seen under any
    /// name is skipped); returns how many functions were probed.
    pub fn attach_library(&mut self, ebpf: &mut Ebpf, path: &Path) -> usize {
        let Ok(meta) = std::fs::metadata(path) else { return 0 };
        if !self.seen.insert((meta.dev(), meta.ino())) {
            return 0;
        }
        let mut probed = HashSet::new();
        let attach = |ebpf: &mut Ebpf, name: &str, symbol: &str| {
            let prog = ebpf.program_mut(name).and_then(|p| <&mut UProbe>::try_from(p).ok());
            // A library lacks most of the names (the runtime has no `cu*`,
            // the driver no `cuda*`): those are skipped.
            prog.is_some_and(|p| p.attach(symbol, path, UProbeScope::AllProcesses).is_ok())
        };
        // Each timed call's return probe first, its entry only where that
        // went in: a call entered with no return probe to end it would
        // leave its thread "inside" for good (the job calls on meanwhile).
        for (entry, symbols) in TIMED {
            for &symbol in symbols {
                if attach(ebpf, names::GPU_CALL_RETURN, symbol) && attach(ebpf, entry, symbol) {
                    probed.insert(symbol);
                }
            }
        }
        // Last (the tests wait for these to know the others are in).
        for &symbol in &gpu_symbols::LAUNCH {
            if attach(ebpf, names::GPU_LAUNCH, symbol) {
                probed.insert(symbol);
            }
        }
        if !probed.is_empty() {
            self.attached.push((path.display().to_string(), probed.len()));
        }
        probed.len()
    }

    /// Every thread's entry: (tid, counters).
    pub fn read(&self) -> Vec<(u32, GpuCalls)> {
        self.calls.iter().filter_map(Result::ok).collect()
    }

    /// Frees the entries of threads that ended.
    pub fn retire(&mut self, tids: &HashSet<u32>) {
        for tid in tids {
            let _ = self.calls.remove(tid);
        }
    }
}

/// The GPU libraries a running process maps now (/proc/PID/maps).
pub fn mapped_gpu_libraries(pid: u32) -> Vec<String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let mut found: Vec<String> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| p.starts_with('/') && is_gpu_library(p))
        .map(str::to_string)
        .collect();
    found.sort();
    found.dedup();
    found
}

#[cfg(test)]
mod tests {
    use super::is_gpu_library;

    #[test]
    fn the_cuda_runtime_and_driver_are_gpu_libraries() {
        for lib in [
            "/opt/venv/lib/python3.11/site-packages/nvidia/cu13/lib/libcudart.so.13",
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            "libcuda.so",
        ] {
            assert!(is_gpu_library(lib), "{lib}");
        }
        for lib in ["/usr/lib/libcudnn.so.9", "/opt/lib/libcuda_stub_notes.txt", "/data/libcudart.txt"] {
            assert!(!is_gpu_library(lib), "{lib}");
        }
    }
}
