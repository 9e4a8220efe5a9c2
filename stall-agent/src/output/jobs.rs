//! The daemon's `/jobs`: per job, what metric labels cannot carry. Each job
//! is the JSON Lines record of its last few seconds (docs/JSON.md, same
//! fields and units) with its identity beside it; the list carries the
//! schema, the node and the time. Without details, what the job's
//! processes named and Python stacks are left out (see [`redact`]).
use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::{json as jsonl, View};
use crate::{detail, job::Tick, verdict::Verdict};

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
                ending: None,
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

/// The list `/jobs` serves; `not_watched`: how many cgroups under the
/// roots are not jobs, and why (a count and a reason, no names).
pub fn list(node: &str, time_s: f64, jobs: Vec<Value>, not_watched: Option<(usize, String)>) -> Value {
    let (count, why) = not_watched.map_or((0, None), |(n, why)| (n, Some(why)));
    json!({
        "schema": jsonl::SCHEMA,
        "node": node,
        "time": time_s,
        "jobs": jobs,
        "not_watched": {"cgroups": count, "why": why},
    })
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

/// A document as whoever reached the daemon without details sees it:
/// every detail the job's processes named (paths, command lines, names,
/// peers, environment values: [`crate::detail`]) is a placeholder wherever
/// it went, fields and words alike; the fields that are nothing but one
/// are null, and Python stacks are left out. Numbers, kinds, roles and
/// the cluster's own names (cgroups, pods) stay.
pub fn redact(doc: &mut Value) {
    forget_fields(doc);
    detail::resolve_json(doc, detail::redact);
}

/// A document as an authenticated client of a daemon run with
/// `--expose-details` sees it: every detail's value.
pub fn reveal(doc: &mut Value) {
    detail::resolve_json(doc, detail::reveal);
}

/// Per `details`: [`reveal`] or [`redact`].
pub fn resolve(doc: &mut Value, details: bool) {
    if details {
        reveal(doc)
    } else {
        redact(doc)
    }
}

fn forget_fields(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.remove("python_stacks");
            m.remove("python_notes");
            for (k, v) in m.iter_mut() {
                match k.as_str() {
                    // A field that is nothing but a name (not the verdict's
                    // `path` of steps, whose objects are redacted in place).
                    "cmdline" | "path" | "resolved" if v.is_string() => *v = Value::Null,
                    _ => forget_fields(v),
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(forget_fields),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_keeps_numbers_and_loses_what_the_job_named() {
        use crate::detail::{Command, Name, PathName};
        let data = PathName::from("/data/a");
        let mut doc = json!({
            "id": "ab", "cgroup": "/kubepods.slice/x",
            "processes": [{"pid": 1, "comm": Name::from("pt_data_worker"), "cmdline": Command::from("python train.py --secret"),
                "cpu_limit_cgroup": "/x",
                "files": [{"path": data, "resolved": PathName::from("/mnt/a"), "read_bytes": 5}]}],
            "progress": {"silent_s": 1.0, "last_output": {"path": PathName::from("/runs/log"), "ago_s": 3.0}},
            "verdict": {"kind": "input-io-bound", "summary": format!("read {data} at 5 MB/s"),
                "path": [{"who": "trainer main thread", "object": format!("the lock on {}", PathName::from("/x.lock"))}],
                "evidence": [format!("file {data}: 5 B")], "python_stacks": [{"frames": []}]},
        });
        let mut shown = doc.clone();
        redact(&mut doc);
        assert_eq!(doc["cgroup"], "/kubepods.slice/x");
        assert_eq!(doc["processes"][0]["cpu_limit_cgroup"], "/x");
        assert!(doc["processes"][0]["cmdline"].is_null());
        assert_eq!(doc["processes"][0]["comm"], "[name]");
        assert!(doc["processes"][0]["files"][0]["path"].is_null());
        assert!(doc["processes"][0]["files"][0]["resolved"].is_null());
        assert_eq!(doc["processes"][0]["files"][0]["read_bytes"], 5);
        assert!(doc["progress"]["last_output"]["path"].is_null());
        assert_eq!(doc["verdict"]["summary"], "read [path] at 5 MB/s");
        assert_eq!(doc["verdict"]["evidence"][0], "file [path]: 5 B");
        assert!(doc["verdict"].get("python_stacks").is_none());
        // The path the verdict followed stays, its objects redacted.
        assert_eq!(doc["verdict"]["path"][0]["object"], "the lock on [path]");
        for secret in ["/data", "/mnt", "secret", "pt_data_worker", "/runs"] {
            assert!(!doc.to_string().contains(secret), "{secret} in {doc}");
        }
        reveal(&mut shown);
        assert_eq!(shown["verdict"]["summary"], "read /data/a at 5 MB/s");
        assert_eq!(shown["processes"][0]["cmdline"], "python train.py --secret");
    }

    #[test]
    fn ids_are_stable_and_differ_by_cgroup() {
        assert_eq!(id("/kubepods.slice/a"), id("/kubepods.slice/a"));
        assert_ne!(id("/kubepods.slice/a"), id("/kubepods.slice/b"));
        assert_eq!(id("").len(), 16);
    }
}
