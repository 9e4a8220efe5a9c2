//! CPU limits (CFS bandwidth control: a Kubernetes CPU limit, systemd's
//! `CPUQuota=`): which cgroup caps a process's CPU, at how many CPUs, and
//! how much it throttled, from cgroup v2 (`cpu.max`, `cpu.stat`) or, where
//! the v1 cpu controller is mounted, v1 (`cpu.cfs_quota_us`,
//! `cpu.cfs_period_us`, `cpu.stat`). Parsers are pure; the readers take
//! the files as they are now.
use std::{
    fs,
    path::{Path, PathBuf},
};

/// The cgroup that caps a process's CPU: the most restrictive quota on the
/// way from its cgroup up to the root.
#[derive(Debug, Clone, PartialEq)]
pub struct Limit {
    /// The cgroup's directory.
    pub cgroup: String,
    /// Quota over period: how many CPUs' worth it may use.
    pub cpus: f64,
    /// The enforcement period.
    pub period_ns: u64,
}

/// A cgroup's throttling counters, cumulative since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuStat {
    /// Enforcement periods in which it had runnable tasks.
    pub periods: u64,
    /// Of them, those in which it ran out of quota.
    pub throttled_periods: u64,
    /// Time its per-CPU run queues spent throttled, summed over CPUs.
    pub throttled_ns: u64,
}

/// One reading of a limited cgroup.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub limit: Limit,
    pub stat: CpuStat,
}

/// A quota: (CPUs, period in ns).
pub type Quota = (f64, u64);

/// `cpu.max` (v2): "QUOTA PERIOD" in µs, QUOTA "max" when unlimited.
pub fn parse_cpu_max(text: &str) -> Option<Quota> {
    let mut it = text.split_whitespace();
    let quota: f64 = it.next()?.parse().ok()?;
    quota_of(quota, it.next().unwrap_or("100000"))
}

/// `cpu.cfs_quota_us` and `cpu.cfs_period_us` (v1): quota -1 when
/// unlimited.
pub fn parse_v1_quota(quota: &str, period: &str) -> Option<Quota> {
    quota_of(quota.trim().parse().ok()?, period.trim())
}

fn quota_of(quota_us: f64, period_us: &str) -> Option<Quota> {
    let period: f64 = period_us.parse().ok()?;
    (quota_us > 0.0 && period > 0.0).then(|| (quota_us / period, (period * 1000.0) as u64))
}

/// `cpu.stat`: v2 says `throttled_usec`, v1 `throttled_time` (ns).
pub fn parse_cpu_stat(text: &str) -> CpuStat {
    let mut s = CpuStat::default();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(key), Some(Ok(v))) = (it.next(), it.next().map(str::parse::<u64>)) else { continue };
        match key {
            "nr_periods" => s.periods = v,
            "nr_throttled" => s.throttled_periods = v,
            "throttled_usec" => s.throttled_ns = v.saturating_mul(1000),
            "throttled_time" => s.throttled_ns = v,
            _ => {}
        }
    }
    s
}

/// Where the CPU controller is, and which line of /proc/PID/cgroup names
/// a process's place in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hierarchy {
    /// The v1 cpu controller, mounted here.
    V1(PathBuf),
    /// cgroup v2, mounted here.
    V2(PathBuf),
}

impl Hierarchy {
    /// The v1 cpu controller where mounted (it then owns the CPU limits,
    /// hybrid systems included), else cgroup v2.
    pub fn find() -> Option<Self> {
        let text = fs::read_to_string("/proc/self/mountinfo").ok()?;
        Self::from_mountinfo(&text)
    }

    pub fn from_mountinfo(text: &str) -> Option<Self> {
        let mut v2 = None;
        for line in text.lines() {
            let Some((pre, post)) = line.split_once(" - ") else { continue };
            let mut post = post.split_whitespace();
            let (Some(fstype), _, Some(options)) = (post.next(), post.next(), post.next()) else { continue };
            let Some(mount) = pre.split_whitespace().nth(4) else { continue };
            match fstype {
                "cgroup" if options.split(',').any(|o| o == "cpu") => {
                    return Some(Hierarchy::V1(mount.into()));
                }
                "cgroup2" => v2 = Some(Hierarchy::V2(mount.into())),
                _ => {}
            }
        }
        v2
    }

    /// A process's cgroup directory in this hierarchy, from the text of
    /// /proc/PID/cgroup.
    pub fn cgroup_of(&self, proc_cgroup: &str) -> Option<PathBuf> {
        let (mount, rel) = match self {
            Hierarchy::V1(mount) => (
                mount,
                proc_cgroup.lines().find_map(|l| {
                    let mut f = l.splitn(3, ':');
                    let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
                    ctrls.split(',').any(|c| c == "cpu").then_some(path)
                })?,
            ),
            Hierarchy::V2(mount) => (mount, proc_cgroup.lines().find_map(|l| l.strip_prefix("0::"))?),
        };
        Some(mount.join(rel.trim_start_matches('/')))
    }

    fn mount(&self) -> &Path {
        match self {
            Hierarchy::V1(m) | Hierarchy::V2(m) => m,
        }
    }

    /// The quota of one cgroup directory, None where it has none.
    fn quota(&self, dir: &Path) -> Option<Quota> {
        let read = |name: &str| fs::read_to_string(dir.join(name)).ok();
        match self {
            Hierarchy::V1(_) => parse_v1_quota(&read("cpu.cfs_quota_us")?, &read("cpu.cfs_period_us")?),
            Hierarchy::V2(_) => parse_cpu_max(&read("cpu.max")?),
        }
    }

    /// The cgroup capping process `pid`'s CPU, if any; None (outer) when
    /// its /proc entry cannot be read (it has just exited).
    pub fn limit_of(&self, pid: u32) -> Option<Option<Limit>> {
        let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        Some(self.limit_in(&text))
    }

    fn limit_in(&self, proc_cgroup: &str) -> Option<Limit> {
        let mut dir = self.cgroup_of(proc_cgroup)?;
        let mut best: Option<Limit> = None;
        // Up to (not including) the root, which has no quota.
        while dir.starts_with(self.mount()) && dir != self.mount() {
            if let Some((cpus, period_ns)) = self.quota(&dir) {
                if best.as_ref().is_none_or(|b| cpus < b.cpus) {
                    best = Some(Limit { cgroup: dir.display().to_string(), cpus, period_ns });
                }
            }
            if !dir.pop() {
                break;
            }
        }
        best
    }

    /// The limit and counters of a cgroup now; None once it is gone or
    /// unlimited.
    pub fn read(&self, cgroup: &str) -> Option<Reading> {
        let dir = Path::new(cgroup);
        let (cpus, period_ns) = self.quota(dir)?;
        let stat = parse_cpu_stat(&fs::read_to_string(dir.join("cpu.stat")).ok()?);
        Some(Reading { limit: Limit { cgroup: cgroup.to_string(), cpus, period_ns }, stat })
    }
}

/// CPUs this process may run on (its affinity): how many run queues a
/// cgroup's tasks can be throttled on at once.
pub fn usable_cpus() -> u32 {
    std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas_in_both_formats() {
        assert_eq!(parse_cpu_max("60000 100000\n"), Some((0.6, 100_000_000)));
        assert_eq!(parse_cpu_max("max 100000\n"), None);
        assert_eq!(parse_cpu_max("200000 50000"), Some((4.0, 50_000_000)));
        assert_eq!(parse_v1_quota("-1\n", "100000\n"), None);
        assert_eq!(parse_v1_quota("50000\n", "100000\n"), Some((0.5, 100_000_000)));
    }

    #[test]
    fn cpu_stat_in_both_formats() {
        let v2 = "usage_usec 1000\nuser_usec 800\nsystem_usec 200\nnr_periods 180\nnr_throttled 176\n\
                  throttled_usec 13900000\nnr_bursts 0\nburst_usec 0\n";
        assert_eq!(
            parse_cpu_stat(v2),
            CpuStat { periods: 180, throttled_periods: 176, throttled_ns: 13_900_000_000 }
        );
        let v1 = "nr_periods 10\nnr_throttled 4\nthrottled_time 250000000\n";
        assert_eq!(
            parse_cpu_stat(v1),
            CpuStat { periods: 10, throttled_periods: 4, throttled_ns: 250_000_000 }
        );
        assert_eq!(parse_cpu_stat("garbage\n"), CpuStat::default());
    }

    #[test]
    fn the_v1_cpu_controller_wins_over_v2_and_finds_the_process() {
        let hybrid = "25 30 0:22 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n\
                      32 25 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n\
                      33 25 0:28 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
                      34 25 0:29 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset\n";
        let h = Hierarchy::from_mountinfo(hybrid).unwrap();
        assert_eq!(h, Hierarchy::V1("/sys/fs/cgroup/cpu,cpuacct".into()));
        let proc_cgroup = "5:cpuset:/\n4:cpu,cpuacct:/kubepods/pod1/abc\n0::/kubepods/pod1/abc\n";
        assert_eq!(h.cgroup_of(proc_cgroup), Some("/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/abc".into()));
        let v2 = "32 25 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let h = Hierarchy::from_mountinfo(v2).unwrap();
        assert_eq!(h.cgroup_of("0::/job.slice/x\n"), Some("/sys/fs/cgroup/job.slice/x".into()));
        assert_eq!(h.cgroup_of("0::/\n"), Some("/sys/fs/cgroup/".into()));
        // cpuset alone is not the cpu controller.
        let only_cpuset = "34 25 0:29 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset\n";
        assert_eq!(Hierarchy::from_mountinfo(only_cpuset), None);
    }
}
