//! The table's host row: the same test binaries, run natively on the running
//! kernel the way `cargo test` runs them (from the tests crate's folder).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::Instant;

use anyhow::{Context, Result};

use super::{Row, TestBin};
use crate::cmd;

/// Runs each binary with the harness arguments `args`, its output shown
/// prefixed with `[host]`.
pub fn run(stall: &Path, tests: &[TestBin], args: &[String]) -> Result<Row> {
    let start = Instant::now();
    let torch = crate::setup::ensure_torch()?;
    let datasets = crate::setup::ensure_datasets()?;
    // The manifests' schema checks run here only (not in the VMs); without
    // the schemas `cargo xtask test` installs they fail on a fresh machine.
    let schemas = crate::setup::ensure_schemas()?;
    let (mut passed, mut failed, mut failing) = (0, 0, Vec::new());
    for t in tests {
        let mut test = cmd::command(&t.path);
        test.args(args)
            .env("STALL_BIN", stall)
            .env("STALL_NVML_SCRIPT_LIB", crate::build::nvml_script_next_to(stall)?)
            .env("STALL_CUDA_STUB_LIB", crate::build::cuda_stub_next_to(stall)?)
            .env("STALL_NCCL_STUB_LIB", crate::build::nccl_stub_next_to(stall)?)
            .env("STALL_TORCH_PATH", &torch)
            .env("STALL_DATASETS_PATH", &datasets)
            .env("STALL_SCHEMAS_PATH", &schemas)
            .current_dir(cmd::workspace_root().join("tests"));
        println!("xtask: $ {}", cmd::describe(&test));
        let mut child =
            test.stdout(Stdio::piped()).spawn().with_context(|| format!("starting {}", t.name))?;
        let stdout = child.stdout.take().context("the test's stdout")?;
        for line in BufReader::new(stdout).lines() {
            let line = line.with_context(|| format!("reading {}'s output", t.name))?;
            println!("[host] {line}");
            if let Some((p, f)) = tally(&line) {
                passed += p;
                failed += f;
            }
        }
        if !child.wait().with_context(|| format!("waiting for {}", t.name))?.success() {
            failing.push(t.name.as_str());
        }
    }
    let ok = failing.is_empty() && passed > 0;
    let detail = if !failing.is_empty() {
        format!("FAIL {passed} passed, {failed} failed; failing: {}", failing.join(" "))
    } else if passed == 0 {
        "FAIL no test ran (does the filter match any?)".to_string()
    } else {
        format!("PASS {passed} passed")
    };
    Ok(Row {
        kernel: kernel_release(),
        place: "native",
        boot: None,
        tests: Some(start.elapsed()),
        passed: ok,
        detail,
    })
}

/// Passed and failed counts from libtest's "test result: ok. 8 passed; 0 failed; ..." line.
fn tally(line: &str) -> Option<(u64, u64)> {
    let rest = line.strip_prefix("test result: ")?;
    let words: Vec<&str> = rest.split_whitespace().collect();
    let count = |label: &str| -> Option<u64> {
        let at = words.iter().position(|w| w.trim_end_matches(';') == label)?;
        words.get(at.checked_sub(1)?)?.parse().ok()
    };
    Some((count("passed")?, count("failed")?))
}

/// The running kernel's release (`uname -r`).
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or_else(|_| "host".into(), |r| r.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_libtest_results() {
        let line = "test result: FAILED. 0 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 2.24s";
        assert_eq!(tally(line), Some((0, 1)));
        assert_eq!(tally("test result: ok. 8 passed; 0 failed; 0 ignored"), Some((8, 0)));
        assert_eq!(tally("running 8 tests"), None);
    }
}
