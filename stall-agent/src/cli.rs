//! The command line.
use std::{ffi::OsString, path::PathBuf, time::Duration};

use clap::{ArgGroup, Args, Parser, Subcommand};

use crate::gpu::GpuSelect;

macro_rules! privileges {
    () => {
        "\
PRIVILEGES (run, attach, daemon): root, or these capabilities, all of them:
    CAP_BPF              create BPF maps and load the programs
    CAP_PERFMON          load tracing programs and attach them to tracepoints
    CAP_DAC_READ_SEARCH  read tracefs (mode 700: tracepoint layouts and ids) and other
                         users' /proc/PID/fd and /proc/PID/task/TID/syscall
    CAP_SYS_PTRACE       see which file each descriptor of the job is and which syscall
                         its threads wait in (/proc's ptrace checks)
    Missing one, stall exits 3 naming it. CAP_SYS_ADMIN is needed only where tracefs
    is not mounted (stall mounts it). kernel.perf_event_paranoid does not matter: every
    program attaches as a raw tracepoint or trampoline, not through perf_event_open, so
    Debian's and Ubuntu's levels above 2 need no change. `stall run` starts the
    command without stall's ambient capabilities."
    };
}

// Each code's line, shared by the full list (`stall --help`) and each
// subcommand's own (its --help lists only the codes it can exit with).
macro_rules! code {
    (internal) => {
        "\n    1    internal error"
    };
    (usage) => {
        "\n    2    usage error (bad option value, --json or --timeline path not writable)"
    };
    (privileged) => {
        "\n    3    not privileged: a capability above is missing, or the kernel refused (EPERM)"
    };
    (kernel) => {
        "\n    5    kernel not supported: missing tracepoint, tracefs or BPF feature"
    };
    (gpu) => {
        "\n    6    GPU asked for with --gpu, but NVML or the device is not available"
    };
}

macro_rules! exit_codes {
    () => {
        concat!(
            "EXIT CODES:",
            "\n    0    success (stall attach)",
            "\n    N    stall run: the command's own exit status (128+signal if it was killed)",
            code!(internal),
            code!(usage),
            code!(privileged),
            "\n    4    target not found: no such PID, not a cgroup v2 directory, or no pods for --kubernetes",
            code!(kernel),
            code!(gpu),
            "\n    7    stall daemon: cannot listen on the --listen or --health-listen address (e.g. port taken)",
            "\n    126  stall run: the command is not executable",
            "\n    127  stall run: the command was not found"
        )
    };
}

/// The exit codes, as `stall --help` lists them.
pub const EXIT_CODES: &str = exit_codes!();
/// What capabilities stall needs, as `--help` lists them.
pub const PRIVILEGES: &str = privileges!();
const AFTER_HELP: &str = concat!(privileges!(), "\n\n", exit_codes!());
const RUN_HELP: &str = concat!(
    privileges!(),
    "\n\nEXIT CODES:",
    "\n    N    the command's own exit status (128+signal if it was killed)",
    code!(internal),
    code!(usage),
    code!(privileged),
    code!(kernel),
    code!(gpu),
    "\n    126  the command is not executable",
    "\n    127  the command was not found"
);
const ATTACH_HELP: &str = concat!(
    privileges!(),
    "\n\nEXIT CODES:",
    "\n    0    success",
    code!(internal),
    code!(usage),
    code!(privileged),
    "\n    4    target not found: no such PID, or not a cgroup v2 directory",
    code!(kernel),
    code!(gpu)
);
const DAEMON_HELP: &str = concat!(
    privileges!(),
    "\n\nEXIT CODES:",
    "\n    0    stopped by SIGTERM or SIGINT",
    code!(internal),
    "\n    2    usage error (bad option value, --web-config not valid)",
    code!(privileged),
    "\n    4    target not found: a --cgroup-root that is not a cgroup v2 directory, or no pods for --kubernetes",
    code!(kernel),
    "\n    6    --require-gpu, but NVML or a GPU is not available",
    "\n    7    cannot listen on the --listen or --health-listen address (e.g. port taken)"
);

/// The release and the commit it was built from.
pub fn version() -> &'static str {
    VERSION
}

/// `stall --version`: the release and the commit it was built from.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("STALL_COMMIT"), ")");
/// `stall --version` (long): with the pieces of the kernel it needs.
const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("STALL_COMMIT"),
    ")\nneeds: raw tracepoints, BPF ring buffers and BTF (Linux 5.10 or later); \
     `stall version` says what this machine's kernel has"
);

#[derive(Parser, Debug)]
#[command(
    name = "stall",
    version = VERSION,
    long_version = LONG_VERSION,
    about = "Why is the GPU idle? Traces a training job from the kernel (eBPF) and says what holds it back.",
    after_help = AFTER_HELP
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// Parses the command line as clap does, and refuses what clap takes
    /// for a command but is a mistyped option: `stall run --durration 5 --
    /// true` would run `--durration` (the command starts at `run`'s first
    /// word that is no option of its own, and no program is named `-…`).
    pub fn try_parse_checked() -> Result<Cli, clap::Error> {
        Self::checked(Self::try_parse()?)
    }

    fn checked(cli: Cli) -> Result<Cli, clap::Error> {
        let Command::Run { cmd, .. } = &cli.command else { return Ok(cli) };
        let Some(first) = cmd.first().and_then(|c| c.to_str()).filter(|c| c.starts_with('-')) else {
            return Ok(cli);
        };
        let mut stall = <Cli as clap::CommandFactory>::command();
        let run = stall.find_subcommand("run").expect("stall run");
        let typed = first.split('=').next().unwrap_or(first);
        let closest = run
            .get_arguments()
            .filter_map(|a| a.get_long())
            .map(|long| (strsim::levenshtein(typed.trim_start_matches('-'), long), long))
            .filter(|(d, _)| *d <= 3)
            .min();
        let hint = closest.map(|(_, long)| format!("; did you mean '--{long}'?")).unwrap_or_default();
        Err(stall.error(
            clap::error::ErrorKind::UnknownArgument,
            format!("unexpected argument '{typed}' for 'stall run'{hint} (the command goes after '--')"),
        ))
    }
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a command and trace it and everything it starts; exit with its status.
    #[command(after_help = RUN_HELP)]
    Run {
        #[command(flatten)]
        common: Common,
        /// With --duration: stop the command when the time is up (SIGTERM to
        /// its process group, SIGKILL 5 s later), report, and exit with its
        /// status. Without it the command goes on, untraced.
        #[arg(long, requires = "duration")]
        stop: bool,
        /// The command and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
        cmd: Vec<OsString>,
    },
    /// Attach to a running job: a PID and its descendants, or a cgroup.
    #[command(after_help = ATTACH_HELP)]
    Attach {
        #[command(flatten)]
        target: AttachTarget,
        #[command(flatten)]
        common: Common,
    },
    /// Watch every job on this node continuously and export Prometheus metrics.
    #[command(after_help = DAEMON_HELP)]
    Daemon(DaemonArgs),
    /// Print a shell completion script: `stall completions bash > /etc/bash_completion.d/stall`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// The version, the commit, and what this machine's kernel offers stall.
    Version,
    /// Internal: the exec gate `stall run` starts (see session::gate).
    #[command(name = "__exec-gate", hide = true)]
    ExecGate {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        cmd: Vec<OsString>,
    },
}

/// `stall daemon`'s options.
#[derive(Args, Debug)]
// One group, so that without either clap names both ways to find the jobs.
#[command(group(ArgGroup::new("jobs").required(true).multiple(true).args(["roots", "kubernetes"])))]
pub struct DaemonArgs {
    /// A cgroup v2 whose child cgroups are the jobs (repeatable; e.g. kubepods.slice).
    #[arg(long = "cgroup-root", value_name = "PATH")]
    pub roots: Vec<PathBuf>,
    /// The kubelet's pods are the jobs, under whichever cgroup driver it uses
    /// (systemd: kubepods.slice, cgroupfs: kubepods), found at start.
    #[arg(long)]
    pub kubernetes: bool,
    /// The container runtime's CRI socket, which names the pods and their
    /// containers (default with --kubernetes: containerd's or CRI-O's).
    #[arg(long, value_name = "PATH", value_parser = parse_endpoint)]
    pub runtime_endpoint: Option<PathBuf>,
    /// A pod label to export on stall_job_info, besides job-name,
    /// batch.kubernetes.io/job-name, training.kubeflow.org/job-name,
    /// jobset.sigs.k8s.io/jobset-name and app.kubernetes.io/name (repeatable).
    #[arg(long = "pod-label", value_name = "NAME")]
    pub pod_labels: Vec<String>,
    /// Watch every job, not only those with a GPU open (machines without GPUs).
    #[arg(long)]
    pub all_jobs: bool,
    /// Also count as GPU jobs those holding an NVIDIA device open without a
    /// CUDA context NVML lists (always so without NVML).
    #[arg(long)]
    pub device_holders: bool,
    /// Address for /metrics and /jobs.
    #[arg(long, default_value = "127.0.0.1:9464", value_name = "ADDR:PORT")]
    pub listen: std::net::SocketAddr,
    /// A port of its own for /healthz: plain HTTP, no password, nothing else served (point the
    /// kubelet's probes there: they never wait behind TLS handshakes or password checks on --listen).
    #[arg(long, value_name = "ADDR:PORT")]
    pub health_listen: Option<std::net::SocketAddr>,
    /// Time between updates: seconds (5, 0.5) or with a unit (30s, 2m, 1h).
    #[arg(long, default_value = "5", value_parser = parse_duration, value_name = "DURATION")]
    pub interval: Duration,
    /// GPUs to sample: `off`, `all`, or indices like `0,2`.
    #[arg(long, value_name = "off|all|0,2")]
    pub gpu: Option<GpuSelect>,
    /// NVML library to load (default libnvidia-ml.so.1 on the loader path), e.g. /run/nvidia/driver/usr/lib64/libnvidia-ml.so.1
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
    /// `tiered`: while a job's GPU is busy and it progresses, no syscall hook runs (they tax every
    /// process of the node); a job that looks wrong gets the full capture for a while. `full`:
    /// always the full capture. Jobs without GPU data are always captured in full.
    #[arg(long, value_enum, default_value = "tiered")]
    pub capture: CaptureMode,
    /// Tiered: full capture once a job's GPU has been idle this long.
    #[arg(long, default_value = "5", value_parser = parse_duration, value_name = "DURATION")]
    pub escalate_idle: Duration,
    /// Tiered: full capture once a job behind a busy GPU has been silent (nothing read or
    /// written) for 3 of its own rhythms, or this long where it has none yet (the most waited).
    #[arg(long, default_value = "120", value_parser = parse_duration, value_name = "DURATION")]
    pub escalate_silent: Duration,
    /// Tiered: the shortest silence escalated, however fast the job's rhythm.
    #[arg(long, default_value = "10", value_parser = parse_duration, value_name = "DURATION")]
    pub escalate_silent_floor: Duration,
    /// Tiered: a full capture lasts at most this long (it ends early once the GPU is busy again).
    #[arg(long, default_value = "60", value_parser = parse_duration, value_name = "DURATION")]
    pub full_window: Duration,
    /// Tiered: after a full capture, no other for the job before this long.
    #[arg(long, default_value = "120", value_parser = parse_duration, value_name = "DURATION")]
    pub cooldown: Duration,
    /// TLS and basic authentication for --listen, in the Prometheus exporter toolkit's web
    /// config format (tls_server_config, basic_auth_users with bcrypt hashes). Without it: plain HTTP.
    #[arg(long, value_name = "FILE")]
    pub web_config: Option<PathBuf>,
    /// Connections open at once on --listen at most. One more closes the connection idle the
    /// longest; when every one is mid-request, the new one is closed at once.
    #[arg(long, default_value = "512", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub http_max_connections: u32,
    /// A connection with no request for this long is closed (a request's headers must arrive
    /// within 10 s of its first byte, or of the connection's opening).
    #[arg(long, default_value = "60s", value_parser = parse_duration, value_name = "DURATION")]
    pub http_idle_timeout: Duration,
    /// Serve file paths, command lines and Python stacks in /jobs and the logs, and allow
    /// POST /jobs/{id}/capture (with --web-config: to authenticated clients only).
    #[arg(long)]
    pub expose_details: bool,
    /// This node's name in /jobs (default: the host name; in Kubernetes, the node's name from
    /// the downward API).
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    pub node_name: Option<String>,
    /// Exit (code 6) when NVML cannot be loaded or sees no GPU, instead of judging the host side
    /// only: on a GPU node a daemon blind to the GPU never escalates and its GPU alerts never fire.
    #[arg(long)]
    pub require_gpu: bool,
    #[command(flatten)]
    pub hooks: HooksArg,
}

/// How much the daemon captures (see `stall daemon --help`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureMode {
    Tiered,
    Full,
}

#[derive(Args, Debug)]
#[group(required = true, multiple = false)]
pub struct AttachTarget {
    /// Trace this process, all its threads and all its descendants (now and later).
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
    /// Trace every task in this cgroup v2 and the cgroups below it (absolute,
    /// or relative to the cgroup2 mount).
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct Common {
    /// Time between live updates: seconds (1, 0.5) or with a unit (30s, 2m, 1h).
    #[arg(long, default_value = "1", value_parser = parse_duration, value_name = "DURATION")]
    pub interval: Duration,
    /// Stop after this long: seconds (30, 0.5) or with a unit (30s, 2m, 1h). Default: when the target exits, or Ctrl-C.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub duration: Option<Duration>,
    /// Write JSON Lines here (`-`: stdout; human output then goes to stderr).
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// Print only the final report.
    #[arg(short, long)]
    pub quiet: bool,
    /// GPUs to sample: `off`, `all`, or indices like `0,2`. Default: all, if NVML is there.
    #[arg(long, value_name = "off|all|0,2")]
    pub gpu: Option<GpuSelect>,
    /// NVML library to load (default libnvidia-ml.so.1 on the loader path), e.g. /run/nvidia/driver/usr/lib64/libnvidia-ml.so.1
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
    /// Ring-buffer size in bytes (power of two, at least a page).
    #[arg(long, hide = true)]
    pub ringbuf_bytes: Option<u32>,
    /// Programs return at once (benchmark floor).
    #[arg(long, hide = true)]
    pub floor: bool,
    /// Time one read in N, picked at random (1: every read); past a thread's
    /// first 32 traced calls since it came on-CPU, one in 128 if N is smaller than
    /// that. Bytes and calls are always exact; timing costs more than the
    /// rest of a read's count.
    #[arg(long, value_name = "N", default_value = "8", value_parser = parse_sample)]
    pub latency_sample: u32,
    /// Write a timeline of every traced thread's states, its file reads, the
    /// GPUs and the verdicts as a Chrome trace (JSON; gzip if FILE ends in
    /// .gz) that Perfetto and chrome://tracing open: docs/TIMELINE.md. A
    /// FILE ending in .svg (without --timeline-svg) gets the SVG instead.
    #[arg(long, value_name = "FILE")]
    pub timeline: Option<PathBuf>,
    /// The same timeline as a self-contained SVG picture.
    #[arg(long, value_name = "FILE")]
    pub timeline_svg: Option<PathBuf>,
    /// Read the Python stacks of the threads the verdict names this often,
    /// whatever the verdict (the bench measures what reading costs the job).
    #[arg(long, hide = true, value_parser = parse_duration, value_name = "DURATION")]
    pub python_stacks_every: Option<Duration>,
    #[command(flatten)]
    pub hooks: HooksArg,
}

/// `--syscall-hooks`, shared by every tracing command.
#[derive(Args, Debug, Clone)]
pub struct HooksArg {
    /// How file reads, writes, opens and closes are hooked: `trampoline` (fentry/fexit on those
    /// syscalls only: nothing else on the machine pays), `tracepoint` (raw_syscalls: every syscall
    /// of every task takes the kernel's slow path while attached), or `auto` (trampolines where the
    /// kernel allows them, else tracepoints). The report and the JSON summary (`syscall_backend`)
    /// say which ran; a refused `trampoline` exits 5.
    #[arg(long, value_enum, default_value = "auto", env = "STALL_SYSCALL_HOOKS", value_name = "MODE")]
    pub syscall_hooks: HooksMode,
}

/// `--syscall-hooks` values (the capture's backends, as users pick them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum HooksMode {
    /// Trampolines where the kernel allows them, else the raw tracepoints.
    #[default]
    Auto,
    /// fentry/fexit on the syscalls' functions; exit 5 where refused.
    Trampoline,
    /// The raw syscall tracepoints.
    Tracepoint,
}

fn parse_sample(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n) if n.is_power_of_two() && n <= 128 => Ok(n),
        _ => Err(format!("{s:?} is not a power of two from 1 to 128")),
    }
}

/// One parser for every duration option: seconds (`30`, `0.5`) or a number
/// with a unit (`30s`, `2m`, `1h`, `500ms`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad =
        || format!("{s:?} is not a duration: use seconds (30, 0.5) or a number with s, m or h (30s, 2m, 1h)");
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale = match unit {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return Err(bad()),
    };
    // Digits and one dot only: no signs, exponents, "inf" or "nan".
    if num.is_empty() || !num.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(bad());
    }
    let v: f64 = num.parse().map_err(|_| bad())?;
    let secs = v * scale;
    if secs <= 0.0 {
        return Err(format!("{s:?}: a duration must be more than zero"));
    }
    Duration::try_from_secs_f64(secs).map_err(|_| format!("{s:?} is too long a duration"))
}

/// A CRI endpoint as the kubelet and crictl spell it (`unix:///run/...`) or
/// as a path.
fn parse_endpoint(s: &str) -> Result<PathBuf, String> {
    let path = s.strip_prefix("unix://").unwrap_or(s);
    if !path.starts_with('/') {
        return Err(format!("{s}: a Unix socket, as unix:///path or /path"));
    }
    Ok(PathBuf::from(path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exit;
    use clap::CommandFactory;

    #[test]
    fn help_names_every_capability_checked() {
        for n in crate::caps::NEEDED {
            assert!(PRIVILEGES.contains(&format!("    {}  ", n.name)), "{} not in --help", n.name);
        }
        assert_eq!(PRIVILEGES.matches("    CAP_").count(), crate::caps::NEEDED.len());
        assert!(EXIT_CODES.contains(&format!("    {}    not privileged", exit::NOT_PRIVILEGED)));
    }

    #[test]
    fn exit_codes_list_every_code() {
        use exit::*;
        for code in
            [INTERNAL, USAGE, NOT_PRIVILEGED, NO_TARGET, KERNEL, GPU, LISTEN, NOT_EXECUTABLE, NOT_FOUND]
        {
            let pad = if code < 10 { "    " } else { "  " };
            assert!(EXIT_CODES.contains(&format!("\n    {code}{pad}")), "exit code {code} not listed");
        }
    }

    /// The help text of a subcommand, as `stall SUB --help` prints it.
    fn help(sub: &str) -> String {
        Cli::command().find_subcommand_mut(sub).unwrap().render_long_help().to_string()
    }

    #[test]
    fn each_subcommand_lists_only_its_own_exit_codes() {
        let codes = |h: &str| -> Vec<String> {
            let list = &h[h.find("EXIT CODES:").expect("an exit code list")..];
            list.lines().skip(1).filter_map(|l| l.split_whitespace().next().map(str::to_string)).collect()
        };
        assert_eq!(codes(&help("run")), ["N", "1", "2", "3", "5", "6", "126", "127"]);
        assert_eq!(codes(&help("attach")), ["0", "1", "2", "3", "4", "5", "6"]);
        assert_eq!(codes(&help("daemon")), ["0", "1", "2", "3", "4", "5", "6", "7"]);
        for sub in ["run", "attach", "daemon"] {
            let h = help(sub);
            assert!(!h.contains("stall run:") && !h.contains("stall daemon:"), "{sub}: {h}");
        }
    }

    #[test]
    fn daemon_without_jobs_names_both_ways_to_find_them() {
        let err = Cli::try_parse_from(["stall", "daemon"]).unwrap_err().to_string();
        assert!(err.contains("--cgroup-root") && err.contains("--kubernetes"), "{err}");
        assert!(Cli::try_parse_from(["stall", "daemon", "--kubernetes"]).is_ok());
        assert!(Cli::try_parse_from(["stall", "daemon", "--kubernetes", "--cgroup-root", "x"]).is_ok());
    }

    #[test]
    fn durations_in_seconds_or_with_a_unit() {
        let ok = |s: &str| parse_duration(s).unwrap();
        assert_eq!(ok("30"), Duration::from_secs(30));
        assert_eq!(ok("30s"), Duration::from_secs(30));
        assert_eq!(ok("2m"), Duration::from_secs(120));
        assert_eq!(ok("1h"), Duration::from_secs(3600));
        assert_eq!(ok("0.5"), Duration::from_millis(500));
        assert_eq!(ok("1.5m"), Duration::from_secs(90));
        assert_eq!(ok("250ms"), Duration::from_millis(250));
        assert_eq!(ok(" 5s "), Duration::from_secs(5));
        for bad in ["", "s", "2x", "-1", "+3", "1e3", "inf", "nan", "1.2.3", "3 s", "2mm", "m2", "1d"] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.contains("is not a duration") && !e.contains('\n'), "{bad:?}: {e}");
        }
        for zero in ["0", "0s", "0.0", "0m"] {
            assert!(parse_duration(zero).unwrap_err().contains("more than zero"), "{zero}");
        }
        assert!(parse_duration("1e400").is_err());
        assert!(parse_duration(&"9".repeat(30)).unwrap_err().contains("too long"));
    }

    #[test]
    fn every_duration_option_takes_units() {
        let c = |args: &[&str]| Cli::try_parse_from(args).map(|c| c.command);
        match c(&["stall", "attach", "--pid", "1", "--interval", "2m", "--duration", "1h"]).unwrap() {
            Command::Attach { common, .. } => {
                assert_eq!(common.interval, Duration::from_secs(120));
                assert_eq!(common.duration, Some(Duration::from_secs(3600)));
            }
            other => panic!("{other:?}"),
        }
        match c(&["stall", "daemon", "--cgroup-root", "x", "--interval", "30s"]).unwrap() {
            Command::Daemon(d) => assert_eq!(d.interval, Duration::from_secs(30)),
            other => panic!("{other:?}"),
        }
        assert!(c(&["stall", "run", "--duration", "2x", "--", "true"]).is_err());
    }

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_takes_the_rest_verbatim() {
        let cli = Cli::try_parse_from([
            "stall",
            "run",
            "--duration",
            "2",
            "--",
            "python3",
            "-u",
            "x.py",
            "--lr",
            "1",
        ])
        .unwrap();
        match cli.command {
            Command::Run { cmd, common, stop } => {
                assert_eq!(cmd, ["python3", "-u", "x.py", "--lr", "1"]);
                assert_eq!(common.duration, Some(Duration::from_secs(2)));
                assert!(!stop);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn nvml_lib_on_every_tracing_command() {
        let lib = "/run/nvidia/driver/usr/lib64/libnvidia-ml.so.1";
        let common = |args: &[&str]| match Cli::try_parse_from(args).unwrap().command {
            Command::Run { common, .. } | Command::Attach { common, .. } => common.nvml_lib,
            Command::Daemon(d) => d.nvml_lib,
            other => panic!("{other:?}"),
        };
        assert_eq!(common(&["stall", "run", "--nvml-lib", lib, "--", "true"]), Some(lib.into()));
        assert_eq!(common(&["stall", "attach", "--pid", "1", "--nvml-lib", lib]), Some(lib.into()));
        assert_eq!(common(&["stall", "daemon", "--cgroup-root", "x", "--nvml-lib", lib]), Some(lib.into()));
        assert_eq!(common(&["stall", "run", "--", "true"]), None);
    }

    #[test]
    fn attach_needs_exactly_one_target() {
        assert!(Cli::try_parse_from(["stall", "attach"]).is_err());
        assert!(Cli::try_parse_from(["stall", "attach", "--pid", "1", "--cgroup", "x"]).is_err());
        assert!(Cli::try_parse_from(["stall", "attach", "--pid", "1", "--gpu", "0,2"]).is_ok());
        assert!(Cli::try_parse_from(["stall", "attach", "--pid", "1", "--gpu", "x"]).is_err());
        assert!(Cli::try_parse_from(["stall", "attach", "--pid", "1", "--interval", "0"]).is_err());
    }

    #[test]
    fn a_mistyped_option_is_no_command() {
        let parse = |args: &[&str]| Cli::checked(Cli::try_parse_from(args).unwrap());
        let e = parse(&["stall", "run", "--durration", "5", "--", "true"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::UnknownArgument);
        let text = e.to_string();
        assert!(text.contains("'--durration'") && text.contains("did you mean '--duration'?"), "{text}");
        let e = parse(&["stall", "run", "--jsn=x.json", "python3"]).unwrap_err();
        assert!(e.to_string().contains("did you mean '--json'?"), "{e}");
        assert!(!parse(&["stall", "run", "--zzzzzzzz", "x"])
            .unwrap_err()
            .to_string()
            .contains("did you mean"));
        // A command's own options stay its own.
        assert!(parse(&["stall", "run", "-q", "--", "python3", "--lr", "1"]).is_ok());
        assert!(parse(&["stall", "run", "python3", "-u", "x.py"]).is_ok());
    }
}
