//! `cargo xtask gpu-check`: everything a machine with an NVIDIA GPU needs to
//! check stall against real PyTorch jobs, in one folder: the stall binary,
//! the training scripts (a slow DataLoader; a GPU-bound and a launch-bound
//! CUDA job for the probes on PyTorch's own libcudart) and `run.sh`, the one
//! command to run there.
use std::path::Path;

use anyhow::{Context, Result};

use crate::{build, cmd, setup};

const FILES: [&str; 3] = ["train_dataloader.py", "train_cuda.py", "run.sh"];

pub fn run(out: Option<&Path>) -> Result<()> {
    setup::ensure()?;
    let stall = build::agent(true)?;
    let dir = out.map(Path::to_path_buf).unwrap_or_else(|| cmd::target_dir().join("gpu-check"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::copy(&stall, dir.join("stall")).context("copying stall")?;
    let src = cmd::workspace_root().join("xtask/gpu-check");
    for f in FILES {
        std::fs::copy(src.join(f), dir.join(f)).with_context(|| format!("copying {f}"))?;
    }
    println!("gpu-check: ready in {}", dir.display());
    println!("On a machine with an NVIDIA GPU, PyTorch and nvidia-smi, as root, run:");
    println!("    {}/run.sh", dir.display());
    println!("It prints stall's verdict next to what nvidia-smi reported (OUT=dir keeps the raw files).");
    Ok(())
}
