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
    assert_eq!(pic.threads.len(), 1);
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
/// between the first two records (the scheduler spent 2 ms picking what
/// came next: the futex wait starts there), 6 of 5 ms next (the counter
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
        ("futex", 8_000.0, 12_000.0),
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
