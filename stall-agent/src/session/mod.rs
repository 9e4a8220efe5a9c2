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
    capture::{cgroup, Capture, CaptureOptions},
    clock::monotonic_ns,
    error::Error,
    gpu::GpuSelect,
    job::{Feed, GpuFleet, GpuScope, Job, Tick, Wake},
    output::{self, View},
    verdict::Verdict,
};

pub enum Target {
    Run(Vec<OsString>),
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
}

/// How the session ended.
pub struct Outcome {
    /// `stall run`: the command's exit status, shell-style.
    pub child_status: Option<i32>,
    pub verdict: Verdict,
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
    let mut feed = Feed::new(opts.interval)?;
    let mut capture = Capture::load(&CaptureOptions {
        ringbuf_bytes: opts.ringbuf_bytes,
        floor: opts.floor,
        cgroup_mode: matches!(target, Target::Cgroup(_)),
        latency_sample: opts.latency_sample,
    })
    .map_err(Error::from)?;
    let start_ns = monotonic_ns();
    let mut gpus =
        GpuFleet::open(opts.gpu.as_ref(), opts.nvml_lib.as_deref(), start_ns).map_err(Error::from)?;
    if let Some(note) = &gpus.note {
        eprintln!("stall: {note}");
    }
    let mut sinks = Sinks::open(&opts)?;

    let mut seeded = Vec::new();
    let mut gate: Option<Gate> = None;
    let (root, label, cgroup_dir) = match &target {
        Target::Run(cmd) => {
            let mut g =
                Gate::spawn(cmd).map_err(|e| Error::Spawn(format!("cannot start stall's exec gate: {e}")))?;
            seeded.extend(capture.track_tree(g.pid, JOB).map_err(Error::from)?);
            g.release().context("releasing the command")?;
            let pid = g.pid;
            gate = Some(g);
            let shown: Vec<String> = cmd.iter().map(|a| a.to_string_lossy().into_owned()).collect();
            (Some(pid), shown.join(" "), None)
        }
        Target::Pid(pid) => {
            seeded.extend(capture.track_tree(*pid, JOB).map_err(Error::from)?);
            (Some(*pid), format!("pid {pid}"), None)
        }
        Target::Cgroup(path) => {
            let dir = cgroup::resolve(path).map_err(Error::from)?;
            seeded.extend(capture.watch_cgroup(&dir, JOB).map_err(Error::from)?);
            (None, format!("cgroup {}", dir.display()), Some(dir))
        }
    };
    feed.attached();
    let mut job = Job::new(JOB, start_ns, root, GpuScope::All);
    // The first snapshot names every process found at attach.
    let snap = capture.snapshot();
    job.absorb(&mut capture, &snap);
    job.observe(&mut capture, seeded.into_iter().map(|(_, ev)| ev));

    let deadline = opts.duration.map(|d| tokio::time::Instant::now() + d);
    let sleep_until = async move {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(sleep_until);
    let mut child_status = None;
    let gpu_note = gpus.note.clone();
    let out = Out { label: &label, gpu_note: gpu_note.as_deref() };
    loop {
        tokio::select! {
            wake = feed.next(&mut capture) => match wake? {
                Wake::Events => job.observe(&mut capture, feed.events.drain(..).map(|(_, ev)| ev)),
                Wake::Tick => {
                    let tick = interval(&mut job, &mut capture, &mut feed, &mut gpus);
                    emit_interval(&mut sinks, &tick, &out)?;
                    if let Some(dir) = &cgroup_dir {
                        if !dir.exists() {
                            break;
                        }
                        let seeded = capture.watch_cgroup(dir, JOB).unwrap_or_default();
                        job.observe(&mut capture, seeded.into_iter().map(|(_, ev)| ev));
                    } else if gate.is_none() && job.root_gone(&capture) {
                        break;
                    }
                }
                // `stall run`: the command got the same Ctrl-C from the
                // terminal; report when it is done.
                Wake::Interrupt if gate.is_some() => {}
                Wake::Terminate | Wake::Hangup if gate.is_some() => {
                    if let Some(g) = &gate {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(g.pid as i32),
                            nix::sys::signal::Signal::SIGTERM,
                        );
                    }
                }
                Wake::Interrupt | Wake::Terminate | Wake::Hangup => break,
            },
            status = async { gate.as_mut().unwrap().child.wait().await }, if gate.is_some() => {
                child_status = Some(shell_status(status.context("waiting for the command")?));
                break;
            }
            _ = &mut sleep_until => break,
        }
    }

    // Let the last exits and closes arrive, then read everything once more.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let _ = interval(&mut job, &mut capture, &mut feed, &mut gpus);
    let report = job.finish(monotonic_ns(), &gpus);
    let view = View {
        window: &report.summary,
        roles: &report.roles,
        gpus: &report.gpus,
        verdict: &report.verdict,
        elapsed_s: report.summary.secs(),
        target: out.label,
        gpu_note: out.gpu_note,
        progress: &report.progress,
        startup_s: report.startup_s,
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
    Ok(Outcome { child_status, verdict: report.verdict })
}

/// The job id of `run`/`attach` (the daemon numbers its cgroups).
const JOB: u32 = 1;

/// Ends an interval: what is in the ring buffer, one map snapshot, one GPU
/// poll, then the job's tick.
fn interval(job: &mut Job, capture: &mut Capture, feed: &mut Feed, gpus: &mut GpuFleet) -> Tick {
    capture.drain_events(&mut feed.events);
    job.observe(capture, feed.events.drain(..).map(|(_, ev)| ev));
    let snap = capture.snapshot();
    for w in gpus.poll() {
        eprintln!("stall: {w}");
    }
    job.tick(capture, &snap, gpus)
}

/// What every output of the session names.
struct Out<'a> {
    label: &'a str,
    gpu_note: Option<&'a str>,
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
        startup_s: None,
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
