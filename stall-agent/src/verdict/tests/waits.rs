//! Jobs of shapes beyond "a trainer and its worker processes", judged by
//! following what the trainer waits on and who ends its waits: loader
//! threads, a thread holding the GIL, sleeping workers, output into a slow
//! pipe or socket, a lock held by another program, a child it waits for.
//! The numbers are what such workloads did (tests/workloads/waits.py).
use super::*;
use crate::wait::{Party, WaitObject};

fn party(pid: u32, comm: &str) -> Party {
    Party::new(pid, comm)
}

impl Job {
    /// A thread of process `tgid` with its counters and state.
    fn thread_of(mut self, tid: u32, tgid: u32, c: ThreadCounters, now: ThreadNow, other_nr: i32) -> Self {
        self.threads.push(ThreadSnap { tid, tgid, job: 1, counters: c, now, other_nr });
        self
    }

    /// `wakee` woken `count` times by thread `waker` of process `tgid`.
    fn woken_by_thread(mut self, wakee: u32, waker: u32, tgid: u32, comm: &str, count: u64) -> Self {
        self.wakes.push(WakeSnap {
            wakee,
            waker,
            waker_tgid: tgid,
            waker_comm: comm.into(),
            count,
            blocked_ns: 0,
        });
        self
    }

    /// As `woken_by_thread`, the wakee blocked `secs` in all before them.
    fn woken_after(mut self, wakee: u32, waker: (u32, u32, &str), count: u64, secs: f64) -> Self {
        let (tid, tgid, comm) = waker;
        let blocked_ns = (secs * S as f64) as u64;
        self.wakes.push(WakeSnap {
            wakee,
            waker: tid,
            waker_tgid: tgid,
            waker_comm: comm.into(),
            count,
            blocked_ns,
        });
        self
    }

    fn waiting_on(mut self, tid: u32, r: u8, o: WaitObject) -> Self {
        self.waits_on.push((tid, r, o));
        self
    }
}

fn waiting(r: u8, nr: i32) -> ThreadNow {
    ThreadNow { running: false, reason: r, syscall: nr, for_ns: 13 * S }
}

/// Four threads of a ThreadPoolExecutor read 256 MB each from storage and
/// hand the main thread its batches: they are its input, as worker
/// processes would be.
#[test]
fn loader_threads_that_read_from_storage_are_the_input() {
    let mut job = Job::new(10).trainer(0.05, [0.65, 0.0, 0.0, 0.0, 0.01, 0.0], blocked(reason::FUTEX));
    for tid in 101..=104 {
        let c = counters(10, 0.1, [0.05, 0.8, 0.0, 0.0, 0.02, 0.0], 256_000_000);
        job = job
            .thread_of(tid, 100, c, waiting(reason::IO, 0), -1)
            .woken_by_thread(100, tid, 100, "loader", 250);
    }
    let v = job.judge(&[]);
    assert_eq!(v.kind, Kind::InputIoBound, "{v:?}");
    for want in ["4 loader threads of the trainer read 1.0 GB at 102 MB/s", "off-CPU in file reads"] {
        assert!(v.summary.contains(want), "{want:?} not in {}", v.summary);
    }
    assert!(v.summary.contains("woken 1000 times by 4 threads of its own"), "{}", v.summary);
    let named: Vec<u32> = v.blamed.iter().filter(|b| b.what == "loader thread").map(|b| b.tid).collect();
    assert_eq!(named, [101, 102, 103, 104]);
    let last = v.path.last().unwrap();
    assert_eq!((last.who, last.state, last.tids.len()), ("loader threads", "io", 4), "{:?}", v.path);
}

/// The same threads decoding what they read, on CPU: CPU-bound.
#[test]
fn loader_threads_on_cpu_are_a_cpu_bound_input() {
    let mut job = Job::new(10).trainer(0.05, [0.9, 0.0, 0.0, 0.0, 0.02, 0.0], blocked(reason::FUTEX));
    for tid in 101..=102 {
        let c = counters(10, 0.6, [0.0, 0.05, 0.0, 0.0, 0.3, 0.0], 20_000_000);
        job = job.thread_of(tid, 100, c, RUNNING, -1).woken_by_thread(100, tid, 100, "loader", 90);
    }
    let v = job.judge(&[]);
    assert_eq!(v.kind, Kind::InputCpuBound, "{v:?}");
    assert!(v.summary.contains("2 loader threads of the trainer"), "{}", v.summary);
}

/// A pure-Python metrics thread keeps the GIL; the main thread takes it
/// back after each short call and waits in futex, woken by that thread.
/// It logs a line each step: never a hang, whatever its silence was.
#[test]
fn a_thread_of_the_trainer_holding_the_gil_is_what_it_waits_for() {
    let gil = || {
        let metrics = counters(10, 0.93, [0.01, 0.0, 0.0, 0.0, 0.06, 0.0], 0);
        Job::new(10)
            .trainer(0.08, [0.86, 0.0, 0.0, 0.05, 0.01, 0.0], blocked(reason::FUTEX))
            .thread_of(3837, 100, metrics, RUNNING, -1)
            .woken_by_thread(100, 3837, 100, "metrics", 1800)
            .woken_by_thread(100, 100, 100, "python", 10)
    };
    let v = gil().printed(4096).judge(&[gpu(0.0, 10, None)]);
    assert_eq!(v.kind, Kind::TrainerHostBound, "{v:?}");
    for want in ["waiting for thread 3837 (python) of the trainer", "on CPU 99%", "Python's GIL"] {
        assert!(v.summary.contains(want), "{want:?} not in {}", v.summary);
    }
    assert!(v.blamed.iter().any(|b| b.tid == 3837), "{:?}", v.blamed);
    // The path: the main thread in futex, then that thread on CPU.
    let steps: Vec<(&str, &str, Vec<u32>)> =
        v.path.iter().map(|p| (p.who, p.state, p.tids.clone())).collect();
    assert_eq!(steps, [("trainer main thread", "futex", vec![100]), ("thread", "on-cpu", vec![3837])]);
    assert!(v.path[1].share.is_some_and(|s| s > 0.98), "{:?}", v.path);
    // Seen silent (its lines not seen yet): a thread at work is no hang.
    let v = gil().judge(&[gpu(0.0, 10, None)]);
    assert_ne!(v.kind, Kind::Hang, "{v:?}");
}

/// The same on a slow CPU: the main thread runs its own bytecode 45 % of
/// the time and waits for the GIL's holder 47 %, neither alone the half
/// that names a cause: together they are the host.
#[test]
fn a_main_thread_between_its_own_work_and_the_gil_holder_is_host_bound() {
    let metrics = counters(10, 0.97, [0.01, 0.0, 0.0, 0.0, 0.02, 0.0], 0);
    let v = Job::new(10)
        .trainer(0.45, [0.47, 0.0, 0.0, 0.08, 0.0, 0.0], blocked(reason::FUTEX))
        .thread_of(3837, 100, metrics, RUNNING, -1)
        .woken_by_thread(100, 3837, 100, "metrics", 1800)
        .printed(4096)
        .judge(&[gpu(0.0, 10, None)]);
    assert_eq!(v.kind, Kind::TrainerHostBound, "{v:?}");
    assert!(v.summary.contains("waiting for thread 3837 (python) of the trainer"), "{}", v.summary);
    // Half of that waiting, and the rest asleep: no cause named.
    let metrics = counters(10, 0.97, [0.01, 0.0, 0.0, 0.0, 0.02, 0.0], 0);
    let v = Job::new(10)
        .trainer(0.10, [0.35, 0.0, 0.0, 0.55, 0.0, 0.0], blocked(reason::FUTEX))
        .thread_of(3837, 100, metrics, RUNNING, -1)
        .woken_by_thread(100, 3837, 100, "metrics", 1800)
        .printed(4096)
        .judge(&[gpu(0.0, 10, None)]);
    assert_ne!(v.kind, Kind::TrainerHostBound, "{v:?}");
}

/// The same, with the waits timed by the kernel: the line and the path
/// say how much of the window the main thread waited for that thread.
#[test]
fn the_time_the_main_thread_waited_for_a_thread_is_named() {
    let metrics = counters(10, 0.93, [0.01, 0.0, 0.0, 0.0, 0.06, 0.0], 0);
    let v = Job::new(10)
        .trainer(0.08, [0.86, 0.0, 0.0, 0.05, 0.01, 0.0], blocked(reason::FUTEX))
        .thread_of(3837, 100, metrics, RUNNING, -1)
        .woken_after(100, (3837, 100, "metrics"), 1800, 8.0)
        .woken_after(100, (0, 0, "[interrupt]"), 50, 0.5)
        .printed(4096)
        .judge(&[gpu(0.0, 10, None)]);
    assert_eq!(v.kind, Kind::TrainerHostBound, "{v:?}");
    assert!(v.summary.contains("waits 80% of the time for thread 3837 (python)"), "{}", v.summary);
    let waited = v.path[1].waited.expect("timed");
    assert!((waited - 0.8).abs() < 0.01, "{:?}", v.path);
    assert_eq!(v.path[0].waited, None);
    // Waits ended mostly by the timer (the GIL's timed waits): no share
    // worth saying, the thread still named.
    let metrics = counters(10, 0.93, [0.01, 0.0, 0.0, 0.0, 0.06, 0.0], 0);
    let v = Job::new(10)
        .trainer(0.08, [0.86, 0.0, 0.0, 0.05, 0.01, 0.0], blocked(reason::FUTEX))
        .thread_of(3837, 100, metrics, RUNNING, -1)
        .woken_after(100, (3837, 100, "metrics"), 300, 0.05)
        .woken_after(100, (0, 0, "[interrupt]"), 1500, 8.0)
        .printed(4096)
        .judge(&[gpu(0.0, 10, None)]);
    assert_eq!(v.kind, Kind::TrainerHostBound, "{v:?}");
    assert!(v.summary.contains("waiting for thread 3837 (python) of the trainer"), "{}", v.summary);
}

/// Who ends the waiting is who ended the most blocked time, not who woke
/// the most often: workers that wake the trainer for every batch in a
/// trickle of short waits are not its bottleneck when one of its own
/// threads, on CPU, ended the long ones.
#[test]
fn blocked_time_not_wakeups_says_who_ends_the_waits() {
    let busy = counters(10, 0.95, [0.0, 0.0, 0.0, 0.0, 0.05, 0.0], 0);
    let job = || {
        let mut job = Job::new(10)
            .trainer(0.1, [0.85, 0.0, 0.0, 0.0, 0.05, 0.0], blocked(reason::FUTEX))
            .thread_of(3837, 100, busy, RUNNING, -1);
        for pid in 101..=102 {
            job = job.worker(pid, 0.3, [0.0, 0.0, 0.6, 0.0, 0.1, 0.0], 1_000_000);
        }
        job
    };
    let by_time = job()
        .woken_after(100, (101, 101, "pt_data_worker"), 900, 0.4)
        .woken_after(100, (102, 102, "pt_data_worker"), 900, 0.4)
        .woken_after(100, (3837, 100, "metrics"), 40, 7.5)
        .judge(&[]);
    assert_eq!(by_time.kind, Kind::TrainerHostBound, "{by_time:?}");
    assert!(by_time.summary.contains("thread 3837"), "{}", by_time.summary);
    // The same wakeups, untimed (counts alone): the workers woke it more.
    let by_count = job()
        .woken_after(100, (101, 101, "pt_data_worker"), 900, 0.0)
        .woken_after(100, (102, 102, "pt_data_worker"), 900, 0.0)
        .woken_after(100, (3837, 100, "metrics"), 40, 0.0)
        .judge(&[]);
    assert!(!by_count.summary.contains("thread 3837"), "{}", by_count.summary);
}

/// DataLoader workers whose `__getitem__` sleeps (a rate limit): they wake
/// the trainer, and spend their time asleep.
#[test]
fn workers_that_sleep_make_the_input_wait() {
    let mut job = Job::new(10).trainer(0.02, [0.0, 0.0, 0.91, 0.0, 0.0, 0.0], blocked(reason::POLL));
    for pid in 101..=102 {
        job = job.worker(pid, 0.05, [0.0, 0.0, 0.0, 0.95, 0.0, 0.0], 0).woken_by(100, pid, 40);
    }
    let v = job.judge(&[]);
    assert_eq!(v.kind, Kind::InputWaitBound, "{v:?}");
    assert!(v.summary.contains("2 workers spend 95% of their time asleep"), "{}", v.summary);
    // One worker is one.
    let one = Job::new(10)
        .trainer(0.02, [0.0, 0.0, 0.91, 0.0, 0.0, 0.0], blocked(reason::POLL))
        .worker(101, 0.05, [0.0, 0.0, 0.0, 0.95, 0.0, 0.0], 0)
        .woken_by(100, 101, 40)
        .judge(&[]);
    assert!(one.summary.contains("1 worker spends 95% of its time asleep"), "{}", one.summary);
    // Workers asleep that never feed it (an idle job waiting on a timer)
    // are not its input.
    let mut idle = Job::new(10).trainer(0.02, [0.0, 0.0, 0.91, 0.0, 0.0, 0.0], blocked(reason::POLL));
    idle = idle.worker(101, 0.0, [0.0, 0.0, 0.0, 0.99, 0.0, 0.0], 0);
    assert_ne!(idle.judge(&[]).kind, Kind::InputWaitBound);
}

/// 64 KiB per step printed into a pipe that a log shipper drains at
/// 1.6 MB/s: the trainer is blocked writing its stdout.
#[test]
fn stdout_into_a_slow_pipe_is_output_bound_and_names_its_reader() {
    let mut c = counters(10, 0.12, [0.1, 0.0, 0.0, 0.0, 0.02, 0.0], 0);
    c.off_ns[usize::from(reason::SEND)] = 76 * S / 10;
    (c.other_write_bytes, c.stdio_write_bytes) = (16_000_000, 16_000_000);
    let pipe = WaitObject::Pipe { fd: 1, writing: true, others: vec![party(812, "fluent-bit")] };
    let v = Job::new(10)
        .thread_of(100, 100, c, waiting(reason::SEND, 1), -1)
        .waiting_on(100, reason::SEND, pipe)
        .judge(&[]);
    assert_eq!(v.kind, Kind::OutputIoBound, "{v:?}");
    assert_eq!((v.path[0].state, v.path[0].share), ("send", Some(0.76)), "{:?}", v.path);
    assert_eq!(
        v.path[0].object.as_ref().map(crate::detail::Text::shown).as_deref(),
        Some("stdout, a pipe read by pid 812 (fluent-bit)")
    );
    assert!(
        v.summary.contains(
            "blocked 76% of 10.0s writing stdout, a pipe read by pid 812 (fluent-bit) (16.0 MB at 1.6 MB/s)"
        ),
        "{}",
        v.summary
    );
}

/// A synchronous upload of a checkpoint: one `sendall` of 64 MB to a slow
/// object store, no byte of it counted yet (the call has not returned). A
/// thread sending is moving data, not hung; the peer is named.
#[test]
fn an_upload_to_a_slow_peer_is_output_bound_not_a_hang() {
    let mut c = counters(8, 0.02, [0.0; 6], 0);
    c.off_ns[usize::from(reason::SEND)] = 78 * S / 10;
    let peer = WaitObject::Socket { fd: 7, peer: Some("10.0.0.5:9000".into()), others: vec![] };
    let v = Job::new(8)
        .thread_of(100, 100, c, waiting(reason::SEND, 44), -1)
        .waiting_on(100, reason::SEND, peer)
        .silent(7.0, Some(1.0), Some(("/runs/train.log", 7.0)))
        .judge(&[gpu(0.0, 8, None)]);
    assert_eq!(v.kind, Kind::OutputIoBound, "{v:?}");
    assert!(v.summary.contains("writing the socket to 10.0.0.5:9000"), "{}", v.summary);
}

/// The trainer waits in `flock` on a lock another program holds (a build
/// lock): a hang, naming the call, the lock file and its holder.
#[test]
fn a_lock_held_elsewhere_names_the_file_and_its_holder() {
    let c = counters(6, 0.001, [0.0, 0.0, 0.0, 0.0, 0.0, 0.999], 0);
    let lock = WaitObject::Lock {
        path: "/root/.cache/torch_extensions/py311_cpu/ext/lock".into(),
        holders: vec![party(4410, "python")],
    };
    let v = Job::new(6)
        .thread_of(100, 100, c, waiting(reason::OTHER, 73), 73)
        .waiting_on(100, reason::OTHER, lock)
        .judge(&[]);
    assert_eq!(v.kind, Kind::Hang, "{v:?}");
    assert!(
        v.summary.contains(
            "(other in flock for 13 s: the lock on /root/.cache/torch_extensions/py311_cpu/ext/lock, held by pid 4410 (python))"
        ),
        "{}",
        v.summary
    );
}

/// A trainer waiting in `wait4` for its child `cmdline`, on CPU.
fn waiting_for_child_on_cpu(cmdline: &str) -> Job {
    let mut job = Job::new(10);
    job.model.note_process(300, Some(100), "python3", Some(cmdline.into()));
    let c = counters(10, 0.01, [0.0, 0.0, 0.0, 0.0, 0.0, 0.98], 0);
    let child = counters(10, 0.95, [0.0, 0.02, 0.0, 0.0, 0.02, 0.0], 1_000_000);
    job.thread_of(100, 100, c, waiting(reason::OTHER, 61), 61).thread_of(300, 300, child, RUNNING, -1)
}

/// The verdict of a trainer waiting for `waiting_for_child_on_cpu`'s
/// evaluation, and that alone.
fn waits_for_the_evaluation_on_cpu(v: &Verdict) {
    assert_eq!(v.kind, Kind::TrainerHostBound, "{v:?}");
    let want = "waiting for its child pid 300 (python3 eval.py --split val), on CPU 98%";
    assert!(v.summary.contains(want), "{}", v.summary);
}

/// An evaluation run as a subprocess: the trainer waits in `wait4`, the
/// child is on CPU.
#[test]
fn a_child_on_cpu_that_the_trainer_waits_for_is_named() {
    let v = waiting_for_child_on_cpu("python3 eval.py --split val").judge(&[]);
    waits_for_the_evaluation_on_cpu(&v);
    assert!(v.blamed.iter().any(|b| (b.pid, b.tid) == (300, 300)), "{:?}", v.blamed);
    // Its line in the evidence calls it what it is.
    assert!(v.evidence.iter().any(|e| e.starts_with("child 300 (python3 pid 300)")), "{:#?}", v.evidence);
    assert!(!v.evidence.iter().any(|e| e.starts_with("worker")), "{:#?}", v.evidence);
}

/// Run through a shim that forked helpers before it exec'd the
/// interpreter (pyenv's): the helpers, still its children, were the
/// shim's; the wait is for the evaluation alone.
#[test]
fn a_shims_helpers_are_not_the_children_a_trainer_waits_for() {
    let mut job = waiting_for_child_on_cpu("python3 eval.py --split val");
    for (i, helper) in (400..405).enumerate() {
        job.model.note_process(helper, Some(100), "bash", Some("bash pyenv-which python3".into()));
        let p = job.model.procs.get_mut(&helper).unwrap();
        p.born_ns = 1_000 + i as u64;
        job = job.thread_of(helper, helper, counters(10, 0.002, [0.0; 6], 0), RUNNING, -1);
    }
    job.model.procs.get_mut(&100).unwrap().exec_ns = 2_000;
    let v = job.judge(&[]);
    waits_for_the_evaluation_on_cpu(&v);
}

/// A trainer with two DataLoader workers (which woke it 200 times each
/// before the evaluation began, idle since) runs an evaluation subprocess:
/// the evaluation is what it waits for, the workers are no part of it.
#[test]
fn dataloader_workers_are_not_the_children_a_trainer_waits_for() {
    let mut job =
        waiting_for_child_on_cpu("python3 eval.py --split val").woken_by_thread(100, 300, 300, "python3", 1);
    for pid in [101, 102] {
        job = job.worker(pid, 0.01, [0.0, 0.0, 0.95], 20_000_000).woken_by_thread(
            100,
            pid,
            pid,
            "pt_data_worker",
            200,
        );
    }
    let v = job.judge(&[]);
    waits_for_the_evaluation_on_cpu(&v);
}

/// A child's command line of several lines (`python3 -c` and a script) is
/// told on one line, cut short.
#[test]
fn a_childs_command_line_is_told_on_one_line() {
    let script =
        "python3 -c import time\nend = time.perf_counter() + 1.5\nwhile time.perf_counter() < end: pass";
    let v = waiting_for_child_on_cpu(script).judge(&[]);
    let want = "its child pid 300 (python3 -c import time end = time.perf_counter() + 1.5 while…), on CPU";
    assert!(v.summary.contains(want), "{}", v.summary);
}

/// The evaluation started through a shell (`sh -c "python3 eval.py; …"`):
/// the shell only waits for its own child, which is on CPU. The wait is
/// followed through the shell, and both are named as what they are.
#[test]
fn a_child_started_through_a_shell_is_followed_through_it() {
    let mut job = Job::new(10);
    job.model.note_process(300, Some(100), "sh", Some("sh -c python3 eval.py; echo done".into()));
    job.model.note_process(301, Some(300), "python3", Some("python3 eval.py".into()));
    let c = counters(10, 0.01, [0.0, 0.0, 0.0, 0.0, 0.0, 0.98], 0);
    let shell = counters(10, 0.01, [0.0, 0.0, 0.0, 0.0, 0.0, 0.97], 0);
    let eval = counters(10, 0.95, [0.0, 0.02, 0.0, 0.0, 0.02, 0.0], 1_000_000);
    let v = job
        .thread_of(100, 100, c, waiting(reason::OTHER, 61), 61)
        .thread_of(300, 300, shell, waiting(reason::OTHER, 61), 61)
        .thread_of(301, 301, eval, RUNNING, -1)
        .judge(&[]);
    assert_eq!(v.kind, Kind::TrainerHostBound, "{v:?}");
    let want = "waiting for its child pid 300 (sh -c python3 eval.py; echo done), which waits for its child pid 301 (python3 eval.py), on CPU 98%";
    assert!(v.summary.contains(want), "{}", v.summary);
    let named: Vec<(u32, u32, &str)> =
        v.blamed.iter().filter(|b| b.pid != 100).map(|b| (b.pid, b.tid, b.what)).collect();
    assert_eq!(
        named,
        [(300, 300, "child the wait goes through"), (301, 301, "child the trainer waits for")],
        "{:?}",
        v.blamed
    );
    let steps: Vec<(&str, &str)> = v.path.iter().map(|p| (p.who, p.state)).collect();
    assert_eq!(steps, [("trainer main thread", "other"), ("child", "other"), ("child", "on-cpu")]);
}

/// A checkpoint uploaded by a subprocess the trainer waits for: the child
/// is blocked sending to the store, so the trainer is output-bound.
#[test]
fn a_child_uploading_what_the_trainer_waits_for_is_output_bound() {
    let mut job = Job::new(10);
    job.model.note_process(300, Some(100), "python3", Some("python3 upload.py ckpt.pt".into()));
    let c = counters(10, 0.01, [0.0, 0.0, 0.0, 0.0, 0.0, 0.97], 0);
    let mut up = counters(10, 0.05, [0.0, 0.0, 0.05, 0.0, 0.0, 0.0], 0);
    up.off_ns[usize::from(reason::SEND)] = 85 * S / 10;
    up.other_write_bytes = 20_000_000;
    let peer = WaitObject::Socket { fd: 3, peer: Some("10.0.0.5:9000".into()), others: vec![] };
    let v = job
        .thread_of(100, 100, c, waiting(reason::OTHER, 61), 61)
        .thread_of(300, 300, up, waiting(reason::SEND, 44), -1)
        .waiting_on(300, reason::SEND, peer)
        .judge(&[]);
    assert_eq!(v.kind, Kind::OutputIoBound, "{v:?}");
    let want = "waiting for its child pid 300 (python3 upload.py ckpt.pt), blocked 89% writing the socket to 10.0.0.5:9000 (20.0 MB at 2.0 MB/s)";
    assert!(v.summary.contains(want), "{}", v.summary);
    let last = v.path.last().unwrap();
    assert_eq!(
        (last.who, last.state, last.object.as_ref().map(crate::detail::Text::shown).as_deref()),
        ("child", "send", Some("the socket to 10.0.0.5:9000"))
    );
}

/// The uploading child sends the parts of a checkpoint from threads of its
/// own and joins them (a multipart upload): its main thread waits in
/// futex, woken by them; they are followed, and the trainer is
/// output-bound on their socket.
#[test]
fn a_child_whose_threads_upload_what_the_trainer_waits_for_is_output_bound() {
    let mut job = Job::new(10);
    job.model.note_process(300, Some(100), "python3", Some("python3 upload.py --parts 2 ckpt.pt".into()));
    let c = counters(10, 0.01, [0.0, 0.0, 0.0, 0.0, 0.0, 0.97], 0);
    let main = counters(10, 0.03, [0.95], 0);
    let part = |bytes: u64| {
        let mut p = counters(10, 0.05, [0.0, 0.0, 0.05], 0);
        p.off_ns[usize::from(reason::SEND)] = 86 * S / 10;
        p.other_write_bytes = bytes;
        p
    };
    let peer = WaitObject::Socket { fd: 5, peer: Some("10.0.0.5:9000".into()), others: vec![] };
    let v = job
        .thread_of(100, 100, c, waiting(reason::OTHER, 61), 61)
        .thread_of(300, 300, main, waiting(reason::FUTEX, 202), 202)
        .thread_of(301, 300, part(10_000_000), waiting(reason::SEND, 44), -1)
        .thread_of(302, 300, part(10_000_000), waiting(reason::SEND, 44), -1)
        .woken_by_thread(300, 301, 300, "python3", 1)
        .woken_by_thread(300, 302, 300, "python3", 1)
        .waiting_on(302, reason::SEND, peer)
        .judge(&[]);
    assert_eq!(v.kind, Kind::OutputIoBound, "{v:?}");
    let want = "waiting for its child pid 300 (python3 upload.py --parts 2 ckpt.pt), blocked 90% writing the socket to 10.0.0.5:9000 (20.0 MB at 2.0 MB/s)";
    assert!(v.summary.contains(want), "{}", v.summary);
    let last = v.path.last().unwrap();
    assert_eq!(
        (
            last.who,
            last.state,
            last.tids.as_slice(),
            last.object.as_ref().map(crate::detail::Text::shown).as_deref()
        ),
        ("child", "send", &[301, 302][..], Some("the socket to 10.0.0.5:9000"))
    );
}

/// A child uploads a checkpoint in one long send per thread: no byte is
/// counted until the calls return, but its thread is blocked on a socket
/// to a peer outside the job all along: moving data, no hang however
/// silent the trainer. The same wait on a peer inside the job moves
/// nothing the job could show.
#[test]
fn a_child_blocked_sending_to_a_store_all_window_is_no_hang() {
    let uploading = |outside: bool| {
        let mut job = Job::new(10);
        job.model.note_process(300, Some(100), "python3", Some("python3 put.py".into()));
        job.model.note_peer("10.0.0.5:9000", !outside);
        let c = counters(10, 0.0, [0.0, 0.0, 0.0, 0.0, 0.0, 1.0], 0);
        let main = counters(10, 0.0, [1.0], 0);
        let mut part = counters(10, 0.02, [], 0);
        part.off_ns[usize::from(reason::SEND)] = 98 * S / 10;
        job.thread_of(100, 100, c, waiting(reason::OTHER, 61), 61)
            .thread_of(300, 300, main, waiting(reason::FUTEX, 202), 202)
            .thread_of(301, 300, part, waiting(reason::SEND, 44), 44)
            .connected(300, 5, "10.0.0.5:9000", 0)
            .blocked_on_fd(300, 5, 9.8)
            .silent(10.0, None, Some(("/runs/train.log", 10.0)))
            .judge(&[])
    };
    let v = uploading(true);
    assert_ne!(v.kind, Kind::Hang, "{}", v.summary);
    let v = uploading(false);
    assert_eq!(v.kind, Kind::Hang, "{}", v.summary);
}

/// Three evaluations, one after another, each 2 s of a 10 s window on CPU;
/// a helper child (a metrics server) asleep all along ended none of the
/// trainer's waits: the evaluations are judged over their own lifetimes,
/// the helper left out.
#[test]
fn children_run_one_after_another_are_judged_over_their_lives() {
    let mut job = Job::new(10);
    job.model.note_process(400, Some(100), "python3", Some("python3 -m metrics_server".into()));
    let c = counters(10, 0.05, [0.0, 0.0, 0.0, 0.0, 0.0, 0.9], 0);
    job = job.thread_of(100, 100, c, waiting(reason::OTHER, 61), 61).thread_of(
        400,
        400,
        counters(10, 0.0, [0.0, 0.0, 0.0, 1.0], 0),
        waiting(reason::SLEEP, 230),
        -1,
    );
    for (pid, life) in [(301, 0.2), (302, 0.2), (303, 0.15)] {
        job.model.note_process(pid, Some(100), "python3", Some(format!("python3 eval.py --round {pid}")));
        let c = counters(10, life * 0.9, [0.0, life * 0.05, 0.0, 0.0, life * 0.05], 0);
        job = job.thread_of(pid, pid, c, RUNNING, -1).woken_by_thread(100, pid, pid, "python3", 1);
    }
    let v = job.judge(&[]);
    assert_eq!(v.kind, Kind::TrainerHostBound, "{v:?}");
    let want = "waiting for its 3 children, one after another (the longest pid 301 (python3 eval.py --round 301)), on CPU 95%";
    assert!(v.summary.contains(want), "{}", v.summary);
    assert!(!v.blamed.iter().any(|b| b.pid == 400), "{:?}", v.blamed);
    let last = v.path.last().unwrap();
    assert_eq!((last.who, &last.pids[..]), ("children", &[301, 302, 303][..]), "{:?}", v.path);
}

/// A child that sleeps between retries (a back-off against a busy
/// service): the trainer waits on its sleeps.
#[test]
fn a_child_that_sleeps_makes_the_trainer_wait_on_its_sleeps() {
    let mut job = Job::new(10);
    job.model.note_process(300, Some(100), "python3", Some("python3 fetch_eval_set.py".into()));
    let c = counters(10, 0.01, [0.0, 0.0, 0.0, 0.0, 0.0, 0.97], 0);
    let child = counters(10, 0.02, [0.0, 0.0, 0.1, 0.85], 0);
    let v = job
        .thread_of(100, 100, c, waiting(reason::OTHER, 61), 61)
        .thread_of(300, 300, child, waiting(reason::SLEEP, 230), -1)
        .silent(2.0, Some(1.0), Some(("/runs/fetch.log", 2.0)))
        .judge(&[]);
    assert_eq!(v.kind, Kind::InputWaitBound, "{v:?}");
    assert!(v.summary.contains("(python3 fetch_eval_set.py), asleep 88% of its time"), "{}", v.summary);
}

/// A gloo rank on a crowded host: its main thread waits in futex for its
/// collective thread, which waits on the peers' sockets (woken by the
/// network, not by the workers); its workers, CPU-starved, want the CPU.
/// The trainer waits on what its thread waits for, not on its input.
#[test]
fn a_thread_that_waits_on_peers_is_no_input_stall_though_the_workers_want_cpu() {
    let gloo = counters(10, 0.03, [0.0, 0.0, 0.95, 0.0, 0.02, 0.0], 0);
    let mut job = Job::new(10)
        .trainer(0.1, [0.46, 0.0, 0.09, 0.0, 0.35, 0.0], blocked(reason::FUTEX))
        .thread_of(105, 100, gloo, waiting(reason::POLL, 7), -1)
        .woken_after(100, (105, 100, "python"), 300, 4.0)
        .woken_after(105, (0, 0, "[interrupt]"), 320, 8.0);
    for pid in 101..=102 {
        job = job.worker(pid, 0.08, [0.0, 0.05, 0.48, 0.0, 0.39, 0.0], 30_000_000);
        job = job.woken_after(100, (pid, pid, "pt_data_worker"), 60, 0.4);
    }
    let peer = WaitObject::Socket { fd: 7, peer: Some("127.0.0.1:29622".into()), others: vec![] };
    let v = job.waiting_on(105, reason::POLL, peer).judge(&[]);
    assert_eq!(v.kind, Kind::Unknown, "{v:?}");
    for want in
        ["waits 40% of the time for thread 105", "blocked 95% (poll on the socket to 127.0.0.1:29622)"]
    {
        assert!(v.summary.contains(want), "{want:?} not in {}", v.summary);
    }
    let steps: Vec<(&str, &str)> = v.path.iter().map(|p| (p.who, p.state)).collect();
    assert_eq!(steps, [("trainer main thread", "futex"), ("thread", "poll")], "{:?}", v.path);
}

/// The slow rank of a gloo run on a crowded host: its main thread waits on
/// its collective threads (5.8 s) and on its CPU-bound workers (5.3 s)
/// alike: its input is a cause of its own, not a wait for its peers.
#[test]
fn a_rank_waiting_on_its_peers_and_its_busy_workers_alike_is_input_bound() {
    let gloo = counters(14, 0.05, [0.9, 0.0, 0.0, 0.0, 0.03, 0.0], 0);
    let mut job = Job::new(14)
        .trainer(0.3, [0.4, 0.0, 0.38, 0.0, 0.2, 0.0], blocked(reason::POLL))
        .thread_of(105, 100, gloo, waiting(reason::FUTEX, 202), -1)
        .thread_of(106, 100, gloo, waiting(reason::FUTEX, 202), -1)
        .woken_after(100, (105, 100, "pt_gloo_runloop"), 254, 3.2)
        .woken_after(100, (106, 100, "pt_gloo_runloop"), 244, 2.56);
    for (pid, ended) in [(101, 3.4), (102, 1.9)] {
        job = job.worker(pid, 0.6, [0.0, 0.0, 0.05, 0.0, 0.3, 0.0], 25_000_000);
        job = job.woken_after(100, (pid, pid, "pt_data_worker"), 470, ended);
    }
    let v = job.judge(&[]);
    assert_eq!(v.kind, Kind::InputCpuBound, "{v:?}");
}

/// PyTorch's pin-memory thread: it ends the main thread's waits, but the
/// workers end its own: the wait goes on to them, CPU-bound as they are.
#[test]
fn a_thread_the_workers_wake_hands_the_wait_on_to_them() {
    let pin = counters(10, 0.05, [0.0, 0.0, 0.85, 0.0, 0.02, 0.0], 0);
    let mut job = Job::new(10)
        .trainer(0.1, [0.8, 0.0, 0.0, 0.0, 0.05, 0.0], blocked(reason::FUTEX))
        .thread_of(105, 100, pin, waiting(reason::POLL, 7), -1)
        .woken_after(100, (105, 100, "pt_pin_memory"), 300, 7.5);
    for pid in 101..=102 {
        job = job.worker(pid, 0.6, [0.0, 0.05, 0.0, 0.0, 0.3, 0.0], 30_000_000).woken_after(
            105,
            (pid, pid, "pt_data_worker"),
            150,
            4.0,
        );
    }
    let v = job.judge(&[]);
    assert_eq!(v.kind, Kind::InputCpuBound, "{v:?}");
}

impl Job {
    /// Process `tgid` connected `fd` to `peer` and read `bytes` from it.
    /// Process `tgid`'s threads were blocked `secs` on descriptor `fd`.
    fn blocked_on_fd(mut self, tgid: u32, fd: i32, secs: f64) -> Self {
        let blocked_ns = (secs * S as f64) as u64;
        self.fd_waits.push(crate::decode::FdWaitSnap { tgid, fd, blocked_ns });
        self
    }

    fn connected(mut self, tgid: u32, fd: i32, peer: &str, bytes: u64) -> Self {
        let file_id = 900 + u64::from(fd as u32);
        self.model.apply(&Event::Connect { ts: 0, tgid, fd, file_id, peer: peer.into() });
        self.files.push(FileSnap {
            tgid,
            fd,
            file_id,
            kind: fd_kind::SOCKET,
            counters: FileCounters { read_bytes: bytes, read_calls: bytes / 65536 + 1, ..Default::default() },
        });
        self
    }
}

/// The main thread joins a thread that uploads a checkpoint to a slow
/// object store: the wait ends in that thread's sends, output-bound.
#[test]
fn a_thread_uploading_what_the_trainer_waits_for_is_output_bound() {
    let mut up = counters(10, 0.02, [0.0, 0.0, 0.15, 0.0, 0.0, 0.0], 0);
    up.off_ns[usize::from(reason::SEND)] = 83 * S / 10;
    up.other_write_bytes = 25_200_000;
    let peer = WaitObject::Socket { fd: 3, peer: Some("127.0.0.1:40985".into()), others: vec![] };
    let v = Job::new(10)
        .trainer(0.05, [0.94, 0.0, 0.01, 0.0, 0.0, 0.0], blocked(reason::FUTEX))
        .thread_of(709, 100, up, waiting(reason::SEND, 44), -1)
        .woken_after(100, (709, 100, "python3"), 3, 9.4)
        .woken_after(709, (0, 0, "[interrupt]"), 20, 9.7)
        .waiting_on(709, reason::SEND, peer)
        .judge(&[]);
    assert_eq!(v.kind, Kind::OutputIoBound, "{v:?}");
    let want = "thread 709 (python) of the trainer, which is blocked 83% writing the socket to 127.0.0.1:40985 (25.2 MB at 2.5 MB/s)";
    assert!(v.summary.contains(want), "{}", v.summary);
}

/// The main thread waits on an event a thread sets between sleeps (a
/// rate-limited API): a wait on those sleeps.
#[test]
fn a_thread_that_sleeps_between_batches_makes_the_trainer_wait() {
    let loader = counters(10, 0.0, [0.0, 0.0, 0.0, 1.0, 0.0, 0.0], 0);
    let v = Job::new(10)
        .trainer(0.04, [0.95, 0.0, 0.01, 0.0, 0.0, 0.0], blocked(reason::FUTEX))
        .thread_of(1006, 100, loader, waiting(reason::SLEEP, 230), -1)
        .woken_after(100, (1006, 100, "python3"), 31, 9.5)
        .woken_after(1006, (0, 0, "[interrupt]"), 30, 10.0)
        .printed(4096)
        .judge(&[]);
    assert_eq!(v.kind, Kind::InputWaitBound, "{v:?}");
    assert!(
        v.summary.contains("thread 1006 (python) of the trainer, which spends 100% of its time asleep"),
        "{}",
        v.summary
    );
}

/// No workers: the trainer reads its samples from a data server over a
/// socket, woken by the network: its input streams in, slowly.
#[test]
fn a_trainer_streaming_its_input_from_a_slow_server_is_input_bound() {
    streamed(false);
}

/// The same, where the trainer was last seen writing a file (its results,
/// as the stream ended): the socket it waited on for its input is still
/// what it waited on for that reason.
#[test]
fn a_trainer_that_wrote_a_file_after_its_stream_still_names_the_socket() {
    streamed(true);
}

fn streamed(wrote_after: bool) {
    let peer = WaitObject::Socket { fd: 3, peer: Some("10.1.2.3:8000".into()), others: vec![] };
    let mut job = Job::new(10)
        .trainer(0.11, [0.0, 0.0, 0.88, 0.0, 0.01, 0.0], waiting(reason::POLL, 45))
        .connected(100, 3, "10.1.2.3:8000", 20_000_000)
        .woken_after(100, (0, 0, "[interrupt]"), 600, 8.7);
    if wrote_after {
        job = job.waiting_on(100, reason::WRITE, WaitObject::File { fd: 4, path: "/out/truth.json".into() });
    }
    let v = job.waiting_on(100, reason::POLL, peer).judge(&[]);
    assert_eq!(v.kind, Kind::InputIoBound, "{v:?}");
    let want = "blocked 88% of 10.0s reading the socket to 10.1.2.3:8000 (20.0 MB at 2.0 MB/s), woken from outside the job";
    assert!(v.summary.contains(want), "{}", v.summary);
    assert_eq!(
        v.path[0].object.as_ref().map(crate::detail::Text::shown).as_deref(),
        Some("the socket to 10.1.2.3:8000"),
        "{:?}",
        v.path
    );
}

/// The same through a pipe (a decoder writing into the trainer's stdin or
/// a FIFO): the writer's pace; but a pipe the job's own workers write
/// (a multiprocessing queue) is no such input.
#[test]
fn a_trainer_fed_through_a_pipe_waits_on_its_writer_unless_a_worker_writes_it() {
    let fed = |writer: u32| {
        let mut c = counters(10, 0.2, [0.0, 0.0, 0.78, 0.0, 0.02, 0.0], 0);
        c.other_read_bytes = 12_000_000;
        let pipe = WaitObject::Pipe { fd: 0, writing: false, others: vec![party(writer, "ffmpeg")] };
        Job::new(10)
            .thread_of(100, 100, c, waiting(reason::POLL, 0), -1)
            .woken_after(100, (writer, writer, "ffmpeg"), 600, 7.6)
            .waiting_on(100, reason::POLL, pipe)
    };
    let v = fed(840).judge(&[]);
    assert_eq!(v.kind, Kind::InputWaitBound, "{v:?}");
    assert!(
        v.summary.contains("reading stdin, a pipe written by pid 840 (ffmpeg) (12.0 MB at 1.2 MB/s)"),
        "{}",
        v.summary
    );
    let mut job = fed(101);
    job = job.worker(101, 0.2, [0.0, 0.0, 0.7, 0.0, 0.0, 0.0], 0);
    assert_ne!(job.judge(&[]).kind, Kind::InputWaitBound);
}

/// A process outside the job at the other end, `cpu_s` of its last 12 s
/// on CPU and `storage` bytes read from storage.
fn busy_party(pid: u32, comm: &str, cpu_s: f64, storage: u64) -> Party {
    let mut p = party(pid, comm);
    p.activity = Some(crate::wait::Activity {
        span_ns: 12 * S,
        cpu_ns: (cpu_s * S as f64) as u64,
        storage_read_bytes: storage,
    });
    p
}

/// The trainer asks a server outside the job over a Unix socket, or reads
/// a FIFO a preprocessor writes: what that process does decides. On CPU
/// all along: input-cpu-bound, naming it; reading storage: input-io-bound;
/// idle: the transport's kind, as before. The path gains the step.
#[test]
fn what_the_process_at_the_other_end_does_decides_the_kind() {
    let fed = |o: WaitObject, server: u32| {
        let mut c = counters(10, 0.15, [0.0, 0.0, 0.83, 0.0, 0.02, 0.0], 0);
        c.other_read_bytes = 2_000_000;
        Job::new(10)
            .thread_of(100, 100, c, waiting(reason::POLL, 45), 45)
            .woken_after(100, (server, server, "featsrv"), 400, 8.1)
            .waiting_on(100, reason::POLL, o)
    };
    let unix = |p: Party| WaitObject::Socket { fd: 5, peer: None, others: vec![p] };
    let v = fed(unix(busy_party(700, "featsrv", 11.8, 0)), 700).judge(&[]);
    assert_eq!(v.kind, Kind::InputCpuBound, "{v:?}");
    assert!(
        v.summary.contains("reading a socket to pid 700 (featsrv) (2.0 MB at 0.2 MB/s)"),
        "{}",
        v.summary
    );
    assert!(
        v.summary.contains("pid 700 (featsrv) at its other end was on CPU 98% of its last 12.0s"),
        "{}",
        v.summary
    );
    let peer = &v.path[1];
    assert_eq!((peer.who, peer.pids.as_slice(), peer.state), ("peer", &[700][..], "on-cpu"), "{:?}", v.path);
    assert!((peer.share.unwrap() - 0.983).abs() < 0.01, "{peer:?}");

    let v = fed(unix(busy_party(700, "featsrv", 1.2, 96_000_000)), 700).judge(&[]);
    assert_eq!(v.kind, Kind::InputIoBound, "{v:?}");
    assert!(v.summary.contains("read 96.0 MB from storage in its last 12.0s (8.0 MB/s)"), "{}", v.summary);
    assert_eq!(v.path[1].state, "io", "{:?}", v.path);

    // An answer too small to be data still counts where the server works.
    let fifo = |p: Party| WaitObject::Pipe { fd: 3, writing: false, others: vec![p] };
    let v = fed(fifo(busy_party(710, "decode", 12.0, 0)), 710).judge(&[]);
    assert_eq!(v.kind, Kind::InputCpuBound, "{v:?}");
    let v = fed(fifo(busy_party(710, "decode", 0.1, 0)), 710).judge(&[]);
    assert_eq!(v.kind, Kind::InputWaitBound, "{v:?}");
    assert!(v.summary.contains("on CPU 1% of its last 12.0s, reading nothing from storage"), "{}", v.summary);
    // Idle on this host behind a socket: its pace, not the network's.
    let v = fed(unix(busy_party(700, "featsrv", 0.1, 0)), 700).judge(&[]);
    assert_eq!(v.kind, Kind::InputWaitBound, "{v:?}");
    assert!(v.summary.contains("it sends at its own pace"), "{}", v.summary);
    // Not sampled yet: the transport's kind.
    let v = fed(unix(party(700, "featsrv")), 700).judge(&[]);
    assert_eq!(v.kind, Kind::InputIoBound, "{v:?}");
    // A Unix socket whose other end nobody outside the job holds is no
    // input from outside.
    let v = fed(WaitObject::Socket { fd: 5, peer: None, others: vec![] }, 700).judge(&[]);
    assert!(!matches!(v.kind, Kind::InputCpuBound | Kind::InputIoBound), "{v:?}");
}

/// A lock another program holds, before the job has been silent long
/// enough to hang: nothing else at work, but the lock and its holder are
/// named; and so is a child that sleeps, where no rule fits.
#[test]
fn idle_and_unknown_still_name_what_the_main_thread_waits_on() {
    let c = counters(5, 0.01, [0.0, 0.0, 0.01, 0.0, 0.0, 0.98], 0);
    let lock = WaitObject::Lock { path: "/tmp/build.lock".into(), holders: vec![party(459, "python3")] };
    let v = Job::new(5)
        .thread_of(100, 100, c, waiting(reason::OTHER, 72), 72)
        .waiting_on(100, reason::OTHER, lock)
        .printed(1024)
        .judge(&[]);
    assert_eq!(v.kind, Kind::Idle, "{v:?}");
    assert!(
        v.summary.contains(", waiting on the lock on /tmp/build.lock, held by pid 459 (python3)"),
        "{}",
        v.summary
    );
    let c = counters(5, 0.1, [0.0, 0.0, 0.01, 0.0, 0.0, 0.88], 0);
    let child = WaitObject::Child { children: vec![party(796, "python3")] };
    let v = Job::new(5)
        .thread_of(100, 100, c, waiting(reason::OTHER, 61), 61)
        .waiting_on(100, reason::OTHER, child)
        .printed(1024)
        .judge(&[]);
    assert_eq!(v.kind, Kind::Unknown, "{v:?}");
    assert!(v.summary.contains("(other (wait4) 89%), waiting on child pid 796 (python3)"), "{}", v.summary);
}
