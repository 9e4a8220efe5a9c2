//! The kernel side, seen from the agent: load and attach the programs with
//! this kernel's tracepoint layouts (`load`, each family's in `hooks`), choose
//! what is tracked, a PID tree or cgroups (`track`), and read back the
//! ring buffer's events (`ring`) and the counter maps (`snapshot`); what a
//! blocked thread waits on and who holds its other end (`waits_on`); the
//! environment a process has now (`environ`).
//! Dropping a [`Capture`] detaches and unloads everything; nothing is
//! pinned, so nothing outlives the agent, even when it is killed.
pub mod btf;
pub mod cgroup;
pub mod environ;
mod error;
pub mod hooks;
mod kernel_log;
mod kfunc;
mod load;
pub mod mounts;
mod object;
pub mod peer_activity;
pub mod procfs;
mod ring;
mod schedstat;
mod snapshot;
pub mod sockets;
pub mod tracefs;
mod track;
pub mod waits_on;

use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf},
    Ebpf,
};
use stall_common::{
    names, task_flags, track_gen, CpuSlot, FdKey, FileStats, InodeBytes, InodeKey, ThreadStats, UringKey,
    UringRead, UringReads, WakeCache, WakeKey, WakeStats,
};
use tokio::io::unix::AsyncFd;

use error::map_err;
pub use error::CaptureError;
pub use hooks::syscalls::{Backend, RegisterReads, SyscallHooks};
use hooks::{gpu, pagecache::Way as MmapWay};
pub use load::{CaptureOptions, DEFAULT_LATENCY_SAMPLE};
pub use ring::DRAIN_EVERY;

/// What this machine's kernel offers stall, found without loading
/// anything (`stall version`): (what, found).
pub fn kernel_features() -> Vec<(&'static str, String)> {
    let yes_no = |b: bool, yes: &str, no: &str| if b { yes.to_string() } else { no.to_string() };
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let btf = btf::KernelBtf::open().ok();
    let tracefs = tracefs::root();
    vec![
        ("kernel", release.trim().to_string()),
        ("BTF", yes_no(btf.is_some(), btf::VMLINUX, "missing: stall cannot run")),
        (
            "tracefs",
            tracefs.as_ref().map_or_else(|e| format!("not found ({e})"), |p| p.display().to_string()),
        ),
        (
            "kfuncs for plain loads (bpf_rdonly_cast)",
            yes_no(btf.as_ref().and_then(kfunc::KfuncIds::find).is_some(), "yes", "no: probe reads instead"),
        ),
        (
            "delayed dequeues (EEVDF, 6.12 on)",
            yes_no(
                btf.as_ref().is_some_and(|b| b.field("sched_entity", "sched_delayed").is_some()),
                "yes",
                "no",
            ),
        ),
        (
            "kprobes",
            yes_no(
                tracefs.as_ref().is_ok_and(|p| p.join("kprobe_events").exists()),
                "yes",
                "no (stall needs none)",
            ),
        ),
    ]
}

pub struct Capture {
    threads: HashMap<MapData, u32, ThreadStats>,
    files: HashMap<MapData, FdKey, FileStats>,
    wakes: HashMap<MapData, WakeKey, WakeStats>,
    /// What `wakes` had no room for, per waking process.
    wakes_by_proc: HashMap<MapData, WakeKey, WakeStats>,
    /// Blocked time per (process, descriptor).
    fd_waits: HashMap<MapData, FdKey, u64>,
    /// Per CPU and slot of wakees, the last pair of `wakes` and its
    /// wakeups not added yet.
    wake_cache: PerCpuArray<MapData, WakeCache>,
    cgroups: HashMap<MapData, u64, u32>,
    /// Storage and mapped bytes per process and file (None: no page-cache
    /// hook here).
    inode_bytes: Option<HashMap<MapData, InodeKey, InodeBytes>>,
    /// How faults on mappings are followed (None: not on this kernel).
    mapped: Option<MmapWay>,
    /// io_uring reads completed, by submitting thread, and those in flight.
    uring_reads: HashMap<MapData, u32, UringReads>,
    uring_pending: HashMap<MapData, UringKey, UringRead>,
    counters: PerCpuArray<MapData, u64>,
    cpu_slot: PerCpuArray<MapData, CpuSlot>,
    track_gen: Array<MapData, u32>,
    /// The job whose switches are recorded on demand (0: none).
    timeline_job: Array<MapData, u32>,
    gen: u32,
    ring: AsyncFd<RingBuf<MapData>>,
    seed_seq: u64,
    /// Blocked threads whose /proc syscall file could not be read when
    /// they were seeded (their reason is a guess).
    unreadable_threads: u32,
    /// The threads [`Capture::sample_sched`] last found tracked.
    sampled: std::collections::HashSet<u32>,
    decode_errors: u64,
    /// `TaskOffsets::flags` as loaded.
    task_flags: u32,
    /// Which `sched_switch` program runs.
    switch_reads: stall_common::SwitchReads,
    /// The GPU library probes (None: not asked for, or refused here: see
    /// `gpu_note`).
    gpu: Option<gpu::GpuProbes>,
    gpu_note: Option<String>,
    /// The kernel side's diagnostics, read where the debug log is asked for.
    kernel_log: Option<aya_log::EbpfLogger<kernel_log::KernelLog>>,
    // Last: programs detach when this drops.
    /// The syscall hooks' backend and links (none: detached).
    hooks: hooks::syscalls::Hooks,
    /// `sched_switch` and `sched_waking` (detached in the daemon's cheap tier).
    sched: hooks::sched::SchedHooks,
    ebpf: Ebpf,
}

impl Capture {
    /// Whether the programs find saved registers from the task's stack
    /// (kernels without `bpf_task_pt_regs`).
    pub fn regs_from_stack(&self) -> bool {
        self.task_flags & task_flags::REGS_FROM_STACK != 0
    }

    /// Whether the syscall hooks (file reads, writes, opens) are attached.
    pub fn syscall_hooks(&self) -> bool {
        self.hooks.attached()
    }

    /// Whether `sched_switch` and `sched_waking` are attached; while they
    /// are not, [`Capture::sample_sched`] keeps the threads' counters.
    pub fn sched_hooks(&self) -> bool {
        self.sched.attached()
    }

    /// Attaches or detaches the scheduler hooks (the daemon's tiers). Call
    /// [`Capture::sample_sched`] just before attaching: the kernel side
    /// goes on from the state the last reading left in each entry.
    pub fn set_sched_hooks(&mut self, on: bool) -> Result<(), CaptureError> {
        match (on, self.sched.attached()) {
            (true, false) => self.sched.attach(&mut self.ebpf),
            (false, true) => self.sched.detach(&mut self.ebpf),
            _ => Ok(()),
        }
    }

    /// Probes the job's GPU library at `path` (a CUDA runtime or driver,
    /// as a process opens it), once per file; how many functions.
    pub fn gpu_library(&mut self, path: &str) -> usize {
        let hooks_on = self.syscall_hooks();
        match self.gpu.as_mut() {
            Some(g) if gpu::is_gpu_library(path) && (hooks_on || !g.on_demand) => {
                g.attach_library(&mut self.ebpf, std::path::Path::new(path))
            }
            _ => 0,
        }
    }

    /// Probes the GPU libraries a process running before stall maps now.
    pub fn gpu_libraries_of(&mut self, pid: u32) {
        if self.gpu.is_some() {
            for path in gpu::mapped_gpu_libraries(pid) {
                self.gpu_library(&path);
            }
        }
    }

    /// The GPU libraries probed so far, and how many functions of each;
    /// or why there are no probes.
    pub fn gpu_probes_line(&self) -> Option<String> {
        if let Some(note) = &self.gpu_note {
            return Some(format!("GPU library probes: none ({note})"));
        }
        let g = self.gpu.as_ref()?;
        Some(if g.attached.is_empty() {
            "GPU library probes: no CUDA library mapped by the job".to_string()
        } else {
            let libs: Vec<String> = g.attached.iter().map(|(p, n)| format!("{p} ({n} functions)")).collect();
            format!("GPU library probes: {}", libs.join(", "))
        })
    }

    /// The syscall hooks' backend (trampolines or raw tracepoints).
    pub fn syscall_backend(&self) -> Backend {
        self.hooks.backend()
    }

    fn reads_line(&self) -> &'static str {
        match self.hooks.register_reads() {
            RegisterReads::Cast => "registers by plain loads (bpf_rdonly_cast)",
            RegisterReads::Probe => "registers by bpf_probe_read_kernel",
        }
    }

    /// How a returning syscall's registers are read: `cast` or `probe`.
    pub fn syscall_reads(&self) -> &'static str {
        self.hooks.register_reads().name()
    }

    /// How `sched_switch` reads the task going off-CPU: `direct`, `probe`
    /// or `probe-stack`.
    pub fn switch_reads(&self) -> &'static str {
        self.switch_reads.name()
    }

    /// How faults on file mappings are followed: `tracepoint`,
    /// `trampoline` or `none`.
    pub fn mmap_hooks(&self) -> &'static str {
        MmapWay::name(self.mapped)
    }

    /// Blocked threads whose /proc syscall file could not be read when
    /// they were seeded.
    pub fn unreadable_threads(&self) -> u32 {
        self.unreadable_threads
    }

    /// One line for people: the backend, and why `auto` fell back.
    pub fn syscall_backend_line(&self) -> String {
        match (self.hooks.backend(), self.hooks.refused()) {
            (Backend::Trampoline, _) => {
                "syscall hooks: trampoline (fentry/fexit on the hooked syscalls only)".to_string()
            }
            (Backend::Tracepoint, None) => {
                format!(
                    "syscall hooks: tracepoint (raw_syscalls: every syscall of the machine; {})",
                    self.reads_line()
                )
            }
            (Backend::Tracepoint, Some(why)) => format!(
                "syscall hooks: tracepoint (raw_syscalls: every syscall of the machine; {}; {})",
                self.reads_line(),
                no_trampolines(why)
            ),
        }
    }

    /// Records every switch of job `job`'s threads (`Event::Switch`), as
    /// `--timeline` does for all, until called again; 0 records none.
    pub fn set_timeline_job(&mut self, job: u32) -> Result<(), CaptureError> {
        self.timeline_job.set(0, job, 0).map_err(map_err(names::TIMELINE_JOB))
    }

    /// Attaches or detaches the syscall hooks. Attaching any syscall
    /// tracepoint puts every task of the machine on the kernel's slow
    /// syscall path (the trampoline backend taxes only the hooked
    /// syscalls' callers); without them only the scheduler hooks run (on/off-CPU
    /// time, waits, wakers), which cost nothing to a task that does not
    /// switch. Reads in flight from before a detach are dropped (a new
    /// hooks epoch), and descriptors opened meanwhile were not seen: call
    /// [`Capture::reseed_fds`] for the tracked processes after attaching.
    pub fn set_syscall_hooks(&mut self, on: bool) -> Result<(), CaptureError> {
        if on == self.syscall_hooks() {
            return Ok(());
        }
        if on {
            self.gen = track_gen::next_epoch(self.gen);
            self.track_gen.set(0, self.gen, 0).map_err(map_err(names::TRACK_GEN))?;
            if let Err(e) = self.hooks.attach(&mut self.ebpf) {
                // Half attached is not attached: leave none.
                let _ = self.hooks.detach(&mut self.ebpf);
                return Err(e);
            }
        } else {
            self.hooks.detach(&mut self.ebpf)?;
            if let Some(g) = self.gpu.as_mut().filter(|g| g.on_demand) {
                g.detach_all(&mut self.ebpf);
            }
        }
        Ok(())
    }
}

/// Why `auto` uses the tracepoints, as a fact about this machine: an EPERM
/// there is how such kernels and hypervisors say no, not a failure of stall.
fn no_trampolines(why: &str) -> String {
    if why.contains("Operation not permitted") {
        "this kernel does not allow syscall trampolines (fentry is refused with EPERM, as under lockdown or a hypervisor without ftrace direct calls)".to_string()
    } else {
        format!("no syscall trampolines on this kernel: {why}")
    }
}

#[cfg(test)]
mod words_tests {
    use super::no_trampolines;

    #[test]
    fn an_eperm_fallback_is_worded_as_a_fact() {
        let eperm = "fentry on __x64_sys_read: the BPF_PROG_LOAD syscall returned Operation not permitted (os error 1)";
        let line = no_trampolines(eperm);
        assert!(line.starts_with("this kernel does not allow syscall trampolines"), "{line}");
        assert!(!line.contains("Operation not permitted") && !line.contains("refused:"), "{line}");
        assert!(no_trampolines("no BTF").ends_with(": no BTF"));
    }
}
