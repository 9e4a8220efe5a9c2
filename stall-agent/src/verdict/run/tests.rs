//! Runs of several ranks on synthetic streams: a launcher, its ranks and
//! their DataLoader workers, through Model → Window → roles → judge.
use std::collections::HashSet;

use stall_common::{fd_kind, reason};

use super::super::judge;
use super::*;
use crate::{
    aggregate::Model,
    correlate::{self, Role},
    decode::{
        CommSnap, Event, FileCounters, FileSnap, GpuCounters, Snapshot, ThreadCounters, ThreadNow,
        ThreadSnap, WakeSnap,
    },
    gpu::gpu_window,
    rank::Rank,
    wait::WaitObject,
};
use ::syscalls::Sysno;

const S: u64 = 1_000_000_000;
const SECS: u64 = 10;
const LAUNCHER: u32 = 10;

/// (on, [futex, io, poll, sleep, runqueue, other, write, sync]) as shares of
/// the window, the trailing ones zero where left out.
fn counters<const N: usize>(on: f64, off: [f64; N], bytes: u64) -> ThreadCounters {
    crate::verdict::tests::counters(SECS, on, off, bytes)
}

fn rank(r: u32) -> Rank {
    Rank::from_env([
        ("RANK", &*r.to_string()),
        ("WORLD_SIZE", "4"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
    ])
    .expect("a rank")
}

const BLOCKED: ThreadNow = ThreadNow { running: false, reason: reason::FUTEX, syscall: 202, for_ns: 1 };
//                              futex io    poll  sleep runq other
const IO_WORKER: [f64; 6] = [0.0, 0.85, 0.0, 0.0, 0.02, 0.0];
const IDLE_WORKER: [f64; 6] = [0.95, 0.0, 0.0, 0.0, 0.0, 0.0];
const FED_TRAINER: [f64; 6] = [0.3, 0.0, 0.6, 0.0, 0.0, 0.0];
const PEER_WAIT: [f64; 6] = [0.7, 0.0, 0.05, 0.0, 0.0, 0.0];

#[derive(Default)]
struct Run {
    model: Model,
    threads: Vec<ThreadSnap>,
    files: Vec<FileSnap>,
    wakes: Vec<WakeSnap>,
    gpu_calls: Vec<(u32, GpuCounters)>,
    communicators: Vec<CommSnap>,
}

impl Run {
    fn new() -> Self {
        let mut model = Model::new(0);
        model.note_process(
            LAUNCHER,
            Some(1),
            "torchrun",
            Some("torchrun --nproc-per-node 4 train.py".into()),
        );
        let mut run = Run { model, ..Default::default() };
        run.thread(LAUNCHER, LAUNCHER, counters(0.0, [0.0, 0.0, 0.0, 0.0, 0.0, 1.0], 0));
        run
    }

    fn thread(&mut self, tid: u32, tgid: u32, c: ThreadCounters) {
        self.threads.push(ThreadSnap { tid, tgid, job: 1, counters: c, now: BLOCKED, other_nr: -1 });
    }

    /// Rank `r` at pid `r*100+100`: its trainer, and two workers reading
    /// `bytes` each; `slow`: its workers wait on storage and it waits on
    /// them, else it waits on its peers while its workers idle.
    fn rank(mut self, r: u32, slow: bool) -> Self {
        let pid = 100 + r * 100;
        self.model.note_process(pid, Some(LAUNCHER), "python", Some("python train.py".into()));
        self.model.note_rank(pid, Some(rank(r)));
        self.thread(pid, pid, counters(0.05, if slow { FED_TRAINER } else { PEER_WAIT }, 0));
        for w in [pid + 1, pid + 2] {
            self.model.note_process(w, Some(pid), "pt_data_worker", Some("python train.py".into()));
            self.model.note_rank(w, Some(rank(r)));
            let bytes = if slow { 300_000_000 } else { 20_000_000 };
            self.model.apply(&Event::Open {
                ts: 0,
                tid: w,
                tgid: w,
                fd: 5,
                file_id: u64::from(w),
                path: format!("/data/shard_{w}.pt"),
                dfd: -100,
                dup_of: None,
            });
            self.files.push(FileSnap {
                tgid: w,
                fd: 5,
                file_id: u64::from(w),
                kind: fd_kind::REGULAR,
                counters: FileCounters {
                    read_bytes: bytes,
                    read_calls: bytes / 65536,
                    read_ns: 1,
                    timed_calls: 1,
                    ..Default::default()
                },
            });
            self.thread(w, w, counters(0.05, if slow { IO_WORKER } else { IDLE_WORKER }, bytes));
            self.wakes.push(WakeSnap {
                wakee: pid,
                waker: w,
                waker_tgid: w,
                waker_comm: "pt_data_worker".into(),
                count: 200,
                blocked_ns: 0,
            });
        }
        self
    }

    /// Rank `r` blocked for good: its trainer and its workers wait, nobody
    /// reads or wakes anyone.
    fn hung_rank(mut self, r: u32) -> Self {
        let pid = 100 + r * 100;
        self.model.note_process(pid, Some(LAUNCHER), "python", Some("python train.py".into()));
        self.model.note_rank(pid, Some(rank(r)));
        self.thread(pid, pid, counters(0.0, [1.0, 0.0, 0.0, 0.0, 0.0, 0.0], 0));
        for w in [pid + 1, pid + 2] {
            self.model.note_process(w, Some(pid), "pt_data_worker", Some("python train.py".into()));
            self.model.note_rank(w, Some(rank(r)));
            self.thread(w, w, counters(0.0, [1.0, 0.0, 0.0, 0.0, 0.0, 0.0], 0));
        }
        self
    }

    fn judged(self) -> (Verdict, correlate::Roles) {
        self.judged_with(&[])
    }

    fn window(&mut self) -> crate::aggregate::Window {
        let end = SECS * S;
        self.model.apply_snapshot(&Snapshot {
            ts: end,
            threads: self.threads.clone(),
            files: self.files.clone(),
            wakes: self.wakes.clone(),
            gpu_calls: self.gpu_calls.clone(),
            communicators: self.communicators.clone(),
            ..Default::default()
        });
        self.model.summary(end)
    }

    fn judged_with(mut self, gpus: &[GpuWindow]) -> (Verdict, correlate::Roles) {
        let w = self.window();
        let on_gpu: HashSet<u32> = gpus.iter().flat_map(|g| g.pids.iter().copied()).collect();
        let roles = correlate::assign(&w, &on_gpu, Some(LAUNCHER));
        (judge(&w, &roles, gpus, &Default::default()), roles)
    }
}

#[test]
fn the_launcher_is_no_trainer_and_workers_belong_to_their_rank() {
    let (_, roles) = Run::new().rank(0, false).rank(1, false).rank(2, true).rank(3, false).judged();
    assert_eq!(roles.ranks, vec![(0, 100), (1, 200), (2, 300), (3, 400)]);
    assert_eq!(roles.trainers, vec![100, 200, 300, 400]);
    assert_eq!(roles.of(LAUNCHER), Role::Other);
    for r in 0..4 {
        let pid = 100 + r * 100;
        assert_eq!(roles.of(pid + 1), Role::Worker);
        assert_eq!(
            (roles.rank_of(pid), roles.rank_of(pid + 1), roles.rank_of(pid + 2)),
            (Some(r), Some(r), Some(r))
        );
        assert_eq!(roles.of_rank(r).workers, vec![pid + 1, pid + 2]);
    }
    assert_eq!(roles.rank_of(LAUNCHER), None);
    assert_eq!(roles.run_id.as_deref(), Some("127.0.0.1:29500"));
}

#[test]
fn the_rank_others_wait_for_is_named() {
    let (v, _) = Run::new().rank(0, false).rank(1, false).rank(2, true).rank(3, false).judged();
    assert_eq!(v.kind, Kind::InputIoBound, "{v:?}");
    let run = v.run.as_ref().expect("a run");
    let s = run.straggler.as_ref().expect("a straggler");
    assert_eq!((s.rank, s.pid, s.kind), (2, 300, Kind::InputIoBound));
    assert_eq!(s.waiting_ranks, vec![0, 1, 3]);
    // Blocked 0.75 of a window it was accounted for 0.8 of.
    assert!((s.peer_wait - 0.9375).abs() < 0.01, "{}", s.peer_wait);
    assert!(v.summary.starts_with("rank 2 (pid 300) holds the run: input-io-bound — "), "{}", v.summary);
    assert!(v.summary.contains("2 workers read 600 MB at 60.0 MB/s"), "{}", v.summary);
    assert!(v.summary.contains("ranks 0, 1, 3 wait for it 94% of the time"), "{}", v.summary);
    assert!(v.summary.shown().ends_with("(no GPU data: host-side verdict)"), "{}", v.summary);
    assert_eq!(run.ranks.len(), 4);
    assert!(run.ranks.iter().filter(|r| r.rank != 2).all(|r| r.kind == Kind::Unknown && r.peer_wait > 0.9));
    assert!(v.evidence[0].starts_with("rank 0 (pid 100): unknown"), "{:?}", v.evidence);
    // Python stacks: the straggler's trainer and workers.
    assert!(v.blamed.iter().any(|b| b.pid == 300 && b.what == "trainer main thread"), "{:?}", v.blamed);
    assert!(v.blamed.iter().all(|b| [300, 301, 302].contains(&b.pid)), "{:?}", v.blamed);
    let json = serde_json::to_value(&v).unwrap();
    assert_eq!(json["straggler"]["rank"], 2);
    assert_eq!(json["ranks"][1]["kind"], Kind::Unknown.as_str());
}

#[test]
fn a_rank_blocked_saving_a_checkpoint_holds_the_run() {
    let mut run = Run::new().rank(0, false).rank(1, false).rank(2, false).rank(3, false);
    // Rank 1's trainer spends the window writing and syncing its checkpoint.
    let t = run.threads.iter_mut().find(|t| t.tid == 200).unwrap();
    t.counters = counters(0.05, [0.02, 0.0, 0.02, 0.0, 0.0, 0.0, 0.3, 0.6], 0);
    let (v, _) = run.judged();
    let s = v.run.as_ref().and_then(|r| r.straggler.as_ref()).expect("a straggler");
    assert_eq!((s.rank, s.pid, s.kind), (1, 200, Kind::OutputIoBound), "{v:?}");
    assert_eq!(s.waiting_ranks, vec![0, 2, 3]);
    assert!(v.summary.starts_with("rank 1 (pid 200) holds the run: output-io-bound — "), "{}", v.summary);
}

/// A crowded host: the waiting ranks' trainers wait for a CPU 30 % of the
/// window, so they are blocked in their collective thread's waits only
/// 45 % of it, but 64 % of the time they could act: they still wait for
/// the slow rank.
#[test]
fn ranks_crowded_off_the_cpus_still_wait_for_the_slow_rank() {
    let mut run = Run::new().rank(0, false).rank(1, false).rank(2, true).rank(3, false);
    for pid in [100, 200, 400] {
        let t = run.threads.iter_mut().find(|t| t.tid == pid).unwrap();
        t.counters = counters(0.2, [0.45, 0.0, 0.0, 0.0, 0.3, 0.0], 0);
        run.thread(pid + 5, pid, counters(0.02, [0.0, 0.0, 0.95], 0));
        let woke = |wakee, waker, waker_tgid| WakeSnap {
            wakee,
            waker,
            waker_tgid,
            waker_comm: "pt_gloo_runloop".into(),
            count: 300,
            blocked_ns: 4 * S,
        };
        run.wakes.push(woke(pid, pid + 5, pid));
        run.wakes.push(woke(pid + 5, 0, 0));
    }
    let (v, _) = run.judged();
    let s = v.run.as_ref().and_then(|r| r.straggler.as_ref()).expect("a straggler");
    assert_eq!((s.rank, s.waiting_ranks.as_slice()), (2, &[0, 1, 3][..]), "{v:?}");
}

#[test]
fn ranks_that_keep_pace_name_no_straggler() {
    let (v, _) = Run::new().rank(0, true).rank(1, true).rank(2, true).rank(3, true).judged();
    assert_eq!(v.kind, Kind::InputIoBound, "{v:?}");
    assert_eq!(v.run.as_ref().unwrap().straggler, None);
    assert!(v.summary.starts_with("4 of 4 ranks input-io-bound; rank 0 (pid 100): "), "{}", v.summary);
    let json = serde_json::to_value(&v).unwrap();
    assert!(json["straggler"].is_null() && json["ranks"].as_array().unwrap().len() == 4);
}

#[test]
fn one_rank_is_judged_as_one_trainer_without_the_launcher() {
    let (v, roles) = Run::new().rank(0, true).judged();
    assert_eq!(roles.trainers, vec![100]);
    assert_eq!(roles.of(LAUNCHER), Role::Other);
    assert_eq!(v.kind, Kind::InputIoBound, "{v:?}");
    assert!(v.run.is_none());
    assert!(serde_json::to_value(&v).unwrap().get("straggler").is_none());
}

#[test]
fn each_rank_is_judged_with_its_own_gpu() {
    // One GPU per rank, all idle while rank 2's workers fall behind.
    let gpus: Vec<GpuWindow> = (0..4u32)
        .map(|r| {
            let samples: Vec<(u64, f64)> = (0..SECS * 10).map(|i| (i * S / 10, 1.0)).collect();
            GpuWindow { pids: vec![100 + r * 100], ..gpu_window(r, "NVIDIA H200", &samples, 0, SECS * S) }
        })
        .collect();
    let (v, _) = Run::new().rank(0, false).rank(1, false).rank(2, true).rank(3, false).judged_with(&gpus);
    let s = v.run.as_ref().unwrap().straggler.as_ref().expect("a straggler");
    assert_eq!((s.rank, s.kind), (2, Kind::InputIoBound), "{v:?}");
    assert!(!v.host_only);
    // The GPUs' line once, before the run's line; none in the ranks' own.
    assert!(v.summary.starts_with("GPU0 idle 100% of 10.0s, GPU1 idle 100%"), "{}", v.summary);
    assert!(
        v.summary.contains(". rank 2 (pid 300) holds the run: input-io-bound — Trainer main thread"),
        "{}",
        v.summary
    );
    assert_eq!(v.summary.shown().matches("GPU2 idle").count(), 1, "{}", v.summary);
    assert!(v
        .run
        .as_ref()
        .unwrap()
        .ranks
        .iter()
        .all(|r| !r.summary.contains("GPU") && !r.summary.contains("host-side")));
}

fn stack(pid: u32, functions: &[&str]) -> crate::pystack::PyStack {
    let frames = functions
        .iter()
        .map(|f| crate::pystack::PyFrame {
            function: f.to_string(),
            file: "train.py".into(),
            line: 1,
            own: true,
        })
        .collect();
    crate::pystack::PyStack { pid, tid: pid, what: "rank trainer main thread".into(), frames }
}

/// Thread `pid`'s state now: blocked in syscall `nr` for `r`, waiting on
/// `on` (as /proc said).
fn blocked_on(w: &mut crate::aggregate::Window, pid: u32, r: u8, nr: Sysno, on: Option<WaitObject>) {
    let t = w
        .procs
        .iter_mut()
        .find(|p| p.tgid == pid)
        .unwrap()
        .threads
        .iter_mut()
        .find(|t| t.tid == pid)
        .unwrap();
    t.now = ThreadNow { running: false, reason: r, syscall: nr as i32, for_ns: 60 * S };
    t.waits_on = on.map(|o| (r, o)).into_iter().collect();
}

fn socket_to(peer: &str) -> Option<WaitObject> {
    Some(WaitObject::Socket { fd: 5, peer: Some(peer.into()), others: vec![] })
}

/// Every rank looks hung: what each trainer waits on tells the ranks
/// waiting for their peers from the one that never reached the
/// collective, whatever their functions are called. A star through rank
/// 0: ranks 1 and 3 wait on rank 0's socket, rank 0 on rank 2's, and
/// rank 2 on a lock of its own.
#[test]
fn a_hung_rank_outside_the_collective_is_named_by_what_the_ranks_wait_on() {
    let mut run = Run::new().hung_rank(0).hung_rank(1).hung_rank(2).hung_rank(3);
    let mut w = run.window();
    let roles = correlate::assign(&w, &HashSet::new(), Some(LAUNCHER));
    let progress = Default::default();
    let v = judge(&w, &roles, &[], &progress);
    // Every rank looks hung, and nothing tells which: no straggler.
    assert_eq!(v.kind, Kind::Hang, "{v:?}");
    assert!(v.run.as_ref().unwrap().straggler.is_none());
    // The sockets' other ends: rank 0 listens at :29500, rank 2's end of its
    // connection is :41000.
    let holder = |_: u32, peer: &str| match peer {
        "127.0.0.1:29500" => Some(100),
        "127.0.0.1:41000" => Some(300),
        _ => None,
    };
    assert_eq!(super::collective_waits(&v, &w, holder), None, "nothing known of the waits yet");
    let lock = WaitObject::Lock { path: "/tmp/rank2.lock".into(), holders: Vec::new() };
    for (pid, r, nr, on) in [
        (100, reason::POLL, Sysno::recvfrom, socket_to("127.0.0.1:41000")),
        (200, reason::POLL, Sysno::recvfrom, socket_to("127.0.0.1:29500")),
        (300, reason::OTHER, Sysno::flock, Some(lock)),
        (400, reason::POLL, Sysno::recvfrom, socket_to("127.0.0.1:29500")),
    ] {
        blocked_on(&mut w, pid, r, nr, on);
    }
    let inside = super::collective_waits(&v, &w, holder).expect("the waits tell the ranks apart");
    assert_eq!(
        [100, 200, 300, 400].map(|p| inside.get(&p).copied()),
        [Some(true), Some(true), Some(false), Some(true)]
    );
    let placed = crate::verdict::judge_placed(&w, &roles, &[], &progress, &inside);
    let s = placed.run.as_ref().unwrap().straggler.as_ref().expect("rank 2 named");
    assert_eq!((s.rank, s.pid, s.kind), (2, 300, Kind::Hang));
    assert_eq!(s.waiting_ranks, vec![0, 1, 3]);
    assert!(placed.summary.starts_with("rank 2 (pid 300) holds the run: hang — "), "{}", placed.summary);
    // Rank 2 in a futex, its stack not read: the ranks' waits end at it.
    blocked_on(&mut w, 300, reason::FUTEX, Sysno::futex, None);
    let inside = super::collective_waits(&v, &w, holder).expect("where the waits end");
    assert_eq!(inside.get(&300), Some(&false));
    // A wait kept from an earlier look no longer holds once the thread is
    // in another call: rank 1 now sleeps, which is no wait on a peer.
    blocked_on(&mut w, 200, reason::SLEEP, Sysno::clock_nanosleep, socket_to("127.0.0.1:29500"));
    w.procs.iter_mut().find(|p| p.tgid == 200).unwrap().threads[0].waits_on =
        vec![(reason::POLL, socket_to("127.0.0.1:29500").unwrap())];
    let inside = super::collective_waits(&v, &w, holder).unwrap();
    assert_eq!(inside.get(&200), Some(&false));
    // A socket to a process of the job that is no rank, or to itself, is
    // no wait on a peer; to an address off this node, it is.
    blocked_on(&mut w, 400, reason::POLL, Sysno::recvfrom, socket_to("127.0.0.1:41001"));
    let own = |_: u32, peer: &str| (peer == "127.0.0.1:41001").then_some(401);
    assert_eq!(super::collective_waits(&v, &w, own).unwrap().get(&400), Some(&false));
    blocked_on(&mut w, 400, reason::POLL, Sysno::recvfrom, socket_to("10.0.0.7:29500"));
    assert_eq!(super::collective_waits(&v, &w, holder).unwrap().get(&400), Some(&true));
}

/// A wait with no object to follow (a futex: the collective runs on
/// another thread of the trainer) is left to the Python stacks.
#[test]
fn a_futex_wait_is_placed_by_the_stack() {
    let mut run = Run::new().hung_rank(0).hung_rank(1).hung_rank(2).hung_rank(3);
    let mut w = run.window();
    let roles = correlate::assign(&w, &HashSet::new(), Some(LAUNCHER));
    let mut v = judge(&w, &roles, &[], &Default::default());
    for pid in [100, 200, 300, 400] {
        assert!(v.blamed.iter().any(|b| b.pid == pid && b.tid == pid), "{pid}: {:?}", v.blamed);
        blocked_on(&mut w, pid, reason::FUTEX, Sysno::futex, None);
    }
    let none = |_: u32, _: &str| None;
    assert_eq!(super::collective_waits(&v, &w, none), None, "no stacks read yet");
    v.python_stacks = vec![
        stack(100, &["recv_exact", "all_reduce", "main"]),
        stack(200, &["ProcessGroupGloo.wait", "all_reduce", "main"]),
        stack(300, &["Event.wait", "stuck", "main"]),
        stack(400, &["barrier", "main"]),
    ];
    let inside = super::collective_waits(&v, &w, none).expect("the stacks tell the ranks apart");
    assert_eq!(inside.get(&300), Some(&false));
    assert_eq!(inside.get(&100), Some(&true));
    // All inside, or none: nothing to tell apart.
    v.python_stacks.retain(|st| st.pid != 300);
    assert_eq!(super::collective_waits(&v, &w, none), None);
}

/// `n` collectives, each waited `wait_ms` to the synchronization after it.
fn collective_calls(n: u64, wait_ms: u64) -> GpuCounters {
    GpuCounters {
        collectives: n,
        collective_waits: n,
        collective_wait_ns: n * wait_ms * 1_000_000,
        collective_waited_ns: n * wait_ms * 1_000_000,
        sync_calls: n,
        sync_ns: n * wait_ms * 1_000_000,
        ..Default::default()
    }
}

/// NCCL ranks: each trainer made `n` all-reduces, one every 300 ms, rank
/// `late` `late_ms` after the others, and waited from each to the
/// synchronization after it (the late rank barely). `known`: the
/// communicators were seen made, so the arrivals can be compared.
fn nccl_run(late: u32, late_ms: u64, known: bool) -> Run {
    let mut run = Run::new();
    let n: u64 = 20;
    for r in 0..4 {
        run = run.rank(r, false);
        let pid = 100 + r * 100;
        let lateness = if r == late { late_ms } else { 0 };
        let wait_ms = if r == late { 5 } else { 5 + late_ms };
        run.gpu_calls.push((pid, collective_calls(n, wait_ms)));
        let ring: Vec<u64> = (0..128u64)
            .map(|slot| if slot < n { (1000 + slot * 300 + lateness + u64::from(r)) * 1_000_000 } else { 0 })
            .collect();
        run.communicators.push(CommSnap {
            tgid: pid,
            comm: 0xc0de,
            id: known.then_some(42),
            nranks: Some(4),
            rank: Some(r),
            tid: pid,
            collectives: n,
            p2p: 0,
            ring,
        });
    }
    run
}

#[test]
fn the_rank_calling_the_collectives_last_is_named_by_its_lateness() {
    let (v, _) = nccl_run(2, 200, true).judged();
    let s = v.run.as_ref().and_then(|r| r.straggler.as_ref()).expect("a straggler");
    assert_eq!((s.rank, s.pid, &s.waiting_ranks[..]), (2, 300, &[0, 1, 3][..]), "{}", v.summary);
    let late = s.late_s.expect("named by its arrivals");
    assert!((late - 0.2).abs() < 0.005, "{late}");
    assert!(v.summary.contains("last at 20 of 20 NCCL collectives compared, 202 ms after"), "{}", v.summary);
    // The others' waits are put on it: 20 × 205 ms of 10 s.
    assert!((s.peer_wait - 0.41).abs() < 0.01, "{}", s.peer_wait);
    let r0 = &v.run.as_ref().unwrap().ranks[0];
    assert_eq!(r0.collectives.map(|c| (c.calls, c.compared, c.last)), Some((20, 20, 0)));
}

#[test]
fn without_the_communicators_identity_the_waits_name_the_late_rank() {
    let (v, _) = nccl_run(1, 200, false).judged();
    let s = v.run.as_ref().and_then(|r| r.straggler.as_ref()).expect("a straggler");
    assert_eq!(s.rank, 1, "{}", v.summary);
    assert!((s.late_s.unwrap() - 0.2).abs() < 0.001);
    assert!(
        v.summary.contains("it waits 5 ms per NCCL collective where the others wait 200 ms more"),
        "{}",
        v.summary
    );
}

#[test]
fn ranks_at_the_collectives_together_name_no_late_rank() {
    let (v, _) = nccl_run(2, 0, true).judged();
    assert!(v.run.as_ref().is_some_and(|r| r.straggler.is_none()), "{}", v.summary);
}

#[test]
fn a_window_ending_inside_the_waits_keeps_their_mean() {
    let mut run = nccl_run(1, 200, false);
    // Each rank but the late one is 150 ms into its next wait when the
    // window ends: time waited, not a longer wait of those that ended.
    for (pid, g) in &mut run.gpu_calls {
        if *pid != 200 {
            g.collective_wait_ns += 150_000_000;
        }
    }
    let (v, _) = run.judged();
    let s = v.run.as_ref().and_then(|r| r.straggler.as_ref()).expect("a straggler");
    assert_eq!(s.rank, 1, "{}", v.summary);
    assert!((s.late_s.unwrap() - 0.2).abs() < 0.001, "{:?}", s.late_s);
    let r0 = &v.run.as_ref().unwrap().ranks[0];
    assert!(r0.collectives.is_some_and(|c| (c.wait_s - 0.205).abs() < 0.001), "{:?}", r0.collectives);
}

/// Four trainers that call the same collectives, none named a rank (no
/// variable, no spawn index) and no communicator seen made (stall attached
/// after): the pid at `late` calls each all-reduce `late_ms` after the
/// others, so waits least from each to the synchronization after it.
fn unnamed_nccl_run(late: u32, late_ms: u64) -> Run {
    let mut run = Run::new();
    let n: u64 = 20;
    for pid in [100, 200, 300, 400] {
        run.model.note_process(pid, Some(LAUNCHER), "python", Some("python rank.py".into()));
        run.thread(pid, pid, counters(0.05, PEER_WAIT, 0));
        let wait_ms = if pid == late { 5 } else { 5 + late_ms };
        run.gpu_calls.push((pid, collective_calls(n, wait_ms)));
    }
    run
}

#[test]
fn trainers_at_the_same_collectives_are_ranks_even_unnumbered() {
    let (v, roles) = unnamed_nccl_run(200, 200).judged();
    assert!(roles.unnumbered);
    assert_eq!(roles.ranks, [(100, 100), (200, 200), (300, 300), (400, 400)]);
    assert_eq!(roles.of(LAUNCHER), Role::Other);
    assert_eq!(roles.rank_number(200), None);
    let s = v.run.as_ref().and_then(|r| r.straggler.as_ref()).expect("a straggler");
    assert_eq!((s.pid, s.number, &s.waiting_pids[..]), (200, None, &[100, 300, 400][..]), "{}", v.summary);
    assert!((s.late_s.unwrap() - 0.2).abs() < 0.001);
    let line = v.summary.to_string();
    assert!(line.starts_with("the rank in pid 200 calls the collectives late"), "{line}");
    assert!(line.contains("; the ranks in pids 100, 300, 400 wait for it"), "{line}");
    // No number is made up for the JSON either.
    let json = serde_json::to_value(&v.run).unwrap();
    assert_eq!(json["straggler"]["rank"], serde_json::Value::Null, "{json}");
    assert_eq!(json["straggler"]["waiting_ranks"], serde_json::json!([]), "{json}");
    assert!(json["ranks"].as_array().unwrap().iter().all(|r| r["rank"].is_null()), "{json}");
}

#[test]
fn one_trainer_at_its_collectives_is_no_run() {
    let mut run = unnamed_nccl_run(200, 200);
    run.gpu_calls.retain(|(pid, _)| *pid == 100);
    let (v, roles) = run.judged();
    assert!(!roles.unnumbered && roles.ranks.is_empty(), "{:?}", roles.ranks);
    assert!(v.run.is_none(), "{}", v.summary);
}
