//! Windows: what the correlation and the verdict look at for one span of
//! time (an interval, the last few seconds, or the whole run), cut from the
//! [`super::Model`]. Plain values; merging consecutive windows gives the
//! longer one.
use std::collections::{HashMap, HashSet, VecDeque};

use stall_common::counter::LOST_CAUSES;

use super::{file_window::FileWindow, files::is_kernel_file};
use crate::decode::{ThreadCounters, ThreadNow};

// The window arithmetic, a concept of its own: one view minus an earlier
// one, and consecutive windows summed.
mod merge;
mod since;

/// Everything the correlation and the verdict look at, for one span of time.
#[derive(Debug, Clone, Default)]
pub struct Window {
    pub start_ns: u64,
    pub end_ns: u64,
    pub procs: Vec<ProcWindow>,
    /// Losses during the window, by cause.
    pub lost: [u64; LOST_CAUSES],
    pub events: u64,
    /// Missed switches seen so far (cumulative; should be 0).
    pub sched_gaps: u64,
    /// Switches the tracepoint never delivered, repaired from the kernel's
    /// counters (cumulative; nothing lost).
    pub sched_repaired: u64,
    /// The CPU limits of the job's cgroups, and what they throttled in the
    /// window.
    pub cpu_limits: Vec<CpuLimitWindow>,
}

/// A cgroup's CPU limit and its throttling in a window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CpuLimitWindow {
    pub cgroup: String,
    /// The limit, in CPUs (quota over period).
    pub cpus: f64,
    pub periods: u64,
    pub throttled_periods: u64,
    /// Time its run queues were throttled, summed over CPUs.
    pub throttled_ns: u64,
}

impl CpuLimitWindow {
    /// Share of its periods in which it ran out of quota.
    pub fn throttled_share(&self) -> f64 {
        if self.periods == 0 {
            0.0
        } else {
            self.throttled_periods as f64 / self.periods as f64
        }
    }
}

impl Window {
    pub fn secs(&self) -> f64 {
        self.end_ns.saturating_sub(self.start_ns) as f64 / 1e9
    }
    pub fn lost_total(&self) -> u64 {
        self.lost.iter().sum()
    }
    pub fn proc(&self, tgid: u32) -> Option<&ProcWindow> {
        self.procs.iter().find(|p| p.tgid == tgid)
    }
    /// The same span with only the processes `keep` names (one rank's).
    pub fn only(&self, keep: impl Fn(u32) -> bool) -> Window {
        Window {
            start_ns: self.start_ns,
            end_ns: self.end_ns,
            procs: self.procs.iter().filter(|p| keep(p.tgid)).cloned().collect(),
            lost: self.lost,
            events: self.events,
            sched_gaps: self.sched_gaps,
            sched_repaired: self.sched_repaired,
            cpu_limits: self.cpu_limits.clone(),
        }
    }

    /// The limit of the cgroup that caps `p`'s CPU, as counted in this window.
    pub fn cpu_limit_of(&self, p: &ProcWindow) -> Option<&CpuLimitWindow> {
        let cgroup = p.cpu_limit.as_deref()?;
        self.cpu_limits.iter().find(|l| l.cgroup == cgroup)
    }
    /// The files that were read, most bytes first, with their reader's pid.
    pub fn files_by_bytes(&self) -> Vec<(u32, &FileWindow)> {
        self.files_by(FileWindow::bytes_in)
    }

    /// The files that were written, most bytes first, with the writer's pid.
    pub fn files_by_written(&self) -> Vec<(u32, &FileWindow)> {
        self.files_by(|f| f.write_bytes)
    }

    /// The files with some `bytes`, most first, with their process's pid.
    fn files_by(&self, bytes: impl Fn(&FileWindow) -> u64) -> Vec<(u32, &FileWindow)> {
        let mut files: Vec<(u32, &FileWindow)> = self
            .procs
            .iter()
            .flat_map(|p| p.files.iter().map(move |f| (p.tgid, f)))
            .filter(|(_, f)| bytes(f) > 0)
            .collect();
        files.sort_by_key(|(_, f)| std::cmp::Reverse(bytes(f)));
        files
    }

    pub fn thread(&self, tid: u32) -> Option<(&ProcWindow, &ThreadWindow)> {
        self.procs.iter().find_map(|p| p.threads.iter().find(|t| t.tid == tid).map(|t| (p, t)))
    }
}

/// Less than this read in a window is not reading data ([`ProcWindow::reads_data`]).
pub const DATA_MIN_BYTES: u64 = 64 << 10;

#[derive(Debug, Clone, Default)]
pub struct ProcWindow {
    pub tgid: u32,
    pub ppid: Option<u32>,
    pub comm: String,
    pub cmdline: Option<String>,
    /// Its rank of a distributed run (None: not one).
    pub rank: Option<crate::rank::Rank>,
    pub alive: bool,
    pub threads: Vec<ThreadWindow>,
    pub files: Vec<FileWindow>,
    /// Reads of pipes, sockets and other non-files.
    pub other_read_bytes: u64,
    /// Bytes it caused to be read from storage (page-cache fills by its
    /// reads, faults on mappings and read-ahead), whatever the file; None:
    /// not seen on this kernel.
    pub storage_bytes: Option<u64>,
    /// Bytes of files its faults mapped into it (from the page cache or
    /// storage) first of the job's processes, whatever the file; None: not
    /// seen on this kernel.
    pub mmap_bytes: Option<u64>,
    /// Bytes its faults mapped that another process got mapped just before
    /// (see [`FileWindow::mmap_shared_bytes`]).
    pub mmap_shared_bytes: Option<u64>,
    /// When it was forked and last exec'd, if seen while traced (0: not).
    pub born_ns: u64,
    pub exec_ns: u64,
    /// When it started, as /proc tells it (ns since boot, in 10 ms ticks;
    /// 0: not known): orders processes whether or not they were traced
    /// from their start.
    pub started_ns: u64,
    /// The cgroup that caps its CPU (see [`Window::cpu_limits`]).
    pub cpu_limit: Option<String>,
    /// The inet sockets it connected, by peer: bytes received and sent,
    /// calls, time in its reads (the files' fields, for a peer).
    pub sockets: Vec<FileWindow>,
    /// How long its threads were blocked reading or writing each
    /// descriptor (pipes and sockets as well as files), longest first.
    pub fd_waits: Vec<FdWait>,
}

/// Blocked time on one descriptor of a process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FdWait {
    pub fd: i32,
    /// What it is open on, where stall saw it opened: a path, a socket's
    /// peer (None: inherited, or opened before stall came).
    pub object: Option<String>,
    /// A socket connected to a peer outside the job (an object store, a
    /// data server): what is blocked there moves data to or from it.
    pub outside: bool,
    pub blocked_ns: u64,
}

impl ProcWindow {
    pub fn sum(&self) -> ThreadCounters {
        let mut c = ThreadCounters::default();
        for t in &self.threads {
            c.add(&t.delta);
        }
        c
    }
    pub fn file_read_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.read_bytes).sum()
    }

    /// What it took in from files: per file what it read and mapped (or,
    /// where more, what it had read from storage), and what it had read from
    /// storage of files it was not seen opening. (Pages of files mapped
    /// before it was traced are left out: most are its libraries' code,
    /// faulted in again by each forked worker.)
    pub fn input_bytes(&self) -> u64 {
        let attributed: u64 = self.files.iter().filter_map(|f| f.storage_bytes).sum();
        let unattributed = self.storage_bytes.unwrap_or(0).saturating_sub(attributed);
        self.files.iter().map(FileWindow::bytes_in).sum::<u64>() + unattributed
    }
    /// Whether it read data: at least [`DATA_MIN_BYTES`] of files that are
    /// not code (modules, libraries) nor the kernel's, read or mapped, or of
    /// the network
    /// (an interpreter starting reads a few small configuration files of
    /// its libraries, wherever they keep them).
    pub fn reads_data(&self) -> bool {
        self.data_file_bytes() + self.network_in() >= DATA_MIN_BYTES
    }
    /// What it took in from files that are neither code nor the kernel's,
    /// read or mapped (`bytes_in` counts a mapping's pages of data only).
    pub fn data_file_bytes(&self) -> u64 {
        self.files
            .iter()
            .filter(|f| !f.is_code() && !is_kernel_file(f.name()))
            .map(FileWindow::bytes_in)
            .sum()
    }
    /// What it loaded of its code (modules read, libraries faulted in):
    /// an `import` at work, at startup or lazily at first use.
    pub fn code_bytes(&self) -> u64 {
        self.files.iter().filter(|f| f.is_code()).map(|f| f.read_bytes + f.mmap_bytes.unwrap_or(0)).sum()
    }
    /// Of what it had read from storage (where the kernel tells per file),
    /// the share that was its code: the part of its time in file reads
    /// spent loading modules and libraries rather than input.
    pub fn code_storage_share(&self) -> f64 {
        let (code, all) = self
            .files
            .iter()
            .filter_map(|f| Some((f.is_code(), f.storage_bytes?)))
            .fold((0u64, 0u64), |(code, all), (is_code, n)| (code + if is_code { n } else { 0 }, all + n));
        if all == 0 {
            0.0
        } else {
            code as f64 / all as f64
        }
    }
    /// Bytes received from peers outside the job over its connected
    /// sockets: network input.
    pub fn network_in(&self) -> u64 {
        self.sockets.iter().filter(|s| !s.ipc).map(|s| s.read_bytes).sum()
    }

    /// Did it move in the window: read or write a file, exchange data with
    /// a peer over a socket, or write to its stdout/stderr (whatever they
    /// point to)?
    pub fn moved(&self) -> bool {
        let c = self.sum();
        // Any output: files, stdout and stderr, pipes and sockets.
        c.file_read_bytes + c.file_write_bytes + c.stdio_write_bytes + c.other_write_bytes > 0
            || self.files.iter().any(|f| f.read_bytes + f.write_bytes > 0 || f.mmap_bytes > Some(0))
            || self.sockets.iter().any(|s| s.read_bytes + s.write_bytes > 0)
    }
    pub fn file_write_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.write_bytes).sum()
    }
    pub fn main_thread(&self) -> Option<&ThreadWindow> {
        self.threads.iter().find(|t| t.tid == self.tgid).or(self.threads.first())
    }
}

#[derive(Debug, Clone, Default)]
pub struct ThreadWindow {
    pub tid: u32,
    pub comm: String,
    pub delta: ThreadCounters,
    pub now: ThreadNow,
    pub other_nr: i32,
    pub alive: bool,
    /// Who woke this thread, those who ended most of its blocked time
    /// first.
    pub woken_by: Vec<Waker>,
    /// What it was last seen blocked on for each reason (the reason, and
    /// the object), the latest first, where /proc could say; set by the
    /// job before a verdict. Per reason: a thread that streamed its input
    /// and then wrote a file still names the socket it waited on.
    pub waits_on: Vec<(u8, crate::wait::WaitObject)>,
}

impl ThreadWindow {
    /// What it was seen blocked on last, for whatever reason.
    pub fn last_wait(&self) -> Option<&(u8, crate::wait::WaitObject)> {
        self.waits_on.first()
    }

    /// What it was last seen blocked on for reason `r`.
    pub fn wait_object(&self, r: u8) -> Option<&crate::wait::WaitObject> {
        self.waits_on.iter().find(|(why, _)| *why == r).map(|(_, o)| o)
    }

    /// Whether its last call that is none of stall's reasons is a wait for
    /// a child: `wait4`, `waitid`, or a wait for the signal a child's end
    /// sends (`timeout` suspends until SIGCHLD, `tini` and `dumb-init` wait
    /// for it in `sigtimedwait`).
    pub fn in_child_wait(&self) -> bool {
        matches!(
            crate::syscalls::name(i64::from(self.other_nr)).as_str(),
            "wait4" | "waitid" | "rt_sigsuspend" | "rt_sigtimedwait"
        )
    }

    /// Whether it spent at least half its time in the window waiting for a
    /// child: a shell, a wrapper script or a launcher, which passes the
    /// wait on.
    pub fn mostly_child_wait(&self) -> bool {
        let other = self.delta.off_ns[usize::from(stall_common::reason::OTHER)];
        let seen = self.delta.on_cpu_ns + self.delta.off_cpu_ns();
        self.in_child_wait() && other > 0 && other * 2 >= seen
    }
}

/// A thread that woke another, how often in the window, and how long
/// the other had waited by then.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Waker {
    /// The waking thread, or its process with `WAKER_ANY_THREAD` set (the
    /// kernel counted it per process: see [`Waker::thread`]).
    pub tid: u32,
    pub tgid: u32,
    pub comm: String,
    pub count: u64,
    /// How long the thread was blocked in the waits these wakeups ended.
    pub blocked_ns: u64,
}

impl Waker {
    /// The waking thread, where the kernel kept it.
    pub fn thread(&self) -> Option<u32> {
        (self.tid & stall_common::WAKER_ANY_THREAD == 0).then_some(self.tid)
    }

    /// Who ended the most blocked time first, then the most frequent (ties
    /// by tid, so the order is stable), at most [`MAX_WAKERS`].
    pub fn rank(wakers: &mut Vec<Waker>) {
        wakers.sort_by(|a, b| (b.blocked_ns, b.count).cmp(&(a.blocked_ns, a.count)).then(a.tid.cmp(&b.tid)));
        wakers.truncate(MAX_WAKERS);
    }
}

/// How much recent history the live verdict looks at.
pub const RECENT_NS: u64 = 5_000_000_000;

/// Keeps the newest windows that span [`RECENT_NS`], give or take a tick's
/// jitter: never less than 95 % of it (a threshold like the hang's 4 s is
/// never missed), and not a whole interval more because the ticks came a
/// few milliseconds late (a live line saying "of 6.0s").
pub fn push_recent(recent: &mut VecDeque<Window>, w: Window) {
    const AT_LEAST_NS: u64 = RECENT_NS - RECENT_NS / 20;
    recent.push_back(w);
    while recent.len() > 1 {
        let end = recent.back().map_or(0, |w| w.end_ns);
        let second_start = recent[1].start_ns;
        if end.saturating_sub(second_start) < AT_LEAST_NS {
            break;
        }
        recent.pop_front();
    }
}

/// Wakers listed per thread and window, most frequent first: a parent
/// woken by each of thousands of short-lived children needs its top ones,
/// not all.
pub const MAX_WAKERS: usize = 64;

/// Ended processes an interval window lists one by one; the least busy
/// beyond this are summed into one entry (a fork storm ends thousands of
/// processes a second, and the last few seconds of windows are kept).
pub const MAX_ENDED_PER_WINDOW: usize = 1024;

/// Sums the least busy ended processes beyond [`MAX_ENDED_PER_WINDOW`]
/// into one entry (tgid 0, as the summary's folded processes).
pub(super) fn fold_small_ended(procs: &mut Vec<ProcWindow>) {
    let ended = procs.iter().filter(|p| !p.alive).count();
    if ended <= MAX_ENDED_PER_WINDOW {
        return;
    }
    let busy = |p: &ProcWindow| {
        let c = p.sum();
        c.on_cpu_ns + c.off_cpu_ns() + c.file_read_bytes + c.other_read_bytes
    };
    let mut order: Vec<(u64, usize)> =
        procs.iter().enumerate().filter(|(_, p)| !p.alive).map(|(i, p)| (busy(p), i)).collect();
    order.sort_unstable_by(|a, b| b.cmp(a));
    let fold: HashSet<usize> = order[MAX_ENDED_PER_WINDOW..].iter().map(|&(_, i)| i).collect();
    let mut sum = ThreadCounters::default();
    let mut files: HashMap<String, FileWindow> = HashMap::new();
    let mut other = 0;
    let mut kept = Vec::with_capacity(procs.len() - fold.len() + 1);
    for (i, p) in procs.drain(..).enumerate() {
        if !fold.contains(&i) {
            kept.push(p);
            continue;
        }
        sum.add(&p.sum());
        other += p.other_read_bytes;
        for f in p.files {
            files
                .entry(f.path.clone())
                .or_insert_with(|| FileWindow { path: f.path.clone(), ..Default::default() })
                .add(&f);
        }
    }
    let mut files: Vec<FileWindow> = files.into_values().collect();
    files.sort_by(|a, b| b.read_bytes.cmp(&a.read_bytes).then(a.path.cmp(&b.path)));
    kept.push(ProcWindow {
        tgid: 0,
        comm: format!("({} ended processes, summed)", fold.len()),
        other_read_bytes: other,
        threads: vec![ThreadWindow {
            tid: 0,
            comm: "(summed)".into(),
            delta: sum,
            other_nr: -1,
            ..Default::default()
        }],
        files,
        ..Default::default()
    });
    *procs = kept;
}

#[cfg(test)]
mod tests;
