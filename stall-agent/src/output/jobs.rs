//! The daemon's `/jobs`: per job, what metric labels cannot carry. Each job
//! is the JSON Lines record of its last few seconds (docs/JSON.md, same
//! fields and units) with its identity beside it; the list carries the
//! schema, the node and the time. Without details, file paths, command
//! lines and Python stacks are left out (see [`redact`]).
use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::{json as jsonl, View};
use crate::{job::Tick, verdict::Verdict};

/// One job as `/jobs` shows it.
pub struct JobView<'a> {
    /// Stable: the same cgroup gets the same id after a restart.
    pub id: String,
    /// Its cgroup, relative to the cgroup mount.
    pub cgroup: &'a str,
    /// Its names in the cluster, where it has them.
    pub namespace: &'a str,
    pub pod: &'a str,
    pub container: &'a str,
    pub pod_uid: &'a str,
    pub slurm_job: &'a str,
    /// The pod's allow-listed labels.
    pub pod_labels: &'a BTreeMap<String, String>,
    /// `cheap`, `full` or `cooldown` (the daemon's capture tiers).
    pub tier: &'static str,
    /// The verdict published for it (may be older than its tick).
    pub verdict: Option<&'a Verdict>,
    /// Its last interval, if it had one.
    pub tick: Option<&'a Tick>,
}

/// A job's document, whole.
pub fn job(j: &JobView) -> Value {
    let mut doc = match (j.tick, j.verdict) {
        (Some(tick), Some(verdict)) => {
            let view = View {
                window: &tick.recent,
                roles: &tick.roles,
                gpus: &tick.gpus,
                verdict,
                elapsed_s: tick.elapsed_s,
                target: j.cgroup,
                gpu_note: None,
                progress: &tick.progress,
                startup_s: None,
                syscall_backend: None,
                gpu_probes: None,
                mmap_hooks: None,
                switch_reads: None,
                exit_status: None,
                unreadable_threads: None,
                starting_up: false,
            };
            serde_json::to_value(jsonl::record("job", &view)).unwrap_or_default()
        }
        _ => json!({"type": "job", "schema": jsonl::SCHEMA, "target": j.cgroup, "verdict": null}),
    };
    if let Value::Object(m) = &mut doc {
        m.insert("id".into(), j.id.clone().into());
        m.insert("cgroup".into(), j.cgroup.into());
        m.insert("namespace".into(), j.namespace.into());
        m.insert("pod".into(), j.pod.into());
        m.insert("container".into(), j.container.into());
        m.insert("pod_uid".into(), j.pod_uid.into());
        m.insert("slurm_job".into(), j.slurm_job.into());
        m.insert("pod_labels".into(), json!(j.pod_labels));
        m.insert("tier".into(), j.tier.into());
    }
    doc
}

/// The list `/jobs` serves.
pub fn list(node: &str, time_s: f64, jobs: Vec<Value>) -> Value {
    json!({"schema": jsonl::SCHEMA, "node": node, "time": time_s, "jobs": jobs})
}

/// A job's id: its cgroup path hashed (FNV-1a, 64 bits), so an alert's
/// cgroup label leads to the same id on every scrape and after restarts.
pub fn id(cgroup: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in cgroup.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Leaves out of a document what tells about the job's data and code
/// rather than its health: file paths (`path`, `resolved`, `[path]` in
/// verdict and progress lines), command lines and Python stacks. Numbers,
/// names of threads and the verdict's kind and words stay.
pub fn redact(doc: &mut Value) {
    redact_in(doc, false);
}

fn redact_in(v: &mut Value, text: bool) {
    match v {
        Value::Object(m) => redact_map(m, text),
        Value::Array(a) => a.iter_mut().for_each(|x| redact_in(x, text)),
        Value::String(s) if text => *s = redact_paths(s),
        _ => {}
    }
}

fn redact_map(m: &mut Map<String, Value>, text: bool) {
    m.remove("python_stacks");
    m.remove("python_notes");
    for (k, v) in m.iter_mut() {
        match k.as_str() {
            "cmdline" | "path" | "resolved" => *v = Value::Null,
            // Lines written for people name files: inside these, any string.
            "verdict" | "progress" | "history" => redact_in(v, true),
            _ if k.ends_with("cgroup") => {}
            _ => redact_in(v, text),
        }
    }
}

/// `[path]` for every absolute path in a line of text: a `/` that starts a
/// word (after a space, a bracket or a quote) up to the next space or
/// closing punctuation. "MB/s" and "1/2" stay.
pub fn redact_paths(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    let mut prev: Option<char> = None;
    while let Some(c) = chars.next() {
        let starts_word = prev.is_none_or(|p| p.is_whitespace() || "([{\"'=,:".contains(p));
        if c == '/' && starts_word {
            let mut path = String::from(c);
            while let Some(n) = chars.next_if(|n| !n.is_whitespace() && !")]}\"',;".contains(*n)) {
                path.push(n);
            }
            // A colon or full stop that ends the word ends the sentence.
            let kept = path.trim_end_matches([':', '.']).len();
            out.push_str("[path]");
            out.push_str(&path[kept..]);
            prev = Some(']');
            continue;
        }
        out.push(c);
        prev = Some(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_in_lines_are_redacted_and_rates_stay() {
        assert_eq!(
            redact_paths(
                "workers read 1.1 GB at 29.8 MB/s from /data/shard_2.pt (/runs/train.log written 3 s ago)"
            ),
            "workers read 1.1 GB at 29.8 MB/s from [path] ([path] written 3 s ago)"
        );
        assert_eq!(redact_paths("files: /a b, /c; 1/2"), "files: [path] b, [path]; 1/2");
        assert_eq!(redact_paths("no paths here"), "no paths here");
    }

    #[test]
    fn a_document_keeps_numbers_and_loses_paths_command_lines_and_stacks() {
        let mut doc = json!({
            "id": "ab", "cgroup": "/kubepods.slice/x",
            "processes": [{"pid": 1, "cmdline": "python train.py --secret", "cpu_limit_cgroup": "/x",
                "files": [{"path": "/data/a", "resolved": "/mnt/a", "read_bytes": 5}]}],
            "progress": {"silent_s": 1.0, "last_output": {"path": "/runs/log", "ago_s": 3.0}},
            "verdict": {"kind": "input-io-bound", "summary": "read /data/a at 5 MB/s",
                "evidence": ["file /data/a: 5 B"], "python_stacks": [{"frames": []}]},
        });
        redact(&mut doc);
        assert_eq!(doc["cgroup"], "/kubepods.slice/x");
        assert_eq!(doc["processes"][0]["cpu_limit_cgroup"], "/x");
        assert!(doc["processes"][0]["cmdline"].is_null());
        assert!(doc["processes"][0]["files"][0]["path"].is_null());
        assert!(doc["processes"][0]["files"][0]["resolved"].is_null());
        assert_eq!(doc["processes"][0]["files"][0]["read_bytes"], 5);
        assert!(doc["progress"]["last_output"]["path"].is_null());
        assert_eq!(doc["verdict"]["summary"], "read [path] at 5 MB/s");
        assert_eq!(doc["verdict"]["evidence"][0], "file [path]: 5 B");
        assert!(doc["verdict"].get("python_stacks").is_none());
        assert!(!doc.to_string().contains("/data"), "{doc}");
    }

    #[test]
    fn ids_are_stable_and_differ_by_cgroup() {
        assert_eq!(id("/kubepods.slice/a"), id("/kubepods.slice/a"));
        assert_ne!(id("/kubepods.slice/a"), id("/kubepods.slice/b"));
        assert_eq!(id("").len(), 16);
    }
}
