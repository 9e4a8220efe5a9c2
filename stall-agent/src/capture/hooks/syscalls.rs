//! The syscalls family: the syscall hooks' two backends, chosen at start-up.
//!
//! - **trampoline**: fentry/fexit programs on the hooked syscalls' entry
//!   functions (`__x64_sys_read`...; stall-ebpf's syscalls/trampoline.rs). Only
//!   callers of these syscalls run a program; nothing else of the machine
//!   changes. Needs BTF and BPF trampolines (the kernel may refuse with
//!   EPERM, e.g. under lockdown or in some VMs).
//! - **tracepoint**: the raw tracepoints `raw_syscalls:sys_enter`/`sys_exit`,
//!   which run for every syscall of the machine and put every task on the
//!   kernel's slow syscall path while attached.
//!
//! `auto` tries the trampolines (load and attach) and falls back to the
//! tracepoints when the kernel refuses. Both feed the same code on the
//! kernel side; the daemon attaches and detaches either on demand.
use aya::{
    programs::{
        fentry::FEntryLinkId, fexit::FExitLinkId, raw_trace_point::RawTracePointLinkId, FEntry, FExit,
        RawTracePoint,
    },
    Btf, Ebpf,
};

use stall_common::names;

use crate::capture::{
    btf::KernelBtf,
    error::{load_err, verifier_reason},
    object::{attached_program, program},
    tracefs::Tracefs,
    CaptureError,
};

/// Which backend to use (`--syscall-hooks`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SyscallHooks {
    /// Trampolines where the kernel allows them, else the raw tracepoints.
    #[default]
    Auto,
    /// fentry/fexit on the syscalls' functions; exit 5 where refused.
    Trampoline,
    /// The raw syscall tracepoints.
    Tracepoint,
}

/// The backend that runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Trampoline,
    Tracepoint,
}

impl Backend {
    /// As the report and the JSON summary (`syscall_backend`) name it.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Trampoline => "trampoline",
            Backend::Tracepoint => "tracepoint",
        }
    }
}

/// (program, tracepoint) for the raw tracepoints: every syscall's entry and
/// exit (the programs pick the ones in `SyscallTables::hooks`). The exit's
/// program is `sys_exit_cast` where the kernel takes it.
pub const ATTACH_RAW: [(&str, &str); 2] = [(names::SYS_ENTER, "sys_enter"), (names::SYS_EXIT, "sys_exit")];

/// How the syscall hooks read a returning call's registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegisterReads {
    /// Plain loads through `bpf_rdonly_cast` (`sys_exit_cast`).
    Cast,
    /// `bpf_probe_read_kernel`.
    Probe,
}

impl RegisterReads {
    /// As the JSON summary (`syscall_reads`) names it.
    pub fn name(self) -> &'static str {
        match self {
            RegisterReads::Cast => "cast",
            RegisterReads::Probe => "probe",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Entry,
    Exit,
}

impl Side {
    fn label(self) -> &'static str {
        match self {
            Side::Entry => "fentry",
            Side::Exit => "fexit",
        }
    }
}

/// (program, side, syscall) for the trampolines: the reading calls
/// (recvfrom and recvmsg too) at entry (the read in flight, its start) and
/// exit (its bytes); the write, open and dup families, sendto, sendmsg,
/// connect and fcntl at exit only (the saved registers still
/// hold the arguments); close at entry only (retired before the number can
/// be reused). Program names fit the kernel's 15 characters.
const TRAMPOLINES: [(&str, Side, &str); 37] = [
    (names::FENTRY_READ, Side::Entry, "read"),
    (names::FEXIT_READ, Side::Exit, "read"),
    (names::FENTRY_PREAD64, Side::Entry, "pread64"),
    (names::FEXIT_PREAD64, Side::Exit, "pread64"),
    (names::FENTRY_READV, Side::Entry, "readv"),
    (names::FEXIT_READV, Side::Exit, "readv"),
    (names::FENTRY_PREADV, Side::Entry, "preadv"),
    (names::FEXIT_PREADV, Side::Exit, "preadv"),
    (names::FENTRY_PREADV2, Side::Entry, "preadv2"),
    (names::FEXIT_PREADV2, Side::Exit, "preadv2"),
    (names::FENTRY_SENDFILE, Side::Entry, "sendfile"),
    (names::FEXIT_SENDFILE, Side::Exit, "sendfile"),
    (names::FENTRY_SPLICE, Side::Entry, "splice"),
    (names::FEXIT_SPLICE, Side::Exit, "splice"),
    (names::FENTRY_CFR, Side::Entry, "copy_file_range"),
    (names::FEXIT_CFR, Side::Exit, "copy_file_range"),
    (names::FEXIT_WRITE, Side::Exit, "write"),
    (names::FEXIT_PWRITE64, Side::Exit, "pwrite64"),
    (names::FEXIT_WRITEV, Side::Exit, "writev"),
    (names::FEXIT_PWRITEV, Side::Exit, "pwritev"),
    (names::FEXIT_PWRITEV2, Side::Exit, "pwritev2"),
    (names::FEXIT_OPEN, Side::Exit, "open"),
    (names::FEXIT_OPENAT, Side::Exit, "openat"),
    (names::FEXIT_OPENAT2, Side::Exit, "openat2"),
    (names::FEXIT_CREAT, Side::Exit, "creat"),
    (names::FEXIT_DUP, Side::Exit, "dup"),
    (names::FEXIT_DUP2, Side::Exit, "dup2"),
    (names::FEXIT_DUP3, Side::Exit, "dup3"),
    (names::FEXIT_FCNTL, Side::Exit, "fcntl"),
    (names::FENTRY_CLOSE, Side::Entry, "close"),
    (names::FENTRY_RECVFROM, Side::Entry, "recvfrom"),
    (names::FEXIT_RECVFROM, Side::Exit, "recvfrom"),
    (names::FENTRY_RECVMSG, Side::Entry, "recvmsg"),
    (names::FEXIT_RECVMSG, Side::Exit, "recvmsg"),
    (names::FEXIT_SENDTO, Side::Exit, "sendto"),
    (names::FEXIT_SENDMSG, Side::Exit, "sendmsg"),
    (names::FEXIT_CONNECT, Side::Exit, "connect"),
];

/// The kernel function behind a native syscall (`SYSCALL_DEFINE`'s
/// wrapper, whose one argument is the task's `struct pt_regs *`).
#[cfg(target_arch = "x86_64")]
fn syscall_function(name: &str) -> String {
    // x86-64's sendfile is the 64-bit-offset one.
    let name = if name == "sendfile" { "sendfile64" } else { name };
    format!("__x64_sys_{name}")
}

enum Link {
    Raw(RawTracePointLinkId),
    Entry(FEntryLinkId),
    Exit(FExitLinkId),
}

/// The chosen backend's programs (loaded) and links (while attached).
pub struct Hooks {
    backend: Backend,
    /// Why `auto` fell back to the tracepoints.
    refused: Option<String>,
    /// The raw tracepoints' (program, tracepoint), the exit's as loaded.
    raw: [(&'static str, &'static str); 2],
    reads: RegisterReads,
    links: Vec<(&'static str, Link)>,
}

impl Hooks {
    /// Loads the backend `want` asks for, attached unless `on_demand`.
    /// `auto` probes the trampolines by loading and attaching them (then
    /// detaching them again if `on_demand`). `casts`: the object's kfunc
    /// placeholders were rewritten (`kfunc.rs`), so `sys_exit_cast` may load.
    pub fn load(
        ebpf: &mut Ebpf,
        want: SyscallHooks,
        btf: Option<&Btf>,
        kernel_btf: &KernelBtf,
        tracefs: &Tracefs,
        casts: bool,
        on_demand: bool,
    ) -> Result<Self, CaptureError> {
        let mut refused = None;
        if want != SyscallHooks::Tracepoint {
            match trampolines(ebpf, btf, kernel_btf) {
                Ok(links) => {
                    let mut hooks = Hooks {
                        backend: Backend::Trampoline,
                        refused: None,
                        raw: ATTACH_RAW,
                        reads: RegisterReads::Probe,
                        links,
                    };
                    if on_demand {
                        hooks.detach(ebpf)?;
                    }
                    return Ok(hooks);
                }
                Err(why) if want == SyscallHooks::Trampoline => {
                    return Err(CaptureError::NoTrampolines(why));
                }
                Err(why) => refused = Some(why),
            }
        }
        if let Some((_, n)) = ATTACH_RAW.iter().find(|(_, n)| !tracefs.has("raw_syscalls", n)) {
            return Err(CaptureError::MissingTracepoint { name: format!("raw_syscalls:{n}") });
        }
        program(ebpf, names::SYS_ENTER, RawTracePoint::load)?;
        // Whether the verifier takes loads through a cast pointer in a raw
        // tracepoint program is its to say: a refused program is not loaded.
        let (exit, reads) = if casts && program(ebpf, names::SYS_EXIT_CAST, RawTracePoint::load).is_ok() {
            (names::SYS_EXIT_CAST, RegisterReads::Cast)
        } else {
            program(ebpf, names::SYS_EXIT, RawTracePoint::load)?;
            (names::SYS_EXIT, RegisterReads::Probe)
        };
        let raw = [ATTACH_RAW[0], (exit, ATTACH_RAW[1].1)];
        let mut hooks = Hooks { backend: Backend::Tracepoint, refused, raw, reads, links: Vec::new() };
        if !on_demand {
            hooks.attach(ebpf)?;
        }
        Ok(hooks)
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub fn register_reads(&self) -> RegisterReads {
        self.reads
    }

    /// Why the trampolines were not used, when `auto` fell back.
    pub fn refused(&self) -> Option<&str> {
        self.refused.as_deref()
    }

    pub fn attached(&self) -> bool {
        !self.links.is_empty()
    }

    pub fn attach(&mut self, ebpf: &mut Ebpf) -> Result<(), CaptureError> {
        match self.backend {
            Backend::Tracepoint => {
                for (prog, name) in self.raw {
                    let p: &mut RawTracePoint = attached_program(ebpf, prog)?;
                    self.links.push((prog, Link::Raw(p.attach(name).map_err(load_err)?)));
                }
            }
            Backend::Trampoline => {
                for (prog, side, _) in TRAMPOLINES {
                    self.links.push((prog, attach_one(ebpf, prog, side).map_err(CaptureError::Refused)?));
                }
            }
        }
        Ok(())
    }

    pub fn detach(&mut self, ebpf: &mut Ebpf) -> Result<(), CaptureError> {
        for (prog, link) in self.links.drain(..) {
            detach_one(ebpf, prog, link)?;
        }
        Ok(())
    }
}

/// Loads and attaches every trampoline program; on the first refusal,
/// undoes what it did and says why.
fn trampolines(
    ebpf: &mut Ebpf,
    btf: Option<&Btf>,
    kernel_btf: &KernelBtf,
) -> Result<Vec<(&'static str, Link)>, String> {
    let btf = btf.ok_or("the kernel has no BTF (/sys/kernel/btf/vmlinux)")?;
    // A wrapper whose prototype in BTF is not the one `struct pt_regs *`
    // would be refused by the verifier (5.10's copy_file_range has no
    // argument there): said before anything is loaded.
    let funcs: Vec<String> = TRAMPOLINES.iter().map(|t| syscall_function(t.2)).collect();
    let names: Vec<&str> = funcs.iter().map(String::as_str).collect();
    for (func, params) in names.iter().zip(kernel_btf.func_params(&names)) {
        match params {
            Some(1) => {}
            Some(n) => {
                return Err(format!(
                    "{func} takes {n} arguments in this kernel's BTF, not the saved registers"
                ))
            }
            None => return Err(format!("this kernel's BTF has no function {func}")),
        }
    }
    let progs: Vec<_> =
        TRAMPOLINES.iter().zip(funcs).map(|(&(prog, side, _), func)| (prog, side, func)).collect();
    load_and_attach(ebpf, btf, &progs)
}

/// Loads and attaches fentry programs on kernel functions, (program,
/// function) each, all or none: on the first refusal, undoes what it did
/// and says why. The programs stay attached as long as `ebpf` lives.
pub(super) fn fentries(ebpf: &mut Ebpf, btf: &Btf, progs: &[(&'static str, &str)]) -> Result<(), String> {
    let progs: Vec<_> = progs.iter().map(|&(prog, func)| (prog, Side::Entry, func.to_string())).collect();
    load_and_attach(ebpf, btf, &progs).map(|_| ())
}

/// Loads, then attaches, each (program, side, kernel function); on the
/// first refusal, undoes what it did and says why.
fn load_and_attach(
    ebpf: &mut Ebpf,
    btf: &Btf,
    progs: &[(&'static str, Side, String)],
) -> Result<Vec<(&'static str, Link)>, String> {
    let mut loaded = Vec::new();
    let mut links = Vec::new();
    let result = (|| {
        for (prog, side, func) in progs {
            load_one(ebpf, prog, *side, func, btf).map_err(|e| format!("{} on {func}: {e}", side.label()))?;
            loaded.push((*prog, *side));
        }
        for (prog, side, func) in progs {
            let link = attach_one(ebpf, prog, *side).map_err(|e| format!("attaching to {func}: {e}"))?;
            links.push((*prog, link));
        }
        Ok(())
    })();
    match result {
        Ok(()) => Ok(links),
        Err(why) => {
            for (prog, link) in links.drain(..) {
                let _ = detach_one(ebpf, prog, link);
            }
            for (prog, side) in loaded {
                let _ = unload_one(ebpf, prog, side);
            }
            Err(why)
        }
    }
}

fn load_one(ebpf: &mut Ebpf, prog: &str, side: Side, func: &str, btf: &Btf) -> Result<(), String> {
    let p = ebpf.program_mut(prog).ok_or_else(|| format!("program {prog} missing from the object"))?;
    match side {
        Side::Entry => {
            let p: &mut FEntry = p.try_into().map_err(|e| chain(&e))?;
            p.load(func, btf).map_err(|e| chain(&e))
        }
        Side::Exit => {
            let p: &mut FExit = p.try_into().map_err(|e| chain(&e))?;
            p.load(func, btf).map_err(|e| chain(&e))
        }
    }
}

fn attach_one(ebpf: &mut Ebpf, prog: &'static str, side: Side) -> Result<Link, String> {
    let p = ebpf.program_mut(prog).ok_or_else(|| format!("program {prog} missing from the object"))?;
    match side {
        Side::Entry => {
            let p: &mut FEntry = p.try_into().map_err(|e| chain(&e))?;
            p.attach().map(Link::Entry).map_err(|e| chain(&e))
        }
        Side::Exit => {
            let p: &mut FExit = p.try_into().map_err(|e| chain(&e))?;
            p.attach().map(Link::Exit).map_err(|e| chain(&e))
        }
    }
}

fn unload_one(ebpf: &mut Ebpf, prog: &str, side: Side) -> Result<(), String> {
    let p = ebpf.program_mut(prog).ok_or_else(|| format!("program {prog} missing from the object"))?;
    match side {
        Side::Entry => <&mut FEntry>::try_from(p).map_err(|e| chain(&e))?.unload().map_err(|e| chain(&e)),
        Side::Exit => <&mut FExit>::try_from(p).map_err(|e| chain(&e))?.unload().map_err(|e| chain(&e)),
    }
}

fn detach_one(ebpf: &mut Ebpf, prog: &str, link: Link) -> Result<(), CaptureError> {
    match link {
        Link::Raw(l) => attached_program::<RawTracePoint>(ebpf, prog)?.detach(l).map_err(load_err),
        Link::Entry(l) => attached_program::<FEntry>(ebpf, prog)?.detach(l).map_err(load_err),
        Link::Exit(l) => attached_program::<FExit>(ebpf, prog)?.detach(l).map_err(load_err),
    }
}

/// The kernel's answer on one line: aya's message (without its causes,
/// which repeat it), and the verifier's reason if it gave one.
fn chain(e: &dyn std::error::Error) -> String {
    let text = e.to_string();
    let Some((head, log)) = text.split_once(". Verifier output:") else {
        return text.lines().next().unwrap_or_default().to_string();
    };
    match verifier_reason(log) {
        Some(reason) => format!("{head} (verifier: {reason})"),
        None => head.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::syscalls;
    use stall_common::hook;

    #[test]
    fn trampolines_cover_every_hooked_syscall() {
        // Each hooked syscall has its program(s): reads at entry and exit,
        // writes and openat at exit, close at entry.
        let hooked = syscalls::hook_table();
        for (nr, what) in hooked {
            let name = syscalls::name(i64::from(nr));
            let sides: Vec<Side> = TRAMPOLINES.iter().filter(|t| t.2 == name).map(|t| t.1).collect();
            let want = match what {
                hook::READ | hook::SENDFILE | hook::COPY => vec![Side::Entry, Side::Exit],
                hook::CLOSE => vec![Side::Entry],
                _ => vec![Side::Exit],
            };
            assert_eq!(sides, want, "{name}");
        }
        assert_eq!(
            TRAMPOLINES.len(),
            TRAMPOLINES.iter().map(|t| t.0).collect::<std::collections::HashSet<_>>().len()
        );
        assert_eq!(syscall_function("pread64"), "__x64_sys_pread64");
        assert_eq!(syscall_function("sendfile"), "__x64_sys_sendfile64");
    }

    #[test]
    fn program_names_fit_the_kernel() {
        // BPF_OBJ_NAME_LEN is 16 with the NUL: longer names are cut.
        for (prog, side, _) in TRAMPOLINES {
            assert!(prog.len() < 16, "{prog}");
            assert!(prog.starts_with(side.label()), "{prog}");
        }
    }
}
