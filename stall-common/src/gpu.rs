//! The job's own GPU libraries, seen through uprobes on their exported
//! calls (CUDA's runtime and driver, NCCL): how long each thread spent
//! inside the calls that wait for the GPU, how many kernels it launched,
//! and when each rank arrived at each collective of its communicators.

/// Which calls a probe stands for: the outermost call a thread is in
/// decides where its time goes (the runtime's `cudaStreamSynchronize`
/// calls the driver's `cuStreamSynchronize`; a synchronous copy waits for
/// the stream first).
pub mod gpu_call {
    /// A synchronization: the thread waits (spinning, yielding or blocked,
    /// as the device's schedule flags say) for work queued on the GPU.
    pub const SYNC: u8 = 1;
    /// A synchronous copy between host and device memory.
    pub const COPY: u8 = 2;
}

/// Per tracked thread (`GPU_CALLS`, by tid): its time inside the GPU
/// library calls that wait, and its kernel launches.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuCalls {
    pub tgid: u32,
    /// How deep the thread is in hooked calls now (0: in none); the
    /// outermost entry's time and kind are kept below.
    pub depth: u32,
    /// When the outermost call in progress began (CLOCK_MONOTONIC ns).
    pub since: u64,
    /// `gpu_call::*` of the outermost call in progress.
    pub kind: u8,
    pub _pad: [u8; 7],
    /// Bytes the copy in progress moves.
    pub pending_bytes: u64,
    pub sync_ns: u64,
    pub sync_calls: u64,
    pub copy_ns: u64,
    pub copy_calls: u64,
    pub copy_bytes: u64,
    /// Kernel launches (counted, not timed).
    pub launches: u64,
    /// When the thread called the first NCCL collective it has not waited
    /// for yet (0: none pending): the next return from a timed call (the
    /// synchronization that learns the collective completed) ends the wait.
    pub collective_since: u64,
    /// Collectives and point-to-point calls this thread made.
    pub collectives: u64,
    /// From each pending collective's call to the return of the timed call
    /// after it: how long the rank waited for its peers and the GPU.
    pub collective_wait_ns: u64,
    pub collective_waits: u64,
}

/// How many of a communicator's last collectives keep their arrival time.
/// The agent compares the ranks' arrivals each tick; a rank more than this
/// many collectives ahead of the last tick leaves the older ones unread.
pub const COLLECTIVE_RING: usize = 128;

/// A communicator of one process (`NCCL_COMMS` key): the process and the
/// `ncclComm_t` it holds.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct CommKey {
    pub tgid: u32,
    pub _pad: u32,
    pub comm: u64,
}

/// What a process's communicator is, and when its rank called each of its
/// last collectives. Every rank of one communicator has the same
/// `id_hash` and calls the same collectives in the same order, so the
/// n-th call of each rank is the same collective: comparing arrival times
/// by sequence number tells the rank that came last.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Communicator {
    /// A hash of the unique id every rank passed to `ncclCommInitRank*`
    /// (a split's: its parent's and the color); 0 where the communicator
    /// was created before the probes were attached (its collectives are
    /// counted, but not matched with other ranks').
    pub id_hash: u64,
    /// Number of ranks and this process's rank (-1: not known, as for a
    /// split, whose new rank NCCL derives from all ranks' keys).
    pub nranks: u32,
    pub rank: i32,
    /// The split's key (orders the new ranks), else 0.
    pub split_key: i32,
    /// The thread that called the last collective.
    pub tid: u32,
    /// Collectives called so far: the next one's sequence number.
    pub collectives: u64,
    /// Point-to-point calls (`ncclSend`, `ncclRecv`): per pair of ranks,
    /// so not in the sequence.
    pub p2p: u64,
    /// `arrivals[seq % COLLECTIVE_RING]`: CLOCK_MONOTONIC ns of the call.
    pub arrivals: [u64; COLLECTIVE_RING],
}

/// A communicator being created by a thread (`NCCL_INITS`, by tid): what
/// the entry probe read, for the return probe, which reads the handle
/// NCCL wrote.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommInit {
    /// The `ncclComm_t*` the call fills.
    pub newcomm: u64,
    pub id_hash: u64,
    pub nranks: u32,
    pub rank: i32,
    pub split_key: i32,
    /// The creating process.
    pub tgid: u32,
}

/// FNV-1a over 64-bit words: the unique id's hash (any rank computes the
/// same from the same 128 bytes) and a split's (parent's hash, color).
pub const fn fnv_words(words: &[u64]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < words.len() {
        h ^= words[i];
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    // 0 means "not known".
    if h == 0 {
        1
    } else {
        h
    }
}

/// `ncclUniqueId`: 128 bytes, passed by value (on the stack).
pub const NCCL_UNIQUE_ID_WORDS: usize = 16;

/// The exported functions each probe goes on, as the agent attaches them
/// (a library lacking one is skipped). The runtime's and the driver's
/// names both: PyTorch calls the runtime, Triton and JAX the driver.
pub mod gpu_symbols {
    pub const SYNC: [&str; 8] = [
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cudaThreadSynchronize",
        "cuStreamSynchronize",
        "cuCtxSynchronize",
        "cuEventSynchronize",
        "cuStreamSynchronize_ptsz",
    ];
    /// Their byte count is the third argument in each.
    pub const COPY: [&str; 7] = [
        "cudaMemcpy",
        "cuMemcpyDtoH_v2",
        "cuMemcpyHtoD_v2",
        "cuMemcpyDtoH",
        "cuMemcpyHtoD",
        "cuMemcpyDtoD_v2",
        "cuMemcpy",
    ];
    pub const LAUNCH: [&str; 5] = [
        "cudaLaunchKernel",
        "cuLaunchKernel",
        "cudaLaunchKernel_ptsz",
        "cuLaunchKernelEx",
        "cudaLaunchKernelExC",
    ];
    /// NCCL's communicator creation: `ncclCommInitRank(ncclComm_t*, int
    /// nranks, ncclUniqueId, int rank)` and the same with a config after.
    pub const NCCL_INIT: [&str; 2] = ["ncclCommInitRank", "ncclCommInitRankConfig"];
    /// `ncclCommSplit(ncclComm_t, int color, int key, ncclComm_t*, config)`.
    pub const NCCL_SPLIT: [&str; 1] = ["ncclCommSplit"];
    /// Collectives whose communicator is the 6th argument.
    pub const NCCL_COMM_ARG5: [&str; 3] = ["ncclAllReduce", "ncclReduceScatter", "ncclBroadcast"];
    /// ... the 5th.
    pub const NCCL_COMM_ARG4: [&str; 1] = ["ncclAllGather"];
    /// ... the 7th (on the stack).
    pub const NCCL_COMM_ARG6: [&str; 1] = ["ncclReduce"];
    /// Point-to-point calls, communicator 5th.
    pub const NCCL_P2P: [&str; 2] = ["ncclSend", "ncclRecv"];
    /// File names (up to the `.so`) of the libraries that export them.
    pub const LIBRARIES: [&str; 3] = ["libcudart.so", "libcuda.so", "libnccl.so"];
}

// SAFETY: integers only (checked by `gpu_calls_have_no_hidden_padding`),
// 8-aligned by its `u64` fields, its size a multiple of 8.
unsafe impl crate::Plain for GpuCalls {}
// SAFETY: as above (`nccl_types_have_no_hidden_padding`).
unsafe impl crate::Plain for Communicator {}
// SAFETY: as above.
unsafe impl crate::Plain for CommInit {}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: repr(C), Copy, and no implicit padding.
    unsafe impl aya::Pod for GpuCalls {}
    // SAFETY: as above.
    unsafe impl aya::Pod for CommKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for Communicator {}
    // SAFETY: as above.
    unsafe impl aya::Pod for CommInit {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_calls_have_no_hidden_padding() {
        assert_eq!(core::mem::size_of::<GpuCalls>(), 4 + 4 + 8 + 8 + 8 + 6 * 8 + 4 * 8);
    }

    #[test]
    fn nccl_types_have_no_hidden_padding() {
        use core::mem::size_of;
        assert_eq!(size_of::<CommKey>(), 16);
        assert_eq!(size_of::<Communicator>(), 8 + 4 * 4 + 8 + 8 + COLLECTIVE_RING * 8);
        assert_eq!(size_of::<CommInit>(), 8 + 8 + 4 * 4);
    }

    #[test]
    fn every_rank_hashes_an_id_alike_and_never_to_zero() {
        let id = [7u64; NCCL_UNIQUE_ID_WORDS];
        assert_eq!(fnv_words(&id), fnv_words(&id));
        assert_ne!(fnv_words(&id), fnv_words(&[7u64; 15]));
        assert_ne!(fnv_words(&[]), 0);
    }
}
