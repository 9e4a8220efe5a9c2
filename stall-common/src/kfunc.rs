//! Kernel functions (kfuncs) the programs call where the kernel has them.
//!
//! aya 0.14 does not relocate kfunc calls, so a program calls a placeholder
//! instead: a helper number no kernel has, with its BTF-id argument an
//! immediate of a value no kernel type has. At load, where the kernel's BTF
//! has the kfunc and the type, the agent rewrites each such call into the
//! kfunc's call and each placeholder immediate into the type's id
//! (stall-agent's capture/kfunc.rs); a program that holds them is loaded only
//! then, and an unrewritten placeholder is refused by any verifier.

/// The helper number standing for `bpf_rdonly_cast(ptr, btf_id)` (6.2): the
/// verifier turns that call into a move, and the pointer it returns into
/// one whose fields are plain, fault-safe loads (no helper call per read).
pub const RDONLY_CAST_CALL: i32 = 0x5374_6c01;

/// The immediate standing for the BTF id of `struct pt_regs`.
pub const PT_REGS_TYPE: i32 = 0x5374_6c02;

/// The immediate standing for the BTF id of `struct task_struct`: a task
/// that is not the current one (a wakee) read by plain loads.
pub const TASK_STRUCT_TYPE: i32 = 0x5374_6c03;

/// Where `struct pt_regs` keeps the syscall number and first argument on
/// x86-64, the one architecture the agent runs on: a load through a cast
/// pointer needs its offset known to the verifier, so it is a constant here
/// rather than the agent's `Config::regs`.
pub const X86_64_NR: usize = 120;
pub const X86_64_ARG0: usize = 112;
/// `ax` (a syscall's return value, `-ENOSYS` while it runs) and `cs`.
pub const X86_64_AX: usize = 80;
pub const X86_64_CS: usize = 136;
