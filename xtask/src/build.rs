//! `cargo xtask build`: build the agent binary.

use std::path::PathBuf;

use anyhow::{ensure, Result};

use crate::{cmd, setup};

/// Runs setup, then builds `stall` and prints where it is.
pub fn run(release: bool) -> Result<()> {
    setup::ensure()?;
    let bin = agent(release)?;
    println!("xtask build: {}", bin.display());
    Ok(())
}

/// Builds stall-agent (its build script compiles the eBPF object with
/// Debian's rustc and bpf-linker, found through [`cmd::tool_path`]) and
/// returns the path of the `stall` binary. Expects setup to have run.
pub fn agent(release: bool) -> Result<PathBuf> {
    let mut build = cmd::cargo();
    build.args(["build", "-p", "stall-agent"]);
    if release {
        build.arg("--release");
    }
    cmd::run(&mut build)?;
    let profile = if release { "release" } else { "debug" };
    let bin = cmd::target_dir().join(profile).join("stall");
    ensure!(bin.is_file(), "the build succeeded but {} is missing", bin.display());
    Ok(bin)
}
