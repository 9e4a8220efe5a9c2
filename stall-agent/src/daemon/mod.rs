//! `stall daemon`: every job on the node, continuously. A job is a cgroup v2
//! directly under a `--cgroup-root`; one set of BPF programs serves them all
//! (cgroup mode, a job id per cgroup). Each interval: new jobs are attached,
//! gone ones detached, each job's window aggregated, judged and exported to
//! Prometheus. Memory follows the live jobs: ended threads, files and jobs
//! are pruned once counted.
mod kube;
pub mod metrics;

use std::{
    collections::{BTreeMap, HashMap, HashSet, VecDeque},
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context, Result};
use serde::Serialize;
use tokio::signal::unix::{signal, SignalKind};

use self::metrics::{JobLabels, Metrics};
use crate::{
    aggregate::{push_recent, Model, Window},
    capture::{cgroup, monotonic_ns, procfs, Capture, CaptureOptions},
    correlate,
    decode::{JobEvent, Snapshot},
    gpu::{self as nvml, GpuSelect},
    session::{
        absorb,
        gpu::{poll_into, GpuTrack},
        observe, SessionError,
    },
    verdict::{self, GpuWindow, Verdict},
};

#[derive(Debug, Clone)]
pub struct Options {
    pub roots: Vec<PathBuf>,
    pub all_jobs: bool,
    pub listen: SocketAddr,
    pub interval: Duration,
    pub gpu: Option<GpuSelect>,
    /// NVML library to load instead of the default.
    pub nvml_lib: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("cannot listen on {addr}: {reason}")]
    Listen { addr: SocketAddr, reason: String },
}

struct Job {
    id: u32,
    dir: PathBuf,
    labels: JobLabels,
    model: Model,
    recent: VecDeque<Window>,
    gpus: HashSet<u32>,
    verdict: Option<Verdict>,
}

/// What `/jobs` serves: per job, what labels cannot carry.
#[derive(Serialize)]
struct JobDoc<'a> {
    job: &'a str,
    cgroup: String,
    pod: &'a str,
    container: &'a str,
    verdict: Option<&'a Verdict>,
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

pub async fn run(opts: Options) -> Result<()> {
    // First: a signal during start-up must still end in a clean exit.
    let mut sigint = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mount =
        cgroup::mount_point().ok_or(SessionError::Capture(crate::capture::CaptureError::NoCgroup2))?;
    let roots: Vec<PathBuf> = opts
        .roots
        .iter()
        .map(|r| cgroup::resolve(r).map_err(SessionError::from))
        .collect::<Result<_, _>>()?;
    let mut capture = Capture::load(&CaptureOptions { cgroup_mode: true, ..Default::default() })
        .map_err(SessionError::from)?;
    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .map_err(|e| DaemonError::Listen { addr: opts.listen, reason: e.to_string() })?;
    let lib = nvml::library(opts.nvml_lib.as_deref());
    let mut gpu = match &opts.gpu {
        Some(GpuSelect::Off) => None,
        Some(sel @ GpuSelect::Indices(_)) => nvml::open_with_library(sel, lib).map_err(SessionError::from)?,
        other => match nvml::open_with_library(other.as_ref().unwrap_or(&GpuSelect::All), lib) {
            Ok(g) => g,
            Err(e) => {
                eprintln!("stall: {e}");
                None
            }
        },
    };

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

    let mut jobs: BTreeMap<PathBuf, Job> = BTreeMap::new();
    let mut next_id = 1u32;
    let mut gpus: Vec<GpuTrack> = Vec::new();
    let mut self_cpu = 0.0f64;
    let mut events_seen = 0u64;
    let mut lost_seen = [0u64; 5];
    let mut tick = tokio::time::interval(opts.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut events: Vec<JobEvent> = Vec::new();
    let start_ns = monotonic_ns();

    let mut drain = tokio::time::interval(crate::capture::DRAIN_EVERY);
    drain.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            r = capture.next_events(&mut events) => {
                r.context("reading the ring buffer")?;
                route(&mut capture, &mut jobs, &mut events);
            }
            _ = drain.tick() => {
                capture.drain_events(&mut events);
                route(&mut capture, &mut jobs, &mut events);
            }
            _ = tick.tick() => {
                discover(&mut capture, &mut jobs, &mut next_id, &roots, &mount, opts.all_jobs, &gpus, &shared.metrics);
                capture.drain_events(&mut events);
                route(&mut capture, &mut jobs, &mut events);
                let snap = capture.snapshot();
                if let Some(src) = gpu.as_mut() {
                    poll_into(&mut gpus, src.as_mut(), start_ns);
                }
                for job in jobs.values_mut() {
                    step(job, &mut capture, &snap, &gpus, &shared.metrics);
                }
                for g in &gpus {
                    let w = g.window(snap.ts.saturating_sub(opts.interval.as_nanos() as u64), snap.ts);
                    shared.metrics.set_gpu(g.index, &g.name, w.util_mean_pct, w.idle_fraction * opts.interval.as_secs_f64());
                }
                let lost: [u64; 5] = std::array::from_fn(|i| snap.lost[i].saturating_sub(lost_seen[i]));
                lost_seen = snap.lost;
                shared.metrics.add_lost(&lost);
                shared.metrics.agent_events.inc_by(snap.events.saturating_sub(events_seen));
                events_seen = snap.events;
                let cpu = self_cpu_seconds();
                shared.metrics.agent_cpu.inc_by((cpu - self_cpu).max(0.0));
                self_cpu = cpu;
                shared.metrics.agent_rss.set(self_rss_bytes() as i64);
                shared.metrics.agent_jobs.set(jobs.len() as i64);
                *shared.jobs_json.lock().unwrap() = jobs_json(&jobs, opts.interval);
            }
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
        }
    }
    eprintln!("stall daemon: detaching");
    drop(capture);
    Ok(())
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

/// Attaches jobs that appeared (and qualify), detaches those that are gone,
/// and follows cgroups created inside a job since the last look.
#[allow(clippy::too_many_arguments)]
fn discover(
    capture: &mut Capture,
    jobs: &mut BTreeMap<PathBuf, Job>,
    next_id: &mut u32,
    roots: &[PathBuf],
    mount: &Path,
    all_jobs: bool,
    gpus: &[GpuTrack],
    metrics: &Metrics,
) {
    let gpu_pids: HashSet<u32> = gpus.iter().flat_map(|g| g.pids.iter().copied()).collect();
    let mut present = HashSet::new();
    for root in roots {
        let Ok(rd) = std::fs::read_dir(root) else { continue };
        for dir in
            rd.filter_map(|e| e.ok()).filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path())
        {
            // A root below another root (kubepods.slice and its QoS slices)
            // is a level of the hierarchy, not a job.
            if roots.contains(&dir) {
                continue;
            }
            present.insert(dir.clone());
            if let Some(job) = jobs.get_mut(&dir) {
                // New sub-cgroups of a watched job, and their tasks.
                if let Ok(seeded) = capture.watch_cgroup(&dir, job.id) {
                    let mut extra = Vec::new();
                    for (j, ev) in &seeded {
                        observe(capture, &mut job.model, *j, ev, &mut extra);
                    }
                }
                continue;
            }
            if !all_jobs && !uses_gpu(&dir, &gpu_pids) {
                continue;
            }
            let id = *next_id;
            *next_id += 1;
            let rel = dir.strip_prefix(mount).unwrap_or(&dir).to_string_lossy().into_owned();
            let ids = kube::parse(&rel);
            let mut job = Job {
                id,
                dir: dir.clone(),
                labels: JobLabels { cgroup: rel, pod: ids.pod, container: ids.container },
                model: Model::new(monotonic_ns()),
                recent: VecDeque::new(),
                gpus: HashSet::new(),
                verdict: None,
            };
            match capture.watch_cgroup(&dir, id) {
                Ok(seeded) => {
                    let mut extra = Vec::new();
                    for (j, ev) in &seeded {
                        observe(capture, &mut job.model, *j, ev, &mut extra);
                    }
                    jobs.insert(dir, job);
                }
                Err(e) => eprintln!("stall: cannot watch {}: {e}", dir.display()),
            }
        }
    }
    let gone: Vec<PathBuf> = jobs.keys().filter(|d| !present.contains(*d) || !d.exists()).cloned().collect();
    for dir in gone {
        if let Some(job) = jobs.remove(&dir) {
            capture.unwatch_cgroup(&job.dir);
            let gpus: Vec<u32> = job.gpus.iter().copied().collect();
            metrics.remove_job(&job.labels, &gpus);
        }
    }
}

/// Does any task of the cgroup (or below) hold an NVIDIA device open, or
/// does NVML list it?
fn uses_gpu(dir: &Path, gpu_pids: &HashSet<u32>) -> bool {
    cgroup::subtree(dir).iter().flat_map(|d| cgroup::threads(d)).any(|(pid, tid)| {
        pid == tid
            && (gpu_pids.contains(&pid)
                || procfs::open_fds(pid).iter().any(|f| f.target.starts_with("/dev/nvidia")))
    })
}

fn route(capture: &mut Capture, jobs: &mut BTreeMap<PathBuf, Job>, events: &mut Vec<JobEvent>) {
    let mut by_id: HashMap<u32, &mut Job> = jobs.values_mut().map(|j| (j.id, j)).collect();
    let mut extra = Vec::new();
    for (id, ev) in events.drain(..) {
        if let Some(job) = by_id.get_mut(&id) {
            observe(capture, &mut job.model, id, &ev, &mut extra);
            for (_, e) in extra.drain(..) {
                job.model.apply(&e);
            }
        }
    }
}

/// The part of a snapshot that belongs to one job.
fn slice(snap: &Snapshot, job: u32) -> Snapshot {
    let threads: Vec<_> = snap.threads.iter().filter(|t| t.job == job).copied().collect();
    let tgids: HashSet<u32> = threads.iter().map(|t| t.tgid).collect();
    let tids: HashSet<u32> = threads.iter().map(|t| t.tid).collect();
    Snapshot {
        ts: snap.ts,
        files: snap.files.iter().filter(|f| tgids.contains(&f.tgid)).copied().collect(),
        wakes: snap.wakes.iter().filter(|w| tids.contains(&w.wakee)).cloned().collect(),
        threads,
        lost: [0; 5],
        events: 0,
        sched_gaps: 0,
    }
}

fn step(job: &mut Job, capture: &mut Capture, snap: &Snapshot, gpus: &[GpuTrack], metrics: &Metrics) {
    absorb(capture, &mut job.model, &slice(snap, job.id));
    let window = job.model.interval(snap.ts);
    push_recent(&mut job.recent, window.clone());
    let pids: HashSet<u32> = job.model.procs.keys().copied().collect();
    let job_gpus: Vec<&GpuTrack> = gpus.iter().filter(|g| g.pids.iter().any(|p| pids.contains(p))).collect();
    job.gpus.extend(job_gpus.iter().map(|g| g.index));
    let gpu_pids: HashSet<u32> = job_gpus.iter().flat_map(|g| g.pids.iter().copied()).collect();

    let recent = Window::merge(job.recent.make_contiguous());
    let roles = correlate::assign(&recent, &gpu_pids, None);
    metrics.add_window(&job.labels, &window, &roles);
    let gw: Vec<GpuWindow> = job_gpus.iter().map(|g| g.window(recent.start_ns, recent.end_ns)).collect();
    for g in &job_gpus {
        let w = g.window(window.start_ns, window.end_ns);
        metrics.add_job_gpu_idle(&job.labels, g.index, w.idle_fraction * window.secs());
    }
    let v = verdict::judge(&recent, &roles, &gw);
    metrics.set_verdict(&job.labels, v.kind);
    job.verdict = Some(v);

    job.model.prune();
}

fn jobs_json(jobs: &BTreeMap<PathBuf, Job>, interval: Duration) -> String {
    let docs: Vec<JobDoc> = jobs
        .values()
        .map(|j| {
            let w = Window::merge(&j.recent.iter().cloned().collect::<Vec<_>>());
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
                verdict: j.verdict.as_ref(),
                processes: j.model.procs.values().filter(|p| p.alive).count(),
                top_files: files,
                gpus: j.gpus.iter().copied().collect(),
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
