//! The syscall hooks as BPF trampolines: fentry/fexit programs on the
//! hooked syscalls' own entry functions (`__x64_sys_read` and so on, whose
//! one argument is the task's `struct pt_regs *`, the pointer the raw
//! syscall tracepoints hand over too). Only callers of these functions run
//! them: no other syscall of the machine goes through a slow path or a
//! program. The agent loads each program against its function
//! (`FEntry::load(function, btf)`) and falls back to the raw tracepoints
//! of syscalls.rs where the kernel refuses.
//!
//! What a call does to the slot and the maps is `syscalls::enter`/`exit`,
//! as for the raw tracepoints; only where `what`, the registers and the
//! return value come from differs. Each program serves one function (a
//! trampoline program is loaded for one attach target), hence one program
//! per function and side:
//! - the read family: fentry (the read in flight, and its start when it is
//!   timed) and fexit (the bytes);
//! - the write family and openat: fexit alone, which still sees the
//!   arguments (the saved registers do not change) and the result: the
//!   entry would only record what the exit can read itself;
//! - close: fentry alone (the descriptor is retired before the number can
//!   be reused).
//!
//! Program names are what the agent's table (capture/backend.rs) names.
use aya_ebpf::{
    macros::{fentry, fexit},
    programs::{FEntryContext, FExitContext},
};
use stall_common::hook;

use crate::{
    config,
    running::tracked_slot,
    syscalls::{enter, exit},
};

/// Entry of a hooked function: `regs` is its `struct pt_regs *` argument.
#[inline(always)]
fn on_entry(regs: u64, what: u8) -> i32 {
    let cfg = config();
    if cfg.floor != 0 {
        return 0;
    }
    if let Some(s) = tracked_slot(&cfg, regs) {
        enter(&cfg, s, what, regs);
    }
    0
}

/// Return of a function whose entry ran `on_entry`.
#[inline(always)]
fn on_exit(regs: u64, ret: i64) -> i32 {
    let cfg = config();
    if cfg.floor != 0 {
        return 0;
    }
    if let Some(s) = tracked_slot(&cfg, regs) {
        exit(&cfg, s, ret);
    }
    0
}

/// Return of a function hooked at its exit only: its entry and exit at once.
#[inline(always)]
fn on_return(regs: u64, ret: i64, what: u8) -> i32 {
    let cfg = config();
    if cfg.floor != 0 {
        return 0;
    }
    if let Some(s) = tracked_slot(&cfg, regs) {
        enter(&cfg, s, what, regs);
        exit(&cfg, s, ret);
    }
    0
}

macro_rules! entries {
    ($($name:ident => $what:expr),* $(,)?) => {$(
        #[fentry]
        pub fn $name(ctx: FEntryContext) -> i32 {
            on_entry(ctx.arg(0), $what)
        }
    )*};
}

macro_rules! exits {
    ($($name:ident),* $(,)?) => {$(
        #[fexit]
        pub fn $name(ctx: FExitContext) -> i32 {
            // One argument: the return value is the next slot.
            on_exit(ctx.arg(0), ctx.arg(1))
        }
    )*};
}

macro_rules! returns {
    ($($name:ident => $what:expr),* $(,)?) => {$(
        #[fexit]
        pub fn $name(ctx: FExitContext) -> i32 {
            on_return(ctx.arg(0), ctx.arg(1), $what)
        }
    )*};
}

entries! {
    fentry_read => hook::READ,
    fentry_pread64 => hook::READ,
    fentry_readv => hook::READ,
    fentry_preadv => hook::READ,
    fentry_preadv2 => hook::READ,
    fentry_close => hook::CLOSE,
}

exits! { fexit_read, fexit_pread64, fexit_readv, fexit_preadv, fexit_preadv2 }

returns! {
    fexit_write => hook::WRITE,
    fexit_pwrite64 => hook::WRITE,
    fexit_writev => hook::WRITE,
    fexit_pwritev => hook::WRITE,
    fexit_pwritev2 => hook::WRITE,
    fexit_openat => hook::OPENAT,
}
