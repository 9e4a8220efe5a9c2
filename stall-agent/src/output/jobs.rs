//! The daemon's `/jobs`: per job, what metric labels cannot carry — its
//! verdict with evidence, progress, processes and the files it reads most.
use serde::Serialize;

use crate::{aggregate::Window, progress::ProgressView, verdict::Verdict};

/// One job as `/jobs` shows it.
pub struct JobView<'a> {
    pub job: &'a str,
    pub cgroup: String,
    pub pod: &'a str,
    pub container: &'a str,
    pub verdict: Option<&'a Verdict>,
    pub progress: Option<&'a ProgressView>,
    pub processes: usize,
    /// The window the files are from (the last few seconds).
    pub recent: Option<&'a Window>,
    pub gpus: Vec<u32>,
}

#[derive(Serialize)]
struct JobDoc<'a> {
    job: &'a str,
    cgroup: &'a str,
    pod: &'a str,
    container: &'a str,
    verdict: Option<&'a Verdict>,
    progress: Option<&'a ProgressView>,
    processes: usize,
    top_files: Vec<FileDoc>,
    gpus: &'a [u32],
}

#[derive(Serialize)]
struct FileDoc {
    pid: u32,
    path: String,
    read_bytes: u64,
    read_calls: u64,
    mb_per_s: f64,
}

/// The JSON array `/jobs` serves; `interval` is the shortest span rates
/// are over.
pub fn render(jobs: &[JobView], interval_s: f64) -> String {
    let empty = Window::default();
    let docs: Vec<JobDoc> = jobs
        .iter()
        .map(|j| {
            let w = j.recent.unwrap_or(&empty);
            let secs = w.secs().max(interval_s);
            let files: Vec<FileDoc> = w
                .files_by_bytes()
                .into_iter()
                .take(10)
                .map(|(pid, f)| FileDoc {
                    pid,
                    path: f.path.clone(),
                    read_bytes: f.read_bytes,
                    read_calls: f.read_calls,
                    mb_per_s: f.read_bytes as f64 / 1e6 / f.rate_secs(secs),
                })
                .collect();
            JobDoc {
                job: j.job,
                cgroup: &j.cgroup,
                pod: j.pod,
                container: j.container,
                verdict: j.verdict,
                progress: j.progress,
                processes: j.processes,
                top_files: files,
                gpus: &j.gpus,
            }
        })
        .collect();
    serde_json::to_string(&docs).unwrap_or_else(|_| "[]".into())
}
