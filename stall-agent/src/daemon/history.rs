//! Each job's verdict changes since the daemon started: kept for
//! `/jobs/{id}` (bounded), and written as one JSON line each on stderr,
//! where journald and `kubectl logs` keep them.
use std::collections::VecDeque;

use serde::Serialize;

use crate::verdict::{Kind, Verdict};

/// Changes kept per job; older ones are dropped (the log has them).
pub const KEPT: usize = 64;

#[derive(Debug, Clone, Serialize)]
pub struct Change {
    /// Unix time, seconds.
    pub time: f64,
    pub kind: Kind,
    /// The verdict's line (its details marked: [`crate::detail`]).
    pub line: crate::detail::Text,
    pub evidence: Vec<crate::detail::Text>,
}

#[derive(Debug, Default)]
pub struct History {
    changes: VecDeque<Change>,
}

impl History {
    /// Takes the verdict published at `time`; the change, if it is one
    /// (another kind than the last).
    pub fn note(&mut self, time: f64, v: &Verdict) -> Option<&Change> {
        if self.changes.back().is_some_and(|c| c.kind == v.kind) {
            return None;
        }
        if self.changes.len() == KEPT {
            self.changes.pop_front();
        }
        self.changes.push_back(Change {
            time,
            kind: v.kind,
            line: v.summary.clone(),
            evidence: v.evidence.clone(),
        });
        self.changes.back()
    }

    pub fn changes(&self) -> impl Iterator<Item = &Change> {
        self.changes.iter()
    }

    /// The kind before the newest change.
    pub fn previous(&self) -> Option<Kind> {
        self.changes.iter().rev().nth(1).map(|c| c.kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(kind: Kind) -> Verdict {
        Verdict { kind, summary: format!("{kind:?}").into(), ..Default::default() }
    }

    #[test]
    fn only_changes_are_kept_and_the_oldest_go_first() {
        let mut h = History::default();
        assert!(h.note(1.0, &verdict(Kind::Unknown)).is_some());
        assert!(h.note(2.0, &verdict(Kind::Unknown)).is_none());
        assert!(h.note(3.0, &verdict(Kind::Hang)).is_some());
        assert_eq!(h.previous(), Some(Kind::Unknown));
        for i in 0..(2 * KEPT) {
            let kind = if i % 2 == 0 { Kind::Unknown } else { Kind::Hang };
            h.note(4.0 + i as f64, &verdict(kind));
        }
        assert_eq!(h.changes().count(), KEPT);
        assert!(h.changes().next().unwrap().time > 3.0);
    }
}
