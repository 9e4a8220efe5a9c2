//! `stall daemon`: every job on the node, continuously. A job is a cgroup v2
//! directly under a `--cgroup-root`; one set of BPF programs serves them all
//! (cgroup mode, a job id per cgroup). Each interval: new jobs are attached,
//! gone ones detached, each job's window aggregated, judged and exported to
//! Prometheus. Memory follows the live jobs: ended threads, files and jobs
//! are pruned once counted. HTTP is served on a thread of its own.
pub mod cri;
mod file_limit;
mod history;
pub mod http;
mod identity;
mod kube;
pub mod metrics;
mod node;
mod ondemand;
mod publish;
mod step;
pub mod tier;
pub mod web_config;

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::Result;

use self::{
    http::{ConnectionLimits, HttpOptions},
    identity::Identities,
    metrics::Metrics,
    node::Node,
    web_config::WebConfig,
};
use crate::{
    capture::{cgroup, procfs, Capture, CaptureError, CaptureOptions, SyscallHooks},
    clock::monotonic_ns,
    error::Error,
    gpu::GpuSelect,
    job::{Feed, GpuFleet, LiveHost, Wake},
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
    pub health_listen: Option<SocketAddr>,
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

pub async fn run(opts: Options) -> Result<()> {
    if let Err(e) = file_limit::raise() {
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
    // The cheap tier, and a node with no job watched, read the threads'
    // counters from /proc, not from the scheduler hooks, where the kernel
    // keeps them (CONFIG_SCHED_INFO): nothing runs at every context switch
    // or syscall of the node for nobody.
    let own = std::process::id();
    let sched_on_demand = procfs::thread_schedstat(own, own).is_some();
    let capture = Capture::load(&CaptureOptions {
        cgroup_mode: true,
        syscall_hooks_on_demand: true,
        sched_hooks_on_demand: sched_on_demand,
        syscall_hooks: opts.syscall_hooks,
        // With the full capture only, where tiers run.
        gpu_probes: true,
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
            health: opts.health_listen,
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
    let mut seen = publish::Seen::default();
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
                publish::log_changes(&mut node, opts.expose_details);
                // With tiers, while a job is escalated; without (no GPU
                // data), while any job is watched.
                let want = match tiers {
                    Some(_) => node.jobs.values().any(|w| w.tier.tier.is_full()),
                    None => !node.jobs.is_empty(),
                };
                node::set_hooks(&mut live, &mut node, want, snap.ts, sched_on_demand);
                shared.metrics.set_hooks(live.capture.syscall_hooks(), live.capture.sched_hooks());
                publish::export_node(
                    &shared.metrics,
                    &snap,
                    &gpus,
                    &mut seen,
                    opts.interval,
                    node.jobs.len(),
                );
                publish::board(&shared, &node);
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
