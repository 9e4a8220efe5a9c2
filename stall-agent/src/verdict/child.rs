//! Following a trainer's wait for a child process (`wait4`, `waitid`): an
//! evaluation, a conversion or an upload run as a subprocess. The wait is
//! followed through children that only wait for their own (a shell, a
//! wrapper script) to those that do the work, and judged by what they do
//! there (by their main threads, or by the threads of their own those
//! wait for), as a wait for a thread of its own would be.
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
    /// The threads that did it: the children's main threads, or the
    /// threads of their own those wait for, or on CPU their busiest.
    pub threads: Vec<&'a ThreadWindow>,
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
        let busiest: Vec<&ThreadWindow> = children
            .iter()
            .filter_map(|c| {
                c.threads
                    .iter()
                    .max_by(|a, b| Shares::of(a, secs).cpu().total_cmp(&Shares::of(b, secs).cpu()))
            })
            .collect();
        let cpu = Shares::of_all(busiest.iter().copied(), secs).cpu();
        let mains: Vec<(u32, &ThreadWindow)> =
            children.iter().filter_map(|c| Some((c.tgid, c.main_thread()?))).collect();
        let mut threads: Vec<&ThreadWindow> = mains.iter().map(|m| m.1).collect();
        let (mut state, mut share) = Shares::of_all(threads.iter().copied(), secs).top_wait();
        if state == reason::FUTEX && share >= rules::TRAINER_WAITS {
            // A main thread that waits for threads of its own (joins an
            // uploader's threads, waits on a pool): what they do is what
            // the child does.
            let helpers = own_wakers(&children);
            let (helpers_state, helpers_share) = Shares::of_all(helpers.iter().copied(), secs).top_wait();
            if !helpers.is_empty() && helpers_share >= rules::WORKER_SHARE && helpers_share > cpu {
                (state, share, threads) = (helpers_state, helpers_share, helpers);
            }
        }
        let passes_on = state == reason::OTHER && share >= rules::TRAINER_WAITS && share > cpu;
        if passes_on && mains.iter().any(|m| m.1.in_child_wait()) {
            waiting = mains;
            via.push(children);
            continue;
        }
        let (state, share, threads) =
            if cpu >= share { (None, cpu, busiest) } else { (Some(state), share, threads) };
        return (share >= rules::WORKER_SHARE).then_some(ChildWait {
            waits,
            via,
            children,
            state,
            share,
            threads,
        });
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
        .flat_map(|(_, t)| &t.waits_on)
        .filter_map(|(_, o)| match o {
            WaitObject::Child { children } => Some(children.iter().map(|c| c.pid)),
            _ => None,
        })
        .flatten()
        .collect();
    // Not what it forked before it exec'd its program (a shim's helpers):
    // those were the previous program's.
    let of_its_program = |p: &ProcWindow, parent: u32| {
        p.ppid == Some(parent) && !w.proc(parent).is_some_and(|pp| p.born_ns > 0 && pp.exec_ns > p.born_ns)
    };
    let children: Vec<&ProcWindow> =
        w.procs.iter().filter(|p| waiting.iter().any(|(parent, _)| of_its_program(p, *parent))).collect();
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

/// The threads of `children` that woke their own main thread.
fn own_wakers<'a>(children: &[&'a ProcWindow]) -> Vec<&'a ThreadWindow> {
    children
        .iter()
        .flat_map(|c| {
            let main = c.main_thread();
            let tids: Vec<u32> = main
                .into_iter()
                .flat_map(|m| &m.woken_by)
                .filter(|b| b.tgid == c.tgid && b.count > 0)
                .filter_map(|b| b.thread().filter(|t| Some(*t) != main.map(|m| m.tid)))
                .collect();
            c.threads.iter().filter(move |t| tids.contains(&t.tid))
        })
        .collect()
}

/// How long `p`'s main thread was seen, on CPU or off, in the window.
fn lived_ns(p: &ProcWindow) -> u64 {
    p.main_thread().map_or(0, |t| t.delta.on_cpu_ns + t.delta.off_cpu_ns())
}
