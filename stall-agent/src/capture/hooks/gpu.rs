//! The GPU library family (stall-ebpf's gpu/), seen from the agent:
//! uprobes on the exported calls of CUDA's runtime and driver and of NCCL,
//! attached to each such library a job process maps, once per file (as a
//! process opens it, `dlopen` at first use included, or from
//! /proc/PID/maps for a process running before stall started), the
//! per-thread counters they keep and the communicators they saw. The
//! probes detach with the [`aya::Ebpf`] that holds them.
use std::{collections::HashSet, os::unix::fs::MetadataExt, path::Path};

use aya::{
    maps::{HashMap, MapData},
    programs::{
        uprobe::{UProbeLinkId, UProbeScope},
        UProbe,
    },
    Ebpf,
};
use stall_common::{gpu_symbols, names, CommKey, Communicator, GpuCalls};

use crate::capture::{
    error::CaptureError,
    object::{program, take},
};

/// The timed calls: the probe on each one's entry (the return probe ends
/// them all).
const TIMED: [(&str, &[&str]); 2] =
    [(names::GPU_SYNC_ENTER, &gpu_symbols::SYNC), (names::GPU_COPY_ENTER, &gpu_symbols::COPY)];

/// NCCL's communicator creations: the entry probe of each (the return
/// probe reads the handle made).
const NCCL_CREATE: [(&str, &[&str]); 2] =
    [(names::NCCL_INIT_ENTER, &gpu_symbols::NCCL_INIT), (names::NCCL_SPLIT_ENTER, &gpu_symbols::NCCL_SPLIT)];

/// NCCL's calls on a communicator, untimed: the probe on each group.
const NCCL_CALLS: [(&str, &[&str]); 4] = [
    (names::NCCL_COLLECTIVE_COMM4, &gpu_symbols::NCCL_COMM_ARG4),
    (names::NCCL_COLLECTIVE_COMM5, &gpu_symbols::NCCL_COMM_ARG5),
    (names::NCCL_COLLECTIVE_COMM6, &gpu_symbols::NCCL_COMM_ARG6),
    (names::NCCL_P2P, &gpu_symbols::NCCL_P2P),
];

/// Whether a path names a library the probes go on (`libcudart.so.13`,
/// `libcuda.so.1`, `libnccl.so.2`).
pub fn is_gpu_library(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    gpu_symbols::LIBRARIES.iter().any(|l| name.starts_with(l))
}

pub struct GpuProbes {
    calls: HashMap<MapData, u32, GpuCalls>,
    comms: HashMap<MapData, CommKey, Communicator>,
    /// The library files probed (device, inode), and those that had none
    /// of the functions.
    seen: HashSet<(u64, u64)>,
    /// The libraries probed, and how many functions of each.
    pub attached: Vec<(String, usize)>,
    /// Every probe attached, by program: what [`GpuProbes::detach_all`]
    /// takes off.
    links: Vec<(&'static str, UProbeLinkId)>,
    /// The probes go on with the syscall hooks and off with them (the
    /// daemon's tiers), not for the whole run.
    pub on_demand: bool,
}

impl GpuProbes {
    /// Loads the probes' programs; nothing is attached until a library is
    /// found.
    pub fn load(ebpf: &mut Ebpf, on_demand: bool) -> Result<Self, CaptureError> {
        for name in [
            names::GPU_SYNC_ENTER,
            names::GPU_COPY_ENTER,
            names::GPU_CALL_RETURN,
            names::GPU_LAUNCH,
            names::NCCL_INIT_ENTER,
            names::NCCL_SPLIT_ENTER,
            names::NCCL_INIT_RETURN,
            names::NCCL_COLLECTIVE_COMM4,
            names::NCCL_COLLECTIVE_COMM5,
            names::NCCL_COLLECTIVE_COMM6,
            names::NCCL_P2P,
        ] {
            program(ebpf, name, UProbe::load)?;
        }
        Ok(Self {
            calls: take(ebpf, names::GPU_CALLS)?,
            comms: take(ebpf, names::NCCL_COMMS)?,
            seen: HashSet::new(),
            attached: Vec::new(),
            links: Vec::new(),
            on_demand,
        })
    }

    /// Probes the library at `path` once (a file already seen under any
    /// name is skipped); returns how many functions were probed.
    pub fn attach_library(&mut self, ebpf: &mut Ebpf, path: &Path) -> usize {
        let Ok(meta) = std::fs::metadata(path) else { return 0 };
        if !self.seen.insert((meta.dev(), meta.ino())) {
            return 0;
        }
        let mut probed = HashSet::new();
        let links = &mut self.links;
        let mut attach = |ebpf: &mut Ebpf, name: &'static str, symbol: &str| {
            let prog = ebpf.program_mut(name).and_then(|p| <&mut UProbe>::try_from(p).ok());
            // A library lacks most of the names (the runtime has no `cu*`,
            // the driver no `cuda*`): those are skipped.
            match prog.map(|p| p.attach(symbol, path, UProbeScope::AllProcesses)) {
                Some(Ok(link)) => {
                    links.push((name, link));
                    true
                }
                _ => false,
            }
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
        // A communicator's creation: its return probe first, as above (an
        // entry alone would leave a pending creation, harmless but never
        // completed).
        for (entry, symbols) in NCCL_CREATE {
            for &symbol in symbols {
                if attach(ebpf, names::NCCL_INIT_RETURN, symbol) && attach(ebpf, entry, symbol) {
                    probed.insert(symbol);
                }
            }
        }
        for (prog, symbols) in NCCL_CALLS {
            for &symbol in symbols {
                if attach(ebpf, prog, symbol) {
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

    /// Takes every probe off (the daemon's cheap tier): the libraries are
    /// probed again when found again.
    pub fn detach_all(&mut self, ebpf: &mut Ebpf) {
        for (name, link) in self.links.drain(..) {
            if let Some(p) = ebpf.program_mut(name).and_then(|p| <&mut UProbe>::try_from(p).ok()) {
                let _ = p.detach(link);
            }
        }
        self.seen.clear();
        self.attached.clear();
    }

    /// Every communicator seen: (key, what it is and its arrivals).
    pub fn communicators(&self) -> Vec<(CommKey, Communicator)> {
        self.comms.iter().filter_map(Result::ok).collect()
    }

    /// Frees the entries of threads that ended.
    pub fn retire(&mut self, tids: &HashSet<u32>) {
        for tid in tids {
            let _ = self.calls.remove(tid);
        }
    }

    /// Frees the communicators of processes that ended.
    pub fn retire_processes(&mut self, tgids: &HashSet<u32>) {
        let gone: Vec<CommKey> =
            self.comms.keys().filter_map(Result::ok).filter(|k| tgids.contains(&k.tgid)).collect();
        for k in gone {
            let _ = self.comms.remove(&k);
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
