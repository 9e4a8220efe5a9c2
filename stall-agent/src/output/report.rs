//! The final human report, and the table the live view shares with it.
use std::fmt::Write;

use stall_common::reason;

use super::View;
use crate::{aggregate::is_data_file, correlate::Role, units};

/// One row per thread worth showing: every process's main thread, plus
/// threads that used >2% CPU or read files. Trainer first, then workers.
/// `file_cols`: room for the TOP FILE column (paths are cut from the left,
/// keeping the file name); `None`: whole paths.
pub fn table(v: &View, max_rows: usize, file_cols: Option<usize>) -> Vec<String> {
    let secs = v.window.secs().max(1e-9);
    let mut rows = vec![format!(
        "{:<8} {:>7} {:>7} {:<15} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>10}  {}",
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
        "THROTL",
        "WRITE",
        "SYNC",
        "SEND",
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
    // A run's threads grouped by the rank they work for, then as before.
    procs.sort_by_key(|p| (v.roles.rank_of(p.tgid).unwrap_or(u32::MAX), rank(v.roles.of(p.tgid)), p.tgid));
    let mut hidden = 0;
    let mut group = None;
    for p in procs.into_iter().filter(|p| notable(v, p)) {
        let role = v.roles.of(p.tgid).as_str();
        let of_rank = v.roles.rank_of(p.tgid);
        if !v.roles.ranks.is_empty() && of_rank != group && rows.len() <= max_rows {
            group = of_rank;
            rows.push(match of_rank {
                Some(r) if v.roles.unnumbered => format!("-- the rank in pid {r}"),
                Some(r) => format!("-- rank {r}"),
                None => "-- not a rank".to_string(),
            });
        }
        let top = p
            .files
            .iter()
            .find(|f| f.read_bytes > 0 && is_data_file(f.name()))
            .map(|f| f.path.as_str())
            // Said of the job's own processes; a helper's blank is enough.
            .unwrap_or(if role == "other" { "" } else { "none" });
        for t in &p.threads {
            let pct = |ns: u64| ns as f64 / 1e9 / secs;
            let worth = t.tid == p.tgid || pct(t.delta.on_cpu_ns) > 0.02 || t.delta.file_read_bytes > 0;
            if !worth || rows.len() > max_rows {
                hidden += 1;
                continue;
            }
            let off = |r: u8| units::pct(pct(t.delta.off_ns[usize::from(r)]));
            let file = if t.tid == p.tgid { shorten(top, file_cols) } else { String::new() };
            rows.push(format!(
                "{:<8} {:>7} {:>7} {:<15} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>10}  {}",
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
                off(reason::THROTTLED),
                off(reason::WRITE),
                off(reason::SYNC),
                off(reason::SEND),
                off(reason::OTHER),
                units::rate(t.delta.file_read_bytes, secs),
                file
            ));
        }
    }
    if hidden > 0 {
        rows.push(format!("({} not shown)", units::count(hidden, "quiet thread", "quiet threads")));
    }
    rows
}

fn shorten(path: &str, max: Option<usize>) -> String {
    let n = path.chars().count();
    match max {
        Some(max) if n > max && max > 1 => {
            let tail: String = path.chars().skip(n - (max - 1)).collect();
            format!("…{tail}")
        }
        _ => path.to_string(),
    }
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// Whether a process earns rows in the human output: the trainer and
/// workers always; others when they used >1% of a CPU or read >1 MB.
fn notable(v: &View, p: &crate::aggregate::ProcWindow) -> bool {
    let secs = v.window.secs().max(1e-9);
    v.roles.of(p.tgid) != Role::Other
        || p.sum().on_cpu_ns as f64 / 1e9 / secs > 0.01
        || p.input_bytes() > 1_000_000
}

pub fn render(v: &View) -> String {
    let w = v.window;
    let secs = w.secs();
    let mut out = String::new();
    let _ = writeln!(out, "stall report: {} over {}", v.target, units::secs(secs));
    let ending = v.ending.as_ref();
    if let Some((_, _, line)) = ending.map(|e| e.syscall_backend) {
        let _ = writeln!(out, "{line}");
    }
    if let Some(line) = ending.and_then(|e| e.gpu_probes) {
        let _ = writeln!(out, "{line}");
    }
    if let Some(note) = v.gpu_note {
        let _ = writeln!(out, "{note}");
    }
    if let Some(n) = ending.map(|e| e.unreadable_threads).filter(|&n| n > 0) {
        let _ = writeln!(
            out,
            "/proc would not say which syscall {} waited in (task/TID/syscall unreadable, even for root): counted as blocked for a reason guessed from their state, not on-CPU",
            units::count(n as usize, "blocked thread", "blocked threads")
        );
    }
    for g in v.gpus {
        let _ = writeln!(
            out,
            "GPU{} {}: mean utilization {:.0}%{}, idle {} ({} samples)",
            g.index,
            g.name,
            g.util_mean_pct,
            super::gpu_power(g),
            units::pct(g.idle_fraction),
            g.samples
        );
    }
    let _ = writeln!(out, "Progress: {}", super::progress_line(v.progress));
    if w.lost_total() > 0 {
        let _ = writeln!(
            out,
            "WARNING: {} events were lost ({}): figures below are partial",
            w.lost_total(),
            stall_common::counter::LOST_NAMES
                .iter()
                .zip(w.lost)
                .filter(|(_, n)| *n > 0)
                .map(|(name, n)| format!("{name} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if w.sched_gaps > 0 {
        let _ = writeln!(
            out,
            "note: {} context switches were missed; what those threads waited for in those spans is unknown",
            w.sched_gaps
        );
    }
    let _ = writeln!(out);
    // The table and the verdict differ where a startup was set apart: say
    // what each share is of, or the same thread reads two ways.
    let startup_s = ending.and_then(|e| e.startup_s);
    match startup_s {
        Some(s) => {
            let _ = writeln!(
                out,
                "Shares in the table are of the whole {}, startup included; the verdict's are of the {} after startup.",
                units::secs(secs),
                units::secs((secs - s).max(0.0))
            );
        }
        None => {
            let _ =
                writeln!(out, "Shares in the table and the verdict are of the whole {}.", units::secs(secs));
        }
    }
    for line in table(v, 40, None) {
        let _ = writeln!(out, "{line}");
    }
    let hidden = w.procs.iter().filter(|p| !notable(v, p)).count();

    // The job's data: not the interpreter's modules, nor stall's own gate.
    let files: Vec<_> = w.files_by_bytes().into_iter().filter(|(_, f)| is_data_file(f.name())).collect();
    if !files.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(out, "Top files by bytes read:");
    }
    for (pid, f) in files.iter().take(10) {
        // Few reads may include no timed one (one in --latency-sample is).
        let lat = match f.mean_read_ns() {
            Some(ns) if ns >= 10_000.0 => format!("{:.0} µs/read", ns / 1e3),
            Some(ns) => format!("{:.1} µs/read", ns / 1e3),
            None => "untimed".to_string(),
        };
        let resolved = f.resolved.as_deref().map(|r| format!(" (= {r})")).unwrap_or_default();
        let source = f.source().map(|s| format!(", {s}")).unwrap_or_default();
        let lat = if f.read_calls > 0 { format!(", {lat}") } else { String::new() };
        let _ = writeln!(
            out,
            "  {}{resolved}: {} {}{lat}, {} while open{source} [{} pid {pid}]",
            f.path,
            units::bytes(f.bytes_in()),
            f.taken_by(),
            units::rate(f.bytes_in(), f.rate_secs(secs)),
            v.roles.of(*pid).as_str()
        );
    }
    if files.len() > 10 {
        let _ = writeln!(out, "  ... and {} more files", files.len() - 10);
    }
    let written: Vec<_> =
        w.files_by_written().into_iter().filter(|(_, f)| crate::progress::is_output(&f.path)).collect();
    if !written.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(out, "Files written (logs, checkpoints):");
    }
    for (pid, f) in written.iter().take(5) {
        let _ = writeln!(
            out,
            "  {}: {} in {} writes [{} pid {pid}]",
            f.path,
            units::bytes(f.write_bytes),
            f.write_calls,
            v.roles.of(*pid).as_str()
        );
    }
    let mut peers: Vec<(u32, &crate::aggregate::FileWindow)> = w
        .procs
        .iter()
        .flat_map(|p| p.sockets.iter().map(move |s| (p.tgid, s)))
        .filter(|(_, s)| s.read_bytes + s.write_bytes > 0)
        .collect();
    peers.sort_by_key(|(pid, s)| (std::cmp::Reverse(s.read_bytes + s.write_bytes), *pid));
    if !peers.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(out, "Network peers (connected sockets):");
    }
    for (pid, s) in peers.iter().take(8) {
        let _ = writeln!(
            out,
            "  {}{}: received {} in {} reads, sent {} [{} pid {pid}]",
            s.path,
            if s.ipc { " (a process of the job)" } else { "" },
            units::bytes(s.read_bytes),
            s.read_calls,
            units::bytes(s.write_bytes),
            v.roles.of(*pid).as_str()
        );
    }
    if !w.cpu_limits.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(out, "CPU limits (throttled time apportioned to threads from cpu.stat):");
    }
    for l in &w.cpu_limits {
        let _ = writeln!(
            out,
            "  {}: {} CPU; throttled in {} of {} periods, {} of run-queue time",
            l.cgroup,
            units::cpus(l.cpus),
            l.throttled_periods,
            l.periods,
            units::secs(l.throttled_ns as f64 / 1e9)
        );
    }
    let _ = writeln!(out);
    let exited = w.procs.iter().filter(|p| !p.alive).count();
    let _ = writeln!(
        out,
        "{} traced ({exited} exited){}; --json has every process, thread and file.",
        units::count(w.procs.len(), "process", "processes"),
        if hidden > 0 {
            format!(", {} not shown above", units::count(hidden, "quiet one", "quiet ones"))
        } else {
            String::new()
        }
    );
    if let Some(status) = ending.and_then(|e| e.exit_status) {
        let _ = writeln!(out, "The command exited with {}.", super::exit_words(status));
    }
    let _ = writeln!(out);
    for c in ending.map_or(&[][..], |e| e.role_changes) {
        let _ = writeln!(out, "Roles at {}: {}.", units::secs(c.at_s), c.says);
    }
    if let Some(s) = startup_s {
        let _ = writeln!(
            out,
            "Startup (imports and set-up, until the interval in which the input pipeline started): {}; the verdict and its shares are of the {} after it.",
            units::secs(s),
            units::secs((secs - s).max(0.0))
        );
    }
    let _ = writeln!(out, "verdict: {}", v.verdict.kind.as_str());
    // The operator's own terminal: every detail shown.
    let _ = writeln!(out, "  {}", v.verdict.summary.shown());
    for e in &v.verdict.evidence {
        let _ = writeln!(out, "  - {}", e.shown());
    }
    if !v.verdict.python_stacks.is_empty() {
        let _ = writeln!(out, "  Python stacks (innermost first):");
    }
    for s in &v.verdict.python_stacks {
        let _ = writeln!(out, "  - {} {} (pid {}): {}", s.what, s.tid, s.pid, s.line());
    }
    for n in &v.verdict.python_notes {
        let _ = writeln!(out, "  note: {n}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        aggregate::Window, correlate::Roles, output::Ending, progress::ProgressView, verdict::Verdict,
    };

    fn rendered(startup_s: Option<f64>) -> String {
        let window = Window { start_ns: 0, end_ns: 20_000_000_000, ..Default::default() };
        let (verdict, progress) = (Verdict::default(), ProgressView::default());
        render(&View {
            window: &window,
            roles: &Roles::default(),
            gpus: &[],
            verdict: &verdict,
            elapsed_s: 20.0,
            target: "python3 train.py",
            gpu_note: None,
            progress: &progress,
            ending: Some(Ending {
                startup_s,
                syscall_backend: ("tracepoint", "cast", "syscall hooks: tracepoint"),
                gpu_probes: None,
                mmap_hooks: "tracepoint",
                switch_reads: "direct",
                exit_status: None,
                unreadable_threads: 0,
                role_changes: &[],
            }),
            starting_up: false,
        })
    }

    #[test]
    fn the_table_and_the_verdict_say_what_their_shares_are_of() {
        let text = rendered(Some(5.0));
        assert!(text.contains("Shares in the table are of the whole 20.0s, startup included; the verdict's are of the 15.0s after startup."), "{text}");
        let text = rendered(None);
        assert!(text.contains("Shares in the table and the verdict are of the whole 20.0s."), "{text}");
    }
}
