//! One trainer and its workers: the rules, the words, and the threads the
//! verdict names.
use super::{classify, words, Blamed, Kind, Verdict, MAX_WORKER_LINES};
use crate::{
    aggregate::{ProcWindow, Window},
    correlate::Roles,
    gpu::GpuWindow,
    progress::ProgressView,
};

/// One trainer (the first of `roles`) and its workers.
pub(super) fn judge(w: &Window, roles: &Roles, gpus: &[GpuWindow], progress: &ProgressView) -> Verdict {
    judge_with_line(w, roles, gpus, progress).0
}

/// [`judge`], and the finding's own line (see `words::verdict`).
pub(super) fn judge_with_line(
    w: &Window,
    roles: &Roles,
    gpus: &[GpuWindow],
    progress: &ProgressView,
) -> (Verdict, String) {
    let scene = classify::Scene::of(w, roles, gpus, progress);
    let finding = classify::classify(&scene);
    let (mut v, line) = words::verdict(&scene, &finding);
    v.blamed = blamed(w, roles, v.kind);
    if let Some(trainer) = scene.trainer {
        for (pid, tid, what) in finding.named_threads(trainer.tgid) {
            if !v.blamed.iter().any(|b| b.tid == tid) {
                v.blamed.push(Blamed { pid, tid, what });
            }
        }
    }
    (v, line)
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
