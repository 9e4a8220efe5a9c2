//! The Prometheus exposition. Labels are bounded by design: cgroup (the
//! job's path; `job` is Prometheus's own target label), namespace, pod,
//! container and pod UID, role, reason, verdict kind, GPU index — never a
//! file or a thread; those go to `/jobs`.
use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::{Metric, Registry, Unit},
};
use stall_common::{
    counter::{LOST_CAUSES, LOST_NAMES},
    reason,
};

use super::identity::{self, Identity};
use crate::{
    aggregate::Window,
    correlate::Roles,
    gpu::GpuWindow,
    verdict::{Collectives, Kind},
};

/// A job's series: its cgroup (unique on the node), and its names in the
/// cluster where it has them (pod and container names; the pod's UID).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobLabels {
    pub cgroup: String,
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub pod_uid: String,
}

impl JobLabels {
    pub fn new(cgroup: String, id: &Identity) -> Self {
        Self {
            cgroup,
            namespace: id.namespace.clone(),
            pod: id.pod.clone(),
            container: id.container.clone(),
            pod_uid: id.pod_uid.clone(),
        }
    }
    fn role(&self, role: &str) -> RoleLabels {
        RoleLabels { job: self.clone(), role: role.to_string() }
    }
    fn reason(&self, role: &str, reason: &str) -> ReasonLabels {
        ReasonLabels { job: self.clone(), role: role.to_string(), reason: reason.to_string() }
    }
    fn kind(&self, kind: Kind) -> VerdictLabels {
        VerdictLabels { job: self.clone(), kind: kind.as_str().to_string() }
    }
    /// A rank of a distributed run that runs in the job. The run is named
    /// by a hash of its id (an environment value, a detail): the same on
    /// every node, which is all an alert's join needs. A rank whose
    /// number is unknown (`None`) is labelled by its trainer's pid,
    /// `pid-<pid>`.
    pub fn rank(&self, run_id: &str, rank: Option<u32>, pid: u32) -> RankLabels {
        let rank = rank.map_or_else(|| format!("pid-{pid}"), |r| r.to_string());
        RankLabels { job: self.clone(), run_id: crate::output::jobs::id(run_id), rank }
    }
    fn gpu(&self, gpu: u32) -> JobGpuLabels {
        JobGpuLabels { job: self.clone(), gpu: gpu.to_string() }
    }
    /// `stall_job_info`'s labels: the job's, its Slurm job, and its pod's
    /// allow-listed labels named as kube-state-metrics names them.
    fn info(&self, id: &Identity) -> Vec<(String, String)> {
        let mut labels = vec![
            ("cgroup".to_string(), self.cgroup.clone()),
            ("namespace".to_string(), self.namespace.clone()),
            ("pod".to_string(), self.pod.clone()),
            ("container".to_string(), self.container.clone()),
            ("pod_uid".to_string(), self.pod_uid.clone()),
            ("slurm_job".to_string(), id.slurm_job.clone()),
        ];
        labels.extend(id.pod_labels.iter().map(|(k, v)| (identity::label_name(k), v.clone())));
        labels
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RoleLabels {
    #[prometheus(flatten)]
    pub job: JobLabels,
    pub role: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    #[prometheus(flatten)]
    pub job: JobLabels,
    pub role: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerdictLabels {
    #[prometheus(flatten)]
    pub job: JobLabels,
    pub kind: String,
}

/// A rank as the metrics show it: its own verdict, its wait for its peers
/// and its NCCL collectives.
pub struct RankState {
    pub labels: RankLabels,
    pub kind: Kind,
    pub peer_wait: f64,
    pub collectives: Option<Collectives>,
}

/// One rank of a run: the series an alert joins across nodes by `run_id`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RankLabels {
    #[prometheus(flatten)]
    pub job: JobLabels,
    pub run_id: String,
    pub rank: String,
}

impl RankLabels {
    fn kind(&self, kind: Kind) -> RankVerdictLabels {
        RankVerdictLabels { rank: self.clone(), kind: kind.as_str().to_string() }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RankVerdictLabels {
    #[prometheus(flatten)]
    pub rank: RankLabels,
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobGpuLabels {
    #[prometheus(flatten)]
    pub job: JobLabels,
    pub gpu: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GpuLabels {
    pub gpu: String,
    pub name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CauseLabels {
    pub cause: String,
}

type FloatCounter = Counter<f64, AtomicU64>;
type FloatGauge = Gauge<f64, AtomicU64>;

const ROLES: [&str; 3] = ["trainer", "worker", "other"];

/// Declares [`Metrics`], one field per metric, and registers each under
/// its name (with the `stall_` prefix), help text and unit, in the order
/// listed (the exposition's order): `field: Type = "name" [in unit], "help";`.
macro_rules! metrics {
    (@unit) => { None };
    (@unit $unit:expr) => { Some($unit) };
    ($($vis:vis $field:ident: $ty:ty = $name:literal $(in $unit:expr)?, $help:literal;)*) => {
        pub struct Metrics {
            pub registry: Registry,
            $($vis $field: $ty,)*
        }

        impl Metrics {
            pub fn new() -> Self {
                let mut registry = Registry::with_prefix("stall");
                $(
                    let $field = <$ty>::default();
                    register(&mut registry, $name, $help, metrics!(@unit $($unit)?), $field.clone());
                )*
                Self { registry, $($field),* }
            }
        }
    };
}

metrics! {
    read_bytes: Family<RoleLabels, Counter> = "read" in Unit::Bytes, "Bytes read from regular files";
    read_calls: Family<RoleLabels, Counter> = "read_calls", "read-family calls on regular files";
    ipc_read_bytes: Family<RoleLabels, Counter> = "ipc_read" in Unit::Bytes,
        "Bytes read from pipes, sockets and other non-files";
    storage_bytes: Family<RoleLabels, Counter> = "storage_read" in Unit::Bytes,
        "Bytes the processes caused to be read from storage (page-cache fills by reads, mappings and read-ahead)";
    mmap_bytes: Family<RoleLabels, Counter> = "mmap_read" in Unit::Bytes,
        "Bytes of files the processes' faults mapped into them (memory-mapped data, and their own code)";
    write_bytes: Family<RoleLabels, Counter> = "write" in Unit::Bytes,
        "Bytes written to regular files (logs, checkpoints)";
    on_cpu: Family<RoleLabels, FloatCounter> = "on_cpu" in Unit::Seconds, "Time on CPU";
    off_cpu: Family<ReasonLabels, FloatCounter> = "off_cpu" in Unit::Seconds, "Time off CPU, by reason";
    processes: Family<RoleLabels, Gauge> = "processes", "Live processes of the job, by role";
    verdict: Family<VerdictLabels, Gauge> = "verdict", "The job's current verdict (1 for the current kind)";
    rank_verdict: Family<RankVerdictLabels, Gauge> = "rank_verdict",
        "A rank's own verdict, judged on its trainer and workers (1 for the current kind)";
    rank_peer_wait: Family<RankLabels, FloatGauge> = "rank_peer_wait_ratio",
        "Share of the last window a rank's trainer waited for its peers while its own pipeline kept up (0 where its own cause holds it)";
    rank_collective_wait: Family<RankLabels, FloatGauge> = "rank_collective_wait" in Unit::Seconds,
        "Mean time from a rank's NCCL collective call to the synchronization that saw it complete, over the last window: the last rank to call waits least";
    rank_collective_lateness: Family<RankLabels, FloatGauge> = "rank_collective_lateness" in Unit::Seconds,
        "Mean time a rank called its NCCL collectives after the first rank of its communicator on this node, over the last window";
    job_gpu_idle: Family<JobGpuLabels, FloatCounter> = "job_gpu_idle" in Unit::Seconds,
        "Time a GPU the job uses spent idle (utilization <= 5%)";
    job_gpu_util: Family<JobGpuLabels, FloatGauge> = "job_gpu_utilization_ratio",
        "Mean utilization of a GPU the job uses, over the last interval (0-1)";
    last_progress: Family<JobLabels, FloatGauge> = "last_progress_timestamp" in Unit::Seconds,
        "Unix time the job last read a file or wrote output (its log, checkpoints, stdout); stall's start if not since";
    tier: Family<JobLabels, Gauge> = "capture_tier",
        "The job's capture tier: 1 full (scheduler and syscall hooks), 0 cheap (GPU and /proc only)";
    escalations: Family<JobLabels, Counter> = "escalations", "Full captures started for the job";
    full_capture: Family<JobLabels, FloatCounter> = "full_capture" in Unit::Seconds,
        "Time the job spent in the full capture";
    pub syscall_hooks: Gauge = "syscall_hooks_attached",
        "1 while the syscall hooks are attached (they tax every process of the node)";
    pub sched_hooks: Gauge = "scheduler_hooks_attached",
        "1 while the scheduler hooks are attached (they tax every context switch of the node)";
    gpu_power: Family<GpuLabels, FloatGauge> = "gpu_power" in Unit::Other("watts".into()),
        "Mean board power draw over the last interval";
    gpu_power_limit: Family<GpuLabels, FloatGauge> = "gpu_power_limit" in Unit::Other("watts".into()),
        "Enforced board power limit";
    gpu_util: Family<GpuLabels, FloatGauge> = "gpu_utilization_ratio",
        "Mean GPU utilization over the last interval (0-1)";
    gpu_idle: Family<GpuLabels, FloatCounter> = "gpu_idle" in Unit::Seconds, "Time the GPU spent idle";
    lost: Family<CauseLabels, Counter> = "lost_events", "Events the kernel side dropped, by cause";
    pub agent_cpu: FloatCounter = "agent_cpu" in Unit::Seconds, "CPU time used by stall itself";
    pub agent_rss: Gauge = "agent_resident_memory" in Unit::Bytes, "stall's resident memory";
    pub agent_jobs: Gauge = "agent_jobs", "Jobs attached";
    pub agent_events: Counter = "agent_events", "Kernel events handled for traced threads";
    pub nvml_up: Gauge = "nvml_up", "1 while NVML answers (GPU data: verdicts on the GPU, and tiers)";
    build_info: Family<BuildLabels, Gauge> = "build_info", "stall's version (always 1)";
    job_info: Family<Vec<(String, String)>, Gauge> = "job_info",
        "A job's names in its cluster (always 1): namespace, pod and container names, pod UID, Slurm job, and the pod's allow-listed labels as label_<name>";
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
}

/// One metric into the registry, with its unit if it has one.
fn register(registry: &mut Registry, name: &str, help: &str, unit: Option<Unit>, metric: impl Metric) {
    match unit {
        Some(unit) => registry.register_with_unit(name, help, unit, metric),
        None => registry.register(name, help, metric),
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Adds one interval of a job.
    pub fn add_window(&self, job: &JobLabels, w: &Window, roles: &Roles) {
        let mut live = [0i64; 3];
        for p in &w.procs {
            let role = roles.of(p.tgid).as_str();
            let rl = job.role(role);
            let sum = p.sum();
            self.read_bytes.get_or_create(&rl).inc_by(p.file_read_bytes());
            self.read_calls.get_or_create(&rl).inc_by(p.files.iter().map(|f| f.read_calls).sum());
            self.ipc_read_bytes.get_or_create(&rl).inc_by(p.other_read_bytes);
            if let Some(bytes) = p.storage_bytes {
                self.storage_bytes.get_or_create(&rl).inc_by(bytes);
            }
            if let Some(bytes) = p.mmap_bytes {
                self.mmap_bytes.get_or_create(&rl).inc_by(bytes);
            }
            self.write_bytes.get_or_create(&rl).inc_by(p.file_write_bytes());
            self.on_cpu.get_or_create(&rl).inc_by(sum.on_cpu_ns as f64 / 1e9);
            for (i, name) in reason::NAMES.iter().enumerate() {
                self.off_cpu.get_or_create(&job.reason(role, name)).inc_by(sum.off_ns[i] as f64 / 1e9);
            }
            if p.alive {
                live[ROLES.iter().position(|r| *r == role).unwrap_or(2)] += 1;
            }
        }
        for (i, role) in ROLES.iter().enumerate() {
            self.processes.get_or_create(&job.role(role)).set(live[i]);
        }
    }

    pub fn set_verdict(&self, job: &JobLabels, kind: Kind) {
        for k in Kind::ALL {
            self.verdict.get_or_create(&job.kind(k)).set(i64::from(k == kind));
        }
    }

    /// The ranks of a run in the job, each with its own verdict, peer wait
    /// and collectives; the ranks of `before` that are gone are dropped.
    /// Returns the ranks set now.
    pub fn set_ranks(&self, now: Vec<RankState>, before: &[RankLabels]) -> Vec<RankLabels> {
        let gone: Vec<RankLabels> =
            before.iter().filter(|b| !now.iter().any(|n| n.labels == **b)).cloned().collect();
        self.remove_ranks(&gone);
        for r in &now {
            for k in Kind::ALL {
                self.rank_verdict.get_or_create(&r.labels.kind(k)).set(i64::from(k == r.kind));
            }
            self.rank_peer_wait.get_or_create(&r.labels).set(r.peer_wait);
            match r.collectives {
                Some(c) => {
                    self.rank_collective_wait.get_or_create(&r.labels).set(c.wait_s);
                    if c.compared > 0 {
                        self.rank_collective_lateness.get_or_create(&r.labels).set(c.late_s);
                    }
                }
                None => {
                    self.rank_collective_wait.remove(&r.labels);
                    self.rank_collective_lateness.remove(&r.labels);
                }
            }
        }
        now.into_iter().map(|r| r.labels).collect()
    }

    pub fn remove_ranks(&self, ranks: &[RankLabels]) {
        for l in ranks {
            for k in Kind::ALL {
                self.rank_verdict.remove(&l.kind(k));
            }
            self.rank_peer_wait.remove(l);
            self.rank_collective_wait.remove(l);
            self.rank_collective_lateness.remove(l);
        }
    }

    /// One interval of a GPU the job uses.
    pub fn add_job_gpu(&self, job: &JobLabels, g: &GpuWindow, secs: f64) {
        let l = job.gpu(g.index);
        self.job_gpu_idle.get_or_create(&l).inc_by(g.idle_fraction * secs);
        self.job_gpu_util.get_or_create(&l).set(g.util_mean_pct / 100.0);
    }

    pub fn set_tier(&self, job: &JobLabels, full: bool) {
        self.tier.get_or_create(job).set(i64::from(full));
    }

    pub fn add_escalations(&self, job: &JobLabels, n: u64) {
        self.escalations.get_or_create(job).inc_by(n);
    }

    pub fn add_full_capture(&self, job: &JobLabels, secs: f64) {
        self.full_capture.get_or_create(job).inc_by(secs);
    }

    pub fn set_hooks(&self, syscalls: bool, sched: bool) {
        self.syscall_hooks.set(i64::from(syscalls));
        self.sched_hooks.set(i64::from(sched));
    }

    /// stall's version, as `stall_build_info` (1).
    pub fn set_build_info(&self) {
        self.build_info.get_or_create(&BuildLabels { version: env!("CARGO_PKG_VERSION").into() }).set(1);
    }

    /// The job's names, as `stall_job_info` (1).
    pub fn set_job_info(&self, job: &JobLabels, id: &Identity) {
        self.job_info.get_or_create(&job.info(id)).set(1);
    }

    /// When the job last moved, as Unix time (it survives between scrapes,
    /// where an age would not).
    pub fn set_last_progress(&self, job: &JobLabels, unix_s: f64) {
        self.last_progress.get_or_create(job).set(unix_s);
    }

    /// One interval of a GPU of the node.
    pub fn set_gpu(&self, g: &GpuWindow, idle_secs: f64) {
        let l = GpuLabels { gpu: g.index.to_string(), name: g.name.clone() };
        self.gpu_util.get_or_create(&l).set(g.util_mean_pct / 100.0);
        self.gpu_idle.get_or_create(&l).inc_by(idle_secs);
        if let Some(w) = g.power_w {
            self.gpu_power.get_or_create(&l).set(w);
        }
        if let Some(w) = g.power_limit_w {
            self.gpu_power_limit.get_or_create(&l).set(w);
        }
    }

    pub fn add_lost(&self, lost: &[u64; LOST_CAUSES]) {
        for (name, n) in LOST_NAMES.iter().zip(lost) {
            self.lost.get_or_create(&CauseLabels { cause: name.to_string() }).inc_by(*n);
        }
    }

    /// Drops every series of a job that is gone (bounded cardinality however
    /// many jobs come and go).
    pub fn remove_job(&self, job: &JobLabels, id: &Identity, gpus: &[u32]) {
        self.job_info.remove(&job.info(id));
        for role in ROLES {
            let rl = job.role(role);
            self.read_bytes.remove(&rl);
            self.read_calls.remove(&rl);
            self.ipc_read_bytes.remove(&rl);
            self.storage_bytes.remove(&rl);
            self.mmap_bytes.remove(&rl);
            self.write_bytes.remove(&rl);
            self.on_cpu.remove(&rl);
            self.processes.remove(&rl);
            for name in reason::NAMES {
                self.off_cpu.remove(&job.reason(role, name));
            }
        }
        for k in Kind::ALL {
            self.verdict.remove(&job.kind(k));
        }
        for g in gpus {
            self.job_gpu_idle.remove(&job.gpu(*g));
            self.job_gpu_util.remove(&job.gpu(*g));
        }
        self.last_progress.remove(job);
        self.tier.remove(job);
        self.escalations.remove(job);
        self.full_capture.remove(job);
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("encoding to a String");
        out
    }
}

/// OpenMetrics text → the classic Prometheus text format (0.0.4), for
/// scrapers and tools that ask for `text/plain` (promtool among them): a
/// counter family is named with its `_total` suffix there, and `# UNIT` and
/// `# EOF` do not exist.
pub fn to_classic(om: &str) -> String {
    let counters: std::collections::HashSet<&str> =
        om.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter")).collect();
    let mut out = String::with_capacity(om.len());
    for line in om.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ')?;
            counters.contains(name).then(|| format!("{p}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{aggregate::Model, correlate, decode::*};

    fn job() -> JobLabels {
        JobLabels { cgroup: "jobs/a".into(), ..Default::default() }
    }

    #[test]
    fn a_window_becomes_series_and_a_gone_job_leaves_none() {
        let mut model = Model::new(0);
        model.note_process(10, Some(1), "python", None);
        model.apply(&Event::Open {
            ts: 0,
            tid: 10,
            tgid: 10,
            fd: 3,
            file_id: 1,
            path: "/d".into(),
            dfd: -100,
            dup_of: None,
        });
        model.apply_snapshot(&Snapshot {
            ts: 1_000_000_000,
            threads: vec![ThreadSnap {
                tid: 10,
                tgid: 10,
                counters: ThreadCounters { on_cpu_ns: 500_000_000, ..Default::default() },
                ..Default::default()
            }],
            files: vec![FileSnap {
                tgid: 10,
                fd: 3,
                file_id: 1,
                kind: 1,
                counters: FileCounters {
                    read_bytes: 4096,
                    read_calls: 1,
                    read_ns: 10,
                    timed_calls: 1,
                    ..Default::default()
                },
            }],
            ..Default::default()
        });
        let w = model.interval(1_000_000_000);
        let roles = correlate::assign(&w, &Default::default(), Some(10));
        let m = Metrics::new();
        m.add_window(&job(), &w, &roles);
        m.set_verdict(&job(), Kind::InputIoBound);
        let text = m.encode();
        assert!(
            text.contains(
                r#"stall_read_bytes_total{cgroup="jobs/a",namespace="",pod="",container="",pod_uid="",role="trainer"} 4096"#
            ),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                r#"stall_verdict{{cgroup="jobs/a",namespace="",pod="",container="",pod_uid="",kind="{}"}} 1"#,
                Kind::InputIoBound
            )),
            "{text}"
        );
        assert!(text.contains(
            r#"stall_on_cpu_seconds_total{cgroup="jobs/a",namespace="",pod="",container="",pod_uid="",role="trainer"} 0.5"#
        ));
        let classic = to_classic(&text);
        assert!(classic.contains("# TYPE stall_read_bytes_total counter\n"), "{classic}");
        assert!(classic.contains("# HELP stall_read_bytes_total Bytes read from regular files."));
        assert!(classic.contains("# TYPE stall_verdict gauge\n"));
        assert!(!classic.contains("# EOF") && !classic.contains("# UNIT"));
        m.remove_job(&job(), &Identity::default(), &[]);
        assert!(!m.encode().contains("jobs/a"));
    }

    #[test]
    fn ranks_come_and_go_with_their_runs() {
        let m = Metrics::new();
        let (r0, r1) = (job().rank("run-7", Some(0), 100), job().rank("run-7", Some(1), 200));
        let nccl = Collectives { calls: 40, wait_s: 0.25, compared: 40, last: 0, late_s: 0.002 };
        let set = m.set_ranks(
            vec![
                RankState { labels: r0.clone(), kind: Kind::InputIoBound, peer_wait: 0.0, collectives: None },
                RankState {
                    labels: r1.clone(),
                    kind: Kind::Unknown,
                    peer_wait: 0.8,
                    collectives: Some(nccl),
                },
            ],
            &[],
        );
        let text = m.encode();
        let series = |rank: u32| {
            format!(
                r#"cgroup="jobs/a",namespace="",pod="",container="",pod_uid="",run_id="{}",rank="{rank}""#,
                crate::output::jobs::id("run-7")
            )
        };
        assert!(
            text.contains(&format!(r#"stall_rank_verdict{{{},kind="{}"}} 1"#, series(0), Kind::InputIoBound)),
            "{text}"
        );
        assert!(text.contains(&format!(r#"stall_rank_peer_wait_ratio{{{}}} 0.8"#, series(1))), "{text}");
        assert!(
            text.contains(&format!(r#"stall_rank_collective_wait_seconds{{{}}} 0.25"#, series(1))),
            "{text}"
        );
        assert!(text.contains(&format!(r#"stall_rank_collective_lateness_seconds{{{}}} 0.002"#, series(1))));
        assert!(!text.contains(&format!(r#"stall_rank_collective_wait_seconds{{{}}}"#, series(0))), "{text}");
        // Rank 1 leaves the job; then the job ends.
        let set = m.set_ranks(
            vec![RankState { labels: r0, kind: Kind::Hang, peer_wait: 0.0, collectives: None }],
            &set,
        );
        let text = m.encode();
        assert!(!text.contains(r#"rank="1""#), "{text}");
        assert!(
            text.contains(&format!(r#"stall_rank_verdict{{{},kind="{}"}} 1"#, series(0), Kind::Hang)),
            "{text}"
        );
        m.remove_ranks(&set);
        assert!(!m.encode().contains(&crate::output::jobs::id("run-7")));
    }
}
