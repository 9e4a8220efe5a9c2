//! Why is the GPU idle? One verdict with numbers, from a window of the job
//! (roles assigned) and what the GPUs did meanwhile. Pure; see
//! docs/VERDICTS.md for the kinds and their rules.
use serde::Serialize;
use stall_common::reason;

use crate::{
    aggregate::{is_code_file, storage_share, PageCache, ProcWindow, ThreadWindow, Waker, Window},
    capture::syscalls,
    correlate::Roles,
    progress::ProgressView,
    pystack::PyStack,
    units,
};

mod hang;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    InputIoBound,
    InputCpuBound,
    Hang,
    TrainerHostBound,
    GpuBusy,
    Idle,
    #[default]
    Unknown,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::InputIoBound => "input-io-bound",
            Kind::InputCpuBound => "input-cpu-bound",
            Kind::Hang => "hang",
            Kind::TrainerHostBound => "trainer-host-bound",
            Kind::GpuBusy => "gpu-busy",
            Kind::Idle => "idle",
            Kind::Unknown => "unknown",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct Verdict {
    pub kind: Kind,
    pub summary: String,
    pub evidence: Vec<String>,
    /// No GPU data: the verdict is about the host side only.
    pub host_only: bool,
    /// The threads the verdict names (whose Python stacks are worth reading).
    #[serde(skip)]
    pub blamed: Vec<Blamed>,
    /// Python stacks of the blamed threads, when read (see `pystack`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub python_stacks: Vec<PyStack>,
    /// Why some blamed processes' stacks could not be read, one line each.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub python_notes: Vec<String>,
}

/// A thread a verdict names, and as what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blamed {
    pub pid: u32,
    pub tid: u32,
    pub what: &'static str,
}

/// A GPU over the window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuWindow {
    pub index: u32,
    pub name: String,
    pub util_mean_pct: f64,
    /// Share of samples at or below `IDLE_UTIL_PCT`.
    pub idle_fraction: f64,
    pub samples: usize,
    /// The longest stretch without a sample, seconds (driver gaps).
    pub max_gap_s: f64,
    /// Mean board power draw, and the enforced limit, watts (when the
    /// device says): utilization counts time with a kernel resident, power
    /// tells computing from spinning.
    pub power_w: Option<f64>,
    pub power_limit_w: Option<f64>,
    /// Mean SM utilization of the processes on the device, summed over
    /// them (when per-process accounting works).
    pub sm_util_pct: Option<f64>,
}

/// Thresholds, in one place so docs and tests can name them.
pub mod rules {
    /// A GPU sample at or below this utilization counts as idle.
    pub const IDLE_UTIL_PCT: f64 = 5.0;
    /// Mean utilization at or above this: the GPU is doing its job.
    pub const GPU_BUSY_PCT: f64 = 60.0;
    /// Below this the window says too little.
    pub const MIN_WINDOW_S: f64 = 0.5;
    /// Trainer waiting (futex + poll + its own file I/O) at least this share.
    pub const TRAINER_WAITS: f64 = 0.5;
    /// Workers' I/O or CPU share that names the bottleneck.
    pub const WORKER_SHARE: f64 = 0.3;
    /// Trainer on CPU at least this share: host-bound.
    pub const TRAINER_BUSY: f64 = 0.5;
    /// Hang: the trainer and its workers show no progress for this long.
    pub const HANG_MIN_S: f64 = 4.0;
    /// Hang: at most this on-CPU share for each of them.
    pub const HANG_MAX_ON_CPU: f64 = 0.05;
    /// Hang: pipe/socket bytes below this are status checks, not batches.
    pub const HANG_MAX_IPC_BYTES_PER_S: f64 = 16_384.0;
    /// Idle: the whole job uses less than this share of one CPU.
    pub const IDLE_MAX_CPU: f64 = 0.05;
    /// Hang behind a busy GPU: silent for this many times the job's own
    /// rhythm (its longest gap between reads and writes while it ran)...
    pub const SILENT_RHYTHMS: f64 = 3.0;
    /// ...and for at least this long.
    pub const SILENT_MIN_S: f64 = 10.0;
    /// ...or, for a job never seen to move and with no output open at
    /// attach (no rhythm to go by), this long.
    pub const SILENT_UNKNOWN_S: f64 = 60.0;
    /// A GPU drawing at least this share of its power limit is computing,
    /// however long the job is silent (a long step, an evaluation).
    pub const GPU_WORKING_POWER: f64 = 0.5;
    /// A busy GPU below this share of its power limit has a kernel resident
    /// but barely computes (a spinning collective, a wedged kernel).
    pub const GPU_LOW_POWER: f64 = 0.25;
}

/// Shares of a thread's window by state (each of on-CPU and the reasons).
#[derive(Debug, Clone, Copy, Default)]
struct Shares {
    on: f64,
    off: [f64; reason::COUNT],
}

impl Shares {
    /// Shares of the thread's own time in the window: a worker that lived
    /// one epoch of three is judged on that epoch (non-persistent
    /// DataLoader workers), not diluted by the time before it existed.
    fn of(t: &ThreadWindow, secs: f64) -> Self {
        let window = secs.max(1e-9) * 1e9;
        let accounted = (t.delta.on_cpu_ns + t.delta.off_cpu_ns()) as f64;
        let wall = if accounted > 0.0 { accounted.min(window) } else { window };
        let mut off = [0.0; reason::COUNT];
        for (i, v) in off.iter_mut().enumerate() {
            *v = t.delta.off_ns[i] as f64 / wall;
        }
        Self { on: t.delta.on_cpu_ns as f64 / wall, off }
    }
    fn r(&self, r: u8) -> f64 {
        self.off[usize::from(r)]
    }
    fn blocked(&self) -> f64 {
        self.off.iter().sum::<f64>() - self.r(reason::RUNQUEUE)
    }
    fn cpu(&self) -> f64 {
        self.on + self.r(reason::RUNQUEUE)
    }
    /// Where the thread spent most of the window, as "futex 60%".
    fn top_wait(&self) -> (u8, f64) {
        (0..reason::COUNT as u8)
            .filter(|r| *r != reason::RUNQUEUE)
            .map(|r| (r, self.r(r)))
            .fold((reason::OTHER, 0.0), |a, b| if b.1 > a.1 { b } else { a })
    }
}

fn reason_name(r: u8, t: &ThreadWindow) -> String {
    if r == reason::OTHER && t.other_nr >= 0 {
        format!("other ({})", syscalls::name(i64::from(t.other_nr)))
    } else {
        reason::NAMES[usize::from(r).min(reason::COUNT - 1)].to_string()
    }
}

/// `w`: the window judged (the last few seconds live, the whole run at the
/// end); `progress`: when the job last moved, which spans more than `w`.
pub fn judge(w: &Window, roles: &Roles, gpus: &[GpuWindow], progress: &ProgressView) -> Verdict {
    let mut v = judge_kind(w, roles, gpus, progress);
    v.blamed = blamed(w, roles, v.kind);
    v
}

/// The trainer's main thread, the workers the evidence names, and in a
/// hang every blocked thread of them.
fn blamed(w: &Window, roles: &Roles, kind: Kind) -> Vec<Blamed> {
    let Some(trainer) = roles.trainers.iter().find_map(|t| w.proc(*t)) else { return Vec::new() };
    let mut out = Vec::new();
    if let Some(m) = trainer.main_thread() {
        out.push(Blamed { pid: trainer.tgid, tid: m.tid, what: "trainer main thread" });
    }
    let mut workers: Vec<&ProcWindow> = w.procs.iter().filter(|p| roles.workers.contains(&p.tgid)).collect();
    workers.sort_by_key(|p| (std::cmp::Reverse(p.input_bytes()), p.tgid));
    workers.truncate(MAX_WORKER_LINES);
    for p in &workers {
        if let Some(t) = p.main_thread() {
            out.push(Blamed { pid: p.tgid, tid: t.tid, what: "worker" });
        }
    }
    if kind == Kind::Hang {
        for p in std::iter::once(trainer).chain(workers.iter().copied()) {
            for t in p.threads.iter().filter(|t| t.alive && !t.now.running) {
                if !out.iter().any(|b| b.tid == t.tid) {
                    out.push(Blamed { pid: p.tgid, tid: t.tid, what: "blocked thread" });
                }
            }
        }
    }
    out
}

fn judge_kind(w: &Window, roles: &Roles, gpus: &[GpuWindow], progress: &ProgressView) -> Verdict {
    let secs = w.secs();
    let host_only = gpus.is_empty();
    let gpu_line = gpu_prefix(gpus, secs);
    let mut evidence = Vec::new();
    if let Some(g) = &gpu_line {
        evidence.push(g.clone());
    }
    if w.lost_total() > 0 {
        evidence.push(format!("{} events lost: figures are partial", w.lost_total()));
    }
    let done = |kind: Kind, text: String, mut evidence: Vec<String>| {
        let mut summary = match &gpu_line {
            Some(g) => format!("{g}. {text}"),
            None => format!("{text} (no GPU data: host-side verdict)"),
        };
        if w.lost_total() > 0 {
            summary.push_str(" [partial: events were lost]");
        }
        evidence.dedup();
        Verdict { kind, summary, evidence, host_only, ..Default::default() }
    };

    let busy = gpus.iter().find(|g| g.util_mean_pct >= rules::GPU_BUSY_PCT);
    let trainer = roles.trainers.iter().find_map(|t| w.proc(*t)).filter(|_| secs >= rules::MIN_WINDOW_S);
    let main = trainer.and_then(ProcWindow::main_thread);
    let (Some(trainer), Some(main)) = (trainer, main) else {
        if let Some(busy) = busy {
            return done(Kind::GpuBusy, busy_text(busy), evidence);
        }
        let text = if trainer.is_some() {
            "the trainer has no traced thread".into()
        } else {
            format!("not enough data ({} of tracing)", units::secs(secs))
        };
        return done(Kind::Unknown, text, evidence);
    };
    let worker_set: std::collections::HashSet<u32> = roles.workers.iter().copied().collect();
    let workers: Vec<&ProcWindow> = w.procs.iter().filter(|p| worker_set.contains(&p.tgid)).collect();
    let tm = Shares::of(main, secs);
    evidence.push(thread_line("trainer main thread", trainer, main, &tm));
    // The busiest readers first; a handful is evidence, thousands is noise.
    let mut shown: Vec<&&ProcWindow> = workers.iter().collect();
    shown.sort_by_key(|p| (std::cmp::Reverse(p.input_bytes()), p.tgid));
    if shown.len() > MAX_WORKER_LINES {
        evidence.push(format!("{} workers; the {MAX_WORKER_LINES} that read most:", shown.len()));
        shown.truncate(MAX_WORKER_LINES);
    }
    for wp in shown {
        if let Some(t) = wp.main_thread() {
            let s = Shares::of(t, secs);
            evidence.push(format!(
                "{}; read {} at {}",
                thread_line("worker", wp, t, &s),
                units::bytes(wp.input_bytes()),
                units::rate(wp.input_bytes(), secs)
            ));
        }
    }
    let file_bytes: u64 = w.procs.iter().map(ProcWindow::input_bytes).sum();
    evidence.extend(top_files(w, secs));
    if let Some(o) = &progress.last_output {
        evidence.push(format!("output {} (pid {}) last written {} ago", o.path, o.pid, units::span(o.ago_s)));
    }

    if let Some(busy) = busy {
        if let Some(text) = hang::behind_busy_gpu(busy, trainer, main, &tm, progress) {
            return done(Kind::Hang, text, evidence);
        }
        return done(Kind::GpuBusy, busy_text(busy), evidence);
    }
    if let Some(text) = hang::no_progress(w, trainer, main, &tm, &workers, secs, progress) {
        return done(Kind::Hang, text, evidence);
    }

    let waits = tm.r(reason::FUTEX) + tm.r(reason::POLL);
    let own_io = tm.r(reason::IO);
    let (wio, wcpu) = worker_shares(&workers, secs);
    let feeders = wakers_of(main, &workers);
    let reader_bytes: u64 = workers.iter().map(|p| p.input_bytes()).sum();
    if waits + own_io >= rules::TRAINER_WAITS {
        let waiting = format!(
            "Trainer main thread blocked {} of {} ({}){}",
            units::pct(waits + own_io),
            units::secs(secs),
            wait_breakdown(main, &tm),
            feeders
        );
        if !workers.is_empty() && wio >= rules::WORKER_SHARE && wio >= wcpu {
            let text = format!(
                "{waiting}; {} read {} at {}{}, {} off-CPU in file reads: input pipeline is I/O-bound",
                workers_word(workers.len()),
                units::bytes(reader_bytes),
                units::rate(reader_bytes, secs),
                from_storage(&workers, reader_bytes),
                units::pct(wio)
            );
            return done(Kind::InputIoBound, text, evidence);
        }
        if !workers.is_empty() && wcpu >= rules::WORKER_SHARE && wcpu > wio {
            let text = format!(
                "{waiting}; {} on CPU {} of the time (read {} at {}): input pipeline is CPU-bound",
                workers_word(workers.len()),
                units::pct(wcpu),
                units::bytes(reader_bytes),
                units::rate(reader_bytes, secs)
            );
            return done(Kind::InputCpuBound, text, evidence);
        }
        if own_io >= rules::WORKER_SHARE {
            let own = trainer.input_bytes();
            let text = format!(
                "Trainer main thread {} off-CPU in file reads of {} ({} at {}{}), no workers: input is I/O-bound",
                units::pct(own_io),
                units::secs(secs),
                units::bytes(own),
                units::rate(own, secs),
                from_storage(&[trainer], own)
            );
            return done(Kind::InputIoBound, text, evidence);
        }
    }
    if tm.cpu() >= rules::TRAINER_BUSY {
        let text = if host_only {
            format!(
                "Trainer main thread on CPU {} of {}: it is busy on the host (input is not the bottleneck)",
                units::pct(tm.cpu()),
                units::secs(secs)
            )
        } else {
            format!(
                "Trainer main thread on CPU {} of {} while the GPU idles: trainer is host-bound",
                units::pct(tm.cpu()),
                units::secs(secs)
            )
        };
        return done(Kind::TrainerHostBound, text, evidence);
    }
    let job_cpu: f64 = w.procs.iter().map(|p| p.sum().on_cpu_ns as f64).sum::<f64>() / 1e9 / secs;
    if job_cpu < rules::IDLE_MAX_CPU && file_bytes == 0 {
        let (r, share) = tm.top_wait();
        let text = format!(
            "Nothing is happening: the job used {:.1}% of a CPU and read no files in {}; trainer main thread mostly in {} ({})",
            job_cpu * 100.0,
            units::secs(secs),
            reason_name(r, main),
            units::pct(share)
        );
        return done(Kind::Idle, text, evidence);
    }
    let text = format!(
        "No single bottleneck: trainer main thread on CPU {}, blocked {} ({})",
        units::pct(tm.cpu()),
        units::pct(tm.blocked()),
        wait_breakdown(main, &tm)
    );
    done(Kind::Unknown, text, evidence)
}

/// Worker lines in the evidence, at most.
const MAX_WORKER_LINES: usize = 8;

fn gpu_prefix(gpus: &[GpuWindow], secs: f64) -> Option<String> {
    let parts: Vec<String> = gpus
        .iter()
        .map(|g| {
            let gap =
                if g.max_gap_s > 2.0 { format!(", sample gap {:.1}s", g.max_gap_s) } else { String::new() };
            if g.samples == 0 {
                format!("GPU{}: no samples", g.index)
            } else {
                format!(
                    "GPU{} idle {} of {}{}{gap}",
                    g.index,
                    units::pct(g.idle_fraction),
                    units::secs(secs),
                    power_words(g)
                )
            }
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// " at 95 W of 700 W", when the device says.
fn power_words(g: &GpuWindow) -> String {
    match (g.power_w, g.power_limit_w) {
        (Some(p), Some(l)) => format!(" at {p:.0} W of {l:.0} W"),
        (Some(p), None) => format!(" at {p:.0} W"),
        _ => String::new(),
    }
}

/// Power draw as a share of the limit, when both are known.
fn power_share(g: &GpuWindow) -> Option<f64> {
    Some(g.power_w? / g.power_limit_w.filter(|l| *l > 0.0)?)
}

fn busy_text(g: &GpuWindow) -> String {
    let mut text = format!("GPU{} busy {:.0}% on average{}", g.index, g.util_mean_pct, power_words(g));
    match power_share(g) {
        Some(share) if share < rules::GPU_LOW_POWER => text.push_str(&format!(
            " ({} of its power limit: a kernel is resident but barely computing; watch for a hang)",
            units::pct(share)
        )),
        _ => text.push_str(": no input stall"),
    }
    text
}

fn thread_line(label: &str, p: &ProcWindow, t: &ThreadWindow, s: &Shares) -> String {
    format!(
        "{label} {} ({} pid {}): on CPU {}, runqueue {}, blocked {} ({})",
        t.tid,
        p.comm,
        p.tgid,
        units::pct(s.on),
        units::pct(s.r(reason::RUNQUEUE)),
        units::pct(s.blocked()),
        wait_breakdown(t, s)
    )
}

/// "futex 60%, poll 37%": the waits above 5%, largest first.
fn wait_breakdown(t: &ThreadWindow, s: &Shares) -> String {
    let mut parts: Vec<(u8, f64)> = (0..reason::COUNT as u8)
        .filter(|r| *r != reason::RUNQUEUE)
        .map(|r| (r, s.r(r)))
        .filter(|x| x.1 >= 0.05)
        .collect();
    parts.sort_by(|a, b| b.1.total_cmp(&a.1));
    if parts.is_empty() {
        return "no wait above 5%".into();
    }
    parts
        .iter()
        .map(|(r, v)| format!("{} {}", reason_name(*r, t), units::pct(*v)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn workers_word(n: usize) -> String {
    if n == 1 {
        "1 worker".into()
    } else {
        format!("{n} workers")
    }
}

/// I/O and CPU shares of the workers' main threads, averaged.
fn worker_shares(workers: &[&ProcWindow], secs: f64) -> (f64, f64) {
    let shares: Vec<Shares> =
        workers.iter().filter_map(|p| p.main_thread()).map(|t| Shares::of(t, secs)).collect();
    if shares.is_empty() {
        return (0.0, 0.0);
    }
    let n = shares.len() as f64;
    (shares.iter().map(|s| s.r(reason::IO)).sum::<f64>() / n, shares.iter().map(Shares::cpu).sum::<f64>() / n)
}

/// ", woken 1,240 times by 4 workers (most by 84810)".
fn wakers_of(main: &ThreadWindow, workers: &[&ProcWindow]) -> String {
    let from_workers: Vec<&Waker> =
        main.woken_by.iter().filter(|b| workers.iter().any(|w| w.tgid == b.tgid)).collect();
    let n: u64 = from_workers.iter().map(|b| b.count).sum();
    if n == 0 {
        return String::new();
    }
    let procs: std::collections::HashSet<u32> = from_workers.iter().map(|b| b.tgid).collect();
    // Count per worker process (its queue feeder threads do the waking).
    let mut per_proc: Vec<(u32, u64)> = procs.iter().map(|p| (*p, 0)).collect();
    for b in &from_workers {
        if let Some(e) = per_proc.iter_mut().find(|e| e.0 == b.tgid) {
            e.1 += b.count;
        }
    }
    per_proc.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let (top_pid, top_n) = per_proc[0];
    format!(", woken {n} times by {} (most by pid {top_pid} ×{top_n})", workers_word(procs.len()))
}

/// " (98 % from storage, page cache cold)": how much of what `procs` took
/// in (`bytes`) the page cache had to bring from storage; empty where the
/// kernel does not show it.
fn from_storage(procs: &[&ProcWindow], bytes: u64) -> String {
    let known: Vec<u64> = procs.iter().filter_map(|p| p.storage_bytes).collect();
    if known.is_empty() || bytes == 0 {
        return String::new();
    }
    let share = storage_share(known.iter().sum(), bytes);
    let cache = match PageCache::of(share) {
        Some(PageCache::Cold) => ", page cache cold",
        Some(PageCache::Warm) => ", from the page cache",
        None => "",
    };
    format!(" ({:.0} % from storage{cache})", share * 100.0)
}

fn top_files(w: &Window, secs: f64) -> Vec<String> {
    w.files_by_bytes()
        .iter()
        .filter(|(_, f)| !is_code_file(f.resolved.as_deref().unwrap_or(&f.path)))
        .take(5)
        .map(|(pid, f)| {
            let source = f.source().map(|s| format!(", {s}")).unwrap_or_default();
            format!(
                "file {}: {} {} by pid {pid} ({} while open{source})",
                f.path,
                units::bytes(f.bytes_in()),
                f.taken_by(),
                units::rate(f.bytes_in(), f.rate_secs(secs))
            )
        })
        .collect()
}

/// GPU utilization samples over a window → [`GpuWindow`].
pub fn gpu_window(index: u32, name: &str, samples: &[(u64, f64)], start_ns: u64, end_ns: u64) -> GpuWindow {
    let inside: Vec<&(u64, f64)> = samples.iter().filter(|(t, _)| *t >= start_ns && *t <= end_ns).collect();
    let n = inside.len();
    let mean = if n == 0 { 0.0 } else { inside.iter().map(|s| s.1).sum::<f64>() / n as f64 };
    let idle = if n == 0 {
        0.0
    } else {
        inside.iter().filter(|s| s.1 <= rules::IDLE_UTIL_PCT).count() as f64 / n as f64
    };
    let mut edges: Vec<u64> = vec![start_ns];
    edges.extend(inside.iter().map(|s| s.0));
    edges.push(end_ns);
    let max_gap = edges.windows(2).map(|p| p[1].saturating_sub(p[0])).max().unwrap_or(0) as f64 / 1e9;
    GpuWindow {
        index,
        name: name.to_string(),
        util_mean_pct: mean,
        idle_fraction: idle,
        samples: n,
        max_gap_s: max_gap,
        power_w: None,
        power_limit_w: None,
        sm_util_pct: None,
    }
}

#[cfg(test)]
mod tests;
