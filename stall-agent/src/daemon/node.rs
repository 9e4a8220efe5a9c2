//! The node's jobs: which cgroups are jobs (those holding a GPU, unless
//! every job is watched), found anew each interval, attached when they
//! appear and detached when they go; and the syscall hooks that the jobs
//! under full capture need, attached while any is.
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::{Path, PathBuf},
};

use super::{
    history::History,
    http::{CaptureRefused, CaptureRequest},
    identity::{Identities, Identity},
    kube,
    metrics::{JobLabels, Metrics, RankLabels},
    ondemand::OnDemand,
    tier::{JobTier, Tier},
};
use crate::{
    capture::{cgroup, procfs},
    clock::monotonic_ns,
    decode::{Event, JobEvent},
    job::{GpuFleet, GpuScope, Job, LiveHost, Tick},
    output::jobs::{self, JobView},
    verdict::Verdict,
};

/// A job of the node: a cgroup directly under a root.
pub(super) struct Watched {
    /// Its id in `/jobs` (from its cgroup: stable across restarts).
    pub id: String,
    pub job: Job,
    pub dir: PathBuf,
    pub labels: JobLabels,
    /// Its names in the cluster (`labels` holds those series carry).
    pub identity: Identity,
    /// The container its GPU process ran in when it was found.
    gpu_container: Option<String>,
    /// The last interval's outcome, for `/jobs`.
    pub last: Option<Tick>,
    pub tier: JobTier,
    /// The verdict published (the live one, or what the cheap tier can
    /// vouch for).
    pub published: Option<Verdict>,
    /// The ranks of a run whose series are exported.
    pub ranks: Vec<RankLabels>,
    /// Its verdict changes since the daemon started.
    pub history: History,
}

/// The node: its jobs, by cgroup directory, and how they are found.
pub(super) struct Node {
    pub jobs: BTreeMap<PathBuf, Watched>,
    /// The capture asked for over HTTP, while it runs.
    pub ondemand: Option<OnDemand>,
    next_id: u32,
    roots: Vec<PathBuf>,
    mount: PathBuf,
    all_jobs: bool,
    /// Holding an NVIDIA device open makes a job even without a CUDA
    /// context NVML lists.
    device_holders: bool,
    /// stall's own cgroup: never a job (it opens the GPU through NVML).
    own: Option<PathBuf>,
    /// Cgroups under the roots at the last look that are not watched, and
    /// why: no process of theirs uses a GPU (and no `--all-jobs`).
    pub not_watched: Option<(usize, String)>,
    /// Whether the daemon said so yet (once: a node's idle pods do not
    /// fill its log).
    told_not_watched: bool,
}

impl Node {
    pub fn new(roots: Vec<PathBuf>, mount: PathBuf, all_jobs: bool, device_holders: bool) -> Self {
        let own = cgroup::of_process(std::process::id(), &mount);
        Self {
            jobs: BTreeMap::new(),
            ondemand: None,
            next_id: 1,
            roots,
            mount,
            all_jobs,
            device_holders,
            own,
            not_watched: None,
            told_not_watched: false,
        }
    }

    /// The cgroups under the roots that may be jobs: read once per look,
    /// for [`Node::pods_to_name`] and [`Node::discover`].
    pub fn candidates(&self) -> Vec<PathBuf> {
        let mut dirs = Vec::new();
        for root in &self.roots {
            let Ok(rd) = std::fs::read_dir(root) else { continue };
            dirs.extend(
                rd.filter_map(|e| e.ok())
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path())
                    // A root below another root (kubepods.slice and its QoS
                    // slices) is a level of the hierarchy, not a job.
                    .filter(|d| {
                        !self.roots.contains(d) && !self.own.as_ref().is_some_and(|own| own.starts_with(d))
                    }),
            );
        }
        dirs
    }

    /// The pod UIDs of the `candidates` not yet watched and of the jobs not
    /// yet named: those the container runtime should list.
    pub fn pods_to_name(&self, candidates: &[PathBuf]) -> Vec<String> {
        let unwatched = candidates.iter().filter(|d| !self.jobs.contains_key(*d)).map(|d| self.relative(d));
        let unnamed =
            self.jobs.values().filter(|w| w.identity.pod.is_empty()).map(|w| w.labels.cgroup.clone());
        unwatched.chain(unnamed).map(|p| kube::parse(&p).pod).filter(|uid| !uid.is_empty()).collect()
    }

    fn relative(&self, dir: &Path) -> String {
        dir.strip_prefix(&self.mount).unwrap_or(dir).to_string_lossy().into_owned()
    }

    /// Attaches jobs that appeared among the `candidates` (and qualify),
    /// detaches those that are gone, and follows cgroups created inside a
    /// job since the last look; a job whose pod the runtime lists only now
    /// is named from now on.
    pub fn discover(
        &mut self,
        candidates: Vec<PathBuf>,
        live: &mut LiveHost,
        gpus: &GpuFleet,
        metrics: &Metrics,
        names: &Identities,
    ) {
        let on_gpu = gpus.holders();
        // Without NVML, holding a device is the only sign of a GPU job.
        let device_holders = self.device_holders || !gpus.sampling();
        let mut present = HashSet::new();
        let mut not_watched = 0;
        for dir in candidates {
            present.insert(dir.clone());
            if let Some(w) = self.jobs.get_mut(&dir) {
                // New sub-cgroups of a watched job, and their tasks.
                if let Ok(seeded) = live.capture.watch_cgroup(&dir, w.job.id) {
                    w.job.observe(live, seeded.into_iter().map(|(_, ev)| ev));
                }
                if w.identity.pod.is_empty() && names.knows(&w.identity.pod_uid) {
                    rename(w, names.of(&w.labels.cgroup, w.gpu_container.as_deref()), metrics);
                }
                continue;
            }
            let gpu_process = gpu_process_cgroup(&dir, &on_gpu, device_holders);
            if !self.all_jobs && gpu_process.is_none() {
                not_watched += 1;
                continue;
            }
            let id = self.next_id;
            self.next_id += 1;
            let rel = self.relative(&dir);
            let gpu_container = gpu_process.and_then(|d| {
                let ids = kube::parse(&self.relative(&d));
                (!ids.container.is_empty()).then_some(ids.container)
            });
            let identity = names.of(&rel, gpu_container.as_deref());
            let mut job = Job::new(id, monotonic_ns(), None, GpuScope::Held);
            match live.capture.watch_cgroup(&dir, id) {
                Ok(seeded) => {
                    job.observe(live, seeded.into_iter().map(|(_, ev)| ev));
                    let labels = JobLabels::new(rel.clone(), &identity);
                    metrics.set_job_info(&labels, &identity);
                    self.jobs.insert(
                        dir.clone(),
                        Watched {
                            id: jobs::id(&rel),
                            job,
                            dir,
                            labels,
                            identity,
                            gpu_container,
                            last: None,
                            tier: JobTier::default(),
                            published: None,
                            ranks: Vec::new(),
                            history: History::default(),
                        },
                    );
                }
                Err(e) => eprintln!("stall: cannot watch {}: {}", dir.display(), crate::error::chain(&e)),
            }
        }
        self.not_watched =
            (not_watched > 0).then(|| (not_watched, not_watched_why(not_watched, device_holders)));
        if let Some((_, why)) = self.not_watched.as_ref().filter(|_| !self.told_not_watched) {
            self.told_not_watched = true;
            eprintln!("stall daemon: not watching {why}");
        }
        let gone: Vec<PathBuf> =
            self.jobs.keys().filter(|d| !present.contains(*d) || !d.exists()).cloned().collect();
        for dir in gone {
            if let Some(w) = self.jobs.remove(&dir) {
                live.capture.unwatch_cgroup(&w.dir);
                let devices: Vec<u32> = w.job.devices.iter().copied().collect();
                metrics.remove_job(&w.labels, &w.identity, &devices);
                metrics.remove_ranks(&w.ranks);
            }
        }
    }

    /// Hands each job its events, one batch per job.
    pub fn route(&mut self, live: &mut LiveHost, events: &mut Vec<JobEvent>) {
        let mut by_id: HashMap<u32, Vec<Event>> = HashMap::new();
        for (id, ev) in events.drain(..) {
            by_id.entry(id).or_default().push(ev);
        }
        for w in self.jobs.values_mut() {
            if let Some(mut batch) = by_id.remove(&w.job.id) {
                if let Some(c) = self.ondemand.as_mut().filter(|c| c.job == w.job.id) {
                    c.take(&mut batch);
                }
                w.job.observe(live, batch);
            }
        }
    }
}

/// A job named anew (its pod listed by the runtime only after the job was
/// found): its series move to the new labels.
fn rename(w: &mut Watched, identity: Identity, metrics: &Metrics) {
    let devices: Vec<u32> = w.job.devices.iter().copied().collect();
    metrics.remove_job(&w.labels, &w.identity, &devices);
    metrics.remove_ranks(&w.ranks);
    w.ranks.clear();
    w.labels = JobLabels::new(w.labels.cgroup.clone(), &identity);
    metrics.set_job_info(&w.labels, &identity);
    w.identity = identity;
}

/// The cgroup (the job's or one below) of a process that uses a GPU: a
/// CUDA context NVML lists (`on_gpu`), or, where `device_holders` count,
/// an NVIDIA device held open. GPU infrastructure (the device plugin,
/// DCGM...) never does: it holds the devices of every node without being
/// anyone's job.
fn gpu_process_cgroup(dir: &Path, on_gpu: &HashSet<u32>, device_holders: bool) -> Option<PathBuf> {
    cgroup::subtree(dir).into_iter().find(|d| {
        cgroup::threads(d).into_iter().any(|(pid, tid)| {
            let listed = on_gpu.contains(&pid);
            pid == tid
                && (listed || device_holders)
                && (listed || procfs::open_fds(pid).iter().any(|f| f.target.starts_with("/dev/nvidia")))
                && !procfs::cmdline(pid).is_some_and(|c| gpu_infrastructure(&c))
        })
    })
}

/// Programs that hold NVIDIA devices on every GPU node to serve it, not to
/// train: the device plugin, feature discovery, the MIG manager, DCGM and
/// its exporter, the persistence daemon, nvidia-smi, the operator's
/// validator, and stall itself.
const GPU_INFRASTRUCTURE: &[&str] = &[
    "nvidia-device-plugin",
    "gpu-feature-discovery",
    "nvidia-mig-parted",
    "nvidia-mig-manager",
    "nv-hostengine",
    "dcgm-exporter",
    "dcgmi",
    "nvidia-persistenced",
    "nvidia-smi",
    "nvidia-validator",
    "stall",
];

/// Whether a command line (`/proc/PID/cmdline`, words joined by spaces)
/// runs one of [`GPU_INFRASTRUCTURE`].
fn gpu_infrastructure(cmdline: &str) -> bool {
    let program = cmdline.split(' ').next().unwrap_or_default();
    let name = program.rsplit('/').next().unwrap_or(program);
    GPU_INFRASTRUCTURE.contains(&name)
}

/// Why `n` cgroups under the roots are not watched, in words.
fn not_watched_why(n: usize, device_holders: bool) -> String {
    let sign = if device_holders { "holds an NVIDIA device open" } else { "has a CUDA context NVML lists" };
    let what = if n == 1 { "cgroup" } else { "cgroups" };
    format!("{n} {what} under the roots: no process of theirs {sign}; --all-jobs watches every one")
}

/// Attaches or detaches the hooks of the full capture: the syscall hooks,
/// and the scheduler's too where `sched_too` (the cheap tier keeps the
/// threads' counters from /proc instead). After attaching, every job's
/// descriptors are looked up afresh (opens and closes were not seen).
pub(super) fn set_hooks(live: &mut LiveHost, node: &mut Node, on: bool, now_ns: u64, sched_too: bool) {
    let sched = sched_too && on != live.capture.sched_hooks();
    if !sched && on == live.capture.syscall_hooks() {
        return;
    }
    let started = std::time::Instant::now();
    let c = &mut live.capture;
    let done = if on {
        if sched {
            // Up to now from /proc: the scheduler hooks go on from there.
            c.sample_sched();
        }
        c.set_sched_hooks(true).and_then(|()| c.set_syscall_hooks(true))
    } else {
        c.set_syscall_hooks(false).and_then(|()| if sched { c.set_sched_hooks(false) } else { Ok(()) })
    };
    let what = if sched { "scheduler and syscall hooks" } else { "syscall hooks" };
    if let Err(e) = done {
        let verb = if on { "attach" } else { "detach" };
        eprintln!("stall: cannot {verb} the {what}: {}", crate::error::chain(&e));
        return;
    }
    // Attaching trampolines patches the kernel's text once per program:
    // say how long the loop stood still for it.
    eprintln!(
        "stall daemon: {what} ({}) {} in {:.2} s",
        live.capture.syscall_backend().name(),
        if on { "attached" } else { "detached" },
        started.elapsed().as_secs_f64()
    );
    if on {
        for w in node.jobs.values_mut() {
            w.job.reseed(live, now_ns);
        }
    }
}

impl Node {
    /// Starts a capture asked for over HTTP, or answers why not (one at a
    /// time; the job must be watched).
    pub fn demand(&mut self, req: CaptureRequest, live: &mut LiveHost, now_ns: u64, lost: u64) {
        if self.ondemand.is_some() {
            let _ = req.reply.send(Err(CaptureRefused::Busy));
            return;
        }
        let Some(w) = self.jobs.values_mut().find(|w| w.id == req.id) else {
            let _ = req.reply.send(Err(CaptureRefused::NoSuchJob));
            return;
        };
        self.ondemand = OnDemand::start(req, (w.job.id, &w.dir, &mut w.tier), live, now_ns, lost);
    }

    /// The capture under way: its job's interval recorded; once its window
    /// is over (or the job gone), answered.
    pub fn step_capture(&mut self, live: &mut LiveHost, gpus: &GpuFleet, now_ns: u64, lost: u64) {
        let Some(mut c) = self.ondemand.take() else { return };
        match self.jobs.get(&c.dir) {
            Some(w) if !c.tick(w.last.as_ref(), gpus, now_ns) => self.ondemand = Some(c),
            w => c.finish(w.map(|w| (&w.job.model, w.last.as_ref())), live, lost, now_ns),
        }
    }

    /// `/jobs` for every job, as of its last interval.
    pub fn views(&self) -> Vec<JobView<'_>> {
        self.jobs
            .values()
            .map(|j| JobView {
                id: j.id.clone(),
                cgroup: &j.labels.cgroup,
                namespace: &j.identity.namespace,
                pod: &j.identity.pod,
                container: &j.identity.container,
                pod_uid: &j.identity.pod_uid,
                slurm_job: &j.identity.slurm_job,
                pod_labels: &j.identity.pod_labels,
                tier: match j.tier.tier {
                    Tier::Cheap => "cheap",
                    Tier::Full { .. } => "full",
                    Tier::Cooldown { .. } => "cooldown",
                },
                verdict: j.published.as_ref(),
                tick: j.last.as_ref(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_infrastructure_is_never_a_job() {
        for infra in [
            "/usr/bin/nvidia-device-plugin --fail-on-init-error=false",
            "nv-hostengine -n --service-account nvidia-dcgm",
            "/usr/bin/dcgm-exporter -f /etc/dcgm-exporter/dcp-metrics-included.csv",
            "/usr/local/bin/stall daemon --kubernetes",
        ] {
            assert!(gpu_infrastructure(infra), "{infra}");
        }
        for job in ["python train.py", "/usr/bin/python3 -m torch.distributed.run train.py", "stall-trainer"]
        {
            assert!(!gpu_infrastructure(job), "{job}");
        }
    }
}
