//! The io_uring family: its programs loaded and attached where this
//! kernel's tracepoints are known, and where they keep a read's ring, user
//! data, opcode, descriptor and result (`UringLayout` for stall-ebpf's
//! uring/), from the tracepoints' BTF typedefs and `struct io_kiocb`:
//! - 5.10: `io_uring_submit_sqe(ctx, opcode, user_data, ...)`, the
//!   descriptor traced just before by `io_uring_file_get(ctx, fd)`,
//!   `io_uring_complete(ctx, user_data, res, cflags)`;
//! - 6.1: `io_uring_submit_sqe(req, ...)` (the descriptor in `req->cqe.fd`),
//!   `io_uring_complete(ctx, req, user_data, res, cflags, ...)`;
//! - 6.3 on: `io_uring_submit_req(req)`, `io_uring_complete(ctx, req, cqe)`.
use aya::{programs::RawTracePoint, Ebpf};
use stall_common::{names, UringLayout};

use crate::capture::{
    btf::{KernelBtf, TpArg},
    error::load_err,
    object::program,
    tracefs::Tracefs,
    CaptureError,
};

/// The submission's tracepoint: 6.3 renamed `io_uring_submit_sqe`.
pub const SUBMIT: [&str; 2] = ["io_uring_submit_req", "io_uring_submit_sqe"];
pub const COMPLETE: &str = "io_uring_complete";
pub const FILE_GET: &str = "io_uring_file_get";

/// `struct io_kiocb` fields the request form needs (None: missing).
#[derive(Debug, Default, Clone, Copy)]
pub struct ReqOffsets {
    pub ctx: Option<u16>,
    pub opcode: Option<u16>,
    pub user_data: Option<u16>,
    pub fd: Option<u16>,
    pub flags: Option<u16>,
}

impl ReqOffsets {
    pub fn from_btf(btf: &KernelBtf) -> Self {
        let at = |path: &str, sizes: &[usize]| {
            btf.offset("io_kiocb", path, sizes).and_then(|o| u16::try_from(o).ok())
        };
        Self {
            ctx: at("ctx", &[8]),
            opcode: at("opcode", &[1]),
            user_data: at("cqe.user_data", &[8]),
            fd: at("cqe.fd", &[4]),
            flags: at("flags", &[4, 8]),
        }
    }
}

/// The layout for `submit` (the submission tracepoint this kernel has),
/// from BTF; None where a piece is missing (io_uring reads not followed).
pub fn layout(btf: &KernelBtf, submit: &str) -> Option<UringLayout> {
    from_args(
        &btf.tracepoint_args(submit)?,
        &btf.tracepoint_args(COMPLETE)?,
        btf.tracepoint_args(FILE_GET).as_deref(),
        ReqOffsets::from_btf(btf),
    )
}

/// Index of the first argument `want` accepts, after `from`.
fn find(args: &[TpArg], from: usize, want: impl Fn(&TpArg) -> bool) -> Option<u8> {
    (from..args.len()).find(|i| want(&args[*i])).and_then(|i| u8::try_from(i).ok())
}

fn is_ptr(a: &TpArg) -> bool {
    matches!(a, TpArg::Ptr(_))
}

fn points_to(a: &TpArg, name: &str) -> bool {
    matches!(a, TpArg::Ptr(Some(n)) if n == name)
}

pub fn from_args(
    submit: &[TpArg],
    complete: &[TpArg],
    file_get: Option<&[TpArg]>,
    req: ReqOffsets,
) -> Option<UringLayout> {
    let mut l = UringLayout { on: 1, ..Default::default() };
    if submit.first().is_some_and(|a| points_to(a, "io_kiocb")) {
        l.submit_req = 1;
        l.req_ctx = req.ctx?;
        l.req_opcode = req.opcode?;
        l.req_user_data = req.user_data?;
        l.req_fd = req.fd?;
        l.req_flags = req.flags?;
    } else {
        l.submit_ctx = find(submit, 0, is_ptr)?;
        l.submit_opcode = find(submit, 0, |a| *a == TpArg::Int(1))?;
        l.submit_user_data = find(submit, 0, |a| *a == TpArg::Int(8))?;
        let file_get = file_get?;
        l.file_ctx = find(file_get, 0, is_ptr)?;
        l.file_fd = find(file_get, 0, |a| *a == TpArg::Int(4))?;
    }
    l.complete_ctx = find(complete, 0, is_ptr)?;
    if let Some(cqe) = find(complete, 0, |a| points_to(a, "io_uring_cqe")) {
        l.complete_cqe = 1;
        l.complete_user_data = cqe;
    } else {
        l.complete_user_data = find(complete, 0, |a| *a == TpArg::Int(8))?;
        l.complete_res =
            find(complete, usize::from(l.complete_user_data) + 1, |a| matches!(a, TpArg::Int(4 | 8)))?;
    }
    Some(l)
}

/// The layout for this kernel's tracepoints, where it has them and their
/// layout is known (docs/KERNELS.md); the default (`on == 0`) else.
pub fn layout_here(tracefs: &Tracefs, btf: &KernelBtf) -> UringLayout {
    submit_here(tracefs)
        .filter(|_| tracefs.has("io_uring", COMPLETE))
        .and_then(|submit| layout(btf, submit))
        .unwrap_or_default()
}

/// The submission tracepoint this kernel has.
fn submit_here(tracefs: &Tracefs) -> Option<&'static str> {
    SUBMIT.iter().copied().find(|e| tracefs.has("io_uring", e))
}

/// Loads and attaches the family where `layout` is on.
pub fn load(ebpf: &mut Ebpf, tracefs: &Tracefs, layout: &UringLayout) -> Result<(), CaptureError> {
    if layout.on == 0 {
        return Ok(());
    }
    let submit = submit_here(tracefs).unwrap_or(SUBMIT[0]);
    program(ebpf, names::URING_SUBMIT, RawTracePoint::load)?.attach(submit).map_err(load_err)?;
    program(ebpf, names::URING_COMPLETE, RawTracePoint::load)?.attach(COMPLETE).map_err(load_err)?;
    if layout.submit_req == 0 {
        program(ebpf, names::URING_FILE_GET, RawTracePoint::load)?.attach(FILE_GET).map_err(load_err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ptr(name: &str) -> TpArg {
        TpArg::Ptr(Some(name.to_string()))
    }
    const VOID: TpArg = TpArg::Ptr(None);
    const U8: TpArg = TpArg::Int(1);
    const U32: TpArg = TpArg::Int(4);
    const U64: TpArg = TpArg::Int(8);

    fn req() -> ReqOffsets {
        ReqOffsets { ctx: Some(8), opcode: Some(40), user_data: Some(64), fd: Some(76), flags: Some(48) }
    }

    #[test]
    fn kernel_5_10_passes_fields_as_arguments() {
        let l = from_args(
            &[VOID, U8, U64, U8, U8],
            &[VOID, U64, U32, U32],
            Some(&[VOID, U32]),
            ReqOffsets::default(),
        )
        .unwrap();
        assert_eq!((l.submit_req, l.submit_ctx, l.submit_opcode, l.submit_user_data), (0, 0, 1, 2));
        assert_eq!((l.file_ctx, l.file_fd), (0, 1));
        assert_eq!((l.complete_cqe, l.complete_ctx, l.complete_user_data, l.complete_res), (0, 0, 1, 2));
        // Without io_uring_file_get the descriptor is unknown: not followed.
        assert!(from_args(&[VOID, U8, U64, U8, U8], &[VOID, U64, U32, U32], None, req()).is_none());
    }

    #[test]
    fn kernel_6_1_passes_the_request() {
        let l = from_args(
            &[ptr("io_kiocb"), U8],
            &[VOID, VOID, U64, U32, U32, U64, U64],
            Some(&[ptr("io_kiocb"), U32]),
            req(),
        )
        .unwrap();
        assert_eq!((l.submit_req, l.req_ctx, l.req_opcode, l.req_user_data, l.req_fd), (1, 8, 40, 64, 76));
        assert_eq!((l.complete_cqe, l.complete_ctx, l.complete_user_data, l.complete_res), (0, 0, 2, 3));
        // A request without a descriptor field: not followed.
        let no_fd = ReqOffsets { fd: None, ..req() };
        assert!(
            from_args(&[ptr("io_kiocb"), U8], &[VOID, VOID, U64, U32, U32, U64, U64], None, no_fd).is_none()
        );
    }

    #[test]
    fn kernel_6_3_on_posts_the_cqe() {
        let l = from_args(&[ptr("io_kiocb")], &[ptr("io_ring_ctx"), VOID, ptr("io_uring_cqe")], None, req())
            .unwrap();
        assert_eq!((l.complete_cqe, l.complete_ctx, l.complete_user_data), (1, 0, 2));
    }

    /// This kernel's io_uring tracepoints, where it has BTF and io_uring.
    #[test]
    fn finds_this_kernels_layout() {
        let Ok(btf) = KernelBtf::open() else { return };
        let Some(submit) = SUBMIT.iter().find(|s| btf.tracepoint_args(s).is_some()) else { return };
        let l = layout(&btf, submit).expect("a layout for this kernel's io_uring tracepoints");
        assert_eq!(l.on, 1);
    }
}
