//! `--before REV`: stall as of another revision, checked out in a worktree
//! of its own under target/bench/before and built there, so that a change
//! is measured beside the build it changes, in the same run on the same
//! machine (between two bench runs this machine's figures move by more
//! than most changes do).
use std::path::PathBuf;

use anyhow::{ensure, Context, Result};

use crate::cmd;

/// A revision's stall.
pub struct Build {
    /// The revision, abbreviated.
    pub rev: String,
    pub stall: PathBuf,
}

/// Checks `rev` out (once) and builds its agent (a no-op when built).
pub fn build(rev: &str) -> Result<Build> {
    let out = cmd::output(
        cmd::command("git").args(["rev-parse", "--short=7", "--verify"]).arg(format!("{rev}^{{commit}}")),
    )?;
    ensure!(out.status.success(), "--before {rev}: not a revision of this repository");
    let short = String::from_utf8(out.stdout).context("git printed non-UTF-8")?.trim().to_string();
    let dir = cmd::target_dir().join("bench/before");
    let src = dir.join(format!("src-{short}"));
    if !src.join("Cargo.toml").is_file() {
        // A worktree whose folder was removed is still registered until pruned.
        cmd::run(cmd::command("git").args(["worktree", "prune"]))?;
        cmd::run(cmd::command("git").args(["worktree", "add", "--detach", "--force"]).arg(&src).arg(&short))?;
    }
    // Its own target folder: the current build's must stay as it is.
    let target = dir.join("target");
    cmd::run(cmd::cargo().current_dir(&src).env("CARGO_TARGET_DIR", &target).args([
        "build",
        "--release",
        "-p",
        "stall-agent",
        "--bin",
        "stall",
    ]))?;
    let stall = target.join("release/stall");
    ensure!(stall.is_file(), "building {short} gave no {}", stall.display());
    Ok(Build { rev: short, stall })
}
