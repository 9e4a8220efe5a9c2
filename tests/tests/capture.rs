//! Kernel capture against ground truth: bytes per worker and file,
//! off-CPU time by reason, wakers, forks and execs, scoping, and losses.
use std::{path::Path, process::Command, time::Duration};

use stall_tests::assert::{assert_close, assert_futex_wait, assert_thread_total};
use stall_tests::cgroup::Cgroup;
use stall_tests::kernel::{kernel_at_least, schedstat_tolerance};
use stall_tests::procs::spawn_announcing;
use stall_tests::scratch::{disk_scratch, Scratch};
use stall_tests::stall::{require_root, stall, stall_with_stdout, Background, Run};
use stall_tests::workload::{blocked_s, jobs_py, python, release, secs, truth};

const T: Duration = Duration::from_secs(90);

fn job(args: &[&str]) -> Vec<String> {
    let mut v = vec![python().to_string(), jobs_py().to_str().unwrap().to_string()];
    v.extend(args.iter().map(|s| s.to_string()));
    v
}

fn run_job(extra: &[&str], job_args: &[&str], truth_path: &Path) -> Run {
    let mut args: Vec<String> = vec!["run".into(), "-q".into()];
    args.extend(extra.iter().map(|s| s.to_string()));
    args.push("--".into());
    args.extend(job(job_args));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    stall(&refs, &[("TRUTH", truth_path)], T)
}

/// Bytes per worker and file for each syscall family, with the registers
/// of a returning call read the cheapest way the kernel takes (on the raw
/// tracepoints from 6.2 on, plain loads through `bpf_rdonly_cast`) and by
/// the fallback, `bpf_probe_read_kernel`.
#[test]
fn workers_bytes_exact_per_syscall_family_and_pipes_are_not_files() {
    let summary = family_bytes_exact(None);
    let cast_expected = summary["syscall_backend"] == "tracepoint" && kernel_at_least(6, 2);
    let expected = if cast_expected { "cast" } else { "probe" };
    assert_eq!(summary["syscall_reads"], expected, "the cheapest register reads the kernel takes: {summary}");
    if cast_expected {
        let fallback = family_bytes_exact(Some("probe"));
        assert_eq!(fallback["syscall_reads"], "probe", "the fallback, asked for: {fallback}");
    }
}

/// One run of the family job, checked; `syscall_reads` is
/// `STALL_SYSCALL_READS`. Returns the summary.
fn family_bytes_exact(syscall_reads: Option<&str>) -> serde_json::Value {
    let s = Scratch::new("family");
    let sizes = [1_000_003usize, 2_000_029, 777_777, 1_500_001];
    let files: Vec<_> = sizes.iter().enumerate().map(|(i, n)| s.file(&format!("w{i}.bin"), *n)).collect();
    let truth_path = s.path("truth.json");
    let mut args = vec!["run", "-q", "--"];
    let job_args: Vec<String> =
        job(&["family"]).into_iter().chain(files.iter().map(|f| f.to_str().unwrap().to_string())).collect();
    args.extend(job_args.iter().map(String::as_str));
    let mut env = vec![("TRUTH", truth_path.as_path())];
    if let Some(how) = syscall_reads {
        env.push(("STALL_SYSCALL_READS", Path::new(how)));
    }
    let run = stall(&args, &env, T);
    assert_eq!(run.status, 0, "{}", run.stderr);
    let t = truth(&truth_path);
    for w in t["workers"].as_array().unwrap() {
        let pid = w["pid"].as_u64().unwrap();
        let path = Path::new(w["path"].as_str().unwrap());
        let i = files.iter().position(|f| f == path).unwrap();
        assert_eq!(w["bytes"], sizes[i] as u64);
        let p = run.process(pid);
        let f = run.file(pid, path);
        assert_eq!(f["read_bytes"], sizes[i] as u64, "worker {pid} ({i}): {f}");
        // The only regular file a worker reads after fork is its own.
        assert_eq!(p["read_bytes"], sizes[i] as u64, "worker {pid}: {p}");
        assert_eq!(run.readers_of(path), vec![pid], "only its worker read {}", path.display());
    }
    let parent = run.process(t["parent"].as_u64().unwrap());
    let pipe_bytes = t["pipe_bytes"].as_u64().unwrap();
    assert!(parent["ipc_read_bytes"].as_u64().unwrap() >= pipe_bytes, "{parent}");
    for f in parent["files"].as_array().unwrap() {
        assert!(!f["path"].as_str().unwrap().starts_with("pipe:"), "a pipe counted as a file: {f}");
    }
    run.summary().clone()
}

/// Off-CPU reasons and totals against ground truth, for each way the
/// kernel lets `sched_switch` read the task going off-CPU: the cheapest it
/// takes (from 5.15 on, plain loads through a BTF pointer and a woken
/// task's wait for a CPU from the kernel's enqueue time, wakeups only
/// marked; from 6.12 on, whose delayed dequeues can enqueue a task before
/// its wakeup, each wakeup checks the wakee's enqueue time through
/// `bpf_rdonly_cast`), and the fallbacks beside it: timed wakeups, then
/// probing reads.
#[test]
fn off_cpu_reasons_match_ground_truth() {
    let first = off_cpu_reasons(None);
    let expected = match (kernel_at_least(5, 15), kernel_at_least(6, 12)) {
        (true, false) => "queued",
        (true, true) => "queued-checked",
        _ => "probe-stack",
    };
    assert_eq!(first, expected, "the cheapest sched_switch the kernel takes");
    if first.starts_with("queued") {
        assert_eq!(off_cpu_reasons(Some("direct")), "direct", "timed wakeups, asked for");
    }
    if first != "probe-stack" {
        assert_eq!(off_cpu_reasons(Some("probe")), "probe", "the fallback, asked for");
    }
}

/// One run of the waits job; `switch_reads` is `STALL_SWITCH_READS`. Returns
/// the summary's `switch_reads`.
fn off_cpu_reasons(switch_reads: Option<&str>) -> String {
    let s = Scratch::new("waits");
    let truth_path = s.path("truth.json");
    let mut env = vec![("TRUTH", truth_path.as_path())];
    if let Some(how) = switch_reads {
        env.push(("STALL_SWITCH_READS", Path::new(how)));
    }
    let args: Vec<String> =
        ["run", "-q", "--"].iter().map(|a| a.to_string()).chain(job(&["waits", "2.0"])).collect();
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = stall(&refs, &env, T);
    assert_eq!(run.status, 0, "{}", run.stderr);
    let how = run.summary()["switch_reads"].as_str().unwrap_or_default().to_string();
    eprintln!("sched_switch reads: {how}");
    let t = truth(&truth_path);
    let by = |tid: &str| run.thread(t[tid].as_u64().unwrap())["off_cpu_by_reason"].clone();

    let futex = by("futex_tid");
    assert_futex_wait("futex off-CPU", secs(&futex["futex"]), &t, 0.05);
    let poll = by("poll_tid");
    assert_close("poll off-CPU", secs(&poll["poll"]), blocked_s(&t, "poll"), 0.05);

    let burner = run.thread(t["burn_tid"].as_u64().unwrap());
    eprintln!(
        "burner: {burner}\ntruth: {t}\nlost: {} sched_gaps: {} sched_repaired: {}",
        run.summary()["lost_by_cause"],
        run.summary()["sched_gaps"],
        run.summary()["sched_repaired"]
    );
    // The burner reads its CPU time and schedstat just before it ends;
    // stall counts it to its end, up to `burn_tail_s` later.
    let tail = secs(&t["burn_tail_s"]);
    assert_thread_total(
        "burner on-CPU vs its CPU time",
        secs(&burner["on_cpu_s"]),
        secs(&t["burn_cpu_s"]),
        tail,
        0.05,
    );
    // The kernel's own totals: stall reconciles with them, so they agree
    // closely.
    assert_thread_total(
        "burner on-CPU vs schedstat",
        secs(&burner["on_cpu_s"]),
        secs(&t["burn_sched_s"]),
        tail,
        schedstat_tolerance(),
    );
    assert_eq!(run.summary()["sched_gaps"], 0, "no switch was lost");
    let runq = secs(&burner["off_cpu_by_reason"]["runqueue"]);
    assert_thread_total(
        "burner on-CPU + runqueue vs wall",
        secs(&burner["on_cpu_s"]) + runq,
        secs(&t["burn_wall_s"]),
        tail,
        0.05,
    );
    how
}

#[test]
fn waker_is_identified() {
    let s = Scratch::new("wake");
    let truth_path = s.path("truth.json");
    let run = run_job(&[], &["wake", "0.5"], &truth_path);
    assert_eq!(run.status, 0, "{}", run.stderr);
    let t = truth(&truth_path);
    let sleeper = run.thread(t["sleeper_tid"].as_u64().unwrap());
    let wakers = sleeper["woken_by"].as_array().unwrap();
    // Python's GIL can add wakeups by other threads; the one that set the
    // event must be among the wakers, under its own name.
    let w = wakers
        .iter()
        .find(|w| w["tid"] == t["waker_tid"])
        .unwrap_or_else(|| panic!("waker missing: {sleeper}"));
    assert_eq!(w["comm"], "waker");
    assert!(w["count"].as_u64().unwrap() >= 1);
    assert!(secs(&sleeper["off_cpu_by_reason"]["futex"]) >= 0.45, "{sleeper}");
}

/// One waker waking one wakee over and over on one CPU is counted in that
/// CPU's cache of its last pair, not in the pair's entry: the counts must
/// still come out whole.
#[test]
fn every_wakeup_of_a_ping_pong_is_counted() {
    let s = Scratch::new("pingpong");
    let truth_path = s.path("truth.json");
    // How often the ping blocks depends on whether the woken pong preempts
    // it: a quarter of the rounds in a loaded TCG guest (681 of 3000 on
    // 5.10), nearly all natively.
    let run = run_job(&[], &["pingpong", "5000"], &truth_path);
    assert_eq!(run.status, 0, "{}", run.stderr);
    let t = truth(&truth_path);
    let blocked = t["blocked"].as_u64().unwrap();
    let ping = run.thread(t["ping_tid"].as_u64().unwrap());
    let by_pong = ping["woken_by"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["tid"] == t["pong_tid"])
        .unwrap_or_else(|| panic!("pong missing among the ping's wakers: {ping}"))["count"]
        .as_u64()
        .unwrap();
    // Only the pong's write wakes the ping from a block in its loop (a
    // page fault's wait may add a few blocks that others end), and the
    // pong's exit once more, from its wait.
    assert!(blocked >= 500, "the ping blocked only {blocked} times: no test");
    assert!(
        by_pong <= blocked + 1 && by_pong + 10 + blocked / 100 >= blocked,
        "the pong woke the ping {by_pong} times; it blocked {blocked} times in its loop: {ping}"
    );
}

/// The time a thread waited is given to whoever ended each wait, and to
/// the descriptor it waited on: a waiter that waits in turn for two feeder
/// processes (one slow, one fast; each answers on a pipe of its own) and
/// for its own sleeps. What it measured itself, each wait from the call
/// to its return, holds the blocked time stall gives each waker and the
/// wait for a CPU after it, so stall's figure is at most that, and short
/// of it by no more than a few ms a wait.
#[test]
fn blocked_time_goes_to_whoever_ended_the_wait() {
    let s = Scratch::new("wait-for");
    let truth_path = s.path("truth.json");
    let rounds = 8;
    let run = run_job(&[], &["wait-for", &rounds.to_string(), "0.2", "0.05", "0.1"], &truth_path);
    assert_eq!(run.status, 0, "{}", run.stderr);
    let t = truth(&truth_path);
    let waiter = run.thread(t["waiter_tid"].as_u64().unwrap());
    let wakers = waiter["woken_by"].as_array().unwrap();
    let blocked_by =
        |pid: u64| -> f64 { wakers.iter().filter(|w| w["pid"] == pid).map(|w| secs(&w["blocked_s"])).sum() };
    let close_with = |what: &str, got: f64, measured: f64, beside: f64| {
        // Per wait: the wakeup's way to the CPU and back to Python, not
        // blocked, is in the measurement only.
        let slack = 0.005 * f64::from(rounds) + 0.02 * measured;
        assert!(
            got <= measured + beside + 0.002 && got >= measured - slack,
            "{what}: stall gives {got:.3} s blocked, the waiter measured {measured:.3} s: {waiter}"
        );
    };
    let close = |what: &str, got: f64, measured: f64| close_with(what, got, measured, 0.0);
    let on_fds = run.process(t["waiter_tid"].as_u64().unwrap())["blocked_on_fds"].clone();
    let blocked_on = |fd: &serde_json::Value| -> f64 {
        on_fds.as_array().unwrap().iter().filter(|w| &w["fd"] == fd).map(|w| secs(&w["blocked_s"])).sum()
    };
    for (name, f) in t["feeders"].as_object().unwrap() {
        close(name, blocked_by(f["pid"].as_u64().unwrap()), secs(&f["waited_s"]));
        close(&format!("{name}'s pipe"), blocked_on(&f["fd"]), secs(&f["waited_s"]));
    }
    // The sleeps: ended by the kernel's timer, in an interrupt; as are the
    // waiter's few waits for the disk (its modules, at start).
    let disk = secs(&waiter["off_cpu_by_reason"]["io"]);
    close_with("sleeps", blocked_by(0), secs(&t["slept_s"]), disk);
    let order: Vec<&str> = wakers.iter().map(|w| w["comm"].as_str().unwrap()).collect();
    assert_eq!(
        order.first(),
        Some(&"feed-slow"),
        "the waker that ended the most blocked time first: {order:?}"
    );
}

#[test]
fn exec_after_fork_is_traced() {
    let s = Scratch::new("exec");
    let size = 654_321;
    let data = s.file("e.bin", size);
    let truth_path = s.path("truth.json");
    let run = run_job(&[], &["exec", data.to_str().unwrap()], &truth_path);
    assert_eq!(run.status, 0, "{}", run.stderr);
    let pid = truth(&truth_path)["pid"].as_u64().unwrap();
    assert_eq!(run.file(pid, &data)["read_bytes"], size as u64);
}

/// Starts a reader that is not part of any traced job.
fn outsider(path: &Path) -> (std::process::Child, u32) {
    spawn_announcing(Command::new(python()).arg(jobs_py()).args(["reader-loop", path.to_str().unwrap()]))
}

#[test]
fn a_process_outside_the_tree_is_not_traced() {
    let s = Scratch::new("outside");
    let theirs = s.file("theirs.bin", 100_000);
    let ours = s.file("ours.bin", 200_000);
    let (mut other, other_pid) = outsider(&theirs);
    let truth_path = s.path("truth.json");
    let run = run_job(&[], &["exact", ours.to_str().unwrap(), "5000", "0"], &truth_path);
    let _ = other.kill();
    let _ = other.wait();
    assert_eq!(run.status, 0, "{}", run.stderr);
    assert!(run.processes().iter().all(|p| p["pid"] != u64::from(other_pid)));
    assert!(run.readers_of(&theirs).is_empty());
}

/// Starts `idle-then-read` (prints its PID, then forks a reader once `go`
/// exists); returns it and its PID.
fn idle_then_read(data: &Path, truth_path: &Path, go: &Path) -> (std::process::Child, u32) {
    spawn_announcing(
        Command::new(python())
            .arg(jobs_py())
            .args(["idle-then-read", data.to_str().unwrap(), go.to_str().unwrap()])
            .env("TRUTH", truth_path),
    )
}

/// How long stall may take to attach: its start-up (BTF, loading and
/// verifying the programs) takes about 0.9 s under the test VMs' emulation.
const ATTACH: Duration = Duration::from_secs(60);

#[test]
fn attach_to_pid_follows_later_forks_and_ends_with_the_target() {
    let s = Scratch::new("attach");
    let size = 2_222_223;
    let data = s.file("a.bin", size);
    let truth_path = s.path("truth.json");
    let go = s.path("go");
    let (mut child, pid) = idle_then_read(&data, &truth_path, &go);
    // Reap the target in the background so stall sees it go.
    let waiter = std::thread::spawn(move || child.wait());
    let mut bg = Background::start(&["attach", "--pid", &pid.to_string(), "-q", "--interval", "0.2"]);
    bg.wait_attached(ATTACH);
    release(&go);
    let run = bg.finish(T);
    waiter.join().unwrap().unwrap();
    assert_eq!(run.status, 0, "{}", run.stderr);
    let reader = truth(&truth_path)["reader"].as_u64().unwrap();
    assert_eq!(run.file(reader, &data)["read_bytes"], size as u64);
    assert_eq!(run.process(reader)["ppid"], u64::from(pid));
}

#[test]
fn attach_to_cgroup_traces_members_only() {
    require_root();
    let s = Scratch::new("cgroup");
    let size = 1_111_111;
    let data = s.file("c.bin", size);
    let theirs = s.file("theirs.bin", 50_000);
    let truth_path = s.path("truth.json");
    let cg = Cgroup::new("capture");
    let go = s.path("go");
    let (mut child, pid) = idle_then_read(&data, &truth_path, &go);
    cg.add(pid);
    let (mut other, other_pid) = outsider(&theirs);
    // Relative to the cgroup2 mount, as users type it.
    let mut bg =
        Background::start(&["attach", "--cgroup", &cg.name, "--duration", "4", "-q", "--interval", "0.2"]);
    bg.wait_attached(ATTACH);
    release(&go);
    let run = bg.finish(T);
    let _ = child.wait();
    let _ = other.kill();
    let _ = other.wait();
    assert_eq!(run.status, 0, "{}", run.stderr);
    let reader = truth(&truth_path)["reader"].as_u64().unwrap();
    assert_eq!(run.file(reader, &data)["read_bytes"], size as u64);
    assert!(run.processes().iter().all(|p| p["pid"] != u64::from(other_pid)));
}

#[test]
fn reused_descriptor_numbers_keep_files_apart() {
    let s = Scratch::new("reuse");
    let sizes = [100_001usize, 250_003, 70_007];
    let files: Vec<_> = sizes.iter().enumerate().map(|(i, n)| s.file(&format!("r{i}.bin"), *n)).collect();
    let truth_path = s.path("truth.json");
    let mut args = vec!["reuse"];
    args.extend(files.iter().map(|f| f.to_str().unwrap()));
    let run = run_job(&[], &args, &truth_path);
    assert_eq!(run.status, 0, "{}", run.stderr);
    let t = truth(&truth_path);
    let fds = t["fds"].as_array().unwrap();
    assert!(fds.iter().all(|fd| *fd == fds[0]), "the workload reuses one fd number: {fds:?}");
    let pid = t["pid"].as_u64().unwrap();
    for (f, n) in files.iter().zip(sizes) {
        assert_eq!(run.file(pid, f)["read_bytes"], n as u64, "{}", f.display());
    }
}

/// A descriptor number is closed and taken by the next open before stall
/// looks the first one up: a data file opened by a relative path, mapped,
/// touched page by page and closed, then a temporary file created (with
/// its number), unlinked and kept open, 20 times. Each data file is
/// resolved to its own path and its mapped bytes count under it, its size
/// within a page; none count under a temporary file.
#[test]
fn a_descriptor_number_taken_by_the_next_open_names_each_file_by_its_own_path() {
    require_root();
    let s = disk_scratch("fd-reuse");
    let truth_path = s.path("truth.json");
    let run = run_job(&[], &["mapped-after-temp", s.0.to_str().unwrap(), "20"], &truth_path);
    assert_eq!(run.status, 0, "{}", run.stderr);
    let t = truth(&truth_path);
    let pid = t["pid"].as_u64().unwrap();
    for pair in t["pairs"].as_array().unwrap() {
        assert_eq!(pair[0], pair[1], "the temporary file takes the data file's number: {t}");
    }
    let p = run.process(pid);
    let listed = p["files"].as_array().unwrap();
    for f in listed {
        let named = f["resolved"].as_str().or(f["path"].as_str()).unwrap();
        if named.contains("/tmp-") {
            assert_eq!(
                f["mmap_bytes"].as_u64().unwrap_or(0),
                0,
                "a temporary file took a data file's pages: {f}"
            );
        }
    }
    for (path, size) in t["files"].as_object().unwrap() {
        let size = size.as_u64().unwrap();
        let name = Path::new(path).file_name().unwrap().to_str().unwrap();
        // Written, then opened again to be mapped: one entry, by its path.
        let f = listed
            .iter()
            .find(|f| f["path"] == name)
            .unwrap_or_else(|| panic!("{name} not among the files: {listed:?}"));
        assert_eq!(f["resolved"], path.as_str(), "{f}");
        let mapped = f["mmap_bytes"].as_u64().unwrap_or_else(|| panic!("no mmap_bytes: {f}"));
        assert!(mapped >= size && mapped <= size + 4096, "{name}: {mapped} of {size} mapped: {f}");
    }
}

#[test]
fn files_opened_before_attach_are_counted() {
    let s = Scratch::new("openbefore");
    let size = 3_333_331;
    let data = s.file("b.bin", size);
    let truth_path = s.path("truth.json");
    let (child, pid) = spawn_announcing(
        Command::new(python())
            .arg(jobs_py())
            .args(["open-before", data.to_str().unwrap(), s.path("go").to_str().unwrap()])
            .env("TRUTH", &truth_path),
    );
    let mut child = child;
    let waiter = std::thread::spawn(move || child.wait());
    let mut bg = Background::start(&["attach", "--pid", &pid.to_string(), "-q", "--interval", "0.2"]);
    bg.wait_attached(ATTACH);
    release(&s.path("go"));
    let run = bg.finish(T);
    waiter.join().unwrap().unwrap();
    assert_eq!(run.status, 0, "{}", run.stderr);
    assert_eq!(truth(&truth_path)["bytes"], size as u64);
    let f = run.file(u64::from(pid), &data);
    assert_eq!(f["read_bytes"], size as u64, "{f}");
}

/// The write family (write, pwrite64, writev, pwritev, pwritev2) as
/// progress signals: exact bytes and calls per file opened for writing
/// (O_WRONLY, O_RDWR, O_CREAT), per thread as file writes, and stdout/stderr
/// lines as stdio writes — to a pipe (other writes) or, with stdout
/// redirected to a file that stall finds open at start, to that file.
#[test]
fn written_bytes_exact_per_file_thread_and_stdio() {
    let s = Scratch::new("writes");
    let (a, b) = (s.path("log.txt"), s.path("ckpt.bin"));
    let truth_path = s.path("truth.json");
    let stdout_file = s.path("stdout.txt");
    let job_args = ["writes", a.to_str().unwrap(), b.to_str().unwrap()];
    for to_file in [false, true] {
        let mut args: Vec<String> = vec!["run".into(), "-q".into(), "--".into()];
        args.extend(job(&job_args));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = to_file.then(|| std::fs::File::create(&stdout_file).expect("stdout file").into());
        let run = stall_with_stdout(&refs, &[("TRUTH", &truth_path)], T, out);
        assert_eq!(run.status, 0, "{}", run.stderr);
        let t = truth(&truth_path);
        let pid = t["pid"].as_u64().unwrap();
        let what = if to_file { "stdout to a file" } else { "stdout to a pipe" };
        for path in [&a, &b] {
            let key = path.to_str().unwrap();
            let f = run.file(pid, path);
            assert_eq!(f["write_bytes"], t["files"][key], "{what}: {f}");
            assert_eq!(f["write_calls"], t["calls"][key], "{what}: {f}");
            assert_eq!(f["read_bytes"], t["reads"][key], "{what}: {f}");
        }
        let file_bytes = t["files"][a.to_str().unwrap()].as_u64().unwrap()
            + t["files"][b.to_str().unwrap()].as_u64().unwrap();
        let writer = run.thread(t["writer_tid"].as_u64().unwrap());
        assert_eq!(writer["file_write_bytes"], file_bytes, "{what}: {writer}");
        assert_eq!(writer["other_write_bytes"], 0, "{what}: {writer}");
        assert_eq!(writer["stdio_write_bytes"], 0, "{what}: {writer}");

        let (out_bytes, err_bytes) =
            (t["stdout_bytes"].as_u64().unwrap(), t["stderr_bytes"].as_u64().unwrap());
        assert!(out_bytes > 0 && err_bytes > 0);
        let printer = run.thread(t["printer_tid"].as_u64().unwrap());
        assert_eq!(printer["stdio_write_bytes"], out_bytes + err_bytes, "{what}: {printer}");
        if to_file {
            // stderr stays a pipe.
            assert_eq!(printer["file_write_bytes"], out_bytes, "{what}: {printer}");
            assert_eq!(printer["other_write_bytes"], err_bytes, "{what}: {printer}");
            let f = run.file(pid, &stdout_file);
            assert_eq!(f["write_bytes"], out_bytes, "{what}: {f}");
            assert_eq!(f["write_calls"], 40, "{what}: {f}");
            let text = std::fs::read_to_string(&stdout_file).unwrap();
            assert!(text.starts_with("step 0 loss 1.000000\n"), "{text}");
        } else {
            assert_eq!(printer["file_write_bytes"], 0, "{what}: {printer}");
            assert_eq!(printer["other_write_bytes"], out_bytes + err_bytes, "{what}: {printer}");
            assert!(run.stdout.contains("step 39 loss"), "{}", run.stdout);
        }
    }
}

/// Bytes and calls are exact whatever the sampling; `--latency-sample 1`
/// times every read, the default one in 8 at random and, in a loop on
/// cached data (many reads between switches), one in 128: each timed read
/// stands for the reads it was picked among.
#[test]
fn read_latency_is_timed_on_the_sampled_reads() {
    let s = Scratch::new("latency");
    let size = 4_000_037usize;
    let data = s.file("data.bin", size);
    let truth_path = s.path("truth.json");
    let chunk = 200; // 20001 reads, the last one short, plus the one at EOF
    let path = data.to_str().unwrap();
    for sample in ["1", "8"] {
        let run =
            run_job(&["--latency-sample", sample], &["exact", path, &chunk.to_string(), "0"], &truth_path);
        assert_eq!(run.status, 0, "{}", run.stderr);
        let pid = truth(&truth_path)["pid"].as_u64().unwrap();
        let f = run.file(pid, &data);
        assert_eq!(f["read_bytes"], size as u64, "{f}");
        let calls = f["read_calls"].as_u64().unwrap();
        assert_eq!(calls, (size / chunk + 2) as u64, "{f}");
        let stands_for = f["read_timed_calls"].as_u64().unwrap();
        if sample == "1" {
            assert_eq!(stands_for, calls, "every read timed: {f}");
        } else {
            // Mostly one in 128 with weight 128: about 156 draws, so the
            // reads they stand for are `calls` ± 8 % (sd); allow ± 40 %.
            let want = calls as f64;
            assert!(
                (stands_for as f64 - want).abs() <= want * 0.4,
                "--latency-sample {sample}: timed ones stand for {stands_for} of {calls}: {f}"
            );
        }
        let lat = f["read_latency_s"].as_f64().unwrap();
        assert!(lat > 0.0 && lat < 2.0, "--latency-sample {sample}: {f}");
    }
    let bad = stall(&["run", "--latency-sample", "3", "--", "true"], &[], T);
    assert_eq!(bad.status, 2, "not a power of two is a usage error: {}", bad.stderr);
}

/// Files named by open, openat2 and creat, read through dup, dup2, dup3
/// and fcntl(F_DUPFD) copies (the original closed before some of them
/// read), and by sendfile, copy_file_range and splice: each file's bytes
/// exact, under its path, and what the last three wrote too (the sink
/// file's bytes exact; splice's pipe is IPC, not a file).
#[test]
fn every_way_to_name_and_read_a_file_is_counted() {
    require_root();
    let s = Scratch::new("read-paths");
    let truth_path = s.path("truth.json");
    let dir = s.path("files");
    std::fs::create_dir_all(&dir).unwrap();
    let run = run_job(&[], &["read-paths", dir.to_str().unwrap()], &truth_path);
    assert_eq!(run.status, 0, "{}", run.stderr);
    let t = truth(&truth_path);
    let pid = t["pid"].as_u64().unwrap();
    // On failure, every file of the process and the losses: where the bytes went.
    let whole = format!("process: {}\nlost: {}", run.process(pid), run.summary()["lost_by_cause"]);
    let mut total = 0;
    for (path, want) in t["read"].as_object().unwrap() {
        let f = run.file(pid, Path::new(path));
        assert_eq!(f["read_bytes"], *want, "{path}: {f}\n{whole}");
        total += want.as_u64().unwrap();
    }
    for (path, want) in t["written"].as_object().unwrap() {
        let f = run.file(pid, Path::new(path));
        assert_eq!(f["write_bytes"], *want, "{path}: {f}");
    }
    // Written when made, then opened once to read: the copies are not opens.
    let dup = run.file(pid, &dir.join("by-dup.bin"));
    assert_eq!(dup["opens"], 2, "{dup}");
    let p = run.process(pid);
    // The files above, and what Python itself reads (its modules).
    assert!(p["read_bytes"].as_u64().unwrap() >= total, "{p}");
    // The spliced bytes went into a pipe and were read back from it.
    let piped = t["piped"].as_u64().unwrap();
    assert!(p["ipc_read_bytes"].as_u64().unwrap() >= piped, "{p}");
    let other_written: u64 =
        p["threads"].as_array().unwrap().iter().map(|t| t["other_write_bytes"].as_u64().unwrap()).sum();
    assert!(other_written >= piped, "{p}");
}

/// A file read to its end through io_uring alone (submitted and reaped with
/// io_uring_enter, no read syscall): its bytes and read calls exact, on the
/// file and on the thread.
#[test]
fn an_io_uring_read_of_a_file_is_counted() {
    require_root();
    let s = Scratch::new("uring");
    let size = 1_234_567;
    let data = s.file("data.bin", size);
    let truth_path = s.path("truth.json");
    let run = run_job(&[], &["uring-read", data.to_str().unwrap(), "65521"], &truth_path);
    assert_eq!(run.status, 0, "{}", run.stderr);
    let t = truth(&truth_path);
    assert_eq!(t["bytes"], size as u64);
    let pid = t["pid"].as_u64().unwrap();
    let f = run.file(pid, &data);
    assert_eq!(f["read_bytes"], size as u64, "{f}");
    assert_eq!(f["read_calls"], t["calls"], "{f}");
    let main = run.thread(pid);
    assert!(main["read_bytes"].as_u64().unwrap() >= size as u64, "{main}");
    assert_eq!(run.summary()["lost_events"], 0);
}

/// Files on a block device, two evicted from the page cache and two left
/// in it, one of each read with read() and one of each mapped with every
/// page touched (twice): what came from storage is each cold file's size
/// (pages rounded up, 2 %), a warm file's nearly nothing; what was mapped
/// is each mapped file's size, cold or warm, counted once, though read()
/// never ran on it.
#[test]
fn storage_and_mapped_bytes_tell_cold_files_from_cached_ones_for_reads_and_mappings() {
    require_root();
    let s = disk_scratch("storage");
    let truth_path = s.path("truth.json");
    let run = run_job(&[], &["storage", s.0.to_str().unwrap()], &truth_path);
    assert_eq!(run.status, 0, "{}", run.stderr);
    let t = truth(&truth_path);
    let pid = t["pid"].as_u64().unwrap();
    // Every kernel the suite runs on follows mapping faults one way or another.
    let hooks = &run.summary()["mmap_hooks"];
    assert!(hooks == "tracepoint" || hooks == "trampoline", "mmap_hooks {hooks}");
    let (mut cold, mut mapped_total) = (0, 0);
    for (path, f) in t["files"].as_object().unwrap() {
        let size = f["size"].as_u64().unwrap();
        let got = run.file(pid, Path::new(path));
        // The whole file, its last page rounded up (2 %).
        let whole = |n: u64| n >= size && n as f64 <= size as f64 * 1.02;
        let storage = got["storage_bytes"].as_u64().unwrap_or_else(|| panic!("no storage_bytes: {got}"));
        if f["cold"] == true {
            cold += size;
            assert!(whole(storage), "{path}: {storage} of {size}: {got}");
        } else {
            assert!((storage as f64) < size as f64 * 0.02, "{path}: {storage} of {size} while cached: {got}");
        }
        let read = if f["mapped"] == true { 0 } else { size };
        assert_eq!(got["read_bytes"], read, "{path}: {got}");
        let mapped = got["mmap_bytes"].as_u64().unwrap_or_else(|| panic!("no mmap_bytes: {got}"));
        if f["mapped"] == true {
            mapped_total += size;
            assert!(whole(mapped), "{path}: mapped {mapped} of {size}: {got}");
            // One process: nobody got its pages mapped before it.
            assert_eq!(got["mmap_shared_bytes"], 0, "{path}: {got}");
        } else {
            assert_eq!(mapped, 0, "{path}: {got}");
        }
    }
    let p = run.process(pid);
    assert!(p["storage_bytes"].as_u64().unwrap() >= cold, "{p}");
    assert!(p["mmap_bytes"].as_u64().unwrap() >= mapped_total, "{p}");
}

/// A shell that redirects its own stdout (`exec >FILE`: open, dup2 onto 1,
/// close) writes to that file through fd 1: the bytes are the file's (and
/// stdio's), under its path.
#[test]
fn a_stdout_redirected_inside_the_job_writes_to_its_file() {
    require_root();
    let s = Scratch::new("dup2-stdout");
    let out = s.path("out.txt");
    let script = format!("exec >{}; echo hello world; echo again", out.display());
    let run = stall(&["run", "-q", "--", "sh", "-c", &script], &[], T);
    assert_eq!(run.status, 0, "{}", run.stderr);
    let want = std::fs::metadata(&out).unwrap().len();
    assert_eq!(want, 18);
    let p = run
        .processes()
        .iter()
        .find(|p| p["comm"] == "sh")
        .unwrap_or_else(|| panic!("no sh: {:?}", run.processes()));
    let f = run.file(p["pid"].as_u64().unwrap(), &out);
    // On failure, the whole process and the losses: where the bytes went.
    let why = format!("{f}\nprocess: {p}\nlost: {}", run.summary()["lost_by_cause"]);
    assert_eq!((f["write_bytes"].as_u64(), f["write_calls"].as_u64()), (Some(want), Some(2)), "{why}");
    assert_eq!(p["file_write_bytes"], want, "{p}");
    assert_eq!(p["stdio_write_bytes"], want, "{p}");
}

/// A connected TCP socket: its peer named from connect, the bytes sent
/// (send, sendmsg) and received (recv, recvmsg) exact, none of them file
/// reads. The peer, this test, is outside the job.
#[test]
fn socket_bytes_exact_per_peer() {
    let s = Scratch::new("socket");
    let truth_path = s.path("truth.json");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    const SEND: usize = 3 << 20;
    let server = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut c, _) = listener.accept().unwrap();
        let mut got = vec![0; 100_000];
        c.read_exact(&mut got).unwrap();
        c.write_all(&vec![7u8; SEND]).unwrap();
    });
    let run = run_job(&[], &["socket", &port.to_string(), "100000"], &truth_path);
    server.join().unwrap();
    assert_eq!(run.status, 0, "{}", run.stderr);
    let t = truth(&truth_path);
    assert_eq!(t["received"], SEND as u64, "{t}");
    let p = run.process(t["pid"].as_u64().unwrap());
    let sock = p["sockets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["peer"] == format!("127.0.0.1:{port}").as_str())
        .unwrap_or_else(|| panic!("no socket to port {port}: {p}"));
    assert_eq!(sock["read_bytes"], SEND as u64, "{sock}");
    assert_eq!(sock["write_bytes"], 100_000, "{sock}");
    assert_eq!(
        (&sock["connects"], &sock["ipc"]),
        (&serde_json::json!(1), &serde_json::json!(false)),
        "{sock}"
    );
    assert!(sock["read_calls"].as_u64().unwrap() >= 2, "{sock}");
    // Socket reads are never file reads.
    assert!(p["ipc_read_bytes"].as_u64().unwrap() >= SEND as u64, "{p}");
    assert!(
        p["files"].as_array().unwrap().iter().all(|f| f["read_bytes"].as_u64().unwrap() < SEND as u64),
        "{p}"
    );
}

/// The kernel side's rare diagnostics reach the agent's debug log through
/// aya-log: with `THREADS` sized for one thread, the job's first fork finds
/// it full, and `STALL_LOG=debug` prints the kernel's line on stderr.
#[test]
fn a_full_map_is_said_in_the_debug_log() {
    let script = "sleep 0.3; for i in 1 2 3; do /bin/true; done; sleep 0.3";
    let env = [("STALL_THREADS_MAX", Path::new("1")), ("STALL_LOG", Path::new("debug"))];
    let run = stall(&["run", "-q", "--", "sh", "-c", script], &env, T);
    assert!(run.stderr.contains("stall: debug: kernel: THREADS full"), "{}", run.stderr);
    let quiet = stall(&["run", "-q", "--", "sh", "-c", script], &env[..1], T);
    assert!(!quiet.stderr.contains("kernel:"), "no debug log unless asked: {}", quiet.stderr);
}
