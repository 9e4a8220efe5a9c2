//! Boots one kernel in QEMU with the test initramfs, streams its serial
//! console (each line prefixed with the kernel's name, and into a log file)
//! and reads /init's verdict from it: QEMU's own exit status is 0 whether
//! the tests passed, failed or the kernel panicked.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::Stdio;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

use super::create_parent;
use super::kernel::Kernel;
use crate::cmd;

const QEMU: &str = "qemu-system-x86_64";
/// TCG, not KVM: /dev/kvm on these machines is a software hypervisor whose
/// guests hang or crash. One host thread for both vCPUs: under multi-threaded
/// TCG a 6.12 guest died of an "Oops: int3" in try_to_wake_up while stall
/// loaded its programs (apparently a breakpoint left by the kernel's live
/// code patching, seen by the other vCPU), and the tests run no slower
/// single-threaded (docs/KERNELS.md). No disk, no network: the initramfs
/// is the whole system.
const QEMU_ARGS: [&str; 13] = [
    "-accel",
    "tcg,thread=single",
    "-cpu",
    "max",
    "-m",
    "2G",
    "-smp",
    "2",
    "-nographic",
    "-no-reboot",
    "-net",
    "none",
    "-no-user-config",
];
/// `panic=-1` with `-no-reboot`: a panic ends QEMU at once instead of
/// waiting for the timeout.
const KERNEL_ARGS: &str = "console=ttyS0 panic=-1 quiet";
/// Printed by /init (init.sh) once it runs, and as its last line.
const INIT_MARK: &str = "STALL-VM-INIT: ";
const RESULT_MARK: &str = "STALL-VM-RESULT: ";
/// Printed by /init before each test binary (`STALL-VM: running LABEL ...`)
/// and after it (`STALL-VM: LABEL exited RC after Ns`).
const BINARY_MARK: &str = "STALL-VM: ";
/// One test at a time in the VM: the timing checks' workloads need the two
/// emulated CPUs to themselves.
const DEFAULT_THREADS: &str = "--test-threads=1";
/// The kernel passes at most 32 init arguments (CONFIG_INIT_ENV_ARG_LIMIT)
/// and its command line is cut at 2048 bytes.
const MAX_INIT_ARGS: usize = 30;
const MAX_CMDLINE: usize = 2000;

/// What one boot gave.
pub struct Outcome {
    pub passed: bool,
    pub detail: String,
    /// From starting QEMU to /init running.
    pub boot: Option<Duration>,
    /// From /init running to its result line.
    pub tests: Option<Duration>,
}

/// The test harness arguments for the guest: the user's, with one test
/// thread unless they chose.
pub fn harness_args(user: &[String]) -> Vec<String> {
    let mut args = Vec::with_capacity(user.len() + 1);
    if !user.iter().any(|a| a.starts_with("--test-threads")) {
        args.push(DEFAULT_THREADS.to_string());
    }
    args.extend(user.iter().cloned());
    args
}

/// One of a kernel's shards: `index` of `count`, from 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

impl Shard {
    /// What /init reads from /proc/cmdline; none for a single shard, which
    /// runs everything.
    pub fn kernel_arg(self) -> Option<String> {
        (self.count > 1).then(|| format!("stall.shard={}/{}", self.index, self.count))
    }

    /// The suffix of its console log's name and of its console lines.
    pub fn tag(self) -> Option<String> {
        (self.count > 1).then(|| format!("{}of{}", self.index, self.count))
    }
}

/// The kernel command line: the shard /init reads from /proc/cmdline, then
/// what follows `--`, which becomes /init's arguments, double quotes keeping
/// an argument with spaces whole.
fn kernel_cmdline(args: &[String], shard: Option<Shard>) -> Result<String> {
    ensure!(args.len() <= MAX_INIT_ARGS, "at most {MAX_INIT_ARGS} test harness arguments fit the kernel's");
    let mut line = KERNEL_ARGS.to_string();
    if let Some(arg) = shard.and_then(Shard::kernel_arg) {
        line.push(' ');
        line.push_str(&arg);
    }
    line.push_str(" --");
    for arg in args {
        ensure!(
            !arg.contains('"') && !arg.chars().any(char::is_control) && !arg.is_empty(),
            "test harness argument {arg:?} cannot go on a kernel command line (empty, a quote or a control character)"
        );
        if arg.contains(char::is_whitespace) {
            line.push_str(&format!(" \"{arg}\""));
        } else {
            line.push(' ');
            line.push_str(arg);
        }
    }
    ensure!(line.len() <= MAX_CMDLINE, "the test harness arguments are too long for a kernel command line");
    Ok(line)
}

/// Boots `kernel`, runs the tests (`shard`'s share of them, if given), and
/// gives up (killing QEMU) after `timeout`.
pub fn boot(
    kernel: &Kernel,
    shard: Option<Shard>,
    initramfs: &Path,
    args: &[String],
    timeout: Duration,
    log: &Path,
) -> Result<Outcome> {
    create_parent(log)?;
    let mut log_file = File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let mut qemu = cmd::command(QEMU);
    qemu.args(QEMU_ARGS)
        .arg("-kernel")
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(initramfs)
        .arg("-append")
        .arg(kernel_cmdline(args, shard)?);
    let name = match shard.and_then(Shard::tag) {
        Some(tag) => format!("{} {tag}", kernel.name),
        None => kernel.name.clone(),
    };
    println!("xtask: $ {}", cmd::describe(&qemu));
    qemu.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = qemu.spawn().with_context(|| format!("could not start {QEMU}"))?;
    let (tx, rx) = mpsc::channel();
    forward_lines(child.stdout.take().context("qemu's stdout")?, "", tx.clone());
    forward_lines(child.stderr.take().context("qemu's stderr")?, "qemu: ", tx);

    let mut console = Console::default();
    let deadline = start + timeout;
    let timed_out = loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(raw) => {
                let line = clean(&raw);
                if let Err(e) = writeln!(log_file, "{line}") {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(e).with_context(|| format!("writing {}", log.display()));
                }
                println!("[{name}] {line}");
                console.see(&line, start.elapsed());
            }
            Err(RecvTimeoutError::Disconnected) => break false,
            Err(RecvTimeoutError::Timeout) => {
                // Our own child, by its handle.
                let _ = child.kill();
                break true;
            }
        }
    };
    let status = child.wait().context("waiting for qemu")?;
    let elapsed = start.elapsed();
    Ok(console.outcome(timed_out, status.success(), timeout, elapsed, log))
}

/// Sends each line read from `from` (lossily decoded) to `to`, from a thread.
fn forward_lines(from: impl Read + Send + 'static, prefix: &'static str, to: Sender<String>) {
    thread::spawn(move || {
        let mut reader = BufReader::new(from);
        let mut buf = Vec::new();
        while matches!(reader.read_until(b'\n', &mut buf), Ok(n) if n > 0) {
            let line = format!("{prefix}{}", String::from_utf8_lossy(&buf));
            if to.send(line).is_err() {
                break;
            }
            buf.clear();
        }
    });
}

/// Drops terminal escape sequences (SeaBIOS clears the screen) and control
/// characters, and the line ending.
fn clean(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => {
                // CSI: ESC [ params final (@..~); otherwise ESC and one char.
                if chars.next() == Some('[') {
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                }
            }
            '\t' => out.push(c),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// What the console said so far.
#[derive(Default)]
struct Console {
    booted: Option<Duration>,
    result: Option<(Duration, String)>,
    /// The test binary /init runs now (its label) and since when: where a
    /// run that times out was.
    running: Option<(String, Duration)>,
    /// The last test that began (the harness prints `test NAME ...`).
    last_test: Option<String>,
}

impl Console {
    fn see(&mut self, line: &str, at: Duration) {
        if line.starts_with(INIT_MARK) && self.booted.is_none() {
            self.booted = Some(at);
        } else if let Some(verdict) = line.strip_prefix(RESULT_MARK) {
            self.result = Some((at, verdict.trim().to_string()));
        } else if let Some(rest) = line.strip_prefix(BINARY_MARK) {
            if let Some(label) = rest.strip_prefix("running ").and_then(|r| r.split(' ').next()) {
                self.running = Some((label.to_string(), at));
                self.last_test = None;
            } else if rest.contains(" exited ") {
                self.running = None;
            }
        } else if let Some(test) = line.strip_prefix("test ").and_then(|t| t.split(" ...").next()) {
            if !test.starts_with("result:") && !test.is_empty() {
                self.last_test = Some(test.to_string());
            }
        }
    }

    /// Where the tests were when they ran out of time.
    fn whereabouts(&self, total: Duration) -> String {
        match &self.running {
            Some((label, since)) => {
                let mut at =
                    format!(" in {label} ({:.0}s into it", total.saturating_sub(*since).as_secs_f64());
                if let Some(test) = &self.last_test {
                    at.push_str(&format!(", last test begun: {test}"));
                }
                at.push(')');
                at
            }
            None => String::new(),
        }
    }

    fn outcome(
        self,
        timed_out: bool,
        exited_ok: bool,
        timeout: Duration,
        total: Duration,
        log: &Path,
    ) -> Outcome {
        let tests = match (self.booted, &self.result) {
            (Some(booted), Some((done, _))) => Some(done.saturating_sub(booted)),
            (Some(booted), None) => Some(total.saturating_sub(booted)),
            _ => None,
        };
        let (passed, detail) = match self.result {
            Some((_, verdict)) => (verdict.starts_with("PASS") && exited_ok, verdict),
            None if timed_out => (
                false,
                format!(
                    "FAIL timed out after {}s{} (see {})",
                    timeout.as_secs(),
                    self.whereabouts(total),
                    log.display()
                ),
            ),
            None if self.booted.is_none() => (
                false,
                format!("FAIL /init never ran: kernel panic or bad initramfs? (see {})", log.display()),
            ),
            None => (false, format!("FAIL no result line: /init or the kernel died (see {})", log.display())),
        };
        Outcome { passed, detail, boot: self.booted, tests }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn harness_gets_one_thread_unless_told() {
        assert_eq!(harness_args(&["leak".into()]), ["--test-threads=1", "leak"]);
        assert_eq!(harness_args(&["--test-threads".into(), "2".into()]), ["--test-threads", "2"]);
    }

    #[test]
    fn harness_arguments_follow_the_double_dash() {
        let line = kernel_cmdline(&["--test-threads=1".into(), "--skip".into(), "a b".into()], None).unwrap();
        assert_eq!(line, "console=ttyS0 panic=-1 quiet -- --test-threads=1 --skip \"a b\"");
        assert!(kernel_cmdline(&["say \"hi\"".into()], None).is_err());
        let shard = Some(Shard { index: 2, count: 3 });
        assert_eq!(
            kernel_cmdline(&["leak".into()], shard).unwrap(),
            "console=ttyS0 panic=-1 quiet stall.shard=2/3 -- leak"
        );
        let whole = Some(Shard { index: 1, count: 1 });
        assert_eq!(kernel_cmdline(&[], whole).unwrap(), "console=ttyS0 panic=-1 quiet --");
    }

    #[test]
    fn escapes_and_line_ends_are_dropped() {
        assert_eq!(clean("\u{1b}c\u{1b}[?7l\u{1b}[2JSeaBIOS (version 1.16)\r\n"), "SeaBIOS (version 1.16)");
        assert_eq!(clean("a\tb\r\n"), "a\tb");
    }

    #[test]
    fn the_result_line_decides() {
        let log = Path::new("x.log");
        let secs = Duration::from_secs;
        let mut c = Console::default();
        c.see("STALL-VM-INIT: 6.1.0-57-cloud-amd64", secs(3));
        c.see("test result: ok. 8 passed", secs(30));
        c.see("STALL-VM-RESULT: PASS 18 passed", secs(60));
        let o = c.outcome(false, true, secs(600), secs(62), log);
        assert!(o.passed);
        assert_eq!((o.detail.as_str(), o.boot, o.tests), ("PASS 18 passed", Some(secs(3)), Some(secs(57))));

        let mut c = Console::default();
        c.see("STALL-VM-INIT: 6.1", secs(3));
        c.see("STALL-VM-RESULT: FAIL 17 passed, 1 failed; failing: leak", secs(60));
        assert!(!c.outcome(false, true, secs(600), secs(62), log).passed);

        let mut c = Console::default();
        c.see("Kernel panic - not syncing: Attempted to kill init!", secs(3));
        let o = c.outcome(false, true, secs(600), secs(4), log);
        assert!(!o.passed && o.detail.contains("/init never ran"), "{}", o.detail);
        assert!(Console::default()
            .outcome(true, true, secs(600), secs(600), log)
            .detail
            .contains("timed out"));

        let mut c = Console::default();
        c.see("STALL-VM-INIT: 6.1", secs(3));
        c.see("STALL-VM: running hooks (STALL_SYSCALL_HOOKS=fentry)", secs(10));
        c.see("test one ... ok", secs(20));
        c.see("test result: ok. 1 passed; 0 failed", secs(30));
        c.see("STALL-VM: hooks exited 0 after 20.0s", secs(30));
        c.see("STALL-VM: running scenarios --skip a (STALL_SYSCALL_HOOKS=auto)", secs(40));
        c.see("test healthy_job_is_not_input_bound ... ", secs(50));
        let detail = c.outcome(true, true, secs(600), secs(600), log).detail;
        assert!(
            detail.contains("in scenarios (560s into it, last test begun: healthy_job_is_not_input_bound)"),
            "{detail}"
        );
        let mut c = Console::default();
        c.see("STALL-VM: running hooks (STALL_SYSCALL_HOOKS=fentry)", secs(10));
        c.see("STALL-VM: hooks exited 0 after 20.0s", secs(30));
        let detail = c.outcome(true, true, secs(600), secs(600), log).detail;
        assert!(!detail.contains(" in hooks"), "{detail}");
    }
}
