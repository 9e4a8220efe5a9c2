//! The job's own GPU libraries, seen through uprobes on their exported
//! calls (CUDA's runtime and driver): how long each thread spent inside
//! the calls that wait for the GPU, and how many kernels it launched.

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
}

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
    /// File names (up to the `.so`) of the libraries that export them.
    pub const LIBRARIES: [&str; 2] = ["libcudart.so", "libcuda.so"];
}

// SAFETY: integers only (checked by `gpu_calls_have_no_hidden_padding`),
// 8-aligned by its `u64` fields, its size a multiple of 8.
unsafe impl crate::Plain for GpuCalls {}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: repr(C), Copy, and no implicit padding.
    unsafe impl aya::Pod for GpuCalls {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_calls_have_no_hidden_padding() {
        assert_eq!(core::mem::size_of::<GpuCalls>(), 4 + 4 + 8 + 8 + 8 + 6 * 8);
    }
}
