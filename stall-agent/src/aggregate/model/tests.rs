//! The model on synthetic streams: events and snapshots in, windows out.
use stall_common::WAKER_ANY_THREAD;

use super::*;
use crate::aggregate::{ProcWindow, Window};
use crate::decode::{FdWaitSnap, InodeSnap, ThreadSnap, WakeSnap};

fn open(tgid: u32, fd: i32, id: u64, path: &str) -> Event {
    Event::Open { ts: 0, tid: tgid, tgid, fd, file_id: id, path: path.into(), dfd: -100, dup_of: None }
}

fn dup(tgid: u32, fd: i32, id: u64, of: i32) -> Event {
    Event::Open { ts: 0, tid: tgid, tgid, fd, file_id: id, path: String::new(), dfd: of, dup_of: Some(of) }
}

fn file_snap(tgid: u32, fd: i32, id: u64, bytes: u64, calls: u64) -> FileSnap {
    FileSnap {
        tgid,
        fd,
        file_id: id,
        kind: fd_kind::REGULAR,
        counters: FileCounters {
            read_bytes: bytes,
            read_calls: calls,
            read_ns: calls * 10,
            timed_calls: calls,
            ..Default::default()
        },
    }
}

#[test]
fn reused_fd_keeps_files_apart() {
    let mut m = Model::new(0);
    m.apply(&open(10, 3, 1, "/a"));
    m.apply(&Event::Close {
        ts: 1,
        tgid: 10,
        fd: 3,
        file_id: 1,
        counters: FileCounters { read_bytes: 100, read_calls: 2, ..Default::default() },
    });
    m.apply(&open(10, 3, 2, "/b"));
    m.apply_snapshot(&Snapshot { ts: 5, files: vec![file_snap(10, 3, 2, 7, 1)], ..Default::default() });
    let w = m.summary(5);
    let p = w.proc(10).unwrap();
    let get = |path: &str| p.files.iter().find(|f| f.path == path).unwrap().read_bytes;
    assert_eq!((get("/a"), get("/b")), (100, 7));
}

/// Storage and mapped bytes land on the path the process opened the file
/// by, in the window they were counted in, also after the descriptor
/// closed (a mapping outlives it); a file stall never saw opened counts
/// for the process only; a kernel without the hooks says nothing (None).
#[test]
fn inode_bytes_follow_the_inode_to_its_path() {
    let mut m = Model::new(0);
    m.apply(&open(10, 3, 1, "/data/shard.arrow"));
    let shard = Inode { dev: 8 << 20 | 1, ino: 42 };
    m.set_file_inode(1, shard);
    m.apply(&Event::Close { ts: 10, tgid: 10, fd: 3, file_id: 1, counters: FileCounters::default() });
    let lib = Inode { dev: 8 << 20 | 1, ino: 7 };
    let counts = |shard_bytes, lib_bytes, mmap_known| Snapshot {
        ts: 1_000,
        inode_bytes: Some(vec![
            InodeSnap {
                tgid: 10,
                inode: shard,
                storage_bytes: shard_bytes,
                mmap_bytes: 2 * shard_bytes,
                mmap_shared_bytes: shard_bytes,
            },
            InodeSnap { tgid: 10, inode: lib, storage_bytes: lib_bytes, mmap_bytes: 0, mmap_shared_bytes: 0 },
        ]),
        mmap_known,
        ..Default::default()
    };
    m.apply_snapshot(&counts(4096, 8192, true));
    let w1 = m.interval(1_000);
    m.apply_snapshot(&counts(3 * 4096, 8192, true));
    let w2 = m.interval(2_000);
    let bytes = |w: &Window| {
        let p = w.proc(10).unwrap();
        let f = p.files.iter().find(|f| f.path == "/data/shard.arrow").unwrap();
        (p.storage_bytes, f.storage_bytes, p.mmap_bytes, f.mmap_bytes)
    };
    let shared = |w: &Window| {
        let p = w.proc(10).unwrap();
        (
            p.mmap_shared_bytes,
            p.files.iter().find(|f| f.path == "/data/shard.arrow").unwrap().mmap_shared_bytes,
        )
    };
    assert_eq!(bytes(&w1), (Some(4096 + 8192), Some(4096), Some(8192), Some(8192)));
    assert_eq!(shared(&w1), (Some(4096), Some(4096)));
    assert_eq!(bytes(&w2), (Some(2 * 4096), Some(2 * 4096), Some(4 * 4096), Some(4 * 4096)));
    assert_eq!(
        bytes(&m.summary(2_000)),
        (Some(3 * 4096 + 8192), Some(3 * 4096), Some(6 * 4096), Some(6 * 4096))
    );
    assert_eq!(
        (shared(&w2), shared(&m.summary(2_000))),
        ((Some(2 * 4096), Some(2 * 4096)), (Some(3 * 4096), Some(3 * 4096)))
    );

    // Fills seen, faults not followed: mapped bytes unknown.
    let mut no_faults = Model::new(0);
    no_faults.apply(&open(10, 3, 1, "/data/shard.arrow"));
    no_faults.set_file_inode(1, shard);
    no_faults.apply_snapshot(&counts(4096, 0, false));
    let w = no_faults.summary(1_000);
    let f = &w.proc(10).unwrap().files[0];
    assert_eq!((f.storage_bytes, f.mmap_bytes, w.proc(10).unwrap().mmap_bytes), (Some(4096), None, None));

    let mut none = Model::new(0);
    none.apply(&open(10, 3, 1, "/data/shard.arrow"));
    none.apply_snapshot(&Snapshot { ts: 1, ..Default::default() });
    let w = none.summary(1);
    let (p, f) = (w.proc(10).unwrap(), &w.proc(10).unwrap().files[0]);
    assert_eq!((p.storage_bytes, f.storage_bytes, p.mmap_bytes, f.mmap_bytes), (None, None, None, None));
}

/// Pages of a file the trainer mapped before forking its workers land on
/// that file's path in each worker that faults them in (they never opened
/// it); a file nobody opened while traced is named from /proc once known;
/// until then it counts for the process only.
#[test]
fn pages_of_an_inherited_mapping_are_named_in_the_process_that_takes_them() {
    let mut m = Model::new(0);
    m.note_process(10, Some(1), "python", None);
    m.note_process(11, Some(10), "pt_data_worker", None);
    m.apply(&open(10, 3, 1, "/data/train/data-00000-of-00001.arrow"));
    let arrow = Inode { dev: 8 << 20 | 1, ino: 42 };
    m.set_file_inode(1, arrow);
    let other = Inode { dev: 8 << 20 | 1, ino: 43 };
    m.apply_snapshot(&Snapshot {
        ts: 1_000,
        inode_bytes: Some(vec![
            InodeSnap { tgid: 10, inode: arrow, storage_bytes: 0, mmap_bytes: 4096, mmap_shared_bytes: 0 },
            InodeSnap {
                tgid: 11,
                inode: arrow,
                storage_bytes: 1 << 20,
                mmap_bytes: 2 << 20,
                mmap_shared_bytes: 0,
            },
            InodeSnap { tgid: 11, inode: other, storage_bytes: 0, mmap_bytes: 8192, mmap_shared_bytes: 0 },
        ]),
        mmap_known: true,
        ..Default::default()
    });
    assert_eq!(m.unnamed_inodes(), vec![(11, other)]);
    let worker_files = |m: &Model| {
        let w = m.summary(1_000);
        let p = w.proc(11).unwrap().clone();
        (p.mmap_bytes, p.files.iter().map(|f| (f.path.clone(), f.mmap_bytes)).collect::<Vec<_>>())
    };
    assert_eq!(
        worker_files(&m),
        (Some((2 << 20) + 8192), vec![("/data/train/data-00000-of-00001.arrow".to_string(), Some(2 << 20))])
    );
    m.name_inode(other, "/data/vocab.bin".into());
    assert!(m.unnamed_inodes().is_empty());
    let (_, files) = worker_files(&m);
    assert!(files.contains(&("/data/vocab.bin".to_string(), Some(8192))), "{files:?}");
}

/// A dup names the original's file: its reads add to that path, and it
/// is not another open (nor more open time), even once the original is
/// closed.
#[test]
fn a_dup_reads_as_its_original() {
    let mut m = Model::new(0);
    m.apply(&open(10, 3, 1, "data/a.bin"));
    m.set_file_resolved(1, "/work/data/a.bin");
    m.apply(&dup(10, 60, 2, 3));
    let f = &m.files[&2];
    assert_eq!(
        (f.path.as_str(), f.resolved.as_deref(), f.dup),
        ("data/a.bin", Some("/work/data/a.bin"), true)
    );
    m.apply_snapshot(&Snapshot {
        ts: 1_000,
        files: vec![file_snap(10, 3, 1, 100, 1), file_snap(10, 60, 2, 50, 2)],
        ..Default::default()
    });
    let w = m.interval(1_000);
    let files = &w.proc(10).unwrap().files;
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!((files[0].read_bytes, files[0].read_calls, files[0].opens), (150, 3, 1));
    assert_eq!(files[0].open_ns, 1_000);
    // A dup of a descriptor stall does not know gets a path later.
    m.apply(&dup(10, 61, 3, 9));
    m.set_file_resolved(3, "/work/other.bin");
    assert_eq!(m.files[&3].path, "/work/other.bin");
}

/// The kernel keeps one entry per descriptor: an open the model still
/// lists under a number whose close it never saw (the kernel's entry was
/// replaced) is retired by the next open of that number, and a copy then
/// names the newest, never the stale one, however the map is ordered.
#[test]
fn a_copy_names_the_newest_open_of_its_number() {
    let mut m = Model::new(0);
    m.apply(&open(10, 3, 1, "/lib/stale.pyc"));
    // Its close never arrives; the number is opened again.
    m.apply(&open(10, 3, 2, "/data/by-dup.bin"));
    assert!(!m.files.contains_key(&1), "the stale open is retired");
    for (i, fd) in (60..70).enumerate() {
        m.apply(&dup(10, fd, 100 + i as u64, 3));
        assert_eq!(m.files[&(100 + i as u64)].path, "/data/by-dup.bin");
    }
    assert_eq!(m.open_file(10, 3).map(|f| f.file_id), Some(2));
    // Another process's descriptor 3 is another entry.
    m.apply(&open(11, 3, 3, "/other"));
    assert_eq!(m.open_file(10, 3).map(|f| f.file_id), Some(2));
    assert_eq!(m.open_file(11, 3).map(|f| f.file_id), Some(3));
}

/// A close of an open the model never held (the agent's rewrite of an
/// entry raced the descriptor's reuse) still ends the older open the model
/// holds under that number; a close of a known open forgets its number.
#[test]
fn a_close_under_another_id_ends_the_older_open_of_its_number() {
    let mut m = Model::new(0);
    m.apply(&Event::Open {
        ts: 5,
        tid: 10,
        tgid: 10,
        fd: 3,
        file_id: 1,
        path: "/a".into(),
        dfd: -100,
        dup_of: None,
    });
    let close = |ts, id| Event::Close { ts, tgid: 10, fd: 3, file_id: id, counters: FileCounters::default() };
    // Older than the open: not the one the model holds.
    m.apply(&close(4, 9));
    assert!(m.open_file(10, 3).is_some());
    m.apply(&close(6, 9));
    assert!(m.open_file(10, 3).is_none());
    assert!(m.files.is_empty());
    m.apply(&open(10, 3, 2, "/b"));
    m.apply(&close(7, 2));
    assert!(m.open_file(10, 3).is_none() && m.files.is_empty());
    // A copy of a closed number names nothing known.
    m.apply(&dup(10, 4, 3, 3));
    assert_eq!(m.files[&3].path, "");
}

#[test]
fn intervals_are_deltas_and_sum_to_total() {
    let mut m = Model::new(0);
    m.apply(&open(10, 3, 1, "/a"));
    let thread = |on: u64| ThreadSnap {
        tid: 10,
        tgid: 10,
        counters: ThreadCounters { on_cpu_ns: on, ..Default::default() },
        ..Default::default()
    };
    m.apply_snapshot(&Snapshot {
        ts: 1_000,
        threads: vec![thread(400)],
        files: vec![file_snap(10, 3, 1, 4096, 1)],
        ..Default::default()
    });
    let w1 = m.interval(1_000);
    m.apply_snapshot(&Snapshot {
        ts: 2_000,
        threads: vec![thread(1_000)],
        files: vec![file_snap(10, 3, 1, 5000, 3)],
        ..Default::default()
    });
    let w2 = m.interval(2_000);
    let p1 = w1.proc(10).unwrap();
    let p2 = w2.proc(10).unwrap();
    assert_eq!(p1.threads[0].delta.on_cpu_ns, 400);
    assert_eq!(p2.threads[0].delta.on_cpu_ns, 600);
    assert_eq!(p1.files[0].read_bytes + p2.files[0].read_bytes, 5000);
    assert_eq!((p1.files[0].opens, p2.files[0].opens), (1, 0));
    assert_eq!(m.summary(2_000).proc(10).unwrap().files[0].read_bytes, 5000);
}

#[test]
fn non_files_never_count_as_file_reads() {
    let mut m = Model::new(0);
    m.apply(&open(10, 5, 9, "/tmp/fifo"));
    m.set_file_kind(9, fd_kind::OTHER);
    m.apply_snapshot(&Snapshot {
        ts: 10,
        files: vec![FileSnap { kind: fd_kind::OTHER, ..file_snap(10, 5, 9, 50, 5) }],
        ..Default::default()
    });
    assert!(m.summary(10).proc(10).unwrap().files.is_empty());
}

#[test]
fn forks_exec_exit_build_the_tree() {
    let mut m = Model::new(0);
    m.note_process(10, Some(1), "python", None);
    m.apply(&Event::NewTask {
        ts: 1,
        parent_tid: 10,
        parent_tgid: 10,
        child_tid: 11,
        child_tgid: 10,
        comm: "python".into(),
    });
    m.apply(&Event::NewTask {
        ts: 2,
        parent_tid: 10,
        parent_tgid: 10,
        child_tid: 20,
        child_tgid: 20,
        comm: "python".into(),
    });
    m.apply(&Event::Exec { ts: 3, tid: 20, tgid: 20, comm: "worker".into() });
    assert_eq!(m.procs[&20].ppid, Some(10));
    assert_eq!(m.procs[&20].comm, "worker");
    assert_eq!(m.threads[&11].tgid, 10);
    let counters = ThreadCounters { file_read_bytes: 9, ..Default::default() };
    m.apply(&Event::Exit {
        ts: 4,
        tid: 20,
        tgid: 20,
        comm: "worker".into(),
        counters: Box::new(counters),
        other_nr: -1,
    });
    assert!(!m.procs[&20].alive);
    assert!(m.procs[&10].alive);
    let (tgids, tids) = m.dead();
    assert!(tgids.contains(&20) && tids.contains(&20) && !tids.contains(&11));
    m.mark_retired(&tgids, &tids);
    let (tgids, tids) = m.dead();
    assert!(tgids.is_empty() && tids.is_empty(), "retired once, not every interval");
    // An exited thread's last counters stay in the totals.
    assert_eq!(m.summary(5).thread(20).unwrap().1.delta.file_read_bytes, 9);
}

/// Ids come back (pids wrap): a new process or thread under the id of
/// one that ended starts afresh, and what the old one counted stays in
/// the run's totals.
#[test]
fn a_reused_id_is_a_new_task() {
    let mut m = Model::new(0);
    let new_task = |ts, parent: u32, tid: u32, tgid: u32| Event::NewTask {
        ts,
        parent_tid: parent,
        parent_tgid: parent,
        child_tid: tid,
        child_tgid: tgid,
        comm: "python".into(),
    };
    let exit = |ts, tid, tgid, file_read_bytes| Event::Exit {
        ts,
        tid,
        tgid,
        comm: "worker".into(),
        counters: Box::new(ThreadCounters { file_read_bytes, ..Default::default() }),
        other_nr: -1,
    };
    // A worker process 20 and a thread 11 of the trainer 10 end.
    m.apply(&new_task(0, 1, 10, 10));
    m.apply(&new_task(1, 10, 20, 20));
    m.apply(&new_task(1, 10, 11, 10));
    m.apply(&exit(2, 20, 20, 100));
    m.apply(&exit(2, 11, 10, 7));
    let (tgids, tids) = m.dead();
    m.mark_retired(&tgids, &tids);
    m.interval(3);
    // Their ids come back: a new worker 20, a new trainer thread 11.
    m.apply(&new_task(4, 10, 20, 20));
    m.apply(&new_task(4, 10, 11, 10));
    assert!(m.procs[&20].alive && m.threads[&20].alive && m.threads[&11].alive);
    assert_eq!((m.threads[&20].total, m.threads[&11].total), Default::default());
    m.apply(&exit(5, 20, 20, 30));
    let w = m.summary(6);
    let proc_bytes =
        |tgid| w.procs.iter().filter(|p| p.tgid == tgid).map(|p| p.sum().file_read_bytes).sum::<u64>();
    assert_eq!(proc_bytes(20), 30, "the new worker alone");
    assert_eq!(proc_bytes(0), 100, "the old one, folded");
    let trainer = w.proc(10).unwrap();
    let reused = trainer.threads.iter().find(|t| t.tid == 0).expect("the old thread, summed");
    assert_eq!(reused.delta.file_read_bytes, 7);
    // An interval after counts only what happened in it.
    let w = m.interval(6);
    assert_eq!(w.proc(20).unwrap().sum().file_read_bytes, 30);
    assert!(w.proc(10).unwrap().threads.iter().all(|t| t.tid != 0), "nothing new of the old thread");
}

#[test]
fn merged_windows_equal_the_longer_window() {
    let mut m = Model::new(0);
    m.apply(&open(10, 3, 1, "/a"));
    let mut windows = Vec::new();
    for i in 1..=3u64 {
        m.apply_snapshot(&Snapshot {
            ts: i * 1000,
            threads: vec![ThreadSnap {
                tid: 10,
                tgid: 10,
                counters: ThreadCounters { on_cpu_ns: i * 100, ..Default::default() },
                ..Default::default()
            }],
            files: vec![file_snap(10, 3, 1, i * 4096, i)],
            ..Default::default()
        });
        windows.push(m.interval(i * 1000));
    }
    let merged = Window::merge(&windows);
    let total = m.summary(3000);
    assert_eq!(merged.secs(), total.secs());
    let (mp, tp) = (merged.proc(10).unwrap(), total.proc(10).unwrap());
    assert_eq!(mp.threads[0].delta, tp.threads[0].delta);
    assert_eq!(mp.files, tp.files);
}

#[test]
fn closed_files_fold_per_path_and_keep_their_counts() {
    let mut m = Model::new(0);
    for k in 0..1000u64 {
        m.apply(&Event::Open {
            ts: k,
            tid: 10,
            tgid: 10,
            fd: 3,
            file_id: k,
            path: "/shard".into(),
            dfd: -100,
            dup_of: None,
        });
        let counters =
            FileCounters { read_bytes: 10, read_calls: 2, read_ns: 5, timed_calls: 1, ..Default::default() };
        m.apply(&Event::Close { ts: k + 1, tgid: 10, fd: 3, file_id: k, counters });
        if k % 100 == 99 {
            let _ = m.interval(k + 1);
        }
    }
    assert!(m.files.is_empty(), "closed files are folded away");
    let w = m.summary(1000);
    let f = &w.proc(10).unwrap().files[0];
    assert_eq!((f.opens, f.read_bytes, f.read_calls, f.open_ns), (1000, 10_000, 2000, 1000));
}

#[test]
fn ended_processes_beyond_the_cap_are_summed() {
    let mut m = Model::new(0);
    let n = MAX_ENDED as u32 + 100;
    for pid in 100..100 + n {
        m.apply(&Event::NewTask {
            ts: 1,
            parent_tid: 10,
            parent_tgid: 10,
            child_tid: pid,
            child_tgid: pid,
            comm: "w".into(),
        });
        m.apply(&open(pid, 3, u64::from(pid), "/shard"));
        let fc =
            FileCounters { read_bytes: 7, read_calls: 1, read_ns: 1, timed_calls: 1, ..Default::default() };
        m.apply(&Event::Close { ts: 2, tgid: pid, fd: 3, file_id: u64::from(pid), counters: fc });
        let counters = ThreadCounters { file_read_bytes: 7, on_cpu_ns: 3, ..Default::default() };
        m.apply(&Event::Exit {
            ts: 3,
            tid: pid,
            tgid: pid,
            comm: "w".into(),
            counters: Box::new(counters),
            other_nr: -1,
        });
    }
    let first = m.interval(10);
    // One thread each, held at its size (a fork storm's window holds thousands).
    assert!(first.procs.iter().all(|p| p.threads.capacity() == p.threads.len()));
    assert!(m.procs.len() <= MAX_ENDED + 1, "{}", m.procs.len());
    let w = m.summary(10);
    let folded = w.proc(0).expect("the summed entry");
    assert!(folded.comm.starts_with("(100 ended processes"), "{}", folded.comm);
    let total_bytes: u64 = w.procs.iter().map(ProcWindow::file_read_bytes).sum();
    assert_eq!(total_bytes, 7 * u64::from(n));
    let on: u64 = w.procs.iter().map(|p| p.sum().on_cpu_ns).sum();
    assert_eq!(on, 3 * u64::from(n));
}

/// An interval ending at `ts` in which only thread `tid` (its process's
/// main thread) is alive, then the prune that follows it.
fn prune_with_alive(m: &mut Model, tid: u32, ts: u64) {
    m.apply_snapshot(&Snapshot {
        ts,
        threads: vec![ThreadSnap { tid, tgid: tid, ..Default::default() }],
        ..Default::default()
    });
    let _ = m.interval(ts);
    m.prune();
}

#[test]
fn prune_keeps_only_the_live_job() {
    let mut m = Model::new(0);
    m.apply(&open(10, 3, 1, "/a"));
    m.apply(&open(20, 3, 2, "/b"));
    m.apply(&Event::NewTask {
        ts: 1,
        parent_tid: 10,
        parent_tgid: 10,
        child_tid: 20,
        child_tgid: 20,
        comm: "w".into(),
    });
    let counters = ThreadCounters::default();
    m.apply(&Event::Exit {
        ts: 2,
        tid: 20,
        tgid: 20,
        comm: "w".into(),
        counters: Box::new(counters),
        other_nr: -1,
    });
    m.apply(&Event::Close { ts: 2, tgid: 10, fd: 3, file_id: 1, counters: FileCounters::default() });
    prune_with_alive(&mut m, 10, 3);
    assert_eq!(m.threads.keys().copied().collect::<Vec<_>>(), vec![10]);
    assert_eq!(m.procs.keys().copied().collect::<Vec<_>>(), vec![10]);
    assert!(m.files.is_empty());
}

/// Peers are remembered while a socket connected to them is open: a
/// long-running daemon's memory follows the job's connections, not every
/// address it ever reached.
#[test]
fn prune_forgets_peers_no_socket_names() {
    let mut m = Model::new(0);
    for (fd, file_id, peer) in [(4, 7, "10.0.0.1:443"), (5, 8, "10.0.0.2:443")] {
        m.note_peer(peer, false);
        m.apply(&Event::Connect { ts: 1, tgid: 10, fd, file_id, peer: peer.into() });
    }
    m.apply(&Event::Close { ts: 2, tgid: 10, fd: 4, file_id: 7, counters: FileCounters::default() });
    prune_with_alive(&mut m, 10, 3);
    assert!(!m.peer_known("10.0.0.1:443"));
    assert!(m.peer_known("10.0.0.2:443"));
}

#[test]
fn wakers_are_listed_most_frequent_first() {
    let mut m = Model::new(0);
    m.apply_snapshot(&Snapshot {
        ts: 10,
        threads: vec![ThreadSnap { tid: 10, tgid: 10, ..Default::default() }],
        wakes: vec![
            WakeSnap {
                wakee: 10,
                waker: 21,
                waker_tgid: 21,
                waker_comm: "w1".into(),
                count: 3,
                blocked_ns: 0,
            },
            WakeSnap {
                wakee: 10,
                waker: 22,
                waker_tgid: 22,
                waker_comm: "w2".into(),
                count: 30,
                blocked_ns: 0,
            },
        ],
        ..Default::default()
    });
    let w = m.summary(10);
    let by = &w.thread(10).unwrap().1.woken_by;
    assert_eq!(by.iter().map(|b| (b.tid, b.count)).collect::<Vec<_>>(), vec![(22, 30), (21, 3)]);
}

/// Each interval holds the blocked time its wakers ended in it, the
/// summary all of it; and who ended the most comes first, however often.
#[test]
fn wakers_blocked_time_per_interval_and_first_by_it() {
    let mut m = Model::new(0);
    let snap = |ts: u64, slow: (u64, u64), fast: (u64, u64)| Snapshot {
        ts,
        threads: vec![ThreadSnap { tid: 10, tgid: 10, ..Default::default() }],
        wakes: vec![
            WakeSnap {
                wakee: 10,
                waker: 21,
                waker_tgid: 21,
                waker_comm: "slow".into(),
                count: slow.0,
                blocked_ns: slow.1,
            },
            WakeSnap {
                wakee: 10,
                waker: 22,
                waker_tgid: 22,
                waker_comm: "fast".into(),
                count: fast.0,
                blocked_ns: fast.1,
            },
        ],
        ..Default::default()
    };
    let got = |w: &Window| -> Vec<(u32, u64, u64)> {
        w.thread(10).unwrap().1.woken_by.iter().map(|b| (b.tid, b.count, b.blocked_ns)).collect()
    };
    m.apply_snapshot(&snap(1_000, (2, 400), (10, 100)));
    assert_eq!(got(&m.interval(1_000)), [(21, 2, 400), (22, 10, 100)]);
    m.apply_snapshot(&snap(2_000, (5, 1_000), (30, 300)));
    assert_eq!(got(&m.interval(2_000)), [(21, 3, 600), (22, 20, 200)]);
    assert_eq!(got(&m.summary(2_000)), [(21, 5, 1_000), (22, 30, 300)]);
}

/// Blocked time per descriptor: each interval its own, the summary all,
/// longest first.
#[test]
fn descriptor_waits_per_interval() {
    let mut m = Model::new(0);
    let snap = |ts: u64, one: u64, five: u64| Snapshot {
        ts,
        threads: vec![ThreadSnap { tid: 10, tgid: 10, ..Default::default() }],
        fd_waits: vec![
            FdWaitSnap { tgid: 10, fd: 1, blocked_ns: one },
            FdWaitSnap { tgid: 10, fd: 5, blocked_ns: five },
        ],
        ..Default::default()
    };
    let got = |w: &Window| -> Vec<(i32, u64)> {
        w.procs.iter().find(|p| p.tgid == 10).unwrap().fd_waits.iter().map(|f| (f.fd, f.blocked_ns)).collect()
    };
    m.apply_snapshot(&snap(1_000, 300, 100));
    assert_eq!(got(&m.interval(1_000)), [(1, 300), (5, 100)]);
    m.apply_snapshot(&snap(2_000, 300, 600));
    assert_eq!(got(&m.interval(2_000)), [(5, 500)]);
    assert_eq!(got(&m.summary(2_000)), [(5, 600), (1, 300)]);
}

/// Wakes the kernel counted per waking process (its pair table full)
/// stay apart from the waking threads', under the process's name and
/// with no thread.
#[test]
fn wakes_counted_per_process_name_no_thread() {
    let mut m = Model::new(0);
    m.note_process(20, Some(1), "python3", None);
    m.apply_snapshot(&Snapshot {
        ts: 10,
        threads: vec![ThreadSnap { tid: 10, tgid: 10, ..Default::default() }],
        wakes: vec![
            WakeSnap {
                wakee: 10,
                waker: 21,
                waker_tgid: 20,
                waker_comm: "w1".into(),
                count: 3,
                blocked_ns: 0,
            },
            WakeSnap {
                wakee: 10,
                waker: 20 | WAKER_ANY_THREAD,
                waker_tgid: 20,
                waker_comm: "w7".into(),
                count: 40,
                blocked_ns: 0,
            },
        ],
        ..Default::default()
    });
    let w = m.summary(10);
    let by = &w.thread(10).unwrap().1.woken_by;
    let got: Vec<_> = by.iter().map(|b| (b.thread(), b.tgid, b.comm.as_str(), b.count)).collect();
    assert_eq!(got, vec![(None, 20, "python3", 40), (Some(21), 20, "w1", 3)]);
}
