//! A thread's window as shares of its own time: on CPU, and off CPU by
//! reason. What the rules compare against their thresholds.
use stall_common::reason;

use crate::aggregate::ThreadWindow;

/// Shares of a thread's window by state (each of on-CPU and the reasons).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Shares {
    pub on: f64,
    off: [f64; reason::COUNT],
}

/// The thread's own time in a window of `secs`: what it was seen on and
/// off CPU, up to the window.
fn wall_ns(t: &ThreadWindow, secs: f64) -> f64 {
    let window = secs.max(1e-9) * 1e9;
    let accounted = (t.delta.on_cpu_ns + t.delta.off_cpu_ns()) as f64;
    if accounted > 0.0 {
        accounted.min(window)
    } else {
        window
    }
}

impl Shares {
    /// Shares of the thread's own time in the window: a worker that lived
    /// one epoch of three is judged on that epoch (non-persistent
    /// DataLoader workers), not diluted by the time before it existed.
    pub fn of(t: &ThreadWindow, secs: f64) -> Self {
        let wall = wall_ns(t, secs);
        let mut off = [0.0; reason::COUNT];
        for (i, v) in off.iter_mut().enumerate() {
            *v = t.delta.off_ns[i] as f64 / wall;
        }
        Self { on: t.delta.on_cpu_ns as f64 / wall, off }
    }

    /// Shares of several threads' windows taken together, each over its own
    /// time: children run one after another are judged on what they did
    /// while they lived.
    pub fn of_all<'a>(threads: impl IntoIterator<Item = &'a ThreadWindow>, secs: f64) -> Self {
        let (mut wall, mut on, mut off) = (0.0, 0.0, [0.0; reason::COUNT]);
        for t in threads {
            wall += wall_ns(t, secs);
            on += t.delta.on_cpu_ns as f64;
            for (sum, ns) in off.iter_mut().zip(t.delta.off_ns) {
                *sum += ns as f64;
            }
        }
        let wall = if wall > 0.0 { wall } else { 1.0 };
        Self { on: on / wall, off: off.map(|ns| ns / wall) }
    }

    /// `ns` of the thread's time, as a share of it (as `of` counts it).
    pub fn part(t: &ThreadWindow, secs: f64, ns: u64) -> f64 {
        ns as f64 / wall_ns(t, secs)
    }

    pub fn r(&self, r: u8) -> f64 {
        self.off[usize::from(r)]
    }

    /// Off CPU while not runnable.
    pub fn blocked(&self) -> f64 {
        self.off.iter().sum::<f64>() - self.runnable()
    }

    /// Runnable but off CPU: waiting for a CPU, or held back by a CPU limit.
    pub fn runnable(&self) -> f64 {
        self.r(reason::RUNQUEUE) + self.r(reason::THROTTLED)
    }

    /// What the thread wanted of the CPU: on it, or runnable.
    pub fn cpu(&self) -> f64 {
        self.on + self.runnable()
    }

    /// Where the thread spent most of the window (reason, share).
    pub fn top_wait(&self) -> (u8, f64) {
        (0..reason::COUNT as u8)
            .filter(|r| !is_runnable(*r))
            .map(|r| (r, self.r(r)))
            .fold((reason::OTHER, 0.0), |a, b| if b.1 > a.1 { b } else { a })
    }

    /// The waits at or above `min`, largest first.
    pub fn waits_above(&self, min: f64) -> Vec<(u8, f64)> {
        let mut parts: Vec<(u8, f64)> = (0..reason::COUNT as u8)
            .filter(|r| !is_runnable(*r))
            .map(|r| (r, self.r(r)))
            .filter(|x| x.1 >= min)
            .collect();
        parts.sort_by(|a, b| b.1.total_cmp(&a.1));
        parts
    }
}

/// `share` of each of `threads`' windows, averaged (0 for no thread).
pub(super) fn mean<'a>(
    threads: impl IntoIterator<Item = &'a ThreadWindow>,
    secs: f64,
    share: impl Fn(&Shares) -> f64,
) -> f64 {
    let (sum, n) =
        threads.into_iter().fold((0.0, 0usize), |(sum, n), t| (sum + share(&Shares::of(t, secs)), n + 1));
    if n == 0 {
        0.0
    } else {
        sum / n as f64
    }
}

fn is_runnable(r: u8) -> bool {
    r == reason::RUNQUEUE || r == reason::THROTTLED
}
