//! [`Window::merge`]: consecutive windows summed into the longer one.
use std::collections::HashMap;

use super::{ProcWindow, ThreadWindow, Waker, Window};
use crate::aggregate::files::add_known;

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
                        started_ns: p.started_ns,
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
                op.mmap_shared_bytes = add_known(op.mmap_shared_bytes, p.mmap_shared_bytes);
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
