//! Per-thread scheduling state: why a thread is off-CPU, its counters in
//! `THREADS`, who wakes it (`WAKES`), the per-CPU slot (`CPU_SLOT`) that
//! holds a running thread's hot state, and where the kernel keeps the task
//! and register fields the programs read.

use crate::{uring::UringReads, COMM_LEN};

/// Why a thread is off-CPU; the index into [`ThreadStats::off_ns`].
pub mod reason {
    /// Blocked in `futex` (locks, condition variables, `queue.Queue.get`).
    pub const FUTEX: u8 = 0;
    /// Blocked reading a regular file, or in uninterruptible sleep outside a
    /// syscall (page faults on mapped files): the job's input.
    pub const IO: u8 = 1;
    /// Waiting on a pipe, socket or event: poll/select/epoll, or a blocking
    /// read of a non-file descriptor (a `multiprocessing` queue).
    pub const POLL: u8 = 2;
    /// Sleeping on purpose: nanosleep, clock_nanosleep, pause.
    pub const SLEEP: u8 = 3;
    /// Runnable but not running: preempted, or woken and waiting for a CPU.
    pub const RUNQUEUE: u8 = 4;
    /// Any other blocking syscall; [`super::ThreadStats::other_nr`] names it.
    pub const OTHER: u8 = 5;
    /// Blocked writing a regular file: its I/O, or the writeback throttling
    /// the kernel puts a writer to sleep in (checkpoints, logs).
    pub const WRITE: u8 = 6;
    /// Blocked in `fsync`, `fdatasync`, `sync_file_range`, `msync`, `sync`
    /// or `syncfs`: waiting for written data to reach storage.
    pub const SYNC: u8 = 7;
    /// Runnable but held back by its cgroup's CPU limit (CFS bandwidth
    /// throttling). The kernel side never sets it: the agent moves it out
    /// of RUNQUEUE, apportioned from the cgroup's `cpu.stat`.
    pub const THROTTLED: u8 = 8;
    /// Blocked writing a pipe or socket: waiting for its reader or peer to
    /// take the data (stdout into a slow log shipper, an upload).
    pub const SEND: u8 = 9;
    pub const COUNT: usize = 10;
    pub const NAMES: [&str; COUNT] =
        ["futex", "io", "poll", "sleep", "runqueue", "other", "write", "sync", "throttled", "send"];

    /// The reason a thread blocked in a syscall of `class` (a
    /// [`crate::syscall_class`]) waits for, as it sleeps (a [`super::sleep`]
    /// value): the one rule the kernel's `sched_switch` and the agent's
    /// /proc seeding both apply. `on_file`, asked only for the read and
    /// write families: whether the call's descriptor is a regular file (a
    /// file's read is input, its write output; a pipe's or socket's read
    /// waits for another party, its write for the party that takes the
    /// data); `None` where that is unknown, and then a file is what blocks
    /// uninterruptibly, as pipes and sockets do not.
    #[inline(always)]
    pub fn reason_for(class: u8, sleep: u8, on_file: impl FnOnce() -> Option<bool>) -> u8 {
        use crate::syscall_class as c;
        let uninterruptible = sleep == super::sleep::UNINTERRUPTIBLE;
        let on_file = || on_file().unwrap_or(uninterruptible);
        match class {
            c::FUTEX => FUTEX,
            c::POLL => POLL,
            c::SLEEP => SLEEP,
            c::READ => {
                if on_file() {
                    IO
                } else {
                    POLL
                }
            }
            c::WRITE => {
                if on_file() {
                    WRITE
                } else {
                    SEND
                }
            }
            c::SYNC => SYNC,
            // Uninterruptible sleep outside the known waits: disk I/O (page
            // faults on mapped files, metadata reads), rarely a kernel lock.
            _ if uninterruptible => IO,
            _ => OTHER,
        }
    }

    /// The reason's name; "other" for a value no reason has.
    pub fn name(r: u8) -> &'static str {
        NAMES.get(usize::from(r)).copied().unwrap_or(NAMES[OTHER as usize])
    }
}

/// Scheduling state of a tracked thread as the kernel side last saw it.
/// How a task going off-CPU sleeps: the kernel side reads it from
/// `preempt` and the task's state, the agent from the state letter /proc
/// shows; [`reason::reason_for`] takes it from either.
pub mod sleep {
    /// Preempted, or still running (a signal cancelled its sleep).
    pub const RUNNABLE: u8 = 0;
    pub const SLEEPING: u8 = 1;
    /// `TASK_UNINTERRUPTIBLE` without `TASK_NOLOAD` (`TASK_IDLE` is not I/O).
    pub const UNINTERRUPTIBLE: u8 = 2;
    pub const EXITING: u8 = 3;

    /// From a /proc `stat` state letter.
    pub fn from_proc(state: char) -> u8 {
        match state {
            'R' => RUNNABLE,
            'D' => UNINTERRUPTIBLE,
            'Z' | 'X' | 'x' => EXITING,
            _ => SLEEPING,
        }
    }
}

/// How the loaded `sched_switch` program reads the task going off-CPU:
/// the one definition of the ladder. The kernel side instantiates its
/// switch program once per variant, with [`SwitchReads::how`] as its
/// `HOW`; the agent loads the variant's [`SwitchReads::program`] and
/// reports its [`SwitchReads::name`]. Cheapest first, as the agent tries
/// them where the kernel allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum SwitchReads {
    /// `Queued` where EEVDF delays dequeues (`task_flags::DELAYED_DEQUEUE`):
    /// a wakeup reads the clock only where the wakee was enqueued before
    /// it (`sched_waking_checked`), and the switch finds the task going
    /// off-CPU and its registers by `bpf_rdonly_cast`, not by helper calls:
    /// both need the kfunc rewrite.
    QueuedChecked = 4,
    /// `Direct`, and a woken task's wait for a CPU from the kernel's
    /// enqueue time (`task_flags::QUEUED_AT`): its wakeup reads no clock.
    Queued = 3,
    /// Plain loads through its BTF pointer: no helper call per field.
    Direct = 2,
    /// `bpf_probe_read_kernel` per field, registers from `bpf_task_pt_regs`.
    Probe = 1,
    /// The same, registers found from `task->stack` (before 5.15).
    ProbeStack = 0,
}

impl SwitchReads {
    pub const ALL: [SwitchReads; 5] = [
        SwitchReads::QueuedChecked,
        SwitchReads::Queued,
        SwitchReads::Direct,
        SwitchReads::Probe,
        SwitchReads::ProbeStack,
    ];

    /// The kernel program's `const HOW: u8`.
    pub const fn how(self) -> u8 {
        self as u8
    }

    /// The variant whose `how` is `how` (`ProbeStack` for no variant's).
    pub const fn from_how(how: u8) -> Self {
        match how {
            4 => SwitchReads::QueuedChecked,
            3 => SwitchReads::Queued,
            2 => SwitchReads::Direct,
            1 => SwitchReads::Probe,
            _ => SwitchReads::ProbeStack,
        }
    }

    /// Whether it reads the current task by plain loads.
    pub const fn direct(self) -> bool {
        matches!(self, SwitchReads::Direct | SwitchReads::Queued | SwitchReads::QueuedChecked)
    }

    /// Whether it takes a woken task's wait for a CPU from the kernel.
    pub const fn queued(self) -> bool {
        matches!(self, SwitchReads::Queued | SwitchReads::QueuedChecked)
    }

    /// As the JSON summary (`switch_reads`) names it.
    pub const fn name(self) -> &'static str {
        match self {
            SwitchReads::QueuedChecked => "queued-checked",
            SwitchReads::Queued => "queued",
            SwitchReads::Direct => "direct",
            SwitchReads::Probe => "probe",
            SwitchReads::ProbeStack => "probe-stack",
        }
    }

    /// Its program in the kernel object.
    pub const fn program(self) -> &'static str {
        use crate::names;
        match self {
            SwitchReads::QueuedChecked => names::SCHED_SWITCH_QUEUED_CAST,
            SwitchReads::Queued => names::SCHED_SWITCH_QUEUED,
            SwitchReads::Direct => names::SCHED_SWITCH_DIRECT,
            SwitchReads::Probe => names::SCHED_SWITCH,
            SwitchReads::ProbeStack => names::SCHED_SWITCH_STACK,
        }
    }
}

pub mod run_state {
    /// Tracked, but no switch seen yet and nothing seeded.
    pub const UNKNOWN: u8 = 0;
    pub const RUNNING: u8 = 1;
    pub const OFF: u8 = 2;
}

/// [`ThreadStats::wake_ts`] of a thread woken at a time not read: below any
/// switch-out time, so whoever splits a span by the wakeup time finds none.
pub const WOKEN_UNTIMED: u64 = 1;

/// Value of the `THREADS` map, keyed by tid. Presence in the map is what
/// makes a thread tracked.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadStats {
    pub tgid: u32,
    /// Which job (attach target, daemon cgroup) this thread belongs to.
    pub job: u32,
    pub on_cpu_ns: u64,
    pub off_ns: [u64; reason::COUNT],
    pub file_read_bytes: u64,
    pub file_read_calls: u64,
    pub other_read_bytes: u64,
    pub other_read_calls: u64,
    /// Successful write-family calls (bytes as returned) on descriptors
    /// counted as files (`fd_kind::UNKNOWN`/`REGULAR` in `FILES`): logs,
    /// checkpoints. Progress signals, never I/O waits.
    pub file_write_bytes: u64,
    pub file_write_calls: u64,
    /// Writes to anything else: pipes, sockets, ttys, untracked descriptors.
    pub other_write_bytes: u64,
    pub other_write_calls: u64,
    /// Writes to fd 1 or 2, whatever they point to (also counted above as
    /// file or other): a log printed to stdout is progress.
    pub stdio_write_bytes: u64,
    pub wakeups: u64,
    /// Switch-in time while running, switch-out time while off-CPU
    /// (CLOCK_MONOTONIC ns, as `bpf_ktime_get_ns`).
    pub last_ts: u64,
    /// When a wakeup was seen during the current off-CPU span, else 0; or
    /// [`WOKEN_UNTIMED`] where the switch-in takes the span's runqueue part
    /// from the kernel (`task_flags::QUEUED_AT`), and stores the enqueue
    /// time here.
    pub wake_ts: u64,
    pub state: u8,
    pub off_reason: u8,
    /// [`kclock`]: which of the kernel's own totals below are kept.
    pub kclock: u8,
    /// Non-zero: `state` was inferred from /proc by the agent (which cannot
    /// tell running from runnable, and races the thread): the first switch
    /// seen settles it and is never counted as a gap.
    pub seeded: u8,
    /// Syscall number at switch-out (-1: not in a syscall).
    pub off_nr: i32,
    /// Last syscall counted as OTHER, to name it.
    pub other_nr: i32,
    pub inflight: u32,
    pub inflight_ts: u64,
    /// fd for reads, dfd for openat.
    pub inflight_fd: i32,
    /// As `CpuSlot::inflight_kind`.
    pub inflight_kind: u32,
    /// filename pointer for openat.
    pub inflight_ptr: u64,
    /// The kernel's `se.sum_exec_runtime` when tracking began, and as of
    /// `last_ts` (read at every switch in and out): on-CPU time is their
    /// difference, plus the span in progress, so a missed switch can never
    /// skew it (see [`kclock::EXEC`]).
    pub exec_base: u64,
    pub exec_ns: u64,
    /// The kernel's `sched_info.run_delay` when tracking began, and as of
    /// the last switch-out (see [`kclock::DELAY`]); `rq_at_out` is
    /// `off_ns[RUNQUEUE]` then.
    pub delay_base: u64,
    pub delay_ns: u64,
    pub rq_at_out: u64,
    /// Kernel-side: the address of the thread's task as of its last
    /// switch-out, which a note naming the thread must match (stall-ebpf's
    /// untracked.rs); 0 before.
    pub task: u64,
    /// Kernel-side: the address of the thread's saved user registers (its
    /// `pt_regs`, fixed for its life) once a syscall of it from 64-bit code
    /// was seen, else 0. A slot loaded for it at its switch-in takes it
    /// (`CpuSlot::regs`), so that its first syscall after asks neither its
    /// thread id nor its code segment.
    pub regs: u64,
    /// Who ended this thread's waits lately: the waker (as its
    /// [`WakeKey::waker`]) of its last noted wakeup, with [`WAIT_NOTED`] set
    /// from that wakeup to the switch-in ending the wait; and its process.
    pub waited_by: u32,
    pub waited_by_tgid: u32,
    /// Blocked time that `waited_by`'s wakeups ended, not yet in its pair's
    /// [`WakeStats::blocked_ns`]: added at each switch-in after a wait it
    /// ended, moved into the pair when another waker ends one (or the
    /// thread exits). A thread woken again and again by one waker (a queue's
    /// feeder, a lock's holder) so pays an addition per wait, not a lookup.
    pub waited_ns: u64,
    /// The descriptor, plus one, of the read or write family call the
    /// thread blocks in during its current off-CPU span, where the call's
    /// entry recorded it (0: none, or not such a call).
    pub blocked_fd: i32,
    /// The descriptor, plus one, whose blocked time `fd_waited_ns` holds,
    /// not yet in its `FD_WAITS` entry: moved there when the thread blocks
    /// on another descriptor, or exits (0: none).
    pub fd_waited: i32,
    pub fd_waited_ns: u64,
}

impl ThreadStats {
    /// Adds the io_uring reads completed for this thread (`URING_READS`).
    #[inline(always)]
    pub fn add_uring_reads(&mut self, u: &UringReads) {
        self.file_read_bytes += u.file_bytes;
        self.file_read_calls += u.file_calls;
        self.other_read_bytes += u.other_bytes;
        self.other_read_calls += u.other_calls;
    }

    /// Adds the read and write counts a CPU slot (`CPU_SLOT`) holds for
    /// this thread: the kernel side when it flushes the slot (then
    /// [`CpuSlot::clear_thread_counts`]), the agent when it reads one.
    #[inline(always)]
    pub fn add_slot_counts(&mut self, r: &CpuSlot) {
        self.file_read_bytes += r.file_read_bytes;
        self.file_read_calls += r.file_read_calls;
        self.other_read_bytes += r.other_read_bytes;
        self.other_read_calls += r.other_read_calls;
        self.file_write_bytes += r.file_write_bytes;
        self.file_write_calls += r.file_write_calls;
        self.other_write_bytes += r.other_write_bytes;
        self.other_write_calls += r.other_write_calls;
        self.stdio_write_bytes += r.stdio_write_bytes;
    }
}

/// `ThreadStats::kclock`: the kernel's totals that an entry carries (set by
/// whoever created it, from a base it read at that moment).
pub mod kclock {
    /// `exec_base`/`exec_ns` are valid: on-CPU time comes from them.
    pub const EXEC: u8 = 1;
    /// `delay_base`/`delay_ns` are valid: a span whose switch-in was never
    /// delivered is split into runqueue and blocked time with them.
    pub const DELAY: u8 = 2;
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct WakeKey {
    pub wakee: u32,
    /// The waking thread, or (in `WAKES_BY_PROC`, with [`WAKER_ANY_THREAD`])
    /// its process.
    pub waker: u32,
}

/// Set in [`WakeKey::waker`] over a process id: some thread of that process
/// (PIDs stay below 2^22). `WAKES` holds a pair per waking thread; a
/// many-threaded job can wake itself in more pairs than it has room for,
/// and the rest are counted per waking process instead of lost.
pub const WAKER_ANY_THREAD: u32 = 1 << 31;

/// [`ThreadStats::waited_by`] of a thread whose wait a signal ended, or its
/// own process's exit: no waker's (PIDs stay below 2^22), and no pair in
/// `WAKES` takes its blocked time.
pub const WAKER_SIGNAL: u32 = 1 << 29;

/// Set in [`ThreadStats::waited_by`] while the wait that waker ended has
/// not been switched in from yet (the bit below [`WAKER_ANY_THREAD`]: PIDs
/// stay below 2^22).
pub const WAIT_NOTED: u32 = 1 << 30;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct WakeStats {
    pub count: u64,
    /// How long the wakee was blocked in the waits this waker ended, from
    /// its switch-out to the wakeup (its wait for a CPU after is apart).
    pub blocked_ns: u64,
    pub waker_tgid: u32,
    pub _pad: u32,
    pub waker_comm: [u8; COMM_LEN],
}

/// `WAKE_CACHE`'s slots per CPU (a power of two): a wakee's is its tid
/// modulo this.
pub const WAKE_CACHE_SLOTS: u32 = 8;

/// A CPU's last wakeup pair in one slot (`WAKE_CACHE`) and its wakeups not yet
/// added to its `WAKES` entry: a wakee woken again and again by one waker
/// (a futex or pipe ping-pong, a queue's feeder) costs the count here, not
/// a hash lookup and an atomic add each time. The agent adds `pending` to
/// the pair's count in its snapshots.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WakeCache {
    /// The pair; a `wakee` of 0: none.
    pub key: WakeKey,
    pub pending: u64,
}

/// Byte offsets of the `struct task_struct` fields the scheduler and task
/// programs read, taken from the running kernel's BTF (/sys/kernel/btf/vmlinux)
/// at start-up: the layout moves between kernels and builds.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskOffsets {
    pub pid: u32,
    pub tgid: u32,
    /// `__state` (5.14 and later, `unsigned int`) or `state` (before, `long`:
    /// its low 32 bits are read).
    pub state: u32,
    pub exit_state: u32,
    /// `se.sum_exec_runtime`: the kernel's own on-CPU total, ns.
    pub sum_exec: u32,
    /// `sched_info.run_delay`: the kernel's own runqueue-wait total, ns;
    /// meaningful only with [`task_flags::RUN_DELAY`].
    pub run_delay: u32,
    /// `stack`: the task's kernel stack, where its user registers are found
    /// without `bpf_task_pt_regs` (before 5.15: [`task_flags::REGS_FROM_STACK`];
    /// and by the cast switch).
    pub stack: u32,
    /// Where the saved user registers sit from `stack`:
    /// `THREAD_SIZE - sizeof(struct pt_regs)`.
    pub regs_in_stack: u32,
    /// [`task_flags`].
    pub flags: u32,
    /// `sched_info.last_queued`: the runqueue clock when the task was last
    /// enqueued (0 once it runs); meaningful only with
    /// [`task_flags::QUEUED_AT`], as are the four below.
    pub last_queued: u32,
    /// `se.cfs_rq`: the task's CFS runqueue, whose `rq` is its CPU's.
    pub se_cfs_rq: u32,
    /// `cfs_rq.rq`, `rq.clock` and `rq.curr`.
    pub cfs_rq_rq: u32,
    pub rq_clock: u32,
    pub rq_curr: u32,
}

/// `TaskOffsets::flags`.
pub mod task_flags {
    /// The kernel keeps `sched_info.run_delay` (CONFIG_SCHED_INFO).
    pub const RUN_DELAY: u32 = 1;
    /// No `bpf_task_pt_regs` (before 5.15): the saved user registers are
    /// found from `task->stack` (the `sched_switch_stack` program).
    pub const REGS_FROM_STACK: u32 = 2;
    /// The kernel keeps `sched_info.last_queued` and the current task leads
    /// to its CPU's runqueue clock (`se.cfs_rq->rq->clock`): a switch-in
    /// can tell how long the task waited for a CPU as the kernel's own
    /// `run_delay` will (the `sched_switch_queued` program), so a wakeup
    /// need not read the clock.
    pub const QUEUED_AT: u32 = 4;
    /// EEVDF delays a blocked task's dequeue (`sched_entity.sched_delayed`,
    /// 6.12 on): migrating such a task enqueues it, long before its wakeup,
    /// and its `last_queued` then counts the rest of its sleep as waiting
    /// for a CPU. With [`QUEUED_AT`], the wakeup reads the wakee's
    /// `last_queued` (`sched_waking_checked`, through `bpf_rdonly_cast`):
    /// set already, the enqueue is not this wakeup's, and the wakeup is
    /// timed by the clock instead.
    pub const DELAYED_DEQUEUE: u32 = 8;
}

/// Where the syscall number, arguments and code segment sit in the
/// architecture's `struct pt_regs` (byte offsets); the raw syscall
/// tracepoints hand the programs a pointer to it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Regs {
    /// The syscall number (`orig_ax` on x86-64).
    pub nr: u16,
    pub arg0: u16,
    pub arg1: u16,
    pub arg2: u16,
    /// Code segment: a task whose syscalls come with `user_cs` there is a
    /// native 64-bit one; others (ia32 compat) number syscalls differently
    /// and are not counted.
    pub cs: u16,
    pub user_cs: u16,
    pub _pad: [u16; 2],
}

/// `CpuSlot::tracked`.
pub mod slot_state {
    /// Not looked up yet (cgroup mode: the task may still be adopted).
    pub const UNCHECKED: u8 = 0;
    pub const TRACKED: u8 = 1;
    pub const UNTRACKED: u8 = 2;
}

/// The per-CPU slot (`CPU_SLOT`): the task this CPU runs, and — if it is
/// tracked — its in-flight syscall and the read and write counts not yet added to
/// `THREADS`/`FILES`. Syscall programs touch only this (an inlined array
/// access) instead of two or three hash lookups per call; `sched_switch`
/// moves the state between the slot and `THREADS` at every switch. The
/// agent adds the pending counts of every CPU's slot to its snapshots.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuSlot {
    pub tid: u32,
    pub tgid: u32,
    pub job: u32,
    /// `TRACK_GEN` when filled: the agent bumps it after changing what is
    /// tracked, which makes every slot look its task up again.
    pub gen: u32,
    pub tracked: u8,
    /// Non-zero: the task makes native syscalls (checked once per span).
    pub native: u8,
    pub _pad: [u8; 2],
    /// The descriptor whose identity is cached below (-1: none).
    pub file_fd: i32,
    /// `FileStats::kind` of `file_fd`, or `fd_kind::OTHER` when it is not
    /// in `FILES` (pipes, sockets: counted as other reads).
    pub file_kind: u32,
    pub inflight: u32,
    pub inflight_fd: i32,
    /// openat's flags; for a timed read, the reads it stands for (the
    /// sampling mask + 1, `Config::read_sample_mask`).
    pub inflight_kind: u32,
    /// xorshift32 state: which reads are timed.
    pub rng: u32,
    pub _pad1: u32,
    /// Start of the read in flight if it is timed, else 0.
    pub inflight_ts: u64,
    /// Address of the task's saved user registers, as the raw syscall
    /// tracepoints pass it (from its entry at its switch-in, else 0 until
    /// its first syscall on this CPU since): unique to the task while it
    /// runs, so a match proves the slot is the current task's without
    /// asking for its tid.
    pub regs: u64,
    // Everything a read of a cached descriptor touches is above
    // `file_write_bytes`: about two cache lines per read, not four.
    /// Pending: program runs for this thread (`counter::EVENTS`).
    pub events: u64,
    /// Pending: added to `FILES[(tgid, file_fd)]` if it is still `file_id`;
    /// `file_ns` is the timed reads' time, each multiplied by the reads it
    /// stands for, and `file_timed` the sum of those.
    pub file_bytes: u64,
    pub file_calls: u64,
    pub file_ns: u64,
    pub file_timed: u64,
    /// Pending: added to the thread's `ThreadStats` counters of the same names.
    pub file_read_bytes: u64,
    pub file_read_calls: u64,
    pub other_read_bytes: u64,
    pub other_read_calls: u64,
    pub file_write_bytes: u64,
    pub file_write_calls: u64,
    pub other_write_bytes: u64,
    pub other_write_calls: u64,
    pub stdio_write_bytes: u64,
    /// openat's filename pointer.
    pub inflight_ptr: u64,
    pub file_id: u64,
    /// The descriptor last written (-1: none), cached apart from the one
    /// read: a copy loop (`dd`, a checkpoint writer reading its source)
    /// alternates the two and would otherwise look one up at every call.
    pub write_fd: i32,
    /// `FileStats::kind` of `write_fd`, as `file_kind` for `file_fd`.
    pub write_kind: u32,
    pub write_file_id: u64,
    /// Pending: added to `FILES[(tgid, write_fd)]` if it is still
    /// `write_file_id`.
    pub write_bytes: u64,
    pub write_calls: u64,
    /// This CPU's runqueue clock and the clock (`bpf_ktime_get_ns`) read at
    /// one switch: later switches count on from them by the runqueue's
    /// clock alone for a while. Not the task's: kept across switches.
    pub clock_rq: u64,
    pub clock_mono: u64,
}

/// Stores `v` in `*field` as a store of its own. LLVM merges plain stores
/// of one byte value to neighbouring fields into a `memset`, which the BPF
/// target turns into a call of compiler-builtins' byte-at-a-time loop
/// (bpf-linker inlines `memcpy`, not `memset`): resetting a slot's counts
/// that way cost over a thousand instructions per context switch. A
/// volatile store is never merged.
#[inline(always)]
pub fn store_apart<T: Copy>(field: &mut T, v: T) {
    // SAFETY: `field` is a valid, aligned reference that nothing else holds.
    unsafe { core::ptr::write_volatile(field, v) }
}

/// Plain data: integers and arrays of them, valid as all-zero bytes, its
/// size a multiple of 8 and its alignment 8.
///
/// # Safety
///
/// Implement it only for such types: [`zeroed`] writes one as `u64`s.
pub unsafe trait Plain: Copy {}

// SAFETY: integers only (checked by `layouts_have_no_hidden_padding`),
// 8-aligned by their `u64` fields, sizes multiples of 8.
unsafe impl Plain for ThreadStats {}

/// Makes `at` a `T` of zero bytes, written a `u64` at a time with volatile
/// stores (see [`store_apart`]): `T::default()` of a struct this large is a
/// `memset`, a call of a byte-at-a-time loop on the BPF target. In place,
/// as a BPF program's stack has no room for a copy.
#[inline(always)]
pub fn zeroed_in<T: Plain>(at: &mut core::mem::MaybeUninit<T>) -> &mut T {
    let words = at.as_mut_ptr().cast::<u64>();
    let mut i = 0;
    while i < core::mem::size_of::<T>() / 8 {
        // SAFETY: `i` words lie within `T` (its size is a multiple of 8) and
        // `words` is 8-aligned (`Plain`).
        unsafe { core::ptr::write_volatile(words.add(i), 0) };
        i += 1;
    }
    // SAFETY: every byte was written, and all-zero is a valid `T` (`Plain`).
    unsafe { at.assume_init_mut() }
}

impl CpuSlot {
    /// Fills the slot for tracked thread `tid` of `tgid` coming on-CPU,
    /// with `t` its `THREADS` entry: every field as
    /// `CpuSlot { rng, tid, tgid, job, gen, tracked, file_fd: -1,
    /// write_fd: -1, in-flight call and registers from t, native: whether
    /// t knows its registers, ..Default::default() }` would set it, `rng`
    /// and the CPU's clocks (`clock_rq`, `clock_mono`) kept, one store per
    /// field (see [`store_apart`]).
    #[inline(always)]
    pub fn load_thread(&mut self, tid: u32, tgid: u32, gen: u32, t: &ThreadStats) {
        self.tid = tid;
        self.tgid = if t.tgid != 0 { t.tgid } else { tgid };
        self.job = t.job;
        self.gen = gen;
        store_apart(&mut self.tracked, slot_state::TRACKED);
        store_apart(&mut self.native, u8::from(t.regs != 0));
        store_apart(&mut self._pad, [0; 2]);
        store_apart(&mut self._pad1, 0);
        self.inflight = t.inflight;
        self.inflight_fd = t.inflight_fd;
        self.inflight_kind = t.inflight_kind;
        self.inflight_ts = t.inflight_ts;
        self.inflight_ptr = t.inflight_ptr;
        store_apart(&mut self.regs, t.regs);
        store_apart(&mut self.events, 0);
        self.clear_thread_counts();
        store_apart(&mut self.file_fd, -1);
        store_apart(&mut self.file_kind, 0);
        store_apart(&mut self.file_id, 0);
        self.clear_file_counts();
        store_apart(&mut self.write_fd, -1);
        store_apart(&mut self.write_kind, 0);
        store_apart(&mut self.write_file_id, 0);
        self.clear_write_counts();
    }

    /// Zeroes the per-thread counts (after they were added to `THREADS`).
    #[inline(always)]
    pub fn clear_thread_counts(&mut self) {
        store_apart(&mut self.file_read_bytes, 0);
        store_apart(&mut self.file_read_calls, 0);
        store_apart(&mut self.other_read_bytes, 0);
        store_apart(&mut self.other_read_calls, 0);
        store_apart(&mut self.file_write_bytes, 0);
        store_apart(&mut self.file_write_calls, 0);
        store_apart(&mut self.other_write_bytes, 0);
        store_apart(&mut self.other_write_calls, 0);
        store_apart(&mut self.stdio_write_bytes, 0);
    }

    /// Zeroes the cached read descriptor's counts (after they were added to
    /// `FILES`).
    #[inline(always)]
    pub fn clear_file_counts(&mut self) {
        store_apart(&mut self.file_bytes, 0);
        store_apart(&mut self.file_calls, 0);
        store_apart(&mut self.file_ns, 0);
        store_apart(&mut self.file_timed, 0);
    }

    /// Zeroes the cached written descriptor's counts.
    #[inline(always)]
    pub fn clear_write_counts(&mut self) {
        store_apart(&mut self.write_bytes, 0);
        store_apart(&mut self.write_calls, 0);
    }
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: all these are repr(C), Copy, and have no implicit padding.
    unsafe impl aya::Pod for ThreadStats {}
    unsafe impl aya::Pod for WakeKey {}
    unsafe impl aya::Pod for WakeStats {}
    unsafe impl aya::Pod for WakeCache {}
    unsafe impl aya::Pod for CpuSlot {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::syscall_class as class;
    use core::mem::size_of;

    /// The blocked-reason rule, as both sides apply it.
    #[test]
    fn a_blocked_reason_by_class_and_sleep() {
        let none = || None;
        assert_eq!(reason::reason_for(class::FUTEX, sleep::SLEEPING, none), reason::FUTEX);
        assert_eq!(reason::reason_for(class::READ, sleep::SLEEPING, || Some(false)), reason::POLL);
        assert_eq!(reason::reason_for(class::READ, sleep::UNINTERRUPTIBLE, || Some(true)), reason::IO);
        assert_eq!(reason::reason_for(class::POLL, sleep::SLEEPING, none), reason::POLL);
        assert_eq!(reason::reason_for(class::SLEEP, sleep::SLEEPING, none), reason::SLEEP);
        assert_eq!(reason::reason_for(class::OTHER, sleep::UNINTERRUPTIBLE, none), reason::IO);
        assert_eq!(reason::reason_for(class::OTHER, sleep::SLEEPING, none), reason::OTHER);
        assert_eq!(reason::reason_for(class::WRITE, sleep::UNINTERRUPTIBLE, || Some(true)), reason::WRITE);
        assert_eq!(reason::reason_for(class::WRITE, sleep::SLEEPING, || Some(false)), reason::SEND);
        // Descriptor unknown: a file blocks uninterruptibly, a pipe does not.
        assert_eq!(reason::reason_for(class::WRITE, sleep::UNINTERRUPTIBLE, none), reason::WRITE);
        assert_eq!(reason::reason_for(class::WRITE, sleep::SLEEPING, none), reason::SEND);
        assert_eq!(reason::reason_for(class::SYNC, sleep::SLEEPING, none), reason::SYNC);
        assert_eq!(sleep::from_proc('D'), sleep::UNINTERRUPTIBLE);
        assert_eq!(sleep::from_proc('S'), sleep::SLEEPING);
        assert_eq!(sleep::from_proc('I'), sleep::SLEEPING);
    }

    /// Each variant's kernel value gives it back, and names are distinct.
    #[test]
    fn the_switch_variants_round_trip() {
        for v in SwitchReads::ALL {
            assert_eq!(SwitchReads::from_how(v.how()), v);
            assert_eq!(SwitchReads::ALL.iter().filter(|w| w.name() == v.name()).count(), 1);
            assert_eq!(SwitchReads::ALL.iter().filter(|w| w.program() == v.program()).count(), 1);
        }
    }

    #[test]
    fn slot_thread_counts_add_and_clear() {
        let mut s = CpuSlot {
            file_read_bytes: 5,
            other_read_calls: 1,
            file_write_bytes: 100,
            file_write_calls: 2,
            other_write_bytes: 30,
            other_write_calls: 1,
            stdio_write_bytes: 30,
            ..Default::default()
        };
        let mut t = ThreadStats { file_write_bytes: 1, ..Default::default() };
        t.add_slot_counts(&s);
        assert_eq!((t.file_read_bytes, t.other_read_calls), (5, 1));
        assert_eq!(
            (
                t.file_write_bytes,
                t.file_write_calls,
                t.other_write_bytes,
                t.other_write_calls,
                t.stdio_write_bytes
            ),
            (101, 2, 30, 1, 30)
        );
        s.clear_thread_counts();
        let mut z = ThreadStats::default();
        z.add_slot_counts(&s);
        assert_eq!(
            (z.file_read_bytes, z.file_write_bytes, z.stdio_write_bytes, z.other_write_calls),
            (0, 0, 0, 0)
        );
    }

    // Sizes are fixed so a change on one side cannot silently desync the other,
    // and every struct is a multiple of 8 (ring-buffer reservations need it:
    // `ThreadStats` travels in `ExitEvent`).
    #[test]
    fn layouts_have_no_hidden_padding() {
        assert_eq!(
            size_of::<ThreadStats>(),
            4 * 2 + 8 + 8 * 10 + 8 * 12 + 4 + 4 + 4 + 4 + 8 + 4 + 4 + 8 + 8 * 7 + 4 + 4 + 8 + 4 + 4 + 8
        );
        assert_eq!(size_of::<ThreadStats>() % 8, 0);
        assert_eq!(size_of::<WakeKey>(), 8);
        assert_eq!(size_of::<WakeStats>(), 40);
        assert_eq!(size_of::<WakeCache>(), 16);
        assert_eq!(size_of::<TaskOffsets>(), 56);
        assert_eq!(size_of::<Regs>(), 16);
        assert_eq!(size_of::<CpuSlot>(), 240);
        assert_eq!(core::mem::offset_of!(CpuSlot, file_write_bytes), 136, "a read's fields first");
    }

    /// A slot whose every byte is `b`.
    fn slot_of(b: u8) -> CpuSlot {
        // SAFETY: `CpuSlot` is integers only, so any bytes are a valid one.
        unsafe { core::mem::transmute([b; size_of::<CpuSlot>()]) }
    }

    fn bytes(s: &CpuSlot) -> [u8; size_of::<CpuSlot>()] {
        // SAFETY: as in `slot_of`, and it has no padding.
        unsafe { core::mem::transmute(*s) }
    }

    // Field by field, the slot must come out as the struct literal would
    // (a field added later and not reset would carry the last thread's
    // value into the next one's).
    #[test]
    fn loading_a_thread_sets_every_field_as_a_fresh_slot_would() {
        let t = ThreadStats {
            tgid: 10,
            job: 3,
            inflight: 7,
            inflight_fd: 4,
            inflight_kind: 2,
            inflight_ts: 99,
            inflight_ptr: 1234,
            regs: 0xffff_c900_0001_3f58,
            ..Default::default()
        };
        for b in [0x00, 0xa5, 0xff] {
            let mut s = slot_of(b);
            s.load_thread(11, 12, 5, &t);
            let want = CpuSlot {
                rng: u32::from_ne_bytes([b; 4]),
                clock_rq: u64::from_ne_bytes([b; 8]),
                clock_mono: u64::from_ne_bytes([b; 8]),
                tid: 11,
                tgid: 10,
                job: 3,
                gen: 5,
                tracked: slot_state::TRACKED,
                file_fd: -1,
                write_fd: -1,
                inflight: 7,
                inflight_fd: 4,
                inflight_kind: 2,
                inflight_ts: 99,
                inflight_ptr: 1234,
                regs: 0xffff_c900_0001_3f58,
                native: 1,
                ..Default::default()
            };
            assert_eq!(bytes(&s), bytes(&want), "from a slot of {b:#x} bytes");
        }
        // An entry without its process id yet takes the caller's; one
        // without its registers leaves them to its first syscall.
        let mut s = slot_of(0xa5);
        s.load_thread(11, 12, 5, &ThreadStats::default());
        assert_eq!((s.tgid, s.regs, s.native), (12, 0, 0));
    }

    #[test]
    fn zeroed_is_the_default() {
        fn zeroed<T: Plain>() -> T {
            let mut v = core::mem::MaybeUninit::uninit();
            *zeroed_in(&mut v)
        }
        fn bytes<T: Plain>(v: T) -> [u8; 512] {
            let mut b = [0xa5; 512];
            // SAFETY: `T` is plain bytes, smaller than the buffer.
            unsafe {
                core::ptr::copy_nonoverlapping((&raw const v).cast::<u8>(), b.as_mut_ptr(), size_of::<T>())
            };
            b
        }
        assert_eq!(bytes(zeroed::<ThreadStats>()), bytes(ThreadStats::default()));
        assert_eq!(bytes(zeroed::<crate::FileStats>()), bytes(crate::FileStats::default()));
        assert_eq!(bytes(zeroed::<crate::InodeBytes>()), bytes(crate::InodeBytes::default()));
    }

    #[test]
    fn clearing_the_counts_zeroes_them_and_nothing_else() {
        let mut s = slot_of(0xa5);
        s.clear_thread_counts();
        s.clear_file_counts();
        s.clear_write_counts();
        let mut want = slot_of(0xa5);
        (want.file_read_bytes, want.file_read_calls) = (0, 0);
        (want.other_read_bytes, want.other_read_calls) = (0, 0);
        (want.file_write_bytes, want.file_write_calls) = (0, 0);
        (want.other_write_bytes, want.other_write_calls, want.stdio_write_bytes) = (0, 0, 0);
        (want.file_bytes, want.file_calls, want.file_ns, want.file_timed) = (0, 0, 0, 0);
        (want.write_bytes, want.write_calls) = (0, 0);
        assert_eq!(bytes(&s), bytes(&want));
    }
}
