//! The syscall hooks as BPF trampolines: fentry/fexit programs on the
//! hooked syscalls' own entry functions (`__x64_sys_read` and so on, whose
//! one argument is the task's `struct pt_regs *`, the pointer the raw
//! syscall tracepoints hand over too). Only callers of these functions run
//! them: no other syscall of the machine goes through a slow path or a
//! program. The agent loads each program against its function
//! (`FEntry::load(function, btf)`) and falls back to the raw tracepoints
//! of this family's raw tracepoints (mod.rs) where the kernel refuses.
//!
//! What a call does to the slot and the maps is `syscalls::enter`/`exit`,
//! as for the raw tracepoints; only where `what`, the registers and the
//! return value come from differs. Each program serves one function (a
//! trampoline program is loaded for one attach target), hence one program
//! per function and side:
//! - the read family, recvfrom and recvmsg, and the calls that read a
//!   descriptor into another (sendfile, splice, copy_file_range): fentry
//!   (the read in flight, and its start when it is timed) and fexit (the
//!   bytes);
//! - the write, open and dup families, sendto, sendmsg, connect and fcntl:
//!   fexit alone, which still
//!   sees the arguments (the saved registers do not change, and a path or
//!   `open_how` in user memory is still there) and the result: the entry
//!   would only record what the exit can read itself;
//! - close: fentry alone (the descriptor is retired before the number can
//!   be reused).
//!
//! Program names are what the agent's table (capture/hooks/syscalls.rs) names.
use aya_ebpf::{
    macros::{fentry, fexit},
    programs::{FEntryContext, FExitContext},
};
use stall_common::{hook, Config, CpuSlot};

use super::{enter, exit};
use crate::{config, running::tracked_slot};

/// Runs `f` on the current task's slot when the task is tracked; `regs` is
/// the hooked function's `struct pt_regs *` argument.
#[inline(always)]
fn on_tracked(regs: u64, f: impl FnOnce(&Config, &mut CpuSlot)) -> i32 {
    let cfg = config();
    if cfg.floor == 0 {
        if let Some(s) = tracked_slot(&cfg, regs) {
            f(&cfg, s);
        }
    }
    0
}

macro_rules! entries {
    ($($name:ident => $what:expr),* $(,)?) => {$(
        #[fentry]
        pub fn $name(ctx: FEntryContext) -> i32 {
            let regs: u64 = ctx.arg(0);
            on_tracked(regs, |cfg, s| enter(cfg, s, $what, regs))
        }
    )*};
}

macro_rules! exits {
    ($($name:ident => $what:expr),* $(,)?) => {$(
        #[fexit]
        pub fn $name(ctx: FExitContext) -> i32 {
            // One argument: the return value is the next slot.
            let (regs, ret): (u64, i64) = (ctx.arg(0), ctx.arg(1));
            on_tracked(regs, |cfg, s| exit(cfg, s, $what, regs, ret, None))
        }
    )*};
}

macro_rules! returns {
    ($($name:ident => $what:expr),* $(,)?) => {$(
        #[fexit]
        pub fn $name(ctx: FExitContext) -> i32 {
            // Hooked at its exit only: its entry and exit at once.
            let (regs, ret): (u64, i64) = (ctx.arg(0), ctx.arg(1));
            on_tracked(regs, |cfg, s| {
                enter(cfg, s, $what, regs);
                exit(cfg, s, $what, regs, ret, None);
            })
        }
    )*};
}

// Names are cut to the kernel's 15 characters: copy_file_range is "cfr".
entries! {
    fentry_read => hook::READ,
    fentry_pread64 => hook::READ,
    fentry_readv => hook::READ,
    fentry_preadv => hook::READ,
    fentry_preadv2 => hook::READ,
    fentry_sendfile => hook::SENDFILE,
    fentry_splice => hook::COPY,
    fentry_cfr => hook::COPY,
    fentry_close => hook::CLOSE,
    fentry_recvfrom => hook::READ,
    fentry_recvmsg => hook::READ,
}

exits! {
    fexit_read => hook::READ,
    fexit_pread64 => hook::READ,
    fexit_readv => hook::READ,
    fexit_preadv => hook::READ,
    fexit_preadv2 => hook::READ,
    fexit_sendfile => hook::SENDFILE,
    fexit_splice => hook::COPY,
    fexit_cfr => hook::COPY,
    fexit_recvfrom => hook::READ,
    fexit_recvmsg => hook::READ,
}

returns! {
    fexit_write => hook::WRITE,
    fexit_pwrite64 => hook::WRITE,
    fexit_writev => hook::WRITE,
    fexit_pwritev => hook::WRITE,
    fexit_pwritev2 => hook::WRITE,
    fexit_open => hook::OPEN,
    fexit_openat => hook::OPENAT,
    fexit_openat2 => hook::OPENAT2,
    fexit_creat => hook::CREAT,
    fexit_dup => hook::DUP,
    fexit_dup2 => hook::DUP,
    fexit_dup3 => hook::DUP,
    fexit_fcntl => hook::FCNTL,
    fexit_sendto => hook::WRITE,
    fexit_sendmsg => hook::WRITE,
    fexit_connect => hook::CONNECT,
}
