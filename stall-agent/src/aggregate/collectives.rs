//! Arrivals at NCCL collectives, compared across the ranks on this node.
//! Every rank of a communicator calls the same collectives in the same
//! order, so the n-th call of each is the same collective: per collective,
//! the rank that called it last holds the others, and each rank's lateness
//! is its call's time after the first rank's. The kernel keeps each
//! communicator's last arrival times; [`Arrivals`] compares each
//! collective once, when every local rank has called it, and keeps
//! cumulative per-thread counts, which windows cut like the kernel's own.
use std::collections::HashMap;

use crate::decode::CommSnap;

/// What the comparisons said of one thread's collectives, cumulative.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArrivalCounts {
    pub compared: u64,
    pub last: u64,
    pub late_ns: u64,
}

#[derive(Debug, Default)]
pub struct Arrivals {
    /// Per communicator id: the first sequence number not compared yet.
    next: HashMap<u64, u64>,
    per_tid: HashMap<u32, ArrivalCounts>,
}

impl Arrivals {
    /// Compares the collectives every local rank of a communicator has
    /// called since the last update (those the rings still hold).
    pub fn update(&mut self, comms: &[CommSnap]) {
        let mut groups: HashMap<u64, Vec<&CommSnap>> = HashMap::new();
        for c in comms {
            let Some(id) = c.id else { continue };
            let members = groups.entry(id).or_default();
            // One entry per process: a handle reused after a destroy left
            // an older one until retired; the busier is the live one.
            match members.iter_mut().find(|m| m.tgid == c.tgid) {
                Some(m) if m.collectives < c.collectives => *m = c,
                Some(_) => {}
                None => members.push(c),
            }
        }
        for (id, members) in groups {
            if members.len() < 2 {
                continue;
            }
            let end = members.iter().map(|m| m.collectives).min().unwrap_or(0);
            let kept = members.iter().map(|m| m.oldest_kept()).max().unwrap_or(0);
            let start = self.next.get(&id).copied().unwrap_or(0).max(kept);
            for seq in start..end {
                self.compare(&members, seq);
            }
            self.next.insert(id, end.max(start));
        }
    }

    fn compare(&mut self, members: &[&CommSnap], seq: u64) {
        let Some(at): Option<Vec<u64>> = members.iter().map(|m| m.arrival(seq)).collect() else {
            return;
        };
        let first = at.iter().copied().min().unwrap_or(0);
        let last = at.iter().copied().max().unwrap_or(0);
        for (m, &t) in members.iter().zip(&at) {
            let e = self.per_tid.entry(m.tid).or_default();
            e.compared += 1;
            e.late_ns += t - first;
            // A tie names nobody.
            if t == last && last > first {
                e.last += 1;
            }
        }
    }

    /// The thread's counts so far.
    pub fn of(&self, tid: u32) -> Option<ArrivalCounts> {
        self.per_tid.get(&tid).copied()
    }

    pub fn threads(&self) -> impl Iterator<Item = (u32, ArrivalCounts)> + '_ {
        self.per_tid.iter().map(|(&t, &c)| (t, c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RING: usize = 8;

    /// A rank's communicator `id` whose `n` collectives arrived at
    /// `at(seq)` ms.
    fn rank(tgid: u32, id: u64, n: u64, at: impl Fn(u64) -> u64) -> CommSnap {
        let mut ring = vec![0; RING];
        for seq in n.saturating_sub(RING as u64)..n {
            ring[(seq % RING as u64) as usize] = at(seq) * 1_000_000;
        }
        CommSnap {
            tgid,
            comm: 0x1000 + u64::from(tgid),
            id: Some(id),
            nranks: Some(4),
            rank: Some(tgid),
            tid: tgid,
            collectives: n,
            p2p: 0,
            ring,
        }
    }

    #[test]
    fn the_rank_calling_each_collective_last_is_named_with_its_lateness() {
        let mut a = Arrivals::default();
        let ranks: Vec<CommSnap> =
            (0..4).map(|r| rank(r, 7, 5, |s| s * 300 + if r == 2 { 200 } else { r as u64 })).collect();
        a.update(&ranks);
        let late = a.of(2).unwrap();
        assert_eq!(late, ArrivalCounts { compared: 5, last: 5, late_ns: 5 * 200 * 1_000_000 });
        let early = a.of(0).unwrap();
        assert_eq!((early.compared, early.last, early.late_ns), (5, 0, 0));
        assert_eq!(a.of(3).unwrap().late_ns, 5 * 3 * 1_000_000);
    }

    #[test]
    fn each_collective_is_compared_once_and_only_when_every_rank_called_it() {
        let mut a = Arrivals::default();
        let at = |s: u64| s * 100;
        a.update(&[rank(0, 7, 3, at), rank(1, 7, 2, at)]);
        assert_eq!(a.of(0).unwrap().compared, 2);
        a.update(&[rank(0, 7, 3, at), rank(1, 7, 3, at)]);
        a.update(&[rank(0, 7, 3, at), rank(1, 7, 3, at)]);
        assert_eq!(a.of(1).unwrap().compared, 3);
    }

    #[test]
    fn collectives_the_rings_no_longer_hold_are_skipped() {
        let mut a = Arrivals::default();
        let at = |s: u64| s * 100;
        a.update(&[rank(0, 7, 2, at), rank(1, 7, 2, at)]);
        // 30 collectives later: both rings hold 25..32 (the second's
        // oldest, 24, is gone).
        a.update(&[rank(0, 7, 32, at), rank(1, 7, 33, at)]);
        assert_eq!(a.of(0).unwrap().compared, 2 + 7);
    }

    #[test]
    fn communicators_apart_or_of_unknown_identity_are_not_compared() {
        let mut a = Arrivals::default();
        let mut unknown = rank(2, 7, 5, |s| s);
        unknown.id = None;
        a.update(&[rank(0, 7, 5, |s| s), rank(1, 8, 5, |s| s + 50), unknown]);
        assert_eq!(a.threads().count(), 0);
    }
}
