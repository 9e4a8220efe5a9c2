//! The counter maps, read back: one snapshot of every thread, descriptor,
//! waker and page-cache count, and retirement of what ended.
use std::collections::HashSet;

use aya::maps::{HashMap, MapData, PerCpuValues};
use stall_common::{
    counter, slot_state, CpuSlot, FdKey, FileStats, ThreadStats, WakeCache, WakeKey, WAIT_NOTED,
    WAKER_ANY_THREAD, WAKE_CACHE_SLOTS,
};

use super::Capture;
use crate::{
    clock::monotonic_ns,
    decode::{self, FdWaitSnap, FileSnap, Inode, InodeSnap, Snapshot, ThreadSnap, WakeSnap},
};

impl Capture {
    /// Reads every counter map once.
    pub fn snapshot(&self) -> Snapshot {
        let ts = monotonic_ns();
        let mut wakes: Vec<WakeSnap> = self
            .wakes
            .iter()
            .chain(self.wakes_by_proc.iter())
            .filter_map(Result::ok)
            .map(|(k, w)| WakeSnap {
                wakee: k.wakee,
                waker: k.waker,
                waker_tgid: w.waker_tgid,
                // Waker 0: the kernel, in an interrupt (see `in_interrupt`).
                waker_comm: if k.waker == 0 {
                    decode::KERNEL_WAKER.into()
                } else {
                    decode::comm(&w.waker_comm)
                },
                count: w.count,
                blocked_ns: w.blocked_ns,
            })
            .collect();
        // After the map, as the slots: a pair flushed meanwhile is counted
        // short until the next snapshot, never twice. The threads' blocked
        // time not yet in their pairs is read after both, for the same reason.
        add_pending_wakes(&mut wakes, &self.wake_caches());
        let mut fd_waits: Vec<FdWaitSnap> = self
            .fd_waits
            .iter()
            .filter_map(Result::ok)
            .map(|(k, blocked_ns)| FdWaitSnap { tgid: k.tgid, fd: k.fd, blocked_ns })
            .collect();
        let mut threads: Vec<(u32, ThreadStats)> = self.threads.iter().filter_map(Result::ok).collect();
        add_pending_waits(&mut wakes, &threads);
        add_pending_fd_waits(&mut fd_waits, &threads);
        for (tid, u) in self.uring_reads.iter().filter_map(Result::ok) {
            if let Some((_, t)) = threads.iter_mut().find(|(t, _)| *t == tid) {
                t.add_uring_reads(&u);
            }
        }
        let mut files: Vec<(FdKey, FileStats)> = self.files.iter().filter_map(Result::ok).collect();
        // After the maps: a slot flushed meanwhile is then counted in
        // neither (until the next snapshot), never in both.
        let slots = self.cpu_slots();
        let mut events = self.counter_sum(counter::EVENTS);
        for r in &slots {
            events += r.events;
            if let Some((_, t)) = threads.iter_mut().find(|(tid, _)| *tid == r.tid) {
                t.add_slot_counts(r);
            }
            if r.file_calls > 0 {
                if let Some(f) = open_of(&mut files, r.tgid, r.file_fd, r.file_id) {
                    f.add_slot_file(r);
                }
            }
            if r.write_calls > 0 {
                if let Some(f) = open_of(&mut files, r.tgid, r.write_fd, r.write_file_id) {
                    f.add_slot_writes(r);
                }
            }
        }
        let files = files.iter().map(|(k, s)| FileSnap::of(k, s)).collect();
        let threads = threads
            .into_iter()
            .map(|(tid, s)| {
                let (counters, now) = decode::fold(&s, ts);
                let other_nr = decode::last_other_nr(&s, &now);
                ThreadSnap { tid, tgid: s.tgid, job: s.job, counters, now, other_nr }
            })
            .collect();
        let mut lost = [0u64; counter::LOST_CAUSES];
        for (i, slot) in lost.iter_mut().enumerate() {
            *slot = self.counter_sum(i as u32);
        }
        lost[counter::LOST_RINGBUF as usize] += self.decode_errors;
        Snapshot {
            ts,
            threads,
            files,
            wakes,
            fd_waits,
            lost,
            events,
            sched_gaps: self.counter_sum(counter::SCHED_GAPS),
            sched_repaired: self.counter_sum(counter::SCHED_REPAIRED),
            inode_bytes: self.inode_bytes.as_ref().map(|m| {
                m.iter()
                    .filter_map(Result::ok)
                    .map(|(k, b)| InodeSnap {
                        tgid: k.tgid,
                        inode: Inode { dev: k.dev, ino: k.ino },
                        storage_bytes: b.storage,
                        mmap_bytes: b.mapped,
                        mmap_shared_bytes: b.shared,
                    })
                    .collect()
            }),
            mmap_known: self.mapped.is_some(),
            // Threads that ended keep theirs here until retired: their exit
            // record carries none.
            gpu_calls: self.gpu.as_ref().map_or_else(Vec::new, |g| {
                g.read().into_iter().map(|(tid, c)| (tid, decode::GpuCounters::of(&c, ts))).collect()
            }),
            communicators: self.gpu.as_ref().map_or_else(Vec::new, |g| {
                g.communicators().iter().map(|(k, c)| decode::CommSnap::of(k, c)).collect()
            }),
        }
    }

    /// Every CPU's cached wakeup pairs with wakeups pending (`WAKE_CACHE`).
    fn wake_caches(&self) -> Vec<WakeCache> {
        (0..WAKE_CACHE_SLOTS)
            .filter_map(|i| self.wake_cache.get(&i, 0).ok())
            .flat_map(|v| v.to_vec())
            .filter(|c| c.pending != 0)
            .collect()
    }

    /// Every CPU's slot (`CPU_SLOT`) that holds a tracked thread.
    fn cpu_slots(&self) -> Vec<CpuSlot> {
        match self.cpu_slot.get(&0, 0) {
            Ok(v) => v.iter().filter(|r| r.tracked == slot_state::TRACKED).copied().collect(),
            Err(_) => Vec::new(),
        }
    }

    /// Clears the CPUs' cached wakeup pairs that `gone` names, whose
    /// entries were just removed: a new thread given a gone one's id must
    /// get an entry of its own. Their pending wakeups go with them; so may
    /// one a CPU adds to another pair meanwhile (written back as read).
    fn forget_wake_pairs(&mut self, gone: impl Fn(&WakeKey) -> bool) {
        for i in 0..WAKE_CACHE_SLOTS {
            let Ok(v) = self.wake_cache.get(&i, 0) else {
                continue;
            };
            let mut v = v.to_vec();
            let mut changed = false;
            for c in v.iter_mut().filter(|c| c.key.wakee != 0 && gone(&c.key)) {
                *c = WakeCache::default();
                changed = true;
            }
            if let (true, Ok(v)) = (changed, PerCpuValues::try_from(v)) {
                let _ = self.wake_cache.set(i, v, 0);
            }
        }
    }

    fn counter_sum(&self, idx: u32) -> u64 {
        self.counters.get(&idx, 0).map(|v| v.iter().sum()).unwrap_or(0)
    }

    /// Forgets processes and threads that are gone: their descriptors (whose
    /// final counts are returned; exit closes files without `close`), and
    /// the waker counts of the threads. (Thread entries the kernel removes at
    /// exit itself.)
    pub fn retire(&mut self, tgids: &HashSet<u32>, tids: &HashSet<u32>) -> Vec<FileSnap> {
        let mut out = Vec::new();
        if !tgids.is_empty() {
            out = remove_where(&mut self.files, |k, _| tgids.contains(&k.tgid))
                .iter()
                .map(|(k, s)| FileSnap::of(k, s))
                .collect();
            if let Some(inode_bytes) = self.inode_bytes.as_mut() {
                // Their last counts were in the snapshot just taken.
                remove_where(inode_bytes, |k, _| tgids.contains(&k.tgid));
            }
        }
        if tids.is_empty() && tgids.is_empty() {
            return out;
        }
        // Dead wakers too: a parent woken by each of a million short-lived
        // children would otherwise fill the map (the model keeps the counts).
        let gone = |k: &WakeKey| {
            tids.contains(&k.wakee)
                || match k.waker & WAKER_ANY_THREAD {
                    0 => tids.contains(&k.waker),
                    _ => tgids.contains(&(k.waker & !WAKER_ANY_THREAD)),
                }
        };
        remove_where(&mut self.wakes, |k, _| gone(k));
        remove_where(&mut self.wakes_by_proc, |k, _| gone(k));
        remove_where(&mut self.fd_waits, |k, _| tgids.contains(&k.tgid));
        self.forget_wake_pairs(gone);
        remove_where(&mut self.uring_reads, |tid, _| tids.contains(tid));
        if let Some(g) = self.gpu.as_mut() {
            g.retire(tids);
            g.retire_processes(tgids);
        }
        // Reads in flight when their process ended never complete for it.
        remove_where(&mut self.uring_pending, |_, r| tgids.contains(&r.tgid));
        out
    }
}

/// The `FILES` entry of `fd` of `tgid` if it still names the open `file_id`.
fn open_of(files: &mut [(FdKey, FileStats)], tgid: u32, fd: i32, file_id: u64) -> Option<&mut FileStats> {
    files.iter_mut().find(|(k, f)| k.tgid == tgid && k.fd == fd && f.file_id == file_id).map(|(_, f)| f)
}

/// Removes the entries of `map` that are `gone` (by key and value); returns them as they
/// stood just before (a process's last counts).
fn remove_where<K: aya::Pod, V: aya::Pod>(
    map: &mut HashMap<MapData, K, V>,
    gone: impl Fn(&K, &V) -> bool,
) -> Vec<(K, V)> {
    let removed: Vec<(K, V)> = map.iter().filter_map(Result::ok).filter(|(k, v)| gone(k, v)).collect();
    for (k, _) in &removed {
        let _ = map.remove(k);
    }
    removed
}

/// Adds each CPU's pending wakeups (`cached`) to their pair's count, where
/// the pair has one (an entry removed meanwhile has none: its party is gone).
fn add_pending_wakes(wakes: &mut [WakeSnap], cached: &[WakeCache]) {
    for c in cached {
        if let Some(w) = wakes.iter_mut().find(|w| w.wakee == c.key.wakee && w.waker == c.key.waker) {
            w.count += c.pending;
        }
    }
}

/// Adds each thread's blocked time that its last waker ended and the
/// kernel has not moved into the pair yet (`ThreadStats::waited_ns`) to
/// that pair: the thread's, or its waker's process's where the pair was
/// counted per process.
fn add_pending_waits(wakes: &mut [WakeSnap], threads: &[(u32, ThreadStats)]) {
    // Indexed: every thread woken since the last snapshot has some.
    let at: std::collections::HashMap<(u32, u32), usize> =
        wakes.iter().enumerate().map(|(i, w)| ((w.wakee, w.waker), i)).collect();
    for (tid, t) in threads.iter().filter(|(_, t)| t.waited_ns != 0) {
        let by = t.waited_by & !WAIT_NOTED;
        let per_proc = t.waited_by_tgid | WAKER_ANY_THREAD;
        if let Some(&i) = at.get(&(*tid, by)).or_else(|| at.get(&(*tid, per_proc))) {
            wakes[i].blocked_ns += t.waited_ns;
        }
    }
}

/// Adds each thread's blocked time on its last descriptor that the
/// kernel has not moved into `FD_WAITS` yet (`ThreadStats::fd_waited_ns`).
fn add_pending_fd_waits(fd_waits: &mut Vec<FdWaitSnap>, threads: &[(u32, ThreadStats)]) {
    // Indexed, as `add_pending_waits`: a scan per thread would cost threads
    // times descriptors at every snapshot.
    let mut at: std::collections::HashMap<(u32, i32), usize> =
        fd_waits.iter().enumerate().map(|(i, f)| ((f.tgid, f.fd), i)).collect();
    for (_, t) in threads.iter().filter(|(_, t)| t.fd_waited_ns != 0 && t.fd_waited != 0) {
        let fd = t.fd_waited - 1;
        match at.get(&(t.tgid, fd)) {
            Some(&i) => fd_waits[i].blocked_ns += t.fd_waited_ns,
            None => {
                at.insert((t.tgid, fd), fd_waits.len());
                fd_waits.push(FdWaitSnap { tgid: t.tgid, fd, blocked_ns: t.fd_waited_ns });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wake(wakee: u32, waker: u32, count: u64) -> WakeSnap {
        WakeSnap { wakee, waker, waker_tgid: waker, waker_comm: "w".into(), count, blocked_ns: 0 }
    }

    fn cached(wakee: u32, waker: u32, pending: u64) -> WakeCache {
        WakeCache { key: WakeKey { wakee, waker }, pending }
    }

    #[test]
    fn pending_wakeups_add_to_their_pair_only() {
        let mut wakes = vec![wake(1, 2, 10), wake(1, 3, 4), wake(5, 2, 1)];
        // Two CPUs' last pairs, one of them the same pair; a pair whose entry
        // is gone adds nothing.
        add_pending_wakes(&mut wakes, &[cached(1, 2, 7), cached(1, 2, 1), cached(9, 9, 100)]);
        let counts: Vec<u64> = wakes.iter().map(|w| w.count).collect();
        assert_eq!(counts, [18, 4, 1]);
    }

    #[test]
    fn pending_descriptor_waits_add_to_their_entry_or_make_one() {
        let mut fd_waits = vec![FdWaitSnap { tgid: 7, fd: 3, blocked_ns: 100 }];
        let on = |tgid: u32, fd_plus_one: i32, ns: u64| ThreadStats {
            tgid,
            fd_waited: fd_plus_one,
            fd_waited_ns: ns,
            ..Default::default()
        };
        add_pending_fd_waits(&mut fd_waits, &[(1, on(7, 4, 50)), (2, on(7, 2, 20)), (3, on(8, 0, 99))]);
        assert_eq!(
            fd_waits,
            [FdWaitSnap { tgid: 7, fd: 3, blocked_ns: 150 }, FdWaitSnap { tgid: 7, fd: 1, blocked_ns: 20 }]
        );
    }

    #[test]
    fn pending_waits_add_to_the_last_wakers_pair() {
        let per_proc = 7 | WAKER_ANY_THREAD;
        let mut wakes = vec![wake(1, 2, 10), wake(1, 3, 4), wake(5, per_proc, 1), wake(6, 2, 1)];
        let waited = |by: u32, tgid: u32, ns: u64| ThreadStats {
            waited_by: by,
            waited_by_tgid: tgid,
            waited_ns: ns,
            ..Default::default()
        };
        add_pending_waits(
            &mut wakes,
            &[
                // Noted or not, the waker is the pair's.
                (1, waited(3 | WAIT_NOTED, 3, 500)),
                // Counted per process: thread 8 of process 7.
                (5, waited(8, 7, 40)),
                // Its pair is gone: nothing.
                (9, waited(2, 2, 1000)),
                (6, waited(2, 2, 0)),
            ],
        );
        let blocked: Vec<u64> = wakes.iter().map(|w| w.blocked_ns).collect();
        assert_eq!(blocked, [0, 500, 40, 0]);
    }
}
