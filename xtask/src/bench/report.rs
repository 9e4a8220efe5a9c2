//! docs/PERFORMANCE.md from the bench's samples.
use std::fmt::Write;

use super::{
    daemon::{DaemonBench, Watch},
    profile::Profile,
    pystacks::{PyStacksBench, Reader},
    sh, CostRow, Mode, Quiet, Sample, Workload,
};

pub struct Meta {
    pub quick: bool,
    pub runs: usize,
    pub strace: bool,
    pub minutes: f64,
    pub quiet: Quiet,
    /// 1-minute load average at the start and the end.
    pub load: (f64, f64),
    /// `--before REV`: the revision run beside the current build.
    pub before: Option<String>,
}

/// Medians of one workload under one mode.
#[derive(Clone, Copy)]
pub struct Stats {
    pub runs: usize,
    pub ops: u64,
    pub secs: f64,
    pub ns_op: f64,
    pub min: f64,
    pub max: f64,
}

pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

pub fn stats(w: &Workload, mode: Mode) -> Option<Stats> {
    let s: Vec<_> = w.samples.iter().filter(|(m, _)| *m == mode).map(|(_, s)| *s).collect();
    if s.is_empty() {
        return None;
    }
    let per: Vec<f64> = s.iter().map(|s| s.ns_per_op()).collect();
    Some(Stats {
        runs: s.len(),
        ops: median(s.iter().map(|s| s.ops as f64).collect()) as u64,
        secs: median(s.iter().map(|s| s.ns as f64 / 1e9).collect()),
        ns_op: median(per.clone()),
        min: per.iter().copied().fold(f64::INFINITY, f64::min),
        max: per.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    })
}

/// (ratio vs baseline, added ns per op) for a mode.
fn versus(w: &Workload, mode: Mode) -> Option<(f64, f64)> {
    let base = stats(w, Mode::Baseline)?;
    let m = stats(w, mode)?;
    Some((m.ns_op / base.ns_op, m.ns_op - base.ns_op))
}

/// How far `mode` is above the floor in percentage points of the baseline,
/// round by round: the median, and the lowest and highest, of each round's
/// (mode − floor) / baseline. The k-th sample of a mode is of round k, and
/// a round runs its modes back to back, so the machine's drift from round
/// to round (the noise of these hosts) moves all three alike and cancels;
/// a ratio of medians taken over different rounds keeps it.
fn above_floor(w: &Workload, mode: Mode) -> Option<(f64, f64, f64)> {
    let of = |m: Mode| rounds(&w.samples, m);
    let pp: Vec<f64> = of(Mode::Baseline)
        .zip(of(mode))
        .zip(of(Mode::Floor))
        .map(|((base, m), floor)| (m - floor) / base * 100.0)
        .collect();
    let lo = pp.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = pp.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (!pp.is_empty()).then(|| (median(pp), lo, hi))
}

/// `mode` over the baseline round by round: the median of each round's
/// ratio (see `above_floor`).
fn paired_ratio(w: &Workload, mode: Mode) -> Option<f64> {
    median_ratio(&w.samples, mode, Mode::Baseline)
}

/// ns per op of `mode`'s samples, round by round (the k-th is of round k).
fn rounds<M: PartialEq + Copy>(samples: &[(M, Sample)], mode: M) -> impl Iterator<Item = f64> + '_ {
    samples.iter().filter(move |(m, _)| *m == mode).map(|(_, s)| s.ns_per_op())
}

/// The median of each round's ratio of `mode` to `base`.
fn median_ratio<M: PartialEq + Copy>(samples: &[(M, Sample)], mode: M, base: M) -> Option<f64> {
    let ratios: Vec<f64> = rounds(samples, mode).zip(rounds(samples, base)).map(|(a, b)| a / b).collect();
    (!ratios.is_empty()).then(|| median(ratios))
}

/// Why the numbers are what they are (the design; the tables measure it):
/// findings measured by hand, kept as markdown beside the other docs so
/// that a sentence of them is fixed there, and written into the report as
/// they are.
const WHERE_THE_COST_IS: &str = include_str!("../../../docs/performance/where-the-cost-is.md");

/// The longest line of prose the report writes; tables keep their width.
const WIDTH: usize = 100;

/// `doc` with each line of prose longer than `WIDTH` broken: each sentence
/// on a line of its own, and a sentence still too long broken between
/// words, never inside a code span nor before a word that would start a
/// block of its own (a list item, a heading, a quote). A list item's lines
/// go on under its text. Tables, headings and shorter lines stay as they
/// are, so the layout changes nothing that markdown shows.
fn reflow(doc: &str) -> String {
    let lines: Vec<String> = doc
        .split('\n')
        .map(|line| {
            if line.chars().count() <= WIDTH || line.starts_with('|') || line.starts_with('#') {
                line.to_string()
            } else {
                reflow_line(line)
            }
        })
        .collect();
    lines.join("\n")
}

fn reflow_line(line: &str) -> String {
    let body = line.trim_start_matches(' ');
    let mut head = line.len() - body.len();
    if body.starts_with("- ") {
        head += 2;
    }
    let (first, body) = line.split_at(head);
    let indent = " ".repeat(head);
    let words = words(body);
    let len = |ws: &[&str]| ws.iter().map(|w| w.chars().count() + 1).sum::<usize>() + head - 1;
    let mut out: Vec<String> = Vec::new();
    let mut cur: Vec<&str> = Vec::new();
    let flush = |cur: &[&str], out: &mut Vec<String>| {
        let lead = if out.is_empty() { first } else { indent.as_str() };
        out.push(format!("{lead}{}", cur.join(" ")));
    };
    for (i, &w) in words.iter().enumerate() {
        let sentence = i > 0 && ends_sentence(words[i - 1], w);
        let long = !cur.is_empty() && len(&cur) + 1 + w.chars().count() > WIDTH;
        if cur.is_empty() || !(sentence || long) {
            cur.push(w);
        } else if !opens_block(w) {
            flush(&cur, &mut out);
            cur = vec![w];
        } else if long && cur.len() > 1 {
            // The word before goes along, so that this one starts no line.
            let last = cur.pop().unwrap_or_default();
            flush(&cur, &mut out);
            cur = vec![last, w];
        } else {
            cur.push(w);
        }
    }
    flush(&cur, &mut out);
    out.join("\n")
}

/// The words of a line of prose, a code span with spaces in it one word.
fn words(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut ticks) = (None, 0);
    let mut at = 0;
    for part in text.split(' ') {
        let begin = at;
        at += part.len() + 1;
        if part.is_empty() && ticks % 2 == 0 {
            continue;
        }
        let s = *start.get_or_insert(begin);
        ticks += part.matches('`').count();
        if ticks % 2 == 0 {
            out.push(&text[s..at - 1]);
            start = None;
        }
    }
    if let Some(s) = start {
        out.push(&text[s..]);
    }
    out
}

/// Whether `word` ends a sentence and `next` begins another.
fn ends_sentence(word: &str, next: &str) -> bool {
    let ended = [".", "?", "!"].iter().any(|end| word.ends_with(end))
        && !["e.g.", "i.e.", "vs.", "etc."].contains(&word.trim_start_matches('('));
    let begins = !next.starts_with(|c: char| c.is_lowercase()) || next.starts_with("stall");
    // A bold lead-in (`**The point.**`) ends whatever comes next.
    word.ends_with(".**") || ended && begins
}

/// Whether a line that starts with `word` would start a block of its own
/// rather than go on with the paragraph.
fn opens_block(word: &str) -> bool {
    let marker = |c: char| "-+*=_#".contains(c);
    word.chars().all(marker)
        || word.starts_with(['>', '|', '<'])
        || word.starts_with("```")
        || word
            .strip_suffix(['.', ')'])
            .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
}

struct Target {
    what: String,
    measured: String,
    /// None: could not be measured.
    met: Option<bool>,
    margin: String,
}

fn targets(ws: &[Workload], cost: &[CostRow], daemon: &DaemonBench) -> Vec<Target> {
    let mut t = Vec::new();
    let by = |key: &str| ws.iter().find(|w| w.key == key);
    let unmeasured = |what: &str| Target {
        what: what.to_string(),
        measured: "not measured".into(),
        met: None,
        margin: String::new(),
    };

    for (key, title, most) in
        [("pread-4k", "pread-4k (worst case)", 5.0), ("futex-pingpong", "futex ping-pong", 15.0)]
    {
        let what = format!("{title}: stall within {most} percentage points of the floor");
        let measured = by(key).and_then(|w| {
            Some((versus(w, Mode::Stall)?, versus(w, Mode::Floor)?, above_floor(w, Mode::Stall)?))
        });
        match measured {
            Some(((rs, _), (rf, _), (pp, lo, hi))) => {
                t.push(Target {
                    what,
                    measured: format!(
                        "stall {:+.1} %, floor {:+.1} % vs baseline (medians); round by round {pp:+.1} pp \
                         ({lo:+.1} to {hi:+.1})",
                        pct(rs),
                        pct(rf)
                    ),
                    met: Some(pp <= most),
                    margin: margin(most - pp, "pp"),
                });
            }
            None => t.push(unmeasured(&what)),
        }
    }

    let what = "pread-4k (worst case): ≥ 500× less added time per read than strace";
    match by("pread-4k").and_then(|w| Some((versus(w, Mode::Stall)?, versus(w, Mode::Strace)?))) {
        Some(((_, sa), (_, ta))) => {
            let (measured, met, m) = if sa <= 0.0 {
                (format!("strace +{ta:.0} ns/read, stall {sa:+.1} ns/read (within noise)"), true, "—".into())
            } else {
                let x = ta / sa;
                (
                    format!("strace +{ta:.0} ns/read, stall +{sa:.1} ns/read: {x:.0}×"),
                    x >= 500.0,
                    if x >= 500.0 {
                        format!("met with {:.2}× to spare", x / 500.0)
                    } else {
                        format!(
                            "missed: {:.1}× short (stall would need ≤ {:.1} ns/read)",
                            500.0 / x,
                            ta / 500.0
                        )
                    },
                )
            };
            t.push(Target { what: what.into(), measured, met: Some(met), margin: m });
        }
        None => t.push(unmeasured(what)),
    }

    for (key, limit, what) in [
        ("loader", 1.0, "loader (DataLoader-like): < 1 % added"),
        ("loader-cold", 1.0, "loader-cold (DataLoader-like, from storage): < 1 % added"),
        (
            "loader-mmap",
            f64::INFINITY,
            "loader-mmap (DataLoader-like, through mappings, page cache warm) (reported)",
        ),
        ("neighbour", 3.0, "neighbour (untraced): < 3 % added"),
    ] {
        match by(key).and_then(|w| Some((paired_ratio(w, Mode::Stall)?, versus(w, Mode::Stall)?))) {
            Some((r, (medians, _))) => {
                let p = pct(r);
                t.push(Target {
                    what: what.into(),
                    measured: format!("{p:+.2} % round by round ({:+.2} % by medians)", pct(medians)),
                    met: limit.is_finite().then_some(p < limit),
                    margin: if limit.is_finite() { margin(limit - p, "pp") } else { String::new() },
                });
            }
            None => t.push(unmeasured(what)),
        }
    }

    for (samples, watch, limit, what) in [
        (
            &daemon.neighbour,
            Watch::Cheap,
            3.0,
            "daemon, healthy GPU job: untraced neighbour's reads < 3 % added (aim 1 %)",
        ),
        (
            &daemon.switcher,
            Watch::Cheap,
            3.0,
            "daemon, healthy GPU job: switch-heavy untraced neighbour (futex ping-pong) < 3 % added",
        ),
        (
            &daemon.neighbour,
            Watch::Escalated,
            f64::INFINITY,
            "daemon, job escalated: untraced neighbour's reads (reported)",
        ),
        (
            &daemon.switcher,
            Watch::Escalated,
            f64::INFINITY,
            "daemon, job escalated: switch-heavy untraced neighbour (reported)",
        ),
    ] {
        match daemon_versus(samples, watch) {
            Some(r) => {
                let p = pct(r);
                t.push(Target {
                    what: what.into(),
                    measured: format!("{p:+.2} %"),
                    met: limit.is_finite().then_some(p < limit),
                    margin: if limit.is_finite() { margin(limit - p, "pp") } else { String::new() },
                });
            }
            None => t.push(unmeasured(what)),
        }
    }

    let what = "agent: < 2 % of one core at 100k events/s";
    match cost.iter().find(|r| r.rate == Some(50_000)) {
        Some(r) => {
            // Attached and running: start-up and the final report are a
            // fixed cost, whatever the rate, shown beside it.
            let pct = r.steady_pct.unwrap_or(r.core_pct());
            t.push(Target {
                what: what.into(),
                measured: format!(
                    "{pct:.2} % at {:.0}k events/s ({:.0}k reads/s){}; {:.2} % over its {:.0} s run with start-up \
                     and report",
                    r.events_per_s() / 1e3,
                    r.achieved / 1e3,
                    if r.steady_pct.is_some() { " once attached" } else { "" },
                    r.core_pct(),
                    r.traced_s
                ),
                met: Some(pct < 2.0),
                margin: margin(2.0 - pct, "pp"),
            })
        }
        None => t.push(unmeasured(what)),
    }

    let what = "agent: peak RSS < 64 MiB";
    match cost.iter().max_by_key(|r| r.rss_kb) {
        Some(top) => {
            let mib = top.rss_kb as f64 / 1024.0;
            let reads = cost.iter().filter(|r| r.records_per_op == 0.0).map(|r| r.rss_kb).max().unwrap_or(0);
            t.push(Target {
                what: what.into(),
                measured: format!(
                    "{mib:.1} MiB at most ({}); {:.1} MiB at most while tracing reads",
                    top.label,
                    reads as f64 / 1024.0
                ),
                met: Some(mib < 64.0),
                margin: margin(64.0 - mib, "MiB"),
            });
        }
        None => t.push(unmeasured(what)),
    }

    let what = "agent: zero lost events at 1M reads/s from the traced job";
    match cost.iter().find(|r| r.rate == Some(1_000_000)) {
        Some(r) => {
            let reached = r.achieved >= 0.97e6;
            t.push(Target {
                what: what.into(),
                measured: format!("{} lost at {:.0}k reads/s achieved", r.lost, r.achieved / 1e3),
                met: Some(r.lost == 0 && reached),
                margin: if !reached {
                    format!("rate not reached under stall ({:.0} % of 1M)", r.achieved / 1e4)
                } else if r.lost == 0 {
                    "—".into()
                } else {
                    format!("missed by {} events", r.lost)
                },
            });
        }
        None => t.push(unmeasured(what)),
    }
    t
}

/// ns per op under `watch` over no daemon: the median of each round's
/// ratio (the k-th sample of a watch is of round k), so that the machine's
/// drift from round to round cancels.
fn daemon_versus(samples: &[(Watch, Sample)], watch: Watch) -> Option<f64> {
    median_ratio(samples, watch, Watch::NoDaemon)
}

fn render_pystacks(d: &mut String, b: &PyStacksBench) {
    let _ = writeln!(d, "\n## Python stacks\n");
    let _ = writeln!(
        d,
        "A tight Python loop counts its iterations for {:.0} s: untraced, with `stall attach` (whose live \
         view reads the stacks of the threads a hang or input verdict names, at most every 5 s: none here, the \
         loop is busy), and with the stacks of its main thread read (py-spy, non-blocking: the process is \
         never paused) every second and five times a second. Medians; the ratio is against untraced in \
         the same run.\n",
        b.secs
    );
    let _ = writeln!(d, "| reader | iterations/s | vs untraced |");
    let _ = writeln!(d, "|---|---:|---:|");
    let rate = |r: Reader| {
        let v: Vec<f64> = b
            .samples
            .iter()
            .filter(|(x, _)| *x == r)
            .map(|(_, s)| s.ops as f64 / (s.ns as f64 / 1e9))
            .collect();
        (!v.is_empty()).then(|| median(v))
    };
    for r in Reader::ALL {
        let (Some(x), Some(base)) = (rate(r), rate(Reader::None)) else { continue };
        let _ = writeln!(d, "| {} | {:.0} | {:+.2} % |", r.label(), x, (x / base - 1.0) * 100.0);
    }
}

fn render_daemon(d: &mut String, b: &DaemonBench, rev: Option<&str>) {
    let _ = writeln!(d, "\n## stall daemon on a node\n");
    let _ = writeln!(
        d,
        "`stall daemon --interval 1` watching a GPU job (a process holding a scripted NVML GPU, in a cgroup of \
         its own). In each mode, in rotating order, {} rounds: a process of the job, then an untraced neighbour, \
         each doing {} `pread`s of 4 KiB from a cached file; then an untraced neighbour that switches often: two \
         threads pinned to one CPU hand a futex back and forth ({} context switches). *Cheap tier*: the job's GPU \
         is busy, so no scheduler or syscall hook is attached (the job's threads are read from /proc each \
         interval); *escalated*: its GPU is idle, so the daemon attached the full capture (scheduler and \
         syscall hooks). Medians of ns per read or per switch; the ratio is the median of each round's \
         ratio to no daemon in the same round.\n",
        b.rounds, b.reads, b.switches
    );
    d.push_str(&daemon_table(b));
    if !b.profiles.is_empty() {
        let _ = writeln!(
            d,
            "\nThe daemon's programs while an untraced neighbour hands a futex back and forth (kernel run-time \
             statistics, as in \"Where the time goes\" above): what each of the neighbour's switches pays \
             inside them. The rest of the neighbour's slowdown is the tracepoints' own dispatch, which no \
             program avoids (an empty program: the floor's ns per run above)."
        );
        for p in b.profiles.iter().filter(|p| !p.before) {
            render_profile(d, p);
        }
    }
    if let Some(rev) = rev.filter(|_| b.profiles.iter().any(|p| p.before)) {
        let _ = writeln!(
            d,
            "\nThe same under the daemon as built from {rev} (`--before`), measured one after the other in \
             this run: ns of BPF programs per switch of the neighbour, then and now."
        );
        render_changes(d, &b.profiles, rev);
    }
}

/// The daemon's table, alone (`cargo xtask bench --daemon-only`).
pub fn daemon_text(b: &DaemonBench, rev: Option<&str>) -> String {
    let mut t = daemon_table(b);
    for p in b.profiles.iter().filter(|p| !p.before) {
        render_profile(&mut t, p);
    }
    if let Some(rev) = rev {
        render_changes(&mut t, &b.profiles, rev);
    }
    for (samples, what) in [(&b.neighbour, "reads"), (&b.switcher, "switches")] {
        for (watch, tier) in [(Watch::Cheap, "cheap tier"), (Watch::Escalated, "escalated")] {
            if let Some(r) = daemon_versus(samples, watch) {
                let _ = writeln!(t, "{tier}: untraced neighbour's {what} {:+.2} %", pct(r));
            }
        }
    }
    t
}

fn daemon_table(b: &DaemonBench) -> String {
    let mut d = String::new();
    let _ = writeln!(
        d,
        "| mode | job ns/read | job vs no daemon | neighbour ns/read | neighbour vs no daemon | switcher ns/switch | switcher vs no daemon |"
    );
    let _ = writeln!(d, "|---|---:|---:|---:|---:|---:|---:|");
    for w in Watch::ALL {
        let med = |v: &[(Watch, Sample)]| {
            median(v.iter().filter(|(x, _)| *x == w).map(|(_, s)| s.ns_per_op()).collect())
        };
        let ratio =
            |v: &[(Watch, Sample)]| daemon_versus(v, w).map_or("—".into(), |r| format!("{:+.2} %", pct(r)));
        let _ = writeln!(
            d,
            "| {} | {:.1} | {} | {:.1} | {} | {:.1} | {} |",
            w.label(),
            med(&b.job),
            ratio(&b.job),
            med(&b.neighbour),
            ratio(&b.neighbour),
            med(&b.switcher),
            ratio(&b.switcher)
        );
    }
    d
}

fn pct(ratio: f64) -> f64 {
    (ratio - 1.0) * 100.0
}

fn margin(headroom: f64, unit: &str) -> String {
    if headroom >= 0.0 {
        format!("met by {headroom:.2} {unit}")
    } else {
        format!("missed by {:.2} {unit}", -headroom)
    }
}

fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "**missed**",
        None => "n/a",
    }
}

/// The targets as plain text, for the terminal.
pub fn targets_text(ws: &[Workload], cost: &[CostRow], daemon: &DaemonBench) -> String {
    let mut s = String::from("targets:\n");
    for t in targets(ws, cost, daemon) {
        let v = verdict(t.met).trim_matches('*');
        let _ = writeln!(s, "  [{v:>6}] {}: {} ({})", t.what, t.measured, t.margin);
    }
    s
}

fn machine() -> Vec<(String, String)> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name")?.split_once(':').map(|(_, v)| v.trim().to_string()))
        .unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:")?.trim().strip_suffix("kB")?.trim().parse::<f64>().ok())
        .map_or("unknown".into(), |kb| format!("{:.1} GiB", kb / 1024.0 / 1024.0));
    let virt = sh("systemd-detect-virt", &[]);
    let commit = sh("git", &["rev-parse", "--short", "HEAD"]);
    let dirty = !sh("git", &["status", "--porcelain", "--untracked-files=no"]).is_empty();
    let mut m = vec![
        ("CPU".to_string(), model),
        ("cores".to_string(), cores.to_string()),
        ("memory".to_string(), mem),
        ("kernel".to_string(), kernel),
    ];
    if !virt.is_empty() && virt != "none" {
        m.push(("virtualization".into(), virt));
    }
    m.push(("stall".into(), format!("{commit}{}", if dirty { " (with uncommitted changes)" } else { "" })));
    m
}

pub fn render(
    meta: &Meta,
    ws: &[Workload],
    profiles: &[Profile],
    cost: &[CostRow],
    daemon: &DaemonBench,
    py: &PyStacksBench,
) -> String {
    let mut d = String::new();
    let date = sh("date", &["-u", "+%Y-%m-%d %H:%M UTC"]);
    let _ = writeln!(d, "# stall: performance\n");
    let _ = writeln!(
        d,
        "Generated by `cargo xtask bench{}` on {date} ({} runs per mode, {:.1} minutes). Do not edit by hand: \
         rerun the bench (as root; `--quick` for a shorter pass, `--runs N` for more runs).\n",
        if meta.quick { " --quick" } else { "" },
        meta.runs,
        meta.minutes
    );
    let _ = writeln!(d, "## Machine\n");
    for (k, v) in machine() {
        let _ = writeln!(d, "- {k}: {v}");
    }
    let q = meta.quiet;
    let _ = writeln!(
        d,
        "- load average (1 min) at start / end: {:.2} / {:.2}; other tracing BPF programs loaded at the start \
         of {} of {} samples (the bench waited {:.0} s in all for them to go)",
        meta.load.0,
        meta.load.1,
        q.contaminated,
        q.samples,
        q.waited.as_secs_f64()
    );
    if q.contaminated > 0 {
        let _ = writeln!(
            d,
            "\n**Another tracer was attached during {} samples: their baselines are slowed too, and the \
             figures below understate stall's relative cost.**",
            q.contaminated
        );
    }

    let _ = writeln!(d, "\n## Targets\n");
    let _ = writeln!(d, "| target | measured | result | margin |\n|---|---|---|---|");
    for t in targets(ws, cost, daemon) {
        let _ = writeln!(d, "| {} | {} | {} | {} |", t.what, t.measured, verdict(t.met), t.margin);
    }

    let _ = writeln!(d, "\n{}", WHERE_THE_COST_IS.trim_end());

    let _ = writeln!(d, "\n## Traced workloads\n");
    let _ = writeln!(
        d,
        "Each workload times its own operation loop (process start, stall's start-up and report excluded) \
         and runs under four modes, interleaved run by run in rotating order: no tracer; `stall run --gpu off \
         -q -- CMD`; `strace -f -qq -o /dev/null -e {}` (fewer ops where it would take minutes: per-op \
         figures compare); and the floor, `stall run --floor` (the same programs attached, every one \
         returning at once: the cost of the tracepoints themselves). Medians over the runs; the range is \
         the lowest and highest ns/op seen. Ratios and added ns are per op against the baseline median. \
         The targets against the floor are judged round by round: each round runs every mode once, back to \
         back, and gives stall's distance above the floor in points of that round's baseline (and, for the \
         targets of added time, its ratio to that round's baseline); the median of the rounds is the \
         figure. pread-4k, copy-4k and futex-pingpong run {} rounds per run: their loops are short, their \
         targets a few points, and one round alone spreads over several points on these hosts.",
        super::STRACE_FILTER,
        super::PER_CALL_ROUNDS
    );
    if !meta.strace {
        let _ = writeln!(d, "\nstrace was not installed: its rows are missing.");
    }
    if let Some(rev) = &meta.before {
        let _ = writeln!(
            d,
            "\nWith `--before {rev}`, one more mode in the same rotation: `stall run` as built from {rev} \
             (\"{}\").",
            Mode::Before.label()
        );
    }
    for w in ws {
        let _ = writeln!(d, "\n### {}: {}\n\n{}.\n", w.key, w.title, w.what);
        let _ = writeln!(
            d,
            "| mode | runs | ops/run | median loop time | ns per {u} (range) | ratio | added ns per {u} |",
            u = w.unit
        );
        let _ = writeln!(d, "|---|---:|---:|---:|---:|---:|---:|");
        for mode in Mode::ALL {
            let Some(s) = stats(w, mode) else { continue };
            let (ratio, added) = versus(w, mode).unwrap_or((f64::NAN, f64::NAN));
            let added = if mode == Mode::Baseline { "—".to_string() } else { format!("{added:+.1}") };
            let _ = writeln!(
                d,
                "| {} | {} | {} | {:.3} s | {} ({}–{}) | {ratio:.3}× | {added} |",
                mode.label(),
                s.runs,
                s.ops,
                s.secs,
                ns(s.ns_op),
                ns(s.min),
                ns(s.max)
            );
        }
        if let (Some((rs, sa)), Some((rf, fa)), Some((pp, lo, hi))) =
            (versus(w, Mode::Stall), versus(w, Mode::Floor), above_floor(w, Mode::Stall))
        {
            let _ = writeln!(
                d,
                "\nstall above the floor: {:+.1} pp, {:+.1} ns per {} (medians); round by round {pp:+.1} pp \
                 ({lo:+.1} to {hi:+.1}); the floor itself: {:+.1} %.",
                (rs - rf) * 100.0,
                sa - fa,
                w.unit,
                pct(rf)
            );
        }
        if let (Some(rev), Some((rs, sa)), Some((rb, ba))) =
            (&meta.before, versus(w, Mode::Stall), versus(w, Mode::Before))
        {
            let _ = writeln!(
                d,
                "\nstall now against stall as of {rev}: {:+.1} pp, {:+.1} ns per {}.",
                (rs - rb) * 100.0,
                sa - ba,
                w.unit
            );
        }
    }

    render_profiles(&mut d, profiles);
    if let Some(rev) = &meta.before {
        render_before_after(&mut d, profiles, rev);
    }
    render_daemon(&mut d, daemon, meta.before.as_deref());
    render_pystacks(&mut d, py);

    let _ = writeln!(d, "\n## Agent cost\n");
    let _ = writeln!(
        d,
        "`stall attach --pid` to a job reading 4 KiB from a cached file at a set rate (or open + read + close \
         in a loop), for {:.0} s each. stall's CPU time and peak RSS are its own (`wait4` on it; start-up, \
         BPF loading and the final report included); lost events are its `--json` summary's `lost_events`. \
         *Once attached* is its CPU over the middle of the run only (its threads' `schedstat`, from 0.7 s \
         after its programs are loaded to 0.5 s before the end): what the job's events cost it, without \
         the fixed cost of start-up and report. \
         Events are what stall counts: one per program run for a tracked thread (a read is 2: enter and \
         exit; open + read + close is 5, of which the open and the close are ring-buffer records). \
         In-kernel program time is charged to the traced job and shows in the workload tables above, \
         not here.\n",
        cost.first().map_or(0.0, |r| r.traced_s.round())
    );
    let _ = writeln!(
        d,
        "| traced job | ops/s achieved | events/s | ring-buffer records/s | stall CPU | % of one core | % once attached | CPU s per 1M events | peak RSS | lost events |"
    );
    let _ = writeln!(d, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in cost {
        let _ = writeln!(
            d,
            "| {} | {:.0} | {:.0} | {:.0} | {:.3} s / {:.1} s | {:.2} % | {} | {} | {:.1} MiB | {} |",
            r.label,
            r.achieved,
            r.events_per_s(),
            r.achieved * r.records_per_op,
            r.cpu_s,
            r.traced_s,
            r.core_pct(),
            r.steady_pct.map_or("—".into(), |p| format!("{p:.2} %")),
            if r.cpu_per_million().is_finite() && r.events_per_s() >= 1e3 {
                format!("{:.4}", r.cpu_per_million())
            } else {
                "—".into()
            },
            r.rss_kb as f64 / 1024.0,
            r.lost
        );
    }
    let best =
        cost.iter().filter(|r| r.lost == 0).max_by(|a, b| a.events_per_s().total_cmp(&b.events_per_s()));
    if let Some(b) = best {
        let _ = writeln!(
            d,
            "\nHighest sustained rate with zero lost events: {:.0} events/s ({}: {:.0} ops/s, {:.0} ring-buffer \
             records/s). Reads are counted in maps and never use the ring buffer, so the read rate is \
             bounded by the machine, not by stall; opens, closes, forks and exits are the records that can be \
             lost.",
            b.events_per_s(),
            b.label,
            b.achieved,
            b.achieved * b.records_per_op
        );
    }
    reflow(&d)
}

fn ns(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn render_profiles(d: &mut String, profiles: &[Profile]) {
    let _ = writeln!(d, "\n## Where the time goes: stall's programs\n");
    let _ = writeln!(
        d,
        "Kernel BPF run-time statistics (`BPF_ENABLE_STATS`, on only while measuring) for stall's programs \
         while it is attached, over {:.1} s per workload. They count time inside the programs only, not \
         the tracepoint machinery around them (that is the floor's cost in the tables above), and include \
         the statistics' own clock reads: the floor's programs, which return at once, show that share. \
         Runs per op include every task on the machine that hits the tracepoints (sched_switch of all \
         CPUs, other processes' reads).",
        profiles.first().map_or(0.0, |p| p.secs)
    );
    if let Some(f) = profiles.iter().find(|p| p.floor) {
        let (runs, ns) = f.progs.iter().fold((0u64, 0u64), |(r, n), c| (r + c.runs, n + c.ns));
        let _ = writeln!(
            d,
            "\nAn empty program (the floor's) measures {:.0} ns per run here: subtract that from the \
             ns-per-run column for the programs' own work.",
            ns as f64 / runs.max(1) as f64
        );
    }
    for p in profiles.iter().filter(|p| !p.before) {
        render_profile(d, p);
    }
}

/// The scheduler programs' variants (`sched_switch_direct`,
/// `sched_waking_marked`...) are one program to compare across builds.
fn program_family(name: &str) -> &str {
    if name.starts_with("sched_switch") {
        "sched_switch"
    } else if name.starts_with("sched_waking") {
        "sched_waking"
    } else if name.starts_with("sys_exit") {
        "sys_exit"
    } else {
        name
    }
}

/// Each profiled workload under the `--before` build and the current one,
/// measured one after the other in this run: ns of programs per op, each
/// program and in all.
fn render_before_after(d: &mut String, profiles: &[Profile], rev: &str) {
    let _ = writeln!(d, "\n## Before and after: stall as of {rev}, and now\n");
    let _ = writeln!(
        d,
        "`cargo xtask bench --before {rev}`: the same workloads' programs under stall as built from {rev} and \
         under the current build, one after the other in this run (kernel run-time statistics as above). \
         ns of BPF programs per op; `sched_switch` and `sched_waking` are whichever variant each build loaded. The daemon's \
         are under \"stall daemon on a node\"."
    );
    render_changes(d, profiles, rev);
}

/// Per profile measured under both builds: its programs' ns per op, then
/// and now.
fn render_changes(d: &mut String, profiles: &[Profile], rev: &str) {
    for now in profiles.iter().filter(|p| !p.before) {
        let Some(was) = profiles.iter().find(|p| p.before && p.label == now.label) else { continue };
        let (ops_now, ops_was) = (now.ops().max(1.0), was.ops().max(1.0));
        let per_op = |p: &Profile, ops: f64, family: &str| -> Option<f64> {
            let ns: u64 = p.progs.iter().filter(|c| program_family(&c.name) == family).map(|c| c.ns).sum();
            (ns > 0).then_some(ns as f64 / ops)
        };
        let mut families: Vec<&str> = Vec::new();
        for c in now.progs.iter().chain(&was.progs).filter(|c| c.runs > 0) {
            let f = program_family(&c.name);
            if !families.contains(&f) {
                families.push(f);
            }
        }
        // Costliest now first; programs below a nanosecond per op in both are left out.
        families.retain(|f| {
            per_op(now, ops_now, f).unwrap_or(0.0).max(per_op(was, ops_was, f).unwrap_or(0.0)) >= 1.0
        });
        families.sort_by(|a, b| {
            let key = |f: &str| per_op(now, ops_now, f).or(per_op(was, ops_was, f)).unwrap_or(0.0);
            key(b).total_cmp(&key(a))
        });
        let _ = writeln!(d, "\n**{}** (ns per {}):\n", now.label, now.unit);
        let _ = writeln!(d, "| program | {rev} | now | change |\n|---|---:|---:|---:|");
        let cell = |v: Option<f64>| v.map_or("—".to_string(), ns);
        let change = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if a > 0.0 => format!("{:+.0} %", 100.0 * (b - a) / a),
            _ => "—".to_string(),
        };
        for f in families {
            let (a, b) = (per_op(was, ops_was, f), per_op(now, ops_now, f));
            let _ = writeln!(d, "| {f} | {} | {} | {} |", cell(a), cell(b), change(a, b));
        }
        let (a, b) = (was.total_ns() as f64 / ops_was, now.total_ns() as f64 / ops_now);
        let _ = writeln!(d, "| **all** | {} | {} | {} |", ns(a), ns(b), change(Some(a), Some(b)));
    }
}

/// One profile: its ops per second and its programs, costliest first.
fn render_profile(d: &mut String, p: &Profile) {
    let ops = p.ops().max(1.0);
    let _ = writeln!(
        d,
        "\n**{}**: {:.0} {}/s; {:.0} ns of BPF programs per {}.\n",
        p.label,
        p.ops_per_s,
        super::profile::plural(p.unit),
        p.total_ns() as f64 / ops,
        p.unit
    );
    let mut progs: Vec<_> = p.progs.iter().filter(|c| c.runs > 0).collect();
    if progs.is_empty() {
        let _ = writeln!(d, "No program of stall's ran.");
        return;
    }
    let _ = writeln!(d, "| program | runs per {u} | ns per run | ns per {u} | share |", u = p.unit);
    let _ = writeln!(d, "|---|---:|---:|---:|---:|");
    let total = p.total_ns().max(1) as f64;
    progs.sort_by_key(|c| std::cmp::Reverse(c.ns));
    for c in progs {
        let _ = writeln!(
            d,
            "| {} | {:.3} | {:.0} | {:.1} | {:.0} % |",
            c.name,
            c.runs as f64 / ops,
            c.ns as f64 / c.runs as f64,
            c.ns as f64 / ops,
            100.0 * c.ns as f64 / total
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::profile::ProgCost;

    fn workload(samples: &[(Mode, u64)]) -> Workload {
        Workload {
            key: "w",
            title: "w",
            what: String::new(),
            unit: "read",
            args: Vec::new(),
            strace_args: Vec::new(),
            neighbour: false,
            rounds_per_run: 1,
            samples: samples.iter().map(|&(m, ns)| (m, Sample { ops: 1, ns })).collect(),
        }
    }

    #[test]
    fn the_floor_distance_is_paired_by_round() {
        use Mode::{Baseline, Floor, Stall};
        // The machine slows by half in the second round and by a fifth in
        // the third (modes in rotating order): every round has stall 10
        // points of its own baseline above the floor.
        let w = workload(&[
            (Baseline, 100),
            (Stall, 140),
            (Floor, 130),
            (Stall, 210),
            (Floor, 195),
            (Baseline, 150),
            (Floor, 156),
            (Baseline, 120),
            (Stall, 168),
        ]);
        let (pp, lo, hi) = above_floor(&w, Stall).unwrap();
        assert!(
            (pp - 10.0).abs() < 1e-9 && (lo - 10.0).abs() < 1e-9 && (hi - 10.0).abs() < 1e-9,
            "{pp} {lo} {hi}"
        );
        assert!(above_floor(&workload(&[(Baseline, 100), (Floor, 120)]), Stall).is_none());
        assert!((paired_ratio(&w, Stall).unwrap() - 1.4).abs() < 1e-9);
    }

    #[test]
    fn the_hand_measured_prose_is_written_as_it_is() {
        assert!(WHERE_THE_COST_IS.starts_with("## Where the cost is"), "{WHERE_THE_COST_IS:.80}");
        for line in WHERE_THE_COST_IS.lines() {
            assert!(line.chars().count() <= WIDTH, "longer than {WIDTH}: {line}");
        }
        assert_eq!(reflow(WHERE_THE_COST_IS), WHERE_THE_COST_IS);
    }

    #[test]
    fn a_long_line_breaks_at_sentences_then_words() {
        let item = format!(
            "- **A finding.** {} `a code span that stays whole` and - more. stall goes on; e.g. This stays.",
            "word ".repeat(30).trim_end()
        );
        let out = reflow(&format!("| {} |\n{item}\nshort.\n", "wide ".repeat(40)));
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].len() > WIDTH, "tables keep their width");
        assert_eq!(lines[1], "- **A finding.**");
        assert!(lines[2].starts_with("  word word"), "{out}");
        assert!(lines.iter().any(|l| l.contains("`a code span that stays whole`")), "{out}");
        assert!(lines.iter().all(|l| !l.trim_start().starts_with("- ") || l.starts_with("- **")), "{out}");
        assert!(lines.iter().any(|l| l.starts_with("  stall goes on; e.g. This stays.")), "{out}");
        assert_eq!(lines.last(), Some(&"short."));
        // Nothing but the line breaks changed.
        let words = |s: &str| s.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        assert_eq!(words(&out), words(&format!("| {} |\n{item}\nshort.", "wide ".repeat(40))));
    }

    #[test]
    fn the_report_keeps_prose_lines_short() {
        use Mode::{Baseline, Before, Floor, Stall, Strace, Timeline};
        let mut w = workload(&[
            (Baseline, 800),
            (Stall, 1000),
            (Timeline, 1040),
            (Strace, 93_000),
            (Floor, 980),
            (Before, 1020),
        ]);
        w.what = format!("a workload described at length, {}", "and at more length ".repeat(12).trim_end());
        let meta = Meta {
            quick: false,
            runs: 5,
            strace: true,
            minutes: 12.9,
            quiet: Quiet { contaminated: 2, samples: 485, ..Quiet::default() },
            load: (1.13, 0.76),
            before: Some("361302f".into()),
        };
        let prog = |name: &str, runs, ns| ProgCost { name: name.into(), runs, ns };
        let profile = |label, before| Profile {
            label,
            unit: "read",
            floor: false,
            secs: 2.0,
            ops_per_s: 900_000.0,
            progs: vec![
                prog("sys_enter", 1_700_000, 90_000_000),
                prog("sys_exit_cast", 1_700_000, 95_000_000),
            ],
            before,
        };
        let profiles = vec![
            profile("pread-4k: 4 KiB reads, traced", false),
            profile("pread-4k: 4 KiB reads, traced", true),
        ];
        let watched = |ns| Watch::ALL.iter().map(|&m| (m, Sample { ops: 1000, ns })).collect::<Vec<_>>();
        let daemon = DaemonBench {
            reads: 262_144,
            rounds: 6,
            job: watched(900_000),
            neighbour: watched(880_000),
            switches: 500_000,
            switcher: watched(2_160_000),
            profiles: vec![profile("daemon, escalated: a neighbour's reads", false)],
        };
        let cost = vec![CostRow {
            label: "50k reads/s (≈100k events/s)".into(),
            rate: Some(50_000),
            achieved: 49_999.0,
            events_per_op: 2.0,
            records_per_op: 0.0,
            traced_s: 8.1,
            cpu_s: 0.104,
            steady_pct: Some(0.18),
            rss_kb: 50_000,
            lost: 0,
        }];
        let py = PyStacksBench {
            secs: 4.0,
            samples: vec![(Reader::None, Sample { ops: 8_800_000, ns: 1_000_000_000 })],
        };
        let doc = render(&meta, &[w], &profiles, &cost, &daemon, &py);
        assert!(doc.contains(WHERE_THE_COST_IS.trim_end()));
        for line in doc.lines().filter(|l| !l.starts_with('|')) {
            assert!(line.chars().count() <= WIDTH, "longer than {WIDTH}: {line}");
        }
    }
}
