//! `cargo xtask build`: build the agent binary.

use std::path::{Path, PathBuf};

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

/// A library the tests load in place of a GPU's own: its crate and the
/// file it builds.
struct StandIn {
    package: &'static str,
    file: &'static str,
}

/// The scripted NVML library the GPU tests load (`tests/nvml-script`).
const NVML_SCRIPT: StandIn = StandIn { package: "stall-nvml-script", file: "libstall_nvml_script.so" };
/// The stand-in CUDA library the CUDA tests load (`tests/cuda-stub`).
const CUDA_STUB: StandIn = StandIn { package: "stall-cuda-stub", file: "libstall_cuda_stub.so" };
/// The stand-in NCCL library the NCCL tests' jobs load (`tests/nccl-stub`).
const NCCL_STUB: StandIn = StandIn { package: "stall-nccl-stub", file: "libstall_nccl_stub.so" };

/// Builds a stand-in library and returns its path: next to `stall` in the
/// same profile's folder, where the tests look for it.
fn build_stand_in(lib: &StandIn, release: bool) -> Result<PathBuf> {
    let mut build = cmd::cargo();
    build.args(["build", "-p", lib.package]);
    if release {
        build.arg("--release");
    }
    cmd::run(&mut build)?;
    let profile = if release { "release" } else { "debug" };
    let path = cmd::target_dir().join(profile).join(lib.file);
    ensure!(path.is_file(), "the build succeeded but {} is missing", path.display());
    Ok(path)
}

/// A stand-in library built next to `stall` by [`build_stand_in`].
fn stand_in_next_to(lib: &StandIn, stall: &Path) -> Result<PathBuf> {
    let path = stall.with_file_name(lib.file);
    ensure!(path.is_file(), "{} is missing: `cargo build -p {}` builds it", path.display(), lib.package);
    Ok(path)
}

pub fn nvml_script(release: bool) -> Result<PathBuf> {
    build_stand_in(&NVML_SCRIPT, release)
}

pub fn nvml_script_next_to(stall: &Path) -> Result<PathBuf> {
    stand_in_next_to(&NVML_SCRIPT, stall)
}

pub fn cuda_stub(release: bool) -> Result<PathBuf> {
    build_stand_in(&CUDA_STUB, release)
}

pub fn cuda_stub_next_to(stall: &Path) -> Result<PathBuf> {
    stand_in_next_to(&CUDA_STUB, stall)
}

pub fn nccl_stub(release: bool) -> Result<PathBuf> {
    build_stand_in(&NCCL_STUB, release)
}

pub fn nccl_stub_next_to(stall: &Path) -> Result<PathBuf> {
    stand_in_next_to(&NCCL_STUB, stall)
}
