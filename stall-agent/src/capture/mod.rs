//! The kernel side, seen from the agent: load and attach the programs with
//! this kernel's tracepoint layouts, choose what is tracked (a PID tree, a
//! cgroup), and read back events and counters. Dropping a [`Capture`]
//! detaches and unloads everything; nothing is pinned, so nothing outlives
//! the agent, even when it is killed.
pub mod backend;
pub mod btf;
pub mod cgroup;
pub mod mapped;
pub mod procfs;
pub mod syscalls;
pub mod tracefs;
pub mod uring;

use std::{
    collections::HashSet,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
};

use aya::{
    maps::{Array, HashMap, MapData, MapType, PerCpuArray, RingBuf},
    programs::{Program, ProgramError, ProgramType, RawTracePoint},
    sys::BpfHelper,
    Btf, Ebpf, EbpfLoader,
};
use stall_common::{
    counter, fd_kind, kclock, reason, run_state, slot_state, syscall_class, task_flags, track_gen, Config,
    CpuSlot, FdKey, FileStats, InodeBytes, InodeKey, Regs, ThreadStats, UringKey, UringRead, UringReads,
    WakeKey, WakeStats, WAKER_ANY_THREAD,
};
use tokio::io::unix::AsyncFd;

use crate::{
    clock::monotonic_ns,
    decode::{self, Event, FileSnap, Inode, InodeSnap, JobEvent, Snapshot, ThreadSnap, WakeSnap},
    pystack::PyStacks,
};

/// (program, category, tracepoint) for the scheduler and task hooks, all
/// raw tracepoints (never skipped while `bpf_prog_active` is held, unlike
/// perf-event tracepoint programs). `sched_switch` is replaced by
/// `sched_switch_stack` on kernels without `bpf_task_pt_regs`.
const ATTACH: [(&str, &str, &str); 5] = [
    ("sched_switch", "sched", "sched_switch"),
    ("sched_waking", "sched", "sched_waking"),
    ("task_newtask", "task", "task_newtask"),
    ("sched_process_exec", "sched", "sched_process_exec"),
    ("sched_process_exit", "sched", "sched_process_exit"),
];

/// (program, category, tracepoint) for page-cache fills (storage bytes per
/// file); attached where the kernel's BTF has the fields it reads.
const PAGE_CACHE_FILL: (&str, &str, &str) = ("page_cache_fill", "filemap", "mm_filemap_add_to_page_cache");

pub use backend::{Backend, SyscallHooks};

/// x86-64's `struct pt_regs`: `orig_ax` (the syscall a task is in), `di`,
/// `si`, `dx` (arguments 0-2), `cs`. Native syscalls come from `__USER_CS`.
#[cfg(target_arch = "x86_64")]
const REGS: Regs = Regs { nr: 120, arg0: 112, arg1: 104, arg2: 96, cs: 136, user_cs: 0x33, _pad: [0; 2] };

/// The ring buffer's size as declared in stall-ebpf's maps.rs.
const DEFAULT_RINGBUF_BYTES: u32 = 4 << 20;

/// How often the agent drains the ring buffer when no wakeup came (the
/// kernel side wakes it only once 1/8 of the ring is waiting).
pub const DRAIN_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

static BPF_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("STALL_BPF_OBJ"));

/// Errors callers branch on (each has its own exit code).
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// Capabilities stall needs are not effective (see `caps`).
    #[error("{}", crate::caps::explain(.0))]
    MissingCaps(Vec<crate::caps::Need>),
    /// Debian's and Ubuntu's kernels add perf_event_paranoid levels above 2
    /// at which only CAP_SYS_ADMIN may call perf_event_open (tracepoint
    /// programs attach through it); Debian's default is 3.
    #[error("the kernel refused to open the perf events tracepoint programs attach through (EACCES): kernel.perf_event_paranoid is {0}, at which Debian's and Ubuntu's kernels admit CAP_SYS_ADMIN only, not CAP_PERFMON; set it to 2 (sysctl kernel.perf_event_paranoid=2) or add CAP_SYS_ADMIN")]
    PerfParanoid(i32),
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
        "this stall was built without its kernel side (STALL_BPF_STUB); build it with `cargo xtask build`"
    )]
    Stub,
    #[error(
        "the kernel refused stall's syscall trampolines (fentry/fexit): {0}; \
         --syscall-hooks tracepoint (or auto) uses the raw syscall tracepoints"
    )]
    NoTrampolines(String),
    #[error("the kernel refused stall's eBPF programs: {0}")]
    Load(String),
    #[error("{0}")]
    Map(String),
    #[error("{0}")]
    Config(String),
}

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
}

/// One read in 8 is timed unless asked otherwise: the two clock reads are
/// most of what a traced read costs, and 1 in 8 (picked at random) gives
/// the per-file average latency to a few percent once a file has had a few
/// hundred reads. Bytes and calls are always exact.
pub const DEFAULT_LATENCY_SAMPLE: u32 = 8;

fn latency_mask(sample: u32) -> Result<u8, CaptureError> {
    let n = if sample == 0 { DEFAULT_LATENCY_SAMPLE } else { sample };
    if !n.is_power_of_two() || n > 128 {
        return Err(CaptureError::Config(format!(
            "--latency-sample {n}: must be a power of two from 1 to 128"
        )));
    }
    Ok((n - 1) as u8)
}

pub struct Capture {
    threads: HashMap<MapData, u32, ThreadStats>,
    files: HashMap<MapData, FdKey, FileStats>,
    wakes: HashMap<MapData, WakeKey, WakeStats>,
    /// What `wakes` had no room for, per waking process.
    wakes_by_proc: HashMap<MapData, WakeKey, WakeStats>,
    cgroups: HashMap<MapData, u64, u32>,
    /// Storage and mapped bytes per process and file (None: no page-cache
    /// hook here).
    inode_bytes: Option<HashMap<MapData, InodeKey, InodeBytes>>,
    /// How faults on mappings are followed (None: not on this kernel).
    mapped: Option<mapped::Way>,
    /// io_uring reads completed, by submitting thread, and those in flight.
    uring_reads: HashMap<MapData, u32, UringReads>,
    uring_pending: HashMap<MapData, UringKey, UringRead>,
    counters: PerCpuArray<MapData, u64>,
    cpu_slot: PerCpuArray<MapData, CpuSlot>,
    track_gen: Array<MapData, u32>,
    gen: u32,
    ring: AsyncFd<RingBuf<MapData>>,
    seed_seq: u64,
    decode_errors: u64,
    /// `TaskOffsets::flags` as loaded.
    task_flags: u32,
    // Last: programs detach when this drops.
    /// The syscall hooks' backend and links (none: detached).
    hooks: backend::Hooks,
    /// Python stack readers of the traced processes.
    py_stacks: PyStacks,
    ebpf: Ebpf,
}

fn map_err(e: impl std::fmt::Display) -> CaptureError {
    CaptureError::Map(e.to_string())
}

/// The verifier's reason, in one line: the last line of its log that is
/// not a statistic ("processed N insns", "verification time"...).
fn verifier_reason(log: &str) -> Option<String> {
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
fn program_load_err(name: &str, e: ProgramError) -> CaptureError {
    if let ProgramError::LoadError { io_error, verifier_log } = &e {
        if io_error.raw_os_error() == Some(libc::EPERM) {
            return not_permitted();
        }
        let log = verifier_log.to_string();
        let reason = verifier_reason(&log).unwrap_or_else(|| io_error.to_string());
        return CaptureError::Load(format!("program {name}: {reason}"));
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

fn load_err(e: impl std::error::Error) -> CaptureError {
    // aya nests the kernel's answer; EPERM anywhere means privileges.
    let mut text = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        text.push_str(": ");
        text.push_str(&s.to_string());
        src = s.source();
    }
    if text.contains("Operation not permitted") || text.contains("EPERM") {
        not_permitted()
    } else {
        CaptureError::Load(text)
    }
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
        let config = Config {
            task: kernel_btf.task_offsets(!features.task_pt_regs)?,
            regs: REGS,
            cgroup_filter: u8::from(opts.cgroup_mode),
            floor: u8::from(opts.floor),
            timeline: u8::from(opts.timeline),
            latency_mask: latency_mask(opts.latency_sample)?,
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
        loader.override_global("CONFIG", &config, true);
        if let Some(bytes) = opts.ringbuf_bytes {
            loader.map_max_entries("EVENTS", bytes);
        }
        let mut ebpf = loader.load(BPF_OBJECT).map_err(load_err)?;

        for (prog, _, name) in ATTACH {
            let prog =
                if prog == "sched_switch" && !features.task_pt_regs { "sched_switch_stack" } else { prog };
            program(&mut ebpf, prog, RawTracePoint::load)?.attach(name).map_err(load_err)?;
        }
        let storage_known = config.page.mapping != 0;
        if storage_known {
            let (prog, _, name) = PAGE_CACHE_FILL;
            let prog = if features.task_pt_regs { prog } else { "page_cache_fill_stack" };
            program(&mut ebpf, prog, RawTracePoint::load)?.attach(name).map_err(load_err)?;
        }
        // Needs the page-cache fields too: None where the fill program is not attached.
        let mapped = mapped::attach(&mut ebpf, &tracefs, &config.page, btf.as_ref())?;
        if config.uring.on != 0 {
            let submit = uring_submit.unwrap_or(uring::SUBMIT[0]);
            program(&mut ebpf, "uring_submit", RawTracePoint::load)?.attach(submit).map_err(load_err)?;
            program(&mut ebpf, "uring_complete", RawTracePoint::load)?
                .attach(uring::COMPLETE)
                .map_err(load_err)?;
            if config.uring.submit_req == 0 {
                program(&mut ebpf, "uring_file_get", RawTracePoint::load)?
                    .attach(uring::FILE_GET)
                    .map_err(load_err)?;
            }
        }
        // The tables first: a program attached before them would see every
        // syscall as unhooked, which is only harmless because nothing is
        // tracked yet.
        let mut classes: Array<_, u8> = take(&mut ebpf, "SYSCALL_CLASS")?;
        for (nr, class) in syscalls::class_table() {
            classes.set(nr, class, 0).map_err(map_err)?;
        }
        let mut hooks: Array<_, u8> = take(&mut ebpf, "HOOKS")?;
        for (nr, what) in syscalls::hook_table() {
            hooks.set(nr, what, 0).map_err(map_err)?;
        }
        let hooks = backend::Hooks::load(
            &mut ebpf,
            opts.syscall_hooks,
            btf.as_ref(),
            &kernel_btf,
            &tracefs,
            opts.syscall_hooks_on_demand,
        )?;
        let ring: RingBuf<MapData> = take(&mut ebpf, "EVENTS")?;
        // SAFETY: the RingBuf owns its map fd for as long as the AsyncFd lives.
        let ring = unsafe { AsyncFd::register(ring) }.map_err(|e| CaptureError::Map(e.to_string()))?;
        Ok(Self {
            threads: take(&mut ebpf, "THREADS")?,
            files: take(&mut ebpf, "FILES")?,
            wakes: take(&mut ebpf, "WAKES")?,
            wakes_by_proc: take(&mut ebpf, "WAKES_BY_PROC")?,
            cgroups: take(&mut ebpf, "CGROUPS")?,
            inode_bytes: if storage_known { Some(take(&mut ebpf, "INODE_BYTES")?) } else { None },
            mapped,
            uring_reads: take(&mut ebpf, "URING_READS")?,
            uring_pending: take(&mut ebpf, "URING_PENDING")?,
            counters: take(&mut ebpf, "COUNTERS")?,
            cpu_slot: take(&mut ebpf, "CPU_SLOT")?,
            track_gen: take(&mut ebpf, "TRACK_GEN")?,
            gen: 0,
            ring,
            seed_seq: 0,
            decode_errors: 0,
            hooks,
            py_stacks: PyStacks::new(),
            task_flags: config.task.flags,
            ebpf,
        })
    }

    /// Whether the programs find saved registers from the task's stack
    /// (kernels without `bpf_task_pt_regs`).
    pub fn regs_from_stack(&self) -> bool {
        self.task_flags & task_flags::REGS_FROM_STACK != 0
    }

    /// Tracks `root`, all its threads and all its descendants, and returns
    /// the files they already had open (as `Open` events). The kernel
    /// follows every task created from here on; inserting parents before
    /// listing their children, and listing until nothing new appears, closes
    /// the window in which a fork could slip through.
    pub fn track_tree(&mut self, root: u32, job: u32) -> Result<Vec<JobEvent>, CaptureError> {
        if !procfs::exists(root) {
            return Err(CaptureError::NoSuchProcess(root));
        }
        let mut done: HashSet<u32> = HashSet::new();
        let mut todo = vec![root];
        let mut opened = Vec::new();
        loop {
            while let Some(pid) = todo.pop() {
                if done.insert(pid) {
                    self.track_process(pid, job)?;
                    opened.extend(self.seed_fds(pid, job));
                }
            }
            let children = procfs::children_map();
            let mut stack: Vec<u32> = done.iter().copied().collect();
            while let Some(p) = stack.pop() {
                for &c in children.get(&p).into_iter().flatten() {
                    if !done.contains(&c) && !todo.contains(&c) {
                        todo.push(c);
                        stack.push(c);
                    }
                }
            }
            if todo.is_empty() {
                break;
            }
        }
        self.changed();
        Ok(opened)
    }

    /// Tells the kernel side that what is tracked changed: every CPU's
    /// slot (`CPU_SLOT`) is looked up again at its next syscall.
    fn changed(&mut self) {
        self.gen = track_gen::next_tracking(self.gen);
        let _ = self.track_gen.set(0, self.gen, 0);
    }

    pub fn py_stacks(&mut self) -> &mut PyStacks {
        &mut self.py_stacks
    }

    pub fn py_stacks_ref(&self) -> &PyStacks {
        &self.py_stacks
    }

    /// Whether the syscall hooks (file reads, writes, opens) are attached.
    pub fn syscall_hooks(&self) -> bool {
        self.hooks.attached()
    }

    /// The syscall hooks' backend (trampolines or raw tracepoints).
    pub fn syscall_backend(&self) -> Backend {
        self.hooks.backend()
    }

    /// How faults on file mappings are followed: `tracepoint`,
    /// `trampoline` or `none`.
    pub fn mmap_hooks(&self) -> &'static str {
        mapped::Way::name(self.mapped)
    }

    /// One line for people: the backend, and why `auto` fell back.
    pub fn syscall_backend_line(&self) -> String {
        match (self.hooks.backend(), self.hooks.refused()) {
            (Backend::Trampoline, _) => {
                "syscall hooks: trampoline (fentry/fexit on the hooked syscalls only)".to_string()
            }
            (Backend::Tracepoint, None) => {
                "syscall hooks: tracepoint (raw_syscalls: every syscall of the machine)".to_string()
            }
            (Backend::Tracepoint, Some(why)) => format!(
                "syscall hooks: tracepoint (raw_syscalls: every syscall of the machine; trampolines refused: {why})"
            ),
        }
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
            self.track_gen.set(0, self.gen, 0).map_err(map_err)?;
            if let Err(e) = self.hooks.attach(&mut self.ebpf) {
                // Half attached is not attached: leave none.
                let _ = self.hooks.detach(&mut self.ebpf);
                return Err(e);
            }
        } else {
            self.hooks.detach(&mut self.ebpf)?;
        }
        Ok(())
    }

    /// Adds every thread of `pid`, with its state as /proc shows it now.
    pub fn track_process(&mut self, pid: u32, job: u32) -> Result<(), CaptureError> {
        let mut seen: HashSet<u32> = HashSet::new();
        loop {
            let fresh: Vec<u32> = procfs::threads(pid).into_iter().filter(|t| !seen.contains(t)).collect();
            if fresh.is_empty() {
                return Ok(());
            }
            for tid in fresh {
                seen.insert(tid);
                self.seed_thread(pid, tid, job)?;
            }
            self.changed();
        }
    }

    fn seed_thread(&mut self, tgid: u32, tid: u32, job: u32) -> Result<(), CaptureError> {
        let now = monotonic_ns();
        let Some(st) = procfs::thread_stat(tgid, tid) else { return Ok(()) };
        let mut t = ThreadStats {
            tgid,
            job,
            last_ts: now,
            off_nr: -1,
            other_nr: -1,
            seeded: 1,
            ..Default::default()
        };
        // The kernel's totals so far: what it adds from now on is this job's.
        if let Some(k) = procfs::thread_schedstat(tgid, tid) {
            t.kclock = kclock::EXEC;
            t.exec_base = k.exec_ns;
            t.exec_ns = k.exec_ns;
            if self.task_flags & task_flags::RUN_DELAY != 0 {
                t.kclock |= kclock::DELAY;
                t.delay_base = k.delay_ns;
                t.delay_ns = k.delay_ns;
            }
        }
        if st.state == 'R' {
            t.state = run_state::RUNNING;
        } else {
            let nr = procfs::thread_syscall(tgid, tid).unwrap_or(-1);
            let fd_regular = || {
                let text = std::fs::read_to_string(format!("/proc/{tgid}/task/{tid}/syscall")).ok()?;
                let arg0 = text.split_whitespace().nth(1)?;
                let fd = i32::from_str_radix(arg0.trim_start_matches("0x"), 16).ok()?;
                procfs::fd_info(tgid, fd).map(|o| o.regular)
            };
            t.state = run_state::OFF;
            t.off_reason = classify_blocked(nr, st.state, fd_regular);
            t.off_nr = nr as i32;
        }
        // BPF_NOEXIST: the kernel may already have created it (a new thread).
        match self.threads.insert(tid, t, 1) {
            Ok(()) => Ok(()),
            Err(_) if self.threads.get(&tid, 0).is_ok() => Ok(()),
            Err(e) => Err(map_err(e)),
        }
    }

    /// Registers the regular files `pid` has open, so reads of descriptors
    /// opened before attach (or inherited over fork) are counted.
    pub fn seed_fds(&mut self, pid: u32, job: u32) -> Vec<JobEvent> {
        let now = monotonic_ns();
        let mut out = Vec::new();
        for f in procfs::open_fds(pid).into_iter().filter(|f| f.regular) {
            self.seed_seq += 1;
            let file_id = (1 << 63) | (u64::from(pid) << 24) | (self.seed_seq & 0xff_ffff);
            let stats = FileStats { file_id, kind: fd_kind::REGULAR, ..Default::default() };
            if self.files.insert(FdKey { tgid: pid, fd: f.fd }, stats, 1).is_ok() {
                let open = Event::Open {
                    ts: now,
                    tid: pid,
                    tgid: pid,
                    fd: f.fd,
                    file_id,
                    path: f.target,
                    dfd: -100,
                    dup_of: None,
                };
                out.push((job, open));
            }
        }
        self.changed();
        out
    }

    /// Tracks every task of the cgroup `dir` and its descendants: those in it
    /// now, and any that later runs there. Returns the files already open.
    pub fn watch_cgroup(&mut self, dir: &Path, job: u32) -> Result<Vec<JobEvent>, CaptureError> {
        let mut opened = Vec::new();
        for d in cgroup::subtree(dir) {
            let Some(id) = cgroup::id(&d) else { continue };
            if self.cgroups.get(&id, 0).is_ok() {
                continue;
            }
            self.cgroups.insert(id, job, 0).map_err(map_err)?;
            let mut pids = HashSet::new();
            for (pid, tid) in cgroup::threads(&d) {
                self.seed_thread(pid, tid, job)?;
                pids.insert(pid);
            }
            for pid in pids {
                opened.extend(self.seed_fds(pid, job));
            }
        }
        self.changed();
        Ok(opened)
    }

    /// Stops following a cgroup (daemon: the job is gone).
    pub fn unwatch_cgroup(&mut self, dir: &Path) {
        for d in cgroup::subtree(dir) {
            if let Some(id) = cgroup::id(&d) {
                let _ = self.cgroups.remove(&id);
            }
        }
        self.changed();
    }

    /// What an opened descriptor is. An absolute path is `stat`ed (the
    /// descriptor may be closed, or its number reused, by the time the
    /// event is read: a file mapped and closed at once); a relative one is
    /// looked up in /proc, where the descriptor says what it points to.
    pub fn classify_open(&mut self, tgid: u32, fd: i32, path: &str) -> Option<procfs::Opened> {
        if path.starts_with('/') {
            if let Some(opened) = procfs::path_info(path) {
                return Some(opened);
            }
        }
        procfs::fd_info(tgid, fd)
    }

    /// Records that an opened descriptor is not a regular file (FIFO,
    /// device...), so the kernel stops counting it as file reads; only if
    /// it still names the same open. This rewrites the whole entry: reads
    /// counted between the lookup and the update are lost, which is why it
    /// is used only for non-files, whose per-file counts nothing reports.
    pub fn set_fd_kind(&mut self, tgid: u32, fd: i32, file_id: u64, kind: u32) {
        let key = FdKey { tgid, fd };
        if let Ok(mut s) = self.files.get(&key, 0) {
            if s.file_id == file_id && s.kind != kind {
                s.kind = kind;
                let _ = self.files.insert(key, s, 2); // BPF_EXIST
                self.changed();
            }
        }
    }

    /// Waits until the ring buffer has records, then decodes all of them.
    pub async fn next_events(&mut self, out: &mut Vec<JobEvent>) -> std::io::Result<()> {
        let mut guard = self.ring.readable_mut().await?;
        let ring = guard.get_inner_mut();
        while let Some(item) = ring.next() {
            match decode::decode(&item) {
                Ok(ev) => out.push(ev),
                Err(_) => self.decode_errors += 1,
            }
        }
        guard.clear_ready();
        Ok(())
    }

    /// Decodes whatever is in the ring buffer now, without waiting.
    pub fn drain_events(&mut self, out: &mut Vec<JobEvent>) {
        let ring = self.ring.get_mut();
        while let Some(item) = ring.next() {
            match decode::decode(&item) {
                Ok(ev) => out.push(ev),
                Err(_) => self.decode_errors += 1,
            }
        }
    }

    pub fn ring_fd(&self) -> i32 {
        self.ring.get_ref().as_raw_fd()
    }

    /// Reads every counter map once.
    pub fn snapshot(&self) -> Snapshot {
        let ts = monotonic_ns();
        let mut threads: Vec<(u32, ThreadStats)> = self.threads.iter().filter_map(Result::ok).collect();
        for (tid, u) in self.uring_reads.iter().filter_map(Result::ok) {
            if let Some((_, t)) = threads.iter_mut().find(|(t, _)| *t == tid) {
                t.add_uring_reads(&u);
            }
        }
        let mut files: Vec<(FdKey, FileStats)> = self.files.iter().filter_map(Result::ok).collect();
        // After the maps: a slot flushed meanwhile is then counted in
        // neither (until the next snapshot), never in both.
        let slots = self.cpu_slots();
        let mut events = self.counter_sum(counter::EVENTS);
        for r in &slots {
            events += r.events;
            if let Some((_, t)) = threads.iter_mut().find(|(tid, _)| *tid == r.tid) {
                t.add_slot_counts(r);
            }
            if r.file_calls > 0 {
                if let Some((_, f)) = files
                    .iter_mut()
                    .find(|(k, f)| k.tgid == r.tgid && k.fd == r.file_fd && f.file_id == r.file_id)
                {
                    f.add_slot_file(r);
                }
            }
        }
        let files = files.iter().map(|(k, s)| FileSnap::of(k, s)).collect();
        let threads = threads
            .into_iter()
            .map(|(tid, s)| {
                let (counters, now) = decode::fold(&s, ts);
                ThreadSnap { tid, tgid: s.tgid, job: s.job, counters, now, other_nr: s.other_nr }
            })
            .collect();
        let wakes = self
            .wakes
            .iter()
            .chain(self.wakes_by_proc.iter())
            .filter_map(Result::ok)
            .map(|(k, w)| WakeSnap {
                wakee: k.wakee,
                waker: k.waker,
                waker_tgid: w.waker_tgid,
                waker_comm: decode::comm(&w.waker_comm),
                count: w.count,
            })
            .collect();
        let mut lost = [0u64; counter::LOST_CAUSES];
        for (i, slot) in lost.iter_mut().enumerate() {
            *slot = self.counter_sum(i as u32);
        }
        lost[counter::LOST_RINGBUF as usize] += self.decode_errors;
        Snapshot {
            ts,
            threads,
            files,
            wakes,
            lost,
            events,
            sched_gaps: self.counter_sum(counter::SCHED_GAPS),
            sched_repaired: self.counter_sum(counter::SCHED_REPAIRED),
            inode_bytes: self.inode_bytes.as_ref().map(|m| {
                m.iter()
                    .filter_map(Result::ok)
                    .map(|(k, b)| InodeSnap {
                        tgid: k.tgid,
                        inode: Inode { dev: k.dev, ino: k.ino },
                        storage_bytes: b.storage,
                        mmap_bytes: b.mapped,
                    })
                    .collect()
            }),
            mmap_known: self.mapped.is_some(),
        }
    }

    /// Every CPU's slot (`CPU_SLOT`) that holds a tracked thread.
    fn cpu_slots(&self) -> Vec<CpuSlot> {
        match self.cpu_slot.get(&0, 0) {
            Ok(v) => v.iter().filter(|r| r.tracked == slot_state::TRACKED).copied().collect(),
            Err(_) => Vec::new(),
        }
    }

    fn counter_sum(&self, idx: u32) -> u64 {
        self.counters.get(&idx, 0).map(|v| v.iter().sum()).unwrap_or(0)
    }

    /// Forgets processes and threads that are gone: their descriptors (whose
    /// final counts are returned; exit closes files without `close`), and
    /// the waker counts of the threads. (Thread entries the kernel removes at
    /// exit itself.)
    pub fn retire(&mut self, tgids: &HashSet<u32>, tids: &HashSet<u32>) -> Vec<FileSnap> {
        let mut out = Vec::new();
        if !tgids.is_empty() {
            out = remove_where(&mut self.files, |k, _| tgids.contains(&k.tgid))
                .iter()
                .map(|(k, s)| FileSnap::of(k, s))
                .collect();
            if let Some(inode_bytes) = self.inode_bytes.as_mut() {
                // Their last counts were in the snapshot just taken.
                remove_where(inode_bytes, |k, _| tgids.contains(&k.tgid));
            }
        }
        if tids.is_empty() && tgids.is_empty() {
            return out;
        }
        // Dead wakers too: a parent woken by each of a million short-lived
        // children would otherwise fill the map (the model keeps the counts).
        let gone = |k: &WakeKey| {
            tids.contains(&k.wakee)
                || match k.waker & WAKER_ANY_THREAD {
                    0 => tids.contains(&k.waker),
                    _ => tgids.contains(&(k.waker & !WAKER_ANY_THREAD)),
                }
        };
        remove_where(&mut self.wakes, |k, _| gone(k));
        remove_where(&mut self.wakes_by_proc, |k, _| gone(k));
        remove_where(&mut self.uring_reads, |tid, _| tids.contains(tid));
        // Reads in flight when their process ended never complete for it.
        remove_where(&mut self.uring_pending, |_, r| tgids.contains(&r.tgid));
        out
    }
}

/// Removes the entries of `map` that are `gone` (by key and value); returns them as they
/// stood just before (a process's last counts).
fn remove_where<K: aya::Pod, V: aya::Pod>(
    map: &mut HashMap<MapData, K, V>,
    gone: impl Fn(&K, &V) -> bool,
) -> Vec<(K, V)> {
    let removed: Vec<(K, V)> = map.iter().filter_map(Result::ok).filter(|(k, v)| gone(k, v)).collect();
    for (k, _) in &removed {
        let _ = map.remove(k);
    }
    removed
}

/// A program of the object, loaded (`load` is the type's own).
fn program<'a, T>(
    ebpf: &'a mut Ebpf,
    name: &str,
    load: fn(&mut T) -> Result<(), ProgramError>,
) -> Result<&'a mut T, CaptureError>
where
    &'a mut T: TryFrom<&'a mut Program, Error = ProgramError>,
{
    let prog: &mut T = ebpf
        .program_mut(name)
        .ok_or_else(|| CaptureError::Load(format!("program {name} missing from the object")))?
        .try_into()
        .map_err(load_err)?;
    load(prog).map_err(|e| program_load_err(name, e))?;
    Ok(prog)
}

/// A program loaded at start-up, to attach or detach.
fn attached_program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, CaptureError>
where
    &'a mut T: TryFrom<&'a mut Program, Error = ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or_else(|| CaptureError::Load(format!("program {name} missing from the object")))?
        .try_into()
        .map_err(load_err)
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

fn take<T: TryFrom<aya::maps::Map>>(ebpf: &mut Ebpf, name: &str) -> Result<T, CaptureError>
where
    T::Error: std::fmt::Display,
{
    let map = ebpf.take_map(name).ok_or_else(|| CaptureError::Map(format!("map {name} missing")))?;
    T::try_from(map).map_err(map_err)
}

/// The wait reason of a thread found blocked at attach, from what /proc
/// shows: the syscall it is in, its state letter, and (for reads) whether
/// the descriptor is a regular file. Mirrors the kernel side's rules.
pub fn classify_blocked(nr: i64, state: char, fd_regular: impl FnOnce() -> Option<bool>) -> u8 {
    match syscalls::class(nr) {
        syscall_class::FUTEX => reason::FUTEX,
        syscall_class::POLL => reason::POLL,
        syscall_class::SLEEP => reason::SLEEP,
        syscall_class::READ if nr >= 0 => {
            if fd_regular().unwrap_or(false) {
                reason::IO
            } else {
                reason::POLL
            }
        }
        _ if state == 'D' => reason::IO,
        _ => reason::OTHER,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocked_reasons_from_proc() {
        assert_eq!(classify_blocked(202, 'S', || None), reason::FUTEX);
        assert_eq!(classify_blocked(0, 'S', || Some(false)), reason::POLL);
        assert_eq!(classify_blocked(0, 'D', || Some(true)), reason::IO);
        assert_eq!(classify_blocked(7, 'S', || None), reason::POLL);
        assert_eq!(classify_blocked(230, 'S', || None), reason::SLEEP);
        assert_eq!(classify_blocked(-1, 'D', || None), reason::IO);
        assert_eq!(classify_blocked(61, 'S', || None), reason::OTHER);
    }

    #[test]
    fn verifier_reason_is_the_last_meaningful_line() {
        let log = "0: R1=ctx() R10=fp0\n0: (85) call bpf_task_pt_regs#175\nunknown func bpf_task_pt_regs#175\nprocessed 1 insns (limit 1000000) max_states_per_insn 0\n\n";
        assert_eq!(verifier_reason(log).as_deref(), Some("unknown func bpf_task_pt_regs#175"));
        assert_eq!(verifier_reason("\n  \n"), None);
    }
}
