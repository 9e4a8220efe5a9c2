//! `cargo xtask test`, `lint` and `ci`.

use std::time::Instant;

use anyhow::Result;

use crate::{build, cmd, setup};

/// stall-ebpf only builds for bpfel-unknown-none (stall-agent's build script
/// builds it); host-side cargo commands over the workspace must leave it out.
const EXCLUDE_EBPF: [&str; 3] = ["--workspace", "--exclude", "stall-ebpf"];
const NEED_ROOT: &str = "integration tests load eBPF programs and need root; refusing to skip them";

/// Lints (unless `skip_lint`), builds the release agent and runs every test,
/// including the integration tests that load the eBPF programs for real.
/// `extra` goes to the test harness.
pub fn run(extra: &[String], skip_lint: bool) -> Result<()> {
    let start = Instant::now();
    // Checked first: skipping the privileged tests would make a green run meaningless.
    cmd::require_root(NEED_ROOT)?;
    setup::ensure()?;
    setup::ensure_test_packages()?;
    let torch = setup::ensure_torch()?;
    let datasets = setup::ensure_datasets()?;
    let schemas = setup::ensure_schemas()?;
    if !skip_lint {
        lint()?;
    }
    let stall = build::agent(true)?;
    // The GPU tests load it in place of libnvidia-ml (tests/nvml-script).
    let nvml = build::nvml_script(true)?;
    // The CUDA tests' jobs load it in place of libcudart (tests/cuda-stub).
    let cuda = build::cuda_stub(true)?;
    // The NCCL tests' jobs load it in place of libnccl (tests/nccl-stub).
    let nccl = build::nccl_stub(true)?;
    let mut test = cmd::cargo();
    test.arg("test")
        .args(EXCLUDE_EBPF)
        .arg("--release")
        .env("STALL_BIN", &stall)
        .env("STALL_NVML_SCRIPT_LIB", &nvml)
        .env("STALL_CUDA_STUB_LIB", &cuda)
        .env("STALL_NCCL_STUB_LIB", &nccl)
        .env("STALL_TORCH_PATH", &torch)
        .env("STALL_DATASETS_PATH", &datasets)
        .env("STALL_SCHEMAS_PATH", &schemas);
    if !extra.is_empty() {
        test.arg("--").args(extra);
    }
    cmd::run(&mut test)?;
    // The same integration tests on other kernels, in QEMU (docs/KERNELS.md).
    crate::vm::after_native_tests(&stall, extra)?;
    println!("xtask test: all passed in {:.0}s", start.elapsed().as_secs_f64());
    Ok(())
}

/// rustfmt check, then clippy with warnings denied.
pub fn lint() -> Result<()> {
    cmd::run(cmd::cargo().args(["fmt", "--all", "--", "--check"]))?;
    // clippy builds stall-agent, whose build script needs the BPF toolchain.
    setup::ensure()?;
    cmd::run(cmd::cargo().arg("clippy").args(EXCLUDE_EBPF).args(["--all-targets", "--", "-D", "warnings"]))?;
    println!("xtask lint: clean");
    Ok(())
}
