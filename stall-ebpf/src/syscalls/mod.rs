//! File reads and writes, on the raw syscall tracepoints: the open family
//! (open, openat, openat2, creat) names a descriptor and the dup family
//! (dup, dup2, dup3, fcntl F_DUPFD) copies it, the read family (read,
//! pread64, readv, preadv, preadv2, and sendfile, splice, copy_file_range
//! from it) counts bytes, calls and latency on it, the write family (write,
//! pwrite64, writev, pwritev, pwritev2, and sendfile, splice,
//! copy_file_range into it) bytes and calls (progress signals: a log or a
//! checkpoint growing), `close` retires it.
//!
//! Two backends feed the same `enter`/`exit` below; they differ only in how
//! they learn the syscall, its registers and its return value. This file's
//! raw tracepoints run for every syscall of the machine (and attaching
//! them puts every task on the kernel's slow syscall path);
//! `trampoline.rs` hooks the hooked syscalls' own entry functions with
//! fentry/fexit, which costs nothing to any other syscall.
//!
//! `raw_syscalls:sys_enter`/`sys_exit` rather than one `syscalls:*` event
//! per syscall: the per-syscall events cost a perf record per call (about
//! twice the floor here), while a raw tracepoint hands the program the
//! registers. Both run for every syscall of the machine, so the first
//! check is the number's entry in the configuration's table (one load;
//! the plain exit looks at the per-CPU slot first), then the slot: an
//! untracked task never reaches a hash map.
mod trampoline;

use core::mem::MaybeUninit;

use aya_ebpf::{
    helpers::{
        bpf_get_smp_processor_id, bpf_probe_read_kernel, bpf_probe_read_user, bpf_probe_read_user_buf,
        generated::bpf_probe_read_user_str,
    },
    macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use stall_common::{
    counter, event_kind, fd_kind, hook, inflight, kfunc, zeroed_in, CloseEvent, Config, CpuSlot, FdKey,
    FileStats, OpenEvent, Regs, PATH_LEN,
};

use crate::{
    bump, config, header,
    maps::{EVENTS, FILES, FILE_SEQ},
    now,
    running::{count_read, count_write, time_this_read, tracked_slot, uncache_fd},
    submit_flags,
};

#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn sys_enter(ctx: RawTracePointContext) -> i32 {
    let cfg = config();
    if cfg.floor != 0 {
        return 0;
    }
    let what = cfg.tables.hook(ctx.arg(1));
    if what == hook::NONE {
        return 0;
    }
    let regs: u64 = ctx.arg(0);
    if let Some(s) = tracked_slot(&cfg, regs) {
        enter(&cfg, s, what, regs);
    }
    0
}

#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn sys_exit(ctx: RawTracePointContext) -> i32 {
    let cfg = config();
    if cfg.floor != 0 {
        return 0;
    }
    let regs: u64 = ctx.arg(0);
    if let Some(s) = tracked_slot(cfg, regs) {
        // Most returns of a tracked task end nothing `enter` recorded
        // (futex, poll, mmap...): they read no register, a helper call.
        if s.inflight == inflight::NONE {
            return 0;
        }
        let (nr, arg0) = nr_and_arg0(regs, &cfg.regs);
        exit(cfg, s, cfg.tables.hook(nr), regs, ctx.arg(1), arg0);
    }
    0
}

/// `sys_exit` loading the registers through `bpf_rdonly_cast` (6.2; the
/// agent rewrites its placeholder, `stall_common::kfunc`, and loads this
/// one where the kernel takes it): plain loads in place of the one helper
/// call per traced return, which is most of what a traced read costs where
/// calls are dear (retpolines, AMD's safe-RET). The number being that
/// cheap, an unhooked call (futex, poll, any task's) returns before the
/// slot is looked at, as at the entry: a task that switches often asks
/// nothing else, where its first return after a switch-in would otherwise
/// ask its thread id to recognise its slot.
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn sys_exit_cast(ctx: RawTracePointContext) -> i32 {
    let cfg = config();
    if cfg.floor != 0 {
        return 0;
    }
    let regs: u64 = ctx.arg(0);
    let (nr, arg0) = nr_and_arg0_cast(regs);
    let hooked = cfg.tables.hook(nr);
    if hooked == hook::NONE {
        return 0;
    }
    if let Some(s) = tracked_slot(cfg, regs) {
        if s.inflight == inflight::NONE {
            return 0;
        }
        exit(cfg, s, hooked, regs, ctx.arg(1), arg0);
    }
    0
}

/// `nr_and_arg0` by plain loads through a cast of the register pointer:
/// the verifier makes them fault-safe (a fault reads 0) and checks them
/// against `struct pt_regs`, at offsets it must know, x86-64's.
#[inline(always)]
fn nr_and_arg0_cast(regs: u64) -> (i64, Option<u64>) {
    let at = crate::rdonly_cast(regs, kfunc::PT_REGS_TYPE);
    // SAFETY: the verifier turns loads through the pointer `bpf_rdonly_cast`
    // returns into fault-checked ones (`BPF_PROBE_MEM`) after checking each
    // is a field of `struct pt_regs`; any 8 bytes are a `u64`.
    unsafe {
        let arg0 = core::ptr::read_volatile(at.add(kfunc::X86_64_ARG0).cast::<u64>());
        let nr = core::ptr::read_volatile(at.add(kfunc::X86_64_NR).cast::<u64>());
        (nr as i64, Some(arg0))
    }
}

/// The syscall number and first argument in the saved registers: one read
/// where they are neighbours (`orig_ax` after `di` on x86-64).
#[inline(always)]
fn nr_and_arg0(regs: u64, r: &Regs) -> (i64, Option<u64>) {
    if u32::from(r.arg0) + 8 == u32::from(r.nr) {
        // SAFETY: bpf_probe_read_kernel checks the address (the saved
        // registers plus an offset from the agent); a fault returns an
        // error, never a crash. Any 16 bytes are a valid `[u64; 2]`.
        return match unsafe { bpf_probe_read_kernel((regs + u64::from(r.arg0)) as *const [u64; 2]) } {
            Ok([arg0, nr]) => (nr as i64, Some(arg0)),
            Err(_) => (-1, None),
        };
    }
    (reg(regs, r.nr).map_or(-1, |v| v as i64), reg(regs, r.arg0))
}

/// What the entry of a hooked syscall does to the current task's slot:
/// `what` is its `hook` kind, `regs` the task's saved user registers (its
/// arguments). Shared by both backends: the raw tracepoint finds `what`
/// from the syscall number, a trampoline knows it from the function it
/// is attached to.
#[inline(always)]
pub(crate) fn enter(cfg: &Config, s: &mut CpuSlot, what: u8, regs: u64) {
    let r = &cfg.regs;
    s.events += 1;
    // The hot calls first: their descriptor is read at their return.
    match what {
        hook::READ | hook::COPY => return reading(s, cfg, inflight::FD_IN_REGS),
        hook::WRITE => {
            s.inflight = inflight::tag(inflight::WRITE, s.gen);
            s.inflight_fd = inflight::FD_IN_REGS;
            return;
        }
        _ => {}
    }
    let Some(arg0) = reg(regs, r.arg0) else {
        return;
    };
    match what {
        hook::SENDFILE => reading(s, cfg, reg(regs, r.arg1).unwrap_or(u64::MAX) as i32),
        hook::OPENAT => {
            let flags = reg(regs, r.arg2).unwrap_or(0) as u32;
            opening(s, arg0 as i32, reg(regs, r.arg1).unwrap_or(0), flags);
        }
        hook::OPEN => opening(s, AT_FDCWD, arg0, reg(regs, r.arg1).unwrap_or(0) as u32),
        hook::CREAT => opening(s, AT_FDCWD, arg0, O_CREAT_WRONLY_TRUNC),
        hook::OPENAT2 => {
            // struct open_how starts with its u64 flags.
            let how = reg(regs, r.arg2).unwrap_or(0);
            // SAFETY: bpf_probe_read_user checks the user address the task
            // passed (any value, even 0 or garbage); a fault returns an
            // error, read as 0, never a crash. Any 8 bytes are a `u64`.
            let flags = unsafe { bpf_probe_read_user(how as *const u64) }.unwrap_or(0) as u32;
            opening(s, arg0 as i32, reg(regs, r.arg1).unwrap_or(0), flags);
        }
        hook::DUP => duplicating(s, arg0 as i32),
        hook::FCNTL => {
            let cmd = reg(regs, r.arg1).unwrap_or(0);
            if cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC {
                duplicating(s, arg0 as i32);
            }
        }
        hook::CONNECT => {
            s.inflight = inflight::tag(inflight::CONNECT, s.gen);
            s.inflight_fd = arg0 as i32;
            s.inflight_ptr = reg(regs, r.arg1).unwrap_or(0);
        }
        hook::CLOSE => close(cfg, s, arg0 as i32),
        _ => {}
    }
}

/// What the return of a hooked syscall does: counts what `enter` recorded
/// with the syscall's return value `ret`. `hooked` is the `hook` kind of
/// the syscall returning, `regs` its saved registers, `arg0` their first
/// argument if the caller read it already. Shared by both backends.
#[inline(always)]
pub(crate) fn exit(cfg: &Config, s: &mut CpuSlot, hooked: u8, regs: u64, ret: i64, arg0: Option<u64>) {
    let what = inflight::kind(s.inflight, s.gen);
    if what == inflight::NONE {
        s.inflight = inflight::NONE;
        return;
    }
    // The return must be of the call that was entered: a stale in-flight
    // mark (its exit never seen on this slot) would otherwise count, say, a
    // futex wake's return of 1 as a 1-byte read.
    if !hook::completes(hooked, what) {
        s.inflight = inflight::NONE;
        return;
    }
    s.events += 1;
    if s.inflight_fd == inflight::FD_IN_REGS {
        s.inflight_fd = arg0.or_else(|| reg(regs, cfg.regs.arg0)).map_or(-1, |v| v as i32);
    }
    if what == inflight::READ {
        let timed = if s.inflight_ts != 0 {
            Some((now().saturating_sub(s.inflight_ts), s.inflight_kind))
        } else {
            None
        };
        let bytes = if ret > 0 { ret as u64 } else { 0 };
        count_read(s, bytes, timed);
        // What sendfile, splice and copy_file_range read, they wrote.
        let out = match hooked {
            hook::SENDFILE => reg(regs, cfg.regs.arg0),
            hook::COPY => reg(regs, cfg.regs.arg2),
            _ => None,
        };
        if let Some(out) = out {
            s.inflight_fd = out as i32;
            count_write(s, bytes);
        }
    } else if what == inflight::WRITE {
        count_write(s, if ret > 0 { ret as u64 } else { 0 });
    } else if what == inflight::OPEN {
        s.inflight = inflight::NONE;
        if ret >= 0 {
            // A directory is no file, known now: the agent need not
            // rewrite its entry (a rewrite can race the number's reuse).
            let kind = if s.inflight_kind & O_DIRECTORY != 0 { fd_kind::OTHER } else { fd_kind::UNKNOWN };
            opened(cfg, s, ret as i32, -1, kind);
        }
    } else if what == inflight::DUP {
        s.inflight = inflight::NONE;
        // dup2(fd, fd) returns fd and changes nothing.
        if ret >= 0 && ret as i32 != s.inflight_fd {
            duplicated(cfg, s, s.inflight_fd, ret as i32);
        }
    } else if what == inflight::CONNECT {
        s.inflight = inflight::NONE;
        // A non-blocking connect is under way once it says EINPROGRESS.
        if ret == 0 || ret == -EINPROGRESS {
            connected(cfg, s, s.inflight_fd, s.inflight_ptr);
        }
    }
}

/// A syscall argument (or any word) at `off` in the saved registers.
#[inline(always)]
fn reg(regs: u64, off: u16) -> Option<u64> {
    // SAFETY: bpf_probe_read_kernel checks the address (the saved registers
    // plus an offset from the agent); a fault returns an error (None), never
    // a crash. Any 8 bytes are a valid `u64`.
    unsafe { bpf_probe_read_kernel((regs + u64::from(off)) as *const u64) }.ok()
}

const AT_FDCWD: i32 = -100;
const EINPROGRESS: i64 = 115;
const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;
/// `sizeof(struct sockaddr_in6)`, the larger of the two.
const SOCKADDR_LEN: usize = 28;
const O_CREAT_WRONLY_TRUNC: u32 = 0o1101;
const O_DIRECTORY: u32 = 0o200000;
const F_DUPFD: u64 = 0;
const F_DUPFD_CLOEXEC: u64 = 1030;

/// A read-family call entered on `fd`; a sample of them is timed
/// (`time_this_read`).
#[inline(always)]
fn reading(s: &mut CpuSlot, cfg: &Config, fd: i32) {
    s.inflight = inflight::tag(inflight::READ, s.gen);
    s.inflight_fd = fd;
    match time_this_read(s, cfg) {
        Some(weight) => {
            s.inflight_kind = weight;
            s.inflight_ts = now();
        }
        None => s.inflight_ts = 0,
    }
}

/// A dup-family call entered: the copy will name what `fd` names.
#[inline(always)]
fn duplicating(s: &mut CpuSlot, fd: i32) {
    s.inflight = inflight::tag(inflight::DUP, s.gen);
    s.inflight_fd = fd;
}

/// An open-family call entered: where its path is relative to, the path
/// (user memory, read at exit) and its flags.
#[inline(always)]
fn opening(s: &mut CpuSlot, dfd: i32, path: u64, flags: u32) {
    s.inflight = inflight::tag(inflight::OPEN, s.gen);
    s.inflight_fd = dfd;
    s.inflight_ptr = path;
    s.inflight_kind = flags;
}

/// `fd` now names the same open as `old`: a new entry of the same kind (a
/// file read through either is a file read), announced with no path.
#[inline(always)]
fn duplicated(cfg: &Config, s: &mut CpuSlot, old: i32, fd: i32) {
    // SAFETY: `get` is unsafe because another CPU may change or delete the
    // entry while the reference lives (a preallocated element can be
    // reused); one field is copied at once.
    let kind = unsafe { FILES.get(FdKey { tgid: s.tgid, fd: old }) }.map(|f| f.kind);
    match kind {
        Some(kind) => opened(cfg, s, fd, old, kind),
        // Not a descriptor stall follows: only what the new number named
        // before (dup2 closes it) is retired.
        None => close(cfg, s, fd),
    }
}

/// A new `FILES` entry of `kind` for `fd`; its file id.
#[inline(always)]
fn new_entry(cfg: &Config, s: &mut CpuSlot, fd: i32, kind: u32) -> u64 {
    let key = FdKey { tgid: s.tgid, fd };
    uncache_fd(s, fd);
    // An entry still there for this number (closed without `close`: dup2,
    // close_range, exec; or seeded by the agent a moment ago) is retired
    // with its counts before the new open replaces it.
    // SAFETY: as in `duplicated`: the value is copied at once.
    if let Some(old) = unsafe { FILES.get(key) }.copied() {
        emit_close(cfg, s, fd, old);
    }
    let file_id = next_file_id();
    let mut at = MaybeUninit::<FileStats>::uninit();
    let stats = zeroed_in(&mut at);
    (stats.file_id, stats.kind) = (file_id, kind);
    if FILES.insert(key, &*stats, 0).is_err() {
        bump(counter::LOST_FD_MAP);
        crate::diag::map_full(counter::LOST_FD_MAP);
    }
    file_id
}

/// `fd`, a socket, was connected to the peer at `addr` (user memory): an
/// inet one is followed per descriptor, announced with the peer's address.
#[inline(always)]
fn connected(cfg: &Config, s: &mut CpuSlot, fd: i32, addr: u64) {
    // SAFETY: bpf_probe_read_user checks the user address the task passed
    // (any value); a fault returns an error, never a crash. Any 2 bytes
    // are a `u16`.
    let family = unsafe { bpf_probe_read_user(addr as *const u16) }.unwrap_or(0);
    if family != AF_INET && family != AF_INET6 {
        return;
    }
    let file_id = new_entry(cfg, s, fd, fd_kind::SOCKET);
    let Some(mut e) = EVENTS.reserve::<OpenEvent>(0) else {
        bump(counter::LOST_RINGBUF);
        return;
    };
    let ev = e.as_mut_ptr();
    // SAFETY: as in `opened`: `ev` is the record reserved above, ours until
    // submitted; bpf_probe_read_user_buf writes exactly `SOCKADDR_LEN`
    // bytes into `path` (longer) and checks the user address.
    unsafe {
        (*ev).hdr = header(event_kind::CONNECT, s.tid, s.tgid, s.job, now());
        (*ev).file_id = file_id;
        (*ev).fd = fd;
        (*ev).dfd = -1;
        (*ev).flags = 0;
        (*ev).dup_of = -1;
        (*ev)._pad = 0;
        let read = bpf_probe_read_user_buf(addr as *const u8, &mut (&mut (*ev).path)[..SOCKADDR_LEN]);
        (*ev).path_len = if read.is_ok() { SOCKADDR_LEN as i32 } else { -1 };
    }
    e.submit(submit_flags(cfg));
}

/// `fd` was opened (`dup_of` -1), or made a copy of `dup_of`.
#[inline(always)]
fn opened(cfg: &Config, s: &mut CpuSlot, fd: i32, dup_of: i32, kind: u32) {
    let file_id = new_entry(cfg, s, fd, kind);
    let Some(mut e) = EVENTS.reserve::<OpenEvent>(0) else {
        bump(counter::LOST_RINGBUF);
        return;
    };
    let ev = e.as_mut_ptr();
    // SAFETY: `ev` points at the record reserved above: `size_of::<OpenEvent>()`
    // bytes of ring buffer, 8-byte aligned, ours alone until submitted (the
    // verifier bounds-checks each store against the reservation). Fields are
    // assigned through the raw pointer (all `Copy`, nothing is dropped), and
    // `ev` is not used after `submit`. bpf_probe_read_user_str writes at most
    // `PATH_LEN` bytes, the size of `path`, and checks the user address: a
    // fault returns a negative errno, never a crash.
    unsafe {
        (*ev).hdr = header(event_kind::OPEN, s.tid, s.tgid, s.job, now());
        (*ev).file_id = file_id;
        (*ev).fd = fd;
        (*ev).dfd = s.inflight_fd;
        (*ev).flags = s.inflight_kind;
        (*ev).dup_of = dup_of;
        (*ev)._pad = 0;
        if dup_of >= 0 {
            (*ev).path_len = 0;
            (*ev).path[0] = 0;
            e.submit(submit_flags(cfg));
            return;
        }
        let n = bpf_probe_read_user_str(
            (*ev).path.as_mut_ptr().cast(),
            PATH_LEN as u32,
            s.inflight_ptr as *const _,
        );
        (*ev).path_len = n as i32;
        if n < 0 {
            bump(counter::LOST_PATH);
        }
    }
    e.submit(submit_flags(cfg));
}

#[inline(always)]
fn close(cfg: &Config, s: &mut CpuSlot, fd: i32) {
    uncache_fd(s, fd);
    let key = FdKey { tgid: s.tgid, fd };
    // SAFETY: as in `duplicated`: the value is copied at once, before the
    // entry is removed.
    let Some(stats) = (unsafe { FILES.get(key) }).copied() else {
        return;
    };
    let _ = FILES.remove(key);
    emit_close(cfg, s, fd, stats);
}

#[inline(always)]
fn emit_close(cfg: &Config, s: &CpuSlot, fd: i32, stats: FileStats) {
    match EVENTS.reserve::<CloseEvent>(0) {
        Some(mut e) => {
            e.write(CloseEvent {
                hdr: header(event_kind::CLOSE, s.tid, s.tgid, s.job, now()),
                fd,
                _pad: 0,
                stats,
            });
            e.submit(submit_flags(cfg));
        }
        None => bump(counter::LOST_RINGBUF),
    }
}

/// Unique per open: CPU number in the top bits, a per-CPU sequence below.
/// Ids the agent assigns to descriptors found at attach have bit 63 set.
#[inline(always)]
fn next_file_id() -> u64 {
    // SAFETY: takes no arguments; returns the CPU this program runs on.
    let cpu = unsafe { bpf_get_smp_processor_id() } as u64;
    let seq = match FILE_SEQ.get_ptr_mut(0) {
        // SAFETY: `p` is non-null and points at this CPU's element of a
        // per-CPU array (the verifier checks the access against the value
        // size); no other CPU writes it. Only the open paths use it; a
        // trampoline preempted between the increment and the read
        // (preemptible kernels) may share a number: a duplicate id at worst.
        Some(p) => unsafe {
            *p += 1;
            *p
        },
        None => 0,
    };
    ((cpu & 0x7fff) << 48) | (seq & 0xffff_ffff_ffff)
}
