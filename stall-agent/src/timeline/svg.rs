//! The timeline as one self-contained SVG, small enough to paste into a
//! chat or an issue. From the top: the GPUs' utilization (or a note that
//! there was none), the live verdict over time, the job's file reads, then
//! a band per thread coloured by its state, 100 ms a step, grouped under
//! a header per process; a dashed line where the startup ended.
use std::fmt::Write;

mod series;

use self::series::{gpus, kind_color, reads, verdicts};
use super::{layout::Group, Picture, STATES};
use crate::verdict::Kind;

/// Colours by `State::index`: on-CPU, futex, io, poll, sleep, runqueue,
/// other, write, sync, throttled, send, stolen.
const COLORS: [&str; STATES] = [
    "#2e7d32", "#f9a825", "#c62828", "#1565c0", "#9e9e9e", "#ef6c00", "#6a1b9a", "#ad1457", "#4e342e",
    "#00838f", "#5d4037", "#ffab91",
];
const NAMES: [&str; STATES] = [
    "on-cpu",
    "futex",
    "io",
    "poll",
    "sleep",
    "runqueue",
    "other",
    "write",
    "sync",
    "throttled",
    "send",
    "stolen",
];

const WIDTH: f64 = 1000.0;
const LABEL: f64 = 230.0;
/// Room right of the time axis: its last label is centred on its end.
const RIGHT: f64 = 30.0;
const BAND: f64 = 14.0;
/// Thread rows and process headers drawn at most (trainer first).
const MAX_ROWS: usize = 40;

/// Where the plot is: x of a time, widths of steps.
struct Scale {
    span_ns: u64,
    dx: f64,
}

impl Scale {
    fn x(&self, ns: u64) -> f64 {
        LABEL + ns.min(self.span_ns) as f64 / self.span_ns.max(1) as f64 * WIDTH
    }
}

pub fn render(p: &Picture, title: &str) -> String {
    let steps = (p.span_ns.div_ceil(p.bucket_ns) as usize).max(1);
    let sc = Scale { span_ns: p.span_ns, dx: WIDTH / steps as f64 };
    let mut s = String::new();
    let mut y = 30.0;
    let _ = writeln!(
        s,
        r#"<text x="4" y="16" font-size="13" font-weight="bold">{} — {:.1} s</text>"#,
        esc(title),
        p.span_ns as f64 / 1e9
    );
    let plot_top = y;
    y = gpus(&mut s, p, &sc, y);
    y = verdicts(&mut s, p, &sc, y);
    y = reads(&mut s, p, &sc, y);
    y = threads(&mut s, &p.groups, steps, &sc, y);
    if let Some(at) = p.startup_ns {
        let x = sc.x(at);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{:.0}" x2="{x:.1}" y2="{y:.0}" stroke="#000" stroke-dasharray="4 3"/>"##,
            plot_top - 4.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.0}" font-size="10">startup ends {:.1} s</text>"#,
            x + 3.0,
            plot_top - 4.0,
            at as f64 / 1e9
        );
    }
    y = axis(&mut s, p.span_ns, y);
    y = legend(&mut s, p, y);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{:.0}" font-family="sans-serif" font-size="11">"#,
        LABEL + WIDTH + RIGHT,
        y + 10.0
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    out.push_str(&s);
    out.push_str("</svg>\n");
    out
}

/// Each process's header and its threads' bands, until `MAX_ROWS`.
fn threads(s: &mut String, groups: &[Group], steps: usize, sc: &Scale, mut y: f64) -> f64 {
    let total: usize = groups.iter().map(|g| g.bands.len() + usize::from(g.header.is_some())).sum();
    let mut rows = 0;
    'groups: for g in groups {
        if let Some(h) = &g.header {
            if rows >= MAX_ROWS {
                break;
            }
            let _ = writeln!(
                s,
                r##"<rect x="0" y="{:.0}" width="{}" height="{BAND}" fill="#eceff1"/>"##,
                y,
                LABEL + WIDTH + RIGHT
            );
            let _ =
                writeln!(s, r#"<text x="4" y="{:.0}" font-weight="bold">{}</text>"#, y + BAND - 3.0, esc(h));
            y += BAND;
            rows += 1;
        }
        let indent = if g.header.is_some() { 14.0 } else { 4.0 };
        for b in &g.bands {
            if rows >= MAX_ROWS {
                break 'groups;
            }
            let _ = writeln!(s, r#"<text x="{indent}" y="{:.0}">{}</text>"#, y + BAND - 3.0, esc(&b.label));
            band(s, &b.buckets, steps, sc, y);
            y += BAND;
            rows += 1;
        }
    }
    if total > rows {
        let _ = writeln!(s, r#"<text x="4" y="{:.0}">… and {} more rows</text>"#, y + 12.0, total - rows);
        y += 16.0;
    }
    y
}

/// One band: each step in its dominant state's colour, runs of one colour
/// as one rect (a long run is one element).
fn band(s: &mut String, buckets: &[[u32; STATES]], steps: usize, sc: &Scale, y: f64) {
    let dominant = |k: usize| -> Option<usize> {
        let c = buckets.get(k)?;
        let (i, v) = c.iter().enumerate().max_by_key(|(_, v)| **v)?;
        (*v > 0).then_some(i)
    };
    let mut run: Option<(usize, usize)> = None; // (start step, state)
    for k in 0..=steps {
        let st = if k < steps { dominant(k) } else { None };
        if matches!((run, st), (Some((_, rs)), Some(st)) if rs == st) {
            continue;
        }
        if let Some((from, rs)) = run.take() {
            let _ = writeln!(
                s,
                r#"<rect x="{:.1}" y="{y:.0}" width="{:.1}" height="{}" fill="{}"/>"#,
                LABEL + from as f64 * sc.dx,
                (k - from) as f64 * sc.dx,
                BAND - 2.0,
                COLORS[rs]
            );
        }
        run = st.map(|st| (k, st));
    }
}

/// A time axis: a tick every 1, 2, 5, 10... s, about ten in all.
fn axis(s: &mut String, span_ns: u64, y: f64) -> f64 {
    let span_s = span_ns as f64 / 1e9;
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
    y + 18.0
}

/// The states' colours, then the verdict kinds that appear, each set in
/// as many lines as the drawing's width takes.
fn legend(s: &mut String, p: &Picture, y: f64) -> f64 {
    let states: Vec<(&str, &str)> = NAMES.iter().zip(COLORS).map(|(n, c)| (*n, c)).collect();
    let mut y = legend_lines(s, &states, 90.0, y);
    let kinds: Vec<(&str, &str)> = Kind::ALL
        .into_iter()
        .filter(|k| p.verdicts.iter().any(|v| v.2 == *k))
        .map(|k| (k.as_str(), kind_color(k)))
        .collect();
    if !kinds.is_empty() {
        let _ = writeln!(s, r#"<text x="4" y="{:.0}">verdict</text>"#, y + 21.0);
        y = legend_lines(s, &kinds, 150.0, y);
    }
    y + 12.0
}

/// Legend entries (a swatch and a name) `step` apart from the label
/// column on, a new line where the next would pass the right edge.
fn legend_lines(s: &mut String, items: &[(&str, &str)], step: f64, mut y: f64) -> f64 {
    let mut x = LABEL;
    for (name, color) in items {
        if x + step > LABEL + WIDTH {
            (x, y) = (LABEL, y + 18.0);
        }
        let _ =
            writeln!(s, r#"<rect x="{x:.0}" y="{:.0}" width="10" height="10" fill="{color}"/>"#, y + 12.0);
        let _ = writeln!(s, r#"<text x="{:.0}" y="{:.0}">{name}</text>"#, x + 14.0, y + 21.0);
        x += step;
    }
    y + 18.0
}

/// The thread states' and the verdict kinds' colours, for the tests.
#[cfg(test)]
pub(super) fn state_colors() -> [&'static str; STATES] {
    COLORS
}

#[cfg(test)]
pub(super) fn kind_colors() -> [&'static str; Kind::ALL.len()] {
    series::KIND_COLORS
}

fn esc(t: &str) -> String {
    t.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
