//! `stall`: why is the GPU idle?
use std::process::ExitCode;

use stall_agent::{
    capture::SyscallHooks,
    cli::{CaptureMode, Cli, Command, Common, DaemonArgs, HooksMode},
    daemon,
    error::Error,
    exit,
    session::{self, gate, Options, Target},
};

fn main() -> ExitCode {
    let cli = match Cli::try_parse_checked() {
        Ok(c) => c,
        // --help, --version, and bare `stall` (help on stderr): as clap prints them.
        Err(e)
            if !e.use_stderr()
                || e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand =>
        {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { exit::USAGE as u8 } else { 0 });
        }
        Err(e) => {
            eprintln!("stall: {}", usage_line(&e));
            return ExitCode::from(exit::USAGE as u8);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("stall: cannot start: {e}");
            return ExitCode::from(exit::INTERNAL as u8);
        }
    };
    let (target, common) = match cli.command {
        Command::ExecGate { cmd } => gate::exec_gate(&cmd),
        Command::Completions { shell } => {
            let mut cli = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cli, "stall", &mut std::io::stdout());
            return ExitCode::SUCCESS;
        }
        Command::Version => {
            println!("stall {}", stall_agent::cli::version());
            for (what, found) in stall_agent::capture::kernel_features() {
                println!("{what}: {found}");
            }
            return ExitCode::SUCCESS;
        }
        Command::Daemon(args) => {
            return match runtime.block_on(daemon::run(daemon_options(args))) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&e),
            };
        }
        Command::Run { common, cmd, stop } => (Target::Run { cmd, stop }, common),
        Command::Attach { target, common } => match (target.pid, target.cgroup) {
            (Some(pid), _) => (Target::Pid(pid), common),
            (None, Some(cg)) => (Target::Cgroup(cg), common),
            (None, None) => unreachable!("clap requires one"),
        },
    };
    match runtime.block_on(session::run(target, session_options(common))) {
        Ok(outcome) => ExitCode::from(outcome.child_status.unwrap_or(0).clamp(0, 255) as u8),
        Err(e) => fail(&e),
    }
}

fn fail(e: &anyhow::Error) -> ExitCode {
    eprintln!("stall: {}", one_line(e));
    ExitCode::from(code_for(e) as u8)
}

/// `stall daemon`'s options, as the daemon takes them.
fn daemon_options(a: DaemonArgs) -> daemon::Options {
    let tiers = daemon::tier::Policy {
        idle_after: a.escalate_idle,
        silent_after: a.escalate_silent,
        silent_floor: a.escalate_silent_floor,
        window: a.full_window,
        cooldown: a.cooldown,
    };
    daemon::Options {
        roots: a.roots,
        kubernetes: a.kubernetes,
        runtime_endpoint: a.runtime_endpoint,
        pod_labels: a.pod_labels,
        all_jobs: a.all_jobs,
        device_holders: a.device_holders,
        listen: a.listen,
        health_listen: a.health_listen,
        interval: a.interval,
        gpu: a.gpu,
        nvml_lib: a.nvml_lib,
        tiers: (a.capture == CaptureMode::Tiered).then_some(tiers),
        syscall_hooks: syscall_hooks(a.hooks.syscall_hooks),
        web_config: a.web_config,
        http_max_connections: a.http_max_connections as usize,
        http_idle_timeout: a.http_idle_timeout,
        expose_details: a.expose_details,
        node_name: a.node_name,
        require_gpu: a.require_gpu,
    }
}

/// `stall run`'s and `stall attach`'s options, as the session takes them.
fn session_options(c: Common) -> Options {
    Options {
        interval: c.interval,
        duration: c.duration,
        json: c.json,
        quiet: c.quiet,
        gpu: c.gpu,
        nvml_lib: c.nvml_lib,
        ringbuf_bytes: c.ringbuf_bytes,
        floor: c.floor,
        latency_sample: c.latency_sample,
        python_stacks_every: c.python_stacks_every,
        timeline: c.timeline,
        timeline_svg: c.timeline_svg,
        syscall_hooks: syscall_hooks(c.hooks.syscall_hooks),
    }
}

/// `--syscall-hooks` as the capture takes it.
fn syscall_hooks(mode: HooksMode) -> SyscallHooks {
    match mode {
        HooksMode::Auto => SyscallHooks::Auto,
        HooksMode::Trampoline => SyscallHooks::Trampoline,
        HooksMode::Tracepoint => SyscallHooks::Tracepoint,
    }
}

/// A usage error on one line: clap's first line, without its "error: "
/// prefix, usage and tips (`stall --help` has those).
fn usage_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let mut lines = text.lines().skip_while(|l| l.trim().is_empty());
    let first = lines.next().unwrap_or("usage error");
    let mut line = first.strip_prefix("error: ").unwrap_or(first).trim().to_string();
    // What clap lists under it, indented ("required arguments were not provided:").
    for more in lines.take_while(|l| l.starts_with(' ') && !l.trim().is_empty()) {
        line.push(' ');
        line.push_str(more.trim());
    }
    line + " (see stall --help)"
}

/// The error and its causes on one line.
fn one_line(e: &anyhow::Error) -> String {
    e.chain().map(ToString::to_string).collect::<Vec<_>>().join(": ")
}

fn code_for(e: &anyhow::Error) -> i32 {
    e.downcast_ref::<Error>().map_or(exit::INTERNAL, Error::exit_code)
}
