//! What the agent sets for the programs: the load-time `Config` global with
//! its per-syscall tables (`SyscallTables`), the `TRACK_GEN` value, and the
//! indices of the `COUNTERS` array.

use crate::{inflight, PageCacheOffsets, Regs, TaskOffsets, UringLayout};

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
    /// (0: every read; 7: one in 8)...
    pub latency_mask: u8,
    /// ...or of these, once the thread has made [`LATENCY_RUN_EVENTS`]
    /// hooked calls since it came on-CPU (see [`Config::read_sample_mask`]).
    pub latency_run_mask: u8,
    pub _pad: [u8; 3],
    /// Wake the agent only once this many bytes wait in the ring buffer
    /// (it also drains on a short timer): a wakeup per record would cost
    /// more than the record on fork and open storms.
    pub ringbuf_wake_bytes: u32,
    pub page: PageCacheOffsets,
    pub uring: UringLayout,
    pub tables: SyscallTables,
}

/// Per syscall number, what the programs do with it: read-only data beside
/// the rest of the configuration, so that a lookup is one load from memory
/// the programs touch anyway (as a map, each syscall of the machine paid a
/// lookup's instructions twice, at its entry and its return).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SyscallTables {
    /// What the raw syscall programs do (`hook`).
    pub hooks: [u8; syscall_class::TABLE_LEN as usize],
    /// What a thread blocked in it waits for (`syscall_class`).
    pub classes: [u8; syscall_class::TABLE_LEN as usize],
}

impl SyscallTables {
    /// The `hook` kind of syscall `nr` (`hook::NONE` out of the table).
    #[inline(always)]
    pub fn hook(&self, nr: i64) -> u8 {
        usize::try_from(nr).ok().and_then(|i| self.hooks.get(i)).copied().unwrap_or(hook::NONE)
    }

    /// The `syscall_class` of syscall `nr` (`OTHER` out of the table).
    #[inline(always)]
    pub fn class(&self, nr: i64) -> u8 {
        usize::try_from(nr).ok().and_then(|i| self.classes.get(i)).copied().unwrap_or(syscall_class::OTHER)
    }
}

impl Default for SyscallTables {
    fn default() -> Self {
        Self {
            hooks: [hook::NONE; syscall_class::TABLE_LEN as usize],
            classes: [syscall_class::OTHER; syscall_class::TABLE_LEN as usize],
        }
    }
}

impl core::fmt::Debug for SyscallTables {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let set = |t: &[u8]| t.iter().filter(|&&v| v != 0).count();
        f.debug_struct("SyscallTables")
            .field("hooked", &set(&self.hooks))
            .field("classified", &set(&self.classes))
            .finish()
    }
}

/// Hooked calls (entries and returns, `CpuSlot::events`) since a thread came
/// on-CPU after which its reads are sampled by `latency_run_mask`: a thread
/// that reads this often without blocking loops on cached data, where a
/// clock read would be a large part of each read's cost, and its many
/// reads give the estimate its samples at a lower rate. Reads that block
/// (from storage, a slow pipe) switch out and keep the base rate.
pub const LATENCY_RUN_EVENTS: u64 = 64;

impl Config {
    /// The mask of the draw that times a read entered after `events` hooked
    /// calls in the current on-CPU span. Each timed read stands for
    /// `mask + 1` reads (`CpuSlot::file_timed`), so the estimate stays
    /// unbiased whatever mask picked it.
    #[inline(always)]
    pub fn read_sample_mask(&self, events: u64) -> u8 {
        if events < LATENCY_RUN_EVENTS {
            self.latency_mask
        } else {
            self.latency_run_mask
        }
    }
}

/// How a syscall number maps to a wait reason; the values of
/// `SyscallTables::classes`, filled by the agent for its architecture.
pub mod syscall_class {
    pub const OTHER: u8 = 0;
    pub const FUTEX: u8 = 1;
    /// read-family: refined to IO or POLL by the descriptor's kind.
    pub const READ: u8 = 2;
    pub const POLL: u8 = 3;
    pub const SLEEP: u8 = 4;
    /// write-family: refined to WRITE (a file) or SEND (a pipe or socket,
    /// waiting for its reader) by the descriptor's kind.
    pub const WRITE: u8 = 5;
    /// The sync family: always SYNC.
    pub const SYNC: u8 = 6;
    pub const TABLE_LEN: u32 = 1024;
}

/// What the raw syscall programs do for a syscall number; the values of
/// `SyscallTables::hooks`, filled by the agent for its architecture.
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
    /// connect(fd, addr, len): an inet socket connected to the peer `addr`
    /// names (followed per descriptor from then on).
    pub const CONNECT: u8 = 12;

    /// The hooks whose exit completes what `inflight` kind `k` began.
    #[inline(always)]
    pub fn completes(hooked: u8, k: u32) -> bool {
        match k {
            super::inflight::READ => matches!(hooked, READ | SENDFILE | COPY),
            super::inflight::WRITE => hooked == WRITE,
            super::inflight::OPEN => matches!(hooked, OPENAT | OPEN | CREAT | OPENAT2),
            super::inflight::DUP => hooked == DUP || hooked == FCNTL,
            super::inflight::CONNECT => hooked == CONNECT,
            _ => false,
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
    /// A hooked GPU library call of a tracked thread found `GPU_CALLS` full.
    pub const LOST_GPU_MAP: u32 = 7;
    /// How many loss causes there are: `LOST_*` run from 0 to this.
    pub const LOST_CAUSES: usize = 8;
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
        "gpu_map_full",
    ];
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: repr(C), Copy, and no implicit padding (nor in the structs it holds).
    unsafe impl aya::Pod for Config {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    // Sizes are fixed so a change on one side cannot silently desync the other.
    #[test]
    fn layouts_have_no_hidden_padding() {
        assert_eq!(
            size_of::<Config>(),
            84 + size_of::<PageCacheOffsets>()
                + size_of::<UringLayout>()
                + 2 * syscall_class::TABLE_LEN as usize
        );
    }

    #[test]
    fn reads_in_a_long_on_cpu_run_are_sampled_at_the_run_rate() {
        let c = Config { latency_mask: 7, latency_run_mask: 127, ..Default::default() };
        assert_eq!(c.read_sample_mask(0), 7);
        assert_eq!(c.read_sample_mask(LATENCY_RUN_EVENTS - 1), 7);
        assert_eq!(c.read_sample_mask(LATENCY_RUN_EVENTS), 127);
        assert_eq!(c.read_sample_mask(u64::MAX), 127);
    }
}
