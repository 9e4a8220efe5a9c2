//! Developer tasks for stall: `cargo xtask <task>` (see `cargo xtask --help`).

mod bench;
mod build;
mod cmd;
mod demo;
mod gpu_check;
mod setup;
mod soak;
mod test;
mod vm;

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", bin_name = "cargo xtask", about = "Developer tasks for stall")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install the BPF toolchain if anything is missing (Debian 12, as root)
    Setup,
    /// Build the agent binary, target/{debug,release}/stall
    Build {
        /// Build with the release profile
        #[arg(long)]
        release: bool,
    },
    /// Check formatting and run clippy with warnings denied
    Lint,
    /// Lint, build the release agent and run all tests, privileged integration
    /// tests included (needs root). This is what CI runs.
    Test {
        /// Skip fmt and clippy (quicker local iterations)
        #[arg(long)]
        no_lint: bool,
        /// Extra arguments for the test harness, after `--` (e.g. --test-threads 1)
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Prepare a folder for checking stall against PyTorch on a GPU machine
    GpuCheck {
        /// Where to put it (default target/gpu-check)
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
    /// Run the integration tests on other kernels (`vm`: in QEMU; see docs/KERNELS.md)
    IntegrationTest {
        #[command(subcommand)]
        target: vm::Target,
    },
    /// Measure stall's overhead (vs no tracer, strace and the floor) and its own
    /// cost; writes docs/PERFORMANCE.md (needs root; ~10 min, --quick ~2)
    Bench {
        /// Fewer runs and smaller workloads
        #[arg(long)]
        quick: bool,
        /// Runs per mode (default 5, 3 with --quick)
        #[arg(long)]
        runs: Option<usize>,
        /// Use the binaries already in target/release
        #[arg(long)]
        no_build: bool,
        /// Only the daemon's cost on a node, printed (docs/PERFORMANCE.md is
        /// left as it is): for comparing two builds of the scheduler hooks
        #[arg(long)]
        daemon_only: bool,
        /// Also run stall as of this revision (built in a worktree under
        /// target/bench/before) beside the current build, as a mode of its
        /// own and in the programs' profiles: before and after in one run
        #[arg(long, value_name = "REV")]
        before: Option<String>,
        /// Instead: the syscall hooks' backends (trampolines, raw tracepoints)
        /// side by side in QEMU on this kernel (repeatable: 6.1, 6.12, a package
        /// or a vmlinuz); writes docs/BACKENDS.md
        #[arg(long, value_name = "KERNEL")]
        vm: Vec<String>,
    },
    /// Soak `stall daemon`: jobs start and stop for MINUTES; memory must stay
    /// flat and nothing may stay loaded after SIGTERM (needs root)
    Soak {
        #[arg(long, default_value = "10")]
        minutes: f64,
    },
    /// Run a demo workload under stall and print its report (needs root)
    Demo {
        /// Extra arguments for stall, after `--`
        #[arg(last = true)]
        args: Vec<String>,
    },
}

fn main() -> ExitCode {
    // Printed by hand: anyhow's Debug output would add a backtrace whenever
    // RUST_BACKTRACE is set, burying the message that says what to do.
    match run(Cli::parse().task) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("caused by: {cause}");
            }
            ExitCode::FAILURE
        }
    }
}

fn run(task: Task) -> Result<()> {
    match task {
        Task::Setup => setup::ensure(),
        Task::Build { release } => build::run(release),
        Task::Lint => test::lint(),
        Task::Test { no_lint, args } => test::run(&args, no_lint),
        Task::Demo { args } => demo::run(&args),
        Task::Soak { minutes } => soak::run(minutes),
        Task::Bench { quick, runs, vm, .. } if !vm.is_empty() => {
            let ops = if quick { 50_000 } else { 200_000 };
            vm::hooks_bench::run(&vm, runs.unwrap_or(if quick { 3 } else { 5 }), ops)
        }
        Task::Bench { quick, runs, no_build, daemon_only, before, .. } => {
            bench::run(&bench::Options { quick, runs, no_build, daemon_only, before })
        }
        Task::IntegrationTest { target } => vm::run_cli(target),
        Task::GpuCheck { out } => gpu_check::run(out.as_deref()),
    }
}
