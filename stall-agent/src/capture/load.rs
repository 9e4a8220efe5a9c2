//! Loading: the kernel's features and layouts probed, the object loaded
//! with them, and the programs attached. What fails says why in one line.
use aya::{
    maps::{MapData, MapType, RingBuf},
    programs::{raw_trace_point::RawTracePointLinkId, ProgramType, RawTracePoint},
    sys::BpfHelper,
    Btf, EbpfLoader,
};
use stall_common::{names, task_flags, Config, Regs};
use tokio::io::unix::AsyncFd;

use super::{
    backend::{self, SyscallHooks},
    btf,
    error::load_err,
    kfunc, mapped,
    object::{attached_program, program, take, BPF_OBJECT},
    tracefs, uring, Capture, CaptureError,
};
use crate::syscalls;

/// (program, category, tracepoint) for the scheduler and task hooks, all
/// raw tracepoints (never skipped while `bpf_prog_active` is held, unlike
/// perf-event tracepoint programs). `sched_switch` is replaced by
/// `sched_switch_stack` on kernels without `bpf_task_pt_regs`.
const ATTACH: [(&str, &str, &str); 5] = [
    (names::SCHED_SWITCH, "sched", "sched_switch"),
    (names::SCHED_WAKING, "sched", "sched_waking"),
    (names::TASK_NEWTASK, "task", "task_newtask"),
    (names::SCHED_PROCESS_EXEC, "sched", "sched_process_exec"),
    (names::SCHED_PROCESS_EXIT, "sched", "sched_process_exit"),
];

/// The tracepoints of [`ATTACH`] that run at every context switch or
/// wakeup of the machine: what the daemon's cheap tier leaves detached.
const SCHED_HOOKS: [&str; 2] = ["sched_switch", "sched_waking"];

/// The scheduler hooks' programs (loaded) and links (while attached).
#[derive(Default)]
pub(super) struct SchedHooks {
    programs: Vec<(&'static str, &'static str)>,
    links: Vec<(&'static str, RawTracePointLinkId)>,
}

impl SchedHooks {
    pub fn attached(&self) -> bool {
        !self.links.is_empty()
    }

    /// All or none: a half-attached scheduler would count half the switches.
    pub fn attach(&mut self, ebpf: &mut aya::Ebpf) -> Result<(), CaptureError> {
        for &(prog, name) in &self.programs {
            match attached_program::<RawTracePoint>(ebpf, prog).and_then(|p| p.attach(name).map_err(load_err))
            {
                Ok(link) => self.links.push((prog, link)),
                Err(e) => {
                    let _ = self.detach(ebpf);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    pub fn detach(&mut self, ebpf: &mut aya::Ebpf) -> Result<(), CaptureError> {
        for (prog, link) in self.links.drain(..) {
            attached_program::<RawTracePoint>(ebpf, prog)?.detach(link).map_err(load_err)?;
        }
        Ok(())
    }
}

/// (program, category, tracepoint) attached in cgroup mode only: a task
/// moved into a watched cgroup is no longer known to be outside them
/// (stall-ebpf's untracked.rs).
const CGROUP_ATTACH: (&str, &str, &str) = (names::CGROUP_ATTACH_TASK, "cgroup", "cgroup_attach_task");

/// (program, category, tracepoint) for page-cache fills (storage bytes per
/// file); attached where the kernel's BTF has the fields it reads.
const PAGE_CACHE_FILL: (&str, &str, &str) =
    (names::PAGE_CACHE_FILL, "filemap", "mm_filemap_add_to_page_cache");

/// x86-64's `struct pt_regs`: `orig_ax` (the syscall a task is in), `di`,
/// `si`, `dx` (arguments 0-2), `cs`. Native syscalls come from `__USER_CS`.
#[cfg(target_arch = "x86_64")]
const REGS: Regs = Regs {
    nr: stall_common::kfunc::X86_64_NR as u16,
    arg0: stall_common::kfunc::X86_64_ARG0 as u16,
    arg1: 104,
    arg2: 96,
    cs: 136,
    user_cs: 0x33,
    _pad: [0; 2],
};

/// The ring buffer's size as declared in stall-ebpf's maps.rs.
const DEFAULT_RINGBUF_BYTES: u32 = 4 << 20;

#[derive(Debug, Clone, Default)]
pub struct CaptureOptions {
    /// Ring buffer size in bytes (power of two, multiple of the page size).
    pub ringbuf_bytes: Option<u32>,
    /// Programs return at once: the benchmark's floor.
    pub floor: bool,
    /// Also track tasks by cgroup (see [`Capture::watch_cgroup`]).
    pub cgroup_mode: bool,
    /// Time one read in this many (a power of two up to 128; 0: the
    /// default, [`DEFAULT_LATENCY_SAMPLE`]).
    pub latency_sample: u32,
    /// Send a record of every switch of a tracked thread (`--timeline`).
    pub timeline: bool,
    /// Leave the syscall hooks detached at load, until
    /// [`Capture::set_syscall_hooks`] (the daemon's cheap tier).
    pub syscall_hooks_on_demand: bool,
    /// Which syscall hooks to use (see [`backend`]).
    pub syscall_hooks: SyscallHooks,
    /// Leave `sched_switch` and `sched_waking` detached at load, until
    /// [`Capture::set_sched_hooks`]; [`Capture::sample_sched`] keeps the
    /// threads' counters from /proc meanwhile (the daemon's cheap tier).
    pub sched_hooks_on_demand: bool,
    /// Probe the CUDA libraries the job maps (uprobes, attached as they
    /// are found).
    pub gpu_probes: bool,
}

/// One read in 8 is timed unless asked otherwise: the two clock reads are
/// most of what a traced read costs, and 1 in 8 (picked at random) gives
/// the per-file average latency to a few percent once a file has had a few
/// hundred reads. Bytes and calls are always exact.
pub const DEFAULT_LATENCY_SAMPLE: u32 = 8;

/// A thread's reads past the first few of an on-CPU span (a loop on cached
/// data: [`stall_common::LATENCY_RUN_EVENTS`]) are timed one in this many, or in the
/// asked-for sample if that is sparser, unless every read is to be timed:
/// such a loop makes thousands of reads a second, and one in 8 of them
/// would spend a third of what stall adds to each on the clock.
pub const LATENCY_RUN_SAMPLE: u32 = 128;

/// The `latency_run_mask` for the asked-for `latency_mask`.
fn latency_run_mask(mask: u8) -> u8 {
    if mask == 0 {
        0
    } else {
        mask.max((LATENCY_RUN_SAMPLE - 1) as u8)
    }
}

fn latency_mask(sample: u32) -> Result<u8, CaptureError> {
    let n = if sample == 0 { DEFAULT_LATENCY_SAMPLE } else { sample };
    if !n.is_power_of_two() || n > 128 {
        return Err(CaptureError::Config(format!(
            "--latency-sample {n}: must be a power of two from 1 to 128"
        )));
    }
    Ok((n - 1) as u8)
}

impl Capture {
    /// Loads and attaches every program. Nothing is tracked until
    /// [`Capture::track_tree`] or [`Capture::watch_cgroup`] says so.
    pub fn load(opts: &CaptureOptions) -> Result<Self, CaptureError> {
        if BPF_OBJECT.is_empty() {
            return Err(CaptureError::Stub);
        }
        let missing = crate::caps::missing(crate::caps::effective());
        if !missing.is_empty() {
            return Err(CaptureError::MissingCaps(missing));
        }
        let tracefs = tracefs::Tracefs::open()?;
        // The raw syscall tracepoints are checked when that backend is chosen.
        if let Some((_, c, n)) = ATTACH.iter().find(|(_, c, n)| !tracefs.has(c, n)) {
            return Err(CaptureError::MissingTracepoint { name: format!("{c}:{n}") });
        }
        let features = Features::probe()?;
        // io_uring reads are followed where the tracepoints and their
        // layout are known (docs/KERNELS.md).
        let uring_submit = uring::SUBMIT.iter().copied().find(|e| tracefs.has("io_uring", e));
        let kernel_btf = btf::KernelBtf::open()?;
        let latency_mask = latency_mask(opts.latency_sample)?;
        let config = Config {
            task: kernel_btf.task_offsets(!features.task_pt_regs)?,
            regs: REGS,
            cgroup_filter: u8::from(opts.cgroup_mode),
            floor: u8::from(opts.floor),
            timeline: u8::from(opts.timeline),
            latency_mask,
            latency_run_mask: latency_run_mask(latency_mask),
            _pad: [0; 3],
            ringbuf_wake_bytes: opts.ringbuf_bytes.unwrap_or(DEFAULT_RINGBUF_BYTES) / 8,
            page: if tracefs.has(PAGE_CACHE_FILL.1, PAGE_CACHE_FILL.2) {
                kernel_btf.page_cache_offsets(mapped::whole_folios()).unwrap_or_default()
            } else {
                Default::default()
            },
            uring: uring_submit
                .filter(|_| tracefs.has("io_uring", uring::COMPLETE))
                .and_then(|submit| uring::layout(&kernel_btf, submit))
                .unwrap_or_default(),
            tables: syscalls::tables(),
        };
        // Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK.
        let _ = nix::sys::resource::setrlimit(
            nix::sys::resource::Resource::RLIMIT_MEMLOCK,
            nix::sys::resource::RLIM_INFINITY,
            nix::sys::resource::RLIM_INFINITY,
        );
        // aya's own reading of the kernel's BTF: trampolines are loaded
        // against a function found in it.
        let btf = Btf::from_sys_fs().ok();
        let mut loader = EbpfLoader::new();
        loader.btf(btf.as_ref());
        loader.override_global(names::CONFIG, &config, true);
        if let Some(bytes) = opts.ringbuf_bytes {
            loader.map_max_entries(names::EVENTS, bytes);
        }
        // The kfunc calls, where the kernel has them (else the programs
        // that make them are not loaded, and their placeholders stay).
        let casts = match kfunc::KfuncIds::find(&kernel_btf) {
            Some(ids) if std::env::var_os(SYSCALL_READS_ENV).is_none_or(|v| v != "probe") => {
                Some(kfunc::rewrite(BPF_OBJECT, ids).map_err(|e| CaptureError::Load(e.into()))?.0)
            }
            _ => None,
        };
        let object = casts.as_ref().map_or(BPF_OBJECT, |o| o.bytes());
        let mut ebpf = loader.load(object).map_err(load_err)?;

        let mut switch_reads = SwitchReads::ProbeStack;
        let mut sched = SchedHooks::default();
        for (prog, _, name) in ATTACH {
            let prog = if prog == names::SCHED_SWITCH {
                switch_reads = load_switch(&mut ebpf, &features, config.task.flags, casts.is_some())?;
                switch_reads.program()
            } else if prog == names::SCHED_WAKING && switch_reads == SwitchReads::Queued {
                // The switch-in splits a woken task's span: the wakeup is only marked.
                program(&mut ebpf, names::SCHED_WAKING_MARKED, RawTracePoint::load)?;
                names::SCHED_WAKING_MARKED
            } else if prog == names::SCHED_WAKING && switch_reads == SwitchReads::QueuedChecked {
                // Loaded with the switch.
                names::SCHED_WAKING_CHECKED
            } else {
                program(&mut ebpf, prog, RawTracePoint::load)?;
                prog
            };
            if SCHED_HOOKS.contains(&name) {
                sched.programs.push((prog, name));
                continue;
            }
            attached_program::<RawTracePoint>(&mut ebpf, prog)?.attach(name).map_err(load_err)?;
        }
        if !opts.sched_hooks_on_demand {
            sched.attach(&mut ebpf)?;
        }
        if opts.cgroup_mode {
            let (prog, category, name) = CGROUP_ATTACH;
            if !tracefs.has(category, name) {
                return Err(CaptureError::MissingTracepoint { name: format!("{category}:{name}") });
            }
            program(&mut ebpf, prog, RawTracePoint::load)?.attach(name).map_err(load_err)?;
        }
        let storage_known = config.page.mapping != 0;
        if storage_known {
            let (prog, _, name) = PAGE_CACHE_FILL;
            let prog = if features.task_pt_regs { prog } else { names::PAGE_CACHE_FILL_STACK };
            program(&mut ebpf, prog, RawTracePoint::load)?.attach(name).map_err(load_err)?;
        }
        // Needs the page-cache fields too: None where the fill program is not attached.
        let mapped = mapped::attach(&mut ebpf, &tracefs, &config.page, btf.as_ref())?;
        if config.uring.on != 0 {
            let submit = uring_submit.unwrap_or(uring::SUBMIT[0]);
            program(&mut ebpf, names::URING_SUBMIT, RawTracePoint::load)?.attach(submit).map_err(load_err)?;
            program(&mut ebpf, names::URING_COMPLETE, RawTracePoint::load)?
                .attach(uring::COMPLETE)
                .map_err(load_err)?;
            if config.uring.submit_req == 0 {
                program(&mut ebpf, names::URING_FILE_GET, RawTracePoint::load)?
                    .attach(uring::FILE_GET)
                    .map_err(load_err)?;
            }
        }
        let hooks = backend::Hooks::load(
            &mut ebpf,
            opts.syscall_hooks,
            btf.as_ref(),
            &kernel_btf,
            &tracefs,
            casts.is_some(),
            opts.syscall_hooks_on_demand,
        )?;
        // Optional: a kernel without uprobes still runs the rest.
        let (gpu, gpu_note) = match opts.gpu_probes.then(|| super::gpu::GpuProbes::load(&mut ebpf)) {
            Some(Ok(g)) => (Some(g), None),
            Some(Err(e)) => (None, Some(e.to_string())),
            None => (None, None),
        };
        let ring: RingBuf<MapData> = take(&mut ebpf, names::EVENTS)?;
        // SAFETY: the RingBuf owns its map fd for as long as the AsyncFd lives.
        let ring = unsafe { AsyncFd::register(ring) }.map_err(|e| CaptureError::Ring(e.into_parts().1))?;
        Ok(Self {
            threads: take(&mut ebpf, names::THREADS)?,
            files: take(&mut ebpf, names::FILES)?,
            wakes: take(&mut ebpf, names::WAKES)?,
            wakes_by_proc: take(&mut ebpf, names::WAKES_BY_PROC)?,
            fd_waits: take(&mut ebpf, names::FD_WAITS)?,
            wake_cache: take(&mut ebpf, names::WAKE_CACHE)?,
            cgroups: take(&mut ebpf, names::CGROUPS)?,
            inode_bytes: if storage_known { Some(take(&mut ebpf, names::INODE_BYTES)?) } else { None },
            mapped,
            uring_reads: take(&mut ebpf, names::URING_READS)?,
            uring_pending: take(&mut ebpf, names::URING_PENDING)?,
            counters: take(&mut ebpf, names::COUNTERS)?,
            cpu_slot: take(&mut ebpf, names::CPU_SLOT)?,
            track_gen: take(&mut ebpf, names::TRACK_GEN)?,
            timeline_job: take(&mut ebpf, names::TIMELINE_JOB)?,
            gen: 0,
            ring,
            seed_seq: 0,
            unreadable_threads: 0,
            sampled: Default::default(),
            decode_errors: 0,
            hooks,
            sched,
            task_flags: config.task.flags,
            switch_reads,
            gpu,
            gpu_note,
            ebpf,
        })
    }
}

/// How the loaded `sched_switch` program reads the task going off-CPU
/// (stall-ebpf's sched.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwitchReads {
    /// `Direct`, and a woken task's wait for a CPU from the kernel's
    /// enqueue time (`task_flags::QUEUED_AT`): its wakeup reads no clock.
    Queued,
    /// `Queued` where EEVDF delays dequeues (`task_flags::DELAYED_DEQUEUE`):
    /// a wakeup reads the clock only where the wakee was enqueued before
    /// it (`sched_waking_checked`), and the switch finds the task going
    /// off-CPU and its registers by `bpf_rdonly_cast`, not by helper calls
    /// (`sched_switch_queued_cast`): both need the kfunc rewrite.
    QueuedChecked,
    /// Plain loads through its BTF pointer: no helper call per field.
    Direct,
    /// `bpf_probe_read_kernel` per field, registers from `bpf_task_pt_regs`.
    Probe,
    /// The same, registers found from `task->stack` (before 5.15).
    ProbeStack,
}

impl SwitchReads {
    /// As the JSON summary (`switch_reads`) names it.
    pub fn name(self) -> &'static str {
        match self {
            SwitchReads::Queued => "queued",
            SwitchReads::QueuedChecked => "queued-checked",
            SwitchReads::Direct => "direct",
            SwitchReads::Probe => "probe",
            SwitchReads::ProbeStack => "probe-stack",
        }
    }

    fn program(self) -> &'static str {
        match self {
            SwitchReads::Queued => names::SCHED_SWITCH_QUEUED,
            SwitchReads::QueuedChecked => names::SCHED_SWITCH_QUEUED_CAST,
            SwitchReads::Direct => names::SCHED_SWITCH_DIRECT,
            SwitchReads::Probe => names::SCHED_SWITCH,
            SwitchReads::ProbeStack => names::SCHED_SWITCH_STACK,
        }
    }
}

/// `STALL_SYSCALL_READS=probe` leaves the kfunc placeholders as they are,
/// so the raw syscall return reads the registers with
/// `bpf_probe_read_kernel` where it would load them through
/// `bpf_rdonly_cast`: for tests and benchmarks of the fallback.
const SYSCALL_READS_ENV: &str = "STALL_SYSCALL_READS";

/// `STALL_SWITCH_READS=probe` loads the probing `sched_switch` where a
/// direct one would load, `=direct` the direct one that times wakeups where
/// the queued one would: for tests and benchmarks of the fallbacks.
const SWITCH_READS_ENV: &str = "STALL_SWITCH_READS";

/// Loads the cheapest `sched_switch` the kernel takes: whether plain loads
/// through a BTF pointer are allowed in a raw tracepoint program is the
/// verifier's to say, so its answer is the probe (a refused program is
/// not loaded, and nothing of it stays). Where EEVDF delays dequeues, the
/// queued one goes only with `sched_waking_checked`, loaded here too,
/// which needs the kfunc placeholders rewritten (`casts`).
fn load_switch(
    ebpf: &mut aya::Ebpf,
    features: &Features,
    flags: u32,
    casts: bool,
) -> Result<SwitchReads, CaptureError> {
    if !features.task_pt_regs {
        program(ebpf, names::SCHED_SWITCH_STACK, RawTracePoint::load)?;
        return Ok(SwitchReads::ProbeStack);
    }
    let asked = std::env::var_os(SWITCH_READS_ENV);
    let probe_only = asked.as_ref().is_some_and(|v| v == "probe");
    let queued = !probe_only && asked.as_ref().is_none_or(|v| v != "direct");
    if queued && flags & task_flags::QUEUED_AT != 0 {
        if flags & task_flags::DELAYED_DEQUEUE == 0 {
            if program(ebpf, names::SCHED_SWITCH_QUEUED, RawTracePoint::load).is_ok() {
                return Ok(SwitchReads::Queued);
            }
        } else if casts && program(ebpf, names::SCHED_WAKING_CHECKED, RawTracePoint::load).is_ok() {
            if program(ebpf, names::SCHED_SWITCH_QUEUED_CAST, RawTracePoint::load).is_ok() {
                return Ok(SwitchReads::QueuedChecked);
            }
            program(ebpf, names::SCHED_WAKING_CHECKED, RawTracePoint::unload)?;
        }
    }
    if !probe_only && program(ebpf, names::SCHED_SWITCH_DIRECT, RawTracePoint::load).is_ok() {
        return Ok(SwitchReads::Direct);
    }
    program(ebpf, names::SCHED_SWITCH, RawTracePoint::load)?;
    Ok(SwitchReads::Probe)
}

/// What the kernel offers beyond the base stall needs, probed before
/// loading: a missing must-have ends start-up with one line naming it.
struct Features {
    /// `bpf_task_pt_regs` (5.15) with `bpf_get_current_task_btf` (5.11):
    /// else `sched_switch_stack` finds the registers from `task->stack`.
    task_pt_regs: bool,
}

impl Features {
    fn probe() -> Result<Self, CaptureError> {
        let raw = ProgramType::RawTracePoint;
        if !aya::sys::is_program_supported(raw).unwrap_or(true) {
            return Err(CaptureError::MissingFeature("BPF raw tracepoint programs (Linux 4.17)".into()));
        }
        if !aya::sys::is_map_supported(MapType::RingBuf).unwrap_or(true) {
            return Err(CaptureError::MissingFeature("the BPF ring buffer (Linux 5.8)".into()));
        }
        for (helper, what) in [
            (BpfHelper::BPF_FUNC_probe_read_kernel, "the BPF helper bpf_probe_read_kernel (Linux 5.5)"),
            (BpfHelper::BPF_FUNC_ringbuf_reserve, "the BPF helper bpf_ringbuf_reserve (Linux 5.8)"),
        ] {
            if !aya::sys::is_helper_supported(raw, helper).unwrap_or(true) {
                return Err(CaptureError::MissingFeature(what.into()));
            }
        }
        let has = |h| aya::sys::is_helper_supported(raw, h).unwrap_or(false);
        Ok(Self {
            task_pt_regs: has(BpfHelper::BPF_FUNC_task_pt_regs)
                && has(BpfHelper::BPF_FUNC_get_current_task_btf),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_runs_of_reads_are_timed_sparser_unless_every_read_is() {
        assert_eq!(latency_run_mask(latency_mask(1).unwrap()), 0, "every read stays timed");
        assert_eq!(latency_run_mask(latency_mask(8).unwrap()), 127);
        assert_eq!(latency_run_mask(latency_mask(0).unwrap()), 127, "the default is 8");
        assert_eq!(latency_run_mask(latency_mask(128).unwrap()), 127);
        assert!(latency_mask(3).is_err());
    }

    /// The agent finds maps and programs by the names in `stall_common::names`;
    /// the kernel side names them after its identifiers. Both must agree.
    #[test]
    fn every_name_the_agent_uses_is_in_the_object() {
        assert!(!BPF_OBJECT.is_empty(), "built with STALL_BPF_STUB: no kernel object to check");
        let obj = aya_obj::Object::parse(BPF_OBJECT).expect("the kernel object parses");
        for map in names::MAPS {
            assert!(obj.maps.contains_key(*map), "map {map} not in the object");
        }
        for prog in names::PROGRAMS {
            assert!(obj.programs.contains_key(*prog), "program {prog} not in the object");
        }
        assert_eq!(
            obj.programs.len(),
            names::PROGRAMS.len(),
            "a program of the object is not in names::PROGRAMS"
        );
    }

    /// The agent writes the tracking generation as the whole value of the
    /// object's `.bss` map (`names::TRACK_GEN`): any other mutable global
    /// there would share, and break, that value.
    #[test]
    fn the_bss_holds_the_tracking_generation_alone() {
        use object::{Object, ObjectSection, ObjectSymbol};
        assert!(!BPF_OBJECT.is_empty(), "built with STALL_BPF_STUB: no kernel object to check");
        let obj = object::File::parse(BPF_OBJECT).expect("the kernel object parses");
        let bss = obj.section_by_name(names::TRACK_GEN).expect("a .bss section");
        assert_eq!(bss.size(), 4, "the .bss holds more than a u32");
        let sym = obj.symbols().find(|s| s.name() == Ok("TRACK_GEN")).expect("the TRACK_GEN symbol");
        assert_eq!(sym.section_index(), Some(bss.index()));
    }

    /// LLVM turns a struct literal's zeroed fields into a `memset`, which
    /// the BPF target links as a byte-at-a-time loop: one in the slot's
    /// refill cost a context switch over a thousand instructions. The
    /// programs that run per switch, per syscall or per fault must not
    /// call it (`stall_common::store_apart`, `zeroed_in`).
    #[test]
    fn the_hot_programs_call_no_byte_loop() {
        use object::{Object, ObjectSection, ObjectSymbol, RelocationTarget};
        assert!(!BPF_OBJECT.is_empty(), "built with STALL_BPF_STUB: no kernel object to check");
        let obj = object::File::parse(BPF_OBJECT).expect("the kernel object parses");
        let hot = [
            "raw_tp/sched_switch",
            "raw_tp/sched_waking",
            "raw_tp/sys_enter",
            "raw_tp/sys_exit",
            "raw_tp/mm_filemap",
            "fentry",
            "fexit",
        ];
        let mut checked = 0;
        for section in obj.sections() {
            let name = section.name().unwrap_or_default();
            if !hot.iter().any(|h| name.starts_with(h)) {
                continue;
            }
            checked += 1;
            for (at, reloc) in section.relocations() {
                let RelocationTarget::Symbol(sym) = reloc.target() else { continue };
                let target =
                    obj.symbol_by_index(sym).and_then(|s| s.name().map(str::to_owned)).unwrap_or_default();
                assert!(
                    !matches!(target.as_str(), "memset" | "memcpy" | "memmove" | "memcmp" | "bcmp"),
                    "{name} calls {target} at {at:#x}"
                );
            }
        }
        assert!(checked >= hot.len(), "only {checked} of the hot sections found");
    }
}
