//! `stall daemon`: every job on the node, continuously. A job is a cgroup v2
//! directly under a `--cgroup-root`; one set of BPF programs serves them all
//! (cgroup mode, a job id per cgroup). Each interval: new jobs are attached,
//! gone ones detached, each job's window aggregated, judged and exported to
//! Prometheus. Memory follows the live jobs: ended threads, files and jobs
//! are pruned once counted. HTTP is served on a thread of its own.
pub mod cri;
mod history;
pub mod http;
mod identity;
mod kube;
pub mod metrics;
mod node;
mod ondemand;
mod step;
pub mod tier;
pub mod web_config;

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::Result;
use stall_common::counter::LOST_CAUSES;

use self::{
    http::{Board, BoardJob, ConnectionLimits, HttpOptions, Shared},
    identity::Identities,
    metrics::Metrics,
    node::Node,
    web_config::WebConfig,
};
use crate::{
    capture::{cgroup, procfs, Capture, CaptureError, CaptureOptions, SyscallHooks},
    clock::{self, monotonic_ns},
    decode::Snapshot,
    error::Error,
    gpu::GpuSelect,
    job::{Feed, GpuFleet, LiveHost, Wake},
    output::jobs,
};

#[derive(Debug, Clone)]
pub struct Options {
    pub roots: Vec<PathBuf>,
    /// The kubelet's pod cgroups as roots too, found under either driver,
    /// and pods named by the container runtime.
    pub kubernetes: bool,
    /// The container runtime's CRI socket (default: containerd's, CRI-O's).
    pub runtime_endpoint: Option<PathBuf>,
    /// Pod labels on `stall_job_info` besides [`identity::POD_LABELS`].
    pub pod_labels: Vec<String>,
    pub all_jobs: bool,
    /// Jobs holding an NVIDIA device open count without a CUDA context.
    pub device_holders: bool,
    pub listen: SocketAddr,
    pub interval: Duration,
    pub gpu: Option<GpuSelect>,
    /// NVML library to load instead of the driver's on the loader path.
    pub nvml_lib: Option<PathBuf>,
    /// Capture tiers; `None`: always the full capture.
    pub tiers: Option<tier::Policy>,
    pub syscall_hooks: SyscallHooks,
    /// TLS and basic authentication (the exporter toolkit's file).
    pub web_config: Option<PathBuf>,
    /// Connections the HTTP server keeps open at most.
    pub http_max_connections: usize,
    /// How long a connection may idle between requests.
    pub http_idle_timeout: Duration,
    /// File paths, command lines and Python stacks in `/jobs`, the logs
    /// and the capture endpoint.
    pub expose_details: bool,
    /// The node's name in `/jobs` (default: the host name).
    pub node_name: Option<String>,
    /// No NVML is an error (exit 6), not a note: on a GPU node, a daemon
    /// that cannot see the GPU judges only the host side.
    pub require_gpu: bool,
}

/// The agent's own cost and the node-wide counters, as last exported.
#[derive(Default)]
struct Seen {
    cpu_s: f64,
    events: u64,
    lost: [u64; LOST_CAUSES],
}

pub async fn run(opts: Options) -> Result<()> {
    if let Err(e) = raise_file_limit() {
        eprintln!("stall daemon: the soft limit on open files stays below the hard one: {e}");
    }
    let web = match &opts.web_config {
        None => None,
        Some(path) => {
            Some(WebConfig::load(path).map_err(|why| Error::Usage(format!("--web-config: {why}")))?)
        }
    };
    let mut feed = Feed::new(opts.interval)?;
    let mount = cgroup::mount_point().ok_or(Error::Capture(CaptureError::NoCgroup2))?;
    let mut roots: Vec<PathBuf> =
        opts.roots.iter().map(|r| cgroup::resolve(r).map_err(Error::from)).collect::<Result<_, _>>()?;
    if opts.kubernetes {
        let pods = kube::pod_roots(&mount)
            .ok_or_else(|| Error::Capture(CaptureError::NoKubepods { mount: mount.clone() }))?;
        eprintln!("stall daemon: Kubernetes pods under the {} cgroup driver", pods.driver);
        roots.extend(pods.roots.into_iter().filter(|r| !roots.contains(r)).collect::<Vec<_>>());
    }
    let mut gpus =
        GpuFleet::open(opts.gpu.as_ref(), opts.nvml_lib.as_deref(), monotonic_ns()).map_err(Error::from)?;
    if opts.require_gpu && !gpus.sampling() {
        let reason = gpus.note.clone().unwrap_or_else(|| "--gpu off".into());
        return Err(Error::RequireGpu(reason).into());
    }
    // Tiers need GPU data to tell when to look; without it, full capture.
    let tiers = opts.tiers.filter(|_| gpus.sampling());
    // The cheap tier reads the threads' counters from /proc, not from the
    // scheduler hooks, where the kernel keeps them (CONFIG_SCHED_INFO).
    let own = std::process::id();
    let sched_on_demand = tiers.is_some() && procfs::thread_schedstat(own, own).is_some();
    let capture = Capture::load(&CaptureOptions {
        cgroup_mode: true,
        syscall_hooks_on_demand: tiers.is_some(),
        sched_hooks_on_demand: sched_on_demand,
        syscall_hooks: opts.syscall_hooks,
        ..Default::default()
    })
    .map_err(Error::from)?;
    let mut live = LiveHost::new(capture);
    eprintln!("stall daemon: {}", live.capture.syscall_backend_line());
    let scheme = if web.as_ref().is_some_and(|w| w.tls.is_some()) { "https" } else { "http" };
    for warning in web.iter().flat_map(|w| &w.warnings) {
        eprintln!("stall daemon: {warning}");
    }
    match &web {
        None if opts.expose_details => eprintln!(
            "stall daemon: --expose-details without --web-config: file paths, command lines and Python stacks go to whoever reaches {}",
            opts.listen
        ),
        Some(w) if opts.expose_details && !w.needs_password() && !w.clients_verified => eprintln!(
            "stall daemon: --expose-details serves authenticated clients only, and the web config authenticates none (no basic_auth_users, no required client certificates): no details are served"
        ),
        _ => {}
    }
    let node_name = opts.node_name.clone().unwrap_or_else(procfs::hostname);
    let (shared, captures) = http::serve(
        opts.listen,
        HttpOptions {
            web,
            expose_details: opts.expose_details,
            fresh: opts.interval * 3 + Duration::from_secs(10),
            node: node_name,
            limits: ConnectionLimits {
                max_connections: opts.http_max_connections,
                idle_timeout: opts.http_idle_timeout,
                ..ConnectionLimits::default()
            },
        },
    )?;
    if let Some(note) = &gpus.note {
        eprintln!("stall: {note}");
    }
    eprintln!(
        "stall daemon: watching {} on {} (metrics at {scheme}://{}/metrics)",
        roots.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(", "),
        mount.display(),
        opts.listen
    );

    let mut names = Identities::new(
        opts.kubernetes || opts.runtime_endpoint.is_some(),
        opts.runtime_endpoint.clone(),
        &opts.pod_labels,
    );
    names.connect().await;
    let mut node = Node::new(roots, mount, opts.all_jobs, opts.device_holders);
    let mut seen = Seen::default();
    look(&mut node, &mut names, &mut live, &gpus, &shared.metrics).await;
    feed.start();
    loop {
        match feed.next(&mut live.capture).await? {
            Wake::Events => node.route(&mut live, &mut feed.events),
            Wake::Tick => {
                look(&mut node, &mut names, &mut live, &gpus, &shared.metrics).await;
                // Everything in the ring before the cut, a batch at a time.
                while live.capture.drain_events(&mut feed.events) {
                    node.route(&mut live, &mut feed.events);
                }
                node.route(&mut live, &mut feed.events);
                if !live.capture.sched_hooks() {
                    live.capture.sample_sched();
                }
                let snap = live.capture.snapshot();
                for w in gpus.poll() {
                    eprintln!("stall: {w}");
                }
                let lost = ondemand::ring_lost(&snap.lost);
                while let Ok(req) = captures.try_recv() {
                    node.demand(req, &mut live, snap.ts, lost);
                }
                let hooks = live.capture.syscall_hooks();
                for w in node.jobs.values_mut() {
                    step::step(w, &mut live, &snap, &gpus, &shared.metrics, tiers.as_ref(), hooks);
                }
                node.step_capture(&mut live, &gpus, snap.ts, lost);
                log_changes(&mut node, opts.expose_details);
                if tiers.is_some() {
                    let want = node.jobs.values().any(|w| w.tier.tier.is_full());
                    node::set_hooks(&mut live, &mut node, want, snap.ts, sched_on_demand);
                }
                shared.metrics.set_hooks(live.capture.syscall_hooks(), live.capture.sched_hooks());
                export_node(&shared.metrics, &snap, &gpus, &mut seen, opts.interval, node.jobs.len());
                publish(&shared, &node);
            }
            Wake::Signal(_) => break,
        }
    }
    eprintln!("stall daemon: detaching");
    drop(live);
    Ok(())
}

/// One look at the node: the cgroups under the roots, read once; the pods
/// among them the container runtime should name (asked only where there is
/// one); then the jobs that came and went.
async fn look(
    node: &mut Node,
    names: &mut Identities,
    live: &mut LiveHost,
    gpus: &GpuFleet,
    metrics: &Metrics,
) {
    let candidates = node.candidates();
    names.learn(&node.pods_to_name(&candidates)).await;
    node.discover(candidates, live, gpus, metrics, names);
}

/// Each job's published verdict into its history; a change is logged as
/// one JSON line on stderr.
fn log_changes(node: &mut Node, details: bool) {
    let now = clock::unix_now_s();
    for w in node.jobs.values_mut() {
        let Some(v) = &w.published else { continue };
        let Some(change) = w.history.note(now, v).cloned() else { continue };
        let mut line = serde_json::json!({
            "msg": "verdict changed",
            "time": change.time,
            "job": w.id,
            "cgroup": w.labels.cgroup,
            "namespace": w.labels.namespace,
            "pod": w.labels.pod,
            "container": w.labels.container,
            "kind": change.kind,
            "verdict": {"line": change.line, "evidence": change.evidence},
        });
        if let Some(previous) = w.history.previous() {
            line["previous"] = serde_json::json!(previous);
        }
        if !details {
            jobs::redact(&mut line);
        }
        eprintln!("{line}");
    }
}

/// What `/jobs` serves until the next interval; the loop is alive.
fn publish(shared: &Shared, node: &Node) {
    let views = node.views();
    let board = Board {
        time: clock::unix_now_s(),
        jobs: views
            .iter()
            .zip(node.jobs.values())
            .map(|(view, w)| BoardJob {
                id: view.id.clone(),
                doc: jobs::job(view),
                history: serde_json::to_value(w.history.changes().collect::<Vec<_>>()).unwrap_or_default(),
            })
            .collect(),
    };
    shared.publish(board);
    shared.beat();
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
    let cpu = procfs::self_cpu_seconds();
    m.agent_cpu.inc_by((cpu - seen.cpu_s).max(0.0));
    seen.cpu_s = cpu;
    m.agent_rss.set(procfs::self_rss_bytes() as i64);
    m.agent_jobs.set(jobs as i64);
    m.nvml_up.set(i64::from(gpus.sampling()));
}

/// Raises the soft limit on open files to the hard one, as a service
/// manager's soft default (1,024 under systemd) leaves little beside 512
/// connections and the capture's own descriptors: `--http-max-connections`
/// decides. The daemon starts no process to inherit it. (soft before, now).
fn raise_file_limit() -> std::io::Result<(u64, u64)> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    Ok((soft, getrlimit(Resource::RLIMIT_NOFILE)?.0))
}

#[cfg(test)]
mod tests {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};

    #[test]
    fn the_soft_file_limit_is_raised_to_the_hard_one() {
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        // One below the hard limit: raised from, and no less room for the
        // tests beside this one than they had.
        let lowered = soft.min(hard - 1);
        setrlimit(Resource::RLIMIT_NOFILE, lowered, hard).unwrap();
        let raised = super::raise_file_limit().unwrap();
        let now = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        setrlimit(Resource::RLIMIT_NOFILE, soft, hard).unwrap();
        assert_eq!(raised, (lowered, hard));
        assert_eq!(now, (hard, hard));
    }
}
