//! The live view: on a terminal, a screen redrawn every interval; elsewhere
//! one plain line per interval.
use std::fmt::Write;

use super::{report, View};
use crate::units;

pub fn screen(v: &View, rate_per_s: f64, rows: usize) -> String {
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
                    "GPU{} {:<20} util {:>3.0}%  idle {}",
                    g.index,
                    g.name,
                    g.util_mean_pct,
                    units::pct(g.idle_fraction)
                );
            }
        }
    }
    let _ = writeln!(out);
    for line in report::table(v, rows.saturating_sub(8).max(4)) {
        let _ = writeln!(out, "{line}");
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "verdict: {}  {}", v.verdict.kind.as_str(), v.verdict.summary);
    out
}

pub fn plain(v: &View) -> String {
    format!("[{:>7}] {}: {}", units::secs(v.elapsed_s), v.verdict.kind.as_str(), v.verdict.summary)
}
