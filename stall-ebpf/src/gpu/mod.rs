//! The GPU library family: uprobes on the exported calls of the job's own
//! CUDA libraries (the agent attaches them to each library a job process
//! maps, by symbol). A call that waits for the GPU is timed from its entry
//! to its return, the outermost call of a thread only (the runtime's calls
//! go through the driver's); a kernel launch is counted without reading
//! the clock. Threads not tracked pay the probe's entry into the kernel
//! and one `THREADS` lookup.
use aya_ebpf::{
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use stall_common::{counter, gpu_call, zeroed_in, GpuCalls};

use crate::{bump, config, current, ids, maps::GPU_CALLS, now, BPF_NOEXIST};

mod nccl;

/// The current thread's entry in `GPU_CALLS`, made on its first call; None
/// where the thread is not tracked (or the map is full: counted).
#[inline(always)]
pub(crate) fn calls() -> Option<&'static mut GpuCalls> {
    let (tid, _) = ids();
    if let Some(p) = GPU_CALLS.get_ptr_mut(tid) {
        // SAFETY: `p` is the non-null value pointer of this thread's entry;
        // the map is preallocated, so the element stays valid memory for the
        // program's run even if the agent deletes it meanwhile (then a
        // miscount, never a fault). Only this thread's probes write it, and
        // a thread runs on one CPU at a time.
        return Some(unsafe { &mut *p });
    }
    let c = current(config())?;
    let mut at = core::mem::MaybeUninit::<GpuCalls>::uninit();
    let fresh = zeroed_in(&mut at);
    fresh.tgid = c.tgid;
    if GPU_CALLS.insert(tid, &*fresh, BPF_NOEXIST).is_err() && GPU_CALLS.get_ptr(tid).is_none() {
        bump(counter::LOST_GPU_MAP);
        crate::diag::map_full(counter::LOST_GPU_MAP);
        return None;
    }
    // SAFETY: as above, for the entry just inserted.
    GPU_CALLS.get_ptr_mut(tid).map(|p| unsafe { &mut *p })
}

/// Deeper than the library's own calls go (runtime into driver): a
/// thread this deep missed returns (a call left by `longjmp`, a thread
/// cancelled inside one), and starts over.
const MAX_DEPTH: u32 = 8;

#[inline(always)]
fn enter(kind: u8, bytes: u64) {
    let Some(c) = calls() else { return };
    if c.depth >= MAX_DEPTH {
        c.depth = 0;
    }
    if c.depth == 0 {
        c.since = now();
        c.kind = kind;
        c.pending_bytes = bytes;
    }
    c.depth = c.depth.saturating_add(1);
}

#[inline(always)]
fn leave() {
    let (tid, _) = ids();
    let Some(p) = GPU_CALLS.get_ptr_mut(tid) else { return };
    // SAFETY: as in `calls`.
    let c = unsafe { &mut *p };
    // A return whose entry was before the probes were attached.
    if c.depth == 0 {
        return;
    }
    c.depth -= 1;
    if c.depth > 0 || c.since == 0 {
        return;
    }
    let at = now();
    let spent = at.saturating_sub(c.since);
    c.since = 0;
    // The first wait after a collective is where the rank learns it
    // completed: for its peers and its GPU.
    if c.collective_since != 0 {
        c.collective_wait_ns += at.saturating_sub(c.collective_since);
        c.collective_waits += 1;
        c.collective_since = 0;
    }
    if c.kind == gpu_call::COPY {
        c.copy_ns += spent;
        c.copy_calls += 1;
        c.copy_bytes += c.pending_bytes;
    } else {
        c.sync_ns += spent;
        c.sync_calls += 1;
    }
}

#[uprobe]
pub fn gpu_sync_enter(_ctx: ProbeContext) -> u32 {
    enter(gpu_call::SYNC, 0);
    0
}

#[uretprobe]
pub fn gpu_call_return(_ctx: RetProbeContext) -> u32 {
    leave();
    0
}

/// The synchronous copies: their byte count is the third argument.
#[uprobe]
pub fn gpu_copy_enter(ctx: ProbeContext) -> u32 {
    enter(gpu_call::COPY, ctx.arg::<u64>(2).unwrap_or(0));
    0
}

#[uprobe]
pub fn gpu_launch(_ctx: ProbeContext) -> u32 {
    if let Some(c) = calls() {
        c.launches += 1;
    }
    0
}
