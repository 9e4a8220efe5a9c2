//! Developer tasks for stall: `cargo xtask <task>` (see `cargo xtask --help`).

mod build;
mod cmd;
mod demo;
mod gpu_check;
mod setup;
mod test;

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
        Task::GpuCheck { out } => gpu_check::run(out.as_deref()),
    }
}
