//! The model cut into [`Window`]s: an interval (what the kernel counted
//! since the last mark) or the whole run (everything counted so far).
use std::collections::HashMap;

use stall_common::{counter::LOST_CAUSES, fd_kind, WAKER_ANY_THREAD};

use super::{Model, Thread};
use crate::aggregate::{files::add_known, window::fold_small_ended};
use crate::aggregate::{CpuLimitWindow, FdWait, FileWindow, ProcWindow, ThreadWindow, Waker, Window};
use crate::decode::ThreadCounters;

/// Where each process sits in a window's list.
type Index = HashMap<u32, usize>;

/// A window's files by (index of the process, path), before they are
/// filed under their process.
type ByPath<'a> = HashMap<(usize, &'a str), FileWindow>;

impl Model {
    /// The window since the previous call, and starts the next one.
    pub fn interval(&mut self, end_ns: u64) -> Window {
        let w = self.window(self.mark_ns, end_ns, true);
        self.mark_ns = end_ns;
        for t in self
            .threads
            .values_mut()
            .chain(self.procs.values_mut().filter_map(|p| p.reused_tids.as_deref_mut()))
        {
            t.mark = t.total;
        }
        for f in self.files.values_mut() {
            f.mark = f.total;
        }
        for w in self.wakes.values_mut() {
            w.count.set_mark();
            w.blocked.set_mark();
        }
        for t in self.fd_waits.values_mut() {
            t.set_mark();
        }
        for s in self.inode_bytes.iter_mut().flat_map(|m| m.values_mut()) {
            s.storage.set_mark();
            s.mapped.set_mark();
            s.shared.set_mark();
        }
        for l in self.cpu_limits.values_mut() {
            l.set_mark();
        }
        self.opened.clear();
        self.lost_mark = self.lost;
        self.events_mark = self.events;
        self.closing.clear();
        self.fold_ended();
        w
    }

    /// The whole run so far.
    pub fn summary(&self, end_ns: u64) -> Window {
        self.window(self.start_ns, end_ns, false)
    }

    /// `since_mark`: an interval (counts since the last mark), else the
    /// whole run.
    fn window(&self, start_ns: u64, end_ns: u64, since_mark: bool) -> Window {
        let mut procs = self.proc_windows();
        let index: Index = procs.iter().enumerate().map(|(i, p)| (p.tgid, i)).collect();
        self.add_threads(&mut procs, &index, since_mark);
        self.add_fd_waits(&mut procs, &index, since_mark);
        let mut by_path = self.file_windows(&index, start_ns, end_ns, since_mark);
        self.add_inode_bytes(&mut procs, &mut by_path, &index, since_mark);
        for ((i, _), fw) in by_path {
            procs[i].files.push(fw);
        }
        if !since_mark {
            procs.extend(self.folded_window());
        }
        for p in &mut procs {
            let (mut sockets, files): (Vec<FileWindow>, _) =
                std::mem::take(&mut p.files).into_iter().partition(|f| f.socket);
            for s in &mut sockets {
                s.ipc = self.peers.get(&s.path).copied().unwrap_or(false);
            }
            (p.files, p.sockets) = (files, sockets);
            p.files.sort_by(|a, b| b.read_bytes.cmp(&a.read_bytes).then(a.path.cmp(&b.path)));
            p.sockets.sort_by(|a, b| b.read_bytes.cmp(&a.read_bytes).then(a.path.cmp(&b.path)));
            p.threads.sort_by_key(|t| t.tid);
        }
        // Processes with nothing in this window (gone before it) are left out.
        procs.retain(|p| !p.threads.is_empty() || !p.files.is_empty() || !p.sockets.is_empty() || p.alive);
        if since_mark {
            fold_small_ended(&mut procs);
        }
        let (lost, events) = self.lost_and_events(since_mark);
        let cpu_limits = self
            .cpu_limits
            .iter()
            .map(|(cgroup, l)| {
                let [periods, throttled_periods, throttled_ns] = l.counts(since_mark);
                CpuLimitWindow {
                    cgroup: cgroup.clone(),
                    cpus: l.cpus,
                    periods,
                    throttled_periods,
                    throttled_ns,
                }
            })
            .collect();
        Window {
            start_ns,
            end_ns,
            procs,
            lost,
            events,
            sched_gaps: self.sched_gaps,
            sched_repaired: self.sched_repaired,
            cpu_limits,
        }
    }

    /// Every process known, with nothing counted yet.
    fn proc_windows(&self) -> Vec<ProcWindow> {
        self.procs
            .values()
            .map(|p| ProcWindow {
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
            })
            .collect()
    }

    /// Who woke each thread, how often, and how long it had been blocked
    /// when they did, in the window.
    fn wakers(&self, since_mark: bool) -> HashMap<u32, Vec<Waker>> {
        let mut woken: HashMap<u32, Vec<Waker>> = HashMap::new();
        for (&(wakee, waker), w) in &self.wakes {
            let n = w.count.since(since_mark);
            if n > 0 {
                let blocked_ns = w.blocked.since(since_mark);
                // A traced waker's current name (the kernel's is from its
                // first wakeup, maybe before it renamed itself); a process's
                // for wakes counted per process.
                let comm = match waker & WAKER_ANY_THREAD {
                    0 => self.threads.get(&waker).map(|t| &t.comm),
                    _ => self.procs.get(&w.waker_tgid).map(|p| &p.comm),
                };
                let comm = comm.filter(|c| !c.is_empty()).unwrap_or(&w.waker_comm).clone();
                woken.entry(wakee).or_default().push(Waker {
                    tid: waker,
                    tgid: w.waker_tgid,
                    comm,
                    count: n,
                    blocked_ns,
                });
            }
        }
        woken
    }

    /// How long each process was blocked on each descriptor in the
    /// window, named by what the descriptor is open on where the model
    /// knows (a file's path, a socket's peer), else by its number.
    fn add_fd_waits(&self, procs: &mut [ProcWindow], index: &Index, since_mark: bool) {
        for (&(tgid, fd), t) in &self.fd_waits {
            let (Some(&i), ns) = (index.get(&tgid), t.since(since_mark)) else { continue };
            if ns == 0 {
                continue;
            }
            let file = self.open_fds.get(&(tgid, fd)).and_then(|id| self.files.get(id));
            let object = file.map(|f| f.path.clone());
            let outside =
                file.is_some_and(|f| f.kind == fd_kind::SOCKET && self.peers.get(&f.path) == Some(&false));
            procs[i].fd_waits.push(FdWait { fd, object, outside, blocked_ns: ns });
        }
        for p in procs.iter_mut() {
            p.fd_waits.sort_by(|a, b| b.blocked_ns.cmp(&a.blocked_ns).then(a.fd.cmp(&b.fd)));
        }
    }

    /// Each thread's counts in the window (and its wakers), under its
    /// process; the summed threads of reused ids too.
    fn add_threads(&self, procs: &mut [ProcWindow], index: &Index, since_mark: bool) {
        let mut woken = self.wakers(since_mark);
        let reused = || self.procs.values().filter_map(|p| p.reused_tids.as_deref());
        let in_window = |t: &Thread| {
            let i = *index.get(&t.tgid)?;
            let delta = if since_mark { t.total.saturating_sub(&t.mark) } else { t.total };
            // A thread that exited before this window adds nothing to it
            // (nor do reused ids' threads that counted nothing).
            let nothing = (since_mark || t.tid == 0) && !t.alive && delta == ThreadCounters::default();
            (!nothing).then_some((i, delta))
        };
        // Each process's list at its exact size: most processes of a fork
        // storm have one thread, and a list grown by pushes would hold four.
        let mut counts = vec![0usize; procs.len()];
        for (i, _) in self.threads.values().chain(reused()).filter_map(in_window) {
            counts[i] += 1;
        }
        for (p, n) in procs.iter_mut().zip(counts) {
            p.threads.reserve_exact(n);
        }
        for t in self.threads.values().chain(reused()) {
            let Some((i, delta)) = in_window(t) else { continue };
            let mut by = woken.remove(&t.tid).unwrap_or_default();
            Waker::rank(&mut by);
            let comm = if t.comm.is_empty() { procs[i].comm.clone() } else { t.comm.clone() };
            procs[i].other_read_bytes += delta.other_read_bytes;
            procs[i].threads.push(ThreadWindow {
                tid: t.tid,
                comm,
                delta,
                now: t.now,
                other_nr: t.other_nr,
                alive: t.alive,
                woken_by: by,
                waits_on: Vec::new(),
            });
        }
    }

    /// What the processes' files read and wrote in the window, per path:
    /// closed files as folded, then the open ones.
    fn file_windows(&self, index: &Index, start_ns: u64, end_ns: u64, since_mark: bool) -> ByPath<'_> {
        let mut by_path = ByPath::new();
        let folded = if since_mark { &self.closing } else { &self.archived };
        for ((tgid, path), a) in folded {
            if let Some(&i) = index.get(tgid) {
                by_path.insert((i, path.as_str()), a.clone());
            }
        }
        for f in self.files.values() {
            let Some(&i) = index.get(&f.tgid) else { continue };
            if f.kind == fd_kind::OTHER {
                continue;
            }
            let d = if since_mark { f.total.saturating_sub(&f.mark) } else { f.total };
            let opened_now = (!since_mark && !f.dup) || self.opened.contains(&f.file_id);
            if since_mark && d.read_calls == 0 && d.write_calls == 0 && !opened_now {
                continue;
            }
            let e = by_path.entry((i, f.path.as_str())).or_insert_with(|| FileWindow {
                path: f.path.clone(),
                resolved: f.resolved.clone(),
                socket: f.kind == fd_kind::SOCKET,
                ..Default::default()
            });
            e.opens += u64::from(opened_now);
            if !f.dup {
                let from = f.open_ts.max(start_ns);
                let to = f.close_ts.unwrap_or(end_ns).min(end_ns);
                e.open_ns += to.saturating_sub(from);
            }
            e.add_counters(&d);
        }
        by_path
    }

    /// Storage and mapped bytes, per process and per path it opened the
    /// file by; left `None` where this kernel does not count them.
    fn add_inode_bytes<'a>(
        &'a self,
        procs: &mut [ProcWindow],
        by_path: &mut ByPath<'a>,
        index: &Index,
        since_mark: bool,
    ) {
        let Some(inode_bytes) = &self.inode_bytes else { return };
        let mmap_zero = self.mmap_known.then_some(0);
        for p in procs.iter_mut() {
            (p.storage_bytes, p.mmap_bytes, p.mmap_shared_bytes) = (Some(0), mmap_zero, mmap_zero);
        }
        for f in by_path.values_mut() {
            (f.storage_bytes, f.mmap_bytes, f.mmap_shared_bytes) = (Some(0), mmap_zero, mmap_zero);
        }
        for ((tgid, inode), s) in inode_bytes {
            let Some(&i) = index.get(tgid) else { continue };
            let storage = s.storage.since(since_mark);
            let (mapped, shared) = (s.mapped.since(since_mark), s.shared.since(since_mark));
            if storage == 0 && mapped == 0 && shared == 0 {
                continue;
            }
            let p = &mut procs[i];
            p.storage_bytes = add_known(p.storage_bytes, Some(storage));
            p.mmap_bytes = add_known(p.mmap_bytes, mmap_zero.map(|_| mapped));
            p.mmap_shared_bytes = add_known(p.mmap_shared_bytes, mmap_zero.map(|_| shared));
            // Under the path it opened the file by, or another process
            // did, or its mappings name; else for the process only.
            let Some((path, resolved)) = self.inode_path(*tgid, *inode) else { continue };
            let e = by_path.entry((i, path.as_str())).or_insert_with(|| FileWindow {
                path: path.clone(),
                resolved: resolved.clone(),
                storage_bytes: Some(0),
                mmap_bytes: mmap_zero,
                mmap_shared_bytes: mmap_zero,
                ..Default::default()
            });
            e.storage_bytes = add_known(e.storage_bytes, Some(storage));
            e.mmap_bytes = add_known(e.mmap_bytes, mmap_zero.map(|_| mapped));
            e.mmap_shared_bytes = add_known(e.mmap_shared_bytes, mmap_zero.map(|_| shared));
        }
    }

    /// Events the kernel side dropped, by cause, and events handled: in
    /// the window, or the whole run.
    fn lost_and_events(&self, since_mark: bool) -> ([u64; LOST_CAUSES], u64) {
        if since_mark {
            let mut l = [0; LOST_CAUSES];
            for (i, v) in l.iter_mut().enumerate() {
                *v = self.lost[i].saturating_sub(self.lost_mark[i]);
            }
            (l, self.events.saturating_sub(self.events_mark))
        } else {
            (self.lost, self.events)
        }
    }
}
