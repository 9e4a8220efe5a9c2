//! Which rows the SVG draws for the traced threads: grouped by process
//! (trainer first, then workers, then the rest), each process under a
//! header naming its pid, role and rank, and short-lived helpers (a shell
//! shim's children, say) folded into one row per parent and name so that
//! they do not push the threads that matter off the picture. Pure.
use std::collections::{BTreeMap, HashMap, HashSet};

use super::STATES;

/// A helper that lived less than this ...
const SHORT_LIFE_NS: u64 = 1_000_000_000;
/// ... and was on CPU less than this is folded.
const LITTLE_CPU_NS: u64 = 500_000_000;
/// This many same-named children of one parent are folded whatever they did.
const MANY_SIBLINGS: usize = 3;

/// What the layout knows of one traced thread.
pub struct ThreadIn {
    pub tid: u32,
    pub pid: u32,
    pub name: String,
    /// First and last ns (since the origin) it was seen in any state.
    pub first_ns: u64,
    pub last_ns: u64,
    pub on_cpu_ns: u64,
    pub buckets: Vec<[u32; STATES]>,
}

/// What the layout knows of one process.
#[derive(Debug, Clone, Default)]
pub struct ProcIn {
    pub name: String,
    /// `trainer`, `worker` or anything else.
    pub role: String,
    pub rank: Option<u32>,
    pub ppid: Option<u32>,
}

/// One band: a thread, or folded helpers.
pub struct Band {
    pub label: String,
    /// Per step, ns per state (by `State::index`).
    pub buckets: Vec<[u32; STATES]>,
}

/// A process and its threads' bands, or one row of folded helpers (no
/// header).
pub struct Group {
    pub header: Option<String>,
    pub bands: Vec<Band>,
}

/// Helpers of one (parent, name): how many, their on-CPU ns, their steps.
type Folded = (usize, u64, Vec<[u32; STATES]>);

fn role_order(role: &str) -> u8 {
    match role {
        "trainer" => 0,
        "worker" => 1,
        _ => 2,
    }
}

/// The groups, in drawing order.
pub fn groups(threads: Vec<ThreadIn>, procs: &HashMap<u32, ProcIn>) -> Vec<Group> {
    let mut by_pid: BTreeMap<u32, Vec<ThreadIn>> = BTreeMap::new();
    for t in threads {
        by_pid.entry(t.pid).or_default().push(t);
    }
    let info = |pid: u32| procs.get(&pid).cloned().unwrap_or_default();
    let name_of = |pid: u32, ts: &[ThreadIn]| {
        let p = info(pid);
        if p.name.is_empty() {
            ts.iter().find(|t| t.tid == pid).or(ts.first()).map(|t| t.name.clone()).unwrap_or_default()
        } else {
            p.name
        }
    };
    // Same-named children of one parent, among the processes nobody
    // called a trainer or a worker.
    let mut siblings: HashMap<(Option<u32>, String), usize> = HashMap::new();
    for (pid, ts) in &by_pid {
        if role_order(&info(*pid).role) == 2 {
            *siblings.entry((info(*pid).ppid, name_of(*pid, ts))).or_default() += 1;
        }
    }
    let folds: HashSet<u32> = by_pid
        .iter()
        .filter(|(pid, ts)| {
            let p = info(**pid);
            let life = ts.iter().map(|t| t.last_ns).max().unwrap_or(0)
                - ts.iter().map(|t| t.first_ns).min().unwrap_or(0);
            let cpu: u64 = ts.iter().map(|t| t.on_cpu_ns).sum();
            let helper = life < SHORT_LIFE_NS && cpu < LITTLE_CPU_NS;
            let many = siblings.get(&(p.ppid, name_of(**pid, ts))).copied().unwrap_or(0) >= MANY_SIBLINGS;
            role_order(&p.role) == 2 && (helper || many)
        })
        .map(|(pid, _)| *pid)
        .collect();
    // A helper's own helpers (a shim's subshells run `readlink`) count
    // under the process that kept its rows, not a row per helper parent.
    let owner = |pid: u32| {
        let mut pp = info(pid).ppid;
        for _ in 0..64 {
            match pp {
                Some(p) if folds.contains(&p) => pp = info(p).ppid,
                _ => break,
            }
        }
        pp
    };
    let mut kept: Vec<(u8, u32, u32, Group)> = Vec::new();
    let mut folded: BTreeMap<(Option<u32>, String), Folded> = BTreeMap::new();
    for (pid, mut ts) in by_pid {
        let p = info(pid);
        let name = name_of(pid, &ts);
        let order = role_order(&p.role);
        if folds.contains(&pid) {
            let f = folded.entry((owner(pid), name)).or_default();
            f.0 += 1;
            f.1 += ts.iter().map(|t| t.on_cpu_ns).sum::<u64>();
            for t in &ts {
                add_into(&mut f.2, &t.buckets);
            }
            continue;
        }
        ts.sort_by_key(|t| t.tid);
        let mut header = format!("pid {pid} · {}", if p.role.is_empty() { "other" } else { &p.role });
        if let Some(r) = p.rank {
            header += &format!(" · rank {r}");
        }
        header += &format!(" · {name}");
        let bands = ts
            .into_iter()
            .map(|t| Band { label: format!("{} ({})", t.name, t.tid), buckets: t.buckets })
            .collect();
        kept.push((order, p.rank.unwrap_or(u32::MAX), pid, Group { header: Some(header), bands }));
    }
    kept.sort_by_key(|k| (k.0, k.1, k.2));
    let mut out: Vec<Group> = kept.into_iter().map(|k| k.3).collect();
    for ((ppid, name), (n, cpu, buckets)) in folded {
        let parent = ppid.map(|p| format!(" (parent {p})")).unwrap_or_default();
        let label = format!("{n} × {name}, {:.1} s on CPU{parent}", cpu as f64 / 1e9);
        out.push(Group { header: None, bands: vec![Band { label, buckets }] });
    }
    out
}

/// Adds `from` into `into`, step by step.
fn add_into(into: &mut Vec<[u32; STATES]>, from: &[[u32; STATES]]) {
    if into.len() < from.len() {
        into.resize(from.len(), [0; STATES]);
    }
    for (a, b) in into.iter_mut().zip(from) {
        for (x, y) in a.iter_mut().zip(b) {
            *x = x.saturating_add(*y);
        }
    }
}
