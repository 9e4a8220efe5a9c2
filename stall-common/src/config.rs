//! What the agent sets for the programs: the load-time `Config` global
//! (with the syscalls family's `SyscallTables`), the `TRACK_GEN` value,
//! and the indices of the `COUNTERS` array.

use crate::{PageCacheOffsets, Regs, SyscallTables, TaskOffsets, UringLayout};

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

/// The `TRACK_GEN` value: the low 24 bits change whenever the agent changes
/// what is tracked (every CPU slot is looked up again), the top 8 bits
/// whenever it attaches the syscall hooks (entries in flight from before
/// are stale; see [`crate::inflight`]).
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
    /// A hooked GPU library call of a tracked thread found `GPU_CALLS` (or
    /// a communicator `NCCL_COMMS`) full.
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
    use crate::syscall_class;
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
