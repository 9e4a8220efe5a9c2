//! The live view: on a terminal, a screen redrawn every interval; elsewhere
//! one plain line per interval.
use std::fmt::Write;

use super::{report, View};
use crate::units;

/// The live screen for a terminal of `rows` × `cols`: no line longer than
/// `cols` (a longer one would wrap and push the screen down), and no more
/// lines than the terminal has.
pub fn screen(v: &View, rate_per_s: f64, rows: usize, cols: usize) -> String {
    let cols = cols.max(1);
    let mut lines = vec![header(v, rate_per_s, cols)];
    match (v.gpus.is_empty(), v.gpu_note) {
        (true, Some(note)) => lines.push(fit(note, cols)),
        _ => {
            for g in v.gpus {
                lines.push(fit(
                    &format!(
                        "GPU{} {:<20} util {:>3.0}%  idle {}{}",
                        g.index,
                        g.name,
                        g.util_mean_pct,
                        units::pct(g.idle_fraction),
                        super::gpu_power(g)
                    ),
                    cols,
                ));
            }
        }
    }
    lines.push(fit(&super::progress_line(v.progress), cols));
    lines.push(String::new());
    let text = format!("verdict: {}", words(v));
    let mut verdict = wrap(&text, cols);
    // Lines left below the top ones, the cursor's own line at the bottom
    // kept free; the table keeps its header and two rows at least, the
    // verdict what it needs, cut short on a tiny terminal.
    let budget = rows.saturating_sub(lines.len() + 1);
    let table_min = 3;
    let most = budget.saturating_sub(table_min + 1).max(1);
    if verdict.len() > most {
        verdict.truncate(most);
        if let Some(last) = verdict.last_mut() {
            *last = fit(&format!("{last} …"), cols);
        }
    }
    let room = budget.saturating_sub(verdict.len() + 1).max(table_min);
    // The columns before TOP FILE take 112 characters.
    let file_cols = cols.saturating_sub(112).max(12);
    // table() may add a "quiet threads" line after its rows.
    for line in report::table(v, room.saturating_sub(2), Some(file_cols)).into_iter().take(room) {
        lines.push(fit(&line, cols));
    }
    lines.push(String::new());
    lines.extend(verdict);
    let mut out = String::new();
    // Home + clear: redraw in place without scrolling.
    out.push_str("\x1b[H\x1b[2J");
    for line in lines {
        let _ = writeln!(out, "{line}");
    }
    for s in v.verdict.python_stacks.iter().take(4) {
        let _ = writeln!(out, "{}", fit(&format!("  {} {}: {}", s.what, s.tid, s.line()), cols));
    }
    out
}

/// "stall  TARGET  12.0s  events 5000/s  lost 0": the target (a command line
/// can be any length) gives way to the numbers.
fn header(v: &View, rate_per_s: f64, cols: usize) -> String {
    let numbers =
        format!("  {}  events {:.0}/s  lost {}", units::secs(v.elapsed_s), rate_per_s, v.window.lost_total());
    let room = cols.saturating_sub("stall  ".len() + numbers.chars().count());
    if room < 8 {
        return fit(&format!("stall{numbers}"), cols);
    }
    format!("stall  {}{numbers}", fit(v.target, room))
}

pub fn plain(v: &View) -> String {
    format!("[{:>7}] {}", units::secs(v.elapsed_s), words(v).replacen("  ", ": ", 1))
}

/// The live verdict: its kind and summary, or, while the job starts up,
/// that it does (imports judged as the steady state would mislead), with
/// what it looks like so far for jobs whose pipeline never shows.
fn words(v: &View) -> String {
    if v.starting_up {
        return format!(
            "starting up  the input pipeline has not run yet (imports, set-up); so far {}",
            v.verdict.kind.as_str()
        );
    }
    format!("{}  {}", v.verdict.kind.as_str(), v.verdict.summary.shown())
}

/// Cuts a line to the terminal width (no wrapping inside the table).
fn fit(line: &str, cols: usize) -> String {
    if line.chars().count() <= cols {
        return line.to_string();
    }
    let mut s: String = line.chars().take(cols.saturating_sub(1)).collect();
    s.push('…');
    s
}

/// Word-wraps at the terminal width; a word longer than a line (a path) is
/// cut into pieces that fit.
fn wrap(text: &str, cols: usize) -> Vec<String> {
    let cols = cols.max(1);
    let mut lines = vec![String::new()];
    let mut words: Vec<String> = Vec::new();
    for word in text.split(' ') {
        let chars: Vec<char> = word.chars().collect();
        if chars.len() <= cols {
            words.push(word.to_string());
        } else {
            words.extend(chars.chunks(cols).map(|c| c.iter().collect::<String>()));
        }
    }
    for word in &words {
        let cur = lines.last_mut().unwrap();
        if !cur.is_empty() && cur.chars().count() + 1 + word.chars().count() > cols {
            lines.push(word.to_string());
        } else {
            if !cur.is_empty() {
                cur.push(' ');
            }
            cur.push_str(word);
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::{
        aggregate::{FileWindow, ProcWindow, ThreadWindow, Window},
        correlate::Roles,
        gpu::GpuWindow,
        progress::ProgressView,
        verdict::{Kind, Verdict},
    };

    #[test]
    fn fits_and_wraps_to_the_terminal() {
        assert_eq!(fit("abcdef", 4), "abc…");
        assert_eq!(fit("abc", 4), "abc");
        assert_eq!(wrap("aa bb cc dd", 5), vec!["aa bb", "cc dd"]);
        assert!(wrap(&"word ".repeat(50), 20).iter().all(|l| l.chars().count() <= 20));
        assert_eq!(wrap("a /very/long/path", 6), vec!["a", "/very/", "long/p", "ath"]);
    }

    /// A busy job with a long command line, a long file path, a GPU and a
    /// long verdict, drawn on terminals from 20 to 250 columns.
    #[test]
    fn the_screen_fits_any_terminal() {
        let long_path = format!("/data/{}/shard-00042.tar", "imagenet-train".repeat(8));
        let threads = (0..40)
            .map(|i| {
                let mut t =
                    ThreadWindow { tid: 1000 + i, comm: format!("pt_data_worker_{i}"), ..Default::default() };
                t.delta.on_cpu_ns = 500_000_000;
                t.delta.file_read_bytes = 10 << 20;
                t
            })
            .collect();
        let proc = ProcWindow {
            tgid: 1000,
            comm: "python3".into(),
            alive: true,
            threads,
            files: vec![FileWindow {
                path: long_path.clone(),
                read_bytes: 10 << 20,
                read_calls: 9,
                ..Default::default()
            }],
            ..Default::default()
        };
        let window = Window { start_ns: 0, end_ns: 1_000_000_000, procs: vec![proc], ..Default::default() };
        let gpus = [GpuWindow {
            index: 0,
            name: "NVIDIA H100 80GB HBM3 with a long name".into(),
            util_mean_pct: 12.0,
            idle_fraction: 0.8,
            samples: 10,
            max_gap_s: 0.1,
            power_w: Some(95.0),
            power_limit_w: Some(700.0),
            sm_util_pct: Some(3.0),
            pids: vec![],
        }];
        let verdict = Verdict {
            kind: Kind::InputIoBound,
            summary: format!("Trainer main thread blocked 87% of 26.1s, woken 487 times by 4 workers; {long_path} read at 92.1 MB/s").into(),
            evidence: Vec::new(),
            host_only: false,
            ..Default::default()
        };
        let progress = ProgressView { known: true, ..Default::default() };
        let target = format!("python3 train.py {}", "--some-flag value ".repeat(12));
        let v = View {
            window: &window,
            roles: &Roles::default(),
            gpus: &gpus,
            verdict: &verdict,
            elapsed_s: 12.0,
            target: &target,
            gpu_note: None,
            progress: &progress,
            ending: None,
            starting_up: false,
        };
        for (rows, cols) in [(24, 20), (24, 40), (24, 80), (30, 100), (40, 130), (50, 200), (60, 250)] {
            let text = screen(&v, 5000.0, rows, cols);
            let body = text.strip_prefix("\x1b[H\x1b[2J").unwrap();
            let lines: Vec<&str> = body.lines().collect();
            for line in &lines {
                assert!(line.chars().count() <= cols, "{cols} columns: {line:?} is {}", line.chars().count());
            }
            assert!(lines.len() < rows, "{rows} rows: {} lines", lines.len());
            assert!(lines[0].starts_with("stall  python3 train.py") || cols < 60, "{cols}: {}", lines[0]);
            assert!(lines[0].ends_with("events 5000/s  lost 0") || cols < 40, "{cols}: {}", lines[0]);
            assert!(body.contains(Kind::InputIoBound.as_str()), "{cols}");
        }
    }

    #[test]
    fn the_live_verdict_says_starting_up_while_the_job_starts() {
        let window = Window { start_ns: 0, end_ns: 1_000_000_000, ..Default::default() };
        let verdict = Verdict {
            kind: Kind::TrainerHostBound,
            summary: "Trainer main thread on CPU 100%; input is not the bottleneck".into(),
            ..Default::default()
        };
        let progress = ProgressView::default();
        let mut v = View {
            window: &window,
            roles: &Roles::default(),
            gpus: &[],
            verdict: &verdict,
            elapsed_s: 3.0,
            target: "python3 train.py",
            gpu_note: None,
            progress: &progress,
            ending: None,
            starting_up: true,
        };
        for text in [plain(&v), screen(&v, 100.0, 40, 200)] {
            assert!(text.contains("starting up"), "{text}");
            assert!(!text.contains("input is not the bottleneck"), "{text}");
        }
        v.starting_up = false;
        assert!(plain(&v).contains("trainer-host-bound: Trainer main thread"), "{}", plain(&v));
    }
}
