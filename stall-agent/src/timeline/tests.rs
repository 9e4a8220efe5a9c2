//! Slices from synthetic switch streams: they tile each thread's life, are
//! named by state, gather short ones without changing per-state sums, and
//! the file parses.
use stall_common::reason;

use super::*;

const MS: u64 = 1_000_000;

fn out(ts: u64, tid: u32, why: u8, nr: i32) -> Switch {
    Switch { ts, tid, tgid: 100, on: false, reason: why, nr, wake_ts: 0, exec_ns: 0 }
}

fn on(ts: u64, tid: u32, wake_ts: u64) -> Switch {
    Switch { ts, tid, tgid: 100, on: true, reason: 0, nr: -1, wake_ts, exec_ns: 0 }
}

fn parse(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes).expect("the trace is JSON")
}

fn slices(v: &serde_json::Value, tid: u32) -> Vec<(String, f64, f64)> {
    v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X" && e["tid"] == tid)
        .map(|e| {
            (e["name"].as_str().unwrap().to_string(), e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap())
        })
        .collect()
}

#[test]
fn slices_tile_a_threads_life_by_state() {
    let mut buf = Vec::new();
    let mut t = Timeline::new(&mut buf, 0, 0).unwrap();
    // on 0-10 ms, futex 10-40 (woken at 40), runqueue 40-45, on 45-60,
    // blocked in a `wait4` (other) 60-100.
    for s in [
        on(0, 7, 0),
        out(10 * MS, 7, reason::FUTEX, 202),
        on(45 * MS, 7, 40 * MS),
        out(60 * MS, 7, reason::OTHER, 61),
    ] {
        t.switch(&s).unwrap();
    }
    let sums = t.sums(7).unwrap();
    let pic = t.finish(100 * MS, &Names::default()).unwrap();
    assert_eq!(pic.groups.iter().map(|g| g.bands.len()).sum::<usize>(), 1);
    let v = parse(&buf);
    let got = slices(&v, 7);
    let want = [
        ("on-cpu", 0.0, 10_000.0),
        ("futex", 10_000.0, 30_000.0),
        ("runqueue", 40_000.0, 5_000.0),
        ("on-cpu", 45_000.0, 15_000.0),
        ("other:wait4", 60_000.0, 40_000.0),
    ];
    assert_eq!(got.len(), want.len(), "{got:?}");
    for (g, w) in got.iter().zip(want) {
        assert_eq!((g.0.as_str(), g.1, g.2), w);
    }
    assert_eq!(sums[State::OnCpu.index()], 25 * MS);
    for e in v["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X") {
        for k in ["pid", "tid", "ts", "dur"] {
            assert!(!e[k].is_null(), "{k} missing in {e}");
        }
    }
    assert_eq!(v["metadata"]["lost_switch_records"], 0);
}

/// On-CPU slices last what the kernel's counter says: 8 of the 10 ms
/// between the first two records (the other 2 are `stolen`: a hypervisor
/// ran another guest, or the scheduler took that long to switch; the futex
/// wait starts at the switch-out, as the summary counts it), 6 of 5 ms next (the counter
/// started at the pick, before the record: the next state starts that much
/// later), and a switch-out with no switch-in seen ran for the counter's
/// 3 ms just before it.
#[test]
fn on_cpu_slices_are_the_kernels_counter() {
    let mut buf = Vec::new();
    let mut t = Timeline::new(&mut buf, 0, 0).unwrap();
    let with_exec = |s: Switch, exec_ns| Switch { exec_ns, ..s };
    for s in [
        with_exec(on(0, 7, 0), 0),
        with_exec(out(10 * MS, 7, reason::FUTEX, 202), 8 * MS),
        with_exec(on(20 * MS, 7, 0), 8 * MS),
        with_exec(out(25 * MS, 7, reason::FUTEX, 202), 14 * MS),
        with_exec(out(40 * MS, 7, reason::POLL, 7), 17 * MS),
    ] {
        t.switch(&s).unwrap();
    }
    let sums = t.sums(7).unwrap();
    t.finish(50 * MS, &Names::default()).unwrap();
    let got = slices(&parse(&buf), 7);
    let want = [
        ("on-cpu", 0.0, 8_000.0),
        ("stolen", 8_000.0, 2_000.0),
        ("futex", 10_000.0, 10_000.0),
        ("on-cpu", 20_000.0, 6_000.0),
        ("futex", 26_000.0, 11_000.0),
        ("on-cpu", 37_000.0, 3_000.0),
        ("poll", 40_000.0, 10_000.0),
    ];
    assert_eq!(got.len(), want.len(), "{got:?}");
    for (g, w) in got.iter().zip(want) {
        assert_eq!((g.0.as_str(), g.1, g.2), w);
    }
    assert_eq!(sums[State::OnCpu.index()], 17 * MS);
    assert_eq!(sums[State::Stolen.index()], 2 * MS);
}

#[test]
fn short_slices_are_gathered_and_their_sums_kept() {
    let mut buf = Vec::new();
    let mut t = Timeline::new(&mut buf, 0, 0).unwrap().with_limits(MS, u64::MAX);
    // 10 000 switches 50 µs apart: on 30 µs, futex 20 µs, for 0.5 s.
    let mut ts = 0;
    for _ in 0..10_000 {
        t.switch(&on(ts, 9, 0)).unwrap();
        t.switch(&out(ts + 30_000, 9, reason::FUTEX, 202)).unwrap();
        ts += 50_000;
    }
    t.switch(&on(ts, 9, 0)).unwrap();
    let sums = t.sums(9).unwrap();
    t.finish(ts, &Names::default()).unwrap();
    let v = parse(&buf);
    let got = slices(&v, 9);
    assert!(got.len() < 2_000, "gathered: {} slices for 20 000 switches", got.len());
    let total = |name: &str| got.iter().filter(|s| s.0 == name).map(|s| s.2).sum::<f64>();
    assert!((total("on-cpu") - 300_000.0).abs() < 1e-3, "{}", total("on-cpu"));
    assert!((total("futex") - 200_000.0).abs() < 1e-3, "{}", total("futex"));
    assert_eq!(sums[State::OnCpu.index()], 300 * MS);
    // Never overlapping, in order.
    let mut end = 0.0;
    for s in &got {
        assert!(s.1 >= end - 1e-6, "overlap at {s:?}");
        end = s.1 + s.2;
    }
}

#[test]
fn a_cap_stops_the_trace_and_says_where() {
    let mut buf = Vec::new();
    let mut t = Timeline::new(&mut buf, 0, 0).unwrap().with_limits(1, 10);
    for i in 0..50u64 {
        t.switch(&on(i * 2 * MS, 3, 0)).unwrap();
        t.switch(&out((i * 2 + 1) * MS, 3, reason::SLEEP, 35)).unwrap();
    }
    t.finish(100 * MS, &Names::default()).unwrap();
    let v = parse(&buf);
    assert_eq!(slices(&v, 3).len(), 10);
    assert!(v["traceEvents"].as_array().unwrap().iter().any(|e| e["name"] == "timeline capped"));
    assert!(v["metadata"]["capped_at_us"].as_f64().is_some());
}

#[test]
fn reads_gpu_and_verdicts_have_their_tracks_and_the_svg_draws_them() {
    let mut buf = Vec::new();
    let mut t = Timeline::new(&mut buf, 0, 1_700_000_000_000_000_000).unwrap();
    t.switch(&on(0, 5, 0)).unwrap();
    t.switch(&out(500 * MS, 5, reason::IO, 0)).unwrap();
    t.reads(
        100,
        0,
        1_000 * MS,
        &[("/data/shard_1.arrow".into(), 8 << 20), ("/data/shard_2.arrow".into(), 1 << 20)],
    )
    .unwrap();
    for k in 0..10 {
        t.gpu(0, k * 100 * MS, if k < 5 { 95.0 } else { 0.0 }).unwrap();
    }
    t.gpu_power(0, 1_000 * MS, 400.0).unwrap();
    t.verdict(1_000 * MS, Kind::InputIoBound, "workers wait on storage").unwrap();
    let mut names = Names::default();
    names.processes.insert(100, ("python".into(), "worker".into()));
    names.threads.insert(5, "pt_data_worker".into());
    let pic = t.finish(1_000 * MS, &names).unwrap();
    let v = parse(&buf);
    assert_eq!(v["baseTimeNanoseconds"], 1_700_000_000_000_000_000u64);
    let ev = v["traceEvents"].as_array().unwrap();
    let read = ev.iter().find(|e| e["cat"] == "reads").unwrap();
    assert_eq!(read["name"], "read /data/shard_1.arrow");
    assert_eq!(read["args"]["bytes"], 9 << 20);
    assert_eq!(ev.iter().filter(|e| e["ph"] == "C" && e["name"] == "GPU0 utilization %").count(), 10);
    assert!(ev.iter().any(|e| e["ph"] == "C" && e["name"] == "GPU0 power W"));
    assert!(ev.iter().any(|e| e["ph"] == "i" && e["name"] == format!("verdict: {}", Kind::InputIoBound)));
    assert!(ev.iter().any(|e| e["ph"] == "M" && e["args"]["name"] == "worker python (100)"));
    assert!(ev.iter().any(|e| e["ph"] == "M" && e["tid"] == 5 && e["args"]["name"] == "pt_data_worker"));
    let svg = render_svg(&pic, "demo");
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("GPU0 utilization") && svg.contains("pt_data_worker") && svg.contains("#c62828"));
}

#[test]
fn an_exit_ends_the_last_slice() {
    let mut buf = Vec::new();
    let mut t = Timeline::new(&mut buf, 0, 0).unwrap();
    t.switch(&on(0, 4, 0)).unwrap();
    t.exit(4, 20 * MS).unwrap();
    t.finish(500 * MS, &Names::default()).unwrap();
    let v = parse(&buf);
    assert_eq!(slices(&v, 4), vec![("on-cpu".to_string(), 0.0, 20_000.0)]);
}

fn in_proc(ts: u64, tid: u32, tgid: u32, on_cpu: bool) -> Switch {
    Switch {
        ts,
        tid,
        tgid,
        on: on_cpu,
        reason: if on_cpu { 0 } else { reason::SLEEP },
        nr: 35,
        wake_ts: 0,
        exec_ns: 0,
    }
}

/// A trainer (pid 10, two threads), a worker (pid 20), an other process
/// (pid 30, busy for the whole run) and a shell shim's 17 `bash` children
/// (pids 100.., 20 ms each), given in an order that is none of those.
fn family(t: &mut Timeline<&mut Vec<u8>>) -> Names {
    let mut names = Names::default();
    for (pid, role) in [(30, "other"), (20, "worker"), (10, "trainer")] {
        t.switch(&in_proc(0, pid, pid, true)).unwrap();
        t.switch(&in_proc(2_000 * MS, pid, pid, false)).unwrap();
        names.processes.insert(pid, (format!("p{pid}"), role.into()));
        names.add_family(pid, Some(1), (role != "other").then_some(0));
    }
    t.switch(&in_proc(0, 11, 10, true)).unwrap();
    names.threads.insert(11, "pt_main_thread".into());
    for i in 0..17 {
        let (pid, at) = (100 + i, 100 * MS + u64::from(i) * 30 * MS);
        t.switch(&in_proc(at, pid, pid, true)).unwrap();
        t.exit(pid, at + 20 * MS).unwrap();
        names.processes.insert(pid, ("bash".into(), "other".into()));
        names.add_family(pid, Some(30), None);
    }
    // One of them ran a `readlink`: counted under 30, not under its bash.
    t.switch(&in_proc(150 * MS, 200, 200, true)).unwrap();
    t.exit(200, 151 * MS).unwrap();
    names.processes.insert(200, ("readlink".into(), "other".into()));
    names.add_family(200, Some(101), None);
    names
}

fn rows(pic: &Picture) -> Vec<String> {
    pic.groups
        .iter()
        .flat_map(|g| g.header.iter().cloned().chain(g.bands.iter().map(|b| format!("  {}", b.label))))
        .collect()
}

#[test]
fn threads_are_grouped_by_process_trainer_first_and_helpers_folded() {
    let mut buf = Vec::new();
    let mut t = Timeline::new(&mut buf, 0, 0).unwrap();
    let names = family(&mut t);
    let pic = t.finish(2_000 * MS, &names).unwrap();
    let rows = rows(&pic);
    assert_eq!(
        rows,
        [
            "pid 10 · trainer · rank 0 · p10",
            "  thread 10 (10)",
            "  pt_main_thread (11)",
            "pid 20 · worker · rank 0 · p20",
            "  thread 20 (20)",
            "pid 30 · other · p30",
            "  thread 30 (30)",
            "  17 × bash, 0.3 s on CPU (parent 30)",
            "  1 × readlink, 0.0 s on CPU (parent 30)",
        ],
    );
    // The folded row carries all 17 helpers' time.
    let folded = &pic.groups[pic.groups.len() - 2].bands[0];
    let on: u64 = folded.buckets.iter().map(|b| u64::from(b[State::OnCpu.index()])).sum();
    assert_eq!(on, 17 * 20 * MS);
    let svg = render_svg(&pic, "family");
    assert!(svg.contains("17 × bash") && svg.contains("pid 10 · trainer · rank 0"));
    assert_eq!(svg.matches("bash").count(), 1, "one row for the helpers");
}

/// Siblings that ran long are not helpers, until there are many of one
/// name under one parent; a lone long-lived process keeps its own rows.
#[test]
fn only_short_or_many_same_named_children_are_folded() {
    let mut buf = Vec::new();
    let mut t = Timeline::new(&mut buf, 0, 0).unwrap();
    let mut names = Names::default();
    // Two long `make`s under 1 (kept), three long `cc1`s under 2 (folded).
    for (pid, name, parent) in
        [(40, "make", 1), (41, "make", 1), (50, "cc1", 2), (51, "cc1", 2), (52, "cc1", 2)]
    {
        t.switch(&in_proc(0, pid, pid, true)).unwrap();
        t.switch(&in_proc(3_000 * MS, pid, pid, false)).unwrap();
        names.processes.insert(pid, (name.into(), "other".into()));
        names.add_family(pid, Some(parent), None);
    }
    let pic = t.finish(3_000 * MS, &names).unwrap();
    let rows = rows(&pic);
    assert!(rows.contains(&"pid 40 · other · make".to_string()), "{rows:?}");
    assert!(rows.contains(&"pid 41 · other · make".to_string()), "{rows:?}");
    assert!(rows.contains(&"  3 × cc1, 9.0 s on CPU (parent 2)".to_string()), "{rows:?}");
    assert!(!rows.iter().any(|r| r.contains("pid 50")), "{rows:?}");
}

#[test]
fn without_gpu_samples_the_svg_says_so_and_with_them_it_does_not() {
    let mut buf = Vec::new();
    let mut t = Timeline::new(&mut buf, 0, 0).unwrap();
    t.switch(&on(0, 5, 0)).unwrap();
    let pic = t.finish(1_000 * MS, &Names::default()).unwrap();
    let svg = render_svg(&pic, "no gpu");
    assert!(svg.contains("no GPU data (NVML not found / --gpu off)"));
    assert!(svg.contains("file reads: none"));
    assert!(!svg.contains("startup ends"));

    let mut buf = Vec::new();
    let mut t = Timeline::new(&mut buf, 0, 0).unwrap();
    t.gpu(0, 0, 50.0).unwrap();
    let svg = render_svg(&t.finish(1_000 * MS, &Names::default()).unwrap(), "gpu");
    assert!(svg.contains("GPU0 utilization") && !svg.contains("no GPU data"));
}

/// Reads of every process per interval add up into one row labelled with
/// the total and the peak rate; verdicts become runs of one colour per
/// kind with a legend; the startup gets its line.
#[test]
fn reads_verdicts_and_the_startup_have_their_rows() {
    let mut buf = Vec::new();
    let origin = 5_000 * MS;
    let mut t = Timeline::new(&mut buf, origin, 0).unwrap();
    t.switch(&on(origin, 5, 0)).unwrap();
    let at = |s: u64| origin + s * 1_000 * MS;
    // 1 MiB in the first second (two processes), 4 MiB in the second.
    t.reads(100, at(0), at(1), &[("/a".into(), 512 << 10)]).unwrap();
    t.reads(101, at(0), at(1), &[("/b".into(), 512 << 10)]).unwrap();
    t.reads(100, at(1), at(2), &[("/a".into(), 4 << 20)]).unwrap();
    t.verdict(at(1), Kind::Unknown, "starting").unwrap();
    t.verdict(at(2), Kind::InputIoBound, "reading").unwrap();
    t.verdict(at(3), Kind::InputIoBound, "reading").unwrap();
    t.startup_end(at(1));
    let pic = t.finish(at(3), &Names::default()).unwrap();
    assert_eq!(pic.reads, vec![(0, 1_000 * MS, 1 << 20), (1_000 * MS, 2_000 * MS, 4 << 20)]);
    assert_eq!(
        pic.verdicts,
        vec![
            (0, 1_000 * MS, Kind::Unknown),
            (1_000 * MS, 2_000 * MS, Kind::InputIoBound),
            (2_000 * MS, 3_000 * MS, Kind::InputIoBound)
        ]
    );
    assert_eq!(pic.startup_ns, Some(1_000 * MS));
    let svg = render_svg(&pic, "rows");
    assert!(svg.contains("file reads: 5.0 MiB total, peak 4.0 MiB/s"), "{svg}");
    // One rect per run of a kind (two), each with its name; a legend entry
    // per kind seen.
    assert_eq!(svg.matches("<title>input-io-bound</title>").count(), 1, "{svg}");
    assert_eq!(svg.matches("<title>unknown</title>").count(), 1, "{svg}");
    assert!(svg.contains(">input-io-bound</text>") && svg.contains(">unknown</text>"));
    assert!(svg.contains("startup ends 1.0 s") && svg.contains("stroke-dasharray"));
}

/// Every legend entry inside the drawing, however many states and kinds:
/// each text's start plus its width at the font's size (11 px, about 6.5
/// px a character in sans-serif) within the SVG's width. The verdict
/// kinds' swatches share no colour with the thread states'.
#[test]
fn the_legend_fits_the_drawing_and_kinds_have_colours_of_their_own() {
    let mut buf = Vec::new();
    let mut t = Timeline::new(&mut buf, 0, 0).unwrap();
    t.switch(&on(0, 5, 0)).unwrap();
    for (i, k) in Kind::ALL.into_iter().enumerate() {
        t.verdict((i as u64 + 1) * 1_000 * MS, k, "k").unwrap();
    }
    let svg = render_svg(&t.finish(10_000 * MS, &Names::default()).unwrap(), "legend");
    let attr = |tag: &str, name: &str| -> Option<f64> {
        let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
        tag[at..].split('"').next()?.parse().ok()
    };
    let width = attr(svg.lines().find(|l| l.starts_with("<svg")).unwrap(), "width").unwrap();
    let mut texts = 0;
    for line in svg.lines().filter(|l| l.starts_with("<text")) {
        let x = attr(line, "x").unwrap();
        let text = line.split('>').nth(1).unwrap().split('<').next().unwrap();
        let w = text.chars().count() as f64 * 6.5;
        let end = if line.contains(r#"text-anchor="middle""#) { x + w / 2.0 } else { x + w };
        assert!(end <= width, "{text:?} at x={x} passes {width}: {line}");
        texts += 1;
    }
    for k in Kind::ALL {
        assert!(svg.contains(&format!(">{}</text>", k.as_str())), "{} in the legend", k.as_str());
    }
    assert!(texts > Kind::ALL.len() + super::STATES);
    let kinds = super::svg::kind_colors();
    let states = super::svg::state_colors();
    assert!(kinds.iter().all(|k| !states.contains(k)), "{kinds:?} against {states:?}");
}
