//! The counters the kernel keeps, per thread, per descriptor and per GPU
//! call, as plain values, and [`fold`], which adds a thread's span in
//! progress at snapshot time to its kernel stats.
use stall_common::{kclock, reason, run_state, FileStats, ThreadStats};

/// One counter of a set: added field by field, and subtracted (an earlier
/// value of the same counter) without going below zero.
pub trait Counter {
    fn add(&mut self, o: &Self);
    fn since(&self, earlier: &Self) -> Self;
}

impl Counter for u64 {
    fn add(&mut self, o: &Self) {
        *self += o;
    }
    fn since(&self, earlier: &Self) -> Self {
        self.saturating_sub(*earlier)
    }
}

impl<const N: usize> Counter for [u64; N] {
    fn add(&mut self, o: &Self) {
        for (a, b) in self.iter_mut().zip(o) {
            *a += b;
        }
    }
    fn since(&self, earlier: &Self) -> Self {
        std::array::from_fn(|i| self[i].saturating_sub(earlier[i]))
    }
}

/// A count that may not have been seen (`None`): known if either side is;
/// what was counted since stays unknown where it was.
impl Counter for Option<u64> {
    fn add(&mut self, o: &Self) {
        if self.is_some() || o.is_some() {
            *self = Some(self.unwrap_or(0) + o.unwrap_or(0));
        }
    }
    fn since(&self, earlier: &Self) -> Self {
        self.map(|a| a.saturating_sub(earlier.unwrap_or(0)))
    }
}

/// Declares a set of counters once: the struct (fields under `keep` are
/// carried along, not counted) and its field-wise [`Counter`] operations,
/// `add` and `saturating_sub`, so that a new counter is its declaration
/// and its use, nothing more.
macro_rules! counters {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $(keep {
                $($(#[$kmeta:meta])* pub $kfield:ident: $kty:ty,)*
            })?
            $($(#[$fmeta:meta])* pub $field:ident: $ty:ty,)*
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $($($(#[$kmeta])* pub $kfield: $kty,)*)?
            $($(#[$fmeta])* pub $field: $ty,)*
        }

        impl $crate::decode::Counter for $name {
            fn add(&mut self, o: &Self) {
                $($crate::decode::Counter::add(&mut self.$field, &o.$field);)*
            }
            fn since(&self, earlier: &Self) -> Self {
                Self {
                    $($($kfield: self.$kfield.clone(),)*)?
                    $($field: $crate::decode::Counter::since(&self.$field, &earlier.$field),)*
                }
            }
        }

        impl $name {
            /// Adds `o`'s counts to these.
            pub fn add(&mut self, o: &Self) {
                $crate::decode::Counter::add(self, o)
            }
            /// What was counted since `earlier` (an earlier value of the
            /// same counters); what is kept, as it is now.
            pub fn saturating_sub(&self, earlier: &Self) -> Self {
                $crate::decode::Counter::since(self, earlier)
            }
        }
    };
}
pub(crate) use counters;

counters! {
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
}

counters! {
    /// A thread's calls into the job's GPU libraries (uprobes on CUDA and
    /// NCCL): its time inside the calls that wait for the GPU, its kernel
    /// launches, its collectives and how late it came to them.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct GpuCounters {
        pub sync_ns: u64,
        pub sync_calls: u64,
        pub copy_ns: u64,
        pub copy_calls: u64,
        pub copy_bytes: u64,
        pub launches: u64,
        /// NCCL collectives and point-to-point calls.
        pub collectives: u64,
        /// From a collective's call to the return of the synchronization
        /// after it (the wait in progress counted so far), and how many
        /// ended.
        pub collective_wait_ns: u64,
        pub collective_waits: u64,
        /// The same time of the waits that ended only: what their mean is
        /// taken over (a window that ends inside a wait would otherwise
        /// lend it to the waits that ended, a short window most).
        pub collective_waited_ns: u64,
        /// Its collectives whose arrival was compared with the other ranks'
        /// on this node, how often it came last, and how long after the
        /// first rank in all (see `aggregate::collectives`).
        pub arrivals_compared: u64,
        pub arrivals_last: u64,
        pub arrival_late_ns: u64,
    }
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
            collectives: c.collectives,
            collective_wait_ns: c.collective_wait_ns,
            collective_waits: c.collective_waits,
            collective_waited_ns: c.collective_wait_ns,
            ..Self::default()
        };
        if c.collective_since != 0 {
            g.collective_wait_ns += now.saturating_sub(c.collective_since);
        }
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

    pub fn any(&self) -> bool {
        *self != Self::default()
    }
}

impl ThreadCounters {
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

counters! {
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

/// The syscall its time counted as OTHER was last spent in: the kernel
/// notes it as a wait ends, so a thread blocked in one since (a shell in
/// `wait4` for its only child) is named by the call it is in now.
pub fn last_other_nr(s: &ThreadStats, now: &ThreadNow) -> i32 {
    if s.state == run_state::OFF && !now.running && now.reason == reason::OTHER && now.syscall >= 0 {
        now.syscall
    } else {
        s.other_nr
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_in_progress_names_its_call() {
        let waiting = ThreadStats {
            state: run_state::OFF,
            off_reason: reason::OTHER,
            off_nr: 61,
            other_nr: -1,
            last_ts: 100,
            ..Default::default()
        };
        let (_, n) = fold(&waiting, 1100);
        assert_eq!(last_other_nr(&waiting, &n), 61);
        // Blocked in a futex now: the last OTHER call stays the one named.
        let futex = ThreadStats { off_reason: reason::FUTEX, off_nr: 202, other_nr: 61, ..waiting };
        let (_, n) = fold(&futex, 1100);
        assert_eq!(last_other_nr(&futex, &n), 61);
        let running = ThreadStats { state: run_state::RUNNING, ..waiting };
        let (_, n) = fold(&running, 1100);
        assert_eq!(last_other_nr(&running, &n), -1);
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
