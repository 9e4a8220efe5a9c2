//! Generic reads of kernel memory, shared by the families: a field of a
//! kernel object by `bpf_probe_read_kernel` (any address, a fault reads as
//! 0), and the syscall a task is in, from its saved user registers.
use aya_ebpf::helpers::{bpf_get_current_task_btf, bpf_probe_read_kernel, bpf_task_pt_regs};
use stall_common::Config;

/// A `u8` field of a kernel object, 0 if unreadable.
#[inline(always)]
pub(crate) fn read_u8(base: u64, off: u32) -> u8 {
    // SAFETY: bpf_probe_read_kernel checks the address (any address, even a
    // stale or garbage one); a fault returns an error, read as 0, never a
    // crash. Any byte is a valid `u8`.
    unsafe { bpf_probe_read_kernel((base + u64::from(off)) as *const u8) }.unwrap_or(0)
}

#[inline(always)]
pub(crate) fn read_u32(base: u64, off: u32) -> u32 {
    // SAFETY: as in `read_u8`: the helper checks the address, a fault reads
    // as 0; any 4 bytes are a valid `u32`.
    unsafe { bpf_probe_read_kernel((base + u64::from(off)) as *const u32) }.unwrap_or(0)
}

#[inline(always)]
pub(crate) fn read_u64(base: u64, off: u32) -> u64 {
    // SAFETY: as in `read_u8`: the helper checks the address, a fault reads
    // as 0; any 8 bytes are a valid `u64`.
    unsafe { bpf_probe_read_kernel((base + u64::from(off)) as *const u64) }.unwrap_or(0)
}

/// The syscall the current task (`prev`) is in, from its saved user
/// registers (`orig_ax` on x86-64); -1 when it is not in one.
#[inline(always)]
pub(crate) fn syscall_nr<const STACK: bool>(prev: u64, cfg: &Config) -> i32 {
    nr_in(user_regs::<STACK>(prev, cfg), cfg)
}

/// The address of the current task's (`prev`'s) saved user registers, 0
/// if unknown. `STACK`: they sit at the top of its kernel stack
/// (`task_pt_regs`).
#[inline(always)]
pub(crate) fn user_regs<const STACK: bool>(prev: u64, cfg: &Config) -> u64 {
    if STACK {
        let stack = read_u64(prev, cfg.task.stack);
        if stack == 0 {
            return 0;
        }
        stack + u64::from(cfg.task.regs_in_stack)
    } else {
        // SAFETY: bpf_get_current_task_btf returns the trusted BTF pointer to
        // the current task that bpf_task_pt_regs requires (the verifier checks
        // its type, and rejects the call on kernels without the helper: the
        // agent loads the `STACK` variant there). The result is used only as
        // an address for bpf_probe_read_kernel.
        unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) as u64 }
    }
}

/// The syscall number in saved user registers at `regs` (0: unknown);
/// -1 when the task is not in a syscall.
#[inline(always)]
pub(crate) fn nr_in(regs: u64, cfg: &Config) -> i32 {
    if regs == 0 {
        return -1;
    }
    // SAFETY: bpf_probe_read_kernel checks the address (computed from the
    // task's stack or `bpf_task_pt_regs`); a fault returns an error, read as
    // -1, never a crash. Any 8 bytes are a valid `i64`.
    unsafe { bpf_probe_read_kernel((regs + u64::from(cfg.regs.nr)) as *const i64) }
        .map(|v| v as i32)
        .unwrap_or(-1)
}
