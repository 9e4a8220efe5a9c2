//! A timeline people can look at: every traced thread's states over time
//! (from per-switch records, only when asked for), its process's file reads
//! per interval, the GPUs' utilization and power, and the verdict of each
//! interval, as a Chrome trace (JSON; Perfetto and `chrome://tracing` open
//! it) and, optionally, a self-contained SVG. Pure: fed by the job, tested
//! on synthetic streams.
//!
//! Slices tile each thread's life from its first switch on and are named by
//! state: `on-cpu`, `futex`, `io`, `poll`, `sleep`, `runqueue`,
//! `other:<syscall>`, `stolen`. To bound the file, a thread's slices shorter than the
//! resolution are gathered per state over a stretch of that length and laid
//! one after the other from its start: per-state sums stay exact, timing is
//! exact to the resolution. Past a cap on events the trace stops (and says
//! where).
mod layout;
mod record;
mod svg;

use std::{collections::HashMap, io::Write};

use serde_json::json;
use stall_common::reason;

pub use self::{
    record::{Buffer, Recording},
    svg::render as render_svg,
};
pub use crate::decode::Switch;
use crate::{syscalls, verdict::Kind};

/// A thread state, as a slice's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    OnCpu,
    Off(u8),
    /// Blocked in a syscall stall does not classify.
    Other(i32),
    /// Current on its CPU, but not running by the kernel's clock of its run
    /// time: the hypervisor ran something else on the virtual CPU (steal
    /// time, which that clock leaves out), or the scheduler was switching
    /// it out. Neither on CPU nor in the runqueue by the kernel's counters,
    /// as in the summary.
    Stolen,
}

impl State {
    pub fn name(self) -> String {
        match self {
            State::OnCpu => "on-cpu".into(),
            State::Off(r) => reason::name(r).into(),
            State::Other(nr) => format!("other:{}", syscalls::name(i64::from(nr))),
            State::Stolen => "stolen".into(),
        }
    }

    /// Index for per-state sums: on-CPU, then the off-CPU reasons.
    pub fn index(self) -> usize {
        match self {
            State::OnCpu => 0,
            State::Off(r) => 1 + usize::from(r).min(reason::COUNT - 1),
            State::Other(_) => 1 + usize::from(reason::OTHER),
            State::Stolen => 1 + reason::COUNT,
        }
    }

    fn off(reason: u8, nr: i32) -> State {
        if reason == reason::OTHER {
            State::Other(nr)
        } else {
            State::Off(reason)
        }
    }
}

/// States, by [`State::index`].
pub const STATES: usize = 2 + reason::COUNT;

/// Per-thread slices shorter than this are gathered (ns).
pub const DEFAULT_RESOLUTION_NS: u64 = 1_000_000;
/// Events written at most.
pub const DEFAULT_MAX_EVENTS: u64 = 4_000_000;
/// The SVG's time step (ns).
const SVG_BUCKET_NS: u64 = 100_000_000;

#[derive(Default)]
struct Line {
    pid: u32,
    /// The state since when, once a switch was seen.
    now: Option<(State, u64)>,
    /// The kernel's on-CPU total at the last record that had it.
    exec: u64,
    /// The timestamp of the last switch-in.
    on_ts: u64,
    /// Short slices gathered since `pending_start`.
    pending: Vec<(State, u64)>,
    pending_start: u64,
    /// Per-state ns, whole run (what the slices add up to).
    sums: [u64; STATES],
    /// For the SVG: per 100 ms, ns per state index.
    buckets: Vec<[u32; STATES]>,
    /// For the SVG: when its first slice began and its last ended (ns
    /// since the origin), to tell short-lived helpers.
    first: Option<u64>,
    last: u64,
}

/// Names and roles for the metadata records, given at the end.
#[derive(Debug, Clone, Default)]
pub struct Names {
    /// pid → (name, role)
    pub processes: HashMap<u32, (String, String)>,
    /// tid → name
    pub threads: HashMap<u32, String>,
    /// pid → the rank it works for, in a distributed run.
    pub ranks: HashMap<u32, u32>,
    /// pid → its parent's pid (helpers are folded per parent).
    pub parents: HashMap<u32, u32>,
}

impl Names {
    /// A process's parent and rank, where known.
    pub fn add_family(&mut self, pid: u32, ppid: Option<u32>, rank: Option<u32>) {
        if let Some(pp) = ppid {
            self.parents.insert(pid, pp);
        }
        if let Some(r) = rank {
            self.ranks.insert(pid, r);
        }
    }
}

/// The pseudo-process that holds the GPU counters, and the pseudo-thread of
/// each process that holds its file reads.
pub const GPU_PID: u32 = 0;
pub const READS_TID: u32 = 0;

pub struct Timeline<W: Write> {
    out: W,
    wrote_any: bool,
    events: u64,
    max_events: u64,
    capped_at: Option<u64>,
    resolution_ns: u64,
    /// CLOCK_MONOTONIC ns of the trace's time 0 (written in µs from it);
    /// the realtime instant of that, for lining up with other traces.
    origin_ns: u64,
    origin_realtime_ns: u64,
    lines: HashMap<u32, Line>,
    /// For the SVG: per GPU, per 100 ms bucket, (sum of utilization, samples).
    gpus: HashMap<u32, Vec<(f64, u32)>>,
    /// For the SVG: the job's file reads per interval, (start, end, bytes),
    /// ns since the origin.
    reads: Vec<(u64, u64, u64)>,
    /// For the SVG: each interval's verdict, (start, end, kind), ns since
    /// the origin; the next one starts where the last ended.
    verdicts: Vec<(u64, u64, Kind)>,
    /// The end of the job's startup (monotonic ns), once known.
    startup_end_ns: Option<u64>,
    /// Switch records the kernel could not deliver (ring buffer full).
    pub lost: u64,
}

impl<W: Write> Timeline<W> {
    pub fn new(mut out: W, origin_ns: u64, origin_realtime_ns: u64) -> std::io::Result<Self> {
        // `baseTimeNanoseconds`: the wall-clock instant of ts 0, as torch
        // (2.4 on) writes it in its traces, so tools that line traces up by
        // it (viztracer's, Perfetto by hand) can put both on one axis.
        writeln!(
            out,
            "{{\"displayTimeUnit\":\"ms\",\"baseTimeNanoseconds\":{origin_realtime_ns},\"traceEvents\":["
        )?;
        Ok(Self {
            out,
            wrote_any: false,
            events: 0,
            max_events: DEFAULT_MAX_EVENTS,
            capped_at: None,
            resolution_ns: DEFAULT_RESOLUTION_NS,
            origin_ns,
            origin_realtime_ns,
            lines: HashMap::new(),
            gpus: HashMap::new(),
            reads: Vec::new(),
            verdicts: Vec::new(),
            startup_end_ns: None,
            lost: 0,
        })
    }

    pub fn with_limits(mut self, resolution_ns: u64, max_events: u64) -> Self {
        self.resolution_ns = resolution_ns;
        self.max_events = max_events;
        self
    }

    fn us(&self, ns: u64) -> f64 {
        ns.saturating_sub(self.origin_ns) as f64 / 1e3
    }

    fn write(&mut self, ev: serde_json::Value, ts: u64) -> std::io::Result<()> {
        if self.capped_at.is_some() {
            return Ok(());
        }
        if self.events >= self.max_events {
            self.capped_at = Some(ts);
            let note = json!({"ph": "i", "s": "g", "name": "timeline capped", "pid": GPU_PID, "tid": 0,
                "ts": self.us(ts), "args": {"why": format!("{} events written: nothing after this", self.max_events)}});
            return self.emit(note);
        }
        self.events += 1;
        self.emit(ev)
    }

    fn emit(&mut self, ev: serde_json::Value) -> std::io::Result<()> {
        if self.wrote_any {
            self.out.write_all(b",\n")?;
        }
        self.wrote_any = true;
        serde_json::to_writer(&mut self.out, &ev)?;
        Ok(())
    }

    /// Takes one switch record. On-CPU slices last what the kernel's counter
    /// says (as the summary does), laid from the switch-in's timestamp: the
    /// counter stops when the scheduler starts switching, the record is
    /// taken once it has picked the next task, which can take long (an idle
    /// CPU balances first), and starts at the pick, before the record.
    /// Where the counter runs past the switch-out, the off-CPU slice after
    /// gives it; where it stops short (steal time under a hypervisor, a long
    /// switch), the rest until the switch-out is `stolen`: the kernel's
    /// run-delay counter, as the summary, counts the runqueue from there.
    pub fn switch(&mut self, s: &Switch) -> std::io::Result<()> {
        let line = self.lines.entry(s.tid).or_insert_with(|| Line { pid: s.tgid, ..Default::default() });
        let prev = line.now.take();
        // On CPU since the last record, by the kernel (None: not read).
        let ran = if s.exec_ns != 0 { s.exec_ns.checked_sub(line.exec) } else { None };
        if s.exec_ns != 0 {
            line.exec = s.exec_ns;
        }
        if s.on {
            let mut at = s.ts;
            if let Some((state, since)) = prev.filter(|(st, _)| *st != State::OnCpu) {
                at = at.max(since);
                // Blocked until woken, then waiting for a CPU.
                if s.wake_ts > since && s.wake_ts < at && state != State::Off(reason::RUNQUEUE) {
                    self.slice(s.tid, state, since, s.wake_ts)?;
                    self.slice(s.tid, State::Off(reason::RUNQUEUE), s.wake_ts, at)?;
                } else {
                    self.slice(s.tid, state, since, at)?;
                }
            }
            let line = self.line(s.tid);
            line.now = Some((State::OnCpu, at));
            line.on_ts = s.ts;
            return Ok(());
        }
        let mut off_since = s.ts;
        match prev {
            Some((State::OnCpu, since)) => {
                let on_ts = self.line(s.tid).on_ts;
                let ran = ran.unwrap_or(s.ts.saturating_sub(on_ts));
                off_since = since + ran;
                self.slice(s.tid, State::OnCpu, since, off_since)?;
                if off_since < s.ts {
                    self.slice(s.tid, State::Stolen, off_since, s.ts)?;
                    off_since = s.ts;
                }
            }
            Some((state, since)) => {
                // Its switch-in never came: it ran, for what the counter says,
                // just before this switch-out (as the summary repairs it).
                let ran = ran.unwrap_or(0);
                let start = s.ts.saturating_sub(ran).max(since);
                off_since = start + ran;
                self.slice(s.tid, state, since, start)?;
                self.slice(s.tid, State::OnCpu, start, off_since)?;
            }
            None => {}
        }
        self.line(s.tid).now = Some((State::off(s.reason, s.nr), off_since));
        Ok(())
    }

    /// The end of `tid`'s current state at `ts` (exit, or the end of the
    /// run): on CPU, for as long as since its switch-in (what the summary
    /// adds for a running thread), from where its slice began.
    fn close_line(&mut self, tid: u32, ts: u64) -> std::io::Result<()> {
        let Some(line) = self.lines.get_mut(&tid) else { return Ok(()) };
        match line.now.take() {
            Some((State::OnCpu, since)) => {
                let ran = ts.saturating_sub(line.on_ts);
                self.slice(tid, State::OnCpu, since, since + ran)
            }
            Some((state, since)) => self.slice(tid, state, since, ts.max(since)),
            None => Ok(()),
        }
    }

    fn line(&mut self, tid: u32) -> &mut Line {
        self.lines.get_mut(&tid).expect("a line per switching thread")
    }

    /// A traced thread exited at `ts`: its last slice ends there (its final
    /// switch comes after the kernel side stopped tracking it).
    pub fn exit(&mut self, tid: u32, ts: u64) -> std::io::Result<()> {
        self.close_line(tid, ts)
    }

    /// A slice of `tid` in `state` over [start, end): written, or gathered
    /// with the thread's other short ones.
    fn slice(&mut self, tid: u32, state: State, start: u64, end: u64) -> std::io::Result<()> {
        let dur = end.saturating_sub(start);
        if dur == 0 {
            return Ok(());
        }
        let res = self.resolution_ns;
        let origin = self.origin_ns;
        let line = self.line(tid);
        line.sums[state.index()] += dur;
        let rel = start.saturating_sub(origin);
        line.first = Some(line.first.map_or(rel, |f| f.min(rel)));
        line.last = line.last.max(end.saturating_sub(origin));
        add_buckets(
            &mut line.buckets,
            state.index(),
            start.saturating_sub(origin),
            end.saturating_sub(origin),
        );
        let pending = !line.pending.is_empty();
        if dur >= res {
            if pending {
                self.flush(tid)?;
            }
            return self.write_slice(tid, state, start, dur);
        }
        if !pending {
            line.pending_start = start;
        }
        match line.pending.iter_mut().find(|(s, _)| *s == state) {
            Some(p) => p.1 += dur,
            None => line.pending.push((state, dur)),
        }
        if end.saturating_sub(line.pending_start) >= res {
            self.flush(tid)?;
        }
        Ok(())
    }

    /// Writes a thread's gathered short slices one after the other from
    /// their stretch's start, the largest first.
    fn flush(&mut self, tid: u32) -> std::io::Result<()> {
        let line = self.lines.get_mut(&tid).expect("a line");
        let mut pending = std::mem::take(&mut line.pending);
        pending.sort_by_key(|(_, d)| std::cmp::Reverse(*d));
        let mut at = line.pending_start;
        for (state, dur) in pending {
            self.write_slice(tid, state, at, dur)?;
            at += dur;
        }
        Ok(())
    }

    fn write_slice(&mut self, tid: u32, state: State, start: u64, dur: u64) -> std::io::Result<()> {
        let pid = self.lines.get(&tid).map_or(0, |l| l.pid);
        let ev = json!({"ph": "X", "name": state.name(), "cat": "state", "pid": pid, "tid": tid,
            "ts": self.us(start), "dur": dur as f64 / 1e3});
        self.write(ev, start)
    }

    /// A process's file reads over an interval: one slice on its "file
    /// reads" track, named by the file read most, every file in its args.
    pub fn reads(&mut self, pid: u32, start: u64, end: u64, files: &[(String, u64)]) -> std::io::Result<()> {
        let Some((top, _)) = files.iter().max_by_key(|(_, b)| *b) else { return Ok(()) };
        let total: u64 = files.iter().map(|(_, b)| b).sum();
        // The SVG draws the job's reads, all processes together.
        let (s0, e0) = (start.saturating_sub(self.origin_ns), end.saturating_sub(self.origin_ns));
        match self.reads.last_mut() {
            Some(r) if r.0 == s0 && r.1 == e0 => r.2 += total,
            _ => self.reads.push((s0, e0, total)),
        }
        let args: serde_json::Map<String, serde_json::Value> =
            files.iter().map(|(p, b)| (p.clone(), json!(b))).collect();
        let ev = json!({"ph": "X", "name": format!("read {top}"), "cat": "reads", "pid": pid, "tid": READS_TID,
            "ts": self.us(start), "dur": end.saturating_sub(start) as f64 / 1e3,
            "args": {"bytes": total, "files": args}});
        self.write(ev, start)
    }

    /// One GPU utilization sample, as a counter.
    pub fn gpu(&mut self, index: u32, ts: u64, util_pct: f64) -> std::io::Result<()> {
        let b = self.gpus.entry(index).or_default();
        let k = (ts.saturating_sub(self.origin_ns) / SVG_BUCKET_NS) as usize;
        if b.len() <= k {
            b.resize(k + 1, (0.0, 0));
        }
        b[k].0 += util_pct;
        b[k].1 += 1;
        let ev = json!({"ph": "C", "name": format!("GPU{index} utilization %"), "pid": GPU_PID,
            "ts": self.us(ts), "args": {"utilization": util_pct}});
        self.write(ev, ts)
    }

    /// A GPU's power draw, as a counter.
    pub fn gpu_power(&mut self, index: u32, ts: u64, watts: f64) -> std::io::Result<()> {
        let ev = json!({"ph": "C", "name": format!("GPU{index} power W"), "pid": GPU_PID,
            "ts": self.us(ts), "args": {"power": watts}});
        self.write(ev, ts)
    }

    /// The verdict of an interval, as an instant event.
    pub fn verdict(&mut self, ts: u64, kind: Kind, summary: &str) -> std::io::Result<()> {
        let end = ts.saturating_sub(self.origin_ns);
        let start = self.verdicts.last().map_or(0, |v| v.1);
        if end > start {
            self.verdicts.push((start, end, kind));
        }
        let ev = json!({"ph": "i", "s": "g", "name": format!("verdict: {kind}"), "pid": GPU_PID, "tid": 0,
            "ts": self.us(ts), "args": {"summary": summary}});
        self.write(ev, ts)
    }

    /// Where the job's startup ended (monotonic ns): the SVG marks it.
    pub fn startup_end(&mut self, ts: u64) {
        self.startup_end_ns = Some(ts);
    }

    /// Per-state ns of a thread's slices (what the trace adds up to).
    pub fn sums(&self, tid: u32) -> Option<[u64; STATES]> {
        self.lines.get(&tid).map(|l| l.sums)
    }

    /// Closes every thread's last slice at `end_ns`, names the tracks,
    /// writes the metadata and ends the JSON; returns what the SVG needs.
    pub fn finish(mut self, end_ns: u64, names: &Names) -> std::io::Result<Picture> {
        let tids: Vec<u32> = self.lines.keys().copied().collect();
        for tid in &tids {
            self.close_line(*tid, end_ns)?;
            if !self.lines[tid].pending.is_empty() {
                self.flush(*tid)?;
            }
        }
        let mut meta: Vec<serde_json::Value> = vec![
            json!({"ph": "M", "name": "process_name", "pid": GPU_PID, "args": {"name": "GPUs and verdicts"}}),
            json!({"ph": "M", "name": "process_sort_index", "pid": GPU_PID, "args": {"sort_index": -1}}),
        ];
        let pids: std::collections::BTreeSet<u32> = self.lines.values().map(|l| l.pid).collect();
        for pid in &pids {
            let (name, role) = names.processes.get(pid).cloned().unwrap_or_default();
            let rank = match role.as_str() {
                "trainer" => 0,
                "worker" => 1,
                _ => 2,
            };
            meta.push(json!({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": format!("{role} {name} ({pid})")}}));
            meta.push(
                json!({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": rank}}),
            );
            meta.push(json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": READS_TID, "args": {"name": "file reads"}}));
        }
        for (tid, l) in &self.lines {
            let name = names.threads.get(tid).cloned().unwrap_or_else(|| format!("thread {tid}"));
            meta.push(
                json!({"ph": "M", "name": "thread_name", "pid": l.pid, "tid": tid, "args": {"name": name}}),
            );
        }
        for m in meta {
            self.emit(m)?;
        }
        let capped = self.capped_at.map(|ts| self.us(ts));
        let tail = json!({
            "clock": "ts is µs of CLOCK_MONOTONIC since origin_monotonic_ns (the kernel's bpf_ktime_get_ns); \
                      origin_realtime_ns is the same instant on CLOCK_REALTIME",
            "origin_monotonic_ns": self.origin_ns,
            "origin_realtime_ns": self.origin_realtime_ns,
            "resolution_us": self.resolution_ns as f64 / 1e3,
            "lost_switch_records": self.lost,
            "events": self.events,
            "capped_at_us": capped,
        });
        write!(self.out, "\n],\"metadata\":{tail}}}\n")?;
        self.out.flush()?;
        let threads = self
            .lines
            .iter()
            .map(|(tid, l)| layout::ThreadIn {
                tid: *tid,
                pid: l.pid,
                name: names.threads.get(tid).cloned().unwrap_or_else(|| format!("thread {tid}")),
                first_ns: l.first.unwrap_or(0),
                last_ns: l.last,
                on_cpu_ns: l.sums[State::OnCpu.index()],
                buckets: l.buckets.clone(),
            })
            .collect();
        let procs = pids
            .iter()
            .map(|pid| {
                let (name, role) = names.processes.get(pid).cloned().unwrap_or_default();
                let info = layout::ProcIn {
                    name,
                    role,
                    rank: names.ranks.get(pid).copied(),
                    ppid: names.parents.get(pid).copied(),
                };
                (*pid, info)
            })
            .collect();
        let mut gpus: Vec<(u32, Vec<(f64, u32)>)> = self.gpus.into_iter().collect();
        gpus.sort_by_key(|g| g.0);
        Ok(Picture {
            span_ns: end_ns.saturating_sub(self.origin_ns),
            bucket_ns: SVG_BUCKET_NS,
            groups: layout::groups(threads, &procs),
            gpus,
            reads: self.reads,
            verdicts: self.verdicts,
            startup_ns: self.startup_end_ns.map(|t| t.saturating_sub(self.origin_ns)),
        })
    }
}

/// What the SVG draws.
pub struct Picture {
    pub span_ns: u64,
    pub bucket_ns: u64,
    /// The traced threads, grouped by process, helpers folded.
    pub groups: Vec<layout::Group>,
    /// Empty: no GPU was sampled (no NVML, or `--gpu off`).
    pub gpus: Vec<(u32, Vec<(f64, u32)>)>,
    /// The job's file reads per interval: (start, end, bytes), ns since the
    /// origin.
    pub reads: Vec<(u64, u64, u64)>,
    /// The live verdict per interval: (start, end, kind), ns since the
    /// origin.
    pub verdicts: Vec<(u64, u64, Kind)>,
    /// Where the startup ended, ns since the origin.
    pub startup_ns: Option<u64>,
}

/// Spreads [start, end) (ns since the origin) over the SVG's buckets.
fn add_buckets(buckets: &mut Vec<[u32; STATES]>, state: usize, start: u64, end: u64) {
    let mut t = start;
    while t < end {
        let k = (t / SVG_BUCKET_NS) as usize;
        let bucket_end = (k as u64 + 1) * SVG_BUCKET_NS;
        let piece = end.min(bucket_end) - t;
        if buckets.len() <= k {
            buckets.resize(k + 1, [0; STATES]);
        }
        buckets[k][state] = buckets[k][state].saturating_add(piece as u32);
        t += piece;
    }
}

#[cfg(test)]
mod tests;
