//! io_uring reads: where the tracepoints keep what the programs need
//! (`UringLayout`), the reads in flight (`URING_PENDING`) and those
//! completed, by thread (`URING_READS`).

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

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: all these are repr(C), Copy, and have no implicit padding.
    unsafe impl aya::Pod for UringKey {}
    unsafe impl aya::Pod for UringRead {}
    unsafe impl aya::Pod for UringReads {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    // Sizes are fixed so a change on one side cannot silently desync the other.
    #[test]
    fn layouts_have_no_hidden_padding() {
        assert_eq!(size_of::<UringLayout>(), 24);
        assert_eq!(size_of::<UringKey>(), 16);
        assert_eq!(size_of::<UringRead>(), 16);
        assert_eq!(size_of::<UringReads>(), 32);
    }
}
