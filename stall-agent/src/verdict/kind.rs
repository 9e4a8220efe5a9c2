//! The kinds of verdict and everything about each: its name (in the report,
//! JSON, metrics and timeline), whether its threads' Python stacks are
//! worth reading, and whether the daemon's cheap tier can vouch for it.
//! Adding a kind: a variant here, its rule in `classify`, its words in
//! `words`, a test, and its line in docs/VERDICTS.md.
use serde::{Serialize, Serializer};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Kind {
    InputIoBound,
    InputCpuBound,
    InputWaitBound,
    OutputIoBound,
    Hang,
    TrainerHostBound,
    GpuBusy,
    Idle,
    #[default]
    Unknown,
}

impl Kind {
    /// Every kind, in the order the metrics list them.
    pub const ALL: [Kind; 9] = [
        Kind::InputIoBound,
        Kind::InputCpuBound,
        Kind::InputWaitBound,
        Kind::OutputIoBound,
        Kind::Hang,
        Kind::TrainerHostBound,
        Kind::GpuBusy,
        Kind::Idle,
        Kind::Unknown,
    ];

    /// The kind's name, the one place it is spelled.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::InputIoBound => "input-io-bound",
            Kind::InputCpuBound => "input-cpu-bound",
            Kind::InputWaitBound => "input-wait-bound",
            Kind::OutputIoBound => "output-io-bound",
            Kind::Hang => "hang",
            Kind::TrainerHostBound => "trainer-host-bound",
            Kind::GpuBusy => "gpu-busy",
            Kind::Idle => "idle",
            Kind::Unknown => "unknown",
        }
    }

    /// Whether the Python stacks of the threads it blames are read live:
    /// where a thread the verdict names waits, or what it runs, is the next
    /// question for every kind but a busy GPU (which names none).
    pub fn wants_stacks(self) -> bool {
        self != Kind::GpuBusy
    }

    /// Whether the daemon's cheap tier (the GPU, the scheduler and /proc, no
    /// syscall hook) sees enough to publish it: a busy GPU, or a hang behind
    /// one. The others rest on file reads only the full capture counts.
    pub fn cheap_tier_vouches(self) -> bool {
        matches!(self, Kind::GpuBusy | Kind::Hang)
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Kind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_distinct_kebab_case_and_serialize_as_such() {
        let names: std::collections::HashSet<&str> = Kind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(names.len(), Kind::ALL.len());
        for k in Kind::ALL {
            assert!(k.as_str().chars().all(|c| c.is_ascii_lowercase() || c == '-'), "{k}");
            assert_eq!(serde_json::to_string(&k).unwrap(), format!("\"{}\"", k.as_str()));
        }
    }

    #[test]
    fn every_kind_is_listed_once() {
        // The match is exhaustive: a new variant needs a position here, and
        // then a place in ALL for this to pass.
        let position = |k: Kind| match k {
            Kind::InputIoBound => 0,
            Kind::InputCpuBound => 1,
            Kind::InputWaitBound => 2,
            Kind::OutputIoBound => 3,
            Kind::Hang => 4,
            Kind::TrainerHostBound => 5,
            Kind::GpuBusy => 6,
            Kind::Idle => 7,
            Kind::Unknown => 8,
        };
        for (i, k) in Kind::ALL.iter().enumerate() {
            assert_eq!(position(*k), i, "{k}");
        }
        assert_eq!(position(Kind::Unknown) + 1, Kind::ALL.len());
    }
}
