//! The timeline of a `run`/`attach` session, or of one job of the daemon
//! on demand: switch records in, the job's ticks and names alongside, a
//! file (or gzip'd bytes) out.
use std::{
    io::{BufWriter, Write},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use anyhow::Result;

use super::{render_svg, Names, Timeline};
use crate::{
    aggregate::Model,
    clock::ClockSnapshot,
    correlate::Roles,
    decode::{Event, JobEvent},
    job::{GpuFleet, Report, Tick},
};

/// A failed write of the trace: named by its option and path where it has
/// them (a usage error, as when the file cannot be created).
fn failed(trace: Option<&(&'static str, PathBuf)>, e: std::io::Error) -> anyhow::Error {
    match trace {
        Some((option, path)) => crate::error::output_failed(option, path, &e).into(),
        None => anyhow::Error::new(e).context("writing the timeline"),
    }
}

/// What to write where: `--timeline out.svg` alone means the picture (a
/// JSON trace in a file named `.svg` is what nobody wants).
fn outputs<'a>(trace: Option<&'a Path>, svg: Option<&'a Path>) -> (Option<&'a Path>, Option<&'a Path>) {
    match (trace, svg) {
        (Some(t), None) if t.extension().is_some_and(|e| e.eq_ignore_ascii_case("svg")) => (None, Some(t)),
        other => other,
    }
}

pub struct Recording {
    timeline: Timeline<Box<dyn Write>>,
    /// The trace's file and the option that named it (None: in memory, or
    /// the picture alone).
    trace: Option<(&'static str, PathBuf)>,
    svg: Option<(&'static str, PathBuf)>,
}

/// Bytes written by a recording kept in memory, read once it is finished.
#[derive(Clone, Default)]
pub struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Buffer {
    pub fn take(&self) -> Vec<u8> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Recording {
    /// Creates the files (a path that cannot be written fails here, before
    /// anything is attached). `trace`: the Chrome trace, gzip'd if it ends
    /// in `.gz`; `svg`: the picture.
    pub fn create(trace: Option<&Path>, svg: Option<&Path>, origin_ns: u64) -> Result<Self> {
        let svg_from_trace = svg.is_none() && trace.is_some();
        let (trace, svg) = outputs(trace, svg);
        // Named as the user typed it: `--timeline t.svg` is the picture.
        let svg_option = if trace.is_none() && svg_from_trace { "--timeline" } else { "--timeline-svg" };
        let out: Box<dyn Write> = match trace {
            None => Box::new(std::io::sink()),
            Some(p) => {
                let f = crate::error::create_output("--timeline", p)?.file;
                if p.extension().is_some_and(|e| e == "gz") {
                    Box::new(flate2::write::GzEncoder::new(BufWriter::new(f), flate2::Compression::default()))
                } else {
                    Box::new(BufWriter::new(f))
                }
            }
        };
        if let Some(p) = svg {
            crate::error::create_output(svg_option, p)?;
        }
        let real = ClockSnapshot::now().mono_to_realtime_ns(origin_ns);
        let trace = trace.map(|p| ("--timeline", p.to_path_buf()));
        let timeline = Timeline::new(out, origin_ns, real).map_err(|e| failed(trace.as_ref(), e))?;
        Ok(Self { timeline, trace, svg: svg.map(|p| (svg_option, p.to_path_buf())) })
    }

    /// A gzip'd Chrome trace kept in memory (the daemon's capture
    /// endpoint): the bytes are in `out` once [`Recording::finish_named`]
    /// returns.
    pub fn in_memory(out: &Buffer, origin_ns: u64, max_events: u64) -> Result<Self> {
        let gz = flate2::write::GzEncoder::new(out.clone(), flate2::Compression::default());
        let real = ClockSnapshot::now().mono_to_realtime_ns(origin_ns);
        let timeline = Timeline::new(Box::new(gz) as Box<dyn Write>, origin_ns, real)?;
        let timeline = timeline.with_limits(super::DEFAULT_RESOLUTION_NS, max_events);
        Ok(Self { timeline, trace: None, svg: None })
    }

    /// Takes the switch records out of `events` (the rest is the job's;
    /// exits end their thread's last slice).
    pub fn take_switches(&mut self, events: &mut Vec<JobEvent>) -> Result<()> {
        self.take_switches_of(events, |(_, ev)| ev)
    }

    /// The same over one job's events, or anything that holds one.
    pub fn take_switches_of<T>(&mut self, events: &mut Vec<T>, event: impl Fn(&T) -> &Event) -> Result<()> {
        let mut err = Ok(());
        events.retain(|item| {
            let ev = event(item);
            let (keep, r) = match ev {
                Event::Switch(s) => (false, self.timeline.switch(s)),
                Event::Exit { ts, tid, .. } => (true, self.timeline.exit(*tid, *ts)),
                _ => (true, Ok(())),
            };
            if err.is_ok() {
                err = r;
            }
            keep
        });
        err.map_err(|e| failed(self.trace.as_ref(), e))
    }

    /// One interval: each process's file reads, the GPU samples, the verdict.
    pub fn tick(&mut self, tick: &Tick, gpus: &GpuFleet) -> Result<()> {
        let written = self.write_tick(tick, gpus);
        written.map_err(|e| failed(self.trace.as_ref(), e))
    }

    fn write_tick(&mut self, tick: &Tick, gpus: &GpuFleet) -> std::io::Result<()> {
        let w = &tick.interval;
        for p in &w.procs {
            let files: Vec<(String, u64)> =
                p.files.iter().filter(|f| f.read_bytes > 0).map(|f| (f.path.clone(), f.read_bytes)).collect();
            self.timeline.reads(p.tgid, w.start_ns, w.end_ns, &files)?;
        }
        for g in &gpus.tracks {
            for (ts, util) in g.samples(w.start_ns, w.end_ns) {
                self.timeline.gpu(g.index, ts, util)?;
            }
        }
        for g in &tick.interval_gpus {
            if let Some(watts) = g.power_w {
                self.timeline.gpu_power(g.index, w.end_ns, watts)?;
            }
        }
        // A timeline is the operator's (or a capture, served with details
        // only): every detail shown.
        self.timeline.verdict(w.end_ns, tick.verdict.kind, &tick.verdict.summary.shown())?;
        Ok(())
    }

    /// Ends an in-memory trace at `end_ns`, tracks named after what the
    /// job's model knows of its processes and threads now.
    pub fn finish_named(mut self, model: &Model, roles: &Roles, lost: u64, end_ns: u64) -> Result<()> {
        let mut names = Names::default();
        for p in model.procs.values() {
            names.processes.insert(p.tgid, (p.comm.clone(), roles.of(p.tgid).as_str().to_string()));
            names.add_family(p.tgid, p.ppid, roles.rank_number(p.tgid));
        }
        for t in model.threads.values() {
            names.threads.insert(t.tid, t.comm.clone());
        }
        self.timeline.lost = lost;
        self.timeline.finish(end_ns, &names).map_err(|e| failed(self.trace.as_ref(), e))?;
        Ok(())
    }

    /// Ends the trace at `end_ns`, tracks named after the report's roles;
    /// writes the picture.
    pub fn finish(mut self, report: &Report, end_ns: u64, title: &str) -> Result<()> {
        let mut names = Names::default();
        for p in &report.summary.procs {
            names.processes.insert(p.tgid, (p.comm.clone(), report.roles.of(p.tgid).as_str().to_string()));
            names.add_family(p.tgid, p.ppid, report.roles.rank_number(p.tgid));
            for t in &p.threads {
                names.threads.insert(t.tid, t.comm.clone());
            }
        }
        self.timeline.lost = report.summary.lost[stall_common::counter::LOST_RINGBUF as usize];
        if let Some(ts) = report.startup_end_ns {
            self.timeline.startup_end(ts);
        }
        let picture = self.timeline.finish(end_ns, &names).map_err(|e| failed(self.trace.as_ref(), e))?;
        if let Some((option, path)) = &self.svg {
            let title = format!("{title} — {}", report.verdict.kind.as_str());
            std::fs::write(path, render_svg(&picture, &title))
                .map_err(|e| crate::error::output_failed(option, path, &e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeline_named_svg_is_the_picture() {
        let (j, s) = (Path::new("t.json"), Path::new("t.svg"));
        assert_eq!(outputs(Some(s), None), (None, Some(s)));
        assert_eq!(outputs(Some(Path::new("T.SVG")), None), (None, Some(Path::new("T.SVG"))));
        assert_eq!(outputs(Some(j), None), (Some(j), None));
        assert_eq!(outputs(Some(j), Some(s)), (Some(j), Some(s)));
        assert_eq!(outputs(None, Some(s)), (None, Some(s)));
    }

    #[test]
    fn an_unwritable_picture_is_named_by_the_option_typed() {
        let bad = Path::new("/nonexistent-stall-dir/t.svg");
        let message = |trace, svg| Recording::create(trace, svg, 0).err().expect("refused").to_string();
        let typed = message(Some(bad), None);
        assert!(typed.starts_with("--timeline /nonexistent-stall-dir/t.svg: "), "{typed}");
        assert!(message(None, Some(bad)).starts_with("--timeline-svg "));
    }
}
