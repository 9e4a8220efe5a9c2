//! Each kernel's test runs split into shards, one boot each, so that two
//! slots (one host CPU each) share out the work of all kernels instead of
//! waiting on the slowest kernel's whole run. The guest's /init lists its
//! runs (binary and syscall-hook backend) and keeps its shard's share,
//! assigned by shard.awk from [`RUN_SECONDS`]; xtask boots every (kernel,
//! shard), longest first, and merges each kernel's shards into one row.

use std::fmt::Write as _;

use super::qemu::Outcome;
pub use super::qemu::Shard;
use super::Row;

/// The assignment /init runs (busybox awk), written into the initramfs.
pub const SHARD_AWK: &str = include_str!("shard.awk");
pub const GUEST_SHARD_AWK: &str = "stall/shard.awk";
/// [`RUN_SECONDS`] for shard.awk, `LABEL SECONDS` a line.
pub const GUEST_WEIGHTS: &str = "stall/weights";
/// Shards per kernel: with two slots, two shards a kernel let the phase
/// take about half its total work.
pub const DEFAULT_SHARDS: u16 = 2;
/// What each run took under TCG on a 2-CPU host (the slower of 6.1 and
/// 6.12 for the labelled runs, 5.10 for the bare names, which only kernels
/// without trampolines run), in seconds, as /init labels them; only the
/// ratios matter. A run not listed weighs [`OTHER_RUN_SECONDS`].
const RUN_SECONDS: [(&str, u32); 33] = [
    ("capture[trampoline]", 168),
    ("daemon[trampoline]", 153),
    ("faults[trampoline]", 118),
    ("scenarios[tracepoint]", 103),
    ("capture[tracepoint]", 72),
    ("causes[tracepoint]", 65),
    ("waits[tracepoint]", 75),
    ("privilege[trampoline]", 49),
    ("progress[tracepoint]", 46),
    ("cuda[tracepoint]", 46),
    ("stress[tracepoint]", 40),
    ("ranks[tracepoint]", 32),
    ("pystacks[tracepoint]", 32),
    ("web[tracepoint]", 28),
    ("run[tracepoint]", 26),
    ("hooks[trampoline]", 23),
    ("gpu[tracepoint]", 20),
    ("hooks[tracepoint]", 17),
    ("chains[tracepoint]", 60),
    ("scenarios", 99),
    ("daemon", 95),
    ("causes", 62),
    ("capture", 58),
    ("waits", 75),
    ("progress", 47),
    ("stress", 44),
    ("faults", 42),
    ("cuda", 40),
    ("ranks", 32),
    ("pystacks", 31),
    ("web", 28),
    ("run", 25),
    ("chains", 60),
];
/// The short runs (errors, leak, signals, timeline, …) and any new one.
const OTHER_RUN_SECONDS: u32 = 10;

/// The weights file for shard.awk.
pub fn weights() -> String {
    let mut out = String::new();
    for (label, secs) in RUN_SECONDS {
        let _ = writeln!(out, "{label} {secs}");
    }
    let _ = writeln!(out, "* {OTHER_RUN_SECONDS}");
    out
}

/// Every boot, as (kernel index, shard), longest first: kernels are listed
/// slowest first (kernel::DEFAULT), and a kernel's first shard gets its
/// heaviest run. Two slots taking them in this order end within about one
/// shard of each other.
pub fn boots(kernels: usize, shards: usize) -> Vec<(usize, Shard)> {
    let count = shards.max(1);
    (0..kernels).flat_map(|k| (1..=count).map(move |index| (k, Shard { index, count }))).collect()
}

/// The passed and failed counts of a shard's verdict (`PASS 18 passed`,
/// `FAIL 17 passed, 1 failed; failing: leak`); zeros where it has none.
fn counts(verdict: &str) -> (u64, u64) {
    let words: Vec<&str> = verdict.split_whitespace().collect();
    let before = |what: &str| {
        words
            .windows(2)
            .find(|w| w[1].trim_end_matches([',', ';']) == what)
            .and_then(|w| w[0].parse().ok())
            .unwrap_or(0)
    };
    (before("passed"), before("failed"))
}

/// One table row for a kernel from its shards' outcomes: PASS only if
/// every shard passed and some test ran; counts summed; a failing shard's
/// verdict in the detail. Boot is the slowest shard's, tests the shards'
/// sum (the kernel's work, more than the wall time when they overlap).
pub fn merge(kernel: &str, shards: &[(Shard, Outcome)]) -> Row {
    let (mut passed, mut failed) = (0, 0);
    let mut failing = Vec::new();
    for (shard, o) in shards {
        let (p, f) = counts(&o.detail);
        passed += p;
        failed += f;
        if !o.passed {
            failing.push(match shard.count {
                1 => o.detail.clone(),
                n => format!("shard {}/{n}: {}", shard.index, o.detail),
            });
        }
    }
    let many = shards.len() > 1;
    let ok = failing.is_empty() && passed > 0;
    let detail = if !failing.is_empty() && !many {
        failing.concat()
    } else if !failing.is_empty() {
        format!("FAIL {passed} passed, {failed} failed; {}", failing.join("; "))
    } else if passed == 0 {
        "FAIL no test ran (does the filter match any?)".to_string()
    } else if many {
        format!("PASS {passed} passed ({} shards)", shards.len())
    } else {
        format!("PASS {passed} passed")
    };
    Row {
        kernel: kernel.to_string(),
        place: "qemu",
        boot: shards.iter().filter_map(|(_, o)| o.boot).max(),
        tests: shards.iter().filter_map(|(_, o)| o.tests).reduce(|a, b| a + b),
        passed: ok,
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::process::{Command, Stdio};
    use std::time::Duration;

    /// A finished shard.
    fn outcome(passed: bool, detail: &str, tests: u64) -> Outcome {
        Outcome {
            passed,
            detail: detail.to_string(),
            boot: Some(Duration::from_secs(5)),
            tests: Some(Duration::from_secs(tests)),
        }
    }

    /// shard.awk's pick for `shard` among `runs` (labels, in order), run
    /// by the host's awk as /init runs it by busybox's.
    fn pick(shard: &str, runs: &[&str]) -> Vec<String> {
        let dir = std::env::temp_dir()
            .join(format!("xtask-shard-{}-{shard}", std::process::id()).replace('/', "-"));
        std::fs::create_dir_all(&dir).unwrap();
        let (awk, weights_path) = (dir.join("shard.awk"), dir.join("weights"));
        std::fs::write(&awk, SHARD_AWK).unwrap();
        std::fs::write(&weights_path, weights()).unwrap();
        let mut child = Command::new("awk")
            .arg("-v")
            .arg(format!("shard={shard}"))
            .arg("-f")
            .arg(&awk)
            .arg(&weights_path)
            .arg("-")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("awk");
        let list: String = runs.iter().map(|r| format!("{r} /stall/tests/x backend\n")).collect();
        child.stdin.take().unwrap().write_all(list.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(out.status.success(), "awk failed for shard {shard}");
        String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect()
    }

    /// 6.1's runs, in /init's order.
    const TRAMPOLINE_KERNEL: [&str; 25] = [
        "capture[trampoline]",
        "daemon[trampoline]",
        "faults[trampoline]",
        "hooks[trampoline]",
        "privilege[trampoline]",
        "capture[tracepoint]",
        "causes[tracepoint]",
        "cuda[tracepoint]",
        "errors[tracepoint]",
        "gpu[tracepoint]",
        "hooks[tracepoint]",
        "kube[tracepoint]",
        "leak[tracepoint]",
        "manifests[tracepoint]",
        "overflow[tracepoint]",
        "progress[tracepoint]",
        "pystacks[tracepoint]",
        "ranks[tracepoint]",
        "run[tracepoint]",
        "scenarios[tracepoint]",
        "signals[tracepoint]",
        "stress[tracepoint]",
        "timeline[tracepoint]",
        "waits[tracepoint]",
        "web[tracepoint]",
    ];

    fn seconds(label: &str) -> u32 {
        RUN_SECONDS.iter().find(|(l, _)| *l == label).map_or(OTHER_RUN_SECONDS, |(_, s)| *s)
    }

    #[test]
    fn shards_take_every_run_once_and_share_the_work() {
        for count in 1..=4 {
            let picks: Vec<Vec<String>> =
                (1..=count).map(|k| pick(&format!("{k}/{count}"), &TRAMPOLINE_KERNEL)).collect();
            let mut all: Vec<&str> = picks.iter().flatten().map(String::as_str).collect();
            all.sort_unstable();
            let mut want = TRAMPOLINE_KERNEL.to_vec();
            want.sort_unstable();
            assert_eq!(all, want, "{count} shards");
            let loads: Vec<u32> = picks.iter().map(|p| p.iter().map(|l| seconds(l)).sum()).collect();
            let (max, min) = (*loads.iter().max().unwrap(), *loads.iter().min().unwrap());
            // Longest first, least loaded next: within the heaviest run.
            assert!(max - min <= 168, "{count} shards: {loads:?}");
        }
        let halves = (pick("1/2", &TRAMPOLINE_KERNEL), pick("2/2", &TRAMPOLINE_KERNEL));
        // The three costliest runs are not all on one shard.
        assert_eq!(halves.0[0], "capture[trampoline]");
        assert_eq!(halves.1[0], "daemon[trampoline]");
        // Each shard runs its share in /init's order.
        let order = |p: &[String]| {
            p.iter().map(|l| TRAMPOLINE_KERNEL.iter().position(|r| r == l).unwrap()).collect::<Vec<_>>()
        };
        for p in [&halves.0, &halves.1] {
            let o = order(p);
            assert!(o.windows(2).all(|w| w[0] < w[1]), "{p:?}");
        }
    }

    #[test]
    fn an_unknown_run_still_lands_somewhere_and_a_bad_shard_fails() {
        let runs = ["new", "capture", "leak"];
        let mut both = pick("1/2", &runs);
        both.extend(pick("2/2", &runs));
        both.sort_unstable();
        assert_eq!(both, ["capture", "leak", "new"]);
        assert_eq!(pick("3/3", &["only"]), Vec::<String>::new());
        let bad = Command::new("awk")
            .args(["-v", "shard=3/2", "-f", "/dev/stdin", "/dev/null", "/dev/null"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .and_then(|mut c| {
                c.stdin.take().unwrap().write_all(SHARD_AWK.as_bytes())?;
                c.wait()
            })
            .unwrap();
        assert!(!bad.success());
    }

    #[test]
    fn boots_go_kernel_by_kernel_each_shard_once() {
        let b = boots(3, 2);
        assert_eq!(b.len(), 6);
        assert_eq!(b[0], (0, Shard { index: 1, count: 2 }));
        assert_eq!(b[1], (0, Shard { index: 2, count: 2 }));
        assert_eq!(b[5], (2, Shard { index: 2, count: 2 }));
        assert_eq!(boots(2, 0), [(0, Shard { index: 1, count: 1 }), (1, Shard { index: 1, count: 1 })]);
        assert_eq!(Shard { index: 2, count: 3 }.kernel_arg().as_deref(), Some("stall.shard=2/3"));
        assert_eq!(Shard { index: 1, count: 1 }.kernel_arg(), None);
    }

    #[test]
    fn a_kernels_shards_merge_into_one_row() {
        let s = |index| Shard { index, count: 2 };
        let row = merge(
            "6.1",
            &[(s(1), outcome(true, "PASS 10 passed", 500)), (s(2), outcome(true, "PASS 8 passed", 400))],
        );
        assert!(row.passed);
        assert_eq!(row.detail, "PASS 18 passed (2 shards)");
        assert_eq!(row.tests, Some(Duration::from_secs(900)));
        assert_eq!(row.boot, Some(Duration::from_secs(5)));

        let row = merge(
            "6.1",
            &[
                (s(1), outcome(false, "FAIL 9 passed, 1 failed; failing: leak[tracepoint]", 500)),
                (s(2), outcome(true, "PASS 8 passed", 400)),
            ],
        );
        assert!(!row.passed);
        assert_eq!(
            row.detail,
            "FAIL 17 passed, 1 failed; shard 1/2: FAIL 9 passed, 1 failed; failing: leak[tracepoint]"
        );

        let row = merge(
            "6.1",
            &[
                (s(1), outcome(true, "PASS 3 passed", 50)),
                (s(2), outcome(false, "FAIL timed out after 1800s", 1800)),
            ],
        );
        assert!(!row.passed && row.detail.contains("shard 2/2: FAIL timed out"), "{}", row.detail);

        // A filter that matches nothing in one shard is no failure; in all, it is.
        let row = merge(
            "5.10",
            &[(s(1), outcome(true, "PASS 0 passed", 9)), (s(2), outcome(true, "PASS 2 passed", 9))],
        );
        assert!(row.passed, "{}", row.detail);
        let row = merge(
            "5.10",
            &[(s(1), outcome(true, "PASS 0 passed", 9)), (s(2), outcome(true, "PASS 0 passed", 9))],
        );
        assert!(!row.passed && row.detail.contains("no test ran"), "{}", row.detail);

        let one = Shard { index: 1, count: 1 };
        let row = merge("6.12", &[(one, outcome(false, "FAIL no test ran (does the filter match any?)", 9))]);
        assert_eq!(row.detail, "FAIL no test ran (does the filter match any?)");
    }
}
