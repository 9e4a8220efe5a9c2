//! Least privilege, measured: stall runs as user `nobody` with exactly the
//! capabilities `stall --help` lists (capsh gives them as ambient ones) and
//! gets exact results; with any one of them left out it exits 3 naming it.
use std::{
    os::unix::{fs::PermissionsExt, process::CommandExt},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use stall_tests::cgroup::Cgroup;
use stall_tests::procs::{run_with_timeout, spawn_announcing, wait_until};
use stall_tests::scratch::Scratch;
use stall_tests::stall::{require_root, stall_bin, Run};
use stall_tests::workload::{jobs_py, python, truth};

const T: Duration = Duration::from_secs(60);

/// The set `stall --help` documents (and `caps::NEEDED` checks).
const CAPS: [&str; 4] = ["cap_bpf", "cap_perfmon", "cap_dac_read_search", "cap_sys_ptrace"];

/// A scratch directory `nobody` can use, holding copies of stall and the
/// workloads (the workspace may sit where `nobody` cannot reach).
struct Place {
    s: Scratch,
    stall: PathBuf,
    jobs: PathBuf,
}

impl Place {
    fn new(tag: &str) -> Self {
        require_root();
        let s = Scratch::new(tag);
        std::fs::set_permissions(&s.0, std::fs::Permissions::from_mode(0o1777)).unwrap();
        // Up to the scratch directory, everything must be searchable.
        let mut dir = s.0.parent();
        while let Some(d) = dir {
            let mode = std::fs::metadata(d).unwrap().permissions().mode();
            assert!(mode & 0o001 != 0, "{} is not searchable by nobody (set STALL_TEST_TMP)", d.display());
            dir = d.parent();
        }
        let stall = s.path("stall");
        std::fs::copy(stall_bin(), &stall).unwrap();
        let jobs = s.path("jobs.py");
        std::fs::copy(jobs_py(), &jobs).unwrap();
        for (p, mode) in [(&stall, 0o755), (&jobs, 0o644)] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        Self { s, stall, jobs }
    }

    /// A file of `size` bytes that nobody can read.
    fn data(&self, name: &str, size: usize) -> PathBuf {
        let p = self.s.file(name, size);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        p
    }
}

/// Whether the running kernel is older than `major.minor`.
fn kernel_older_than(major: u32, minor: u32) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release.trim().split(['.', '-']).map(|x| x.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) < (major, minor)
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK, whose hard
/// limit only CAP_SYS_RESOURCE may raise: with nobody's own limit stall
/// must say so in one line and exit 3. (The other runs here raise the limit
/// first, as the README says to on such kernels.)
fn memlock_named_on_an_old_kernel(p: &Place) {
    if !kernel_older_than(5, 11) {
        return;
    }
    let (code, _, err) =
        as_nobody_limited(&CAPS, p, &["run", "-q", "--gpu", "off", "--", "true"], &[], false);
    assert_eq!(code, 3, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("RLIMIT_MEMLOCK") && err.contains("CAP_SYS_RESOURCE"), "{err}");
}

/// `stall ARGS` as `nobody` with exactly `caps` (effective, permitted,
/// inheritable and ambient), through capsh; JSON Lines to `json`.
fn as_nobody(caps: &[&str], place: &Place, args: &[&str], env: &[(&str, &Path)]) -> (i32, String, String) {
    as_nobody_limited(caps, place, args, env, true)
}

/// Raises the memlock limit of what `cmd` runs to unlimited, as a systemd
/// unit's LimitMEMLOCK=infinity does, on kernels that charge BPF maps to it
/// (before 5.11; elsewhere it takes CAP_SYS_RESOURCE, which some hosts'
/// root lacks, and changes nothing).
fn unlimited_memlock(cmd: &mut Command) -> &mut Command {
    if !kernel_older_than(5, 11) {
        return cmd;
    }
    let unlimited = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: setrlimit is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// A command running `place`'s stall as `nobody` with exactly `caps`
/// (effective, permitted, inheritable and ambient), through capsh; stall's
/// arguments to be added.
fn nobody_stall(caps: &[&str], place: &Place) -> Command {
    assert!(
        Path::new("/usr/sbin/capsh").exists() || Path::new("/sbin/capsh").exists(),
        "capsh is missing: `cargo xtask test` installs it (Debian package libcap2-bin)"
    );
    let set = caps.join(",");
    let mut cmd = Command::new("capsh");
    let switch = "cap_setpcap,cap_setuid,cap_setgid+ep";
    if set.is_empty() {
        cmd.arg(format!("--caps={switch}")).args(["--keep=1", "--user=nobody"]);
    } else {
        cmd.arg(format!("--caps={set}+eip {switch}"))
            .args(["--keep=1", "--user=nobody"])
            .arg(format!("--addamb={set}"));
    }
    cmd.args(["--shell=/bin/sh", "--", "-c", r#"exec "$0" "$@""#]).arg(&place.stall);
    cmd
}

/// `as_nobody`, with the memlock limit raised to unlimited first (by root,
/// as a systemd unit's LimitMEMLOCK does) or left as it is.
fn as_nobody_limited(
    caps: &[&str],
    place: &Place,
    args: &[&str],
    env: &[(&str, &Path)],
    raise_memlock: bool,
) -> (i32, String, String) {
    let mut cmd = nobody_stall(caps, place);
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    if raise_memlock {
        unlimited_memlock(&mut cmd);
    }
    let out = run_with_timeout(cmd, T);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Held by each test: they share the perf_event_paranoid setting.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

const PARANOID: &str = "/proc/sys/kernel/perf_event_paranoid";

/// Held by each test; checks first that stall runs at the kernel's own
/// kernel.perf_event_paranoid. Debian's and Ubuntu's kernels (the test VMs)
/// default to 3, at which only CAP_SYS_ADMIN may call perf_event_open: stall
/// attaches no perf events, so the README promises that level needs no change.
struct Paranoid {
    old: Option<String>,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl Paranoid {
    fn at_most_2(p: &Place) -> Self {
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let old = std::fs::read_to_string(PARANOID).unwrap();
        let level: i32 = old.trim().parse().unwrap();
        if level > 2 {
            let (code, _, err) = as_nobody(&CAPS, p, &["run", "-q", "--gpu", "off", "--", "true"], &[]);
            assert_eq!(code, 0, "at perf_event_paranoid {level}: {err}");
        }
        Self { old: None, _serial: serial }
    }
}

impl Drop for Paranoid {
    fn drop(&mut self) {
        if let Some(old) = &self.old {
            let _ = std::fs::write(PARANOID, old.trim());
        }
    }
}

fn records(json: &Path) -> Run {
    let text = std::fs::read_to_string(json).unwrap_or_default();
    Run {
        status: 0,
        stdout: String::new(),
        stderr: String::new(),
        records: text.lines().map(|l| serde_json::from_str(l).unwrap()).collect(),
    }
}

#[test]
fn exact_results_as_nobody_with_the_documented_capabilities() {
    let p = Place::new("priv-run");
    memlock_named_on_an_old_kernel(&p);
    let _paranoid = Paranoid::at_most_2(&p);
    let size = 2_000_003;
    let data = p.data("data.bin", size);
    let truth_path = p.s.path("truth.json");
    let json = p.s.path("out.json");
    let (code, _, err) = as_nobody(
        &CAPS,
        &p,
        &[
            "run",
            "-q",
            "--gpu",
            "off",
            "--json",
            json.to_str().unwrap(),
            "--",
            python(),
            p.jobs.to_str().unwrap(),
            "exact",
            data.to_str().unwrap(),
            "4099",
            "7",
        ],
        &[("TRUTH", &truth_path)],
    );
    assert_eq!(code, 7, "the command's status; stderr: {err}");
    assert!(err.trim().is_empty(), "nothing on stderr: {err}");
    let t = truth(&truth_path);
    let pid = t["pid"].as_u64().unwrap();
    assert_eq!(t["uid"], 65534, "the command runs as nobody");
    assert_eq!(t["cap_eff"], 0, "the command does not inherit stall's capabilities");
    let run = records(&json);
    let f = run.file(pid, &data);
    assert_eq!(f["read_bytes"], size as u64, "{f}");
    assert_eq!(f["read_calls"], (size as u64).div_ceil(4099) + 1, "{f}");
    assert_eq!(run.summary()["lost_events"], 0);
}

/// A root process's file opened before attach: only /proc with
/// CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE says which file that descriptor is.
#[test]
fn attach_to_another_users_process_as_nobody() {
    let p = Place::new("priv-attach");
    memlock_named_on_an_old_kernel(&p);
    let _paranoid = Paranoid::at_most_2(&p);
    let size = 1_500_007;
    let data = p.data("data.bin", size);
    let truth_path = p.s.path("truth.json");
    let json = p.s.path("out.json");
    // The job reads once stall has attached, however long its start.
    let go = p.s.path("go");
    let (mut job, pid) = spawn_announcing(
        Command::new(python())
            .arg(jobs_py())
            .args(["open-before", data.to_str().unwrap(), go.to_str().unwrap()])
            .env("TRUTH", &truth_path),
    );
    let mut cmd = nobody_stall(&CAPS, &p);
    cmd.args(["attach", "-q", "--gpu", "off", "--interval", "0.2", "--json", json.to_str().unwrap()])
        .args(["--pid", &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut stall = unlimited_memlock(&mut cmd).spawn().unwrap();
    wait_until("stall attached (an interval written)", T, || {
        if let Ok(Some(status)) = stall.try_wait() {
            panic!("stall exited before attaching: {status}");
        }
        std::fs::read_to_string(&json).is_ok_and(|t| t.contains('\n'))
    });
    std::fs::write(&go, "").unwrap();
    job.wait().unwrap();
    let status = stall.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(stall.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(0), "{err}");
    assert_eq!(truth(&truth_path)["bytes"], size as u64);
    let run = records(&json);
    assert_eq!(run.file(u64::from(pid), &data)["read_bytes"], size as u64);
    assert_eq!(run.summary()["lost_events"], 0);
}

#[test]
fn one_capability_fewer_exits_3_naming_it() {
    let p = Place::new("priv-fewer");
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for left_out in CAPS {
        let caps: Vec<&str> = CAPS.iter().copied().filter(|c| *c != left_out).collect();
        let (code, out, err) = as_nobody(&caps, &p, &["run", "-q", "--gpu", "off", "--", "true"], &[]);
        assert_eq!(code, 3, "without {left_out}: {err}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "one line without {left_out}: {err}");
        let name = left_out.to_uppercase();
        assert!(
            lines[0].starts_with(&format!("stall: missing capability {name} (to ")),
            "names {name}: {err}"
        );
        assert!(out.is_empty(), "nothing on stdout: {out}");
    }
    let (code, _, err) = as_nobody(&[], &p, &["attach", "--gpu", "off", "--pid", "1"], &[]);
    assert_eq!(code, 3, "{err}");
    assert!(err.starts_with("stall: missing capabilities CAP_BPF (to "), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// `GET path` over HTTP/1.0 (no chunked body); the body, if 200.
fn http_get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.contains(" 200 ").then(|| body.to_string())
}

/// The daemon, as the DaemonSet and the systemd unit run it: an
/// unprivileged user with exactly the four capabilities, watching a root
/// job whose file was open before the daemon started.
#[test]
fn daemon_as_nobody_with_the_documented_capabilities() {
    let p = Place::new("priv-daemon");
    memlock_named_on_an_old_kernel(&p);
    let _paranoid = Paranoid::at_most_2(&p);
    let size = 1_234_577;
    let data = p.data("data.bin", size);
    let truth_path = p.s.path("truth.json");
    let root = Cgroup::new("priv-daemon");
    let job_cg = root.child("job");
    // The job reads once the daemon watches it, however long its start.
    let go = p.s.path("go");
    let (mut job, pid) = spawn_announcing(
        Command::new(python())
            .arg(jobs_py())
            .args(["open-before", data.to_str().unwrap(), go.to_str().unwrap()])
            .env("TRUTH", &truth_path),
    );
    job_cg.add(pid);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut daemon = unlimited_memlock(&mut nobody_stall(&CAPS, &p))
        .args(["daemon", "--all-jobs", "--gpu", "off", "--interval", "0.5s", "--cgroup-root", &root.name])
        .arg(format!("--listen=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let label = format!("cgroup=\"{}\"", job_cg.name);
    // The job's bytes, and whether the syscall hooks are on: its series
    // appears once it is watched, the hooks come on after.
    let read_bytes = || -> Option<(u64, bool)> {
        let text = http_get(port, "/metrics")?;
        let hooked = text.lines().any(|l| l == "stall_syscall_hooks_attached 1");
        let lines: Vec<&str> =
            text.lines().filter(|l| l.starts_with("stall_read_bytes_total{") && l.contains(&label)).collect();
        (!lines.is_empty()).then(|| {
            let n =
                lines.iter().filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum::<f64>() as u64;
            (n, hooked)
        })
    };
    let deadline = std::time::Instant::now() + T;
    let mut got = None;
    while std::time::Instant::now() < deadline {
        let seen = read_bytes();
        got = seen.map(|(n, _)| n);
        if seen.is_some_and(|(_, hooked)| hooked) && !go.exists() {
            std::fs::write(&go, "").unwrap();
        }
        if got == Some(size as u64) || daemon.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    job.wait().unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(daemon.id() as i32), nix::sys::signal::Signal::SIGTERM)
        .ok();
    let out = daemon.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(got, Some(size as u64), "the job's bytes; daemon stderr: {err}");
    assert_eq!(truth(&truth_path)["bytes"], size as u64);
    assert_eq!(out.status.code(), Some(0), "{err}");
}
