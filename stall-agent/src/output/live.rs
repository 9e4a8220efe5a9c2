//! The live view: on a terminal, a screen redrawn every interval; elsewhere
//! one plain line per interval.
use std::fmt::Write;

use super::{report, View};
use crate::units;

pub fn screen(v: &View, rate_per_s: f64, rows: usize, cols: usize) -> String {
    let mut out = String::new();
    // Home + clear: redraw in place without scrolling.
    out.push_str("\x1b[H\x1b[2J");
    let _ = writeln!(
        out,
        "stall  {}  {}  events {:.0}/s  lost {}",
        v.target,
        units::secs(v.elapsed_s),
        rate_per_s,
        v.window.lost_total()
    );
    match (v.gpus.is_empty(), v.gpu_note) {
        (true, Some(note)) => {
            let _ = writeln!(out, "{note}");
        }
        _ => {
            for g in v.gpus {
                let _ = writeln!(
                    out,
                    "GPU{} {:<20} util {:>3.0}%  idle {}{}",
                    g.index,
                    g.name,
                    g.util_mean_pct,
                    units::pct(g.idle_fraction),
                    super::gpu_power(g)
                );
            }
        }
    }
    let _ = writeln!(out, "{}", fit(&super::progress_line(v.progress), cols));
    let _ = writeln!(out);
    // The columns before TOP FILE take 112 characters.
    let file_cols = cols.saturating_sub(112).max(12);
    for line in report::table(v, rows.saturating_sub(10).max(4), Some(file_cols)) {
        let _ = writeln!(out, "{}", fit(&line, cols));
    }
    let _ = writeln!(out);
    let text = format!("verdict: {}  {}", v.verdict.kind.as_str(), v.verdict.summary);
    for line in wrap(&text, cols) {
        let _ = writeln!(out, "{line}");
    }
    for s in v.verdict.python_stacks.iter().take(4) {
        let _ = writeln!(out, "{}", fit(&format!("  {} {}: {}", s.what, s.tid, s.line()), cols));
    }
    out
}

pub fn plain(v: &View) -> String {
    format!("[{:>7}] {}: {}", units::secs(v.elapsed_s), v.verdict.kind.as_str(), v.verdict.summary)
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

/// Word-wraps at the terminal width.
fn wrap(text: &str, cols: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for word in text.split(' ') {
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

    #[test]
    fn fits_and_wraps_to_the_terminal() {
        assert_eq!(fit("abcdef", 4), "abc…");
        assert_eq!(fit("abc", 4), "abc");
        assert_eq!(wrap("aa bb cc dd", 5), vec!["aa bb", "cc dd"]);
        assert!(wrap(&"word ".repeat(50), 20).iter().all(|l| l.chars().count() <= 20));
    }
}
