//! One tracing session (`stall run`, `stall attach`): capture → aggregate →
//! correlate → verdict → outputs, every interval and once at the end.
pub mod gate;

use std::{
    ffi::OsString,
    io::{IsTerminal, Write},
    path::PathBuf,
    time::Duration,
};

use anyhow::{Context, Result};

use self::gate::Gate;
use crate::{
    capture::{cgroup, Capture, CaptureOptions, SyscallHooks},
    clock::monotonic_ns,
    error::Error,
    gpu::GpuSelect,
    job::{Feed, GpuFleet, GpuScope, Job, LiveHost, Stacks, Tick, Wake},
    output::{self, Ending, View},
    timeline::Recording,
    verdict::Verdict,
};

pub enum Target {
    /// `stall run`: the command; `stop`: stop it when `--duration` is up.
    Run {
        cmd: Vec<OsString>,
        stop: bool,
    },
    Pid(u32),
    Cgroup(PathBuf),
}

/// `gpu`: `None` = use NVML if it is there.
#[derive(Debug, Clone)]
pub struct Options {
    pub interval: Duration,
    pub duration: Option<Duration>,
    pub json: Option<PathBuf>,
    pub quiet: bool,
    pub gpu: Option<GpuSelect>,
    /// NVML library to load instead of the driver's on the loader path.
    pub nvml_lib: Option<PathBuf>,
    pub ringbuf_bytes: Option<u32>,
    pub floor: bool,
    pub latency_sample: u32,
    /// Read Python stacks this often whatever the verdict (bench).
    pub python_stacks_every: Option<Duration>,
    /// Chrome trace and SVG of the timeline.
    pub timeline: Option<PathBuf>,
    pub timeline_svg: Option<PathBuf>,
    pub syscall_hooks: SyscallHooks,
}

/// How the session ended.
pub struct Outcome {
    /// `stall run`: the command's exit status, shell-style.
    pub child_status: Option<i32>,
    pub verdict: Verdict,
}

struct Sinks {
    json: Option<Box<dyn Write>>,
    /// The --json path (None: none, or stdout).
    json_file: Option<PathBuf>,
    /// This run created it (it did not exist before).
    json_created: bool,
    /// Human output: stdout, or stderr when JSON goes to stdout.
    human: Box<dyn Write>,
    live_tty: bool,
    quiet: bool,
}

/// Standard output or error, where a reader that went away (`stall run ...
/// | head`) ends the output, not the run: the job is traced to its end and
/// stall exits with its status, as a pipeline expects.
struct UntilClosed<W: Write> {
    out: W,
    closed: bool,
}

impl<W: Write> UntilClosed<W> {
    fn new(out: W) -> Self {
        Self { out, closed: false }
    }

    fn check(&mut self, r: std::io::Result<usize>, len: usize) -> std::io::Result<usize> {
        match r {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(len)
            }
            r => r,
        }
    }
}

impl<W: Write> Write for UntilClosed<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.closed {
            return Ok(buf.len());
        }
        let r = self.out.write(buf);
        self.check(r, buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.closed {
            return Ok(());
        }
        let r = self.out.flush().map(|()| 0);
        self.check(r, 0).map(|_| ())
    }
}

impl Sinks {
    /// Opens the outputs: a --json path that cannot be written is a usage
    /// error, found before anything is loaded. `shares_terminal`: the
    /// traced command writes to stall's terminal (`stall run`), so the live
    /// view prints a line per interval instead of redrawing the screen,
    /// which would erase the command's own output.
    fn open(opts: &Options, shares_terminal: bool) -> Result<Self, Error> {
        let json_stdout = opts.json.as_deref().is_some_and(|p| p.as_os_str() == "-");
        let mut json_created = false;
        let json: Option<Box<dyn Write>> = match &opts.json {
            None => None,
            Some(_) if json_stdout => Some(Box::new(UntilClosed::new(std::io::stdout()))),
            Some(p) => {
                let out = create_json(p)?;
                json_created = out.created;
                Some(Box::new(std::io::BufWriter::new(out.file)))
            }
        };
        let json_file = opts.json.clone().filter(|_| !json_stdout);
        let (human, tty): (Box<dyn Write>, bool) = if json_stdout {
            (Box::new(UntilClosed::new(std::io::stderr())), std::io::stderr().is_terminal())
        } else {
            (Box::new(UntilClosed::new(std::io::stdout())), std::io::stdout().is_terminal())
        };
        let live_tty = tty && !opts.quiet && !shares_terminal;
        Ok(Self { json, json_file, json_created, human, live_tty, quiet: opts.quiet })
    }

    /// Writes a JSON Lines record, if --json asks for them; a write that
    /// fails names the path (a usage error, as when it cannot be created).
    fn write_json(&mut self, kind: &'static str, v: &View) -> Result<()> {
        let Some(j) = self.json.as_mut() else { return Ok(()) };
        let written = output::json::write_line(j, kind, v).and_then(|()| j.flush());
        match (written, &self.json_file) {
            (Ok(()), _) => Ok(()),
            (Err(e), Some(p)) => Err(crate::error::output_failed("--json", p, &e).into()),
            (Err(e), None) => Err(e.into()),
        }
    }

    /// After a failed run: a --json file it created and never wrote to is
    /// removed (an empty file would read as a run that said nothing); never
    /// one that was there before (a device such as /dev/null, a FIFO).
    fn remove_unwritten_json(&mut self) {
        self.json = None;
        if let Some(p) = self.json_file.as_ref().filter(|_| self.json_created) {
            if std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file() && m.len() == 0) {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

/// Creates the --json file, or says in one line why it cannot.
fn create_json(p: &std::path::Path) -> Result<crate::error::Output, Error> {
    crate::error::create_output("--json", p)
}

pub async fn run(target: Target, opts: Options) -> Result<Outcome> {
    if let Target::Run { cmd, .. } = &target {
        if let Some(prog) = cmd.first() {
            gate::check_command(prog)?;
        }
    }
    let mut sinks = Sinks::open(&opts, matches!(target, Target::Run { .. }))?;
    let outcome = run_with(target, opts, &mut sinks).await;
    if outcome.is_err() {
        sinks.remove_unwritten_json();
    }
    outcome
}

async fn run_with(target: Target, opts: Options, sinks: &mut Sinks) -> Result<Outcome> {
    let mut timeline = match (&opts.timeline, &opts.timeline_svg) {
        (None, None) => None,
        (trace, svg) => Some(Recording::create(trace.as_deref(), svg.as_deref(), monotonic_ns())?),
    };
    let mut feed = Feed::new(opts.interval)?;
    let capture = Capture::load(&CaptureOptions {
        ringbuf_bytes: opts.ringbuf_bytes,
        floor: opts.floor,
        cgroup_mode: matches!(target, Target::Cgroup(_)),
        latency_sample: opts.latency_sample,
        syscall_hooks_on_demand: false,
        sched_hooks_on_demand: false,
        timeline: opts.timeline.is_some() || opts.timeline_svg.is_some(),
        syscall_hooks: opts.syscall_hooks,
        // Whatever NVML says: the probes see the job's own CUDA calls.
        gpu_probes: !opts.floor,
    })
    .map_err(Error::from)?;
    let mut live = LiveHost::new(capture);
    let start_ns = monotonic_ns();
    let mut gpus =
        GpuFleet::open(opts.gpu.as_ref(), opts.nvml_lib.as_deref(), start_ns).map_err(Error::from)?;

    let mut seeded = Vec::new();
    let mut gate: Option<Gate> = None;
    let (root, label, cgroup_dir) = match &target {
        Target::Run { cmd, .. } => {
            // `--json -`: the command's own output must not interleave with
            // the JSON lines; it goes where stall's human output goes.
            let json_stdout = opts.json.as_deref().is_some_and(|p| p.as_os_str() == "-");
            let mut g = Gate::spawn(cmd, json_stdout)
                .map_err(|e| Error::Spawn(format!("cannot start stall's exec gate: {e}")))?;
            seeded.extend(live.capture.track_tree(g.pid, JOB).map_err(Error::from)?);
            g.release().context("releasing the command")?;
            let pid = g.pid;
            gate = Some(g);
            let shown: Vec<String> = cmd.iter().map(|a| a.to_string_lossy().into_owned()).collect();
            (Some(pid), shown.join(" "), None)
        }
        Target::Pid(pid) => {
            seeded.extend(live.capture.track_tree(*pid, JOB).map_err(Error::from)?);
            (Some(*pid), format!("pid {pid}"), None)
        }
        Target::Cgroup(path) => {
            let dir = cgroup::resolve(path).map_err(Error::from)?;
            seeded.extend(live.capture.watch_cgroup(&dir, JOB).map_err(Error::from)?);
            (None, format!("cgroup {}", dir.display()), Some(dir))
        }
    };
    // Notes are for runs that proceed: after the target is found.
    if let Some(note) = &gpus.note {
        eprintln!("stall: {note}");
    }
    let mut job = Job::new(JOB, start_ns, root, GpuScope::All);
    job.stacks = opts.python_stacks_every.map_or(Stacks::On, Stacks::Every);
    // The first snapshot names every process found at attach.
    let snap = live.capture.snapshot();
    job.absorb(&mut live, &snap);
    job.observe(&mut live, seeded.into_iter().map(|(_, ev)| ev));

    let deadline = opts.duration.map(|d| tokio::time::Instant::now() + d);
    let sleep_until = async move {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(sleep_until);
    let mut child_status = None;
    feed.start();
    let gpu_note = gpus.note.clone();
    let hooks_line = live.capture.syscall_backend_line();
    let out = Out {
        label: &label,
        gpu_note: gpu_note.as_deref(),
        syscall_backend: live.capture.syscall_backend().name(),
        syscall_reads: live.capture.syscall_reads(),
        hooks_line: &hooks_line,
        mmap_hooks: live.capture.mmap_hooks(),
        switch_reads: live.capture.switch_reads(),
    };
    loop {
        tokio::select! {
            wake = feed.next(&mut live.capture) => match wake? {
                Wake::Events => {
                    if let Some(t) = &mut timeline {
                        t.take_switches(&mut feed.events)?;
                    }
                    job.observe(&mut live, feed.events.drain(..).map(|(_, ev)| ev));
                }
                Wake::Tick => {
                    let tick = interval(&mut job, &mut live, &mut feed, &mut gpus, timeline.as_mut())?;
                    emit_interval(sinks, &tick, &out)?;
                    if let Some(dir) = &cgroup_dir {
                        if !dir.exists() {
                            break;
                        }
                        let seeded = live.capture.watch_cgroup(dir, JOB).unwrap_or_default();
                        job.observe(&mut live, seeded.into_iter().map(|(_, ev)| ev));
                    } else if gate.is_none() && job.root_gone(&live) {
                        break;
                    }
                }
                // `stall run`: the command gets the signal once, then stall
                // reports when it is done and exits with its status.
                Wake::Signal(r) if gate.is_some() => {
                    if let Some(g) = &gate {
                        g.pass_on(r);
                    }
                }
                Wake::Signal(_) => break,
            },
            status = async { gate.as_mut().unwrap().child.wait().await }, if gate.is_some() => {
                child_status = Some(shell_status(status.context("waiting for the command")?));
                break;
            }
            _ = &mut sleep_until => {
                if let (Some(g), Target::Run { stop, .. }) = (gate.as_mut(), &target) {
                    if *stop {
                        let status = g.stop(Duration::from_secs(5)).await.context("stopping the command")?;
                        child_status = Some(shell_status(status));
                    } else {
                        eprintln!(
                            "stall: --duration is up: {label} (pid {}) goes on running, untraced (--stop stops it)",
                            g.pid
                        );
                    }
                }
                break;
            }
        }
    }

    // Let the last exits and closes arrive, then read everything once more.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let _ = interval(&mut job, &mut live, &mut feed, &mut gpus, timeline.as_mut())?;
    let end_ns = monotonic_ns();
    let report = job.finish(&mut live, end_ns, &gpus);
    let gpu_probes = live.capture.gpu_probes_line();
    if let Some(t) = timeline {
        t.finish(&report, end_ns, &label)?;
    }
    let view = View {
        window: &report.summary,
        roles: &report.roles,
        gpus: &report.gpus,
        verdict: &report.verdict,
        elapsed_s: report.summary.secs(),
        target: out.label,
        gpu_note: out.gpu_note,
        progress: &report.progress,
        ending: Some(Ending {
            startup_s: report.startup_s,
            syscall_backend: (out.syscall_backend, out.syscall_reads, out.hooks_line),
            gpu_probes: gpu_probes.as_deref(),
            mmap_hooks: out.mmap_hooks,
            switch_reads: out.switch_reads,
            exit_status: child_status,
            unreadable_threads: live.capture.unreadable_threads(),
            role_changes: &report.role_changes,
        }),
        starting_up: false,
    };
    sinks.write_json("summary", &view)?;
    if sinks.live_tty {
        // Leave the live screen behind with the report under it.
        writeln!(sinks.human)?;
    }
    write!(sinks.human, "{}", output::report::render(&view))?;
    sinks.human.flush()?;
    Ok(Outcome { child_status, verdict: report.verdict })
}

/// The job id of `run`/`attach` (the daemon numbers its cgroups).
const JOB: u32 = 1;

/// Ends an interval: what is in the ring buffer, one map snapshot, one GPU
/// poll, then the job's tick (and the timeline's).
fn interval(
    job: &mut Job,
    live: &mut LiveHost,
    feed: &mut Feed,
    gpus: &mut GpuFleet,
    timeline: Option<&mut Recording>,
) -> Result<Tick> {
    let mut timeline = timeline;
    // Everything in the ring before the cut, a batch at a time.
    loop {
        let more = live.capture.drain_events(&mut feed.events);
        if let Some(t) = timeline.as_deref_mut() {
            t.take_switches(&mut feed.events)?;
        }
        job.observe(live, feed.events.drain(..).map(|(_, ev)| ev));
        if !more {
            break;
        }
    }
    let snap = live.capture.snapshot();
    for w in gpus.poll() {
        eprintln!("stall: {w}");
    }
    let tick = job.tick(live, &snap, gpus);
    if let Some(t) = timeline {
        t.tick(&tick, gpus)?;
    }
    Ok(tick)
}

/// What every output of the session names.
struct Out<'a> {
    label: &'a str,
    gpu_note: Option<&'a str>,
    /// `Backend::name` of the syscall hooks, and the line saying so.
    syscall_backend: &'static str,
    /// `Capture::syscall_reads`.
    syscall_reads: &'static str,
    hooks_line: &'a str,
    /// `Capture::mmap_hooks`.
    mmap_hooks: &'static str,
    /// `Capture::switch_reads`.
    switch_reads: &'static str,
}

fn shell_status(s: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))
}

fn emit_interval(sinks: &mut Sinks, tick: &Tick, out: &Out) -> Result<()> {
    let v = View {
        window: &tick.recent,
        roles: &tick.roles,
        gpus: &tick.gpus,
        verdict: &tick.verdict,
        elapsed_s: tick.elapsed_s,
        target: out.label,
        gpu_note: out.gpu_note,
        progress: &tick.progress,
        ending: None,
        starting_up: tick.starting_up,
    };
    sinks.write_json("interval", &v)?;
    if sinks.quiet {
        return Ok(());
    }
    if sinks.live_tty {
        let (rows, cols) = terminal_size();
        let events_per_s = tick.interval.events as f64 / tick.interval.secs().max(1e-3);
        write!(sinks.human, "{}", output::live::screen(&v, events_per_s, rows, cols))?;
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
