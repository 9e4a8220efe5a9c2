//! The final human report, and the table the live view shares with it.
use std::fmt::Write;

use stall_common::reason;

use super::View;
use crate::{aggregate::ThreadWindow, capture::syscalls, correlate::Role, units};

/// One row per thread worth showing: every process's main thread, plus
/// threads that used >2% CPU or read files. Trainer first, then workers.
pub fn table(v: &View, max_rows: usize) -> Vec<String> {
    let secs = v.window.secs().max(1e-9);
    let mut rows = vec![format!(
        "{:<8} {:>7} {:>7} {:<15} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>10}  {}",
        "ROLE",
        "PID",
        "TID",
        "COMM",
        "ONCPU",
        "FUTEX",
        "IO",
        "POLL",
        "SLEEP",
        "RUNQ",
        "OTHER",
        "READ/s",
        "TOP FILE"
    )];
    let mut procs: Vec<_> = v.window.procs.iter().collect();
    let rank = |r: Role| match r {
        Role::Trainer => 0,
        Role::Worker => 1,
        Role::Other => 2,
    };
    procs.sort_by_key(|p| (rank(v.roles.of(p.tgid)), p.tgid));
    let mut hidden = 0;
    for p in procs {
        let role = v.roles.of(p.tgid).as_str();
        let top = p.files.first().map(|f| f.path.as_str()).unwrap_or("");
        for t in &p.threads {
            let pct = |ns: u64| ns as f64 / 1e9 / secs;
            let worth = t.tid == p.tgid || pct(t.delta.on_cpu_ns) > 0.02 || t.delta.file_read_bytes > 0;
            if !worth || rows.len() > max_rows {
                hidden += 1;
                continue;
            }
            let off = |r: u8| units::pct(pct(t.delta.off_ns[usize::from(r)]));
            let file = if t.tid == p.tgid { top } else { "" };
            rows.push(format!(
                "{:<8} {:>7} {:>7} {:<15} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>10}  {}",
                role,
                p.tgid,
                t.tid,
                truncate(&t.comm, 15),
                units::pct(pct(t.delta.on_cpu_ns)),
                off(reason::FUTEX),
                off(reason::IO),
                off(reason::POLL),
                off(reason::SLEEP),
                off(reason::RUNQUEUE),
                off(reason::OTHER),
                units::rate(t.delta.file_read_bytes, secs),
                file
            ));
        }
    }
    if hidden > 0 {
        rows.push(format!("({hidden} quiet threads not shown)"));
    }
    rows
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

fn waits(t: &ThreadWindow) -> String {
    let mut parts: Vec<(usize, u64)> =
        t.delta.off_ns.iter().copied().enumerate().filter(|(_, ns)| *ns > 0).collect();
    parts.sort_by_key(|p| std::cmp::Reverse(p.1));
    parts
        .iter()
        .take(3)
        .map(|(r, ns)| {
            let name = if *r == usize::from(reason::OTHER) && t.other_nr >= 0 {
                format!("other/{}", syscalls::name(i64::from(t.other_nr)))
            } else {
                reason::NAMES[*r].to_string()
            };
            format!("{name} {}", units::secs(*ns as f64 / 1e9))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn render(v: &View) -> String {
    let w = v.window;
    let secs = w.secs();
    let mut out = String::new();
    let _ = writeln!(out, "stall report: {} over {}", v.target, units::secs(secs));
    if let Some(note) = v.gpu_note {
        let _ = writeln!(out, "{note}");
    }
    for g in v.gpus {
        let _ = writeln!(
            out,
            "GPU{} {}: mean utilization {:.0}%, idle {} ({} samples)",
            g.index,
            g.name,
            g.util_mean_pct,
            units::pct(g.idle_fraction),
            g.samples
        );
    }
    if w.lost_total() > 0 {
        let _ = writeln!(
            out,
            "WARNING: {} events were lost ({:?}): figures below are partial",
            w.lost_total(),
            w.lost
        );
    }
    let _ = writeln!(out);
    for p in &w.procs {
        let role = v.roles.of(p.tgid).as_str();
        let sum = p.sum();
        let _ = writeln!(
            out,
            "[{role}] pid {} ({}){}: on CPU {}, off CPU {}, read {} from {} file(s) at {}{}",
            p.tgid,
            p.comm,
            p.ppid.map(|pp| format!(" ppid {pp}")).unwrap_or_default(),
            units::secs(sum.on_cpu_ns as f64 / 1e9),
            units::secs(sum.off_cpu_ns() as f64 / 1e9),
            units::bytes(p.file_read_bytes()),
            p.files.len(),
            units::rate(p.file_read_bytes(), secs),
            if p.other_read_bytes > 0 {
                format!(", {} from pipes/sockets", units::bytes(p.other_read_bytes))
            } else {
                String::new()
            }
        );
        if let Some(cmd) = &p.cmdline {
            let _ = writeln!(out, "    cmd: {}", truncate(cmd, 120));
        }
        for t in &p.threads {
            let wakers: Vec<String> =
                t.woken_by.iter().take(3).map(|(tid, _, comm, n)| format!("{comm} {tid} ×{n}")).collect();
            let _ = writeln!(
                out,
                "    thread {} ({}): on CPU {}, waits: {}{}",
                t.tid,
                t.comm,
                units::secs(t.delta.on_cpu_ns as f64 / 1e9),
                if t.delta.off_cpu_ns() > 0 { waits(t) } else { "none".into() },
                if wakers.is_empty() { String::new() } else { format!("; woken by {}", wakers.join(", ")) }
            );
        }
        for f in p.files.iter().take(10) {
            let lat = if f.read_calls > 0 { f.read_ns as f64 / f.read_calls as f64 / 1e3 } else { 0.0 };
            let _ = writeln!(
                out,
                "    file {}: {} in {} reads ({} opens, {:.0} µs/read, {})",
                f.path,
                units::bytes(f.read_bytes),
                f.read_calls,
                f.opens,
                lat,
                units::rate(f.read_bytes, secs)
            );
        }
        if p.files.len() > 10 {
            let _ = writeln!(out, "    ... {} more files", p.files.len() - 10);
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "verdict: {}", v.verdict.kind.as_str());
    let _ = writeln!(out, "  {}", v.verdict.summary);
    for e in &v.verdict.evidence {
        let _ = writeln!(out, "  - {e}");
    }
    out
}
