//! File reads: `openat` names a descriptor, the read family counts bytes,
//! calls and latency on it, `close` retires it. One enter and one exit
//! program serve read, pread64, readv, preadv and preadv2 (fd is argument 0
//! of each).
use aya_ebpf::{
    helpers::{bpf_get_smp_processor_id, generated::bpf_probe_read_user_str},
    macros::tracepoint,
    programs::TracePointContext,
};
use stall_common::{
    counter, event_kind, fd_kind, inflight, CloseEvent, Config, FdKey, FileStats, OpenEvent, PATH_LEN,
};

use crate::{
    atomic_add, bump, config, current,
    maps::{EVENTS, FILES, FILE_SEQ},
    now, submit_flags,
    task::header,
};

#[tracepoint]
pub fn sys_enter_read_family(ctx: TracePointContext) -> u32 {
    let cfg = config();
    if cfg.floor != 0 {
        return 0;
    }
    let Some(cur) = current(&cfg) else {
        return 0;
    };
    let fd: u64 = unsafe { ctx.read_at(usize::from(cfg.offsets.sys_arg0)) }.unwrap_or(u64::MAX);
    let t = cur.stats;
    t.inflight = inflight::READ;
    t.inflight_fd = fd as i32;
    t.inflight_ts = now();
    0
}

#[tracepoint]
pub fn sys_exit_read_family(ctx: TracePointContext) -> u32 {
    let cfg = config();
    if cfg.floor != 0 {
        return 0;
    }
    let Some(cur) = current(&cfg) else {
        return 0;
    };
    let t = cur.stats;
    if t.inflight != inflight::READ {
        return 0;
    }
    t.inflight = inflight::NONE;
    let ret: i64 = unsafe { ctx.read_at(usize::from(cfg.offsets.sys_ret)) }.unwrap_or(-1);
    let bytes = if ret > 0 { ret as u64 } else { 0 };
    let lat = now().saturating_sub(t.inflight_ts);
    let key = FdKey { tgid: cur.tgid, fd: t.inflight_fd };
    match FILES.get_ptr_mut(key) {
        Some(f) if unsafe { (*f).kind } != fd_kind::OTHER => {
            // Threads of one process share descriptors: add atomically.
            unsafe {
                atomic_add(&mut (*f).read_bytes, bytes);
                atomic_add(&mut (*f).read_calls, 1);
                atomic_add(&mut (*f).read_ns, lat);
            }
            t.file_read_bytes += bytes;
            t.file_read_calls += 1;
            t.file_read_ns += lat;
        }
        _ => {
            t.other_read_bytes += bytes;
            t.other_read_calls += 1;
            t.other_read_ns += lat;
        }
    }
    0
}

#[tracepoint]
pub fn sys_enter_openat(ctx: TracePointContext) -> u32 {
    let cfg = config();
    if cfg.floor != 0 {
        return 0;
    }
    let Some(cur) = current(&cfg) else {
        return 0;
    };
    let o = &cfg.offsets;
    let t = cur.stats;
    t.inflight = inflight::OPEN;
    t.inflight_fd = unsafe { ctx.read_at::<u64>(usize::from(o.sys_arg0)) }.unwrap_or(0) as i32;
    t.inflight_ptr = unsafe { ctx.read_at::<u64>(usize::from(o.sys_arg1)) }.unwrap_or(0);
    t.inflight_kind = unsafe { ctx.read_at::<u64>(usize::from(o.sys_arg2)) }.unwrap_or(0) as u32;
    t.inflight_ts = now();
    0
}

#[tracepoint]
pub fn sys_exit_openat(ctx: TracePointContext) -> u32 {
    let cfg = config();
    if cfg.floor != 0 {
        return 0;
    }
    let Some(cur) = current(&cfg) else {
        return 0;
    };
    let t = cur.stats;
    if t.inflight != inflight::OPEN {
        return 0;
    }
    t.inflight = inflight::NONE;
    let ret: i64 = unsafe { ctx.read_at(usize::from(cfg.offsets.sys_ret)) }.unwrap_or(-1);
    if ret < 0 {
        return 0;
    }
    let fd = ret as i32;
    let key = FdKey { tgid: cur.tgid, fd };
    // An entry still there for this number (closed without `close`: dup2,
    // close_range, exec; or seeded by the agent a moment ago) is retired
    // with its counts before the new open replaces it.
    if let Some(old) = unsafe { FILES.get(key) }.copied() {
        emit_close(&cfg, cur.tid, cur.tgid, t.job, fd, old);
    }
    let file_id = next_file_id();
    let stats = FileStats { file_id, kind: fd_kind::UNKNOWN, ..Default::default() };
    if FILES.insert(key, stats, 0).is_err() {
        bump(counter::LOST_FD_MAP);
    }
    let Some(mut e) = EVENTS.reserve::<OpenEvent>(0) else {
        bump(counter::LOST_RINGBUF);
        return 0;
    };
    let ev = e.as_mut_ptr();
    unsafe {
        (*ev).hdr = header(event_kind::OPEN, cur.tid, cur.tgid, t.job, now());
        (*ev).file_id = file_id;
        (*ev).fd = fd;
        (*ev).dfd = t.inflight_fd;
        (*ev).flags = t.inflight_kind;
        let n = bpf_probe_read_user_str(
            (*ev).path.as_mut_ptr().cast(),
            PATH_LEN as u32,
            t.inflight_ptr as *const _,
        );
        (*ev).path_len = n as i32;
        if n < 0 {
            bump(counter::LOST_PATH);
        }
    }
    e.submit(submit_flags(&cfg));
    0
}

#[tracepoint]
pub fn sys_enter_close(ctx: TracePointContext) -> u32 {
    let cfg = config();
    if cfg.floor != 0 {
        return 0;
    }
    let Some(cur) = current(&cfg) else {
        return 0;
    };
    let fd: u64 = unsafe { ctx.read_at(usize::from(cfg.offsets.sys_arg0)) }.unwrap_or(u64::MAX);
    let key = FdKey { tgid: cur.tgid, fd: fd as i32 };
    let Some(stats) = (unsafe { FILES.get(key) }).copied() else {
        return 0;
    };
    let _ = FILES.remove(key);
    emit_close(&cfg, cur.tid, cur.tgid, cur.stats.job, fd as i32, stats);
    0
}

#[inline(always)]
fn emit_close(cfg: &Config, tid: u32, tgid: u32, job: u32, fd: i32, stats: FileStats) {
    match EVENTS.reserve::<CloseEvent>(0) {
        Some(mut e) => {
            e.write(CloseEvent { hdr: header(event_kind::CLOSE, tid, tgid, job, now()), fd, _pad: 0, stats });
            e.submit(submit_flags(cfg));
        }
        None => bump(counter::LOST_RINGBUF),
    }
}

/// Unique per open: CPU number in the top bits, a per-CPU sequence below.
/// Ids the agent assigns to descriptors found at attach have bit 63 set.
#[inline(always)]
fn next_file_id() -> u64 {
    let cpu = unsafe { bpf_get_smp_processor_id() } as u64;
    let seq = match FILE_SEQ.get_ptr_mut(0) {
        Some(p) => unsafe {
            *p += 1;
            *p
        },
        None => 0,
    };
    ((cpu & 0x7fff) << 48) | (seq & 0xffff_ffff_ffff)
}
