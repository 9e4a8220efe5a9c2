//! The rows over the threads: the GPUs' utilization (or a note that there
//! was none), the live verdict per interval, the job's file reads.
use std::fmt::Write;

use super::{Scale, BAND, LABEL, WIDTH};
use crate::{timeline::Picture, verdict::Kind};

/// Colours by the kind's place in `Kind::ALL`.
/// Light tints of their own, none a thread state's colour: a verdict row
/// in the futex yellow read as a thread in futex.
pub(super) const KIND_COLORS: [&str; Kind::ALL.len()] =
    ["#ef9a9a", "#ffcc80", "#80cbc4", "#f48fb1", "#000000", "#ce93d8", "#a5d6a7", "#e0e0e0", "#bcaaa4"];
const GPU_H: f64 = 40.0;
const READS_H: f64 = 30.0;

/// A utilization line per GPU, or a note row where none was sampled.
pub(super) fn gpus(s: &mut String, p: &Picture, sc: &Scale, mut y: f64) -> f64 {
    if p.gpus.is_empty() {
        let _ = writeln!(
            s,
            r##"<text x="4" y="{:.0}" fill="#757575" font-style="italic">no GPU data (NVML not found / --gpu off)</text>"##,
            y + BAND - 3.0
        );
        return y + BAND + 4.0;
    }
    for (index, buckets) in &p.gpus {
        let _ = writeln!(s, r#"<text x="4" y="{:.0}">GPU{index} utilization</text>"#, y + GPU_H / 2.0 + 4.0);
        let _ = writeln!(
            s,
            r##"<rect x="{LABEL}" y="{y:.0}" width="{WIDTH}" height="{GPU_H}" fill="#f5f5f5" stroke="#ccc"/>"##
        );
        let mut pts = String::new();
        for (k, (sum, n)) in buckets.iter().enumerate() {
            if *n > 0 {
                let v = sum / f64::from(*n);
                let x = LABEL + (k as f64 + 0.5) * sc.dx;
                let _ = write!(pts, "{x:.1},{:.1} ", y + GPU_H - v / 100.0 * GPU_H);
            }
        }
        let _ = writeln!(s, r##"<polyline points="{pts}" fill="none" stroke="#000" stroke-width="1.2"/>"##);
        y += GPU_H + 10.0;
    }
    y
}

/// The live verdict of each interval, a colour per kind.
pub(super) fn verdicts(s: &mut String, p: &Picture, sc: &Scale, y: f64) -> f64 {
    let _ = writeln!(s, r#"<text x="4" y="{:.0}">verdict</text>"#, y + BAND - 3.0);
    // Runs of one kind become one rect.
    let mut runs: Vec<(u64, u64, Kind)> = Vec::new();
    for &(a, b, k) in &p.verdicts {
        match runs.last_mut() {
            Some(r) if r.2 == k && r.1 == a => r.1 = b,
            _ => runs.push((a, b, k)),
        }
    }
    for (a, b, k) in runs {
        let x = sc.x(a);
        let _ = writeln!(
            s,
            r#"<rect x="{x:.1}" y="{y:.0}" width="{:.1}" height="{}" fill="{}"><title>{}</title></rect>"#,
            sc.x(b) - x,
            BAND - 2.0,
            kind_color(k),
            k.as_str()
        );
    }
    y + BAND + 4.0
}

pub(super) fn kind_color(k: Kind) -> &'static str {
    KIND_COLORS[Kind::ALL.iter().position(|x| *x == k).unwrap_or(Kind::ALL.len() - 1)]
}

/// The job's file reads: a bar per interval, as high as its rate against
/// the peak one.
pub(super) fn reads(s: &mut String, p: &Picture, sc: &Scale, y: f64) -> f64 {
    let rate = |&(a, b, n): &(u64, u64, u64)| n as f64 / (b.saturating_sub(a).max(1) as f64 / 1e9);
    let total: u64 = p.reads.iter().map(|r| r.2).sum();
    let peak = p.reads.iter().map(rate).fold(0.0, f64::max);
    let label = if total == 0 {
        "file reads: none".to_string()
    } else {
        format!("file reads: {} total, peak {}/s", bytes(total as f64), bytes(peak))
    };
    let _ = writeln!(s, r#"<text x="4" y="{:.0}">{label}</text>"#, y + READS_H / 2.0 + 4.0);
    let _ = writeln!(
        s,
        r##"<rect x="{LABEL}" y="{y:.0}" width="{WIDTH}" height="{READS_H}" fill="#f5f5f5" stroke="#ccc"/>"##
    );
    for r in p.reads.iter().filter(|r| r.2 > 0) {
        let h = rate(r) / peak * READS_H;
        let x = sc.x(r.0);
        let _ = writeln!(
            s,
            r##"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{h:.1}" fill="#1565c0"/>"##,
            y + READS_H - h,
            (sc.x(r.1) - x).max(0.5)
        );
    }
    y + READS_H + 8.0
}

fn bytes(n: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}
