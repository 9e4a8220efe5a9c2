//! The scheduler family: `sched_switch` (the cheapest variant of the
//! switch-reading ladder the kernel takes), `sched_waking` (the one that
//! goes with it), the task hooks, and in cgroup mode `cgroup_attach_task`.
//! All raw tracepoints: never skipped while `bpf_prog_active` is held,
//! unlike perf-event tracepoint programs.
use aya::programs::{raw_trace_point::RawTracePointLinkId, RawTracePoint};
use stall_common::{names, task_flags, Config, SwitchReads};

use crate::capture::{
    error::load_err,
    object::{attached_program, program},
    tracefs::Tracefs,
    CaptureError, CaptureOptions,
};

/// (program, category, tracepoint) for the scheduler and task hooks.
/// `sched_switch` is replaced by the variant [`load_switch`] picks.
const ATTACH: [(&str, &str, &str); 5] = [
    (names::SCHED_SWITCH, "sched", "sched_switch"),
    (names::SCHED_WAKING, "sched", "sched_waking"),
    (names::TASK_NEWTASK, "task", "task_newtask"),
    (names::SCHED_PROCESS_EXEC, "sched", "sched_process_exec"),
    (names::SCHED_PROCESS_EXIT, "sched", "sched_process_exit"),
];

/// The tracepoints of [`ATTACH`] that run at every context switch or
/// wakeup of the machine: what the daemon's cheap tier leaves detached.
const SCHED_HOOKS: [&str; 2] = ["sched_switch", "sched_waking"];

/// (program, category, tracepoint) attached in cgroup mode only: a task
/// moved into a watched cgroup is no longer known to be outside them
/// (stall-ebpf's untracked.rs).
const CGROUP_ATTACH: (&str, &str, &str) = (names::CGROUP_ATTACH_TASK, "cgroup", "cgroup_attach_task");

/// `STALL_SWITCH_READS=probe` loads the probing `sched_switch` where a
/// direct one would load, `=direct` the direct one that times wakeups where
/// the queued one would: for tests and benchmarks of the fallbacks.
const SWITCH_READS_ENV: &str = "STALL_SWITCH_READS";

/// The scheduler hooks' programs (loaded) and links (while attached).
#[derive(Default)]
pub struct SchedHooks {
    programs: Vec<(&'static str, &'static str)>,
    links: Vec<(&'static str, RawTracePointLinkId)>,
}

impl SchedHooks {
    pub fn attached(&self) -> bool {
        !self.links.is_empty()
    }

    /// All or none: a half-attached scheduler would count half the switches.
    pub fn attach(&mut self, ebpf: &mut aya::Ebpf) -> Result<(), CaptureError> {
        for &(prog, name) in &self.programs {
            match attached_program::<RawTracePoint>(ebpf, prog).and_then(|p| p.attach(name).map_err(load_err))
            {
                Ok(link) => self.links.push((prog, link)),
                Err(e) => {
                    let _ = self.detach(ebpf);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    pub fn detach(&mut self, ebpf: &mut aya::Ebpf) -> Result<(), CaptureError> {
        for (prog, link) in self.links.drain(..) {
            attached_program::<RawTracePoint>(ebpf, prog)?.detach(link).map_err(load_err)?;
        }
        Ok(())
    }
}

/// Whether this kernel has every tracepoint the family needs (the raw
/// syscall tracepoints are checked when that backend is chosen).
pub fn check(tracefs: &Tracefs) -> Result<(), CaptureError> {
    match ATTACH.iter().find(|(_, c, n)| !tracefs.has(c, n)) {
        Some((_, c, n)) => Err(CaptureError::MissingTracepoint { name: format!("{c}:{n}") }),
        None => Ok(()),
    }
}

/// Loads the family and attaches it, the switch and wakeup hooks only
/// unless they are to wait for [`SchedHooks::attach`]; which switch runs.
/// `task_pt_regs`: the kernel has `bpf_task_pt_regs`; `casts`: the kfunc
/// placeholders were rewritten.
pub fn load(
    ebpf: &mut aya::Ebpf,
    opts: &CaptureOptions,
    tracefs: &Tracefs,
    config: &Config,
    task_pt_regs: bool,
    casts: bool,
) -> Result<(SchedHooks, SwitchReads), CaptureError> {
    let mut switch_reads = SwitchReads::ProbeStack;
    let mut sched = SchedHooks::default();
    for (prog, _, name) in ATTACH {
        let prog = if prog == names::SCHED_SWITCH {
            switch_reads = load_switch(ebpf, task_pt_regs, config.task.flags, casts)?;
            switch_reads.program()
        } else if prog == names::SCHED_WAKING && switch_reads == SwitchReads::Queued {
            // The switch-in splits a woken task's span: the wakeup is only marked.
            program(ebpf, names::SCHED_WAKING_MARKED, RawTracePoint::load)?;
            names::SCHED_WAKING_MARKED
        } else if prog == names::SCHED_WAKING && switch_reads == SwitchReads::QueuedChecked {
            // Loaded with the switch.
            names::SCHED_WAKING_CHECKED
        } else {
            program(ebpf, prog, RawTracePoint::load)?;
            prog
        };
        if SCHED_HOOKS.contains(&name) {
            sched.programs.push((prog, name));
            continue;
        }
        attached_program::<RawTracePoint>(ebpf, prog)?.attach(name).map_err(load_err)?;
    }
    if !opts.sched_hooks_on_demand {
        sched.attach(ebpf)?;
    }
    if opts.cgroup_mode {
        let (prog, category, name) = CGROUP_ATTACH;
        if !tracefs.has(category, name) {
            return Err(CaptureError::MissingTracepoint { name: format!("{category}:{name}") });
        }
        program(ebpf, prog, RawTracePoint::load)?.attach(name).map_err(load_err)?;
    }
    Ok((sched, switch_reads))
}

/// Loads the cheapest `sched_switch` the kernel takes: whether plain loads
/// through a BTF pointer are allowed in a raw tracepoint program is the
/// verifier's to say, so its answer is the probe (a refused program is
/// not loaded, and nothing of it stays). Where EEVDF delays dequeues, the
/// queued one goes only with `sched_waking_checked`, loaded here too,
/// which needs the kfunc placeholders rewritten (`casts`).
fn load_switch(
    ebpf: &mut aya::Ebpf,
    task_pt_regs: bool,
    flags: u32,
    casts: bool,
) -> Result<SwitchReads, CaptureError> {
    if !task_pt_regs {
        program(ebpf, SwitchReads::ProbeStack.program(), RawTracePoint::load)?;
        return Ok(SwitchReads::ProbeStack);
    }
    let asked = std::env::var_os(SWITCH_READS_ENV);
    let probe_only = asked.as_ref().is_some_and(|v| v == "probe");
    let queued = !probe_only && asked.as_ref().is_none_or(|v| v != "direct");
    if queued && flags & task_flags::QUEUED_AT != 0 {
        if flags & task_flags::DELAYED_DEQUEUE == 0 {
            if program(ebpf, SwitchReads::Queued.program(), RawTracePoint::load).is_ok() {
                return Ok(SwitchReads::Queued);
            }
        } else if casts && program(ebpf, names::SCHED_WAKING_CHECKED, RawTracePoint::load).is_ok() {
            if program(ebpf, SwitchReads::QueuedChecked.program(), RawTracePoint::load).is_ok() {
                return Ok(SwitchReads::QueuedChecked);
            }
            program(ebpf, names::SCHED_WAKING_CHECKED, RawTracePoint::unload)?;
        }
    }
    if !probe_only && program(ebpf, SwitchReads::Direct.program(), RawTracePoint::load).is_ok() {
        return Ok(SwitchReads::Direct);
    }
    program(ebpf, SwitchReads::Probe.program(), RawTracePoint::load)?;
    Ok(SwitchReads::Probe)
}
