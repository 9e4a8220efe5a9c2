//! One tracing session (`stall run`, `stall attach`): capture → aggregate →
//! correlate → verdict → outputs, every interval and once at the end.
pub mod gate;
pub(crate) mod gpu;

use std::{
    collections::{HashSet, VecDeque},
    ffi::OsString,
    io::{IsTerminal, Write},
    path::PathBuf,
    time::Duration,
};

use anyhow::{Context, Result};
use stall_common::fd_kind;
use tokio::signal::unix::{signal, SignalKind};

use crate::{
    aggregate::{push_recent, Model, Window},
    capture::{cgroup, monotonic_ns, procfs, Capture, CaptureOptions},
    correlate,
    decode::{Event, JobEvent, Snapshot},
    gpu::{self as nvml, GpuSelect},
    output::{self, View},
    verdict::{self, GpuWindow, Verdict},
};

use self::{gate::Gate, gpu::GpuTrack};

pub enum Target {
    Run(Vec<OsString>),
    Pid(u32),
    Cgroup(PathBuf),
}

/// How the GPU side was asked for: `None` = use NVML if it is there.
#[derive(Debug, Clone)]
pub struct Options {
    pub interval: Duration,
    pub duration: Option<Duration>,
    pub json: Option<PathBuf>,
    pub quiet: bool,
    pub gpu: Option<GpuSelect>,
    /// NVML library to load instead of the default.
    pub nvml_lib: Option<PathBuf>,
    pub ringbuf_bytes: Option<u32>,
    pub floor: bool,
    pub latency_sample: u32,
}

/// How the session ended.
pub struct Outcome {
    /// `stall run`: the command's exit status, shell-style.
    pub child_status: Option<i32>,
    pub verdict: Verdict,
}

/// Errors that carry their own exit code up to `main`.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Capture(#[from] crate::capture::CaptureError),
    #[error("{0}")]
    Gpu(#[from] nvml::GpuError),
    #[error("{0}")]
    Spawn(String),
}

struct Sinks {
    json: Option<Box<dyn Write>>,
    /// Human output: stdout, or stderr when JSON goes to stdout.
    human: Box<dyn Write>,
    live_tty: bool,
    quiet: bool,
}

impl Sinks {
    fn open(opts: &Options) -> Result<Self> {
        let json_stdout = opts.json.as_deref().is_some_and(|p| p.as_os_str() == "-");
        let json: Option<Box<dyn Write>> = match &opts.json {
            None => None,
            Some(_) if json_stdout => Some(Box::new(std::io::stdout())),
            Some(p) => Some(Box::new(std::io::BufWriter::new(
                std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
            ))),
        };
        let (human, tty): (Box<dyn Write>, bool) = if json_stdout {
            (Box::new(std::io::stderr()), std::io::stderr().is_terminal())
        } else {
            (Box::new(std::io::stdout()), std::io::stdout().is_terminal())
        };
        Ok(Self { json, human, live_tty: tty && !opts.quiet, quiet: opts.quiet })
    }
}

pub async fn run(target: Target, opts: Options) -> Result<Outcome> {
    // First: a signal during start-up must still end in a clean exit.
    let mut sigint = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut capture = Capture::load(&CaptureOptions {
        ringbuf_bytes: opts.ringbuf_bytes,
        floor: opts.floor,
        cgroup_mode: matches!(target, Target::Cgroup(_)),
        latency_sample: opts.latency_sample,
    })
    .map_err(SessionError::from)?;

    let mut gpu = open_gpu(&opts)?;
    let gpu_note = match &gpu {
        Ok(_) => None,
        Err(e) => Some(e.clone()),
    };
    if let Some(note) = &gpu_note {
        eprintln!("stall: {note}");
    }
    let mut sinks = Sinks::open(&opts)?;

    let mut model = Model::new(monotonic_ns());
    let mut pending: Vec<JobEvent> = Vec::new();
    let mut gate: Option<Gate> = None;
    let (root, label, cgroup_dir) = match &target {
        Target::Run(cmd) => {
            let mut g = Gate::spawn(cmd)
                .map_err(|e| SessionError::Spawn(format!("cannot start stall's exec gate: {e}")))?;
            pending.extend(capture.track_tree(g.pid, 1).map_err(SessionError::from)?);
            g.release().context("releasing the command")?;
            let pid = g.pid;
            gate = Some(g);
            let shown: Vec<String> = cmd.iter().map(|a| a.to_string_lossy().into_owned()).collect();
            (Some(pid), shown.join(" "), None)
        }
        Target::Pid(pid) => {
            pending.extend(capture.track_tree(*pid, 1).map_err(SessionError::from)?);
            (Some(*pid), format!("pid {pid}"), None)
        }
        Target::Cgroup(path) => {
            let dir = cgroup::resolve(path).map_err(SessionError::from)?;
            pending.extend(capture.watch_cgroup(&dir, 1).map_err(SessionError::from)?);
            (None, format!("cgroup {}", dir.display()), Some(dir))
        }
    };
    // The first snapshot names every process found at attach.
    for t in capture.snapshot().threads {
        note_process(&mut model, t.tgid);
    }

    let mut state = Loop {
        model,
        gpus: Vec::new(),
        recent: VecDeque::new(),
        root,
        label,
        gpu_note: gpu_note.as_ref().map(|e| e.to_string()),
        last_events: 0,
    };
    state.process(&mut capture, &mut pending);

    let mut tick = tokio::time::interval(opts.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let deadline = opts.duration.map(|d| tokio::time::Instant::now() + d);
    let sleep_until = async move {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(sleep_until);
    let mut child_status = None;
    let mut events = Vec::new();

    let mut drain = tokio::time::interval(crate::capture::DRAIN_EVERY);
    drain.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            r = capture.next_events(&mut events) => {
                r.context("reading the ring buffer")?;
                state.process(&mut capture, &mut events);
            }
            _ = drain.tick() => {
                capture.drain_events(&mut events);
                state.process(&mut capture, &mut events);
            }
            _ = tick.tick() => {
                let view = state.interval(&mut capture, gpu.as_mut().ok().and_then(|g| g.as_mut()));
                emit_interval(&mut sinks, &view, &state)?;
                if let Some(dir) = &cgroup_dir {
                    if !dir.exists() {
                        break;
                    }
                    pending.extend(capture.watch_cgroup(dir, 1).unwrap_or_default());
                    state.process(&mut capture, &mut pending);
                } else if gate.is_none() && state.root_gone() {
                    break;
                }
            }
            status = async { gate.as_mut().unwrap().child.wait().await }, if gate.is_some() => {
                child_status = Some(shell_status(status.context("waiting for the command")?));
                break;
            }
            _ = &mut sleep_until => break,
            _ = sigint.recv() => {
                // `stall run`: the command got the same Ctrl-C; report when it is done.
                if gate.is_none() { break; }
            }
            _ = sigterm.recv() => {
                if let Some(g) = &gate {
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(g.pid as i32), nix::sys::signal::Signal::SIGTERM);
                } else {
                    break;
                }
            }
        }
    }

    // Let the last exits and closes arrive, then read everything once more.
    tokio::time::sleep(Duration::from_millis(50)).await;
    capture.drain_events(&mut events);
    state.process(&mut capture, &mut events);
    let _ = state.interval(&mut capture, gpu.as_mut().ok().and_then(|g| g.as_mut()));
    let end = state.model.last_ns.max(monotonic_ns());
    let summary = state.model.summary(end);
    let gpus: Vec<GpuWindow> = state.gpus.iter().map(|g| g.summary(end)).collect();
    let roles = state.roles(&summary);
    let recent = Window::merge(state.recent.make_contiguous());
    let recent_gpus: Vec<GpuWindow> =
        state.gpus.iter().map(|g| g.window(recent.start_ns, recent.end_ns)).collect();
    // A job that ends hung is hung, whatever it did before.
    let recent_verdict = verdict::judge(&recent, &roles, &recent_gpus);
    let verdict = if recent_verdict.kind == verdict::Kind::Hang {
        recent_verdict
    } else {
        verdict::judge(&summary, &roles, &gpus)
    };
    let view = View {
        window: &summary,
        roles: &roles,
        gpus: &gpus,
        verdict: &verdict,
        elapsed_s: summary.secs(),
        target: &state.label,
        gpu_note: state.gpu_note.as_deref(),
    };
    if let Some(j) = &mut sinks.json {
        writeln!(j, "{}", output::json::line("summary", &view))?;
        j.flush()?;
    }
    if sinks.live_tty {
        // Leave the live screen behind with the report under it.
        writeln!(sinks.human)?;
    }
    write!(sinks.human, "{}", output::report::render(&view))?;
    sinks.human.flush()?;
    Ok(Outcome { child_status, verdict })
}

fn open_gpu(opts: &Options) -> Result<Result<Option<Box<dyn nvml::GpuSource>>, nvml::GpuError>> {
    let lib = nvml::library(opts.nvml_lib.as_deref());
    match &opts.gpu {
        Some(GpuSelect::Off) => Ok(Ok(None)),
        // Asked for explicitly: missing NVML is an error.
        Some(sel @ GpuSelect::Indices(_)) => {
            Ok(Ok(nvml::open_with_library(sel, lib).map_err(SessionError::from)?))
        }
        Some(sel) => Ok(nvml::open_with_library(sel, lib)),
        None => Ok(nvml::open_with_library(&GpuSelect::All, lib)),
    }
}

/// Takes one map snapshot into a job's model: counters, current names, and
/// the kernel entries of what ended freed (keeps the maps bounded), with the
/// last counts of the descriptors exit closed.
pub(crate) fn absorb(capture: &mut Capture, model: &mut Model, snap: &Snapshot) {
    model.apply_snapshot(snap);
    for t in &snap.threads {
        note_process(model, t.tgid);
    }
    model.refresh_names(procfs::thread_comm);
    let (tgids, tids) = model.dead();
    if tgids.is_empty() && tids.is_empty() {
        return;
    }
    let last = capture.retire(&tgids, &tids);
    model.apply_files(&last);
    model.end_files_of(&tgids, snap.ts);
    model.mark_retired(&tgids, &tids);
}

/// Applies one event to `model`, adding what only /proc can tell: what an
/// opened descriptor is, the new process's name and the files it inherited
/// (those go to `extra`, to be applied after the batch).
pub(crate) fn observe(
    capture: &mut Capture,
    model: &mut Model,
    job: u32,
    ev: &Event,
    extra: &mut Vec<JobEvent>,
) {
    model.apply(ev);
    match ev {
        Event::Open { tgid, fd, file_id, path, .. } => {
            if let Some((target, regular)) = capture.classify_open(*tgid, *fd, path) {
                if regular {
                    // The kernel counts UNKNOWN as a file already; no map
                    // write, so no read-modify-write race with its counters.
                    model.set_file_kind(*file_id, fd_kind::REGULAR);
                    if !path.starts_with('/') {
                        model.set_file_resolved(*file_id, &target);
                    }
                } else {
                    capture.set_fd_kind(*tgid, *fd, *file_id, fd_kind::OTHER);
                    model.set_file_kind(*file_id, fd_kind::OTHER);
                }
            }
        }
        Event::NewTask { parent_tgid, child_tid, child_tgid, .. } if child_tid == child_tgid => {
            note_process(model, *child_tgid);
            // Inherited descriptors only matter if the parent had files open
            // (a fork storm of processes without any costs no /proc walk).
            if model.files.values().any(|f| f.tgid == *parent_tgid && f.open) {
                extra.extend(capture.seed_fds(*child_tgid, job));
            }
        }
        Event::Exec { tgid, .. } => {
            if let Some(c) = procfs::cmdline(*tgid) {
                model.note_process(*tgid, None, "", Some(c));
            }
        }
        _ => {}
    }
}

fn shell_status(s: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))
}

pub(crate) fn note_process(model: &mut Model, tgid: u32) {
    if model.procs.get(&tgid).is_some_and(|p| p.cmdline.is_some()) {
        return;
    }
    let st = procfs::stat(tgid);
    model.note_process(
        tgid,
        st.as_ref().map(|s| s.ppid),
        st.as_ref().map(|s| s.comm.as_str()).unwrap_or(""),
        procfs::cmdline(tgid),
    );
}

fn emit_interval(sinks: &mut Sinks, view: &IntervalView, state: &Loop) -> Result<()> {
    let v = View {
        window: &view.window,
        roles: &view.roles,
        gpus: &view.gpus,
        verdict: &view.verdict,
        elapsed_s: view.elapsed_s,
        target: &state.label,
        gpu_note: state.gpu_note.as_deref(),
    };
    if let Some(j) = &mut sinks.json {
        writeln!(j, "{}", output::json::line("interval", &v))?;
        j.flush()?;
    }
    if sinks.quiet {
        return Ok(());
    }
    if sinks.live_tty {
        let (rows, cols) = terminal_size();
        write!(sinks.human, "{}", output::live::screen(&v, view.events_per_s, rows, cols))?;
    } else {
        writeln!(sinks.human, "{}", output::live::plain(&v))?;
    }
    sinks.human.flush()?;
    Ok(())
}

/// (rows, columns) of the terminal the live view draws on.
fn terminal_size() -> (usize, usize) {
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    for fd in [libc::STDOUT_FILENO, libc::STDERR_FILENO] {
        // SAFETY: TIOCGWINSZ fills a winsize.
        if unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) } == 0 && ws.ws_row > 0 && ws.ws_col > 0 {
            return (usize::from(ws.ws_row), usize::from(ws.ws_col));
        }
    }
    (40, 120)
}

struct IntervalView {
    window: Window,
    roles: correlate::Roles,
    gpus: Vec<GpuWindow>,
    verdict: Verdict,
    elapsed_s: f64,
    events_per_s: f64,
}

struct Loop {
    model: Model,
    gpus: Vec<GpuTrack>,
    recent: VecDeque<Window>,
    root: Option<u32>,
    label: String,
    gpu_note: Option<String>,
    last_events: u64,
}

impl Loop {
    /// Applies decoded events, looking at what only /proc can tell: what an
    /// opened descriptor is, and what a new process inherited.
    fn process(&mut self, capture: &mut Capture, events: &mut Vec<JobEvent>) {
        let mut extra = Vec::new();
        for (job, ev) in events.drain(..) {
            observe(capture, &mut self.model, job, &ev, &mut extra);
        }
        for (_, ev) in &extra {
            self.model.apply(ev);
        }
    }

    fn roles(&self, w: &Window) -> correlate::Roles {
        let gpu_pids: HashSet<u32> = self.gpus.iter().flat_map(|g| g.pids.iter().copied()).collect();
        correlate::assign(w, &gpu_pids, self.root)
    }

    fn root_gone(&self) -> bool {
        let Some(root) = self.root else { return false };
        let zombie_or_gone = procfs::stat(root).is_none_or(|s| s.state == 'Z' || s.state == 'X');
        zombie_or_gone || self.model.procs.get(&root).is_some_and(|p| !p.alive)
    }

    fn interval(
        &mut self,
        capture: &mut Capture,
        gpu: Option<&mut Box<dyn nvml::GpuSource>>,
    ) -> IntervalView {
        let mut events = Vec::new();
        capture.drain_events(&mut events);
        self.process(capture, &mut events);
        let snap = capture.snapshot();
        absorb(capture, &mut self.model, &snap);
        if let Some(src) = gpu {
            gpu::poll_into(&mut self.gpus, src.as_mut(), self.model.start_ns);
        }
        let window = self.model.interval(snap.ts);
        let events_per_s = window.events as f64 / window.secs().max(1e-3);
        self.last_events = snap.events;
        push_recent(&mut self.recent, window.clone());

        let summary = self.model.summary(snap.ts);
        let roles = self.roles(&summary);
        let recent = Window::merge(self.recent.make_contiguous());
        let gpus: Vec<GpuWindow> =
            self.gpus.iter().map(|g| g.window(recent.start_ns, recent.end_ns)).collect();
        let verdict = verdict::judge(&recent, &roles, &gpus);
        let elapsed_s = snap.ts.saturating_sub(self.model.start_ns) as f64 / 1e9;
        IntervalView { window: recent, roles, gpus, verdict, elapsed_s, events_per_s }
    }
}
