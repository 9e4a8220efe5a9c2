//! stall's kernel side.
//!
//! Every program starts with the target filter; all but the syscall
//! trampolines are raw tracepoint programs (never skipped while another
//! tracing program or a `bpf()` syscall holds the CPU's `bpf_prog_active`;
//! trampolines have per-program recursion guards too). The scheduler and task
//! programs look the current tid up in `THREADS` (plus, in cgroup mode, the
//! current cgroup id in `CGROUPS`), except for threads already known not to
//! be ours (`UNTRACKED`, see untracked.rs): the rest of the machine's
//! switches and wakeups cost array reads only. The syscall programs (raw tracepoints
//! that run for every syscall of the machine, or fentry/fexit trampolines
//! on the hooked syscalls' functions, whichever the kernel allows: see
//! syscalls/trampoline.rs), check the per-CPU slot (`CPU_SLOT`) that
//! `sched_switch` filled for the task it switched in (see running.rs): no
//! hash lookup per syscall. Tracked threads are aggregated in place
//! (per-thread counters in `THREADS`, per-descriptor counters in `FILES`,
//! waker counts in `WAKES`); only what must be seen one by one (opens, task
//! creation, exec, exit, close) goes through the `EVENTS` ring buffer.
//! Anything dropped is counted by cause in `COUNTERS`.
#![no_std]
#![no_main]
// BPF inline asm (atomic add) is behind this gate; the build sets RUSTC_BOOTSTRAP.
#![feature(asm_experimental_arch)]

mod diag;
mod gpu;
mod kread;
mod maps;
mod pagecache;
mod running;
mod sched;
mod syscalls;
mod timeline;
mod untracked;
mod uring;

use core::mem::MaybeUninit;

use aya_ebpf::helpers::{
    bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns,
};
use stall_common::{counter, zeroed_in, Config, EventHeader, ThreadStats};

use crate::maps::{CGROUPS, COUNTERS, THREADS};

/// Written by the agent at load time (`EbpfLoader::override_global`).
// SAFETY: no other symbol of the object is named `CONFIG`, and it must keep
// this name: the agent finds the global by it (`stall_common::names::CONFIG`).
#[unsafe(no_mangle)]
// SAFETY: `Config` is `repr(C)` and holds only integers (and structs of
// integers), for which all-zero bytes are a valid value.
static CONFIG: Config = unsafe { core::mem::zeroed() };

/// The config as loaded. The address passes through a volatile read so
/// that the compiler cannot fold the zeroes it sees at build time (the
/// verifier folds the frozen values instead), and each program loads only
/// the fields it uses: a volatile copy of the whole struct cost every run
/// of every program some sixty loads before its first check.
#[inline(always)]
pub(crate) fn config() -> &'static Config {
    let at: *const Config = &raw const CONFIG;
    // SAFETY: `at` is a local, so the volatile read is of valid, aligned
    // memory and yields `&raw const CONFIG` again: an aligned pointer to an
    // initialised static that nothing writes while programs run (the agent
    // sets it before load, and aya freezes the `.rodata` map that holds it).
    unsafe { &*core::ptr::read_volatile(&at) }
}

/// The header every ring-buffer record starts with.
#[inline(always)]
pub(crate) fn header(kind: u32, tid: u32, tgid: u32, job: u32, ts: u64) -> EventHeader {
    EventHeader { kind, tid, tgid, job, ts }
}

/// The current task's name. aya's `bpf_get_current_comm` zeroes its buffer
/// first, which LLVM makes a byte loop; the helper itself writes all of it
/// (the name padded with zeros, or zeros where it fails).
#[inline(always)]
pub(crate) fn current_comm() -> [u8; stall_common::COMM_LEN] {
    let mut comm = MaybeUninit::<[u8; stall_common::COMM_LEN]>::uninit();
    // SAFETY: the helper takes a buffer and its size, and fills every byte
    // of it whatever it returns; any bytes are a valid `[u8; N]`.
    unsafe {
        aya_ebpf::helpers::generated::bpf_get_current_comm(
            comm.as_mut_ptr().cast(),
            stall_common::COMM_LEN as u32,
        );
        comm.assume_init()
    }
}

/// `bpf_rdonly_cast(at, <type>)`, by its placeholders (see
/// `stall_common::kfunc`; `type_placeholder` is one of its `*_TYPE`s): a
/// pointer whose fields of that kernel type are read by plain loads, which
/// the verifier checks against the type and makes fault-safe (a fault
/// reads 0). Only in programs the agent loads once it rewrote them.
#[inline(always)]
pub(crate) fn rdonly_cast(at: u64, type_placeholder: i32) -> *const u8 {
    // SAFETY: a call through a constant is how BPF helpers are called; this
    // one's number is the placeholder the agent rewrites into the kfunc's
    // call before load (a program still holding it is never loaded, and a
    // verifier refuses it). The kfunc only returns its first argument.
    unsafe {
        let cast: unsafe extern "C" fn(u64, u32) -> u64 =
            core::mem::transmute(stall_common::kfunc::RDONLY_CAST_CALL as usize);
        cast(at, type_placeholder as u32) as *const u8
    }
}

#[inline(always)]
pub(crate) fn now() -> u64 {
    // SAFETY: takes no arguments and only reads the monotonic clock.
    unsafe { bpf_ktime_get_ns() }
}

#[inline(always)]
pub(crate) fn bump(idx: u32) {
    bump_by(idx, 1);
}

#[inline(always)]
pub(crate) fn bump_by(idx: u32, n: u64) {
    if let Some(p) = COUNTERS.get_ptr_mut(idx) {
        // SAFETY: `p` is non-null and points at this CPU's element of a
        // per-CPU array (the verifier checks the 8-byte access against the
        // value size); no other CPU writes it, and the agent only reads it.
        // A program that interrupts this one on the CPU (`sched_waking` or
        // `uring_complete` in an interrupt, or any program after a preempted
        // trampoline) may bump the same counter between the load and the
        // store: a lost count, not a fault.
        unsafe { *p += n };
    }
}

/// Map update flag: insert only if the key is not there yet.
pub(crate) const BPF_NOEXIST: u64 = 1;
pub(crate) const BPF_ANY: u64 = 0;

/// `lock *(u64 *)(p) += v`: core's atomics are not available on the BPF
/// target, and counters shared by threads of one process need this.
///
/// # Safety
///
/// `p` must point at a writable, 8-byte aligned `u64` for the duration of
/// the call: in practice a field of a map value the caller looked up.
#[inline(always)]
pub(crate) unsafe fn atomic_add(p: *mut u64, v: u64) {
    // SAFETY: the caller guarantees `p`; the instruction is BPF's own atomic
    // add (BPF_ATOMIC | BPF_ADD, 64-bit), which the verifier also checks: it
    // rejects the program unless `p` is a pointer it knows valid for 8 bytes.
    unsafe {
        core::arch::asm!("lock *(u64 *)({0} + 0) += {1}", in(reg) p, in(reg) v);
    }
}

/// Submit flags for a ring-buffer record: no wakeup until enough is waiting.
#[inline(always)]
pub(crate) fn submit_flags(cfg: &Config) -> u64 {
    const BPF_RB_AVAIL_DATA: u64 = 0;
    const BPF_RB_NO_WAKEUP: u64 = 1;
    const BPF_RB_FORCE_WAKEUP: u64 = 2;
    if maps::EVENTS.query(BPF_RB_AVAIL_DATA) >= u64::from(cfg.ringbuf_wake_bytes) {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    }
}

pub(crate) struct Current {
    pub tid: u32,
    pub tgid: u32,
    pub stats: &'static mut ThreadStats,
}

/// The target filter: the current thread's stats if it is tracked.
///
/// In cgroup mode a thread of a watched cgroup that is not in `THREADS` yet
/// is added here, on its first traced event. A task noted as not ours
/// (untracked.rs) costs neither the lookup nor the adoption check.
#[inline(always)]
pub(crate) fn current(cfg: &Config) -> Option<Current> {
    if untracked::known(current_task(), untracked::generations(running::generation())) {
        return None;
    }
    let (tid, tgid) = ids();
    match tracked(tid, tgid) {
        Some(c) => Some(c),
        None => adopt(cfg, tid, tgid),
    }
}

/// The current task, as a plain address (`bpf_get_current_task`, any kernel).
#[inline(always)]
pub(crate) fn current_task() -> u64 {
    // SAFETY: takes no arguments; returns the current task's address, which
    // is only ever read through bpf_probe_read_kernel.
    unsafe { bpf_get_current_task() }
}

#[inline(always)]
pub(crate) fn ids() -> (u32, u32) {
    let pid_tgid = bpf_get_current_pid_tgid();
    (pid_tgid as u32, (pid_tgid >> 32) as u32)
}

/// The current thread, if it is in `THREADS`.
#[inline(always)]
pub(crate) fn tracked(tid: u32, tgid: u32) -> Option<Current> {
    let p = THREADS.get_ptr_mut(tid)?;
    bump(counter::EVENTS);
    // SAFETY: `p` is the non-null value pointer of the thread's `THREADS`
    // entry; the verifier bounds-checks every access through it. The map is
    // preallocated, so the element stays valid memory for the program's run
    // even if it is deleted meanwhile (then recycled: a miscount, never a
    // fault). Its other writers are the programs of the same thread, which
    // runs on one CPU at a time, `sched_waking` on another CPU (`wake_ts`
    // and `wakeups`, while the entry says off-CPU) and the agent's seeding:
    // races cost accuracy, not memory safety.
    Some(Current { tid, tgid, stats: unsafe { &mut *p } })
}

/// Cgroup mode: the job of the current thread's cgroup, if it is watched.
/// A helper call and one lookup in a small map: the cheapest "not ours".
#[inline(always)]
pub(crate) fn watched_job(cfg: &Config, tid: u32) -> Option<u32> {
    if cfg.cgroup_filter == 0 || tid == 0 {
        return None;
    }
    // SAFETY: takes no arguments; reads the current task's cgroup id.
    let cgid = unsafe { bpf_get_current_cgroup_id() };
    // SAFETY: `get` is unsafe because another writer may change or delete
    // the entry while the reference lives (the map is preallocated, so a
    // deleted element can be reused); the value is copied at once, and only
    // the agent writes this map.
    unsafe { CGROUPS.get(cgid) }.copied()
}

/// Cgroup mode: starts tracking the current thread if its cgroup is watched.
#[inline(always)]
pub(crate) fn adopt(cfg: &Config, tid: u32, tgid: u32) -> Option<Current> {
    let job = watched_job(cfg, tid)?;
    adopt_into(cfg, tid, tgid, job)
}

/// Starts tracking the current thread as one of job `job`'s.
#[inline(always)]
pub(crate) fn adopt_into(cfg: &Config, tid: u32, tgid: u32, job: u32) -> Option<Current> {
    let (exec, delay) = sched::kernel_totals(current_task(), cfg);
    let mut at = MaybeUninit::<ThreadStats>::uninit();
    let fresh = zeroed_in(&mut at);
    fresh.tgid = tgid;
    fresh.job = job;
    fresh.off_nr = -1;
    fresh.other_nr = -1;
    fresh.kclock = sched::kclock_flags(cfg);
    (fresh.exec_base, fresh.exec_ns) = (exec, exec);
    (fresh.delay_base, fresh.delay_ns) = (delay, delay);
    // Never reset a thread another CPU inserted meanwhile.
    if THREADS.insert(tid, &*fresh, BPF_NOEXIST).is_err() && THREADS.get_ptr(tid).is_none() {
        bump(counter::LOST_THREAD_MAP);
        return None;
    }
    untracked::forget(current_task());
    tracked(tid, tgid)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

// SAFETY: "license" is the section the loader reads the licence string
// from; it holds only this byte array, and nothing executes from it.
#[unsafe(link_section = "license")]
// SAFETY: no other symbol of the object is named `LICENSE`.
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
