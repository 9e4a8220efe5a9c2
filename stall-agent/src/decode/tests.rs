//! Decoding on hand-made records: peers of both families, events with
//! their payloads, and what is rejected.
use stall_common::{FileStats, ThreadStats};

use super::*;

#[test]
fn peers_of_both_families() {
    let mut v4 = vec![2, 0, 0x49, 0x61, 127, 0, 0, 1];
    v4.resize(28, 0);
    assert_eq!(peer_of(&v4).as_deref(), Some("127.0.0.1:18785"));
    let mut v6 = vec![10, 0, 0x01, 0xbb, 0, 0, 0, 0];
    v6.extend([0x20, 0x01, 0x0d, 0xb8]);
    v6.extend([0; 11]);
    v6.push(1);
    v6.resize(28, 0);
    assert_eq!(peer_of(&v6).as_deref(), Some("[2001:db8::1]:443"));
    let mut mapped = vec![10, 0, 0, 80, 0, 0, 0, 0];
    mapped.extend([0; 10]);
    mapped.extend([0xff, 0xff, 10, 0, 0, 5]);
    mapped.resize(28, 0);
    assert_eq!(peer_of(&mapped).as_deref(), Some("10.0.0.5:80"));
    assert_eq!(peer_of(&[1, 0, b'/', b't']), None);
    assert_eq!(peer_of(&[2, 0]), None);
}

fn bytes<T>(v: &T) -> Vec<u8> {
    // SAFETY: plain-data test values.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
}

#[test]
fn decodes_open_with_path() {
    let mut e = OpenEvent {
        hdr: EventHeader { kind: event_kind::OPEN, tid: 11, tgid: 10, job: 1, ts: 5 },
        file_id: 77,
        fd: 3,
        dfd: -100,
        flags: 0,
        path_len: 9,
        dup_of: -1,
        _pad: 0,
        path: [0; stall_common::PATH_LEN],
    };
    e.path[..8].copy_from_slice(b"/data/x1");
    match decode(&bytes(&e)).unwrap().1 {
        Event::Open { path, fd, file_id, tgid, .. } => {
            assert_eq!((path.as_str(), fd, file_id, tgid), ("/data/x1", 3, 77, 10))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn close_and_exit_carry_write_counts() {
    let stats =
        FileStats { file_id: 9, read_bytes: 5, write_bytes: 4097, write_calls: 3, ..Default::default() };
    let e = CloseEvent {
        hdr: EventHeader { kind: event_kind::CLOSE, tid: 11, tgid: 10, job: 1, ts: 5 },
        fd: 4,
        _pad: 0,
        stats,
    };
    match decode(&bytes(&e)).unwrap().1 {
        Event::Close { counters, file_id, .. } => {
            assert_eq!(file_id, 9);
            assert_eq!((counters.read_bytes, counters.write_bytes, counters.write_calls), (5, 4097, 3));
        }
        other => panic!("{other:?}"),
    }
    let t = ThreadStats {
        file_write_bytes: 10,
        file_write_calls: 2,
        other_write_bytes: 7,
        other_write_calls: 1,
        stdio_write_bytes: 7,
        ..Default::default()
    };
    let (c, _) = fold(&t, 0);
    assert_eq!(
        (
            c.file_write_bytes,
            c.file_write_calls,
            c.other_write_bytes,
            c.other_write_calls,
            c.stdio_write_bytes
        ),
        (10, 2, 7, 1, 7)
    );
    let later = ThreadCounters { file_write_bytes: 25, stdio_write_bytes: 9, ..c };
    let d = later.saturating_sub(&c);
    assert_eq!((d.file_write_bytes, d.stdio_write_bytes, d.other_write_bytes), (15, 2, 0));
    let f1 = FileCounters::from(&stats);
    let f2 = FileCounters { write_bytes: 5000, write_calls: 4, ..f1 };
    assert_eq!(
        f2.saturating_sub(&f1),
        FileCounters { write_bytes: 903, write_calls: 1, ..Default::default() }
    );
}

#[test]
fn rejects_short_and_unknown() {
    assert_eq!(decode(&[0; 4]), Err(DecodeError::Short(4)));
    let h = EventHeader { kind: 99, ..Default::default() };
    assert_eq!(decode(&bytes(&h)), Err(DecodeError::Kind(99)));
    let h = EventHeader { kind: event_kind::EXIT, ..Default::default() };
    assert!(matches!(decode(&bytes(&h)), Err(DecodeError::Short(_))));
}

#[test]
fn a_jobs_part_of_a_snapshot_keeps_its_own_bytes_gpu_calls_and_communicators() {
    use super::{CommSnap, GpuCounters, Inode, InodeSnap, Snapshot, ThreadSnap};
    let thread = |tid, tgid, job| ThreadSnap { tid, tgid, job, ..Default::default() };
    let comm = |tgid| CommSnap {
        tgid,
        comm: 1,
        id: Some(7),
        nranks: Some(2),
        rank: Some(0),
        tid: tgid,
        collectives: 3,
        p2p: 0,
        ring: vec![0; 4],
    };
    let bytes = |tgid| InodeSnap {
        tgid,
        inode: Inode { dev: 1, ino: 2 },
        storage_bytes: 10,
        mmap_bytes: 20,
        mmap_shared_bytes: 0,
    };
    let gpu = GpuCounters { collectives: 3, ..Default::default() };
    let snap = Snapshot {
        threads: vec![thread(10, 10, 1), thread(11, 10, 1), thread(20, 20, 2)],
        inode_bytes: Some(vec![bytes(10), bytes(20)]),
        mmap_known: true,
        gpu_calls: vec![(11, gpu), (20, gpu)],
        communicators: vec![comm(10), comm(20)],
        ..Default::default()
    };
    let mine = snap.of_job(1);
    assert_eq!(mine.threads.len(), 2);
    assert_eq!(mine.inode_bytes, Some(vec![bytes(10)]));
    assert!(mine.mmap_known);
    assert_eq!(mine.gpu_calls, vec![(11, gpu)]);
    assert_eq!(mine.communicators, vec![comm(10)]);
}
