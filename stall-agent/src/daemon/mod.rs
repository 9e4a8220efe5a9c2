//! `stall daemon`: every job on the node, continuously. A job is a cgroup v2
//! directly under a `--cgroup-root`; one set of BPF programs serves them all
//! (cgroup mode, a job id per cgroup). Each interval: new jobs are attached,
//! gone ones detached, each job's window aggregated, judged and exported to
//! Prometheus. Memory follows the live jobs: ended threads, files and jobs
//! are pruned once counted.
mod kube;
pub mod metrics;
pub mod tier;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Result;
use serde::Serialize;
use stall_common::counter::LOST_CAUSES;

use self::{
    metrics::{JobLabels, Metrics},
    tier::JobTier,
};
use crate::{
    aggregate::{Window, RECENT_NS},
    capture::{cgroup, procfs, Capture, CaptureError, CaptureOptions, SyscallHooks},
    clock::monotonic_ns,
    decode::{Event, JobEvent, Snapshot},
    error::Error,
    gpu::GpuSelect,
    job::{Feed, GpuFleet, GpuScope, Job, Stacks, Tick, Wake},
    progress::ProgressView,
    verdict::{rules, Kind, Verdict},
};

#[derive(Debug, Clone)]
pub struct Options {
    pub roots: Vec<PathBuf>,
    pub all_jobs: bool,
    pub listen: SocketAddr,
    pub interval: Duration,
    pub gpu: Option<GpuSelect>,
    /// NVML library to load instead of the driver's on the loader path.
    pub nvml_lib: Option<PathBuf>,
    /// Capture tiers; `None`: always the full capture.
    pub tiers: Option<tier::Policy>,
    pub syscall_hooks: SyscallHooks,
}

/// A job of the node: a cgroup directly under a root.
struct Watched {
    job: Job,
    dir: PathBuf,
    labels: JobLabels,
    /// The last interval's outcome, for `/jobs`.
    last: Option<Tick>,
    tier: JobTier,
    /// The verdict published (the live one, or what the cheap tier can
    /// vouch for).
    published: Option<Verdict>,
}

/// What `/jobs` serves: per job, what labels cannot carry.
#[derive(Serialize)]
struct JobDoc<'a> {
    job: &'a str,
    cgroup: String,
    pod: &'a str,
    container: &'a str,
    verdict: Option<&'a Verdict>,
    progress: Option<&'a ProgressView>,
    processes: usize,
    top_files: Vec<FileDoc>,
    gpus: Vec<u32>,
}

#[derive(Serialize)]
struct FileDoc {
    pid: u32,
    path: String,
    read_bytes: u64,
    read_calls: u64,
    mb_per_s: f64,
}

struct Shared {
    metrics: Metrics,
    jobs_json: Mutex<String>,
}

/// The node: its jobs, by cgroup directory, and how they are found.
struct Node {
    jobs: BTreeMap<PathBuf, Watched>,
    next_id: u32,
    roots: Vec<PathBuf>,
    mount: PathBuf,
    all_jobs: bool,
}

/// The agent's own cost and the node-wide counters, as last exported.
#[derive(Default)]
struct Seen {
    cpu_s: f64,
    events: u64,
    lost: [u64; LOST_CAUSES],
}

pub async fn run(opts: Options) -> Result<()> {
    let mut feed = Feed::new(opts.interval)?;
    let mount = cgroup::mount_point().ok_or(Error::Capture(CaptureError::NoCgroup2))?;
    let roots: Vec<PathBuf> =
        opts.roots.iter().map(|r| cgroup::resolve(r).map_err(Error::from)).collect::<Result<_, _>>()?;
    let mut gpus =
        GpuFleet::open(opts.gpu.as_ref(), opts.nvml_lib.as_deref(), monotonic_ns()).map_err(Error::from)?;
    // Tiers need GPU data to tell when to look; without it, full capture.
    let tiers = opts.tiers.filter(|_| gpus.sampling());
    let mut capture = Capture::load(&CaptureOptions {
        cgroup_mode: true,
        syscall_hooks_on_demand: tiers.is_some(),
        syscall_hooks: opts.syscall_hooks,
        ..Default::default()
    })
    .map_err(Error::from)?;
    eprintln!("stall daemon: {}", capture.syscall_backend_line());
    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .map_err(|e| Error::Listen { addr: opts.listen, reason: e.to_string() })?;
    if let Some(note) = &gpus.note {
        eprintln!("stall: {note}");
    }

    let shared = Arc::new(Shared { metrics: Metrics::new(), jobs_json: Mutex::new("[]".into()) });
    let app = axum::Router::new()
        .route("/metrics", axum::routing::get(serve_metrics))
        .route("/jobs", axum::routing::get(serve_jobs))
        .with_state(shared.clone());
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            eprintln!("stall: HTTP server stopped: {e}");
        }
    });
    eprintln!(
        "stall daemon: watching {} on {} (metrics at http://{}/metrics)",
        roots.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(", "),
        mount.display(),
        opts.listen
    );

    let mut node = Node { jobs: BTreeMap::new(), next_id: 1, roots, mount, all_jobs: opts.all_jobs };
    let mut seen = Seen::default();
    node.discover(&mut capture, &gpus, &shared.metrics);
    feed.start();
    loop {
        match feed.next(&mut capture).await? {
            Wake::Events => node.route(&mut capture, &mut feed.events),
            Wake::Tick => {
                node.discover(&mut capture, &gpus, &shared.metrics);
                capture.drain_events(&mut feed.events);
                node.route(&mut capture, &mut feed.events);
                let snap = capture.snapshot();
                for w in gpus.poll() {
                    eprintln!("stall: {w}");
                }
                let hooks = capture.syscall_hooks();
                for w in node.jobs.values_mut() {
                    step(w, &mut capture, &snap, &gpus, &shared.metrics, tiers.as_ref(), hooks);
                }
                if tiers.is_some() {
                    let want = node.jobs.values().any(|w| w.tier.tier.is_full());
                    set_hooks(&mut capture, &mut node, want, snap.ts);
                }
                shared.metrics.set_syscall_hooks(capture.syscall_hooks());
                export_node(&shared.metrics, &snap, &gpus, &mut seen, opts.interval, node.jobs.len());
                *shared.jobs_json.lock().unwrap() = jobs_json(&node.jobs, opts.interval);
            }
            Wake::Signal(_) => break,
        }
    }
    eprintln!("stall daemon: detaching");
    drop(capture);
    Ok(())
}

/// Node-wide series: each GPU, losses, and the agent's own cost.
fn export_node(
    m: &Metrics,
    snap: &Snapshot,
    gpus: &GpuFleet,
    seen: &mut Seen,
    interval: Duration,
    jobs: usize,
) {
    for g in &gpus.tracks {
        let w = g.window(snap.ts.saturating_sub(interval.as_nanos() as u64), snap.ts);
        m.set_gpu(&w, w.idle_fraction * interval.as_secs_f64());
    }
    let lost: [u64; LOST_CAUSES] = std::array::from_fn(|i| snap.lost[i].saturating_sub(seen.lost[i]));
    seen.lost = snap.lost;
    m.add_lost(&lost);
    m.agent_events.inc_by(snap.events.saturating_sub(seen.events));
    seen.events = snap.events;
    let cpu = self_cpu_seconds();
    m.agent_cpu.inc_by((cpu - seen.cpu_s).max(0.0));
    seen.cpu_s = cpu;
    m.agent_rss.set(self_rss_bytes() as i64);
    m.agent_jobs.set(jobs as i64);
}

/// OpenMetrics to whoever asks for it (Prometheus does), the classic text
/// format otherwise.
async fn serve_metrics(
    axum::extract::State(s): axum::extract::State<Arc<Shared>>,
    headers: axum::http::HeaderMap,
) -> impl axum::response::IntoResponse {
    let om = headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/openmetrics-text"));
    let text = s.metrics.encode();
    if om {
        (
            [(
                axum::http::header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
    } else {
        (
            [(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
            metrics::to_classic(&text),
        )
    }
}

async fn serve_jobs(
    axum::extract::State(s): axum::extract::State<Arc<Shared>>,
) -> impl axum::response::IntoResponse {
    ([(axum::http::header::CONTENT_TYPE, "application/json")], s.jobs_json.lock().unwrap().clone())
}

impl Node {
    /// Attaches jobs that appeared (and qualify), detaches those that are
    /// gone, and follows cgroups created inside a job since the last look.
    fn discover(&mut self, capture: &mut Capture, gpus: &GpuFleet, metrics: &Metrics) {
        let on_gpu = gpus.holders();
        let mut present = HashSet::new();
        for root in &self.roots {
            let Ok(rd) = std::fs::read_dir(root) else { continue };
            for dir in rd
                .filter_map(|e| e.ok())
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
            {
                // A root below another root (kubepods.slice and its QoS
                // slices) is a level of the hierarchy, not a job.
                if self.roots.contains(&dir) {
                    continue;
                }
                present.insert(dir.clone());
                if let Some(w) = self.jobs.get_mut(&dir) {
                    // New sub-cgroups of a watched job, and their tasks.
                    if let Ok(seeded) = capture.watch_cgroup(&dir, w.job.id) {
                        w.job.observe(capture, seeded.into_iter().map(|(_, ev)| ev));
                    }
                    continue;
                }
                if !self.all_jobs && !uses_gpu(&dir, &on_gpu) {
                    continue;
                }
                let id = self.next_id;
                self.next_id += 1;
                let rel = dir.strip_prefix(&self.mount).unwrap_or(&dir).to_string_lossy().into_owned();
                let ids = kube::parse(&rel);
                let mut job = Job::new(id, monotonic_ns(), None, GpuScope::Held);
                match capture.watch_cgroup(&dir, id) {
                    Ok(seeded) => {
                        job.observe(capture, seeded.into_iter().map(|(_, ev)| ev));
                        let labels = JobLabels { cgroup: rel, pod: ids.pod, container: ids.container };
                        self.jobs.insert(
                            dir.clone(),
                            Watched {
                                job,
                                dir,
                                labels,
                                last: None,
                                tier: JobTier::default(),
                                published: None,
                            },
                        );
                    }
                    Err(e) => eprintln!("stall: cannot watch {}: {e}", dir.display()),
                }
            }
        }
        let gone: Vec<PathBuf> =
            self.jobs.keys().filter(|d| !present.contains(*d) || !d.exists()).cloned().collect();
        for dir in gone {
            if let Some(w) = self.jobs.remove(&dir) {
                capture.unwatch_cgroup(&w.dir);
                let devices: Vec<u32> = w.job.devices.iter().copied().collect();
                metrics.remove_job(&w.labels, &devices);
            }
        }
    }

    /// Hands each job its events, one batch per job.
    fn route(&mut self, capture: &mut Capture, events: &mut Vec<JobEvent>) {
        let mut by_id: HashMap<u32, Vec<Event>> = HashMap::new();
        for (id, ev) in events.drain(..) {
            by_id.entry(id).or_default().push(ev);
        }
        for w in self.jobs.values_mut() {
            if let Some(batch) = by_id.remove(&w.job.id) {
                w.job.observe(capture, batch);
            }
        }
    }
}

/// Does any task of the cgroup (or below) hold an NVIDIA device open, or
/// does NVML list it?
fn uses_gpu(dir: &Path, on_gpu: &HashSet<u32>) -> bool {
    cgroup::subtree(dir).iter().flat_map(|d| cgroup::threads(d)).any(|(pid, tid)| {
        pid == tid
            && (on_gpu.contains(&pid)
                || procfs::open_fds(pid).iter().any(|f| f.target.starts_with("/dev/nvidia")))
    })
}

/// Attaches or detaches the syscall hooks; after attaching, every job's
/// descriptors are looked up afresh (opens and closes were not seen).
fn set_hooks(capture: &mut Capture, node: &mut Node, on: bool, now_ns: u64) {
    if on == capture.syscall_hooks() {
        return;
    }
    let started = std::time::Instant::now();
    if let Err(e) = capture.set_syscall_hooks(on) {
        eprintln!("stall: cannot {} the syscall hooks: {e}", if on { "attach" } else { "detach" });
        return;
    }
    // Attaching trampolines patches the kernel's text once per program:
    // say how long the loop stood still for it.
    eprintln!(
        "stall daemon: syscall hooks ({}) {} in {:.2} s",
        capture.syscall_backend().name(),
        if on { "attached" } else { "detached" },
        started.elapsed().as_secs_f64()
    );
    if on {
        for w in node.jobs.values_mut() {
            w.job.reseed(capture, now_ns);
        }
    }
}

/// One interval of one job: its tick, its tier for the next, exported,
/// then what ended forgotten.
fn step(
    w: &mut Watched,
    capture: &mut Capture,
    snap: &Snapshot,
    gpus: &GpuFleet,
    metrics: &Metrics,
    tiers: Option<&tier::Policy>,
    hooks: bool,
) {
    // Python stacks for what the full capture blames (escalated jobs).
    w.job.stacks = if tiers.is_none() || w.tier.tier.is_full() { Stacks::On } else { Stacks::Off };
    let tick = w.job.tick(capture, &snap.of_job(w.job.id), gpus);
    if !hooks {
        w.job.note_io(capture, &tick.roles, snap.ts);
    }
    metrics.add_window(&w.labels, &tick.interval, &tick.roles);
    let secs = tick.interval.secs();
    for g in &tick.interval_gpus {
        metrics.add_job_gpu(&w.labels, g, secs);
    }
    metrics.set_last_progress_age(&w.labels, tick.progress.silent_s);
    let verdict = match tiers {
        None => tick.verdict.clone(),
        Some(policy) => {
            // Full data for the span the live verdict judges, or not.
            let full = w.tier.settled(snap.ts, Duration::from_nanos(RECENT_NS));
            if w.tier.tier.is_full() {
                metrics.add_full_capture(&w.labels, secs);
            }
            let before = w.tier.escalations;
            w.tier.step(snap.ts, &signals(&tick), policy);
            metrics.add_escalations(&w.labels, w.tier.escalations - before);
            metrics.set_tier(&w.labels, w.tier.tier.is_full());
            published(&tick, full, w.published.as_ref())
        }
    };
    metrics.set_verdict(&w.labels, verdict.kind);
    w.published = Some(verdict);
    w.last = Some(tick);
    w.job.prune();
}

/// What a tick says to the tiers.
fn signals(tick: &Tick) -> tier::Signals {
    let has_gpu = !tick.interval_gpus.is_empty();
    tier::Signals {
        has_gpu,
        gpu_idle: has_gpu
            && tick.interval_gpus.iter().all(|g| g.samples > 0 && g.idle_fraction >= GPU_IDLE_SHARE),
        gpu_busy: tick.interval_gpus.iter().any(|g| g.util_mean_pct >= rules::GPU_BUSY_PCT),
        silent_s: tick.progress.silent_s,
    }
}

/// A GPU idle at least this share of an interval counts as idle for it.
const GPU_IDLE_SHARE: f64 = 0.9;

/// The verdict to publish: the live one when it rests on full data; in the
/// cheap tier only what it can vouch for — a busy GPU (or a hang behind
/// one), judged from the GPU, the scheduler and /proc — and otherwise the
/// last full verdict while the job waits for its next capture.
fn published(tick: &Tick, full: bool, before: Option<&Verdict>) -> Verdict {
    if full || matches!(tick.verdict.kind, Kind::GpuBusy | Kind::Hang) {
        return tick.verdict.clone();
    }
    if let Some(v) = before.filter(|v| !matches!(v.kind, Kind::GpuBusy | Kind::Hang)) {
        return v.clone();
    }
    Verdict {
        kind: Kind::Unknown,
        summary: "no full capture of this job yet (cheap tier: scheduler and GPU only); it starts once its GPU has idled for the escalation threshold".into(),
        evidence: tick.verdict.evidence.clone(),
        host_only: tick.verdict.host_only,
        ..Default::default()
    }
}

fn jobs_json(jobs: &BTreeMap<PathBuf, Watched>, interval: Duration) -> String {
    let docs: Vec<JobDoc> = jobs
        .values()
        .map(|j| {
            let empty = Window::default();
            let w = j.last.as_ref().map_or(&empty, |t| &t.recent);
            let secs = w.secs().max(interval.as_secs_f64());
            let files: Vec<FileDoc> = w
                .files_by_bytes()
                .into_iter()
                .take(10)
                .map(|(pid, f)| FileDoc {
                    pid,
                    path: f.path.clone(),
                    read_bytes: f.read_bytes,
                    read_calls: f.read_calls,
                    mb_per_s: f.read_bytes as f64 / 1e6 / f.rate_secs(secs),
                })
                .collect();
            JobDoc {
                job: &j.labels.cgroup,
                cgroup: j.dir.display().to_string(),
                pod: &j.labels.pod,
                container: &j.labels.container,
                verdict: j.published.as_ref(),
                progress: j.last.as_ref().map(|t| &t.progress),
                processes: j.job.model.procs.values().filter(|p| p.alive).count(),
                top_files: files,
                gpus: j.job.devices.iter().copied().collect(),
            }
        })
        .collect();
    serde_json::to_string(&docs).unwrap_or_else(|_| "[]".into())
}

fn self_cpu_seconds() -> f64 {
    let Ok(text) = std::fs::read_to_string("/proc/self/stat") else { return 0.0 };
    let Some(rest) = text.rfind(')').map(|i| &text[i + 2..]) else { return 0.0 };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime, stime are fields 14 and 15 (11 and 12 after the comm).
    let ticks: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
    ticks as f64 / hz
}

fn self_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}
