//! Jobs of shapes beyond "a trainer and its worker processes", judged by
//! following what the trainer waits on and who ends its waits: loader
//! threads, a thread holding the GIL, sleeping workers, output into a slow
//! pipe or socket, a lock held by another program, a child it waits for.
//! The numbers are what such workloads did (tests/workloads/waits.py).
use super::*;
use crate::wait::{Party, WaitObject};

fn party(pid: u32, comm: &str) -> Party {
    Party { pid, comm: comm.into() }
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
    assert_eq!(v.path[0].object.as_deref(), Some("stdout, a pipe read by pid 812 (fluent-bit)"));
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
    let peer = WaitObject::Socket { fd: 7, peer: Some("10.0.0.5:9000".into()) };
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

/// An evaluation run as a subprocess: the trainer waits in `wait4`, the
/// child is on CPU.
#[test]
fn a_child_on_cpu_that_the_trainer_waits_for_is_named() {
    let mut job = Job::new(10);
    job.model.note_process(300, Some(100), "python3", Some("python3 eval.py --split val".into()));
    let c = counters(10, 0.01, [0.0, 0.0, 0.0, 0.0, 0.0, 0.98], 0);
    let child = counters(10, 0.95, [0.0, 0.02, 0.0, 0.0, 0.02, 0.0], 1_000_000);
    let v = job
        .thread_of(100, 100, c, waiting(reason::OTHER, 61), 61)
        .thread_of(300, 300, child, RUNNING, -1)
        .judge(&[]);
    assert_eq!(v.kind, Kind::TrainerHostBound, "{v:?}");
    assert!(
        v.summary.contains("waiting for its child pid 300 (python3 eval.py --split val), on CPU 98%"),
        "{}",
        v.summary
    );
    assert!(v.blamed.iter().any(|b| b.tid == 300), "{:?}", v.blamed);
}
