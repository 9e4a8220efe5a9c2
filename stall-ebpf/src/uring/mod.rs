//! io_uring reads: a read a tracked thread submits (`IORING_OP_READ`,
//! `READV`, `READ_FIXED`) is remembered by (ring, user data) with its
//! descriptor; its completion, wherever it runs (the submitter, an io-wq
//! worker, an interrupt), adds the bytes to the descriptor's `FILES` entry
//! and to the thread's `URING_READS`, atomically. No syscall hook sees these
//! reads: `io_uring_enter` only submits and reaps.
//!
//! The tracepoints' arguments moved between kernels (`UringLayout`, from
//! BTF): 5.10 passes ring, opcode and user data as arguments and traces the
//! descriptor just before (`io_uring_file_get`); 6.x passes the request,
//! whose fields hold them, and from 6.3 the completion's posted CQE.
use aya_ebpf::{
    helpers::bpf_probe_read_kernel, macros::raw_tracepoint, programs::RawTracePointContext, EbpfContext,
};
use stall_common::{counter, uring_op, UringKey, UringRead, UringReads};

use crate::{
    atomic_add, bump, config, current,
    maps::{URING_FD, URING_PENDING, URING_READS},
    running::add_to_file,
    BPF_NOEXIST,
};

/// `REQ_F_FIXED_FILE`: the request's descriptor is an index into the
/// ring's registered files.
const REQ_FIXED_FILE: u64 = 1;

/// Argument `i` of the raw tracepoint, by index known only at load time.
#[inline(always)]
fn arg(ctx: &RawTracePointContext, i: u8) -> u64 {
    let args = ctx.as_ptr() as *const u64;
    // SAFETY: bpf_probe_read_kernel checks the address: the raw tracepoint's
    // argument array, index masked to 0..=7 (an index past the tracepoint's
    // arguments reads whatever follows them on the kernel stack: garbage,
    // never a fault); a failed read returns an error, read as 0.
    unsafe { bpf_probe_read_kernel(args.wrapping_add(usize::from(i) & 7)) }.unwrap_or(0)
}

#[inline(always)]
fn field<T: Copy + Default>(base: u64, off: u16) -> T {
    // SAFETY: bpf_probe_read_kernel checks the address; a fault returns an
    // error, read as `T::default()`, never a crash. Callers use only integer
    // types, for which any bytes are a valid value.
    unsafe { bpf_probe_read_kernel((base + u64::from(off)) as *const T) }.unwrap_or_default()
}

/// `io_uring_submit_req(req)`, `io_uring_submit_sqe(req, ...)` or (5.10)
/// `io_uring_submit_sqe(ctx, opcode, user_data, ...)`: attached to
/// whichever the kernel has.
#[raw_tracepoint]
pub fn uring_submit(ctx: RawTracePointContext) -> i32 {
    let cfg = config();
    let l = &cfg.uring;
    if cfg.floor != 0 || l.on == 0 {
        return 0;
    }
    let (key, opcode, fd) = if l.submit_req != 0 {
        let req = arg(&ctx, 0);
        let key = UringKey { ctx: field(req, l.req_ctx), user_data: field(req, l.req_user_data) };
        let fixed = field::<u64>(req, l.req_flags) & REQ_FIXED_FILE != 0;
        let fd = if fixed { -1 } else { field::<i32>(req, l.req_fd) };
        (key, field::<u8>(req, l.req_opcode), fd)
    } else {
        let key = UringKey { ctx: arg(&ctx, l.submit_ctx), user_data: arg(&ctx, l.submit_user_data) };
        // The descriptor `io_uring_file_get` traced for this submission,
        // taken whatever the opcode: a registered file traces none, and
        // must not get the one of an earlier submission.
        let fd = match URING_FD.get_ptr_mut(0) {
            Some(s) => {
                // SAFETY: `s` is non-null and points at this CPU's element of
                // a per-CPU array, valid for the program's run; only this
                // program and `uring_file_get` use it, both raw tracepoints in
                // task context (preemption disabled), never nested on a CPU.
                let s = unsafe { &mut *s };
                let fd = if s.tid == crate::ids().0 { s.fd } else { -1 };
                s.tid = 0;
                fd
            }
            None => -1,
        };
        (key, arg(&ctx, l.submit_opcode) as u8, fd)
    };
    if !uring_op::is_read(opcode) {
        return 0;
    }
    let Some(cur) = current(&cfg) else {
        return 0;
    };
    let read = UringRead { tgid: cur.tgid, tid: cur.tid, fd, _pad: 0 };
    if URING_PENDING.insert(key, read, 0).is_err() {
        bump(counter::LOST_URING_MAP);
        crate::diag::map_full(counter::LOST_URING_MAP);
    }
    0
}

/// `io_uring_file_get(ctx, fd)` (5.10): the descriptor of the submission
/// that follows on this CPU. Attached only where the submission does not
/// carry the request.
#[raw_tracepoint(tracepoint = "io_uring_file_get")]
pub fn uring_file_get(ctx: RawTracePointContext) -> i32 {
    let cfg = config();
    let l = &cfg.uring;
    if cfg.floor != 0 || l.on == 0 || l.submit_req != 0 {
        return 0;
    }
    if let Some(s) = URING_FD.get_ptr_mut(0) {
        // SAFETY: as in `uring_submit`: this CPU's element of a per-CPU
        // array, used by no other CPU and by no nested program.
        let s = unsafe { &mut *s };
        s.tid = crate::ids().0;
        s.fd = arg(&ctx, l.file_fd) as i32;
    }
    0
}

/// `io_uring_complete`: a read of a tracked thread finished with `res`.
#[raw_tracepoint(tracepoint = "io_uring_complete")]
pub fn uring_complete(ctx: RawTracePointContext) -> i32 {
    let cfg = config();
    let l = &cfg.uring;
    if cfg.floor != 0 || l.on == 0 {
        return 0;
    }
    let ring = arg(&ctx, l.complete_ctx);
    let (user_data, res) = if l.complete_cqe != 0 {
        let cqe = arg(&ctx, l.complete_user_data);
        (field::<u64>(cqe, 0), field::<i32>(cqe, 8))
    } else {
        (arg(&ctx, l.complete_user_data), arg(&ctx, l.complete_res) as i32)
    };
    let key = UringKey { ctx: ring, user_data };
    // SAFETY: `get` is unsafe because another CPU may change or delete the
    // entry while the reference lives (a preallocated element can be
    // reused); the value is copied at once, before the removal below.
    let Some(read) = (unsafe { URING_PENDING.get(&key) }).copied() else {
        return 0;
    };
    let _ = URING_PENDING.remove(&key);
    let bytes = if res > 0 { res as u64 } else { 0 };
    let file = read.fd >= 0
        // SAFETY: `f` is the live `FILES` entry `add_to_file` passes: its
        // fields are valid, 8-byte aligned `u64`s.
        && add_to_file(read.tgid, read.fd, |f| unsafe {
            atomic_add(&mut f.read_bytes, bytes);
            atomic_add(&mut f.read_calls, 1);
        });
    if URING_READS.get_ptr_mut(read.tid).is_none()
        && URING_READS.insert(read.tid, UringReads::default(), BPF_NOEXIST).is_err()
        && URING_READS.get_ptr_mut(read.tid).is_none()
    {
        bump(counter::LOST_URING_MAP);
        crate::diag::map_full(counter::LOST_URING_MAP);
        return 0;
    }
    if let Some(t) = URING_READS.get_ptr_mut(read.tid) {
        // SAFETY: the non-null value pointer of the thread's `URING_READS`
        // entry; the map is preallocated, so it stays valid memory for the
        // program's run even if the thread's exit removes it meanwhile (a
        // lost count, never a fault).
        let t = unsafe { &mut *t };
        // SAFETY: `t`'s fields are valid, 8-byte aligned `u64`s; completions
        // on other CPUs add to the same entry, hence atomically.
        unsafe {
            if file {
                atomic_add(&mut t.file_bytes, bytes);
                atomic_add(&mut t.file_calls, 1);
            } else {
                atomic_add(&mut t.other_bytes, bytes);
                atomic_add(&mut t.other_calls, 1);
            }
        }
    }
    0
}
