//! JSON Lines, schema 3 (docs/JSON.md): one `interval` record per interval,
//! one `summary` at the end. Bytes are integers, times are seconds.
use serde::Serialize;
use stall_common::{counter, reason};

use super::View;
use crate::{
    aggregate::{ProcWindow, ThreadWindow},
    decode::ThreadCounters,
    detail::{Command, EnvValue, Name, PathName, Peer, Text},
    gpu::GpuWindow,
    progress::ProgressView,
    verdict::Verdict,
    wait::WaitObject,
};

pub const SCHEMA: u32 = 3;

#[derive(Serialize)]
pub struct Record<'a> {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub schema: u32,
    pub target: &'a str,
    /// Seconds since tracing started, at the end of this record's window.
    pub elapsed_s: f64,
    pub duration_s: f64,
    pub lost_events: u64,
    pub lost_by_cause: std::collections::BTreeMap<&'static str, u64>,
    pub partial: bool,
    /// Context switches the kernel side missed so far (0 expected): their
    /// spans are not in the on/off-CPU figures.
    pub sched_gaps: u64,
    /// Switches the tracepoint never delivered, repaired exactly from the
    /// kernel's own counters (nothing lost; some kernels do not trace every
    /// switch).
    pub sched_repaired: u64,
    pub gpu_available: bool,
    /// The distributed run the job's ranks belong to (null: not a run).
    pub run_id: Option<EnvValue>,
    /// The CPU limits capping the job's processes, and their throttling in
    /// the window.
    pub cpu_limits: Vec<CpuLimit<'a>>,
    pub processes: Vec<Process>,
    pub gpus: &'a [GpuWindow],
    /// When the job last moved (reads, writes) and its newest output.
    pub progress: &'a ProgressView,
    /// Summary only: seconds of startup before the input pipeline started,
    /// when the verdict is on the steady state after it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub startup_s: Option<f64>,
    /// Summary only: how the syscalls were hooked, `trampoline` or `tracepoint`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub syscall_backend: Option<&'static str>,
    /// Summary only: how a returning syscall's registers were read
    /// (`cast`: plain loads through `bpf_rdonly_cast`; `probe`:
    /// `bpf_probe_read_kernel`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub syscall_reads: Option<&'static str>,
    /// Summary only: which CUDA libraries the GPU library probes went on,
    /// in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_probes: Option<&'a str>,
    /// Summary only: how faults on file mappings were followed
    /// (`tracepoint`, `trampoline`, or `none`: `mmap_bytes` null).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mmap_hooks: Option<&'static str>,
    /// Summary only: how `sched_switch` read the task going off-CPU
    /// (`direct`: plain loads through its BTF pointer; `probe`,
    /// `probe-stack`: `bpf_probe_read_kernel`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub switch_reads: Option<&'static str>,
    /// Summary of `stall run` only: the command's exit status, shell-style
    /// (128 + N: killed by signal N); null while it goes on running.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<Option<i32>>,
    /// Summary only: blocked threads whose /proc/PID/task/TID/syscall could
    /// not be read at the start (their reason then is a guess); absent if none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unreadable_threads: Option<u32>,
    /// Summary only: each time the trainers changed while tracing, and
    /// why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role_changes: Option<&'a [crate::correlate::RoleChange]>,
    pub verdict: &'a Verdict,
}

#[derive(Serialize)]
pub struct CpuLimit<'a> {
    pub cgroup: &'a str,
    pub cpu_limit_cpus: f64,
    pub periods: u64,
    pub throttled_periods: u64,
    pub throttled_s: f64,
}

#[derive(Serialize)]
pub struct OffCpu {
    pub futex: f64,
    pub io: f64,
    pub poll: f64,
    pub sleep: f64,
    pub runqueue: f64,
    pub other: f64,
    pub write: f64,
    pub sync: f64,
    pub throttled: f64,
    /// Blocked writing a pipe or socket (its reader or peer slow to take it).
    pub send: f64,
}

impl From<&ThreadCounters> for OffCpu {
    fn from(c: &ThreadCounters) -> Self {
        let s = |r: u8| c.off_ns[usize::from(r)] as f64 / 1e9;
        Self {
            futex: s(reason::FUTEX),
            io: s(reason::IO),
            poll: s(reason::POLL),
            sleep: s(reason::SLEEP),
            runqueue: s(reason::RUNQUEUE),
            other: s(reason::OTHER),
            write: s(reason::WRITE),
            sync: s(reason::SYNC),
            throttled: s(reason::THROTTLED),
            send: s(reason::SEND),
        }
    }
}

#[derive(Serialize)]
pub struct Process {
    pub pid: u32,
    pub ppid: Option<u32>,
    pub comm: Name,
    pub cmdline: Option<Command>,
    pub role: &'static str,
    /// The rank of a distributed run it works for (its trainer's; null: not a run).
    pub rank: Option<u32>,
    /// Where its rank was found, for a rank's trainer (null otherwise).
    pub rank_from: Option<crate::rank::Found>,
    /// The cgroup capping its CPU (one of `cpu_limits`; null: none).
    pub cpu_limit_cgroup: Option<String>,
    pub alive: bool,
    pub read_bytes: u64,
    pub read_calls: u64,
    pub files_opened: u64,
    /// Bytes read from pipes, sockets and other non-files (never file throughput).
    pub ipc_read_bytes: u64,
    /// Bytes it caused to be read from storage, any file (null: this kernel
    /// does not show page-cache fills).
    pub storage_bytes: Option<u64>,
    /// Bytes of files its faults mapped into it (pages touched through
    /// memory mappings, from the page cache or storage), any file; not in
    /// `read_bytes` (null: this kernel does not show them); where two
    /// processes got the same pages mapped, the first's.
    pub mmap_bytes: Option<u64>,
    /// Bytes its faults mapped that another process of the job got mapped
    /// just before (counted in that one's `mmap_bytes`, not here).
    pub mmap_shared_bytes: Option<u64>,
    /// Bytes written to regular files, to anything else, and to stdout or
    /// stderr whatever they are (also in one of the two before).
    pub file_write_bytes: u64,
    pub other_write_bytes: u64,
    pub stdio_write_bytes: u64,
    pub on_cpu_s: f64,
    pub off_cpu_s: f64,
    pub off_cpu_by_reason: OffCpu,
    pub threads: Vec<Thread>,
    pub files: Vec<File>,
    /// The inet sockets it connected, per peer.
    pub sockets: Vec<Socket>,
    /// How long its threads were blocked reading or writing each
    /// descriptor, longest first.
    pub blocked_on_fds: Vec<FdWait>,
}

#[derive(Serialize)]
pub struct FdWait {
    pub fd: i32,
    /// The path or peer it was opened on, where stall saw it opened.
    pub object: Option<PathName>,
    pub blocked_s: f64,
}

#[derive(Serialize)]
pub struct Socket {
    /// "address:port" it connected to.
    pub peer: Peer,
    /// The peer is a process of the job (IPC), not a source of input.
    pub ipc: bool,
    pub read_bytes: u64,
    pub read_calls: u64,
    pub write_bytes: u64,
    pub write_calls: u64,
    /// Connections to it in the window (one open at attach counts).
    pub connects: u64,
    /// Time in reads of it, estimated from the timed ones.
    pub wait_s: f64,
}

#[derive(Serialize)]
pub struct Thread {
    pub tid: u32,
    pub comm: Name,
    pub on_cpu_s: f64,
    pub off_cpu_s: f64,
    pub off_cpu_by_reason: OffCpu,
    pub read_bytes: u64,
    pub read_calls: u64,
    /// Successful writes to regular files, to anything else (pipes,
    /// sockets, ttys), and to fd 1/2 whatever they are (also in one of the
    /// two): progress signals.
    pub file_write_bytes: u64,
    pub other_write_bytes: u64,
    pub stdio_write_bytes: u64,
    pub state: &'static str,
    pub woken_by: Vec<Waker>,
    /// What it was last seen blocked on, where /proc could say (null: no
    /// object, or never seen blocked in a call that has one).
    pub waits_on: Option<WaitsOn>,
    /// Its calls into the job's CUDA libraries (null: none seen).
    pub gpu_calls: Option<GpuCalls>,
}

#[derive(Serialize)]
pub struct GpuCalls {
    /// Time inside the synchronizations (stream, device, event, context),
    /// whether the thread spun, yielded or slept in them, and their count.
    pub sync_s: f64,
    pub sync_calls: u64,
    /// Synchronous copies between host and device: time, count, bytes.
    pub copy_s: f64,
    pub copy_calls: u64,
    pub copy_bytes: u64,
    /// Kernel launches.
    pub launches: u64,
    /// NCCL collectives and point-to-point calls; the time from each
    /// collective to the synchronization after it, and how many such
    /// waits; its collectives compared with other ranks' on this node, how
    /// often it called last, and its time after the first rank in all.
    pub collectives: u64,
    pub collective_wait_s: f64,
    pub collective_waits: u64,
    pub arrivals_compared: u64,
    pub arrivals_last: u64,
    pub arrival_late_s: f64,
}

#[derive(Serialize)]
pub struct WaitsOn {
    /// The reason it waited for (`send`, `other`, ...).
    pub reason: &'static str,
    /// The object: `object` (`pipe`, `socket`, `file`, `lock`, `child`)
    /// and its fields.
    #[serde(flatten)]
    pub object: WaitObject,
    /// In words: "stdout, a pipe read by pid 812 (fluent-bit)".
    pub says: Text,
}

#[derive(Serialize)]
pub struct Waker {
    /// Null where the kernel counted this process's wakes of the thread
    /// without naming the waking thread (its wake table was full).
    pub tid: Option<u32>,
    pub pid: u32,
    pub comm: Name,
    pub count: u64,
    /// How long the thread was blocked in the waits these wakeups ended
    /// (its wait for a CPU after each is not in it).
    pub blocked_s: f64,
}

#[derive(Serialize)]
pub struct File {
    pub path: PathName,
    /// Absolute path when `path` was opened relative.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolved: Option<PathName>,
    pub opens: u64,
    pub read_calls: u64,
    pub read_bytes: u64,
    /// Summed time spent in read calls on it.
    /// Time in reads, estimated from the timed ones (`read_timed_calls`).
    pub read_latency_s: f64,
    pub read_timed_calls: u64,
    pub write_bytes: u64,
    pub write_calls: u64,
    /// Time it was open during the window (the per-file rate's divisor).
    pub open_s: f64,
    /// Of it, bytes this process caused to be read from storage (by reads
    /// or through a mapping); the rest of what it read came from the page
    /// cache. Null where the kernel does not show page-cache fills.
    pub storage_bytes: Option<u64>,
    /// Bytes of it this process's faults mapped into it (not in
    /// `read_bytes`) first of the job's processes; null where the kernel
    /// does not show them.
    pub mmap_bytes: Option<u64>,
    /// Bytes of it its faults mapped that another process of the job got
    /// mapped just before (in that one's `mmap_bytes`).
    pub mmap_shared_bytes: Option<u64>,
    /// The filesystem serving it where a server does (`fuse.slowfs`,
    /// `nfs4`): then `storage_bytes` says nothing of its page cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filesystem: Option<String>,
}

fn thread(t: &ThreadWindow) -> Thread {
    let state = if !t.alive {
        "exited"
    } else if t.now.running {
        "running"
    } else {
        reason::name(t.now.reason)
    };
    Thread {
        tid: t.tid,
        comm: t.comm.as_str().into(),
        on_cpu_s: t.delta.on_cpu_ns as f64 / 1e9,
        off_cpu_s: t.delta.off_cpu_ns() as f64 / 1e9,
        off_cpu_by_reason: (&t.delta).into(),
        read_bytes: t.delta.file_read_bytes,
        read_calls: t.delta.file_read_calls,
        file_write_bytes: t.delta.file_write_bytes,
        other_write_bytes: t.delta.other_write_bytes,
        stdio_write_bytes: t.delta.stdio_write_bytes,
        state,
        woken_by: t
            .woken_by
            .iter()
            .map(|b| Waker {
                tid: b.thread(),
                pid: b.tgid,
                comm: b.comm.as_str().into(),
                count: b.count,
                blocked_s: b.blocked_ns as f64 / 1e9,
            })
            .collect(),
        waits_on: t.last_wait().map(|(r, o)| WaitsOn {
            reason: reason::name(*r),
            object: o.clone(),
            says: o.describe(),
        }),
        gpu_calls: t.delta.gpu.any().then(|| {
            let g = &t.delta.gpu;
            GpuCalls {
                sync_s: g.sync_ns as f64 / 1e9,
                sync_calls: g.sync_calls,
                copy_s: g.copy_ns as f64 / 1e9,
                copy_calls: g.copy_calls,
                copy_bytes: g.copy_bytes,
                launches: g.launches,
                collectives: g.collectives,
                collective_wait_s: g.collective_wait_ns as f64 / 1e9,
                collective_waits: g.collective_waits,
                arrivals_compared: g.arrivals_compared,
                arrivals_last: g.arrivals_last,
                arrival_late_s: g.arrival_late_ns as f64 / 1e9,
            }
        }),
    }
}

fn process(p: &ProcWindow, role: &'static str, rank: Option<u32>) -> Process {
    let sum = p.sum();
    Process {
        pid: p.tgid,
        ppid: p.ppid,
        comm: p.comm.as_str().into(),
        cmdline: p.cmdline.as_deref().map(Command::from),
        role,
        rank,
        rank_from: p.rank.as_ref().filter(|r| role == "trainer" && Some(r.rank) == rank).map(|r| r.found),
        cpu_limit_cgroup: p.cpu_limit.clone(),
        alive: p.alive,
        read_bytes: p.file_read_bytes(),
        read_calls: p.files.iter().map(|f| f.read_calls).sum(),
        files_opened: p.files.iter().map(|f| f.opens).sum(),
        ipc_read_bytes: p.other_read_bytes,
        storage_bytes: p.storage_bytes,
        mmap_bytes: p.mmap_bytes,
        mmap_shared_bytes: p.mmap_shared_bytes,
        file_write_bytes: sum.file_write_bytes,
        other_write_bytes: sum.other_write_bytes,
        stdio_write_bytes: sum.stdio_write_bytes,
        on_cpu_s: sum.on_cpu_ns as f64 / 1e9,
        off_cpu_s: sum.off_cpu_ns() as f64 / 1e9,
        off_cpu_by_reason: (&sum).into(),
        threads: p.threads.iter().map(thread).collect(),
        files: p
            .files
            .iter()
            .map(|f| File {
                path: f.path.as_str().into(),
                resolved: f.resolved.as_deref().map(PathName::from),
                opens: f.opens,
                read_calls: f.read_calls,
                read_bytes: f.read_bytes,
                read_latency_s: f.read_time_ns() / 1e9,
                read_timed_calls: f.timed_calls,
                write_bytes: f.write_bytes,
                write_calls: f.write_calls,
                open_s: f.open_ns as f64 / 1e9,
                storage_bytes: f.storage_bytes,
                mmap_bytes: f.mmap_bytes,
                mmap_shared_bytes: f.mmap_shared_bytes,
                filesystem: f.filesystem.clone(),
            })
            .collect(),
        sockets: p
            .sockets
            .iter()
            .map(|s| Socket {
                peer: s.path.as_str().into(),
                ipc: s.ipc,
                read_bytes: s.read_bytes,
                read_calls: s.read_calls,
                write_bytes: s.write_bytes,
                write_calls: s.write_calls,
                connects: s.opens,
                wait_s: s.read_time_ns() / 1e9,
            })
            .collect(),
        blocked_on_fds: p
            .fd_waits
            .iter()
            .map(|f| FdWait {
                fd: f.fd,
                object: f.object.as_deref().map(PathName::from),
                blocked_s: f.blocked_ns as f64 / 1e9,
            })
            .collect(),
    }
}

pub fn record<'a>(kind: &'static str, v: &'a View<'a>) -> Record<'a> {
    let w = v.window;
    let ending = v.ending.as_ref();
    let lost_by_cause = counter::LOST_NAMES.iter().zip(w.lost).map(|(n, c)| (*n, c)).collect();
    Record {
        kind,
        schema: SCHEMA,
        target: v.target,
        elapsed_s: v.elapsed_s,
        duration_s: w.secs(),
        lost_events: w.lost_total(),
        lost_by_cause,
        partial: w.lost_total() > 0,
        sched_gaps: w.sched_gaps,
        sched_repaired: w.sched_repaired,
        gpu_available: !v.gpus.is_empty(),
        processes: w
            .procs
            .iter()
            .map(|p| process(p, v.roles.of(p.tgid).as_str(), v.roles.rank_number(p.tgid)))
            .collect(),
        run_id: v.roles.run_id.as_deref().map(EnvValue::from),
        cpu_limits: w
            .cpu_limits
            .iter()
            .map(|l| CpuLimit {
                cgroup: &l.cgroup,
                cpu_limit_cpus: l.cpus,
                periods: l.periods,
                throttled_periods: l.throttled_periods,
                throttled_s: l.throttled_ns as f64 / 1e9,
            })
            .collect(),
        gpus: v.gpus,
        progress: v.progress,
        startup_s: ending.and_then(|e| e.startup_s),
        syscall_backend: ending.map(|e| e.syscall_backend.0),
        syscall_reads: ending.map(|e| e.syscall_backend.1),
        gpu_probes: ending.and_then(|e| e.gpu_probes),
        mmap_hooks: ending.map(|e| e.mmap_hooks),
        switch_reads: ending.map(|e| e.switch_reads),
        exit_status: ending.map(|e| e.exit_status),
        unreadable_threads: ending.map(|e| e.unreadable_threads).filter(|&n| n > 0),
        role_changes: ending.map(|e| e.role_changes),
        verdict: v.verdict,
    }
}

/// One JSON line to `w` as the operator's own output shows it (every
/// detail), written as it is serialised: the summary of a job that forked
/// thousands of processes is tens of megabytes, which a string would hold
/// at once.
pub fn write_line(w: &mut dyn std::io::Write, kind: &'static str, v: &View) -> std::io::Result<()> {
    let mut shown = crate::detail::Revealing::new(&mut *w);
    serde_json::to_writer(&mut shown, &record(kind, v))?;
    shown.finish()?;
    writeln!(w)
}
