//! `cargo xtask bench --vm KERNEL`: the syscall hooks' two backends side by
//! side on kernels that allow BPF trampolines (the development machines
//! refuse them). Each kernel boots in QEMU with the test initramfs plus
//! `bench-wl`; /init runs `bench-hooks.sh` instead of the tests: rounds of
//! no stall / trampolines / raw tracepoints, interleaved, each timing the
//! traced job's 4 KiB preads and an untraced neighbour's preads and
//! getppid calls. TCG's absolute times say nothing about hardware; the
//! ratios to the no-stall runs of the same boot are what the table shows.

use std::fmt::Write as _;
use std::fs;
use std::time::Duration;

use anyhow::{ensure, Context, Result};

use super::{ensure_packages, initramfs, kernel, qemu, vm_dir};
use crate::{build, cmd, setup};

const BACKENDS: [&str; 3] = ["none", "trampoline", "tracepoint"];
/// (who, workload, what one op is) in table order.
const ROWS: [(&str, &str, &str); 3] = [
    ("traced", "pread", "the traced job's 4 KiB pread"),
    ("neighbour", "pread", "an untraced neighbour's 4 KiB pread"),
    ("neighbour", "getppid", "an untraced neighbour's getppid (no hook on it)"),
];
const DOC: &str = "docs/BACKENDS.md";

/// One `STALL-BENCH:` line: who, workload, backend, ns per op.
#[derive(Debug, PartialEq)]
struct Sample {
    who: String,
    what: String,
    backend: String,
    ns_per_op: f64,
}

pub fn run(specs: &[String], rounds: usize, ops: u64) -> Result<()> {
    cmd::require_root("the VM bench builds and boots what the VM tests do")?;
    setup::ensure()?;
    ensure_packages()?;
    let stall = build::agent(true)?;
    let nvml = build::nvml_script(true)?;
    let cuda = build::cuda_stub(true)?;
    let nccl = build::nccl_stub(true)?;
    let gpu = initramfs::GpuLibs { nvml_script: &nvml, cuda_stub: &cuda, nccl_stub: &nccl };
    cmd::run(cmd::cargo().args(["build", "--release", "-p", "bench-workloads"]))?;
    let wl = cmd::target_dir().join("release/bench-wl");
    let dir = vm_dir();
    let kernels = kernel::resolve_all(specs, &dir.join("kernels"))?;
    let initramfs =
        initramfs::build(&dir, &stall, &gpu, &[], &[], &kernels, &[(wl.as_path(), "stall/bin/bench-wl")])?;
    let args = vec!["--bench-hooks".to_string(), rounds.to_string(), ops.to_string()];
    let mut doc = String::from(HEADER);
    for k in &kernels {
        let log = dir.join("logs").join(format!("{}-bench.log", k.name));
        let timeout = Duration::from_secs(120 + rounds as u64 * 240);
        let outcome = qemu::boot(k, None, &initramfs, &args, timeout, &log)?;
        let text = fs::read_to_string(&log).with_context(|| format!("reading {}", log.display()))?;
        let failures: Vec<&str> = text.lines().filter(|l| l.contains("STALL-BENCH-FAIL:")).collect();
        ensure!(
            outcome.passed && failures.is_empty(),
            "the bench failed on {}: {} {}",
            k.name,
            outcome.detail,
            failures.join("; ")
        );
        let samples: Vec<Sample> = text.lines().filter_map(parse).collect();
        let table = table(&samples)?;
        println!("\nsyscall hook backends on {} ({rounds} rounds, {ops} ops each):\n{table}", k.name);
        let _ =
            write!(doc, "\n## {}\n\n{rounds} rounds of {ops} ops per sample, medians.\n\n{table}", k.name);
    }
    let path = cmd::workspace_root().join(DOC);
    fs::write(&path, doc).with_context(|| format!("writing {}", path.display()))?;
    println!("xtask bench --vm: wrote {}", path.display());
    Ok(())
}

const HEADER: &str = "# Syscall hook backends, side by side

Written by `cargo xtask bench --vm KERNEL` (xtask/src/vm/hooks_bench.rs); do not edit by hand.

stall hooks file reads, writes, opens and closes either with BPF trampolines (fentry/fexit on the
hooked syscalls' own functions) or with the raw syscall tracepoints (docs/KERNELS.md, \"Syscall
hooks\"). The development machines refuse trampolines, so this bench boots Debian kernels that
allow them in QEMU and runs, round by round and interleaved: no stall, `stall --syscall-hooks
trampoline`, `stall --syscall-hooks tracepoint`. Each mode times three loops: the traced job's own
4 KiB preads of a cached file (under `stall run`), and an untraced neighbour's 4 KiB preads and
`getppid` calls while stall traces another process (`stall attach --pid` on a sleeper), the agent
stopped (SIGSTOP) during those loops with its programs attached: both vCPUs of the guest share one
host thread, so the agent's own CPU time would otherwise weigh as much as the hooks. The traced
job's rows include the agent (it has that job's events to handle).

QEMU here is TCG (no KVM): absolute times are those of an emulated CPU and say nothing about real
hardware. The ratios compare like with like, in one boot: ×1.00 is no cost. The neighbour rows are
what an always-on agent must not tax; on trampolines only callers of the hooked syscalls run a
program, on tracepoints every syscall of the machine takes the slow path.
";

/// `STALL-BENCH: who what backend ops=N ns=T` anywhere in a console line.
fn parse(line: &str) -> Option<Sample> {
    let rest = line.split_once("STALL-BENCH: ")?.1;
    let mut words = rest.split_whitespace();
    let (who, what, backend) = (words.next()?, words.next()?, words.next()?);
    let mut ops = None;
    let mut ns = None;
    for w in words {
        match w.split_once('=') {
            Some(("ops", v)) => ops = v.parse::<f64>().ok(),
            Some(("ns", v)) => ns = v.parse::<f64>().ok(),
            _ => {}
        }
    }
    let (ops, ns) = (ops.filter(|o| *o > 0.0)?, ns?);
    Some(Sample { who: who.into(), what: what.into(), backend: backend.into(), ns_per_op: ns / ops })
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 })
}

/// Median ns per op of each row under each backend, and the ratio to none.
fn table(samples: &[Sample]) -> Result<String> {
    let mut out = String::from("| loop | no stall | trampoline | tracepoint |\n|---|---|---|---|\n");
    for (who, what, label) in ROWS {
        let med = |backend: &str| {
            median(
                samples
                    .iter()
                    .filter(|s| s.who == who && s.what == what && s.backend == backend)
                    .map(|s| s.ns_per_op)
                    .collect(),
            )
        };
        let meds: Vec<Option<f64>> = BACKENDS.iter().map(|b| med(b)).collect();
        let base = meds[0].with_context(|| format!("no samples of {who} {what} without stall"))?;
        let cell = |m: Option<f64>| match m {
            Some(m) => format!("{m:.0} ns (×{:.2})", m / base),
            None => "-".to_string(),
        };
        let _ = writeln!(out, "| {label} | {base:.0} ns | {} | {} |", cell(meds[1]), cell(meds[2]));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_bench_lines_from_the_console() {
        let s = parse("[6.12] STALL-BENCH: neighbour getppid trampoline ops=1000 ns=250000").unwrap();
        assert_eq!(s.who, "neighbour");
        assert_eq!(s.what, "getppid");
        assert_eq!(s.backend, "trampoline");
        assert_eq!(s.ns_per_op, 250.0);
        assert!(parse("STALL-BENCH: traced pread none ops=0 ns=5").is_none());
        assert!(parse("STALL-BENCH-FAIL: traced pread none: boom").is_none());
        assert!(parse("unrelated").is_none());
    }

    #[test]
    fn table_gives_medians_and_ratios_to_no_stall() {
        let mut samples = Vec::new();
        for (who, what) in [("traced", "pread"), ("neighbour", "pread"), ("neighbour", "getppid")] {
            for (backend, ns) in [("none", [100.0, 110.0, 90.0]), ("trampoline", [120.0, 130.0, 125.0])] {
                for n in ns {
                    samples.push(Sample {
                        who: who.into(),
                        what: what.into(),
                        backend: backend.into(),
                        ns_per_op: n,
                    });
                }
            }
        }
        let t = table(&samples).unwrap();
        assert!(t.contains("| the traced job's 4 KiB pread | 100 ns | 125 ns (×1.25) | - |"), "{t}");
        samples.retain(|s| s.backend != "none");
        assert!(table(&samples).is_err());
    }
}
