//! What ended, set aside: processes beyond [`MAX_ENDED`] and processes
//! or threads whose ids a new task took (pids wrap) are summed, so a job
//! that forks without end keeps the agent's memory bounded and a reused id
//! starts afresh.
use std::collections::{HashMap, HashSet};

use super::{Model, Proc, Thread};
use crate::aggregate::{FileWindow, ProcWindow, ThreadWindow};
use crate::decode::{Inode, ThreadCounters};

/// Ended processes kept one by one; older ones are folded into one entry.
pub const MAX_ENDED: usize = 4096;

/// Ended processes beyond [`MAX_ENDED`], summed (fork storms).
#[derive(Debug, Default)]
pub(super) struct Folded {
    procs: u64,
    counters: ThreadCounters,
    files: HashMap<String, FileWindow>,
    storage_bytes: u64,
    mmap_bytes: u64,
    mmap_shared_bytes: u64,
}

impl Model {
    /// A new task takes `tid` (a new process `tgid == tid`): whatever ended
    /// under that id before (pids wrap, and a long run sees them come back)
    /// is set aside, so the new one starts afresh instead of adding to a dead
    /// entry: an ended process is folded into the summed ones, an ended
    /// thread of a live process into that process's summed reused threads.
    /// Only once their kernel entries are freed (always, but for a pid
    /// reused within the same interval).
    pub(super) fn make_room(&mut self, tid: u32, tgid: u32) {
        let ended = |p: &Proc| !p.alive && p.retired;
        if tid == tgid && self.procs.get(&tgid).is_some_and(ended) {
            self.ended.retain(|t| *t != tgid);
            self.fold([tgid]);
        }
        let Some(old) = self.threads.get(&tid).filter(|t| !t.alive && t.retired) else { return };
        let owner = old.tgid;
        if self.procs.get(&owner).is_some_and(ended) {
            self.ended.retain(|t| *t != owner);
            self.fold([owner]);
            return;
        }
        let old = self.threads.remove(&tid).expect("found above");
        self.wakes.retain(|(wakee, waker), _| *wakee != tid && *waker != tid);
        let p = self.proc_mut(owner);
        p.tids.retain(|t| *t != tid);
        let sum = p.reused_tids.get_or_insert_with(|| {
            Box::new(Thread {
                tgid: owner,
                comm: "(ended threads whose ids were reused, summed)".into(),
                other_nr: -1,
                ..Default::default()
            })
        });
        sum.total.add(&old.total);
        sum.mark.add(&old.mark);
    }

    /// Sums the oldest ended processes beyond [`MAX_ENDED`] into one entry,
    /// so a job that forks without end keeps the agent's memory bounded.
    pub(super) fn fold_ended(&mut self) {
        if self.ended.len() <= MAX_ENDED {
            return;
        }
        let mut oldest = Vec::new();
        while self.ended.len() > MAX_ENDED {
            oldest.push(self.ended.pop_front().expect("non-empty"));
        }
        self.fold(oldest);
    }

    /// Sums ended processes into the one entry of [`Folded`].
    fn fold(&mut self, tgids: impl IntoIterator<Item = u32>) {
        let mut gone_tgids = HashSet::new();
        let mut gone_tids = HashSet::new();
        for tgid in tgids {
            if self.procs.get(&tgid).is_none_or(|p| p.alive) {
                continue; // the pid came back as a new process
            }
            self.fold_threads(tgid, &mut gone_tids);
            gone_tgids.insert(tgid);
            self.folded.procs += 1;
        }
        // One pass over the wakers, storage and folded files for the batch.
        self.wakes.retain(|(wakee, waker), _| !gone_tids.contains(wakee) && !gone_tids.contains(waker));
        self.fold_inode_bytes(&gone_tgids);
        self.inode_paths.retain(|(tgid, _), _| !gone_tgids.contains(tgid));
        self.fold_archived(&gone_tgids);
    }

    /// Removes an ended process and its threads, their counts summed;
    /// adds the threads' ids to `gone_tids`.
    fn fold_threads(&mut self, tgid: u32, gone_tids: &mut HashSet<u32>) {
        let p = self.procs.remove(&tgid).expect("checked by the caller");
        if let Some(t) = &p.reused_tids {
            self.folded.counters.add(&t.total);
        }
        for tid in p.tids {
            if let Some(t) = self.threads.remove(&tid) {
                self.folded.counters.add(&t.total);
                gone_tids.insert(tid);
            }
        }
    }

    /// Storage and mapped bytes of the processes gone, summed (and per path
    /// where the process opened the file by one).
    fn fold_inode_bytes(&mut self, gone_tgids: &HashSet<u32>) {
        let Some(inode_bytes) = self.inode_bytes.as_mut() else { return };
        let folded = &mut self.folded;
        let paths: HashMap<(u32, Inode), String> = inode_bytes
            .keys()
            .filter(|(tgid, _)| gone_tgids.contains(tgid))
            .filter_map(|&(tgid, inode)| {
                let p = self.inode_paths.get(&(tgid, inode)).or_else(|| self.inode_names.get(&inode))?;
                Some(((tgid, inode), p.0.clone()))
            })
            .collect();
        let mmap_known = self.mmap_known;
        inode_bytes.retain(|key, s| {
            if !gone_tgids.contains(&key.0) {
                return true;
            }
            folded.storage_bytes += s.storage.total;
            folded.mmap_bytes += s.mapped.total;
            folded.mmap_shared_bytes += s.shared.total;
            if let Some(path) = paths.get(key) {
                let f = folded
                    .files
                    .entry(path.clone())
                    .or_insert_with(|| FileWindow { path: path.clone(), ..Default::default() });
                f.storage_bytes = Some(f.storage_bytes.unwrap_or(0) + s.storage.total);
                if mmap_known {
                    f.mmap_bytes = Some(f.mmap_bytes.unwrap_or(0) + s.mapped.total);
                    f.mmap_shared_bytes = Some(f.mmap_shared_bytes.unwrap_or(0) + s.shared.total);
                }
            }
            false
        });
    }

    /// Closed files of the processes gone, summed per path.
    fn fold_archived(&mut self, gone_tgids: &HashSet<u32>) {
        let keys: Vec<(u32, String)> =
            self.archived.keys().filter(|k| gone_tgids.contains(&k.0)).cloned().collect();
        for k in keys {
            let a = self.archived.remove(&k).expect("listed above");
            self.folded
                .files
                .entry(k.1)
                .or_insert_with(|| FileWindow { path: a.path.clone(), ..Default::default() })
                .add(&a);
        }
    }

    /// The whole run's entry for the folded processes (tgid 0), if any.
    pub(super) fn folded_window(&self) -> Option<ProcWindow> {
        let folded = &self.folded;
        if folded.procs == 0 {
            return None;
        }
        let mut files: Vec<FileWindow> = folded.files.values().cloned().collect();
        files.sort_by(|a, b| b.read_bytes.cmp(&a.read_bytes).then(a.path.cmp(&b.path)));
        Some(ProcWindow {
            tgid: 0,
            comm: format!("({} ended processes, summed)", folded.procs),
            other_read_bytes: folded.counters.other_read_bytes,
            threads: vec![ThreadWindow {
                tid: 0,
                comm: "(summed)".into(),
                delta: folded.counters,
                other_nr: -1,
                ..Default::default()
            }],
            files,
            storage_bytes: self.inode_bytes.as_ref().map(|_| folded.storage_bytes),
            mmap_bytes: (self.inode_bytes.is_some() && self.mmap_known).then_some(folded.mmap_bytes),
            mmap_shared_bytes: (self.inode_bytes.is_some() && self.mmap_known)
                .then_some(folded.mmap_shared_bytes),
            ..Default::default()
        })
    }
}
