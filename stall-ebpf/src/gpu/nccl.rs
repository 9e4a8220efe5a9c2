//! NCCL, in the GPU library family: uprobes on the job's `libnccl.so`. A
//! communicator is known from its creation (`ncclCommInitRank*`: its rank,
//! its size and a hash of the unique id all its ranks share;
//! `ncclCommSplit`: its parent's hash and the color), and each collective
//! called on it stamps its arrival time at its sequence number, so the
//! agent can compare the ranks' n-th calls. A collective also starts the
//! calling thread's wait for it, which its next synchronization ends
//! (gpu.rs). Processes not tracked pay the probe's entry into the kernel
//! and one map lookup.
use aya_ebpf::{
    helpers::bpf_probe_read_user,
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use stall_common::{
    counter, fnv_words, zeroed_in, CommInit, CommKey, Communicator, COLLECTIVE_RING, NCCL_UNIQUE_ID_WORDS,
};

use crate::{
    bump, config, current, diag, gpu, ids,
    maps::{NCCL_COMMS, NCCL_INITS, NCCL_SCRATCH},
    now, BPF_ANY,
};

/// `ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int
/// rank)` and `…Config`: the 128-byte id is passed by value, in memory just
/// above the return address; `rank` is the third integer argument.
#[uprobe]
pub fn nccl_init_enter(ctx: ProbeContext) -> u32 {
    let Some(c) = current(config()) else { return 0 };
    let (tid, _) = ids();
    // SAFETY: a uprobe's context is the task's saved registers.
    let sp = unsafe { (*ctx.regs).rsp };
    // SAFETY: reads user memory through the helper, which fails (leaving
    // the zeroes) rather than fault.
    let id = unsafe { bpf_probe_read_user((sp + 8) as *const [u64; NCCL_UNIQUE_ID_WORDS]) }
        .unwrap_or([0; NCCL_UNIQUE_ID_WORDS]);
    let init = CommInit {
        newcomm: ctx.arg::<u64>(0).unwrap_or(0),
        id_hash: fnv_words(&id),
        nranks: ctx.arg::<u32>(1).unwrap_or(0),
        rank: ctx.arg::<i32>(2).unwrap_or(-1),
        split_key: 0,
        tgid: c.tgid,
    };
    let _ = NCCL_INITS.insert(tid, &init, BPF_ANY);
    0
}

/// `ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
/// config)`: ranks of one color share the new communicator; NCCL orders
/// them by key, which only all of them know.
#[uprobe]
pub fn nccl_split_enter(ctx: ProbeContext) -> u32 {
    let Some(c) = current(config()) else { return 0 };
    let (tid, _) = ids();
    let key = CommKey { tgid: c.tgid, _pad: 0, comm: ctx.arg::<u64>(0).unwrap_or(0) };
    // SAFETY: a value pointer of the preallocated map, read once.
    let parent = NCCL_COMMS.get_ptr(&key).map_or(0, |p| unsafe { (*p).id_hash });
    let color = ctx.arg::<i32>(1).unwrap_or(-1);
    // NCCL_SPLIT_NOCOLOR: this rank gets no communicator; nor one whose
    // parent was made before the probes (no hash to derive from).
    if color < 0 || parent == 0 {
        return 0;
    }
    let init = CommInit {
        newcomm: ctx.arg::<u64>(3).unwrap_or(0),
        id_hash: fnv_words(&[parent, color as u64]),
        nranks: 0,
        rank: -1,
        split_key: ctx.arg::<i32>(2).unwrap_or(0),
        tgid: c.tgid,
    };
    let _ = NCCL_INITS.insert(tid, &init, BPF_ANY);
    0
}

/// After a creation returned: the handle NCCL wrote is the communicator.
#[uretprobe]
pub fn nccl_init_return(_ctx: RetProbeContext) -> u32 {
    let (tid, _) = ids();
    let Some(p) = NCCL_INITS.get_ptr(&tid) else { return 0 };
    // SAFETY: a value pointer of the preallocated map, copied out at once.
    let init = unsafe { *p };
    let _ = NCCL_INITS.remove(&tid);
    // SAFETY: user memory through the helper (fails rather than fault).
    let comm = unsafe { bpf_probe_read_user(init.newcomm as *const u64) }.unwrap_or(0);
    if comm == 0 {
        return 0;
    }
    let key = CommKey { tgid: init.tgid, _pad: 0, comm };
    if let Some(fresh) = fresh() {
        fresh.id_hash = init.id_hash;
        fresh.nranks = init.nranks;
        fresh.rank = init.rank;
        fresh.split_key = init.split_key;
        fresh.tid = tid;
        // A handle reused after `ncclCommDestroy` starts over.
        if NCCL_COMMS.insert(&key, &*fresh, BPF_ANY).is_err() {
            bump(counter::LOST_GPU_MAP);
            diag::map_full(counter::LOST_GPU_MAP);
        }
    }
    0
}

/// A zeroed `Communicator` in this CPU's scratch slot.
#[inline(always)]
fn fresh() -> Option<&'static mut Communicator> {
    let p = NCCL_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: this CPU's slot of a per-CPU array; a program runs to its end
    // on one CPU, so nothing else uses the slot meanwhile.
    let slot = unsafe { &mut *(p as *mut core::mem::MaybeUninit<Communicator>) };
    Some(zeroed_in(slot))
}

/// A collective (or point-to-point call) on `comm` by the current thread.
#[inline(always)]
fn arrive(comm: u64, p2p: bool) {
    let Some(calls) = gpu::calls() else { return };
    let at = now();
    calls.collectives += 1;
    if calls.collective_since == 0 {
        calls.collective_since = at;
    }
    let (tid, _) = ids();
    let key = CommKey { tgid: calls.tgid, _pad: 0, comm };
    let entry = match NCCL_COMMS.get_ptr_mut(&key) {
        Some(p) => p,
        None => {
            // Made before the probes: counted, never matched (no id).
            let Some(fresh) = fresh() else { return };
            fresh.rank = -1;
            if NCCL_COMMS.insert(&key, &*fresh, BPF_ANY).is_err() {
                bump(counter::LOST_GPU_MAP);
                diag::map_full(counter::LOST_GPU_MAP);
                return;
            }
            let Some(p) = NCCL_COMMS.get_ptr_mut(&key) else { return };
            p
        }
    };
    // SAFETY: a value pointer of the preallocated map; the element stays
    // valid memory while the program runs (a delete by the agent meanwhile
    // costs a miscount, never a fault). One process's calls on one
    // communicator come from one thread at a time.
    let c = unsafe { &mut *entry };
    c.tid = tid;
    if p2p {
        c.p2p += 1;
        return;
    }
    let seq = c.collectives;
    c.arrivals[(seq as usize) & (COLLECTIVE_RING - 1)] = at;
    c.collectives = seq + 1;
}

/// `ncclAllGather(send, recv, count, type, comm, stream)`.
#[uprobe]
pub fn nccl_collective_comm4(ctx: ProbeContext) -> u32 {
    arrive(ctx.arg::<u64>(4).unwrap_or(0), false);
    0
}

/// `ncclAllReduce`, `ncclReduceScatter`, `ncclBroadcast`: `(send, recv,
/// count, type, op or root, comm, stream)`.
#[uprobe]
pub fn nccl_collective_comm5(ctx: ProbeContext) -> u32 {
    arrive(ctx.arg::<u64>(5).unwrap_or(0), false);
    0
}

/// `ncclReduce(send, recv, count, type, op, root, comm, stream)`: the
/// seventh argument is the first in memory, above the return address.
#[uprobe]
pub fn nccl_collective_comm6(ctx: ProbeContext) -> u32 {
    // SAFETY: a uprobe's context is the task's saved registers.
    let sp = unsafe { (*ctx.regs).rsp };
    // SAFETY: user memory through the helper (fails rather than fault).
    let comm = unsafe { bpf_probe_read_user((sp + 8) as *const u64) }.unwrap_or(0);
    arrive(comm, false);
    0
}

/// `ncclSend(buf, count, type, peer, comm, stream)` and `ncclRecv`.
#[uprobe]
pub fn nccl_p2p(ctx: ProbeContext) -> u32 {
    arrive(ctx.arg::<u64>(4).unwrap_or(0), true);
    0
}
