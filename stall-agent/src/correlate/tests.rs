use super::*;
use crate::aggregate::{FileWindow, ProcWindow, ThreadWindow, Waker};
use crate::decode::ThreadCounters;

fn proc(tgid: u32, ppid: u32, on_ms: u64, read: u64) -> ProcWindow {
    ProcWindow {
        tgid,
        ppid: Some(ppid),
        comm: format!("p{tgid}"),
        alive: true,
        threads: vec![ThreadWindow {
            tid: tgid,
            delta: ThreadCounters { on_cpu_ns: on_ms * 1_000_000, ..Default::default() },
            ..Default::default()
        }],
        files: if read > 0 {
            vec![FileWindow {
                path: "/d".into(),
                resolved: None,
                opens: 1,
                read_calls: 1,
                read_bytes: read,
                read_ns: 1,
                timed_calls: 1,
                open_ns: 1,
                ..Default::default()
            }]
        } else {
            vec![]
        },
        ..Default::default()
    }
}

fn window(procs: Vec<ProcWindow>) -> Window {
    Window { start_ns: 0, end_ns: 10_000_000_000, procs, ..Default::default() }
}

#[test]
fn the_fed_process_is_the_trainer_without_gpu_data() {
    // bash (1) → python trainer (2) → workers 3, 4, 5; resource tracker 6 idle.
    let w = window(vec![
        proc(1, 0, 0, 0),
        proc(2, 1, 500, 0),
        proc(3, 2, 100, 1000),
        proc(4, 2, 100, 1000),
        proc(5, 2, 100, 1000),
        proc(6, 2, 0, 0),
    ]);
    let r = assign(&w, &HashSet::new(), Some(1));
    assert_eq!(r.trainers, vec![2]);
    assert_eq!(r.of(3), Role::Worker);
    assert_eq!(r.of(6), Role::Other);
    assert_eq!(r.of(1), Role::Other);
}

#[test]
fn the_busy_trainer_that_feeds_idle_workers_stays_the_trainer() {
    // Trainer computing (busy), handing indices to 2 forked workers that
    // are nearly idle: the trainer wakes them more than they wake it.
    let mut t = proc(2, 1, 900, 0);
    t.cmdline = Some("python train.py".into());
    let mut w1 = proc(3, 2, 5, 0);
    let mut w2 = proc(4, 2, 5, 0);
    for w in [&mut w1, &mut w2] {
        w.cmdline = Some("python train.py".into());
        w.threads[0].woken_by =
            vec![Waker { tid: 2, tgid: 2, comm: "python".into(), count: 50, blocked_ns: 0 }];
    }
    let mut tracker = proc(5, 2, 0, 0);
    tracker.cmdline = Some("python -c from multiprocessing.resource_tracker import main;main(8)".into());
    let w = window(vec![t, w1, w2, tracker]);
    let r = assign(&w, &HashSet::new(), Some(2));
    assert_eq!(r.trainers, vec![2]);
    assert_eq!((r.of(3), r.of(4), r.of(5)), (Role::Worker, Role::Worker, Role::Other));
}

#[test]
fn hung_forked_workers_are_workers() {
    let mut t = proc(2, 1, 0, 0);
    t.cmdline = Some("python train.py".into());
    let mut w1 = proc(3, 2, 0, 0);
    w1.cmdline = Some("python train.py".into());
    let w = window(vec![t, w1]);
    let r = assign(&w, &HashSet::new(), Some(2));
    assert_eq!((r.trainers.clone(), r.of(3)), (vec![2], Role::Worker));
}

#[test]
fn programs_run_at_import_are_not_workers() {
    // `import torch` runs ldconfig (reads ld.so.cache, busy for a moment,
    // ends); the DataLoader forks two workers that read shards.
    let mut t = proc(2, 1, 500, 0);
    t.cmdline = Some("python train.py".into());
    let mut ldconfig = proc(3, 2, 40, 60_000);
    ldconfig.cmdline = None; // gone before /proc was read
    (ldconfig.born_ns, ldconfig.exec_ns) = (10, 11);
    ldconfig.alive = false;
    let mut sh = proc(4, 2, 20, 0);
    sh.cmdline = Some("/bin/sh -c uname -p 2> /dev/null".into());
    let mut ws = Vec::new();
    for pid in [5, 6] {
        let mut w = proc(pid, 2, 100, 1_000_000);
        w.cmdline = Some("python train.py".into());
        ws.push(w);
    }
    // A spawned worker execs the interpreter anew: still a worker.
    let mut spawned = proc(7, 2, 100, 1_000_000);
    spawned.cmdline =
        Some("python -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5)".into());
    let w = window([vec![t, ldconfig, sh, spawned], ws].concat());
    let r = assign(&w, &HashSet::new(), Some(2));
    assert_eq!(r.trainers, vec![2]);
    assert_eq!((r.of(3), r.of(4)), (Role::Other, Role::Other));
    assert_eq!((r.of(5), r.of(6), r.of(7)), (Role::Worker, Role::Worker, Role::Worker));
    // A shim's helper, forked before the shim exec'd the interpreter,
    // and the subshell it forked in turn.
    let mut shim = w.clone();
    shim.procs[0].exec_ns = 50;
    shim.procs[2].born_ns = 20;
    shim.procs[2].cmdline = None;
    let mut sub = proc(8, 4, 30, 0);
    sub.born_ns = 25;
    shim.procs.push(sub);
    let r = assign(&shim, &HashSet::new(), Some(2));
    assert_eq!((r.of(4), r.of(8)), (Role::Other, Role::Other));
    // Its exit woke the trainer once: still not a worker.
    let mut exited = w.clone();
    exited.procs[0].threads[0].woken_by =
        vec![Waker { tid: 3, tgid: 3, comm: "ldconfig".into(), count: 1, blocked_ns: 0 }];
    assert_eq!(assign(&exited, &HashSet::new(), Some(2)).of(3), Role::Other);
    // A program that feeds the trainer is a worker, exec'd or not.
    let mut fed = w.clone();
    fed.procs[0].threads[0].woken_by =
        vec![Waker { tid: 3, tgid: 3, comm: "ldconfig".into(), count: 90, blocked_ns: 0 }];
    assert_eq!(assign(&fed, &HashSet::new(), Some(2)).of(3), Role::Worker);
}

#[test]
fn gpu_users_are_trainers() {
    let w = window(vec![proc(1, 0, 0, 0), proc(2, 1, 500, 0), proc(3, 2, 100, 1000)]);
    let r = assign(&w, &HashSet::from([1]), Some(1));
    assert_eq!(r.trainers, vec![1]);
    assert_eq!(r.of(3), Role::Worker);
}

#[test]
fn lone_process_is_its_own_trainer() {
    let w = window(vec![proc(7, 1, 900, 5000)]);
    let r = assign(&w, &HashSet::new(), None);
    assert_eq!(r.trainers, vec![7]);
    assert!(r.workers.is_empty());
}

const WAIT4: i32 = 61;
const RT_SIGSUSPEND: i32 = 130;

/// A process whose main thread spent `wait_ms` of the window in `nr` (a
/// wait for its child) and `on_ms` on CPU.
fn waiting(tgid: u32, ppid: u32, nr: i32, wait_ms: u64, on_ms: u64) -> ProcWindow {
    let mut p = proc(tgid, ppid, on_ms, 0);
    p.started_ns = started(tgid);
    p.threads[0].other_nr = nr;
    p.threads[0].delta.off_ns[usize::from(stall_common::reason::OTHER)] = wait_ms * 1_000_000;
    p
}

fn with_cmdline(mut p: ProcWindow, c: &str) -> ProcWindow {
    p.cmdline = Some(c.into());
    p
}

/// Start times in pid order, 20 ms apart, as a launch chain starts them.
fn started(tgid: u32) -> u64 {
    1_000_000_000 + u64::from(tgid) * 20_000_000
}

/// Every process started in pid order (a launch chain).
fn chained(mut procs: Vec<ProcWindow>) -> Window {
    for p in &mut procs {
        p.started_ns = started(p.tgid);
    }
    window(procs)
}

fn woken_by(p: &mut ProcWindow, by: u32, count: u64) {
    p.threads[0].woken_by.push(Waker { tid: by, tgid: by, comm: format!("p{by}"), count, blocked_ns: 0 });
}

#[test]
fn a_shims_exited_helpers_never_hold_the_trainers_role() {
    // pyenv: the shim (100) forks helpers (bash scripts that read and
    // fork subshells of their own, then exit) before it exec's the
    // interpreter; the interpreter runs a job with a busy helper thread
    // and no worker. The helpers have more busy children than anyone.
    let mut interp = with_cmdline(proc(100, 1, 3_000, 0), "python3 job.py");
    interp.exec_ns = 500;
    let mut procs = vec![interp];
    for h in 0..5u32 {
        let pid = 101 + h * 10;
        let mut helper = proc(pid, 100, 20, 4096);
        (helper.born_ns, helper.alive) = (100 + u64::from(h) * 50, false);
        procs.push(helper);
        for s in 1..=4 {
            let mut sub = proc(pid + s, pid, 5, 1024);
            (sub.born_ns, sub.alive) = (120 + u64::from(h) * 50, false);
            procs.push(sub);
        }
    }
    let w = window(procs);
    let r = assign(&w, &HashSet::new(), Some(100));
    assert_eq!(r.trainers, vec![100]);
    assert!(r.workers.is_empty(), "{:?}", r.workers);
    assert_eq!((r.of(101), r.of(102)), (Role::Other, Role::Other));
    // The same under `stall run`'s root before the shim is known to have
    // exec'd (no exec seen: attached late) still never takes an ended
    // helper while the interpreter lives.
    let mut late = w.clone();
    late.procs[0].exec_ns = 0;
    let r = assign(&late, &HashSet::new(), Some(100));
    assert_eq!(r.trainers, vec![100]);
}

#[test]
fn an_ended_process_never_holds_the_trainers_role_while_what_it_started_lives() {
    // A launcher script (10) that started three busy short programs and the
    // job (14), then ended; the job lives on with no worker.
    let mut launcher = proc(10, 1, 50, 0);
    launcher.alive = false;
    let mut procs = vec![launcher];
    for pid in 11..=13 {
        let mut p = proc(pid, 10, 30, 2048);
        p.alive = false;
        p.exec_ns = 5;
        procs.push(p);
    }
    procs.push(with_cmdline(proc(14, 10, 2_000, 0), "python3 job.py"));
    let r = assign(&window(procs), &HashSet::new(), Some(10));
    assert_eq!(r.trainers, vec![14]);
    assert_eq!(r.of(10), Role::Other);
}

#[test]
fn a_wrapper_that_only_waits_passes_its_role_down() {
    // bash run.sh (1) waits in wait4 for python (2), which has no worker:
    // the job is python, whatever the root.
    let shell = waiting(1, 0, WAIT4, 9_990, 2);
    let job = with_cmdline(proc(2, 1, 4_000, 0), "python3 job.py");
    let r = assign(&chained(vec![shell.clone(), job.clone()]), &HashSet::new(), Some(1));
    assert_eq!((r.trainers.clone(), r.of(1)), (vec![2], Role::Other));
    // `timeout` waits for SIGCHLD in rt_sigsuspend; a Python parent in
    // subprocess.call spent its start-up on CPU first; and two levels
    // (make → sh -c → python).
    let timeout = waiting(1, 0, RT_SIGSUSPEND, 9_990, 1);
    let r = assign(&chained(vec![timeout, job.clone()]), &HashSet::new(), Some(1));
    assert_eq!(r.trainers, vec![2]);
    // Its imports took 80 ms of CPU, and a second of a 10 s job on a slow
    // machine: then it started the job.
    let mut parent = waiting(1, 0, WAIT4, 8_900, 80);
    let mut late_job = job.clone();
    late_job.started_ns = parent.started_ns + 1_100_000_000;
    let r = assign(&window(vec![parent.clone(), late_job.clone()]), &HashSet::new(), Some(1));
    assert_eq!(r.trainers, vec![2]);
    // Had it used the CPU after the job started, it would be no wrapper.
    parent.threads[0].delta.on_cpu_ns = 1_500_000_000;
    let r = assign(&window(vec![parent, late_job]), &HashSet::new(), Some(1));
    assert_eq!(r.trainers, vec![1]);
    let make = waiting(5, 0, WAIT4, 9_990, 3);
    let mut sh = waiting(1, 5, WAIT4, 9_990, 1);
    sh.exec_ns = 3;
    let r = assign(&chained(vec![make, sh, job.clone()]), &HashSet::new(), Some(5));
    assert_eq!(r.trainers, vec![2]);
    assert_eq!((r.of(5), r.of(1)), (Role::Other, Role::Other));
    // With DataLoader workers below the job, the job is still the trainer.
    let workers: Vec<ProcWindow> =
        (3..=4).map(|pid| with_cmdline(proc(pid, 2, 300, 1 << 20), "python3 job.py")).collect();
    let r = assign(&chained([vec![shell, job], workers].concat()), &HashSet::new(), Some(1));
    assert_eq!((r.trainers.clone(), r.workers.clone()), (vec![2], vec![3, 4]));
}

#[test]
fn a_trainer_that_works_between_its_evaluations_is_no_wrapper() {
    // It spins 200 ms per evaluation of 1 s and waits for each in wait4
    // (80 % of its time): it stays the trainer, the evaluation is no
    // worker of the shell-less kind.
    let trainer = waiting(2, 1, WAIT4, 8_000, 2_000);
    let mut eval = with_cmdline(proc(3, 2, 1_000, 0), "python3 -c evaluate()");
    eval.started_ns = trainer.started_ns + 60_000_000_000;
    let r = assign(&window(vec![trainer.clone(), eval.clone()]), &HashSet::new(), Some(2));
    assert_eq!(r.trainers, vec![2]);
    // Even where it waits as long as a wrapper would: it did its steps
    // for a minute before it started the evaluation.
    let mut long_eval = trainer;
    long_eval.threads[0].delta.off_ns[usize::from(stall_common::reason::OTHER)] = 9_950_000_000;
    long_eval.threads[0].delta.on_cpu_ns = 50_000_000;
    let r = assign(&window(vec![long_eval.clone(), eval.clone()]), &HashSet::new(), Some(2));
    assert_eq!(r.trainers, vec![2]);
    // Where no start is known (attached to processes older than stall),
    // a process that waits is never taken for a wrapper.
    (long_eval.started_ns, eval.started_ns) = (0, 0);
    let r = assign(&window(vec![long_eval, eval]), &HashSet::new(), Some(2));
    assert_eq!(r.trainers, vec![2]);
}

#[test]
fn a_trainer_that_evaluates_from_its_first_steps_is_no_wrapper() {
    // Its first evaluation starts 300 ms in; it waits for its evaluations
    // 95 % of the time (a slow machine), and steps on CPU between them.
    let trainer = waiting(2, 1, WAIT4, 9_500, 700);
    let mut eval = with_cmdline(proc(3, 2, 1_000, 0), "python3 -c evaluate()");
    eval.started_ns = trainer.started_ns + 300_000_000;
    let r = assign(&window(vec![trainer, eval]), &HashSet::new(), Some(2));
    assert_eq!(r.trainers, vec![2]);
}

#[test]
fn a_trainer_waiting_for_its_uploads_that_logs_its_steps_is_no_wrapper() {
    // Its steps are short: it waits for its upload subprocess 97 % of the
    // time, the first started within a second; but it logs each step to a
    // file of its own between the uploads.
    let mut trainer = waiting(2, 1, WAIT4, 9_700, 60);
    trainer.threads[0].delta.file_write_bytes = 80;
    let mut upload = with_cmdline(proc(3, 2, 900, 0), "python3 put.py");
    upload.started_ns = trainer.started_ns + 300_000_000;
    upload.threads[0].delta.other_write_bytes = 16 << 20;
    let r = assign(&window(vec![trainer.clone(), upload.clone()]), &HashSet::new(), Some(2));
    assert_eq!(r.trainers, vec![2]);
    // A shell script whose stderr is a file writes it through stdio: still
    // a wrapper.
    let mut shell = waiting(1, 0, WAIT4, 9_990, 2);
    shell.threads[0].delta.file_write_bytes = 40;
    shell.threads[0].delta.stdio_write_bytes = 40;
    let job = with_cmdline(proc(2, 1, 4_000, 0), "python3 job.py");
    let r = assign(&chained(vec![shell, job]), &HashSet::new(), Some(1));
    assert_eq!(r.trainers, vec![2]);
}

#[test]
fn a_pipelines_consumer_is_the_trainer_and_its_producer_a_worker() {
    // sh -c "python3 gen.py | python3 train.py": the shell waits for both;
    // gen writes 40 MB into the pipe, train reads it and computes; each
    // wakes the other (a full pipe wakes its writer when read).
    let shell = waiting(1, 0, WAIT4, 9_990, 2);
    let mut gen = with_cmdline(proc(2, 1, 3_000, 1 << 20), "python3 gen.py");
    gen.exec_ns = 4;
    gen.threads[0].delta.other_write_bytes = 40 << 20;
    let mut train = with_cmdline(proc(3, 1, 6_000, 0), "python3 train.py");
    train.exec_ns = 4;
    train.threads[0].delta.other_read_bytes = 40 << 20;
    train.threads[0].delta.other_write_bytes = 2_000; // its log on stdout
    woken_by(&mut train, 2, 400);
    woken_by(&mut gen, 3, 300);
    let r = assign(&chained(vec![shell, gen, train]), &HashSet::new(), Some(1));
    assert_eq!(r.trainers, vec![3]);
    assert_eq!((r.of(2), r.of(1)), (Role::Worker, Role::Other));
}

#[test]
fn a_job_piped_into_a_quiet_reader_stays_the_trainer() {
    // python3 train.py | tee log: tee (3) reads what the trainer writes and
    // does nearly nothing itself.
    let shell = waiting(1, 0, WAIT4, 9_990, 2);
    let mut train = with_cmdline(proc(2, 1, 6_000, 0), "python3 train.py");
    train.threads[0].delta.other_write_bytes = 1 << 20;
    let mut tee = with_cmdline(proc(3, 1, 20, 0), "tee log");
    tee.threads[0].delta.other_read_bytes = 1 << 20;
    woken_by(&mut tee, 2, 500);
    let r = assign(&chained(vec![shell, train, tee]), &HashSet::new(), Some(1));
    assert_eq!(r.trainers, vec![2]);
}

#[test]
fn a_process_calling_the_gpu_libraries_is_the_trainer() {
    // A launcher (1) waits for its job (2), which forked a busy helper (3)
    // but launches kernels itself.
    let launcher = waiting(1, 0, WAIT4, 9_990, 2);
    let mut job = with_cmdline(proc(2, 1, 4_000, 0), "python3 job.py");
    job.threads[0].delta.gpu.launches = 1_000;
    let helper = with_cmdline(proc(3, 2, 9_000, 0), "python3 job.py");
    let r = assign(&chained(vec![launcher, job, helper]), &HashSet::new(), Some(1));
    assert_eq!(r.trainers, vec![2]);
}

#[test]
fn a_role_change_says_what_became_of_the_former_trainer_and_why_the_new_one() {
    // The first tick took the shell (1) for the trainer, before its job
    // (2) had run; now the shell only waits for it.
    let shell = with_cmdline(waiting(1, 0, WAIT4, 9_990, 2), "bash run.sh");
    let job = with_cmdline(proc(2, 1, 4_000, 0), "python3 job.py");
    let w = chained(vec![shell, job]);
    let r = assign(&w, &HashSet::new(), Some(1));
    assert_eq!((r.trainers.clone(), r.rule), (vec![2], TrainerRule::Root));
    let c = change(&[1], &r, &w, 1.5).expect("a change");
    assert_eq!((c.from.as_slice(), c.to.as_slice(), c.at_s), (&[1][..], &[2][..], 1.5));
    assert_eq!(
        c.says,
        "pid 1 (p1) only waits for its child; the trainer now: pid 2 (p2), which is what stall was pointed at, \
         past the wrappers that only wait"
    );
    // The same trainers, or none before: no change.
    assert_eq!(change(&[2], &r, &w, 2.0), None);
    assert_eq!(change(&[], &r, &w, 0.5), None);
    // A former trainer that ended.
    let mut ended = w.clone();
    ended.procs[0].alive = false;
    let c = change(&[1], &r, &ended, 3.0).expect("a change");
    assert!(c.says.starts_with("pid 1 (p1) ended; the trainer now: pid 2 (p2)"), "{}", c.says);
}
