//! [`Window::since`]: a view of the whole run minus an earlier view of it,
//! what happened in between.
use super::{CpuLimitWindow, FdWait, FileWindow, ProcWindow, ThreadWindow, Waker, Window};
use crate::decode::ThreadCounters;

fn sub_known(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    crate::decode::Counter::since(&a, &b)
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
                mmap_shared_bytes: sub_known(p.mmap_shared_bytes, b.mmap_shared_bytes),
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
        let d = f.saturating_sub(bf);
        if d.read_calls + d.write_calls + d.opens > 0
            || d.open_ns > 0
            || d.storage_bytes > Some(0)
            || d.mmap_bytes > Some(0)
            || d.mmap_shared_bytes > Some(0)
        {
            out.push(d);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_subtracts_an_earlier_view_of_the_same_run() {
        let thread = |tid: u32, on: u64, wakes: u64| ThreadWindow {
            tid,
            alive: true,
            delta: ThreadCounters { on_cpu_ns: on, ..Default::default() },
            woken_by: vec![Waker { tid: 9, tgid: 9, comm: "w".into(), count: wakes, blocked_ns: 0 }],
            ..Default::default()
        };
        let file = |bytes: u64| FileWindow {
            path: "/a".into(),
            read_bytes: bytes,
            read_calls: bytes / 10,
            ..Default::default()
        };
        let proc = |on: u64, wakes: u64, bytes: u64, alive: bool| ProcWindow {
            tgid: 1,
            alive,
            threads: vec![ThreadWindow { alive, ..thread(1, on, wakes) }],
            files: vec![file(bytes)],
            ..Default::default()
        };
        let before = Window {
            start_ns: 0,
            end_ns: 10,
            procs: vec![proc(100, 3, 50, true)],
            events: 4,
            ..Default::default()
        };
        let mut now = Window {
            start_ns: 0,
            end_ns: 30,
            procs: vec![proc(160, 10, 250, true)],
            events: 9,
            ..Default::default()
        };
        // A process that ended before, and one that came after.
        now.procs.push(ProcWindow { tgid: 2, ..proc(5, 0, 0, false) });
        let before = Window {
            procs: [before.procs.clone(), vec![ProcWindow { tgid: 2, ..proc(5, 0, 0, false) }]].concat(),
            ..before
        };
        now.procs.push(ProcWindow { tgid: 3, ..proc(7, 1, 20, true) });
        let d = now.since(&before);
        assert_eq!((d.start_ns, d.end_ns, d.events), (10, 30, 5));
        let p = d.proc(1).unwrap();
        assert_eq!(p.threads[0].delta.on_cpu_ns, 60);
        assert_eq!(p.threads[0].woken_by[0].count, 7);
        assert_eq!((p.files[0].read_bytes, p.files[0].read_calls), (200, 20));
        assert!(d.proc(2).is_none(), "ended before: nothing since");
        assert_eq!(d.proc(3).unwrap().threads[0].delta.on_cpu_ns, 7, "new since: all of it");
    }
}
