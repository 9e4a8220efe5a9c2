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

/// File name of the scripted NVML library the GPU tests load (crate
/// `tests/nvml-script`).
pub const NVML_SCRIPT_LIB: &str = "libstall_nvml_script.so";

/// Builds the scripted NVML library and returns its path: next to `stall`
/// in the same profile's folder, where the tests look for it.
pub fn nvml_script(release: bool) -> Result<PathBuf> {
    let mut build = cmd::cargo();
    build.args(["build", "-p", "stall-nvml-script"]);
    if release {
        build.arg("--release");
    }
    cmd::run(&mut build)?;
    let profile = if release { "release" } else { "debug" };
    let lib = cmd::target_dir().join(profile).join(NVML_SCRIPT_LIB);
    ensure!(lib.is_file(), "the build succeeded but {} is missing", lib.display());
    Ok(lib)
}

/// The scripted NVML library built next to `stall` by [`nvml_script`].
pub fn nvml_script_next_to(stall: &Path) -> Result<PathBuf> {
    let lib = stall.with_file_name(NVML_SCRIPT_LIB);
    ensure!(lib.is_file(), "{} is missing: `cargo build -p stall-nvml-script` builds it", lib.display());
    Ok(lib)
}

/// File name of the stand-in CUDA library the CUDA tests load (crate
/// `tests/cuda-stub`).
pub const CUDA_STUB_LIB: &str = "libstall_cuda_stub.so";

/// Builds the stand-in CUDA library and returns its path: next to `stall`
/// in the same profile's folder, where the tests look for it.
pub fn cuda_stub(release: bool) -> Result<PathBuf> {
    let mut build = cmd::cargo();
    build.args(["build", "-p", "stall-cuda-stub"]);
    if release {
        build.arg("--release");
    }
    cmd::run(&mut build)?;
    let profile = if release { "release" } else { "debug" };
    let lib = cmd::target_dir().join(profile).join(CUDA_STUB_LIB);
    ensure!(lib.is_file(), "the build succeeded but {} is missing", lib.display());
    Ok(lib)
}

/// The stand-in CUDA library built next to `stall` by [`cuda_stub`].
pub fn cuda_stub_next_to(stall: &Path) -> Result<PathBuf> {
    let lib = stall.with_file_name(CUDA_STUB_LIB);
    ensure!(lib.is_file(), "{} is missing: `cargo build -p stall-cuda-stub` builds it", lib.display());
    Ok(lib)
}
