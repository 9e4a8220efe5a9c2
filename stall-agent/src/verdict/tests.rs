//! Every verdict kind on synthetic streams, through the same path as live
//! data: events and snapshots → Model → Window → roles → judge.
use std::collections::HashSet;

use stall_common::{counter::LOST_CAUSES, fd_kind, reason};

use super::*;
use crate::progress::OutputAge;
use crate::{
    aggregate::{is_code_file, Model},
    correlate,
    decode::{
        Event, FileCounters, FileSnap, GpuCounters, Inode, InodeSnap, Snapshot, ThreadCounters, ThreadNow,
        ThreadSnap, WakeSnap,
    },
    gpu::gpu_window,
};

mod waits;

const S: u64 = 1_000_000_000;

/// Shares of a window by state: (on, [futex, io, poll, sleep, runqueue, other,
/// write, sync]), the trailing ones zero where left out.
pub(super) fn counters<const N: usize>(secs: u64, on: f64, off: [f64; N], file_bytes: u64) -> ThreadCounters {
    let ns = |f: f64| (f * (secs * S) as f64) as u64;
    let mut off_ns = [0; reason::COUNT];
    for (i, v) in off.iter().enumerate() {
        off_ns[i] = ns(*v);
    }
    ThreadCounters {
        on_cpu_ns: ns(on),
        off_ns,
        file_read_bytes: file_bytes,
        file_read_calls: file_bytes / 65536,
        ..Default::default()
    }
}

struct Job {
    model: Model,
    secs: u64,
    threads: Vec<ThreadSnap>,
    files: Vec<FileSnap>,
    inode_bytes: Option<Vec<InodeSnap>>,
    /// Whether the "kernel" follows faults on mappings.
    mmap_known: bool,
    wakes: Vec<WakeSnap>,
    gpu_pids: HashSet<u32>,
    lost: [u64; LOST_CAUSES],
    /// As a test sets it; else as the window shows (silent since its start
    /// unless something in it moved).
    progress: Option<ProgressView>,
    /// The job's processes are in one cgroup with this CPU limit.
    cpu_limit: Option<crate::cpulimit::Reading>,
    /// What threads were seen blocked on, by tid (as the job places them).
    waits_on: Vec<(u32, u8, crate::wait::WaitObject)>,
    /// The filesystem serving every file, where a server does (as the job
    /// places it).
    filesystem: Option<&'static str>,
    /// Calls into the job's CUDA libraries, by tid.
    gpu_calls: Vec<(u32, GpuCounters)>,
    /// Blocked time per descriptor of a process.
    fd_waits: Vec<crate::decode::FdWaitSnap>,
}

impl Job {
    fn new(secs: u64) -> Self {
        let mut model = Model::new(0);
        model.note_process(100, Some(1), "python", None);
        Self {
            model,
            secs,
            threads: vec![],
            files: vec![],
            inode_bytes: None,
            mmap_known: false,
            wakes: vec![],
            gpu_pids: HashSet::new(),
            lost: [0; LOST_CAUSES],
            progress: None,
            cpu_limit: None,
            waits_on: vec![],
            filesystem: None,
            gpu_calls: vec![],
            fd_waits: vec![],
        }
    }

    fn thread(mut self, tid: u32, tgid: u32, c: ThreadCounters, now: ThreadNow) -> Self {
        self.threads.push(ThreadSnap { tid, tgid, job: 1, counters: c, now, other_nr: -1 });
        self
    }

    fn trainer<const N: usize>(self, on: f64, off: [f64; N], now: ThreadNow) -> Self {
        let c = counters(self.secs, on, off, 0);
        self.thread(100, 100, c, now)
    }

    /// A worker process (child of the trainer) that opened `path` as fd 5;
    /// the file's id is the pid.
    fn worker_opening(&mut self, pid: u32, path: String) -> u64 {
        self.model.note_process(pid, Some(100), "pt_data_worker", None);
        let id = u64::from(pid);
        self.model.apply(&Event::Open {
            ts: 0,
            tid: pid,
            tgid: pid,
            fd: 5,
            file_id: id,
            path,
            dfd: -100,
            dup_of: None,
        });
        id
    }

    /// A worker process (child of the trainer) reading `bytes` from its own file.
    fn worker<const N: usize>(mut self, pid: u32, on: f64, off: [f64; N], bytes: u64) -> Self {
        let id = self.worker_opening(pid, format!("/data/rows_{pid}.pt"));
        self.files.push(FileSnap {
            tgid: pid,
            fd: 5,
            file_id: id,
            kind: fd_kind::REGULAR,
            counters: FileCounters {
                read_bytes: bytes,
                read_calls: bytes / 65536 + 1,
                read_ns: 1,
                timed_calls: 1,
                ..Default::default()
            },
        });
        let c = counters(self.secs, on, off, bytes);
        let now = ThreadNow { running: false, reason: reason::IO, syscall: 0, for_ns: 1000 };
        self.thread(pid, pid, c, now)
    }

    /// A worker that maps its shard (opened, mapped, closed), faults
    /// `mapped` bytes of it in (None: faults not followed), `storage` of
    /// them from storage: no read() at all.
    fn mapping_worker<const N: usize>(
        mut self,
        pid: u32,
        on: f64,
        off: [f64; N],
        storage: u64,
        mapped: Option<u64>,
    ) -> Self {
        let id = self.worker_opening(pid, format!("/data/shard_{pid}.safetensors"));
        let inode = Inode { dev: 8 << 20, ino: id };
        self.model.set_file_kind(id, fd_kind::REGULAR);
        self.model.set_file_inode(id, inode);
        self.model.apply(&Event::Close {
            ts: 1,
            tgid: pid,
            fd: 5,
            file_id: id,
            counters: FileCounters::default(),
        });
        self.inode_bytes.get_or_insert_with(Vec::new).push(InodeSnap {
            tgid: pid,
            inode,
            storage_bytes: storage,
            mmap_bytes: mapped.unwrap_or(0),
            mmap_shared_bytes: 0,
        });
        self.mmap_known = mapped.is_some();
        let c = counters(self.secs, on, off, 0);
        let now = ThreadNow { running: false, reason: reason::IO, syscall: -1, for_ns: 1000 };
        self.thread(pid, pid, c, now)
    }

    fn woken_by(mut self, wakee: u32, waker: u32, count: u64) -> Self {
        self.wakes.push(WakeSnap {
            wakee,
            waker,
            waker_tgid: waker,
            waker_comm: "pt_data_worker".into(),
            count,
            blocked_ns: 0,
        });
        self
    }

    fn judge(mut self, gpus: &[GpuWindow]) -> Verdict {
        let end = self.secs * S;
        self.model.apply_snapshot(&Snapshot {
            ts: end,
            threads: self.threads.clone(),
            files: self.files.clone(),
            wakes: self.wakes.clone(),
            lost: self.lost,
            inode_bytes: self.inode_bytes.clone(),
            mmap_known: self.mmap_known,
            gpu_calls: self.gpu_calls.clone(),
            fd_waits: self.fd_waits.clone(),
            ..Default::default()
        });
        if let Some(r) = &self.cpu_limit {
            let pids: Vec<u32> = self.model.procs.keys().copied().collect();
            for pid in pids {
                self.model.note_cpu_limit(pid, Some(r.limit.cgroup.clone()));
            }
            self.model.apply_cpu_limits(end, std::slice::from_ref(r), 2);
        }
        let mut w = self.model.summary(end);
        for t in w.procs.iter_mut().flat_map(|p| p.threads.iter_mut()) {
            t.waits_on = self.waits_on.iter().filter(|x| x.0 == t.tid).map(|x| (x.1, x.2.clone())).collect();
        }
        for f in w.procs.iter_mut().flat_map(|p| p.files.iter_mut()) {
            f.filesystem = self.filesystem.map(str::to_string);
        }
        let roles = correlate::assign(&w, &self.gpu_pids, Some(100));
        let moved = w.procs.iter().any(crate::aggregate::ProcWindow::moved);
        let progress = self.progress.clone().unwrap_or(ProgressView {
            known: true,
            silent_s: if moved { 0.0 } else { self.secs as f64 },
            ..Default::default()
        });
        judge(&w, &roles, gpus, &progress)
    }

    /// The job has not moved for `secs`; `rhythm`: its usual gap;
    /// `output`: its log and how long ago it was written.
    fn silent(mut self, secs: f64, rhythm: Option<f64>, output: Option<(&str, f64)>) -> Self {
        self.progress = Some(ProgressView {
            silent_s: secs,
            known: true,
            rhythm_s: rhythm,
            last_output: output.map(|(path, ago_s)| OutputAge { path: path.into(), pid: 100, ago_s }),
        });
        self
    }

    /// Never seen to move, no output known: silent since tracing started.
    fn never_moved(mut self) -> Self {
        self.progress = Some(ProgressView { silent_s: self.secs as f64, known: false, ..Default::default() });
        self
    }

    /// The trainer wrote `bytes` to its stdout in the window.
    fn printed(mut self, bytes: u64) -> Self {
        if let Some(t) = self.threads.iter_mut().find(|t| t.tid == 100) {
            t.counters.stdio_write_bytes += bytes;
            t.counters.other_write_bytes += bytes;
        }
        self
    }
}

fn blocked(r: u8) -> ThreadNow {
    ThreadNow { running: false, reason: r, syscall: if r == reason::FUTEX { 202 } else { 7 }, for_ns: 1 }
}

const RUNNING: ThreadNow = ThreadNow { running: true, reason: 0, syscall: -1, for_ns: 1 };

fn gpu(util: f64, secs: u64, gap_at: Option<(u64, u64)>) -> GpuWindow {
    // One sample every 100 ms, except inside the gap.
    let samples: Vec<(u64, f64)> = (0..secs * 10)
        .map(|i| i * S / 10)
        .filter(|t| gap_at.is_none_or(|(a, b)| *t < a * S || *t >= b * S))
        .map(|t| (t, util))
        .collect();
    gpu_window(0, "NVIDIA H200", &samples, 0, secs * S)
}

/// A GPU at `util` drawing `watts` of a 700 W limit.
fn gpu_at_power(util: f64, secs: u64, watts: f64) -> GpuWindow {
    GpuWindow { power_w: Some(watts), power_limit_w: Some(700.0), ..gpu(util, secs, None) }
}

/// The trainer sits in a futex, its workers idle, nothing is read.
fn futex_trainer(secs: u64) -> Job {
    Job::new(secs).trainer(0.001, [0.999, 0.0, 0.0, 0.0, 0.0, 0.0], blocked(reason::FUTEX)).worker(
        101,
        0.0,
        [0.0, 0.0, 1.0, 0.0, 0.0, 0.0],
        0,
    )
}

//          on    futex io   poll sleep runq other
const IO_WORKER: [f64; 6] = [0.0, 0.85, 0.0, 0.0, 0.02, 0.0];
const CPU_WORKER: [f64; 6] = [0.0, 0.05, 0.0, 0.0, 0.1, 0.0];
const TRAINER_WAITS: [f64; 6] = [0.6, 0.0, 0.37, 0.0, 0.0, 0.0];

fn io_bound_job() -> Job {
    let mut job = Job::new(10).trainer(0.03, TRAINER_WAITS, blocked(reason::FUTEX));
    for pid in 101..=104 {
        job = job.worker(pid, 0.1, IO_WORKER, 400_000_000).woken_by(100, pid, 300);
    }
    job
}

/// Workers of a throttled rank on a host crowded by the other ranks: on a
/// CPU 9 %, waiting for one 41 %, in their reads 45 %. The queue is the
/// host's, not their work: their reads hold them.
#[test]
fn workers_crowded_off_the_cpus_by_others_are_still_held_by_their_reads() {
    let crowded = |io: f64| {
        let mut job = Job::new(10).trainer(0.03, TRAINER_WAITS, blocked(reason::FUTEX));
        for pid in 101..=102 {
            job = job.worker(pid, 0.09, [0.0, io, 0.0, 0.0, 0.41, 0.0], 12_000_000).woken_by(100, pid, 120);
        }
        job.judge(&[])
    };
    let v = crowded(0.45);
    assert_eq!(v.kind, Kind::InputIoBound, "{}", v.summary);
    // Reads shorter than their own time on a CPU: CPU-bound, as before.
    let v = crowded(0.05);
    assert_eq!(v.kind, Kind::InputCpuBound, "{}", v.summary);
}

#[test]
fn input_io_bound_with_numbers() {
    let v = io_bound_job().judge(&[]);
    assert_eq!(v.kind, Kind::InputIoBound, "{v:?}");
    assert!(v.host_only);
    assert!(v.summary.contains("4 workers read 1.6 GB at 160 MB/s"), "{}", v.summary);
    // 0.85 of the 0.97 of the window the workers were accounted for.
    assert!(v.summary.contains("88% off-CPU in file reads"), "{}", v.summary);
    assert!(v.summary.contains("woken 1200 times by 4 workers (most by pid 101 ×300)"), "{}", v.summary);
    assert!(v.summary.contains("no GPU data"), "{}", v.summary);
    assert!(v.evidence.iter().any(|e| e.starts_with("file /data/rows_10")), "{:?}", v.evidence);
}

/// The same workers reading from a FUSE filesystem: nothing came from
/// storage, which says nothing of the page cache; the filesystem is named,
/// and its server, which answered their reads (woke them).
#[test]
fn input_io_bound_from_a_fuse_filesystem_names_it_and_its_server() {
    let mut job = io_bound_job();
    job.filesystem = Some("fuse.s3fs");
    for pid in 101..=104 {
        job.wakes.push(WakeSnap {
            wakee: pid,
            waker: 900,
            waker_tgid: 900,
            waker_comm: "s3fs".into(),
            count: 2000,
            blocked_ns: 8 * S,
        });
    }
    let v = job.judge(&[]);
    assert_eq!(v.kind, Kind::InputIoBound, "{v:?}");
    assert!(
        v.summary.contains(
            "4 workers read 1.6 GB at 160 MB/s (100 % from fuse.s3fs, a FUSE filesystem, served by a program in user space, not from a local disk or its page cache), the reads answered by pid 900 (s3fs), "
        ),
        "{}",
        v.summary
    );
    job = io_bound_job();
    job.filesystem = Some("nfs4");
    let v = job.judge(&[]);
    assert!(
        v.summary.contains("(100 % from nfs4, a network filesystem, not from a local disk"),
        "{}",
        v.summary
    );
    assert!(!v.summary.contains("answered by"), "{}", v.summary);
}

/// Workers that take their samples through mappings (safetensors, Arrow,
/// `torch.load(mmap=True)`) read nothing with read(): their bytes are what
/// the page cache brought in from storage for them, and the evidence names
/// the shards.
#[test]
fn input_io_bound_through_mappings_counts_what_storage_brought_in() {
    let v = mapping_io_job(200_000_000, None);
    assert_eq!(v.kind, Kind::InputIoBound, "{v:?}");
    assert!(
        v.summary.contains("4 workers read 800 MB at 80.0 MB/s (100 % from storage, page cache cold)"),
        "{}",
        v.summary
    );
    assert_shard_evidence(&v, &["200 MB in 0 reads", "through a mapping, from storage"]);
}

/// The same where faults are followed: the mapped bytes count, and where
/// they came from.
#[test]
fn input_io_bound_through_mappings_counts_the_mapped_bytes() {
    let v = mapping_io_job(150_000_000, Some(200_000_000));
    assert_eq!(v.kind, Kind::InputIoBound, "{v:?}");
    assert!(v.summary.contains("4 workers read 800 MB at 80.0 MB/s (75 % from storage)"), "{}", v.summary);
    assert_shard_evidence(&v, &["200 MB mapped", "through a mapping, 75 % from storage"]);
}

/// A trainer waiting on 4 workers that map their shards, `storage` bytes
/// each from storage, `mapped` through the mapping (None: not followed),
/// off-CPU in I/O.
fn mapping_io_job(storage: u64, mapped: Option<u64>) -> Verdict {
    let mut job = Job::new(10).trainer(0.03, TRAINER_WAITS, blocked(reason::FUTEX));
    for pid in 101..=104 {
        job = job.mapping_worker(pid, 0.1, IO_WORKER, storage, mapped).woken_by(100, pid, 300);
    }
    job.judge(&[])
}

/// Some evidence line names a shard and says each of `what`.
fn assert_shard_evidence(v: &Verdict, what: &[&str]) {
    assert!(
        v.evidence.iter().any(|e| e.starts_with("file /data/shard_10") && what.iter().all(|w| e.contains(w))),
        "{:?}",
        v.evidence
    );
}

#[test]
fn input_io_bound_names_idle_gpu() {
    let v = io_bound_job().judge(&[gpu(2.0, 10, None)]);
    assert_eq!(v.kind, Kind::InputIoBound);
    assert!(!v.host_only);
    assert!(v.summary.starts_with("GPU0 idle 100% of 10.0s."), "{}", v.summary);
}

/// Workers that decode what they map from a warm page cache: CPU-bound,
/// with what they took in through the mappings.
#[test]
fn input_cpu_bound_through_warm_mappings() {
    let mut job = Job::new(10).trainer(0.03, TRAINER_WAITS, blocked(reason::FUTEX));
    for pid in 101..=104 {
        job = job.mapping_worker(pid, 0.8, CPU_WORKER, 0, Some(50_000_000));
    }
    let v = job.judge(&[gpu(1.0, 10, None)]);
    assert_eq!(v.kind, Kind::InputCpuBound, "{v:?}");
    assert!(v.summary.contains("(read 200 MB at 20.0 MB/s)"), "{}", v.summary);
    assert!(
        v.evidence
            .iter()
            .any(|e| e.contains("50.0 MB mapped") && e.contains("through a mapping, from the page cache")),
        "{:?}",
        v.evidence
    );
}

#[test]
fn input_cpu_bound() {
    let mut job = Job::new(10).trainer(0.03, TRAINER_WAITS, blocked(reason::FUTEX));
    for pid in 101..=104 {
        job = job.worker(pid, 0.8, CPU_WORKER, 1_000_000);
    }
    let v = job.judge(&[gpu(1.0, 10, None)]);
    assert_eq!(v.kind, Kind::InputCpuBound, "{v:?}");
    assert!(v.summary.contains("on CPU 84% of the time, waiting for a CPU 11% (read"), "{}", v.summary);
}

/// The trainer wrote `bytes` to `path` (fd 4) in the window.
fn trainer_writes(job: &mut Job, path: &str, bytes: u64) {
    job.model.apply(&Event::Open {
        ts: 0,
        tid: 100,
        tgid: 100,
        fd: 4,
        file_id: 7,
        path: path.into(),
        dfd: -100,
        dup_of: None,
    });
    job.files.push(FileSnap {
        tgid: 100,
        fd: 4,
        file_id: 7,
        kind: fd_kind::REGULAR,
        counters: FileCounters { write_bytes: bytes, write_calls: bytes / 65536, ..Default::default() },
    });
}

#[test]
fn trainer_blocked_writing_and_syncing_a_checkpoint_is_output_io_bound() {
    // 20 s: 50% in fsync, 32% in write, while its workers keep up.
    let mut job = Job::new(20);
    trainer_writes(&mut job, "/ckpt/ckpt.pt.tmp", 720_000_000);
    let mut job = job.trainer(0.1, [0.03, 0.0, 0.03, 0.0, 0.02, 0.0, 0.32, 0.5], blocked(reason::SYNC));
    for pid in 101..=102 {
        job = job.worker(pid, 0.05, [0.9, 0.0, 0.0, 0.0, 0.0, 0.0], 1_000_000);
    }
    let v = job.judge(&[gpu(2.0, 20, None)]);
    assert_eq!(v.kind, Kind::OutputIoBound, "{v:?}");
    assert!(v.summary.starts_with("GPU0 "), "{}", v.summary);
    assert!(
        v.summary.contains(
            "Trainer main thread blocked 82% of 20.0s writing /ckpt/ckpt.pt.tmp (720 MB at 43.9 MB/s, 61% of it in sync)"
        ),
        "{}",
        v.summary
    );
    assert!(
        v.evidence.iter().any(|e| e.starts_with("file /ckpt/ckpt.pt.tmp: 720 MB written by pid 100")),
        "{:?}",
        v.evidence
    );
    // Without GPU data the same, said to be host-side.
    let mut job = Job::new(20);
    trainer_writes(&mut job, "/ckpt/ckpt.pt.tmp", 720_000_000);
    let v = job.trainer(0.1, [0.03, 0.0, 0.03, 0.0, 0.02, 0.0, 0.32, 0.5], blocked(reason::SYNC)).judge(&[]);
    assert_eq!(v.kind, Kind::OutputIoBound, "{v:?}");
    assert!(v.host_only);
}

#[test]
fn output_waits_below_the_input_waits_leave_the_input_verdict() {
    // 35% writing, 55% waiting for workers that read: the input comes first.
    let mut job = Job::new(10);
    trainer_writes(&mut job, "/logs/metrics.jsonl", 1_000_000);
    let mut job = job.trainer(0.05, [0.3, 0.0, 0.25, 0.0, 0.0, 0.0, 0.35, 0.0], blocked(reason::FUTEX));
    for pid in 101..=104 {
        job = job.worker(pid, 0.05, IO_WORKER, 50_000_000);
    }
    let v = job.judge(&[gpu(1.0, 10, None)]);
    assert_eq!(v.kind, Kind::InputIoBound, "{v:?}");
    // A trainer blocked in fsync alone for the whole window is writing, not
    // hung, even with nothing counted as progress in it.
    let v =
        Job::new(10).trainer(0.0, [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0], blocked(reason::SYNC)).judge(&[]);
    assert_eq!(v.kind, Kind::OutputIoBound, "{v:?}");
}

/// Workers throttled by their cgroup's CPU limit (what a Kubernetes CPU
/// limit does): input-cpu-bound, naming the limit, with on-CPU time apart
/// from the waits.
#[test]
fn workers_held_back_by_a_cpu_limit_name_the_limit() {
    use crate::cpulimit::{CpuStat, Limit, Reading};
    let mut job = Job::new(18).trainer(0.03, TRAINER_WAITS, blocked(reason::FUTEX));
    for pid in 101..=104 {
        // Runnable 85%: the kernel does not say how much of it the limit caused.
        job = job.worker(pid, 0.15, [0.0, 0.0, 0.0, 0.0, 0.85, 0.0], 1_000_000);
    }
    job.cpu_limit = Some(Reading {
        limit: Limit { cgroup: "/sys/fs/cgroup/kubepods/pod1".into(), cpus: 0.6, period_ns: 100_000_000 },
        // Both run queues throttled 75% of the 18 s.
        stat: CpuStat { periods: 180, throttled_periods: 176, throttled_ns: 27_000_000_000 },
    });
    let v = job.judge(&[gpu(1.0, 18, None)]);
    assert_eq!(v.kind, Kind::InputCpuBound, "{v:?}");
    assert!(
        v.summary.contains(
            "4 workers on CPU 15% of the time, throttled 75% (waiting for a CPU 10%): the cgroup's CPU limit (0.6 CPU, /sys/fs/cgroup/kubepods/pod1) throttled them in 98% of periods (27.0s throttled): input pipeline is CPU-bound by its CPU limit"
        ),
        "{}",
        v.summary
    );
    assert!(v.evidence.iter().any(|e| e.contains("runqueue 10%, throttled 75%")), "{:?}", v.evidence);
}

/// The trainer in the same throttled cgroup as its workers (under
/// emulation its own work per batch grows): throttled 38 %, it waits on its
/// workers for most of the rest; the limit holds the input back.
#[test]
fn a_trainer_throttled_with_its_workers_still_waits_on_them() {
    use crate::cpulimit::{CpuStat, Limit, Reading};
    //                                    futex io   poll  sleep runq  other write sync
    let mut job =
        Job::new(20).trainer(0.11, [0.0, 0.0, 0.41, 0.0, 0.48, 0.0, 0.0, 0.0], blocked(reason::POLL));
    for pid in 101..=104 {
        job = job.worker(pid, 0.12, [0.0, 0.0, 0.02, 0.0, 0.86, 0.0], 0);
    }
    job.cpu_limit = Some(Reading {
        limit: Limit { cgroup: "/sys/fs/cgroup/job".into(), cpus: 0.6, period_ns: 100_000_000 },
        // Both run queues throttled 40 % of the 20 s.
        stat: CpuStat { periods: 200, throttled_periods: 200, throttled_ns: 16_000_000_000 },
    });
    let v = job.judge(&[]);
    assert_eq!(v.kind, Kind::InputCpuBound, "{v:?}");
    assert!(v.summary.contains("the cgroup's CPU limit (0.6 CPU, /sys/fs/cgroup/job)"), "{}", v.summary);
}

#[test]
fn trainer_reading_its_own_data_is_io_bound() {
    let mut job = Job::new(10);
    job.model.apply(&Event::Open {
        ts: 0,
        tid: 100,
        tgid: 100,
        fd: 3,
        file_id: 1,
        path: "/d".into(),
        dfd: -100,
        dup_of: None,
    });
    job.files.push(FileSnap {
        tgid: 100,
        fd: 3,
        file_id: 1,
        kind: fd_kind::REGULAR,
        counters: FileCounters {
            read_bytes: 5_000_000,
            read_calls: 10,
            read_ns: 1,
            timed_calls: 1,
            ..Default::default()
        },
    });
    let v = job.trainer(0.1, [0.0, 0.85, 0.0, 0.0, 0.05, 0.0], blocked(reason::IO)).judge(&[]);
    assert_eq!(v.kind, Kind::InputIoBound, "{v:?}");
    assert!(v.summary.contains("no workers"), "{}", v.summary);
}

/// The trainer's time in file reads, where storage brought in its
/// modules (a lazy `import` at the first step), is no wait for input:
/// with only data from storage it is, with only code it is not.
#[test]
fn a_trainer_loading_its_modules_from_storage_is_not_input_bound() {
    let reading = |path: &str| {
        let mut job = Job::new(10);
        job.model.apply(&Event::Open {
            ts: 0,
            tid: 100,
            tgid: 100,
            fd: 3,
            file_id: 1,
            path: path.into(),
            dfd: -100,
            dup_of: None,
        });
        let inode = Inode { dev: 8 << 20, ino: 1 };
        job.model.set_file_kind(1, fd_kind::REGULAR);
        job.model.set_file_inode(1, inode);
        job.model.apply(&Event::Close {
            ts: 1,
            tgid: 100,
            fd: 3,
            file_id: 1,
            counters: FileCounters { read_bytes: 90_000_000, read_calls: 200, ..Default::default() },
        });
        job.inode_bytes = Some(vec![InodeSnap {
            tgid: 100,
            inode,
            storage_bytes: 90_000_000,
            mmap_bytes: 0,
            mmap_shared_bytes: 0,
        }]);
        job.trainer(0.1, [0.3, 0.55, 0.0, 0.0, 0.05, 0.0], blocked(reason::FUTEX)).judge(&[])
    };
    let data = reading("/data/train.bin");
    assert_eq!(data.kind, Kind::InputIoBound, "{data:?}");
    let code =
        reading("/opt/venv/lib/python3.11/site-packages/torch/_dynamo/__pycache__/utils.cpython-311.pyc");
    assert_ne!(code.kind, Kind::InputIoBound, "{code:?}");
}

/// The trainer's main thread in the job's CUDA calls (the GPU library
/// probes): `sync` and `copy` shares of the window, `launches` in all; it
/// logs a line every step.
fn trainer_in_cuda(on: f64, futex: f64, sync: f64, copy: f64, launches: u64) -> Verdict {
    let mut job = Job::new(10).trainer(on, [futex], blocked(reason::FUTEX)).silent(
        0.05,
        Some(0.05),
        Some(("/tmp/train.log", 0.05)),
    );
    let ns = |share: f64| (share * 10e9) as u64;
    let gpu = GpuCounters {
        sync_ns: ns(sync),
        sync_calls: 400,
        copy_ns: ns(copy),
        copy_calls: 40,
        copy_bytes: 40 * (64 << 20),
        launches,
        ..Default::default()
    };
    job.gpu_calls.push((100, gpu));
    job.judge(&[])
}

#[test]
fn a_trainer_spinning_in_cuda_synchronizations_is_gpu_busy() {
    let v = trainer_in_cuda(0.97, 0.03, 0.9, 0.0, 3200);
    assert_eq!(v.kind, Kind::GpuBusy, "{v:?}");
    assert!(
        v.summary.starts_with(
            "Trainer main thread inside CUDA synchronizations 90% of 10.0s (400 calls, spinning: on CPU 97%)"
        ),
        "{}",
        v.summary
    );
    assert_eq!(v.path[0].state, "gpu-sync");
    // Blocked in them (the blocking schedule): the same verdict.
    let v = trainer_in_cuda(0.05, 0.95, 0.9, 0.0, 3200);
    assert_eq!(v.kind, Kind::GpuBusy, "{v:?}");
    assert!(v.summary.contains("(400 calls, blocked 95%)"), "{}", v.summary);
    // Under half the window in them: not what holds the trainer.
    let v = trainer_in_cuda(0.97, 0.03, 0.3, 0.0, 3200);
    assert_eq!(v.kind, Kind::TrainerHostBound, "{v:?}");
}

#[test]
fn a_busy_trainer_launching_thousands_of_kernels_is_named_launch_bound() {
    let v = trainer_in_cuda(0.97, 0.03, 0.02, 0.0, 240_000);
    assert_eq!(v.kind, Kind::TrainerHostBound, "{v:?}");
    assert!(
        v.summary.contains("launching 24,000 GPU kernels/s, inside CUDA synchronizations 2%: the host cannot launch kernels fast enough"),
        "{}",
        v.summary
    );
    // A few launches a second are nothing to name.
    let v = trainer_in_cuda(0.97, 0.03, 0.02, 0.0, 500);
    assert!(!v.summary.contains("kernels/s"), "{}", v.summary);
}

#[test]
fn synchronous_copies_are_named_with_their_rate() {
    let v = trainer_in_cuda(0.97, 0.03, 0.0, 0.6, 0);
    assert_eq!(v.kind, Kind::TrainerHostBound, "{v:?}");
    assert!(
        v.summary.contains("inside synchronous CUDA copies 60% of 10.0s (40 copies, 2.7 GB at 447 MB/s)"),
        "{}",
        v.summary
    );
    assert_eq!(v.path[0].state, "gpu-copy");
}

#[test]
fn hang_names_blocked_threads() {
    let mut job = Job::new(6).trainer(0.001, [0.999, 0.0, 0.0, 0.0, 0.0, 0.0], blocked(reason::FUTEX));
    for pid in 101..=102 {
        job = job.worker(pid, 0.0, [0.0, 0.0, 1.0, 0.0, 0.0, 0.0], 0);
    }
    // Workers did read before the window: mark them as children that worked.
    let v = job.judge(&[gpu(0.0, 6, None)]);
    assert_eq!(v.kind, Kind::Hang, "{v:?}");
    assert!(v.summary.contains("No progress in the last 6.0s"), "{}", v.summary);
    // Blocked in futex, the call its reason is named for: said once.
    assert!(v.summary.contains(" 100 (futex") && !v.summary.contains("futex in futex"), "{}", v.summary);
    // Its idle children are no workers here: the trainer is blocked alone
    // (not "and 0 workers").
    assert!(v.summary.contains("trainer (pid 100) blocked, no file reads"), "{}", v.summary);
}

#[test]
fn workers_that_lived_part_of_the_window_are_judged_on_their_lifetime() {
    // Non-persistent workers: two epochs of two workers, each alive half
    // the window and 85% in file reads while alive.
    let mut job = Job::new(10).trainer(0.03, TRAINER_WAITS, blocked(reason::FUTEX));
    for pid in 101..=104 {
        job = job.worker(pid, 0.05, [0.0, 0.42, 0.0, 0.0, 0.01, 0.0], 100_000_000).woken_by(100, pid, 10);
    }
    let v = job.judge(&[]);
    assert_eq!(v.kind, Kind::InputIoBound, "{v:?}");
    assert!(v.summary.contains("88% off-CPU in file reads"), "{}", v.summary);
}

/// A trainer hung for the whole window under a shell script: the shell
/// reading its script's next line (as the trainer ended) is none of the
/// job's progress.
#[test]
fn what_started_the_trainer_moves_nothing_of_a_hung_job() {
    let mut job = Job::new(6).trainer(0.001, [0.999, 0.0, 0.0, 0.0, 0.0, 0.0], blocked(reason::FUTEX));
    job.model.note_process(1, None, "bash", Some("bash run.sh".into()));
    job.model.apply(&Event::Open {
        ts: 0,
        tid: 1,
        tgid: 1,
        fd: 255,
        file_id: 1,
        path: "/runs/run.sh".into(),
        dfd: -100,
        dup_of: None,
    });
    job.files.push(FileSnap {
        tgid: 1,
        fd: 255,
        file_id: 1,
        kind: fd_kind::REGULAR,
        counters: FileCounters { read_bytes: 191, read_calls: 3, ..Default::default() },
    });
    let shell = counters(6, 0.001, [0.0, 0.0, 0.0, 0.0, 0.0, 0.999], 191);
    let job =
        job.thread(1, 1, shell, ThreadNow { running: false, reason: reason::OTHER, syscall: 61, for_ns: 1 });
    // Progress counts no read of a process with no role (the shell).
    let v = job.silent(6.0, Some(0.5), None).judge(&[]);
    assert_eq!(v.kind, Kind::Hang, "{}", v.summary);
}

#[test]
fn short_stall_is_not_a_hang() {
    let v = Job::new(2).trainer(0.0, [1.0, 0.0, 0.0, 0.0, 0.0, 0.0], blocked(reason::FUTEX)).judge(&[]);
    assert_ne!(v.kind, Kind::Hang);
}

#[test]
fn woken_by_workers_is_not_a_hang() {
    let v = Job::new(6)
        .trainer(0.001, [0.999, 0.0, 0.0, 0.0, 0.0, 0.0], blocked(reason::FUTEX))
        .worker(101, 0.0, [0.0, 0.0, 1.0, 0.0, 0.0, 0.0], 0)
        .woken_by(100, 101, 40)
        .judge(&[]);
    assert_ne!(v.kind, Kind::Hang, "{v:?}");
}

/// A trainer blocked faulting its libraries in from a cold cache (an
/// import, a teardown) for the whole window moves: pages come in.
#[test]
fn blocked_on_faults_that_bring_pages_in_is_not_a_hang() {
    let mut job = Job::new(6).trainer(0.02, [0.0, 0.97, 0.0, 0.0, 0.01, 0.0], blocked(reason::IO));
    job.inode_bytes = Some(vec![InodeSnap {
        tgid: 100,
        inode: Inode { dev: 8 << 20, ino: 9 },
        storage_bytes: 3 << 20,
        mmap_bytes: 3 << 20,
        mmap_shared_bytes: 0,
    }]);
    job.mmap_known = true;
    let v = job.judge(&[]);
    assert_ne!(v.kind, Kind::Hang, "{v:?}");
    // The same without a page coming in is a hang.
    let v = Job::new(6).trainer(0.02, [0.0, 0.97, 0.0, 0.0, 0.01, 0.0], blocked(reason::IO)).judge(&[]);
    assert_eq!(v.kind, Kind::Hang, "{v:?}");
}

/// A hung trainer that rewrites a status file at each check (its truth, a
/// heartbeat) now and then reads a directory or inode block from storage:
/// a page in seconds is no progress.
#[test]
fn a_heartbeats_metadata_page_is_not_progress() {
    let hung = |storage_bytes: u64| {
        let mut job = Job::new(6)
            .trainer(0.003, [0.0, 0.0, 0.997, 0.0, 0.0, 0.0], blocked(reason::POLL))
            .worker(101, 0.0, [0.0, 0.0, 1.0, 0.0, 0.0, 0.0], 0);
        job.inode_bytes = Some(vec![InodeSnap {
            tgid: 100,
            inode: Inode { dev: 1 << 20, ino: 2 },
            storage_bytes,
            mmap_bytes: 0,
            mmap_shared_bytes: 0,
        }]);
        job.mmap_known = true;
        job.judge(&[])
    };
    let v = hung(4096);
    assert_eq!(v.kind, Kind::Hang, "{v:?}");
    // Pages coming in at an import's pace are work.
    let v = hung(4 << 20);
    assert_ne!(v.kind, Kind::Hang, "{v:?}");
}

#[test]
fn trainer_host_bound_with_and_without_gpu() {
    let job = || {
        Job::new(10).trainer(0.9, [0.05, 0.0, 0.0, 0.0, 0.05, 0.0], RUNNING).worker(
            101,
            0.01,
            [0.0, 0.0, 0.95, 0.0, 0.0, 0.0],
            100_000,
        )
    };
    let v = job().judge(&[gpu(1.0, 10, None)]);
    assert_eq!(v.kind, Kind::TrainerHostBound, "{v:?}");
    assert!(v.summary.contains("while the GPU idles"));
    let v = job().judge(&[]);
    assert_eq!(v.kind, Kind::TrainerHostBound, "{v:?}");
    assert!(v.summary.contains("busy on the host"));
    // What the workers read meanwhile, by file: the input kept up.
    assert!(
        v.summary.contains("; its worker read 100 KB meanwhile (/data/rows_101.pt 100 KB)"),
        "{}",
        v.summary
    );
}

/// Workers that map their shards while the trainer is the one busy: the
/// line gives what they read in all and names the two files that gave most.
#[test]
fn a_busy_trainer_names_the_files_its_workers_read() {
    let mut job = Job::new(10).trainer(0.9, [0.05, 0.0, 0.0, 0.0, 0.05, 0.0], RUNNING);
    for pid in 101..=104 {
        job = job.mapping_worker(pid, 0.1, [0.0, 0.0, 0.8, 0.0, 0.0, 0.0], 0, Some(64_000_000));
    }
    let v = job.judge(&[]);
    assert_eq!(v.kind, Kind::TrainerHostBound, "{v:?}");
    assert!(
        v.summary.contains("; its 4 workers read 256 MB meanwhile (/data/shard_101.safetensors 64.0 MB, /data/shard_102.safetensors 64.0 MB and 2 more files)"),
        "{}",
        v.summary
    );
}

/// A host crowded by CPU-hungry workers (the slow rank of a run on a
/// small node): the trainer waits for a CPU a good part of the time, and
/// of the rest it waits on its input more than it works.
#[test]
fn a_trainer_crowded_off_the_cpu_by_its_workers_is_input_cpu_bound() {
    let crowded = |on: f64, rq: f64, futex: f64, poll: f64| {
        Job::new(10).trainer(on, [futex, 0.0, poll, 0.0, rq, 0.0], blocked(reason::POLL)).worker(
            101,
            0.45,
            [0.0, 0.0, 0.32, 0.0, 0.23, 0.0],
            2_000_000,
        )
    };
    // On CPU 23 %, waiting for one 28 %, waiting on input 49 %: 68 % of
    // the time it could run.
    let v = crowded(0.23, 0.28, 0.23, 0.26).judge(&[]);
    assert_eq!(v.kind, Kind::InputCpuBound, "{v:?}");
    // On CPU 40 %, waiting for one 45 %, on input 15 %: it is the one busy.
    let v = crowded(0.40, 0.45, 0.05, 0.10).judge(&[]);
    assert_eq!(v.kind, Kind::TrainerHostBound, "{v:?}");
}

#[test]
fn gpu_busy_wins() {
    let v = io_bound_job().judge(&[gpu(95.0, 10, None)]);
    assert_eq!(v.kind, Kind::GpuBusy);
    assert!(v.summary.contains("GPU0 busy 95%"), "{}", v.summary);
}

#[test]
fn idle_job() {
    let v = Job::new(10).trainer(0.001, [0.0, 0.0, 0.0, 0.999, 0.0, 0.0], blocked(reason::SLEEP)).judge(&[]);
    assert_eq!(v.kind, Kind::Idle, "{v:?}");
    assert!(v.summary.contains("mostly in sleep"), "{}", v.summary);
}

#[test]
fn unknown_without_data() {
    let v = Job::new(10).judge(&[]);
    assert_eq!(v.kind, Kind::Unknown);
    let v = Job::new(0).trainer(0.5, [0.0; 6], RUNNING).judge(&[]);
    assert_eq!(v.kind, Kind::Unknown);
    assert!(v.summary.contains("not enough data"));
}

#[test]
fn nvml_sample_gaps_are_reported_and_do_not_skew_idle() {
    let g = gpu(0.0, 10, Some((3, 8)));
    assert_eq!(g.samples, 50);
    assert!((g.max_gap_s - 5.1).abs() < 0.11, "{}", g.max_gap_s);
    assert_eq!(g.idle_fraction, 1.0);
    let v = io_bound_job().judge(&[g]);
    assert_eq!(v.kind, Kind::InputIoBound);
    assert!(v.summary.contains("sample gap 5.1s"), "{}", v.summary);
    let none = gpu_window(1, "x", &[], 0, 10 * S);
    assert_eq!((none.samples, none.util_mean_pct), (0, 0.0));
}

#[test]
fn lost_events_mark_the_verdict_partial() {
    let mut job = io_bound_job();
    job.lost = [3, 0, 0, 0, 0, 0, 0, 0];
    let v = job.judge(&[]);
    assert!(v.summary.contains("partial"), "{}", v.summary);
    assert!(v.evidence.iter().any(|e| e.contains("3 events lost")));
}

#[test]
fn a_busy_gpu_at_low_power_behind_a_silent_job_is_a_hang() {
    // The DFlash incident: the log stopped 8 minutes ago, the trainer sits
    // in futex, NVML says 100 %.
    let v = futex_trainer(10)
        .silent(480.0, Some(2.0), Some(("/runs/dflash/train.log", 480.0)))
        .judge(&[gpu_at_power(100.0, 10, 95.0)]);
    assert_eq!(v.kind, Kind::Hang, "{v:?}");
    for want in [
        "reports 100% busy at 95 W of 700 W",
        "nothing progressed for 8 min",
        "train.log last written 8 min ago",
        "futex 100%",
    ] {
        assert!(v.summary.contains(want), "{want:?} not in {}", v.summary);
    }
    assert!(v.evidence.iter().any(|e| e.contains("train.log")), "{:?}", v.evidence);
}

#[test]
fn a_busy_gpu_at_high_power_is_working_however_silent() {
    // A long step, or an evaluation: the GPU draws real power.
    let v = futex_trainer(10).silent(120.0, Some(3.0), None).judge(&[gpu_at_power(100.0, 10, 640.0)]);
    assert_eq!(v.kind, Kind::GpuBusy, "{v:?}");
    assert!(v.summary.contains("at 640 W of 700 W: no input stall"), "{}", v.summary);
}

#[test]
fn silence_within_the_jobs_own_rhythm_is_not_a_hang() {
    // Logs every 5 s, waits on the GPU in between; 8 s of silence is within
    // three of its gaps, even at unknown power.
    let v = futex_trainer(10)
        .silent(8.0, Some(5.0), Some(("/runs/train.log", 8.0)))
        .judge(&[gpu(99.0, 10, None)]);
    assert_eq!(v.kind, Kind::GpuBusy, "{v:?}");
    // Five gaps' worth is not.
    let v = futex_trainer(10)
        .silent(25.0, Some(5.0), Some(("/runs/train.log", 25.0)))
        .judge(&[gpu(99.0, 10, None)]);
    assert_eq!(v.kind, Kind::Hang, "{v:?}");
    assert!(v.summary.contains("it used to move at least every 5 s"), "{}", v.summary);
}

#[test]
fn a_job_never_seen_to_move_needs_a_long_silence_behind_a_busy_gpu() {
    let v = futex_trainer(30).never_moved().judge(&[gpu(99.0, 30, None)]);
    assert_eq!(v.kind, Kind::GpuBusy, "{v:?}");
    let v = futex_trainer(70).never_moved().judge(&[gpu(99.0, 70, None)]);
    assert_eq!(v.kind, Kind::Hang, "{v:?}");
}

#[test]
fn a_busy_gpu_at_low_power_is_called_out_while_the_job_moves() {
    let v = io_bound_job().judge(&[gpu_at_power(100.0, 10, 80.0)]);
    assert_eq!(v.kind, Kind::GpuBusy, "{v:?}");
    assert!(v.summary.contains("barely computing"), "{}", v.summary);
}

#[test]
fn a_line_written_within_the_jobs_rhythm_is_never_a_hang() {
    // Everyone blocked, nothing read, the GPU idle, but a line every 2 s,
    // the last one 1 s ago: the job moves at its own pace.
    let v = futex_trainer(6)
        .printed(120)
        .silent(1.0, Some(2.0), Some(("/runs/train.log", 1.0)))
        .judge(&[gpu(0.0, 6, None)]);
    assert_ne!(v.kind, Kind::Hang, "{v:?}");
    assert!(!v.summary.contains("hung"), "{}", v.summary);
    // The same lines, the last of them three rhythms ago: it stopped.
    let v = futex_trainer(6)
        .printed(120)
        .silent(7.0, Some(2.0), Some(("/runs/train.log", 7.0)))
        .judge(&[gpu(0.0, 6, None)]);
    assert_eq!(v.kind, Kind::Hang, "{v:?}");
    assert!(v.summary.contains("train.log last written 7 s ago"), "{}", v.summary);
}

#[test]
fn the_evidence_names_data_files_not_the_interpreters_modules() {
    for code in [
        "/usr/lib/python3.11/__pycache__/threading.cpython-311.pyc",
        "/opt/venv/lib/python3.11/site-packages/torch/_meta_registrations.py",
        "/opt/venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/etc/ld.so.cache",
    ] {
        assert!(is_code_file(code), "{code}");
    }
    for data in ["/data/shard_0001.arrow", "/mnt/ds/train-00001-of-00064.parquet", "/ckpt/model.safetensors"]
    {
        assert!(!is_code_file(data), "{data}");
    }
}
