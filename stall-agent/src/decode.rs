//! Kernel records → plain values: ring-buffer events and map snapshots in
//! the form the (pure) aggregation consumes. Nothing here touches the kernel.
use stall_common::{
    counter, event_kind, kclock, reason, run_state, CloseEvent, EventHeader, ExecEvent, ExitEvent, FdKey,
    FileStats, NewTaskEvent, OpenEvent, SwitchEvent, ThreadStats, COMM_LEN,
};

/// Per-thread counters, cumulative since the thread became tracked, with the
/// span in progress at snapshot time folded in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThreadCounters {
    pub on_cpu_ns: u64,
    pub off_ns: [u64; reason::COUNT],
    pub file_read_bytes: u64,
    pub file_read_calls: u64,
    pub other_read_bytes: u64,
    pub other_read_calls: u64,
    /// Successful writes to files (logs, checkpoints), to anything else
    /// (pipes, sockets, ttys), and to fd 1 or 2 whatever they are (these
    /// are also in one of the two before): progress signals.
    pub file_write_bytes: u64,
    pub file_write_calls: u64,
    pub other_write_bytes: u64,
    pub other_write_calls: u64,
    pub stdio_write_bytes: u64,
    pub wakeups: u64,
    /// Its calls into the job's GPU libraries.
    pub gpu: GpuCounters,
}

/// A thread's calls into the job's GPU libraries (uprobes on CUDA): its
/// time inside the calls that wait for the GPU, and its kernel launches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuCounters {
    pub sync_ns: u64,
    pub sync_calls: u64,
    pub copy_ns: u64,
    pub copy_calls: u64,
    pub copy_bytes: u64,
    pub launches: u64,
}

impl GpuCounters {
    /// A `GPU_CALLS` entry, with the call in progress at `now` counted so
    /// far (a thread stuck in a synchronization shows it).
    pub fn of(c: &stall_common::GpuCalls, now: u64) -> Self {
        let mut g = Self {
            sync_ns: c.sync_ns,
            sync_calls: c.sync_calls,
            copy_ns: c.copy_ns,
            copy_calls: c.copy_calls,
            copy_bytes: c.copy_bytes,
            launches: c.launches,
        };
        if c.depth > 0 && c.since != 0 {
            let so_far = now.saturating_sub(c.since);
            if c.kind == stall_common::gpu_call::COPY {
                g.copy_ns += so_far;
            } else {
                g.sync_ns += so_far;
            }
        }
        g
    }

    pub fn saturating_sub(&self, o: &Self) -> Self {
        Self {
            sync_ns: self.sync_ns.saturating_sub(o.sync_ns),
            sync_calls: self.sync_calls.saturating_sub(o.sync_calls),
            copy_ns: self.copy_ns.saturating_sub(o.copy_ns),
            copy_calls: self.copy_calls.saturating_sub(o.copy_calls),
            copy_bytes: self.copy_bytes.saturating_sub(o.copy_bytes),
            launches: self.launches.saturating_sub(o.launches),
        }
    }

    pub fn add(&mut self, o: &Self) {
        self.sync_ns += o.sync_ns;
        self.sync_calls += o.sync_calls;
        self.copy_ns += o.copy_ns;
        self.copy_calls += o.copy_calls;
        self.copy_bytes += o.copy_bytes;
        self.launches += o.launches;
    }

    pub fn any(&self) -> bool {
        *self != Self::default()
    }
}

impl ThreadCounters {
    pub fn saturating_sub(&self, o: &Self) -> Self {
        let mut off = [0; reason::COUNT];
        for (i, v) in off.iter_mut().enumerate() {
            *v = self.off_ns[i].saturating_sub(o.off_ns[i]);
        }
        Self {
            on_cpu_ns: self.on_cpu_ns.saturating_sub(o.on_cpu_ns),
            off_ns: off,
            file_read_bytes: self.file_read_bytes.saturating_sub(o.file_read_bytes),
            file_read_calls: self.file_read_calls.saturating_sub(o.file_read_calls),
            other_read_bytes: self.other_read_bytes.saturating_sub(o.other_read_bytes),
            other_read_calls: self.other_read_calls.saturating_sub(o.other_read_calls),
            file_write_bytes: self.file_write_bytes.saturating_sub(o.file_write_bytes),
            file_write_calls: self.file_write_calls.saturating_sub(o.file_write_calls),
            other_write_bytes: self.other_write_bytes.saturating_sub(o.other_write_bytes),
            other_write_calls: self.other_write_calls.saturating_sub(o.other_write_calls),
            stdio_write_bytes: self.stdio_write_bytes.saturating_sub(o.stdio_write_bytes),
            wakeups: self.wakeups.saturating_sub(o.wakeups),
            gpu: self.gpu.saturating_sub(&o.gpu),
        }
    }

    pub fn add(&mut self, o: &Self) {
        self.on_cpu_ns += o.on_cpu_ns;
        for (a, b) in self.off_ns.iter_mut().zip(o.off_ns) {
            *a += b;
        }
        self.file_read_bytes += o.file_read_bytes;
        self.file_read_calls += o.file_read_calls;
        self.other_read_bytes += o.other_read_bytes;
        self.other_read_calls += o.other_read_calls;
        self.file_write_bytes += o.file_write_bytes;
        self.file_write_calls += o.file_write_calls;
        self.other_write_bytes += o.other_write_bytes;
        self.other_write_calls += o.other_write_calls;
        self.stdio_write_bytes += o.stdio_write_bytes;
        self.wakeups += o.wakeups;
        self.gpu.add(&o.gpu);
    }

    pub fn off_cpu_ns(&self) -> u64 {
        self.off_ns.iter().sum()
    }
}

/// What a thread is doing at snapshot time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThreadNow {
    pub running: bool,
    /// Wait reason when off-CPU (see `stall_common::reason`).
    pub reason: u8,
    /// Syscall at switch-out (-1: none).
    pub syscall: i32,
    /// How long it has been in that state, ns.
    pub for_ns: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileCounters {
    pub read_bytes: u64,
    pub read_calls: u64,
    /// Time in the timed reads, and how many were timed.
    pub read_ns: u64,
    pub timed_calls: u64,
    /// Successful writes on this descriptor (a log, a checkpoint).
    pub write_bytes: u64,
    pub write_calls: u64,
}

impl FileCounters {
    /// What was counted since `o` (an earlier value of the same counters).
    pub fn saturating_sub(&self, o: &Self) -> Self {
        Self {
            read_bytes: self.read_bytes.saturating_sub(o.read_bytes),
            read_calls: self.read_calls.saturating_sub(o.read_calls),
            read_ns: self.read_ns.saturating_sub(o.read_ns),
            timed_calls: self.timed_calls.saturating_sub(o.timed_calls),
            write_bytes: self.write_bytes.saturating_sub(o.write_bytes),
            write_calls: self.write_calls.saturating_sub(o.write_calls),
        }
    }
}

impl From<&FileStats> for FileCounters {
    fn from(s: &FileStats) -> Self {
        Self {
            read_bytes: s.read_bytes,
            read_calls: s.read_calls,
            read_ns: s.read_ns,
            timed_calls: s.timed_calls,
            write_bytes: s.write_bytes,
            write_calls: s.write_calls,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Open {
        ts: u64,
        tid: u32,
        tgid: u32,
        fd: i32,
        file_id: u64,
        path: String,
        dfd: i32,
        /// A dup of this descriptor (`path` is empty: the same open).
        dup_of: Option<i32>,
    },
    /// An inet socket connected: followed per descriptor like a file, its
    /// traffic named by the peer ("10.0.0.5:443", "[::1]:8000").
    Connect {
        ts: u64,
        tgid: u32,
        fd: i32,
        file_id: u64,
        peer: String,
    },
    NewTask {
        ts: u64,
        parent_tid: u32,
        parent_tgid: u32,
        child_tid: u32,
        child_tgid: u32,
        comm: String,
    },
    Exec {
        ts: u64,
        tid: u32,
        tgid: u32,
        comm: String,
    },
    Exit {
        ts: u64,
        tid: u32,
        tgid: u32,
        comm: String,
        counters: ThreadCounters,
        other_nr: i32,
    },
    Close {
        ts: u64,
        tgid: u32,
        fd: i32,
        file_id: u64,
        counters: FileCounters,
    },
    /// Only with `--timeline`: not part of the model.
    Switch(Switch),
}

/// One context switch of a traced thread, from the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Switch {
    pub ts: u64,
    pub tid: u32,
    pub tgid: u32,
    /// Switched in (else out).
    pub on: bool,
    /// Out: why it left the CPU (`stall_common::reason`), and the syscall
    /// it is in (-1: none).
    pub reason: u8,
    pub nr: i32,
    /// In: when it was woken (0: it was preempted, or not seen).
    pub wake_ts: u64,
    /// The kernel's on-CPU total of the thread as of the switch (0: none).
    pub exec_ns: u64,
}

/// An event and the job (attach target, daemon cgroup) it belongs to.
pub type JobEvent = (u32, Event);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("ring-buffer record of {0} bytes is too short")]
    Short(usize),
    #[error("unknown ring-buffer record kind {0}")]
    Kind(u32),
}

fn read<T: Copy>(buf: &[u8]) -> Result<T, DecodeError> {
    if buf.len() < size_of::<T>() {
        return Err(DecodeError::Short(buf.len()));
    }
    // SAFETY: length checked; T is a repr(C) plain-data type from stall-common.
    Ok(unsafe { std::ptr::read_unaligned(buf.as_ptr().cast::<T>()) })
}

/// The name of waker 0: a wakeup made in interrupt context (a device, a
/// timer, the network), which the kernel side gives to no task.
pub const KERNEL_WAKER: &str = "[interrupt]";

pub fn comm(raw: &[u8; COMM_LEN]) -> String {
    let end = raw.iter().position(|b| *b == 0).unwrap_or(COMM_LEN);
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

pub fn decode(buf: &[u8]) -> Result<JobEvent, DecodeError> {
    let hdr: EventHeader = read(buf)?;
    let event = match hdr.kind {
        event_kind::OPEN => {
            let e: OpenEvent = read(buf)?;
            let n = usize::try_from(e.path_len).unwrap_or(0).min(e.path.len());
            let end = e.path[..n].iter().position(|b| *b == 0).unwrap_or(n);
            Event::Open {
                ts: hdr.ts,
                tid: hdr.tid,
                tgid: hdr.tgid,
                fd: e.fd,
                file_id: e.file_id,
                path: String::from_utf8_lossy(&e.path[..end]).into_owned(),
                dfd: e.dfd,
                dup_of: (e.dup_of >= 0).then_some(e.dup_of),
            }
        }
        event_kind::CONNECT => {
            let e: OpenEvent = read(buf)?;
            let n = usize::try_from(e.path_len).unwrap_or(0).min(e.path.len());
            Event::Connect {
                ts: hdr.ts,
                tgid: hdr.tgid,
                fd: e.fd,
                file_id: e.file_id,
                peer: peer_of(&e.path[..n]).unwrap_or_else(|| "unknown peer".into()),
            }
        }
        event_kind::NEWTASK => {
            let e: NewTaskEvent = read(buf)?;
            Event::NewTask {
                ts: hdr.ts,
                parent_tid: hdr.tid,
                parent_tgid: hdr.tgid,
                child_tid: e.child_tid,
                child_tgid: e.child_tgid,
                comm: comm(&e.comm),
            }
        }
        event_kind::EXEC => {
            let e: ExecEvent = read(buf)?;
            Event::Exec { ts: hdr.ts, tid: hdr.tid, tgid: hdr.tgid, comm: comm(&e.comm) }
        }
        event_kind::EXIT => {
            let e: ExitEvent = read(buf)?;
            Event::Exit {
                ts: hdr.ts,
                tid: hdr.tid,
                tgid: hdr.tgid,
                comm: comm(&e.comm),
                counters: fold(&e.stats, hdr.ts).0,
                other_nr: e.stats.other_nr,
            }
        }
        event_kind::CLOSE => {
            let e: CloseEvent = read(buf)?;
            Event::Close {
                ts: hdr.ts,
                tgid: hdr.tgid,
                fd: e.fd,
                file_id: e.stats.file_id,
                counters: FileCounters::from(&e.stats),
            }
        }
        event_kind::SWITCH => {
            let e: SwitchEvent = read(buf)?;
            Event::Switch(Switch {
                ts: hdr.ts,
                tid: hdr.tid,
                tgid: hdr.tgid,
                on: e.on != 0,
                reason: e.reason,
                nr: e.nr,
                wake_ts: e.wake_ts,
                exec_ns: e.exec_ns,
            })
        }
        k => return Err(DecodeError::Kind(k)),
    };
    Ok((hdr.job, event))
}

/// The kernel's counters plus the span in progress at `now` (a thread that
/// has been blocked since before attach has no finished span at all).
///
/// On-CPU time is the kernel's own (`se.sum_exec_runtime` since tracking
/// began, see `stall_common::kclock`) where the entry carries it: a switch
/// the programs missed then costs nothing once the next one is seen. The
/// off-CPU reasons are stall's, from the switches, the wakeups and what
/// each blocked in (a span whose switch-in was never delivered is split
/// with the kernel's counters in the kernel side, `SCHED_REPAIRED`).
/// A woken thread's runqueue time is from its enqueue to its switch-in, as
/// the kernel's `run_delay` counts it, where the switch-in can read that
/// (`task_flags::QUEUED_AT`: the span is split then, and a woken thread
/// still waiting counts as blocked until it runs); else from its wakeup
/// (`sched_waking`), which also counts the wakeup's delivery.
pub fn fold(s: &ThreadStats, now: u64) -> (ThreadCounters, ThreadNow) {
    let rq = usize::from(reason::RUNQUEUE);
    let mut c = ThreadCounters {
        on_cpu_ns: s.on_cpu_ns,
        off_ns: s.off_ns,
        file_read_bytes: s.file_read_bytes,
        file_read_calls: s.file_read_calls,
        other_read_bytes: s.other_read_bytes,
        other_read_calls: s.other_read_calls,
        file_write_bytes: s.file_write_bytes,
        file_write_calls: s.file_write_calls,
        other_write_bytes: s.other_write_bytes,
        other_write_calls: s.other_write_calls,
        stdio_write_bytes: s.stdio_write_bytes,
        wakeups: s.wakeups,
        gpu: GpuCounters::default(),
    };
    if s.kclock & kclock::EXEC != 0 {
        c.on_cpu_ns = s.exec_ns.saturating_sub(s.exec_base);
    }
    let since = now.saturating_sub(s.last_ts);
    let mut state = ThreadNow { running: false, reason: s.off_reason, syscall: s.off_nr, for_ns: since };
    match s.state {
        run_state::RUNNING => {
            c.on_cpu_ns += since;
            state.running = true;
        }
        run_state::OFF => {
            let r = usize::from(s.off_reason).min(reason::COUNT - 1);
            if s.off_reason != reason::RUNQUEUE && s.wake_ts >= s.last_ts && s.wake_ts != 0 {
                let blocked = s.wake_ts - s.last_ts;
                c.off_ns[r] += blocked.min(since);
                c.off_ns[rq] += since.saturating_sub(blocked);
            } else {
                c.off_ns[r] += since;
            }
        }
        _ => state.for_ns = 0,
    }
    (c, state)
}

/// "address:port" of a `sockaddr_in` or `sockaddr_in6` as the task passed
/// it to connect (family in host order, port and address in network order).
pub fn peer_of(sockaddr: &[u8]) -> Option<String> {
    let family = u16::from_ne_bytes(sockaddr.get(..2)?.try_into().ok()?);
    let port = u16::from_be_bytes(sockaddr.get(2..4)?.try_into().ok()?);
    match family {
        2 => {
            let a: [u8; 4] = sockaddr.get(4..8)?.try_into().ok()?;
            Some(format!("{}:{port}", std::net::Ipv4Addr::from(a)))
        }
        10 => {
            let a: [u8; 16] = sockaddr.get(8..24)?.try_into().ok()?;
            let ip = std::net::Ipv6Addr::from(a);
            Some(match ip.to_ipv4_mapped() {
                Some(v4) => format!("{v4}:{port}"),
                None => format!("[{ip}]:{port}"),
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
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
    fn fold_adds_span_in_progress() {
        let running =
            ThreadStats { state: run_state::RUNNING, last_ts: 100, on_cpu_ns: 7, ..Default::default() };
        let (c, n) = fold(&running, 150);
        assert_eq!(c.on_cpu_ns, 57);
        assert!(n.running);

        let blocked = ThreadStats {
            state: run_state::OFF,
            off_reason: reason::FUTEX,
            last_ts: 100,
            ..Default::default()
        };
        let (c, n) = fold(&blocked, 1100);
        assert_eq!(c.off_ns[reason::FUTEX as usize], 1000);
        assert_eq!(n.for_ns, 1000);

        // Woken at 400, still waiting for a CPU at 500.
        let woken = ThreadStats { wake_ts: 400, ..blocked };
        let (c, _) = fold(&woken, 500);
        assert_eq!(c.off_ns[reason::FUTEX as usize], 300);
        assert_eq!(c.off_ns[reason::RUNQUEUE as usize], 100);

        // Woken at a time not read (the switch-in will split the span):
        // blocked until it runs.
        let untimed = ThreadStats { wake_ts: stall_common::WOKEN_UNTIMED, ..blocked };
        let (c, _) = fold(&untimed, 500);
        assert_eq!(c.off_ns[reason::FUTEX as usize], 400);
        assert_eq!(c.off_ns[reason::RUNQUEUE as usize], 0);
    }

    #[test]
    fn kernel_on_cpu_wins_over_missed_switches() {
        let rq = reason::RUNQUEUE as usize;
        // stall's own sums missed a slice (on-CPU 7); the kernel says 1000
        // on-CPU since tracking began (at 5000). Runqueue time is stall's.
        let mut off_ns = [0; reason::COUNT];
        off_ns[rq] = 90;
        let t = ThreadStats {
            state: run_state::RUNNING,
            last_ts: 100,
            on_cpu_ns: 7,
            off_ns,
            kclock: kclock::EXEC | kclock::DELAY,
            exec_base: 5000,
            exec_ns: 6000,
            delay_base: 100,
            delay_ns: 400,
            rq_at_out: 50,
            ..Default::default()
        };
        let (c, _) = fold(&t, 150);
        assert_eq!(c.on_cpu_ns, 1000 + 50);
        assert_eq!(c.off_ns[rq], 90);
        // Without them (an entry nobody could read them for): stall's own.
        let (c, _) = fold(&ThreadStats { kclock: 0, ..t }, 150);
        assert_eq!((c.on_cpu_ns, c.off_ns[rq]), (57, 90));
    }
}

/// One read of the kernel maps.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// CLOCK_MONOTONIC ns, the clock of every kernel timestamp.
    pub ts: u64,
    pub threads: Vec<ThreadSnap>,
    pub files: Vec<FileSnap>,
    pub wakes: Vec<WakeSnap>,
    /// How long each process was blocked reading or writing each of its
    /// descriptors, cumulative.
    pub fd_waits: Vec<FdWaitSnap>,
    /// Losses by cause (`stall_common::counter::LOST_NAMES`), cumulative.
    pub lost: [u64; counter::LOST_CAUSES],
    /// Events handled in the kernel for tracked threads, cumulative.
    pub events: u64,
    /// Switches that did not match the state before (see
    /// `stall_common::counter::SCHED_GAPS`), cumulative.
    pub sched_gaps: u64,
    /// Switches the tracepoint never delivered, repaired from the kernel's
    /// counters (see `stall_common::counter::SCHED_REPAIRED`), cumulative.
    pub sched_repaired: u64,
    /// What each process took of each file outside its read calls, per
    /// file, cumulative; None where the kernel does not let stall see
    /// page-cache fills.
    pub inode_bytes: Option<Vec<InodeSnap>>,
    /// Whether the kernel side follows faults on mappings here (else
    /// `InodeSnap::mmap_bytes` stays 0 and means nothing).
    pub mmap_known: bool,
    /// Per thread that called into the job's GPU libraries, by tid,
    /// cumulative; kept after the thread ends, until its entry is freed.
    pub gpu_calls: Vec<(u32, GpuCounters)>,
}

/// A file as the page cache knows it: the kernel's device number (major
/// << 20 | minor) and inode number.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Inode {
    pub dev: u32,
    pub ino: u64,
}

impl Inode {
    /// From `stat`'s `st_dev` (glibc's encoding) and `st_ino`.
    pub fn from_stat(st_dev: u64, st_ino: u64) -> Self {
        let (major, minor) = (libc::major(st_dev), libc::minor(st_dev));
        Self { dev: (major << 20) | (minor & 0xf_ffff), ino: st_ino }
    }
}

/// What one process took of one file outside its read calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InodeSnap {
    pub tgid: u32,
    pub inode: Inode,
    /// Bytes it caused to be read from storage.
    pub storage_bytes: u64,
    /// Bytes its faults mapped into it.
    pub mmap_bytes: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThreadSnap {
    pub tid: u32,
    pub tgid: u32,
    pub job: u32,
    pub counters: ThreadCounters,
    pub now: ThreadNow,
    pub other_nr: i32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileSnap {
    pub tgid: u32,
    pub fd: i32,
    pub file_id: u64,
    pub kind: u32,
    pub counters: FileCounters,
}

impl FileSnap {
    /// A `FILES` entry as read from the map.
    pub fn of(k: &FdKey, s: &FileStats) -> Self {
        Self { tgid: k.tgid, fd: k.fd, file_id: s.file_id, kind: s.kind, counters: s.into() }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WakeSnap {
    pub wakee: u32,
    pub waker: u32,
    pub waker_tgid: u32,
    pub waker_comm: String,
    pub count: u64,
    /// The wakee's blocked time that this waker's wakeups ended (ns).
    pub blocked_ns: u64,
}

/// Blocked time of one process in reads and writes of one descriptor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FdWaitSnap {
    pub tgid: u32,
    pub fd: i32,
    pub blocked_ns: u64,
}

impl Snapshot {
    /// The part that belongs to one job (cgroup mode): its threads, their
    /// processes' descriptors and the wakeups of its threads. Node-wide
    /// totals (losses, events) stay with the whole snapshot.
    pub fn of_job(&self, job: u32) -> Snapshot {
        let threads: Vec<ThreadSnap> = self.threads.iter().filter(|t| t.job == job).copied().collect();
        let tgids: std::collections::HashSet<u32> = threads.iter().map(|t| t.tgid).collect();
        let tids: std::collections::HashSet<u32> = threads.iter().map(|t| t.tid).collect();
        Snapshot {
            ts: self.ts,
            files: self.files.iter().filter(|f| tgids.contains(&f.tgid)).copied().collect(),
            wakes: self.wakes.iter().filter(|w| tids.contains(&w.wakee)).cloned().collect(),
            fd_waits: self.fd_waits.iter().filter(|f| tgids.contains(&f.tgid)).copied().collect(),
            threads,
            ..Default::default()
        }
    }
}
