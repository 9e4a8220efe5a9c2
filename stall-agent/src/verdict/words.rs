//! How a finding is told: the summary line and the evidence, with numbers.
//! No rule here; `classify` decided.
use stall_common::reason;

mod child;
mod hang;
mod source;
mod stream;

use self::hang::{behind_busy_gpu, no_progress};
use self::source::{from_storage, fuse_server};
use super::{
    classify::{Finding, Scene},
    rules,
    shares::Shares,
    Verdict, MAX_WORKER_LINES,
};
use crate::{
    aggregate::{is_code_file, is_data_file, ProcWindow, ThreadWindow, Waker, Window},
    detail::{Name, PathName, Peer, Text},
    gpu::GpuWindow,
    syscalls, units,
};

/// The verdict for `finding`: its summary and the evidence of the scene;
/// and the finding's own line, without the GPUs' line or notes around it
/// (a rank's line in a run's).
pub(super) fn verdict(s: &Scene, finding: &Finding) -> (Verdict, String) {
    let gpu_line = gpu_prefix(s.gpus, s.secs);
    let text = summary(s, finding);
    let mut summary = around(&text, gpu_line.as_deref());
    let lost = s.w.lost_total();
    if lost > 0 {
        summary.push_str(PARTIAL_NOTE);
    }
    let mut evidence: Vec<String> = gpu_line.into_iter().collect();
    if lost > 0 {
        evidence.push(format!("{lost} events lost: figures are partial"));
    }
    if let (Finding::OutputIo { .. }, Some(trainer)) = (finding, s.trainer) {
        evidence.extend(written_files(trainer, s.secs));
    }
    evidence.extend(job_evidence(s, finding));
    evidence.dedup();
    let v = Verdict {
        kind: finding.kind(),
        summary: summary.into(),
        evidence: evidence.into_iter().map(Text::from).collect(),
        path: super::path::of(s, finding),
        host_only: s.host_only(),
        ..Default::default()
    };
    (v, text)
}

/// Said after a summary with lost events.
pub(super) const PARTIAL_NOTE: &str = " [partial: events were lost]";

/// `text` as a summary of the GPUs' window: after their line, or said to
/// be host-side without them.
pub(super) fn with_gpus(text: &str, gpus: &[GpuWindow], secs: f64) -> String {
    around(text, gpu_prefix(gpus, secs).as_deref())
}

fn around(text: &str, gpu_line: Option<&str>) -> String {
    match gpu_line {
        Some(g) => format!("{g}. {text}"),
        None => format!("{text} (no GPU data: host-side verdict)"),
    }
}

fn summary(s: &Scene, finding: &Finding) -> String {
    let secs = s.secs;
    let (Some(trainer), Some((main, tm))) = (s.trainer, s.main.as_ref()) else {
        return match finding {
            Finding::GpuBusy(g) => busy_text(g),
            Finding::TrainerUntraced => "the trainer has no traced thread".into(),
            _ => format!("not enough data ({} of tracing)", units::secs(secs)),
        };
    };
    let waiting = |waits: f64| {
        format!(
            "Trainer main thread blocked {} of {} ({}){}",
            units::pct(waits),
            units::secs(secs),
            wait_breakdown(main, tm),
            wakers_of(main, &s.workers)
        )
    };
    let reader_bytes = s.reader_bytes();
    match finding {
        Finding::GpuBusy(g) => busy_text(g),
        Finding::HangBehindBusyGpu(h) => behind_busy_gpu(h, trainer, main, s.progress),
        Finding::HangNoProgress(h) => no_progress(h, trainer, s.workers.len(), secs, s.progress),
        Finding::InputIo { waits, worker_io } => format!(
            "{}; {} read {} at {}{}{}, {} off-CPU in file reads: input pipeline is I/O-bound",
            waiting(*waits),
            workers_word(s.workers.len()),
            units::bytes(reader_bytes),
            units::rate(reader_bytes, secs),
            from_storage(&s.workers, reader_bytes),
            fuse_server(s, &s.workers, reader_bytes),
            units::pct(*worker_io)
        ),
        Finding::InputNet { waits, worker_wait } => {
            let net: u64 = s.workers.iter().map(|p| p.network_in()).sum();
            format!(
                "{}; {} received {} from {} at {}, {} of {} time waiting on it: input pipeline is network-bound",
                waiting(*waits),
                workers_word(s.workers.len()),
                units::bytes(net),
                top_peers(&s.workers),
                units::rate(net, secs),
                units::pct(*worker_wait),
                their(s.workers.len())
            )
        }
        Finding::InputCpu { waits } => {
            let (on, rq, throttled) = runnable_shares(s.workers.iter().copied(), secs);
            let workers = workers_word(s.workers.len());
            match held_by_limit(s.w, s.workers.iter().copied(), throttled) {
                Some(limit) => format!(
                    "{}; {workers} on CPU {} of the time, throttled {} (waiting for a CPU {}): {limit}: input pipeline is CPU-bound by its CPU limit (raise the limit; more workers would share the same quota)",
                    waiting(*waits),
                    units::pct(on),
                    units::pct(throttled),
                    units::pct(rq),
                ),
                None => format!(
                    "{}; {workers} on CPU {} of the time{} (read {} at {}): input pipeline is CPU-bound",
                    waiting(*waits),
                    units::pct(on),
                    if rq >= 0.05 { format!(", waiting for a CPU {}", units::pct(rq)) } else { String::new() },
                    units::bytes(reader_bytes),
                    units::rate(reader_bytes, secs)
                ),
            }
        }
        Finding::InputWait { waits, reason: r, share } => {
            let what = if *r == reason::SLEEP {
                "asleep".to_string()
            } else {
                let named = s.workers.iter().filter_map(|p| p.main_thread()).find(|t| t.other_nr >= 0);
                named.map_or_else(
                    || "in other calls".into(),
                    |t| format!("in {}", syscalls::name(i64::from(t.other_nr))),
                )
            };
            format!(
                "{}; {} {} {} of {} time {what}, neither reading nor computing (read {} at {}): input pipeline waits on its workers' own waits (a rate limit, a back-off, a lock)",
                waiting(*waits),
                workers_word(s.workers.len()),
                if s.workers.len() == 1 { "spends" } else { "spend" },
                units::pct(*share),
                their(s.workers.len()),
                units::bytes(reader_bytes),
                units::rate(reader_bytes, secs)
            )
        }
        Finding::Child(c) => child::waits_for_children(c, secs),
        Finding::TrainerReads { own_io } => {
            let own = trainer.input_bytes();
            format!(
                "Trainer main thread {} off-CPU in file reads of {} ({} at {}{}), no workers: input is I/O-bound",
                units::pct(*own_io),
                units::secs(secs),
                units::bytes(own),
                units::rate(own, secs),
                from_storage(&[trainer], own)
            )
        }
        Finding::OutputIo { out, send, .. } if *send * 2.0 >= *out => {
            // Into a pipe or a socket: whoever takes the data sets the pace.
            let bytes = main.delta.other_write_bytes;
            let to = main
                .wait_object(reason::SEND)
                .map(|o| o.describe().to_string())
                .or_else(|| top_sent_peer(trainer).map(|p| format!("the socket to {p}")))
                .unwrap_or_else(|| "a pipe or socket".into());
            format!(
                "Trainer main thread blocked {} of {} writing {to} ({} at {}): whoever takes its output is slow, and the trainer waits for it",
                units::pct(*out),
                units::secs(secs),
                units::bytes(bytes),
                units::rate(bytes, secs),
            )
        }
        Finding::LoaderThreads { waits, threads, io, cpu } => {
            let bytes: u64 = threads.iter().map(|t| t.delta.file_read_bytes + t.delta.other_read_bytes).sum();
            let loaders = loader_threads_word(threads.len());
            let tail = if io >= cpu {
                format!("{} off-CPU in file reads: input pipeline is I/O-bound", units::pct(*io))
            } else {
                format!("on CPU {} of the time: input pipeline is CPU-bound", units::pct(*cpu))
            };
            format!(
                "Trainer main thread blocked {} of {} ({}){}; {loaders} read {} at {}{}, {tail}",
                units::pct(*waits),
                units::secs(secs),
                wait_breakdown(main, tm),
                own_wakers(main, trainer.tgid),
                units::bytes(bytes),
                units::rate(bytes, secs),
                from_storage(&[trainer], trainer.input_bytes()),
            )
        }
        Finding::OwnThreadBusy { waits, thread, cpu, wakes, waited } => {
            // A wait with a timeout (CPython's GIL: 5 ms, then it asks the
            // holder to drop it) is ended by the timer, not by the thread
            // it waits for: a small timed share says little then.
            format!(
                "{}, which ended {} of its waits and is on CPU {} without reading input (it holds the CPU or Python's GIL): trainer is host-bound",
                waits_for_thread(main, tm, secs, *waits, thread, waits_for(*waited, "waiting for")),
                units::pct(*wakes),
                units::pct(*cpu),
            )
        }
        Finding::OwnThreadWaits { waits, thread, state, share, waited } => {
            let on = thread.wait_object(*state).map(|o| o.describe().to_string());
            let head = waits_for_thread(main, tm, secs, *waits, thread, waits_for(*waited, "waits for"));
            match *state {
                reason::SEND | reason::WRITE | reason::SYNC => {
                    let (bytes, what) = if *state == reason::SEND {
                        let peer = || top_sent_peer(trainer).map(|p| format!("the socket to {p}"));
                        (thread.delta.other_write_bytes, on.or_else(peer).unwrap_or_else(|| "a pipe or socket".into()))
                    } else {
                        (thread.delta.file_write_bytes, on.unwrap_or_else(|| "files".into()))
                    };
                    let verb = if *state == reason::SYNC { "syncing" } else { "writing" };
                    format!(
                        "{head}, which is blocked {} {verb} {what} ({} at {}): whoever takes its output is slow, and the trainer waits for it",
                        units::pct(*share),
                        units::bytes(bytes),
                        units::rate(bytes, secs),
                    )
                }
                reason::SLEEP => format!(
                    "{head}, which spends {} of its time asleep (a rate limit, a back-off, a poll interval): the trainer waits on its sleeps",
                    units::pct(*share),
                ),
                reason::IO => format!(
                    "{head}, which is blocked {} in file reads{}: the trainer waits on its reads",
                    units::pct(*share),
                    on.map(|o| format!(" of {o}")).unwrap_or_default(),
                ),
                _ => format!(
                    "{head}, which is itself blocked {} ({}{}) and woken by no worker: the wait leaves the trainer (a peer, a remote service), not an input stall",
                    units::pct(*share),
                    reason_name(*state, thread),
                    on.map(|o| format!(" on {o}")).unwrap_or_default(),
                ),
            }
        }
        Finding::TrainerStream { wait, bytes, network, peer } => {
            stream::streamed_in(main, secs, *wait, *bytes, *network, *peer)
        }
        Finding::OutputIo { out, sync, .. } => {
            let written = trainer.file_write_bytes();
            // The files that carry the bytes, not every control file touched.
            let files: Vec<_> =
                by_written(trainer).into_iter().filter(|f| f.write_bytes * 10 >= written).collect();
            let names: Vec<String> =
                files.iter().take(2).map(|f| PathName::from(f.path.as_str()).to_string()).collect();
            let more = if files.len() > 2 { format!(" and {} more", files.len() - 2) } else { String::new() };
            format!(
                "Trainer main thread blocked {} of {} writing {}{more} ({} at {}, {} of it in sync): writing output (checkpoints, logs) stalls the trainer",
                units::pct(*out),
                units::secs(secs),
                if names.is_empty() { "files".to_string() } else { names.join(", ") },
                units::bytes(written),
                units::rate(written, out * secs),
                units::pct(if *out > 0.0 { sync / out } else { 0.0 })
            )
        }
        Finding::TrainerBusy { .. } if held_by_limit(s.w, [trainer], tm.r(reason::THROTTLED)).is_some() => {
            let limit = held_by_limit(s.w, [trainer], tm.r(reason::THROTTLED)).unwrap_or_default();
            format!(
                "Trainer main thread on CPU {} of {}, throttled {} (waiting for a CPU {}): {limit}: trainer is host-bound by its CPU limit",
                units::pct(tm.on),
                units::secs(secs),
                units::pct(tm.r(reason::THROTTLED)),
                units::pct(tm.r(reason::RUNQUEUE)),
            )
        }
        Finding::GpuWait { sync } => {
            let g = &main.delta.gpu;
            let how = if tm.cpu() >= 0.5 * sync {
                format!("spinning: on CPU {}", units::pct(tm.cpu()))
            } else {
                format!("blocked {}", units::pct(tm.blocked()))
            };
            format!(
                "Trainer main thread inside CUDA synchronizations {} of {} ({} calls, {how}): it waits for its GPU, which is the bottleneck",
                units::pct(*sync),
                units::secs(secs),
                g.sync_calls,
            )
        }
        Finding::GpuCopies { copy } => {
            let g = &main.delta.gpu;
            format!(
                "Trainer main thread inside synchronous CUDA copies {} of {} ({} copies, {} at {}): copies between host and device memory hold the trainer, and the GPU waits for them",
                units::pct(*copy),
                units::secs(secs),
                g.copy_calls,
                units::bytes(g.copy_bytes),
                units::rate(g.copy_bytes, g.copy_ns as f64 / 1e9),
            )
        }
        Finding::TrainerBusy { cpu } if launch_bound(main, secs).is_some() => {
            let (rate, sync) = launch_bound(main, secs).unwrap_or_default();
            format!(
                "Trainer main thread on CPU {} of {} launching {} GPU kernels/s, inside CUDA synchronizations {}: the host cannot launch kernels fast enough, the GPU waits for them{}",
                units::pct(*cpu),
                units::secs(secs),
                units::grouped(rate),
                units::pct(sync),
                workers_input(&s.workers)
            )
        }
        Finding::TrainerBusy { cpu } if s.host_only() => format!(
            "Trainer main thread on CPU {} of {}: it is busy on the host (input is not the bottleneck){}",
            units::pct(*cpu),
            units::secs(secs),
            workers_input(&s.workers)
        ),
        Finding::TrainerBusy { cpu } => format!(
            "Trainer main thread on CPU {} of {} while the GPU idles: trainer is host-bound{}",
            units::pct(*cpu),
            units::secs(secs),
            workers_input(&s.workers)
        ),
        Finding::Idle { job_cpu } => {
            let (r, share) = tm.top_wait();
            format!(
                "Nothing is happening: the job used {:.1}% of a CPU and read no files in {}; trainer main thread mostly in {} ({}){}",
                job_cpu * 100.0,
                units::secs(secs),
                reason_name(r, main),
                units::pct(share),
                waiting_on(main, r)
            )
        }
        Finding::NoSingleBottleneck | Finding::NotEnoughData | Finding::TrainerUntraced => {
            format!(
                "No single bottleneck: trainer main thread on CPU {}, blocked {} ({}){}",
                units::pct(tm.cpu()),
                units::pct(tm.blocked()),
                wait_breakdown(main, tm),
                waiting_on(main, tm.top_wait().0)
            )
        }
    }
}

/// "; its 4 workers read 256 MB meanwhile (/data/train.arrow 254 MB, …)":
/// the input that kept up with a busy trainer, by file (summed over the
/// workers, code left out, the two that gave most named); empty without
/// workers or input.
fn workers_input(workers: &[&ProcWindow]) -> String {
    let mut by_path: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
    for f in workers.iter().flat_map(|p| p.files.iter()) {
        if !is_code_file(f.resolved.as_deref().unwrap_or(&f.path)) && f.bytes_in() > 0 {
            *by_path.entry(f.path.as_str()).or_default() += f.bytes_in();
        }
    }
    let total: u64 = workers.iter().map(|p| p.input_bytes()).sum();
    if by_path.is_empty() || total == 0 {
        return String::new();
    }
    let mut files: Vec<(&str, u64)> = by_path.into_iter().collect();
    files.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let named: Vec<String> =
        files.iter().take(2).map(|(p, b)| format!("{} {}", PathName::from(*p), units::bytes(*b))).collect();
    let more = match files.len().saturating_sub(2) {
        0 => String::new(),
        1 => " and 1 more file".into(),
        n => format!(" and {n} more files"),
    };
    format!(
        "; {} read {} meanwhile ({}{more})",
        if workers.len() == 1 { "its worker".to_string() } else { format!("its {} workers", workers.len()) },
        units::bytes(total),
        named.join(", ")
    )
}

/// The peers outside the job `procs` received most from: "10.0.0.5:443",
/// "10.0.0.5:443 and 2 more peers".
fn top_peers(procs: &[&ProcWindow]) -> String {
    let mut by_peer: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
    for s in procs.iter().flat_map(|p| p.sockets.iter()).filter(|s| !s.ipc) {
        *by_peer.entry(s.path.as_str()).or_default() += s.read_bytes;
    }
    let mut peers: Vec<(&str, u64)> = by_peer.into_iter().collect();
    peers.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    match peers.len() {
        0 => "the network".into(),
        1 => Peer::from(peers[0].0).to_string(),
        n => format!("{} and {} more peer{}", Peer::from(peers[0].0), n - 1, if n == 2 { "" } else { "s" }),
    }
}

/// The main threads' mean shares of the window: on CPU, waiting for a CPU,
/// throttled.
fn runnable_shares<'a>(procs: impl Iterator<Item = &'a ProcWindow>, secs: f64) -> (f64, f64, f64) {
    let shares: Vec<Shares> =
        procs.filter_map(ProcWindow::main_thread).map(|t| Shares::of(t, secs)).collect();
    let n = shares.len().max(1) as f64;
    let mean = |f: &dyn Fn(&Shares) -> f64| shares.iter().map(f).sum::<f64>() / n;
    (mean(&|s| s.on), mean(&|s| s.r(reason::RUNQUEUE)), mean(&|s| s.r(reason::THROTTLED)))
}

/// "the cgroup's CPU limit (0.6 CPU) throttled them in 98% of periods
/// (13.9s)", when the limit capping these processes held them back: they
/// were throttled a tenth of their time or more.
fn held_by_limit<'a>(
    w: &Window,
    procs: impl IntoIterator<Item = &'a ProcWindow>,
    throttled: f64,
) -> Option<String> {
    if throttled < 0.1 {
        return None;
    }
    let limit = procs.into_iter().find_map(|p| w.cpu_limit_of(p))?;
    Some(format!(
        "the cgroup's CPU limit ({} CPU, {}) throttled them in {} of periods ({} throttled)",
        units::cpus(limit.cpus),
        limit.cgroup,
        units::pct(limit.throttled_share()),
        units::secs(limit.throttled_ns as f64 / 1e9)
    ))
}

/// The trainer's and the busiest workers' lines, the files read most and
/// the last output, once there is a trainer to speak of. The children a
/// trainer's wait was followed to are called children, not workers.
fn job_evidence(s: &Scene, finding: &Finding) -> Vec<String> {
    let followed: Vec<u32> = match finding {
        Finding::Child(c) => c.via.iter().flatten().chain(&c.children).map(|p| p.tgid).collect(),
        _ => Vec::new(),
    };
    let (Some(trainer), Some((main, tm))) = (s.trainer, s.main.as_ref()) else { return Vec::new() };
    let mut evidence = vec![thread_line("trainer main thread", trainer, main, tm)];
    // The busiest readers first; a handful is evidence, thousands is noise.
    let mut shown: Vec<&&ProcWindow> = s.workers.iter().collect();
    shown.sort_by_key(|p| (std::cmp::Reverse(p.input_bytes() + p.network_in()), p.tgid));
    if shown.len() > MAX_WORKER_LINES {
        evidence.push(format!("{} workers; the {MAX_WORKER_LINES} that read most:", shown.len()));
        shown.truncate(MAX_WORKER_LINES);
    }
    for wp in shown {
        if let Some(t) = wp.main_thread() {
            let shares = Shares::of(t, s.secs);
            let net = wp.network_in();
            evidence.push(format!(
                "{}; read {} at {}{}",
                thread_line(if followed.contains(&wp.tgid) { "child" } else { "worker" }, wp, t, &shares),
                units::bytes(wp.input_bytes()),
                units::rate(wp.input_bytes(), s.secs),
                if net > 0 {
                    format!("; received {} at {} from peers", units::bytes(net), units::rate(net, s.secs))
                } else {
                    String::new()
                }
            ));
        }
    }
    evidence.extend(top_files(s.w, s.secs));
    evidence.extend(top_peers_evidence(s.w, s.secs));
    if let Some(o) = &s.progress.last_output {
        evidence.push(format!("output {} (pid {}) last written {} ago", o.path, o.pid, units::span(o.ago_s)));
    }
    evidence
}

fn reason_name(r: u8, t: &ThreadWindow) -> String {
    if r == reason::OTHER && t.other_nr >= 0 {
        format!("other ({})", syscalls::name(i64::from(t.other_nr)))
    } else {
        reason::name(r).to_string()
    }
}

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

fn busy_text(g: &GpuWindow) -> String {
    let mut text = format!("GPU{} busy {:.0}% on average{}", g.index, g.util_mean_pct, power_words(g));
    match g.power_share() {
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
        "{label} {} ({} pid {}): on CPU {}, runqueue {}{}, blocked {} ({})",
        t.tid,
        Name::from(p.comm.as_str()),
        p.tgid,
        units::pct(s.on),
        units::pct(s.r(reason::RUNQUEUE)),
        if s.r(reason::THROTTLED) > 0.0 {
            format!(", throttled {}", units::pct(s.r(reason::THROTTLED)))
        } else {
            String::new()
        },
        units::pct(s.blocked()),
        wait_breakdown(t, s)
    )
}

/// "futex 60%, poll 37%": the waits above 5%, largest first.
fn wait_breakdown(t: &ThreadWindow, s: &Shares) -> String {
    let parts = s.waits_above(0.05);
    if parts.is_empty() {
        return "no wait above 5%".into();
    }
    parts
        .iter()
        .map(|(r, v)| format!("{} {}", reason_name(*r, t), units::pct(*v)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// "waits 94% of the time for" a thread, where the kernel timed the waits
/// it ended and they are a share worth naming; else `otherwise`.
fn waits_for(waited: Option<f64>, otherwise: &str) -> String {
    match waited {
        Some(w) if w >= rules::WAITED_NAMED => format!("waits {} of the time for", units::pct(w)),
        _ => otherwise.into(),
    }
}

/// "Trainer main thread blocked 95% of 10.0s (futex 94%), waits 94% of the
/// time for thread 709 (python3) of the trainer": the head of the findings
/// that follow the main thread's wait to another thread of its own.
fn waits_for_thread(
    main: &ThreadWindow,
    tm: &Shares,
    secs: f64,
    waits: f64,
    thread: &ThreadWindow,
    ended: String,
) -> String {
    format!(
        "Trainer main thread blocked {} of {} ({}), {ended} thread {} ({}) of the trainer",
        units::pct(waits),
        units::secs(secs),
        wait_breakdown(main, tm),
        thread.tid,
        Name::from(thread.comm.as_str()),
    )
}

/// ", waiting on the lock on /tmp/build.lock, held by pid 459 (python3)":
/// what `t` was seen blocked on in `state`, where /proc or the kernel
/// named it; empty otherwise.
fn waiting_on(t: &ThreadWindow, state: u8) -> String {
    t.wait_object(state).map(|o| format!(", waiting on {}", o.describe())).unwrap_or_default()
}

/// "its" for one, "their" for more.
fn their(n: usize) -> &'static str {
    if n == 1 {
        "its"
    } else {
        "their"
    }
}

fn workers_word(n: usize) -> String {
    if n == 1 {
        "1 worker".into()
    } else {
        format!("{n} workers")
    }
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

fn loader_threads_word(n: usize) -> String {
    if n == 1 {
        "1 loader thread of the trainer".into()
    } else {
        format!("{n} loader threads of the trainer")
    }
}

/// ", woken 412 times by 4 threads of its own (most by thread 3837 ×130)".
fn own_wakers(main: &ThreadWindow, tgid: u32) -> String {
    let mut own: Vec<&Waker> =
        main.woken_by.iter().filter(|b| b.tgid == tgid && b.thread() != Some(main.tid)).collect();
    own.sort_by(|a, b| b.count.cmp(&a.count).then(a.tid.cmp(&b.tid)));
    let n: u64 = own.iter().map(|b| b.count).sum();
    match own.first() {
        Some(top) if n > 0 => format!(
            ", woken {n} times by {} thread{} of its own (most by thread {} ×{})",
            own.len(),
            if own.len() == 1 { "" } else { "s" },
            top.tid,
            top.count
        ),
        _ => String::new(),
    }
}

/// The peer outside the job `p` sent most to.
fn top_sent_peer(p: &ProcWindow) -> Option<Peer> {
    p.sockets
        .iter()
        .filter(|s| s.write_bytes > 0)
        .max_by_key(|s| s.write_bytes)
        .map(|s| s.path.as_str().into())
}

/// A busy main thread's kernel launches per second and its share inside
/// CUDA's synchronizations, where it launches enough to be named.
fn launch_bound(main: &ThreadWindow, secs: f64) -> Option<(u64, f64)> {
    let g = &main.delta.gpu;
    let rate = g.launches as f64 / secs;
    (rate >= rules::LAUNCHES_NAMED_PER_S).then(|| (rate.round() as u64, g.sync_ns as f64 / 1e9 / secs))
}

/// The files a process wrote in the window, most bytes first.
fn by_written(p: &ProcWindow) -> Vec<&crate::aggregate::FileWindow> {
    let mut files: Vec<_> = p.files.iter().filter(|f| f.write_bytes > 0).collect();
    files.sort_by(|a, b| b.write_bytes.cmp(&a.write_bytes).then_with(|| a.path.cmp(&b.path)));
    files
}

/// Evidence: the files that took at least 1% of what `p` wrote.
fn written_files(p: &ProcWindow, secs: f64) -> Vec<String> {
    let written = p.file_write_bytes();
    by_written(p)
        .iter()
        .filter(|f| f.write_bytes * 100 >= written)
        .take(5)
        .map(|f| {
            format!(
                "file {}: {} written by pid {} in {} calls ({} over the window)",
                PathName::from(f.path.as_str()),
                units::bytes(f.write_bytes),
                p.tgid,
                f.write_calls,
                units::rate(f.write_bytes, secs)
            )
        })
        .collect()
}

/// The peers outside the job that sent most, per process: "peer
/// 10.0.0.5:443: 64 MB received by pid 12 in 900 reads (8.0 MB/s while
/// connected, 7.1s in its reads)".
fn top_peers_evidence(w: &Window, secs: f64) -> Vec<String> {
    let mut socks: Vec<(u32, &crate::aggregate::FileWindow)> = w
        .procs
        .iter()
        .flat_map(|p| p.sockets.iter().map(move |s| (p.tgid, s)))
        .filter(|(_, s)| !s.ipc && s.read_bytes > 0)
        .collect();
    socks.sort_by_key(|(pid, s)| (std::cmp::Reverse(s.read_bytes), *pid));
    socks
        .iter()
        .take(5)
        .map(|(pid, s)| {
            format!(
                "peer {}: {} received by pid {pid} in {} reads ({} while connected, {} in its reads)",
                Peer::from(s.path.as_str()),
                units::bytes(s.read_bytes),
                s.read_calls,
                units::rate(s.read_bytes, s.rate_secs(secs)),
                units::secs(s.read_time_ns() / 1e9)
            )
        })
        .collect()
}

fn top_files(w: &Window, secs: f64) -> Vec<String> {
    w.files_by_bytes()
        .iter()
        .filter(|(_, f)| is_data_file(f.name()))
        .take(5)
        .map(|(pid, f)| {
            let source = f.source().map(|s| format!(", {s}")).unwrap_or_default();
            format!(
                "file {}: {} {} by pid {pid} ({} while open{source})",
                PathName::from(f.path.as_str()),
                units::bytes(f.bytes_in()),
                f.taken_by(),
                units::rate(f.bytes_in(), f.rate_secs(secs))
            )
        })
        .collect()
}
