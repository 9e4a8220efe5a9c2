//! Loading: the kernel's features and layouts probed, the object loaded
//! with them, and the programs attached. What fails says why in one line.
use aya::{
    maps::{MapData, MapType, RingBuf},
    programs::ProgramType,
    sys::BpfHelper,
    Btf, Ebpf, EbpfLoader,
};
use stall_common::{names, Config, Regs};
use tokio::io::unix::AsyncFd;

use super::{
    btf::KernelBtf,
    error::load_err,
    hooks::{gpu, pagecache, sched, syscalls, syscalls::SyscallHooks, uring},
    kernel_log, kfunc,
    object::{take, BPF_OBJECT},
    tracefs::Tracefs,
    Capture, CaptureError,
};

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
    /// Probe the GPU libraries (CUDA, NCCL) the job maps (uprobes,
    /// attached as they are found; with `syscall_hooks_on_demand`, only
    /// while the syscall hooks are attached).
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
        let tracefs = Tracefs::open()?;
        sched::check(&tracefs)?;
        let features = Features::probe()?;
        let kernel_btf = KernelBtf::open()?;
        let config = config(opts, &features, &tracefs, &kernel_btf)?;
        // aya's own reading of the kernel's BTF: trampolines are loaded
        // against a function found in it.
        let btf = Btf::from_sys_fs().ok();
        let (mut ebpf, casts) = load_object(opts, &config, btf.as_ref(), &kernel_btf)?;
        let (sched, switch_reads) =
            sched::load(&mut ebpf, opts, &tracefs, &config, features.task_pt_regs, casts)?;
        let mapped = pagecache::load(&mut ebpf, &tracefs, &config.page, features.task_pt_regs, btf.as_ref())?;
        uring::load(&mut ebpf, &tracefs, &config.uring)?;
        let hooks = syscalls::Hooks::load(
            &mut ebpf,
            opts.syscall_hooks,
            btf.as_ref(),
            &kernel_btf,
            &tracefs,
            casts,
            opts.syscall_hooks_on_demand,
        )?;
        // Optional: a kernel without uprobes still runs the rest.
        let on_demand = opts.syscall_hooks_on_demand;
        let (gpu, gpu_note) = match opts.gpu_probes.then(|| gpu::GpuProbes::load(&mut ebpf, on_demand)) {
            Some(Ok(g)) => (Some(g), None),
            Some(Err(e)) => (None, Some(e.to_string())),
            None => (None, None),
        };
        let families = Families { sched, switch_reads, mapped, hooks, gpu, gpu_note };
        Self::with_maps(ebpf, families, &config)
    }

    /// The capture of the loaded object `ebpf`: its maps taken out.
    fn with_maps(mut ebpf: Ebpf, f: Families, config: &Config) -> Result<Self, CaptureError> {
        let ring: RingBuf<MapData> = take(&mut ebpf, names::EVENTS)?;
        // SAFETY: the RingBuf owns its map fd for as long as the AsyncFd lives.
        let ring = unsafe { AsyncFd::register(ring) }.map_err(|e| CaptureError::Ring(e.into_parts().1))?;
        let storage_known = config.page.mapping != 0;
        Ok(Self {
            threads: take(&mut ebpf, names::THREADS)?,
            files: take(&mut ebpf, names::FILES)?,
            wakes: take(&mut ebpf, names::WAKES)?,
            wakes_by_proc: take(&mut ebpf, names::WAKES_BY_PROC)?,
            fd_waits: take(&mut ebpf, names::FD_WAITS)?,
            wake_cache: take(&mut ebpf, names::WAKE_CACHE)?,
            cgroups: take(&mut ebpf, names::CGROUPS)?,
            inode_bytes: if storage_known { Some(take(&mut ebpf, names::INODE_BYTES)?) } else { None },
            mapped: f.mapped,
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
            hooks: f.hooks,
            sched: f.sched,
            task_flags: config.task.flags,
            switch_reads: f.switch_reads,
            gpu: f.gpu,
            gpu_note: f.gpu_note,
            kernel_log: kernel_log::reader(&mut ebpf),
            ebpf,
        })
    }
}

/// What each family's load leaves for the capture to hold.
struct Families {
    sched: sched::SchedHooks,
    switch_reads: stall_common::SwitchReads,
    mapped: Option<pagecache::Way>,
    hooks: syscalls::Hooks,
    gpu: Option<gpu::GpuProbes>,
    gpu_note: Option<String>,
}

/// The config the programs are loaded with: this kernel's layouts, as
/// each family finds them, and the options.
fn config(
    opts: &CaptureOptions,
    features: &Features,
    tracefs: &Tracefs,
    kernel_btf: &KernelBtf,
) -> Result<Config, CaptureError> {
    let latency_mask = latency_mask(opts.latency_sample)?;
    Ok(Config {
        task: kernel_btf.task_offsets(!features.task_pt_regs)?,
        regs: REGS,
        cgroup_filter: u8::from(opts.cgroup_mode),
        floor: u8::from(opts.floor),
        timeline: u8::from(opts.timeline),
        latency_mask,
        latency_run_mask: latency_run_mask(latency_mask),
        _pad: [0; 3],
        ringbuf_wake_bytes: opts.ringbuf_bytes.unwrap_or(DEFAULT_RINGBUF_BYTES) / 8,
        page: pagecache::offsets_here(tracefs, kernel_btf),
        // io_uring reads are followed where the tracepoints and their
        // layout are known (docs/KERNELS.md).
        uring: uring::layout_here(tracefs, kernel_btf),
        tables: crate::syscalls::tables(),
    })
}

/// The object loaded with `config`, and whether its kfunc placeholders
/// were rewritten (where the kernel has the kfuncs; else the programs
/// that make the calls are not loaded, and their placeholders stay).
fn load_object(
    opts: &CaptureOptions,
    config: &Config,
    btf: Option<&Btf>,
    kernel_btf: &KernelBtf,
) -> Result<(Ebpf, bool), CaptureError> {
    // Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK.
    let _ = nix::sys::resource::setrlimit(
        nix::sys::resource::Resource::RLIMIT_MEMLOCK,
        nix::sys::resource::RLIM_INFINITY,
        nix::sys::resource::RLIM_INFINITY,
    );
    let mut loader = EbpfLoader::new();
    loader.btf(btf);
    loader.override_global(names::CONFIG, config, true);
    kernel_log::set_level(&mut loader);
    if let Some(bytes) = opts.ringbuf_bytes {
        loader.map_max_entries(names::EVENTS, bytes);
    }
    if let Some(n) = std::env::var(THREADS_MAX_ENV).ok().and_then(|v| v.parse().ok()) {
        loader.map_max_entries(names::THREADS, n);
    }
    let casts = match kfunc::KfuncIds::find(kernel_btf) {
        Some(ids) if std::env::var_os(SYSCALL_READS_ENV).is_none_or(|v| v != "probe") => {
            Some(kfunc::rewrite(BPF_OBJECT, ids).map_err(|e| CaptureError::Load(e.into()))?.0)
        }
        _ => None,
    };
    let object = casts.as_ref().map_or(BPF_OBJECT, |o| o.bytes());
    Ok((loader.load(object).map_err(load_err)?, casts.is_some()))
}

/// `STALL_THREADS_MAX=N` sizes `THREADS` for N threads: for tests of a
/// full map (what the kernel side then loses, and says).
const THREADS_MAX_ENV: &str = "STALL_THREADS_MAX";

/// `STALL_SYSCALL_READS=probe` leaves the kfunc placeholders as they are,
/// so the raw syscall return reads the registers with
/// `bpf_probe_read_kernel` where it would load them through
/// `bpf_rdonly_cast`: for tests and benchmarks of the fallback.
const SYSCALL_READS_ENV: &str = "STALL_SYSCALL_READS";

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
