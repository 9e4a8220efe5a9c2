//! Windows: what the correlation and the verdict look at for one span of
//! time (an interval, the last few seconds, or the whole run), cut from the
//! [`super::Model`]. Plain values; merging consecutive windows gives the
//! longer one.
use std::collections::{HashMap, HashSet, VecDeque};

use stall_common::counter::LOST_CAUSES;

use crate::decode::{FileCounters, ThreadCounters, ThreadNow};

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

/// A file the kernel makes up as it is read (/proc, /sys, /dev): no page
/// cache, no storage, and no progress when written.
pub fn is_kernel_file(path: &str) -> bool {
    ["/sys/", "/proc/", "/dev/"].iter().any(|p| path.starts_with(p))
}

/// Files that are the interpreter's and its libraries' own (modules,
/// bytecode, shared objects, package metadata, the loader's cache) or the
/// system's configuration (/etc, /usr/share: locales, certificates, time
/// zones), which every interpreter reads as it starts, not the job's data:
/// the evidence names data files.
pub fn is_code_file(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    [".py", ".pyc", ".pyi", ".pth", ".so"].iter().any(|ext| name.ends_with(ext))
        || name.contains(".so.")
        || ["/__pycache__/", "/site-packages/", "/dist-packages/", "/lib/python3", "/lib64/python3"]
            .iter()
            .any(|d| path.contains(d))
        || [".dist-info/", ".egg-info/"].iter().any(|d| path.contains(d))
        || ["/etc/", "/usr/share/"].iter().any(|d| path.starts_with(d))
        // Executables (the interpreter a forked worker runs through the
        // parent's mapping) and the C library's locale data.
        || ["/bin/", "/sbin/"].iter().any(|d| path.contains(d))
        || path.starts_with("/usr/lib/locale/")
        || path == "/etc/ld.so.cache"
        || is_stalls_own(path)
}

/// stall's own executable: `stall run`'s gate maps it, in the command's
/// process, before it execs the command.
fn is_stalls_own(path: &str) -> bool {
    static OWN: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    OWN.get_or_init(|| Some(std::env::current_exe().ok()?.to_string_lossy().into_owned()))
        .as_deref()
        .is_some_and(|own| own == path)
}

/// The part of `bytes` that came from storage (`storage` of them), at most 1.
pub fn storage_share(storage: u64, bytes: u64) -> f64 {
    (storage as f64 / bytes as f64).min(1.0)
}

/// What a share read from storage says of the page cache, where it says
/// something: it served nearly all (warm) or nearly none (cold).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageCache {
    Warm,
    Cold,
}

impl PageCache {
    pub fn of(storage_share: f64) -> Option<Self> {
        match storage_share {
            s if s < 0.02 => Some(Self::Warm),
            s if s > 0.98 => Some(Self::Cold),
            _ => None,
        }
    }
}

/// A sum of counts that some windows may not have (None + None is None).
pub(super) fn add_known(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (None, None) => None,
        _ => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    }
}

fn sub_known(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    a.map(|a| a.saturating_sub(b.unwrap_or(0)))
}

impl Window {
    /// What happened after `before`, a window of the same job from the same
    /// start that ends earlier (the whole run at two moments): counters are
    /// subtracted per process, thread, file and waker; processes that did
    /// nothing since are left out.
    pub fn since(&self, before: &Window) -> Window {
        let mut out = Window {
            start_ns: before.end_ns.max(self.start_ns),
            end_ns: self.end_ns,
            events: self.events.saturating_sub(before.events),
            sched_gaps: self.sched_gaps,
            sched_repaired: self.sched_repaired,
            ..Default::default()
        };
        for (i, l) in out.lost.iter_mut().enumerate() {
            *l = self.lost[i].saturating_sub(before.lost[i]);
        }
        out.cpu_limits = self
            .cpu_limits
            .iter()
            .map(|l| match before.cpu_limits.iter().find(|b| b.cgroup == l.cgroup) {
                Some(b) => CpuLimitWindow {
                    periods: l.periods.saturating_sub(b.periods),
                    throttled_periods: l.throttled_periods.saturating_sub(b.throttled_periods),
                    throttled_ns: l.throttled_ns.saturating_sub(b.throttled_ns),
                    ..l.clone()
                },
                None => l.clone(),
            })
            .collect();
        for p in &self.procs {
            let Some(b) = before.proc(p.tgid) else {
                out.procs.push(p.clone());
                continue;
            };
            let mut q = ProcWindow {
                other_read_bytes: p.other_read_bytes.saturating_sub(b.other_read_bytes),
                storage_bytes: sub_known(p.storage_bytes, b.storage_bytes),
                mmap_bytes: sub_known(p.mmap_bytes, b.mmap_bytes),
                threads: Vec::with_capacity(p.threads.len()),
                files: Vec::with_capacity(p.files.len()),
                fd_waits: p
                    .fd_waits
                    .iter()
                    .map(|f| {
                        let earlier = b.fd_waits.iter().find(|x| x.fd == f.fd).map_or(0, |x| x.blocked_ns);
                        FdWait { blocked_ns: f.blocked_ns.saturating_sub(earlier), ..f.clone() }
                    })
                    .filter(|f| f.blocked_ns > 0)
                    .collect(),
                ..p.clone()
            };
            for t in &p.threads {
                let Some(bt) = b.threads.iter().find(|x| x.tid == t.tid) else {
                    q.threads.push(t.clone());
                    continue;
                };
                let delta = t.delta.saturating_sub(&bt.delta);
                if !t.alive && delta == ThreadCounters::default() {
                    continue;
                }
                let mut woken_by: Vec<Waker> = t
                    .woken_by
                    .iter()
                    .map(|w| {
                        let (count, blocked_ns) = bt
                            .woken_by
                            .iter()
                            .find(|x| x.tid == w.tid)
                            .map_or((0, 0), |x| (x.count, x.blocked_ns));
                        Waker {
                            count: w.count.saturating_sub(count),
                            blocked_ns: w.blocked_ns.saturating_sub(blocked_ns),
                            ..w.clone()
                        }
                    })
                    .filter(|w| w.count > 0)
                    .collect();
                Waker::rank(&mut woken_by);
                q.threads.push(ThreadWindow { delta, woken_by, ..t.clone() });
            }
            q.files = files_since(&p.files, &b.files);
            q.sockets = files_since(&p.sockets, &b.sockets);
            if p.alive || !q.threads.is_empty() || !q.files.is_empty() || !q.sockets.is_empty() {
                out.procs.push(q);
            }
        }
        out
    }
}

/// What happened to each of `now`'s files (or sockets) after `before`,
/// the same list at an earlier moment; those with nothing new left out.
fn files_since(now: &[FileWindow], before: &[FileWindow]) -> Vec<FileWindow> {
    let mut out = Vec::new();
    for f in now {
        let Some(bf) = before.iter().find(|x| x.path == f.path) else {
            out.push(f.clone());
            continue;
        };
        let d = FileWindow {
            opens: f.opens.saturating_sub(bf.opens),
            read_calls: f.read_calls.saturating_sub(bf.read_calls),
            read_bytes: f.read_bytes.saturating_sub(bf.read_bytes),
            read_ns: f.read_ns.saturating_sub(bf.read_ns),
            timed_calls: f.timed_calls.saturating_sub(bf.timed_calls),
            write_bytes: f.write_bytes.saturating_sub(bf.write_bytes),
            write_calls: f.write_calls.saturating_sub(bf.write_calls),
            open_ns: f.open_ns.saturating_sub(bf.open_ns),
            storage_bytes: sub_known(f.storage_bytes, bf.storage_bytes),
            mmap_bytes: sub_known(f.mmap_bytes, bf.mmap_bytes),
            ..f.clone()
        };
        if d.read_calls + d.write_calls + d.opens > 0
            || d.open_ns > 0
            || d.storage_bytes > Some(0)
            || d.mmap_bytes > Some(0)
        {
            out.push(d);
        }
    }
    out
}

impl Window {
    /// Consecutive windows as one (the verdict looks at the last few
    /// seconds, not at one noisy interval). Thread states are the latest.
    pub fn merge(windows: &[Window]) -> Window {
        let mut out = Window {
            start_ns: windows.first().map_or(0, |w| w.start_ns),
            end_ns: windows.last().map_or(0, |w| w.end_ns),
            ..Default::default()
        };
        // Indexes, not scans: a fork storm puts thousands of processes (and
        // an open storm thousands of files) in each window.
        let mut proc_at: HashMap<u32, usize> = HashMap::new();
        let mut thread_at: Vec<HashMap<u32, usize>> = Vec::new();
        let mut file_at: Vec<HashMap<String, usize>> = Vec::new();
        // (process, thread, waker) → place in that thread's `woken_by`.
        let mut waker_at: HashMap<(usize, usize, u32), usize> = HashMap::new();
        for w in windows {
            for (i, l) in w.lost.iter().enumerate() {
                out.lost[i] += l;
            }
            out.events += w.events;
            for l in &w.cpu_limits {
                match out.cpu_limits.iter_mut().find(|o| o.cgroup == l.cgroup) {
                    Some(o) => {
                        o.cpus = l.cpus;
                        o.periods += l.periods;
                        o.throttled_periods += l.throttled_periods;
                        o.throttled_ns += l.throttled_ns;
                    }
                    None => out.cpu_limits.push(l.clone()),
                }
            }
            out.sched_gaps = out.sched_gaps.max(w.sched_gaps);
            out.sched_repaired = out.sched_repaired.max(w.sched_repaired);
            for p in &w.procs {
                let pi = *proc_at.entry(p.tgid).or_insert_with(|| {
                    out.procs.push(ProcWindow {
                        tgid: p.tgid,
                        ppid: p.ppid,
                        comm: p.comm.clone(),
                        cmdline: p.cmdline.clone(),
                        rank: p.rank.clone(),
                        alive: p.alive,
                        born_ns: p.born_ns,
                        exec_ns: p.exec_ns,
                        cpu_limit: p.cpu_limit.clone(),
                        ..Default::default()
                    });
                    thread_at.push(HashMap::new());
                    file_at.push(HashMap::new());
                    out.procs.len() - 1
                });
                let op = &mut out.procs[pi];
                op.alive = p.alive;
                op.exec_ns = op.exec_ns.max(p.exec_ns);
                op.cpu_limit.clone_from(&p.cpu_limit);
                op.comm.clone_from(&p.comm);
                // A rank may be known only from a later window on.
                if p.rank.is_some() {
                    op.rank.clone_from(&p.rank);
                }
                op.other_read_bytes += p.other_read_bytes;
                op.storage_bytes = add_known(op.storage_bytes, p.storage_bytes);
                op.mmap_bytes = add_known(op.mmap_bytes, p.mmap_bytes);
                for t in &p.threads {
                    let ti = match thread_at[pi].get(&t.tid) {
                        Some(&ti) => {
                            let o = &mut op.threads[ti];
                            o.delta.add(&t.delta);
                            o.now = t.now;
                            o.alive = t.alive;
                            o.other_nr = t.other_nr;
                            ti
                        }
                        None => {
                            thread_at[pi].insert(t.tid, op.threads.len());
                            op.threads.push(ThreadWindow { woken_by: Vec::new(), ..t.clone() });
                            op.threads.len() - 1
                        }
                    };
                    let o = &mut op.threads[ti];
                    for b in &t.woken_by {
                        match waker_at.get(&(pi, ti, b.tid)) {
                            Some(&k) => {
                                o.woken_by[k].count += b.count;
                                o.woken_by[k].blocked_ns += b.blocked_ns;
                            }
                            None => {
                                waker_at.insert((pi, ti, b.tid), o.woken_by.len());
                                o.woken_by.push(b.clone());
                            }
                        }
                    }
                }
                for f in &p.fd_waits {
                    match op.fd_waits.iter_mut().find(|o| o.fd == f.fd) {
                        Some(o) => {
                            o.blocked_ns += f.blocked_ns;
                            if f.object.is_some() {
                                o.object.clone_from(&f.object);
                            }
                        }
                        None => op.fd_waits.push(f.clone()),
                    }
                }
                for s in &p.sockets {
                    match op.sockets.iter_mut().find(|o| o.path == s.path) {
                        Some(o) => o.add(s),
                        None => op.sockets.push(s.clone()),
                    }
                }
                for f in &p.files {
                    match file_at[pi].get(&f.path) {
                        Some(&fi) => {
                            op.files[fi].add(f);
                        }
                        None => {
                            file_at[pi].insert(f.path.clone(), op.files.len());
                            op.files.push(f.clone());
                        }
                    }
                }
            }
        }
        for p in &mut out.procs {
            p.fd_waits.sort_by(|a, b| b.blocked_ns.cmp(&a.blocked_ns).then(a.fd.cmp(&b.fd)));
            p.files.sort_by(|a, b| b.read_bytes.cmp(&a.read_bytes).then(a.path.cmp(&b.path)));
            for t in &mut p.threads {
                Waker::rank(&mut t.woken_by);
            }
        }
        out
    }
}

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
    /// storage), whatever the file; None: not seen on this kernel.
    pub mmap_bytes: Option<u64>,
    /// When it was forked and last exec'd, if seen while traced (0: not).
    pub born_ns: u64,
    pub exec_ns: u64,
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
    /// What it was last seen blocked on (the reason it waited for, and the
    /// object), where /proc could say; set by the job before a verdict.
    pub waits_on: Option<(u8, crate::wait::WaitObject)>,
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

/// Regular files merged by path, or connected sockets merged by peer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FileWindow {
    /// The path, or a socket's peer ("10.0.0.5:443").
    pub path: String,
    /// A connected inet socket: network traffic, never file throughput
    /// (in [`ProcWindow::sockets`], not `files`).
    pub socket: bool,
    /// A socket whose peer is a process of the job: IPC, not input.
    pub ipc: bool,
    pub resolved: Option<String>,
    pub opens: u64,
    pub read_calls: u64,
    pub read_bytes: u64,
    /// Time in the timed reads (one in `--latency-sample`), and how many.
    pub read_ns: u64,
    pub timed_calls: u64,
    /// Successful writes to it (a log, a checkpoint).
    pub write_bytes: u64,
    pub write_calls: u64,
    /// Time the file was open within the window, summed over its opens:
    /// the per-file rate is over this, not over the whole window.
    pub open_ns: u64,
    /// Bytes of it this process caused to be read from storage (the rest of
    /// what it read came from the page cache); None: not seen here.
    pub storage_bytes: Option<u64>,
    /// Bytes of it this process's faults mapped into it (its pages touched
    /// through a mapping); None: not seen here.
    pub mmap_bytes: Option<u64>,
}

impl FileWindow {
    /// Its path, resolved where it was.
    pub fn name(&self) -> &str {
        self.resolved.as_deref().unwrap_or(&self.path)
    }
    /// A module, a library, an executable: code, not data.
    pub fn is_code(&self) -> bool {
        !self.socket && is_code_file(self.name())
    }

    /// The bytes of it the process took in: read and mapped, or where more
    /// (pages of a mapping where faults are not followed), brought in from
    /// storage. The pages of a program's own code (shared objects, modules)
    /// it runs through a mapping are not input, nor are shared-memory
    /// segments (/dev/shm: semaphores, tensors passed between processes).
    pub fn bytes_in(&self) -> u64 {
        let path = self.resolved.as_deref().unwrap_or(&self.path);
        let mapped = match self.mmap_bytes {
            Some(n) if n > 0 && !is_code_file(path) && !is_kernel_file(path) => n,
            _ => 0,
        };
        // Where its faults are followed, what it mapped is exact: the
        // read-ahead its faults set off is mapped by whoever touches it (a
        // worker faulting a page still being read brings in megabytes its
        // siblings then map from the page cache).
        if mapped > 0 {
            return self.read_bytes + mapped;
        }
        self.read_bytes.max(self.storage_bytes.unwrap_or(0))
    }

    /// How it was taken in: "in 12 reads", "mapped", "in 12 reads and
    /// mapped".
    pub fn taken_by(&self) -> String {
        let reads = format!("in {} reads", self.read_calls);
        match (self.read_calls, self.mmap_bytes.unwrap_or(0)) {
            (_, 0) => reads,
            (0, _) => "mapped".to_string(),
            _ => format!("{reads} and mapped"),
        }
    }

    /// Where those bytes came from, where the kernel shows it: "from the
    /// page cache", "82 % from storage", "from storage (page cache cold)",
    /// each "through a mapping, " first where none was read().
    pub fn source(&self) -> Option<String> {
        if is_kernel_file(self.resolved.as_deref().unwrap_or(&self.path)) {
            return None;
        }
        let storage = self.storage_bytes?;
        let taken = self.read_bytes + self.mmap_bytes.unwrap_or(0);
        let how = if self.read_bytes == 0 { "through a mapping, " } else { "" };
        if taken == 0 {
            return (storage > 0).then(|| format!("{how}from storage"));
        }
        let share = storage_share(storage, taken);
        Some(match PageCache::of(share) {
            Some(PageCache::Warm) => format!("{how}from the page cache"),
            Some(PageCache::Cold) => format!("{how}from storage (page cache cold)"),
            None => format!("{how}{:.0} % from storage", share * 100.0),
        })
    }

    /// Adds another window's counts for the same path.
    pub fn add(&mut self, o: &FileWindow) {
        self.opens += o.opens;
        self.read_calls += o.read_calls;
        self.read_bytes += o.read_bytes;
        self.read_ns += o.read_ns;
        self.timed_calls += o.timed_calls;
        self.write_bytes += o.write_bytes;
        self.write_calls += o.write_calls;
        self.open_ns += o.open_ns;
        self.storage_bytes = add_known(self.storage_bytes, o.storage_bytes);
        self.mmap_bytes = add_known(self.mmap_bytes, o.mmap_bytes);
    }

    /// Adds one descriptor's counters (an interval's delta, or its total).
    pub fn add_counters(&mut self, c: &FileCounters) {
        self.read_calls += c.read_calls;
        self.read_bytes += c.read_bytes;
        self.read_ns += c.read_ns;
        self.timed_calls += c.timed_calls;
        self.write_bytes += c.write_bytes;
        self.write_calls += c.write_calls;
    }

    /// Mean duration of a read, from the timed ones.
    pub fn mean_read_ns(&self) -> Option<f64> {
        (self.timed_calls > 0).then(|| self.read_ns as f64 / self.timed_calls as f64)
    }

    /// Time spent in all its reads, estimated from the timed ones.
    pub fn read_time_ns(&self) -> f64 {
        self.mean_read_ns().map_or(0.0, |m| m * self.read_calls as f64)
    }

    /// Seconds to divide its bytes by: the time it was open in a window of
    /// `window_s` (the whole window for files open throughout or unknown,
    /// and for bytes through a mapping).
    pub fn rate_secs(&self, window_s: f64) -> f64 {
        // A mapping is read long after its descriptor closed.
        if self.open_ns > 0 && self.read_bytes >= self.bytes_in() {
            (self.open_ns as f64 / 1e9).min(window_s)
        } else {
            window_s
        }
    }
}

/// How much recent history the live verdict looks at.
pub const RECENT_NS: u64 = 5_000_000_000;

/// Keeps the newest windows that span at least [`RECENT_NS`] (never less,
/// so a threshold like the hang's 4 s is not missed by a jitter of the tick).
pub fn push_recent(recent: &mut VecDeque<Window>, w: Window) {
    recent.push_back(w);
    while recent.len() > 1 {
        let end = recent.back().map_or(0, |w| w.end_ns);
        let second_start = recent[1].start_ns;
        if end.saturating_sub(second_start) < RECENT_NS {
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
