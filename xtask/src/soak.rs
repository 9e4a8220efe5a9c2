//! `cargo xtask soak`: `stall daemon` under jobs that start and stop every
//! few seconds for a while; its memory must stay flat and nothing may stay
//! loaded after SIGTERM (tests/workloads/soak.py does the work and judges).
use anyhow::Result;

use crate::{build, cmd, setup};

pub fn run(minutes: f64) -> Result<()> {
    cmd::require_root("the soak runs stall daemon, which loads eBPF programs")?;
    setup::ensure()?;
    let stall = build::agent(true)?;
    let script = cmd::workspace_root().join("tests/workloads/soak.py");
    cmd::run(
        cmd::command("python3")
            .arg(script)
            .arg("--stall")
            .arg(stall)
            .arg("--minutes")
            .arg(minutes.to_string()),
    )
}
