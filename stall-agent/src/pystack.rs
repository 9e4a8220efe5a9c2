//! Where in Python: the stacks of the threads a verdict blames, read from
//! the target's memory with py-spy (as `py-spy dump --nonblocking` does:
//! the process is never paused; a stack read while it runs can be slightly
//! inconsistent). Needs what `process_vm_readv` needs (root, or
//! CAP_SYS_PTRACE); works across mount namespaces (py-spy reads the
//! interpreter through /proc/PID/root).
use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use serde::Serialize;

use crate::contain::contained;

/// One Python frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PyFrame {
    pub function: String,
    /// As py-spy shortens it (relative to its sys.path entry), else whole.
    pub file: String,
    pub line: i32,
    /// Not the interpreter's nor an installed package's: the job's own code.
    pub own: bool,
}

/// A thread's Python stack, innermost frame first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PyStack {
    pub pid: u32,
    pub tid: u32,
    /// The thread's role in the verdict ("trainer main thread", "worker").
    pub what: String,
    pub frames: Vec<PyFrame>,
}

impl PyFrame {
    /// A library entry point a stack is read for: the DataLoader handing
    /// out a batch, a collective, a checkpoint being saved or loaded.
    fn is_landmark(&self) -> bool {
        let name = self.function.rsplit('.').next().unwrap_or(&self.function);
        (self.file.contains("torch/utils/data/") && name == "__next__")
            || self.file.contains("torch/distributed/")
            || (self.file.contains("torch/serialization.py") && matches!(name, "save" | "load"))
            || COLLECTIVES.contains(&name)
    }
}

/// Functions that are a collective of a distributed run, whatever library
/// defines them (torch.distributed's, or a job's own over sockets).
const COLLECTIVES: [&str; 9] = [
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "barrier",
    "monitored_barrier",
    "all_to_all",
];

/// The main thread of a process multiprocessing spawned, as read to tell
/// what it runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MainThread {
    /// Innermost first.
    pub frames: Vec<PyFrame>,
    /// The index `torch.multiprocessing.spawn`'s wrapper was given (its
    /// argument `i`), where a frame is the wrapper and its arguments could
    /// be read.
    pub spawn_index: Option<u32>,
}

/// Whether a process multiprocessing spawned runs
/// `torch.multiprocessing.spawn`'s wrapper (`_wrap(fn, i, ...)`): Some(true)
/// when a frame is the wrapper, Some(false) when the process runs another
/// target (its `BaseProcess._bootstrap` has started one), None while it is
/// still unpickling its target.
pub fn runs_torch_spawn(frames: &[PyFrame]) -> Option<bool> {
    let named = |f: &PyFrame, in_file: &str, name: &str| named(&f.file, &f.function, in_file, name);
    if frames.iter().any(|f| is_torch_spawn_wrapper(&f.file, &f.function)) {
        return Some(true);
    }
    frames.iter().any(|f| named(f, "multiprocessing/process.py", "_bootstrap")).then_some(false)
}

fn named(file: &str, function: &str, in_file: &str, name: &str) -> bool {
    file.contains(in_file) && function.rsplit('.').next() == Some(name)
}

fn is_torch_spawn_wrapper(file: &str, function: &str) -> bool {
    named(file, function, "torch/multiprocessing/spawn.py", "_wrap")
}

impl PyStack {
    /// Whether the thread waits inside a collective of a distributed run
    /// (any frame in torch.distributed, or a collective by its name).
    pub fn in_collective(&self) -> bool {
        self.frames.iter().any(|f| {
            let name = f.function.rsplit('.').next().unwrap_or(&f.function);
            f.file.contains("torch/distributed/") || COLLECTIVES.contains(&name)
        })
    }

    /// "Event.wait (threading.py:629) ← train_step (train.py:29)": the
    /// innermost frames down to the first of the job's own code, and
    /// between them the library call the job made that people look for
    /// (`_BaseDataLoaderIter.__next__`, a `torch.distributed` collective,
    /// `torch.save`), where there is one.
    pub fn line(&self) -> String {
        let own = self.frames.iter().position(|f| f.own);
        let mut shown: Vec<usize> = (0..self.frames.len().min(2)).collect();
        if let Some(i) = own.filter(|i| *i >= 2) {
            // The outermost landmark: the call the job's own code made.
            if let Some(l) = (2..i).rev().find(|l| self.frames[*l].is_landmark()) {
                shown.push(l);
            }
            shown.push(i);
        }
        let mut parts = Vec::new();
        for (n, &i) in shown.iter().enumerate() {
            if n > 0 && i > shown[n - 1] + 1 {
                parts.push("…".to_string());
            }
            let f = &self.frames[i];
            parts.push(format!("{} ({}:{})", f.function, f.file, f.line));
        }
        parts.join(" ← ")
    }
}

/// Reads Python stacks, keeping one reader per process (finding the
/// interpreter is the costly part) and bounding how often and how long.
pub struct PyStacks {
    spies: HashMap<u32, py_spy::PythonSpy>,
    /// Why a process's stacks cannot be read (told once).
    notes: HashMap<u32, String>,
    /// Reads in a row that failed, by process, until one succeeds.
    failed_reads: HashMap<u32, u32>,
    last: Option<Instant>,
}

/// Tries of one read: the interpreter is read while it runs, and a thread
/// that starts or ends meanwhile (a queue's feeder) can spoil a try.
const TRIES: usize = 3;
/// Reads in a row that fail before a process is given up (its note kept,
/// never tried again): a race spoils one read, not several.
const FAILED_READS: u32 = 3;

/// At most one live read per this long.
pub const LIVE_EVERY: Duration = Duration::from_secs(5);

impl Default for PyStacks {
    fn default() -> Self {
        Self::new()
    }
}

impl PyStacks {
    pub fn new() -> Self {
        Self { spies: HashMap::new(), notes: HashMap::new(), failed_reads: HashMap::new(), last: None }
    }

    /// Whether a live read is due: at most one per `every` (the live
    /// view's is [`LIVE_EVERY`]).
    pub fn due(&self, every: Duration) -> bool {
        self.last.is_none_or(|t| t.elapsed() >= every)
    }

    /// The stacks of `threads` (pid, tid, what), and one note per process
    /// whose stacks cannot be read.
    pub fn read(&mut self, threads: &[(u32, u32, String)]) -> (Vec<PyStack>, Vec<String>) {
        self.last = Some(Instant::now());
        let mut by_pid: HashMap<u32, Vec<(u32, &str)>> = HashMap::new();
        for (pid, tid, what) in threads {
            by_pid.entry(*pid).or_default().push((*tid, what.as_str()));
        }
        let mut pids: Vec<u32> = by_pid.keys().copied().collect();
        pids.sort_unstable();
        let (mut stacks, mut notes) = (Vec::new(), Vec::new());
        for pid in pids {
            match self.traces(pid) {
                Ok(traces) => {
                    for &(tid, what) in &by_pid[&pid] {
                        let t =
                            traces.iter().find(|t| t.os_thread_id == Some(u64::from(tid))).or_else(|| {
                                // Before Python 3.11 py-spy cannot name OS threads
                                // (without libunwind): a lone thread is the one.
                                (traces.len() == 1 && tid == pid).then(|| &traces[0])
                            });
                        if let Some(t) = t {
                            stacks.push(PyStack { pid, tid, what: what.to_string(), frames: frames(t) });
                        }
                    }
                }
                Err(note) if note.is_empty() => {}
                Err(note) => notes.push(note),
            }
        }
        (stacks, notes)
    }

    /// The main thread, to tell what a process runs. A failure is not
    /// remembered: a process just started may not show its interpreter yet.
    pub fn main_thread(&mut self, pid: u32) -> Option<MainThread> {
        // The frames' arguments are read for the wrapper's index; every
        // other value read is dropped here, never kept nor shown
        // (arguments can hold secrets).
        let traces = self.traces_with(pid, true);
        self.notes.remove(&pid);
        let traces = traces.ok()?;
        let main = traces
            .iter()
            .find(|t| t.os_thread_id == Some(u64::from(pid)))
            .or_else(|| (traces.len() == 1).then(|| &traces[0]))?;
        let spawn_index =
            main.frames.iter().find(|f| is_torch_spawn_wrapper(&f.filename, &f.name)).and_then(|f| {
                f.locals.as_ref()?.iter().find(|l| l.arg && l.name == "i")?.repr.as_ref()?.parse().ok()
            });
        Some(MainThread { frames: frames(main), spawn_index })
    }

    fn traces(&mut self, pid: u32) -> Result<Vec<py_spy::StackTrace>, String> {
        self.traces_with(pid, false)
    }

    /// `arguments`: with each frame's arguments and locals, formatted.
    fn traces_with(&mut self, pid: u32, arguments: bool) -> Result<Vec<py_spy::StackTrace>, String> {
        if let Some(n) = self.notes.get(&pid) {
            return Err(n.clone());
        }
        if let std::collections::hash_map::Entry::Vacant(slot) = self.spies.entry(pid) {
            let config = py_spy::Config {
                blocking: py_spy::config::LockingStrategy::NonBlocking,
                native: false,
                ..Default::default()
            };
            match contained(|| py_spy::PythonSpy::new(pid as py_spy::Pid, &config)) {
                Ok(Ok(spy)) => {
                    slot.insert(spy);
                }
                Ok(Err(e)) => return Err(self.note(pid, &e.to_string())),
                Err(panicked) => return Err(self.note(pid, &panicked)),
            }
        }
        let spy = self.spies.get_mut(&pid).expect("inserted above");
        spy.config.dump_locals = u64::from(arguments);
        let mut error = String::new();
        for _ in 0..TRIES {
            match contained(|| spy.get_stack_traces()) {
                Ok(Ok(traces)) => {
                    self.failed_reads.remove(&pid);
                    return Ok(traces);
                }
                Ok(Err(e)) => error = e.to_string(),
                Err(panicked) => {
                    // A reader that panicked may hold a torn view of the
                    // interpreter: the next read starts from a new one.
                    self.spies.remove(&pid);
                    let note = self.note(pid, &panicked);
                    self.notes.remove(&pid);
                    return Err(note);
                }
            }
        }
        let failed = self.failed_reads.entry(pid).or_default();
        *failed += 1;
        if *failed < FAILED_READS {
            // Said for this read only: the next may succeed.
            let note = self.note(pid, &error);
            self.notes.remove(&pid);
            return Err(note);
        }
        self.spies.remove(&pid);
        Err(self.note(pid, &error))
    }

    /// The note for a process whose stacks cannot be read (remembered: it
    /// is not tried again), or "" for one that has ended.
    fn note(&mut self, pid: u32, error: &str) -> String {
        // Ended (or ending: a zombie): no stack to show, no note needed.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat.rfind(')').and_then(|i| stat[i + 1..].trim_start().chars().next());
        if state.is_none_or(|s| s == 'Z' || s == 'X') {
            return String::new();
        }
        let note = format!("Python stacks of pid {pid}: {}", why_not(pid, error));
        self.notes.insert(pid, note.clone());
        note
    }

    /// Forgets processes that are gone.
    pub fn retain(&mut self, alive: impl Fn(u32) -> bool) {
        self.spies.retain(|p, _| alive(*p));
        self.notes.retain(|p, _| alive(*p));
        self.failed_reads.retain(|p, _| alive(*p));
    }
}

/// Why `pid`'s stacks cannot be read, in words a person can act on, from
/// py-spy's `error`.
fn why_not(pid: u32, error: &str) -> String {
    if error.contains("Permission denied") || error.contains("Operation not permitted") {
        return "permission denied (needs root or CAP_SYS_PTRACE, and no seccomp or LSM policy against \
                reading another process's memory)"
            .into();
    }
    match std::fs::read_link(format!("/proc/{pid}/exe")) {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            "permission denied (needs root or CAP_SYS_PTRACE)".into()
        }
        Ok(path) => {
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if name.starts_with("python") {
                format!("{name}: {}", one_line(error))
            } else {
                format!("not a Python process ({name})")
            }
        }
        Err(_) => one_line(error),
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn frames(t: &py_spy::StackTrace) -> Vec<PyFrame> {
    t.frames
        .iter()
        .map(|f| PyFrame {
            function: f.name.clone(),
            file: f.short_filename.clone().unwrap_or_else(|| f.filename.clone()),
            line: f.line,
            own: is_own(&f.filename),
        })
        .collect()
}

/// The job's own code: not the standard library, not an installed package,
/// not frozen or generated.
fn is_own(filename: &str) -> bool {
    !(filename.starts_with('<')
        || filename.contains("/site-packages/")
        || filename.contains("/dist-packages/")
        || filename.contains("/lib/python3")
        || filename.contains("/lib64/python3")
        || filename.contains("/lib/python2"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(function: &str, file: &str, line: i32) -> PyFrame {
        PyFrame { function: function.into(), file: file.into(), line, own: is_own(file) }
    }

    #[test]
    fn the_line_shows_the_innermost_frames_and_the_jobs_own() {
        let s = PyStack {
            pid: 1,
            tid: 1,
            what: "trainer main thread".into(),
            frames: vec![
                f("wait", "/usr/lib/python3.11/threading.py", 327),
                f("wait", "/usr/lib/python3.11/threading.py", 629),
                f("_get_data", "/opt/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", 1295),
                f("train_step", "/home/me/train.py", 29),
                f("<module>", "/home/me/train.py", 40),
            ],
        };
        assert_eq!(
            s.line(),
            "wait (/usr/lib/python3.11/threading.py:327) ← wait (/usr/lib/python3.11/threading.py:629) ← … ← \
             train_step (/home/me/train.py:29)"
        );
        let short = PyStack { frames: s.frames[3..].to_vec(), ..s.clone() };
        assert_eq!(short.line(), "train_step (/home/me/train.py:29) ← <module> (/home/me/train.py:40)");
    }

    #[test]
    fn the_line_keeps_the_library_call_the_job_made() {
        let dl = "/opt/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py";
        let s = PyStack {
            pid: 1,
            tid: 1,
            what: "trainer main thread".into(),
            frames: vec![
                f("_PollLikeSelector.select", "/usr/lib/python3.11/selectors.py", 415),
                f("wait", "/usr/lib/python3.11/multiprocessing/connection.py", 947),
                f("_poll", "/usr/lib/python3.11/multiprocessing/connection.py", 440),
                f("_get_data", dl, 1295),
                f("_next_data", dl, 1441),
                f("_BaseDataLoaderIter.__next__", dl, 725),
                f("main", "/home/me/train.py", 130),
            ],
        };
        assert_eq!(
            s.line(),
            format!(
                "_PollLikeSelector.select (/usr/lib/python3.11/selectors.py:415) ← \
                 wait (/usr/lib/python3.11/multiprocessing/connection.py:947) ← … ← \
                 _BaseDataLoaderIter.__next__ ({dl}:725) ← main (/home/me/train.py:130)"
            )
        );
        // Several torch.distributed frames: the outermost, the call the job
        // made (here right after the innermost two: nothing elided).
        let c10d = "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py";
        let s = PyStack {
            frames: vec![
                f("Work.wait", "/usr/lib/python3.11/threading.py", 0),
                f("all_reduce", c10d, 2800),
                f("wrapper", "/opt/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", 81),
                f("train_step", "/home/me/train.py", 12),
            ],
            ..s
        };
        assert_eq!(
            s.line(),
            format!(
                "Work.wait (/usr/lib/python3.11/threading.py:0) ← all_reduce ({c10d}:2800) ← \
                 wrapper (/opt/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py:81) ← \
                 train_step (/home/me/train.py:12)"
            )
        );
    }

    #[test]
    fn a_spawned_rank_runs_torchs_wrapper() {
        let bootstrap = [
            f("BaseProcess.run", "multiprocessing/process.py", 108),
            f("BaseProcess._bootstrap", "multiprocessing/process.py", 314),
            f("_main", "multiprocessing/spawn.py", 135),
            f("spawn_main", "multiprocessing/spawn.py", 122),
            f("<module>", "<string>", 1),
        ];
        let with = |inner: &[PyFrame]| -> Vec<PyFrame> { inner.iter().chain(&bootstrap).cloned().collect() };
        let rank = with(&[f("train", "/job/train.py", 30), f("_wrap", "torch/multiprocessing/spawn.py", 90)]);
        assert_eq!(runs_torch_spawn(&rank), Some(true));
        let worker = with(&[f("_worker_loop", "torch/utils/data/_utils/worker.py", 300)]);
        assert_eq!(runs_torch_spawn(&worker), Some(false));
        // Still importing what it was told to run.
        let unpickling = [f("_find_and_load", "<frozen importlib._bootstrap>", 1360), bootstrap[2].clone()];
        assert_eq!(runs_torch_spawn(&unpickling), None);
        // A function of the job's own named `_wrap` is not torch's.
        assert_eq!(runs_torch_spawn(&with(&[f("_wrap", "/job/train.py", 3)])), Some(false));
    }

    #[test]
    fn a_non_python_process_gets_one_note() {
        let mut p = PyStacks::new();
        let me = std::process::id();
        let (stacks, notes) = p.read(&[(me, me, "trainer main thread".into())]);
        assert!(stacks.is_empty());
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].starts_with(&format!("Python stacks of pid {me}: ")), "{notes:?}");
        // Asked again, the same note, without trying again.
        let (_, again) = p.read(&[(me, me, "x".into())]);
        assert_eq!(again, notes);
    }
}
