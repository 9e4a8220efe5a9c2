//! What the role rules read of the job's processes, each fact named by what
//! it shows: the tree, who did anything, who feeds whom, and which
//! processes can hold no role however the tree is shaped — the helpers of
//! a program that replaced itself (a shim's subshells), the wrappers that
//! only wait for their child (a shell script, `timeout`, `make`, a Python
//! parent in `subprocess.call`, `tini`), and what ended while what it
//! started lives on. No name of a program decides any of it. Pure.
use std::collections::{HashMap, HashSet};

use crate::aggregate::{ProcWindow, Window};

/// Wakeups of the trainer that make a program it ran one of its feeders (a
/// program's output read through a pipe and its exit wake the parent a few
/// times; a feeder delivers batch after batch).
pub const FEEDER_MIN_WAKES: u64 = 16;

/// The share of its time a wrapper's main thread spends waiting for its
/// child, at least: most of it (a Python parent's imports take a second of
/// a short job on a slow machine).
const WRAPPER_WAIT_SHARE: f64 = 0.5;

/// How soon after its own start a wrapper starts its child: a shell,
/// `timeout` or `make` at once, a Python parent after its imports (`conda
/// run`'s take a second or two). One whose start is not known is no
/// wrapper.
const WRAPPER_CHILD_WITHIN_NS: u64 = 5_000_000_000;

/// What /proc's start times (10 ms ticks) and the reaping after a child
/// ends may add to a wrapper's time on CPU beyond the span before its
/// first child started.
const WRAPPER_CPU_SLACK_NS: u64 = 50_000_000;

pub(super) struct Evidence<'a> {
    pub by_tgid: HashMap<u32, &'a ProcWindow>,
    pub parent: HashMap<u32, u32>,
    /// By process: its children in the window (a fork storm leaves
    /// thousands: each is looked up, never searched for).
    kids: HashMap<u32, Vec<&'a ProcWindow>>,
    busy: HashSet<u32>,
    /// By process: the others that woke its threads.
    pub feeders: HashMap<u32, HashSet<u32>>,
    /// By process: those that woke it at least [`FEEDER_MIN_WAKES`] times.
    pub wakers: HashMap<u32, HashSet<u32>>,
    /// By process: the busy processes whose data it takes in through a
    /// pipe or socket, waking it for each piece (a pipeline's producer).
    pub producers: HashMap<u32, HashSet<u32>>,
    /// Forked by a program before it exec'd another (and all below them):
    /// they belong to the program that is gone.
    before_exec: HashSet<u32>,
    wrappers: HashSet<u32>,
    /// Some process that may hold a role is still alive.
    any_alive: bool,
}

impl<'a> Evidence<'a> {
    pub fn of(w: &'a Window) -> Self {
        let by_tgid: HashMap<u32, &ProcWindow> = w.procs.iter().map(|p| (p.tgid, p)).collect();
        let parent: HashMap<u32, u32> = w.procs.iter().filter_map(|p| Some((p.tgid, p.ppid?))).collect();
        let secs = w.secs().max(1e-3);
        let busy = w.procs.iter().filter(|p| busy(p, secs)).map(|p| p.tgid).collect();
        let mut kids: HashMap<u32, Vec<&ProcWindow>> = HashMap::new();
        for p in &w.procs {
            if let Some(pp) = p.ppid {
                kids.entry(pp).or_default().push(p);
            }
        }
        let mut e = Evidence {
            by_tgid,
            parent,
            kids,
            busy,
            feeders: HashMap::new(),
            wakers: HashMap::new(),
            producers: HashMap::new(),
            before_exec: HashSet::new(),
            wrappers: HashSet::new(),
            any_alive: false,
        };
        e.note_feeding(w);
        e.before_exec = w.procs.iter().map(|p| p.tgid).filter(|t| e.forked_before_exec(*t)).collect();
        e.wrappers = w.procs.iter().filter(|p| e.only_waits_for_child(p)).map(|p| p.tgid).collect();
        e.any_alive = w.procs.iter().any(|p| p.alive && !e.before_exec.contains(&p.tgid));
        e
    }

    /// Who feeds whom: waking its threads, being its child that does work,
    /// or handing it data through a pipe or socket.
    fn note_feeding(&mut self, w: &Window) {
        for p in &w.procs {
            for t in &p.threads {
                for b in t.woken_by.iter().filter(|b| b.tgid != p.tgid) {
                    let Some(from) = self.by_tgid.get(&b.tgid) else { continue };
                    self.feeders.entry(p.tgid).or_default().insert(b.tgid);
                    // A child's exit wakes its parent once: feeding is more.
                    if b.count >= FEEDER_MIN_WAKES {
                        self.wakers.entry(p.tgid).or_default().insert(b.tgid);
                        if self.busy(b.tgid) && self.busy(p.tgid) && flows(from, p) > flows(p, from) {
                            self.producers.entry(p.tgid).or_default().insert(b.tgid);
                        }
                    }
                }
            }
            if let Some(pp) = p.ppid.filter(|pp| self.by_tgid.contains_key(pp)) {
                if self.busy(p.tgid) {
                    self.feeders.entry(pp).or_default().insert(p.tgid);
                }
            }
        }
    }

    pub fn present(&self, t: u32) -> bool {
        self.by_tgid.contains_key(&t)
    }

    /// Did it do anything: read a file, or use the CPU (>1%)?
    pub fn busy(&self, t: u32) -> bool {
        self.busy.contains(&t)
    }

    /// A child that works for its parent: busy, or a data worker even idle.
    pub fn worker_like(&self, child: u32, parent: u32) -> bool {
        self.busy(child)
            || forked_worker(self.by_tgid.get(&child).copied(), self.by_tgid.get(&parent).copied())
    }

    /// A wrapper: a process whose main thread does nothing but wait for
    /// the child it started. It passes every role on to that child.
    pub fn is_wrapper(&self, t: u32) -> bool {
        self.wrappers.contains(&t)
    }

    /// Whether `t` hands the work of its children up to its parent when
    /// counting who has workers: a wrapper, or an idle process that
    /// mostly waits for a child (a shell the trainer ran its evaluation
    /// through).
    pub fn passes_on(&self, t: u32) -> bool {
        let waits =
            || self.by_tgid.get(&t).and_then(|p| p.main_thread()).is_some_and(|m| m.mostly_child_wait());
        self.is_wrapper(t) || (!self.busy(t) && waits())
    }

    /// Whether `t` may hold a role of its own: not a wrapper, not a helper
    /// of a program that exec'd since, and not ended while a process that
    /// may hold one lives.
    pub fn may_hold_a_role(&self, t: u32) -> bool {
        let ended_early = self.any_alive && self.by_tgid.get(&t).is_some_and(|p| !p.alive);
        !self.is_wrapper(t) && !self.before_exec.contains(&t) && !ended_early
    }

    /// Whether `t` belongs to a program that exec'd since it was forked.
    pub fn of_a_replaced_program(&self, t: u32) -> bool {
        self.before_exec.contains(&t)
    }

    /// Its distance from the top of the tree.
    pub fn depth(&self, mut t: u32) -> usize {
        let mut d = 0;
        while let Some(&pp) = self.parent.get(&t) {
            if d > 64 {
                break;
            }
            t = pp;
            d += 1;
        }
        d
    }

    /// Its children in the window.
    pub fn children(&self, t: u32) -> impl Iterator<Item = &'a ProcWindow> + '_ {
        self.kids.get(&t).into_iter().flatten().copied()
    }

    /// The process that stands for `t` when `t` may hold no role: down
    /// through wrappers, helpers and what ended, to the child that lives
    /// on and did the most (None: nothing below it may hold a role).
    pub fn standing_for(&self, mut t: u32) -> Option<u32> {
        for _ in 0..16 {
            if self.may_hold_a_role(t) {
                return Some(t);
            }
            let next = self
                .children(t)
                .filter(|c| !self.before_exec.contains(&c.tgid))
                .max_by_key(|c| (c.alive, self.cpu_with_children(c.tgid), std::cmp::Reverse(c.tgid)))?;
            t = next.tgid;
        }
        None
    }

    /// Its own time on CPU and its children's (one level: enough to tell
    /// the child that works from a helper beside it).
    fn cpu_with_children(&self, t: u32) -> u64 {
        let own = self.by_tgid.get(&t).map_or(0, |p| p.sum().on_cpu_ns);
        own + self.children(t).map(|c| c.sum().on_cpu_ns).sum::<u64>()
    }

    /// Forked before its parent (or a process above it) exec'd the
    /// program it runs now: a shim's helpers and their subshells.
    fn forked_before_exec(&self, mut t: u32) -> bool {
        for _ in 0..64 {
            let (Some(c), Some(&pp)) = (self.by_tgid.get(&t), self.parent.get(&t)) else { return false };
            let Some(p) = self.by_tgid.get(&pp) else { return false };
            if c.born_ns > 0 && p.exec_ns > c.born_ns {
                return true;
            }
            t = pp;
        }
        false
    }

    fn only_waits_for_child(&self, p: &ProcWindow) -> bool {
        let Some(first) = self.children(p.tgid).map(|c| c.started_ns).min() else { return false };
        let before_child = first.saturating_sub(p.started_ns);
        if p.started_ns == 0 || first == 0 || before_child > WRAPPER_CHILD_WITHIN_NS {
            return false;
        }
        // All it did on CPU fits before its first child started: nothing
        // after (a trainer that runs evaluations steps between them).
        if p.sum().on_cpu_ns > before_child + before_child / 10 + WRAPPER_CPU_SLACK_NS {
            return false;
        }
        // It does nothing else: reads no data, writes no file but its own
        // stdout and stderr (a trainer that waits for its uploads logs its
        // steps between them).
        let c = p.sum();
        if p.reads_data() || c.file_write_bytes > c.stdio_write_bytes {
            return false;
        }
        let Some(main) = p.main_thread() else { return false };
        let others_work = p.threads.iter().filter(|t| t.tid != main.tid).any(|t| t.delta.on_cpu_ns > 0);
        let waited = main.delta.off_ns[usize::from(stall_common::reason::OTHER)] as f64;
        let seen = (main.delta.on_cpu_ns + main.delta.off_cpu_ns()) as f64;
        main.in_child_wait() && !others_work && seen > 0.0 && waited >= WRAPPER_WAIT_SHARE * seen
    }
}

/// The bytes that can have gone from `a` to `b` through a pipe or socket:
/// what `a` wrote to such, bounded by what `b` read of such.
fn flows(a: &ProcWindow, b: &ProcWindow) -> u64 {
    a.sum().other_write_bytes.min(b.sum().other_read_bytes)
}

/// A child that looks like a data worker of its parent even when idle (a
/// hung worker is still a worker): a fork that did not exec (same command
/// line: multiprocessing's fork start method, as DataLoader uses on Linux),
/// or a multiprocessing spawn child. The resource tracker is not one.
pub fn forked_worker(child: Option<&ProcWindow>, parent: Option<&ProcWindow>) -> bool {
    let child = child.and_then(|p| p.cmdline.as_deref());
    let parent = parent.and_then(|p| p.cmdline.as_deref());
    match (child, parent) {
        (Some(c), _) if c.contains("resource_tracker") => false,
        (Some(c), Some(p)) if c == p => true,
        (Some(c), _) => c.contains("multiprocessing.spawn") || c.contains("multiprocessing.forkserver"),
        _ => false,
    }
}

/// Did this process do anything: read a file, or use the CPU (>1%)?
fn busy(p: &ProcWindow, secs: f64) -> bool {
    let c = p.sum();
    p.input_bytes() > 0 || c.file_read_calls > 0 || (c.on_cpu_ns as f64 / 1e9) / secs > 0.01
}

/// Whether a process called the job's GPU libraries: launched, copied,
/// synchronized or joined a collective. Only a trainer does.
pub fn calls_the_gpu(p: &ProcWindow) -> bool {
    let g = p.sum().gpu;
    g.launches + g.copy_calls + g.sync_calls + g.collectives > 0
}
