//! The timeline as one self-contained SVG: a band per thread coloured by
//! its state, 100 ms a step, the GPUs' utilization above; small enough to
//! paste into a chat or an issue.
use std::fmt::Write;

use super::{Picture, STATES};

/// One thread's band.
pub struct Band {
    pub label: String,
    /// trainer 0, worker 1, other 2: the order of the bands.
    pub rank: u8,
    pub tid: u32,
    /// Per step, ns per state (by `State::index`).
    pub buckets: Vec<[u32; STATES]>,
}

/// Colours by `State::index`: on-CPU, futex, io, poll, sleep, runqueue,
/// other, write, sync, throttled, send.
const COLORS: [&str; STATES] = [
    "#2e7d32", "#f9a825", "#c62828", "#1565c0", "#9e9e9e", "#ef6c00", "#6a1b9a", "#ad1457", "#4e342e",
    "#00838f", "#5d4037",
];
const NAMES: [&str; STATES] =
    ["on-cpu", "futex", "io", "poll", "sleep", "runqueue", "other", "write", "sync", "throttled", "send"];

const WIDTH: f64 = 1000.0;
const LABEL: f64 = 230.0;
const BAND: f64 = 14.0;
const GPU_H: f64 = 40.0;
/// Bands drawn at most (the busiest kinds first: trainer, workers, others).
const MAX_BANDS: usize = 40;

pub fn render(p: &Picture, title: &str) -> String {
    let steps = (p.span_ns.div_ceil(p.bucket_ns) as usize).max(1);
    let dx = WIDTH / steps as f64;
    let bands: Vec<&Band> = p.threads.iter().take(MAX_BANDS).collect();
    let gpu_h = if p.gpus.is_empty() { 0.0 } else { GPU_H * p.gpus.len() as f64 + 10.0 };
    let top = 30.0;
    let height = top + gpu_h + bands.len() as f64 * BAND + 70.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{height:.0}" font-family="sans-serif" font-size="11">"#,
        LABEL + WIDTH + 10.0
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="4" y="16" font-size="13" font-weight="bold">{} — {:.1} s</text>"#,
        esc(title),
        p.span_ns as f64 / 1e9
    );
    let mut y = top;
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
                let _ =
                    write!(pts, "{:.1},{:.1} ", LABEL + (k as f64 + 0.5) * dx, y + GPU_H - v / 100.0 * GPU_H);
            }
        }
        let _ = writeln!(s, r##"<polyline points="{pts}" fill="none" stroke="#000" stroke-width="1.2"/>"##);
        y += GPU_H + 10.0;
    }
    for b in &bands {
        let _ = writeln!(s, r#"<text x="4" y="{:.0}">{}</text>"#, y + BAND - 3.0, esc(&b.label));
        // Runs of one colour become one rect (a long run is one element).
        let mut run: Option<(usize, usize)> = None; // (start step, state)
        let dominant = |k: usize| -> Option<usize> {
            let c = b.buckets.get(k)?;
            let (i, v) = c.iter().enumerate().max_by_key(|(_, v)| **v)?;
            (*v > 0).then_some(i)
        };
        for k in 0..=steps {
            let st = if k < steps { dominant(k) } else { None };
            match (run, st) {
                (Some((_, rs)), Some(st)) if rs == st => {}
                _ => {
                    if let Some((from, rs)) = run.take() {
                        let _ = writeln!(
                            s,
                            r#"<rect x="{:.1}" y="{y:.0}" width="{:.1}" height="{}" fill="{}"/>"#,
                            LABEL + from as f64 * dx,
                            (k - from) as f64 * dx,
                            BAND - 2.0,
                            COLORS[rs]
                        );
                    }
                    run = st.map(|st| (k, st));
                }
            }
        }
        y += BAND;
    }
    if p.threads.len() > MAX_BANDS {
        let _ = writeln!(
            s,
            r#"<text x="4" y="{:.0}">… and {} more threads</text>"#,
            y + 12.0,
            p.threads.len() - MAX_BANDS
        );
        y += 16.0;
    }
    // A time axis: a tick every 1, 2, 5, 10... s, about ten in all.
    let span_s = p.span_ns as f64 / 1e9;
    let step = [1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0]
        .into_iter()
        .find(|st| span_s / st <= 12.0)
        .unwrap_or(7200.0);
    let _ =
        writeln!(s, r##"<line x1="{LABEL}" y1="{y:.0}" x2="{}" y2="{y:.0}" stroke="#888"/>"##, LABEL + WIDTH);
    let mut t = 0.0;
    while t <= span_s {
        let x = LABEL + t / span_s.max(1e-9) * WIDTH;
        let _ =
            writeln!(s, r##"<line x1="{x:.1}" y1="{y:.0}" x2="{x:.1}" y2="{:.0}" stroke="#888"/>"##, y + 4.0);
        let _ = writeln!(s, r#"<text x="{x:.1}" y="{:.0}" text-anchor="middle">{t:.0} s</text>"#, y + 15.0);
        t += step;
    }
    y += 18.0;
    let mut x = LABEL;
    for (i, name) in NAMES.iter().enumerate() {
        let _ = writeln!(
            s,
            r#"<rect x="{x:.0}" y="{:.0}" width="10" height="10" fill="{}"/>"#,
            y + 12.0,
            COLORS[i]
        );
        let _ = writeln!(s, r#"<text x="{:.0}" y="{:.0}">{name}</text>"#, x + 14.0, y + 21.0);
        x += 90.0;
    }
    s.push_str("</svg>\n");
    s
}

fn esc(t: &str) -> String {
    t.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
