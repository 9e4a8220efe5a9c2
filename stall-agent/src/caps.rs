//! The Linux capabilities stall needs, checked before anything is loaded.
//!
//! Measured on 6.18 by running stall as `nobody` with capsh, one capability
//! left out at a time (tests/tests/privilege.rs does it on every run):
//! without CAP_BPF or CAP_PERFMON the kernel refuses the programs; without
//! CAP_DAC_READ_SEARCH tracefs (mode 700) cannot be read; without
//! CAP_SYS_PTRACE stall still starts, but an attached job's files
//! go uncounted (its /proc/PID/fd links cannot be read). Root has all four.
//! CAP_SYS_ADMIN stands in for CAP_BPF and CAP_PERFMON and CAP_DAC_OVERRIDE
//! for CAP_DAC_READ_SEARCH, as in the kernel's own checks.

/// One capability stall needs: its bit in `CapEff`, bits that stand in for
/// it, and what stall uses it for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    pub name: &'static str,
    pub bit: u32,
    pub or: &'static [u32],
    pub why: &'static str,
}

const CAP_DAC_OVERRIDE: u32 = 1;
const CAP_SYS_ADMIN: u32 = 21;

/// Every capability `run`, `attach` and `daemon` need.
pub const NEEDED: [Need; 4] = [
    Need { name: "CAP_BPF", bit: 39, or: &[CAP_SYS_ADMIN], why: "create BPF maps and load the programs" },
    Need {
        name: "CAP_PERFMON",
        bit: 38,
        or: &[CAP_SYS_ADMIN],
        why: "load tracing programs and attach them to tracepoints",
    },
    Need {
        name: "CAP_DAC_READ_SEARCH",
        bit: 2,
        or: &[CAP_DAC_OVERRIDE],
        why: "read tracefs, mode 700, and other users' /proc/PID/fd and /proc/PID/task/TID/syscall",
    },
    Need {
        name: "CAP_SYS_PTRACE",
        bit: 19,
        or: &[],
        why: "read which file each of the job's descriptors is and which syscall its threads wait in, past /proc's ptrace checks",
    },
];

/// The names of [`NEEDED`], comma-separated.
pub fn names() -> String {
    NEEDED.iter().map(|n| n.name).collect::<Vec<_>>().join(", ")
}

/// What of [`NEEDED`] an effective set (`CapEff` bits) lacks.
pub fn missing(effective: u64) -> Vec<Need> {
    let has = |bit: u32| effective & (1u64 << bit) != 0;
    NEEDED.iter().filter(|n| !has(n.bit) && !n.or.iter().any(|&b| has(b))).copied().collect()
}

/// This process's effective capabilities (`CapEff` of /proc/self/status).
pub fn effective() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:").and_then(|v| u64::from_str_radix(v.trim(), 16).ok()))
        })
        .unwrap_or(0)
}

/// One line naming what is missing and what each is for.
pub fn explain(missing: &[Need]) -> String {
    let what: Vec<String> = missing.iter().map(|n| format!("{} (to {})", n.name, n.why)).collect();
    let noun = if missing.len() == 1 { "capability" } else { "capabilities" };
    format!("missing {noun} {}; run stall as root or with {}", what.join(", "), names())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL4: u64 = (1 << 39) | (1 << 38) | (1 << 19) | (1 << 2);

    fn names_of(m: &[Need]) -> Vec<&str> {
        m.iter().map(|n| n.name).collect()
    }

    #[test]
    fn the_four_suffice_and_each_is_needed() {
        assert!(missing(ALL4).is_empty());
        assert!(missing(u64::MAX).is_empty(), "root");
        for n in NEEDED {
            assert_eq!(names_of(&missing(ALL4 & !(1 << n.bit))), [n.name]);
        }
        assert_eq!(missing(0).len(), 4);
    }

    #[test]
    fn kernel_equivalents_count() {
        let admin = (1 << 21) | (1 << 19) | (1 << 2);
        assert!(missing(admin).is_empty(), "CAP_SYS_ADMIN covers CAP_BPF and CAP_PERFMON");
        let dac_override = (1 << 39) | (1 << 38) | (1 << 19) | (1 << 1);
        assert!(missing(dac_override).is_empty());
    }

    /// The deploy files ask for exactly what is checked.
    #[test]
    fn deploy_files_ask_for_exactly_these() {
        let want: Vec<&str> = NEEDED.iter().map(|n| n.name).collect();
        let unit = include_str!("../../deploy/stall-daemon.service");
        for key in ["AmbientCapabilities=", "CapabilityBoundingSet="] {
            let line = unit.lines().find_map(|l| l.strip_prefix(key)).unwrap_or_else(|| panic!("no {key}"));
            let mut got: Vec<&str> = line.split_whitespace().collect();
            got.sort_unstable();
            let mut w = want.clone();
            w.sort_unstable();
            assert_eq!(got, w, "{key}");
        }
        let ds = include_str!("../../deploy/daemonset.yaml");
        let add = ds.lines().find_map(|l| l.trim().strip_prefix("add: [")).expect("capabilities add");
        let mut got: Vec<String> =
            add.trim_end_matches(']').split(',').map(|c| format!("CAP_{}", c.trim())).collect();
        got.sort_unstable();
        let mut w: Vec<String> = want.iter().map(|s| s.to_string()).collect();
        w.sort_unstable();
        assert_eq!(got, w);
        assert!(ds.contains("drop: [ALL]"));
    }

    #[test]
    fn capsh_measured_set() {
        // CapEff of `capsh --caps=cap_bpf,cap_perfmon,cap_sys_ptrace,cap_dac_read_search+eip ...`
        assert!(missing(0x0000_00c0_0008_0004).is_empty());
    }

    #[test]
    fn explanation_is_one_line_naming_each() {
        let text = explain(&missing(ALL4 & !(1 << 19)));
        assert!(!text.contains('\n'));
        assert!(text.starts_with("missing capability CAP_SYS_PTRACE (to read which file"), "{text}");
        assert!(text.ends_with("CAP_BPF, CAP_PERFMON, CAP_DAC_READ_SEARCH, CAP_SYS_PTRACE"), "{text}");
        let two = explain(&missing(ALL4 & !(1 << 39) & !(1 << 38)));
        assert!(two.starts_with("missing capabilities CAP_BPF (to create"), "{two}");
        assert!(two.contains(", CAP_PERFMON (to load tracing"), "{two}");
    }
}
