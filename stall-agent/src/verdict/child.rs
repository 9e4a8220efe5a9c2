//! Following a trainer's wait for a child process (`wait4`, `waitid`): an
//! evaluation, a conversion or an upload run as a subprocess. The wait is
//! followed through children that only wait for their own (a shell, a
//! wrapper script) to those that do the work, and judged by what they do
//! there, as a wait for a thread of its own would be.
use std::cmp::Reverse;

use stall_common::reason;

use super::{rules, shares::Shares};
use crate::{
    aggregate::{ProcWindow, ThreadWindow, Window},
    correlate::FEEDER_MIN_WAKES,
    wait::WaitObject,
};

/// Children waiting for children, at most: a launcher, a shell, a script.
const MAX_DEPTH: usize = 4;

/// Where a trainer's wait for its children leads.
pub(super) struct ChildWait<'a> {
    /// The trainer main thread's share blocked waiting for children.
    pub waits: f64,
    /// The children it went through, level by level, each waiting for the
    /// next (shells), the longest-lived first.
    pub via: Vec<Vec<&'a ProcWindow>>,
    /// The children at its end, one after another in the window, the
    /// longest-lived first.
    pub children: Vec<&'a ProcWindow>,
    /// What they did: on CPU (None) or blocked for that reason; and that
    /// share of their own time.
    pub state: Option<u8>,
    pub share: f64,
}

/// The trainer's main thread blocked at least `TRAINER_WAITS` of the window
/// in a wait for children: where that wait leads, if its children spend
/// a fair share of their time (`WORKER_SHARE`) in one state.
pub(super) fn follow<'a>(
    w: &'a Window,
    trainer: &'a ProcWindow,
    main: &'a ThreadWindow,
    waits: f64,
    secs: f64,
) -> Option<ChildWait<'a>> {
    if waits < rules::TRAINER_WAITS || !main.in_child_wait() {
        return None;
    }
    let mut via = Vec::new();
    let mut waiting: Vec<(u32, &ThreadWindow)> = vec![(trainer.tgid, main)];
    for _ in 0..MAX_DEPTH {
        let children = waited_for(w, &waiting);
        if children.is_empty() {
            return None;
        }
        // On CPU: each child's busiest thread (a pool computing while its
        // main thread waits for it counts as the child computing).
        let busiest = children.iter().filter_map(|c| {
            c.threads.iter().max_by(|a, b| Shares::of(a, secs).cpu().total_cmp(&Shares::of(b, secs).cpu()))
        });
        let cpu = Shares::of_all(busiest, secs).cpu();
        let mains: Vec<(u32, &ThreadWindow)> =
            children.iter().filter_map(|c| Some((c.tgid, c.main_thread()?))).collect();
        let (state, share) = Shares::of_all(mains.iter().map(|m| m.1), secs).top_wait();
        let passes_on = state == reason::OTHER && share >= rules::TRAINER_WAITS && share > cpu;
        if passes_on && mains.iter().any(|m| m.1.in_child_wait()) {
            waiting = mains;
            via.push(children);
            continue;
        }
        let (state, share) = if cpu >= share { (None, cpu) } else { (Some(state), share) };
        return (share >= rules::WORKER_SHARE).then_some(ChildWait { waits, via, children, state, share });
    }
    None
}

/// The children that the `waiting` (a process, and its thread that waits)
/// wait for, the longest-lived first: those whose exit ended a wait or
/// that /proc named — not a helper it keeps, nor the DataLoader workers a
/// trainer also has, which wake it batch after batch where an exit wakes
/// it once; else all their children in the window.
fn waited_for<'a>(w: &'a Window, waiting: &[(u32, &ThreadWindow)]) -> Vec<&'a ProcWindow> {
    let named: Vec<u32> = waiting
        .iter()
        .filter_map(|(_, t)| match &t.waits_on {
            Some((_, WaitObject::Child { children })) => Some(children.iter().map(|c| c.pid)),
            _ => None,
        })
        .flatten()
        .collect();
    let children: Vec<&ProcWindow> =
        w.procs.iter().filter(|p| waiting.iter().any(|(parent, _)| p.ppid == Some(*parent))).collect();
    let wakes = |p: &ProcWindow| -> u64 {
        waiting.iter().flat_map(|(_, t)| &t.woken_by).filter(|b| b.tgid == p.tgid).map(|b| b.count).sum()
    };
    let feeds = |p: &&ProcWindow| wakes(p) >= FEEDER_MIN_WAKES;
    let ended = |p: &&ProcWindow| named.contains(&p.tgid) || (wakes(p) > 0 && !feeds(p));
    let mut picked: Vec<&ProcWindow> = children.iter().copied().filter(ended).collect();
    if picked.is_empty() {
        picked = children.into_iter().filter(|p| !feeds(p)).collect();
    }
    picked.sort_by_key(|p| (Reverse(lived_ns(p)), p.tgid));
    picked
}

/// How long `p`'s main thread was seen, on CPU or off, in the window.
fn lived_ns(p: &ProcWindow) -> u64 {
    p.main_thread().map_or(0, |t| t.delta.on_cpu_ns + t.delta.off_cpu_ns())
}
