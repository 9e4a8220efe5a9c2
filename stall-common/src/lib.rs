//! Types shared by stall's kernel side (`stall-ebpf`) and its agent.
//!
//! Everything here is `#[repr(C)]`, `Copy`, and free of implicit padding, so
//! the same bytes mean the same thing on both sides of a BPF map or the ring
//! buffer, and the verifier never sees uninitialised stack bytes.
#![no_std]

pub const COMM_LEN: usize = 16;
pub const PATH_LEN: usize = 256;

/// Why a thread is off-CPU; the index into [`ThreadStats::off_ns`].
pub mod reason {
    /// Blocked in `futex` (locks, condition variables, `queue.Queue.get`).
    pub const FUTEX: u8 = 0;
    /// Blocked reading a regular file, or in uninterruptible sleep outside a
    /// syscall (page faults on mapped files).
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
    pub const COUNT: usize = 6;
    pub const NAMES: [&str; COUNT] = ["futex", "io", "poll", "sleep", "runqueue", "other"];
}

/// How a syscall number maps to a wait reason; the values of the
/// `SYSCALL_CLASS` array map, filled by the agent for its architecture.
pub mod syscall_class {
    pub const OTHER: u8 = 0;
    pub const FUTEX: u8 = 1;
    /// read-family: refined to IO or POLL by the descriptor's kind.
    pub const READ: u8 = 2;
    pub const POLL: u8 = 3;
    pub const SLEEP: u8 = 4;
    pub const TABLE_LEN: u32 = 1024;
}

/// What a tracked descriptor is; set by the agent after it has looked at it.
pub mod fd_kind {
    /// Opened with openat, not yet classified: counted as a file.
    pub const UNKNOWN: u32 = 0;
    pub const REGULAR: u32 = 1;
    /// FIFO, socket, device, eventfd...: never file throughput.
    pub const OTHER: u32 = 2;
}

/// Scheduling state of a tracked thread as the kernel side last saw it.
pub mod run_state {
    /// Tracked, but no switch seen yet and nothing seeded.
    pub const UNKNOWN: u8 = 0;
    pub const RUNNING: u8 = 1;
    pub const OFF: u8 = 2;
}

/// In-flight syscall kinds recorded at sys_enter for use at sys_exit.
///
/// The kind is the low byte; the bits above hold the hooks epoch of
/// `TRACK_GEN` it was recorded in ([`track_gen`]). The syscall hooks can be
/// detached and attached again (the daemon's tiers): an entry recorded
/// before a detach never sees its exit, and must not pair with the exit of
/// some later, unhooked syscall.
pub mod inflight {
    pub const NONE: u32 = 0;
    pub const READ: u32 = 1;
    pub const OPEN: u32 = 2;
    /// write-family: counted at exit on the descriptor's `FILES` entry.
    pub const WRITE: u32 = 3;
    /// dup-family: the returned descriptor names the same open as
    /// `inflight_fd`.
    pub const DUP: u32 = 4;
    const KIND_MASK: u32 = 0xff;

    /// `kind` as recorded under `gen` (a `TRACK_GEN` value).
    #[inline(always)]
    pub fn tag(kind: u32, gen: u32) -> u32 {
        kind | (super::track_gen::epoch(gen) << 8)
    }

    /// The kind of a `tag`ged entry if it was recorded in the epoch of
    /// `gen`, else `NONE`.
    #[inline(always)]
    pub fn kind(tagged: u32, gen: u32) -> u32 {
        if tagged >> 8 == super::track_gen::epoch(gen) {
            tagged & KIND_MASK
        } else {
            NONE
        }
    }
}

/// The `TRACK_GEN` value: the low 24 bits change whenever the agent changes
/// what is tracked (every CPU slot is looked up again), the top 8 bits
/// whenever it attaches the syscall hooks (entries in flight from before
/// are stale; see [`inflight`]).
pub mod track_gen {
    const EPOCH_SHIFT: u32 = 24;
    const TRACK_MASK: u32 = (1 << EPOCH_SHIFT) - 1;

    #[inline(always)]
    pub fn epoch(gen: u32) -> u32 {
        gen >> EPOCH_SHIFT
    }

    /// After a change of what is tracked.
    pub fn next_tracking(gen: u32) -> u32 {
        (gen & !TRACK_MASK) | (gen.wrapping_add(1) & TRACK_MASK)
    }

    /// After the syscall hooks were attached again.
    pub fn next_epoch(gen: u32) -> u32 {
        (epoch(gen).wrapping_add(1) << EPOCH_SHIFT) | (gen.wrapping_add(1) & TRACK_MASK)
    }
}

/// Indices into the per-CPU `COUNTERS` array: losses by cause, and totals.
pub mod counter {
    pub const LOST_RINGBUF: u32 = 0;
    pub const LOST_THREAD_MAP: u32 = 1;
    pub const LOST_FD_MAP: u32 = 2;
    pub const LOST_WAKE_MAP: u32 = 3;
    pub const LOST_PATH: u32 = 4;
    /// A page-cache fill or a mapping fault of a tracked process found
    /// `INODE_BYTES` full.
    pub const LOST_INODE_MAP: u32 = 5;
    /// An io_uring read of a tracked thread found `URING_PENDING` or
    /// `URING_READS` full.
    pub const LOST_URING_MAP: u32 = 6;
    /// How many loss causes there are: `LOST_*` run from 0 to this.
    pub const LOST_CAUSES: usize = 7;
    /// Events handled for tracked threads (all hooks): the agent's event rate.
    pub const EVENTS: u32 = 8;
    /// A switch that did not match the state seen before (switched in while
    /// marked running, or out while marked off without the kernel's counters
    /// to repair it, see `SCHED_REPAIRED`): a switch was missed and part of
    /// that span's attribution is unknown. Should stay 0.
    pub const SCHED_GAPS: u32 = 9;
    /// A switch-in the tracepoint never delivered, found at the next
    /// switch-out and repaired from the kernel's own counters (the span's
    /// on-CPU, runqueue and blocked parts are exact): nothing is lost.
    /// Some kernels do not trace every switch (docs/KERNELS.md).
    pub const SCHED_REPAIRED: u32 = 10;
    pub const COUNT: u32 = 16;
    pub const LOST_NAMES: [&str; LOST_CAUSES] = [
        "ringbuf_full",
        "thread_map_full",
        "fd_map_full",
        "wake_map_full",
        "path_unreadable",
        "inode_map_full",
        "uring_map_full",
    ];
}

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
    /// Time in the timed reads only (see `FileStats::read_ns`).
    pub file_read_ns: u64,
    pub other_read_bytes: u64,
    pub other_read_calls: u64,
    pub other_read_ns: u64,
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
    /// When a wakeup was seen during the current off-CPU span, else 0.
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

/// Key of the `INODE_BYTES` map: one file (the kernel's device and inode
/// number, as the page cache knows it) read by one process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct InodeKey {
    pub tgid: u32,
    /// The kernel's `dev_t`: major << 20 | minor.
    pub dev: u32,
    pub ino: u64,
}

/// Value of the `INODE_BYTES` map: what one process took of one file
/// outside its read calls, cumulative.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InodeBytes {
    /// Bytes it caused to be read from storage (page-cache fills by its
    /// reads, its faults and their read-ahead).
    pub storage: u64,
    /// Bytes its faults mapped into it from the file (fault-around windows
    /// and single-page faults, from the page cache or storage).
    pub mapped: u64,
    /// The page range `[window_start, window_stop)` counted last for this
    /// file: a fault that retries pages of it (not yet read when first
    /// tried) does not count them again. Zeroed: none.
    pub window_start: u64,
    pub window_stop: u64,
    /// 1 + the page a single-page fault counted alone where the kernel maps
    /// whole folios: the page was not in the cache yet, so its folio's other
    /// pages are counted at the file's next fault; 0: none.
    pub pending: u64,
}

/// Where the page-cache fill program finds a filled folio's file and size
/// (byte offsets from BTF). `mapping == 0`: not found, the program is not
/// attached.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageCacheOffsets {
    /// `page.flags` (a folio starts with its head page).
    pub flags: u32,
    /// `page.mapping`: the `address_space`.
    pub mapping: u32,
    /// `address_space.host`: the inode.
    pub host: u32,
    pub ino: u32,
    /// `inode.i_sb`, and `super_block.s_dev` in it.
    pub sb: u32,
    pub dev: u32,
    /// `PG_head`: the folio is large, its order is in `order_byte`.
    pub head_bit: u32,
    /// The byte holding a large folio's order (`_folio_order`, or the low
    /// byte of `_flags_1`); 0: folios are single pages here (5.10).
    pub order_byte: u32,
    /// `inode.i_size`: pages a fault window tried past the end are not
    /// counted.
    pub size: u32,
    /// Where the fault trampolines find the file of a `struct vm_fault *`
    /// (kernels without the `mm_filemap_*` fault tracepoints):
    /// `vm_fault.vma`, `vm_fault.pgoff`, `vm_area_struct.vm_file`,
    /// `file.f_mapping`; `file_mapping` 0: not found, the trampolines are
    /// not loaded.
    pub fault_vma: u32,
    pub fault_pgoff: u32,
    pub vma_file: u32,
    pub file_mapping: u32,
    /// Where the page cache's folio holding an index is found:
    /// `address_space.i_pages.xa_head`, `xa_node.shift`, `xa_node.slots`.
    pub xa_head: u32,
    pub node_shift: u32,
    pub node_slots: u32,
    /// Non-zero: a fault maps each large folio it reaches whole (6.18 on),
    /// not only the part inside its window.
    pub whole_folios: u32,
    pub _pad: u32,
}

/// Where the io_uring tracepoints keep what the read programs need; the
/// layouts moved between kernels (5.10 passes the fields as arguments, 6.x
/// a `struct io_kiocb *` and, from 6.3, the completion's `struct
/// io_uring_cqe *`). Set by the agent from BTF; `on` 0: not attached.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UringLayout {
    pub on: u8,
    /// Non-zero: the submission's argument 0 is the request (`struct
    /// io_kiocb *`), whose fields are at the `req_*` offsets; else the ring,
    /// opcode and user data are the arguments `submit_*`.
    pub submit_req: u8,
    pub submit_ctx: u8,
    pub submit_opcode: u8,
    pub submit_user_data: u8,
    /// Non-zero: the completion's argument `complete_user_data` is the
    /// posted `struct io_uring_cqe *` (user data at 0, result at 8).
    pub complete_cqe: u8,
    pub complete_ctx: u8,
    pub complete_user_data: u8,
    pub complete_res: u8,
    /// `io_uring_file_get(ctx, fd)` arguments, where the submission does not
    /// carry the descriptor (5.10: the fd is traced just before it).
    pub file_ctx: u8,
    pub file_fd: u8,
    pub _pad: u8,
    /// `io_kiocb.ctx`, `.opcode` (1 byte), `.cqe.user_data`, `.cqe.fd`,
    /// `.flags` (bit 0: a registered file, whose number is no descriptor).
    pub req_ctx: u16,
    pub req_opcode: u16,
    pub req_user_data: u16,
    pub req_fd: u16,
    pub req_flags: u16,
    pub _pad2: u16,
}

/// `io_uring` opcodes that read into memory from a descriptor.
pub mod uring_op {
    pub const READV: u8 = 1;
    pub const READ_FIXED: u8 = 4;
    pub const READ: u8 = 22;

    #[inline(always)]
    pub fn is_read(op: u8) -> bool {
        op == READV || op == READ_FIXED || op == READ
    }
}

/// Key of `URING_PENDING`: a request in flight on one ring.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UringKey {
    pub ctx: u64,
    pub user_data: u64,
}

/// Value of `URING_PENDING`: who submitted the read, and from which
/// descriptor (-1: a registered file, or none seen).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UringRead {
    pub tgid: u32,
    pub tid: u32,
    pub fd: i32,
    pub _pad: u32,
}

/// Value of `URING_READS` (by tid): io_uring reads completed for a thread,
/// counted where they complete (often not in the thread), hence apart from
/// `THREADS`; the agent adds them to the thread's reads.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UringReads {
    pub file_bytes: u64,
    pub file_calls: u64,
    pub other_bytes: u64,
    pub other_calls: u64,
}

/// Key of the `FILES` map: one open descriptor of one process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FdKey {
    pub tgid: u32,
    pub fd: i32,
}

/// Value of the `FILES` map. `file_id` names one open(); a reused fd number
/// gets a new id, so bytes never land on the file that had the number before.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FileStats {
    pub file_id: u64,
    pub read_bytes: u64,
    pub read_calls: u64,
    /// Time in the timed reads: one read in `Config::latency_mask + 1`,
    /// picked at random, is timed (the clock costs more than the rest of
    /// a read's accounting); `timed_calls` counts them.
    pub read_ns: u64,
    pub timed_calls: u64,
    /// Successful write-family calls on this descriptor, and their bytes.
    pub write_bytes: u64,
    pub write_calls: u64,
    pub kind: u32,
    pub _pad: u32,
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

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct WakeStats {
    pub count: u64,
    pub waker_tgid: u32,
    pub _pad: u32,
    pub waker_comm: [u8; COMM_LEN],
}

/// Ring-buffer event kinds ([`EventHeader::kind`]).
pub mod event_kind {
    pub const OPEN: u32 = 1;
    pub const NEWTASK: u32 = 2;
    pub const EXEC: u32 = 3;
    pub const EXIT: u32 = 4;
    pub const CLOSE: u32 = 5;
    /// A context switch of a tracked thread: only with `Config::timeline`.
    pub const SWITCH: u32 = 6;
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct EventHeader {
    pub kind: u32,
    pub tid: u32,
    pub tgid: u32,
    pub job: u32,
    pub ts: u64,
}

/// A successful openat of a tracked thread.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct OpenEvent {
    pub hdr: EventHeader,
    pub file_id: u64,
    pub fd: i32,
    pub dfd: i32,
    pub flags: u32,
    /// Length of `path` including the NUL, or a negative errno.
    pub path_len: i32,
    /// A dup of this descriptor (no path: the same open as that one); -1
    /// for an open.
    pub dup_of: i32,
    pub _pad: u32,
    pub path: [u8; PATH_LEN],
}

/// A tracked thread created a task (thread or process).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NewTaskEvent {
    pub hdr: EventHeader,
    pub child_tid: u32,
    pub child_tgid: u32,
    pub clone_flags: u64,
    pub comm: [u8; COMM_LEN],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ExecEvent {
    pub hdr: EventHeader,
    pub comm: [u8; COMM_LEN],
}

/// A tracked thread switched in (`on` 1) or out (`on` 0): the timeline's
/// raw material, sent only when it is asked for (`Config::timeline`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SwitchEvent {
    pub hdr: EventHeader,
    /// In: when the thread was woken during its off-CPU span (0: preempted,
    /// or not seen).
    pub wake_ts: u64,
    /// The kernel's on-CPU total of the thread (`sum_exec_runtime`) as of
    /// this switch; 0: not read.
    pub exec_ns: u64,
    /// Out: the syscall it is in (-1: none).
    pub nr: i32,
    /// Out: why it left the CPU (`reason`).
    pub reason: u8,
    pub on: u8,
    pub _pad: [u8; 2],
}

/// A tracked thread exited; its final counters (the map entry is gone).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ExitEvent {
    pub hdr: EventHeader,
    pub stats: ThreadStats,
    pub comm: [u8; COMM_LEN],
}

/// A tracked descriptor was closed; its final counters.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CloseEvent {
    pub hdr: EventHeader,
    pub fd: i32,
    pub _pad: u32,
    pub stats: FileStats,
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
    /// `stack`: the task's kernel stack, for kernels without
    /// `bpf_task_pt_regs` (see [`task_flags::REGS_FROM_STACK`]).
    pub stack: u32,
    /// Where the saved user registers sit from `stack`:
    /// `THREAD_SIZE - sizeof(struct pt_regs)`.
    pub regs_in_stack: u32,
    /// [`task_flags`].
    pub flags: u32,
    pub _pad: u32,
}

/// `TaskOffsets::flags`.
pub mod task_flags {
    /// The kernel keeps `sched_info.run_delay` (CONFIG_SCHED_INFO).
    pub const RUN_DELAY: u32 = 1;
    /// No `bpf_task_pt_regs` (before 5.15): the saved user registers are
    /// found from `task->stack` (the `sched_switch_stack` program).
    pub const REGS_FROM_STACK: u32 = 2;
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

/// What the raw syscall programs do for a syscall number; the values of the
/// `HOOKS` array map, filled by the agent for its architecture.
pub mod hook {
    pub const NONE: u8 = 0;
    /// read, pread64, readv, preadv, preadv2 (fd is argument 0 of each).
    pub const READ: u8 = 1;
    pub const OPENAT: u8 = 2;
    pub const CLOSE: u8 = 3;
    /// write, pwrite64, writev, pwritev, pwritev2 (fd is argument 0 of each).
    pub const WRITE: u8 = 4;
    /// open(path, flags): openat without the dirfd.
    pub const OPEN: u8 = 5;
    /// creat(path, mode): open(path, O_CREAT | O_WRONLY | O_TRUNC).
    pub const CREAT: u8 = 10;
    /// openat2(dfd, path, how, size): the flags are in `how`.
    pub const OPENAT2: u8 = 6;
    /// dup, dup2, dup3 (the old descriptor is argument 0).
    pub const DUP: u8 = 7;
    /// fcntl: a dup for `F_DUPFD` and `F_DUPFD_CLOEXEC`.
    pub const FCNTL: u8 = 8;
    /// sendfile(out_fd, in_fd, ...): a read of argument 1 and a write of
    /// argument 0.
    pub const SENDFILE: u8 = 9;
    /// splice(fd_in, off_in, fd_out, ...), copy_file_range(fd_in, off_in,
    /// fd_out, ...): a read of argument 0 and a write of argument 2.
    pub const COPY: u8 = 11;

    /// The hooks whose exit completes what `inflight` kind `k` began.
    #[inline(always)]
    pub fn completes(hooked: u8, k: u32) -> bool {
        match k {
            super::inflight::READ => matches!(hooked, READ | SENDFILE | COPY),
            super::inflight::WRITE => hooked == WRITE,
            super::inflight::OPEN => matches!(hooked, OPENAT | OPEN | CREAT | OPENAT2),
            super::inflight::DUP => hooked == DUP || hooked == FCNTL,
            _ => false,
        }
    }
}

/// `CpuSlot::tracked`.
pub mod slot_state {
    /// Not looked up yet (cgroup mode: the task may still be adopted).
    pub const UNCHECKED: u8 = 0;
    pub const TRACKED: u8 = 1;
    pub const UNTRACKED: u8 = 2;
}

/// The per-CPU slot (`CPU_SLOT`): the task this CPU runs, and — if it is
/// tracked — its in-flight syscall and the read counts not yet added to
/// `THREADS`/`FILES`. Syscall programs touch only this (an inlined array
/// access) instead of two or three hash lookups per read; `sched_switch`
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
    pub inflight_kind: u32,
    /// xorshift32 state: which reads are timed.
    pub rng: u32,
    pub _pad1: u32,
    /// Start of the read in flight if it is timed, else 0.
    pub inflight_ts: u64,
    pub inflight_ptr: u64,
    pub file_id: u64,
    /// Address of the task's saved user registers, as the raw syscall
    /// tracepoints pass it (0 until its first syscall on this CPU since it
    /// was switched in): unique to the task while it runs, so a match
    /// proves the slot is the current task's without asking for its tid.
    pub regs: u64,
    /// Pending: program runs for this thread (`counter::EVENTS`).
    pub events: u64,
    /// Pending: added to the thread's `ThreadStats` counters of the same names.
    pub file_read_bytes: u64,
    pub file_read_calls: u64,
    pub file_read_ns: u64,
    pub other_read_bytes: u64,
    pub other_read_calls: u64,
    pub other_read_ns: u64,
    pub file_write_bytes: u64,
    pub file_write_calls: u64,
    pub other_write_bytes: u64,
    pub other_write_calls: u64,
    pub stdio_write_bytes: u64,
    /// Pending: added to `FILES[(tgid, file_fd)]` if it is still `file_id`
    /// (reads only: writes go to `FILES` at once, see `inflight::WRITE`).
    pub file_bytes: u64,
    pub file_calls: u64,
    pub file_ns: u64,
    pub file_timed: u64,
}

/// Load-time configuration, written into the object's `CONFIG` global.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    pub task: TaskOffsets,
    pub regs: Regs,
    /// Non-zero: also track any task whose cgroup is in `CGROUPS`.
    pub cgroup_filter: u8,
    /// Non-zero: every program returns at once (the benchmark's floor).
    pub floor: u8,
    /// Non-zero: send a `SwitchEvent` for every switch of a tracked thread.
    pub timeline: u8,
    /// A read is timed when the random draw has none of these bits set
    /// (0: every read; 7: one in 8).
    pub latency_mask: u8,
    /// Wake the agent only once this many bytes wait in the ring buffer
    /// (it also drains on a short timer): a wakeup per record would cost
    /// more than the record on fork and open storms.
    pub ringbuf_wake_bytes: u32,
    pub page: PageCacheOffsets,
    pub uring: UringLayout,
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
        self.file_read_ns += r.file_read_ns;
        self.other_read_bytes += r.other_read_bytes;
        self.other_read_calls += r.other_read_calls;
        self.other_read_ns += r.other_read_ns;
        self.file_write_bytes += r.file_write_bytes;
        self.file_write_calls += r.file_write_calls;
        self.other_write_bytes += r.other_write_bytes;
        self.other_write_calls += r.other_write_calls;
        self.stdio_write_bytes += r.stdio_write_bytes;
    }
}

impl CpuSlot {
    /// Zeroes what [`ThreadStats::add_slot_counts`] adds.
    #[inline(always)]
    pub fn clear_thread_counts(&mut self) {
        self.file_read_bytes = 0;
        self.file_read_calls = 0;
        self.file_read_ns = 0;
        self.other_read_bytes = 0;
        self.other_read_calls = 0;
        self.other_read_ns = 0;
        self.file_write_bytes = 0;
        self.file_write_calls = 0;
        self.other_write_bytes = 0;
        self.other_write_calls = 0;
        self.stdio_write_bytes = 0;
    }
}

impl FileStats {
    /// Adds the per-file counts a CPU slot (`CPU_SLOT`) holds for its cached
    /// descriptor (`CpuSlot::file_fd`, if it is still `file_id`), each
    /// through `add`: the kernel side adds atomically when it flushes the
    /// slot (threads of one process share descriptors), the agent plainly
    /// when it reads one.
    #[inline(always)]
    pub fn add_slot_file_with(&mut self, s: &CpuSlot, mut add: impl FnMut(&mut u64, u64)) {
        add(&mut self.read_bytes, s.file_bytes);
        add(&mut self.read_calls, s.file_calls);
        add(&mut self.read_ns, s.file_ns);
        add(&mut self.timed_calls, s.file_timed);
    }

    /// [`FileStats::add_slot_file_with`] with plain additions.
    #[inline(always)]
    pub fn add_slot_file(&mut self, s: &CpuSlot) {
        self.add_slot_file_with(s, |a, v| *a += v);
    }
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: all these are repr(C), Copy, and have no implicit padding.
    unsafe impl aya::Pod for ThreadStats {}
    unsafe impl aya::Pod for FdKey {}
    unsafe impl aya::Pod for FileStats {}
    unsafe impl aya::Pod for WakeKey {}
    unsafe impl aya::Pod for WakeStats {}
    unsafe impl aya::Pod for InodeKey {}
    unsafe impl aya::Pod for InodeBytes {}
    unsafe impl aya::Pod for UringKey {}
    unsafe impl aya::Pod for UringRead {}
    unsafe impl aya::Pod for UringReads {}
    unsafe impl aya::Pod for Config {}
    unsafe impl aya::Pod for CpuSlot {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn slot_file_counts_add_every_field() {
        let s = CpuSlot { file_bytes: 100, file_calls: 3, file_ns: 50, file_timed: 1, ..Default::default() };
        let mut f =
            FileStats { read_bytes: 1, read_calls: 1, read_ns: 1, timed_calls: 1, ..Default::default() };
        f.add_slot_file(&s);
        assert_eq!((f.read_bytes, f.read_calls, f.read_ns, f.timed_calls), (101, 4, 51, 2));
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
    // and every struct is a multiple of 8 (ring-buffer reservations need it).
    #[test]
    fn layouts_have_no_hidden_padding() {
        assert_eq!(
            size_of::<ThreadStats>(),
            4 * 2 + 8 + 8 * 6 + 8 * 14 + 4 + 4 + 4 + 4 + 8 + 4 + 4 + 8 + 8 * 5
        );
        assert_eq!(size_of::<FdKey>(), 8);
        assert_eq!(size_of::<FileStats>(), 64);
        assert_eq!(size_of::<WakeKey>(), 8);
        assert_eq!(size_of::<WakeStats>(), 32);
        assert_eq!(size_of::<EventHeader>(), 24);
        assert_eq!(size_of::<OpenEvent>(), 24 + 8 + 16 + 8 + PATH_LEN);
        assert_eq!(size_of::<SwitchEvent>(), 24 + 8 + 8 + 8);
        assert_eq!(size_of::<InodeKey>(), 16);
        assert_eq!(size_of::<PageCacheOffsets>(), 72);
        assert_eq!(size_of::<InodeBytes>(), 40);
        assert_eq!(size_of::<UringLayout>(), 24);
        assert_eq!(size_of::<UringKey>(), 16);
        assert_eq!(size_of::<UringRead>(), 16);
        assert_eq!(size_of::<UringReads>(), 32);
        assert_eq!(size_of::<NewTaskEvent>(), 24 + 8 + 8 + 16);
        assert_eq!(size_of::<ExitEvent>(), 24 + size_of::<ThreadStats>() + 16);
        assert_eq!(size_of::<CloseEvent>(), 24 + 8 + 64);
        assert_eq!(size_of::<TaskOffsets>(), 40);
        assert_eq!(size_of::<Regs>(), 16);
        assert_eq!(size_of::<Config>(), 64 + size_of::<PageCacheOffsets>() + size_of::<UringLayout>());
        assert_eq!(size_of::<CpuSlot>(), 208);
        for s in [
            size_of::<ThreadStats>(),
            size_of::<OpenEvent>(),
            size_of::<ExitEvent>(),
            size_of::<CloseEvent>(),
            size_of::<SwitchEvent>(),
        ] {
            assert_eq!(s % 8, 0);
        }
    }
}
