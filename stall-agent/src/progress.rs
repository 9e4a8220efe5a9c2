//! Is the job still moving? Utilization says a kernel was resident, not
//! that the job got anywhere: progress is what a person checks with `stat`
//! and `tail` — files read, output written (logs, checkpoints, metrics,
//! stdout). This keeps when the job last moved, its own rhythm (how long it
//! usually goes between moves), and the outputs it had open at attach with
//! their last write time, so a job hung before stall came is seen at once.
use std::collections::VecDeque;

use serde::Serialize;

use crate::{
    aggregate::{ProcWindow, Window},
    correlate::{Role, Roles},
};

/// Gaps remembered to learn the job's rhythm.
const GAPS: usize = 32;

/// An output the job writes, as last seen.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Output {
    pub path: String,
    pub pid: u32,
    /// CLOCK_MONOTONIC ns of its last write (from its mtime when that was
    /// before stall attached).
    #[serde(skip)]
    pub last_write_ns: u64,
}

#[derive(Debug, Clone, Default)]
pub struct Progress {
    start_ns: u64,
    /// When the job last moved, if it has since stall started.
    last_ns: Option<u64>,
    /// Gaps between moves, newest last.
    gaps: VecDeque<u64>,
    /// Outputs, most recently written first (a handful).
    outputs: Vec<Output>,
}

/// Progress as the verdict and the outputs see it at one moment.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ProgressView {
    /// Seconds since the job last moved: since its last read or write seen
    /// by stall, else since its newest output was written before attach,
    /// else since stall started (`known` false).
    pub silent_s: f64,
    /// Whether the silence is measured from a move (seen, or an output's
    /// mtime) rather than from stall's start.
    pub known: bool,
    /// The longest recent gap between moves while the job ran (its own
    /// rhythm), if it moved at least twice.
    pub rhythm_s: Option<f64>,
    /// The newest output and how long ago it was written.
    pub last_output: Option<OutputAge>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutputAge {
    pub path: crate::detail::PathName,
    pub pid: u32,
    pub ago_s: f64,
}

impl Progress {
    pub fn new(start_ns: u64) -> Self {
        Self { start_ns, ..Default::default() }
    }

    /// An output found at attach (a regular file open for writing, or
    /// stdout/stderr pointing to one), last written at `last_write_ns`.
    pub fn note_output(&mut self, path: &str, pid: u32, last_write_ns: u64) {
        if !is_output(path) {
            return;
        }
        self.remember(Output { path: path.to_string(), pid, last_write_ns });
    }

    fn remember(&mut self, o: Output) {
        match self.outputs.iter_mut().find(|x| x.path == o.path) {
            Some(x) => {
                if o.last_write_ns >= x.last_write_ns {
                    *x = o;
                }
            }
            None => self.outputs.push(o),
        }
        self.outputs.sort_by(|a, b| b.last_write_ns.cmp(&a.last_write_ns).then(a.path.cmp(&b.path)));
        self.outputs.truncate(8);
    }

    /// Takes one interval window: did the job move in it? Any process of
    /// the job writing a file moves it (each rank's log, whoever the
    /// trainer is taken to be); reads and writes of pipes and sockets count
    /// for the trainer and its workers only (`roles`; everyone while no
    /// trainer is known): a metrics uploader or a log shipper beside them
    /// sends whether or not training moves.
    pub fn observe(&mut self, w: &Window, roles: &Roles) {
        let counts = |tgid: u32| roles.trainers.is_empty() || roles.of(tgid) != Role::Other;
        let mut wrote = false;
        for p in &w.procs {
            for f in p.files.iter().filter(|f| f.write_bytes > 0 && is_output(&f.path)) {
                self.remember(Output { path: f.path.clone(), pid: p.tgid, last_write_ns: w.end_ns });
                wrote = true;
            }
        }
        if wrote || w.procs.iter().filter(|p| counts(p.tgid)).any(ProcWindow::moved) {
            self.moved_at(w.end_ns);
        }
    }

    /// The job moved by `ts` (seen some other way: its /proc I/O counters).
    pub fn moved_at(&mut self, ts: u64) {
        if let Some(last) = self.last_ns {
            if ts <= last {
                return;
            }
            if self.gaps.len() == GAPS {
                self.gaps.pop_front();
            }
            self.gaps.push_back(ts - last);
        }
        self.last_ns = Some(ts);
    }

    pub fn view(&self, now_ns: u64) -> ProgressView {
        let newest_output = self.outputs.first();
        let (since, known) = match (self.last_ns, newest_output) {
            (Some(t), _) => (t, true),
            (None, Some(o)) => (o.last_write_ns, true),
            (None, None) => (self.start_ns, false),
        };
        ProgressView {
            silent_s: now_ns.saturating_sub(since) as f64 / 1e9,
            known,
            rhythm_s: self.gaps.iter().max().map(|g| *g as f64 / 1e9),
            last_output: newest_output.map(|o| OutputAge {
                path: o.path.as_str().into(),
                pid: o.pid,
                ago_s: now_ns.saturating_sub(o.last_write_ns) as f64 / 1e9,
            }),
        }
    }
}

/// A file that says the job got somewhere (a log, a checkpoint), not a
/// kernel interface it writes to (a cgroup's procs, a /proc knob).
pub fn is_output(path: &str) -> bool {
    !crate::aggregate::is_kernel_file(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::{FileWindow, ThreadWindow};
    use crate::decode::ThreadCounters;

    const S: u64 = 1_000_000_000;

    fn window(end_s: u64, read: u64, written_to: Option<&str>) -> Window {
        let files = written_to
            .map(|p| {
                vec![FileWindow { path: p.into(), write_bytes: 100, write_calls: 1, ..Default::default() }]
            })
            .unwrap_or_default();
        let delta = ThreadCounters { file_read_bytes: read, ..Default::default() };
        Window {
            start_ns: (end_s - 1) * S,
            end_ns: end_s * S,
            procs: vec![ProcWindow {
                tgid: 7,
                alive: true,
                threads: vec![ThreadWindow { tid: 7, delta, ..Default::default() }],
                files,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn silence_is_counted_from_the_last_move_and_the_rhythm_learnt() {
        let mut p = Progress::new(0);
        for s in 1..=9 {
            // A log line every 3 s, nothing else.
            p.observe(&window(s, 0, (s % 3 == 0).then_some("/run/train.log")), &Roles::default());
        }
        let v = p.view(20 * S);
        assert!(v.known);
        assert!((v.silent_s - 11.0).abs() < 1e-9, "{v:?}");
        assert_eq!(v.rhythm_s, Some(3.0));
        let out = v.last_output.unwrap();
        assert_eq!((out.path.value(), out.pid), ("/run/train.log", 7));
        assert!((out.ago_s - 11.0).abs() < 1e-9);
    }

    #[test]
    fn an_output_written_before_attach_dates_the_silence() {
        let mut p = Progress::new(600 * S);
        p.note_output("/run/train.log", 7, 120 * S);
        p.note_output("/run/older.log", 7, 60 * S);
        for s in 601..=610 {
            p.observe(&window(s, 0, None), &Roles::default());
        }
        let v = p.view(610 * S);
        assert!(v.known && v.rhythm_s.is_none());
        assert!((v.silent_s - 490.0).abs() < 1e-9, "{v:?}");
        assert_eq!(v.last_output.unwrap().path.value(), "/run/train.log");
    }

    #[test]
    fn a_log_written_by_any_process_of_the_job_is_progress() {
        // The roles took another process for the trainer (a launcher of
        // ranks no variable names): the ranks' logs still move the job.
        let mut both = window(1, 0, None);
        both.procs.push(ProcWindow { tgid: 1, alive: true, ..Default::default() });
        let roles = crate::correlate::assign(&both, &[1].into(), None);
        assert_eq!((roles.trainers.as_slice(), roles.of(7)), ([1].as_slice(), Role::Other));
        let mut p = Progress::new(0);
        for s in 1..=6 {
            p.observe(&window(s, 0, Some("/run/rank3.log")), &roles);
        }
        let v = p.view(6 * S);
        assert!(v.known && v.silent_s < 1e-9, "{v:?}");
        assert_eq!(v.rhythm_s, Some(1.0));
        // Its reads alone, outside the trainer and its workers, are not.
        let mut q = Progress::new(0);
        q.observe(&window(1, 4096, None), &roles);
        assert!(!q.view(S).known);
    }

    #[test]
    fn without_any_move_or_output_silence_runs_from_the_start_unknown() {
        let mut p = Progress::new(5 * S);
        p.observe(&window(6, 0, None), &Roles::default());
        let v = p.view(9 * S);
        assert!(!v.known);
        assert!((v.silent_s - 4.0).abs() < 1e-9);
        // Reads are moves too.
        p.observe(&window(10, 4096, None), &Roles::default());
        assert!(p.view(10 * S).silent_s < 1e-9);
    }
}
