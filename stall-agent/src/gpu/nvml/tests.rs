//! The sampling state on scripted driver readings (no GPU needed).
use super::*;

const REAL: u64 = 1_735_689_600_000_000_000;
const MONO: u64 = 86_400 * 1_000_000_000;

fn clock_at(mono_ns: u64) -> ClockSnapshot {
    // Realtime moves with monotonic: offset REAL - MONO.
    ClockSnapshot { mono_ns, real_ns: REAL - MONO + mono_ns, boot_ns: mono_ns }
}

/// Realtime microsecond stamp of a monotonic instant.
fn rt_us(mono_ns: u64) -> u64 {
    (REAL - MONO + mono_ns) / 1000
}

fn state(open_mono: u64) -> DevState {
    DevState::new(0, "GPU 0".into(), open_mono)
}

#[test]
fn buffered_samples_are_new_sorted_and_monotonic() {
    let mut st = state(MONO);
    let clock = clock_at(MONO + 1_000 * MS);
    // Out of order, with a duplicate and one from before open time.
    let rows = vec![
        (rt_us(MONO + 500 * MS), 50.0),
        (rt_us(MONO + 167 * MS), 10.0),
        (rt_us(MONO - 100 * MS), 99.0),
        (rt_us(MONO + 334 * MS), 30.0),
        (rt_us(MONO + 500 * MS), 50.0),
        (rt_us(MONO + 667 * MS), 120.0),
    ];
    let out = st.absorb_buffered(rows.clone(), &clock);
    let ts: Vec<u64> = out.iter().map(|s| s.ts_ns).collect();
    assert_eq!(ts, vec![MONO + 167 * MS, MONO + 334 * MS, MONO + 500 * MS, MONO + 667 * MS]);
    assert_eq!(out[3].util_pct, 100.0, "clamped");
    assert_eq!(st.last_raw_us, rt_us(MONO + 667 * MS));
    assert_eq!(st.last_buffered_mono_ns, Some(MONO + 667 * MS));
    // Median spacing ~167 ms (the pre-open gap of 267 ms is in the set too).
    let p = st.period_ns.unwrap();
    assert!((166 * MS..=168 * MS).contains(&p), "{p}");

    // Same rows again: nothing new.
    assert!(st.absorb_buffered(rows, &clock).is_empty());
    // One newer row: just that one.
    let clock = clock_at(MONO + 1_200 * MS);
    let out = st.absorb_buffered(vec![(rt_us(MONO + 834 * MS), 40.0)], &clock);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].ts_ns, MONO + 834 * MS);
}

#[test]
fn priming_emits_nothing_but_seeds_state() {
    let mut st = state(MONO);
    let clock = clock_at(MONO);
    let rows = vec![(rt_us(MONO - 334 * MS), 1.0), (rt_us(MONO - 167 * MS), 2.0)];
    assert!(st.absorb_buffered(rows, &clock).is_empty());
    assert_eq!(st.last_raw_us, rt_us(MONO - 167 * MS));
    assert_eq!(st.last_buffered_mono_ns, Some(MONO - 167 * MS));
    assert!(st.period_ns.is_some());
}

#[test]
fn instant_fallback_timing() {
    let mut st = state(MONO);
    // Never saw a buffered sample: fall back at once.
    assert!(st.needs_instant(MONO + MS));
    let clock = clock_at(MONO + 400 * MS);
    let rows = vec![(rt_us(MONO + 100 * MS), 5.0), (rt_us(MONO + 300 * MS), 5.0)];
    st.absorb_buffered(rows, &clock);
    assert_eq!(st.period_ns, Some(200 * MS));
    // Threshold 2 * 200 + 50 = 450 ms after the newest sample.
    assert!(!st.needs_instant(MONO + 700 * MS));
    assert!(st.needs_instant(MONO + 751 * MS));
    // Unsupported buffer: always instant.
    st.buffered = false;
    assert!(st.needs_instant(MONO + 301 * MS));

    assert_eq!(stale_after_ns(None), MAX_STALE_NS);
    assert_eq!(stale_after_ns(Some(MS)), MIN_STALE_NS);
    assert_eq!(stale_after_ns(Some(10_000 * MS)), MAX_STALE_NS);
}

#[test]
fn emitted_timeline_strictly_increases() {
    let mut st = state(MONO);
    let a = st.emit(vec![GpuSample { ts_ns: MONO + 900 * MS, util_pct: 0.0 }]);
    assert_eq!(a.len(), 1);
    // Buffered samples that predate the instant reading are dropped,
    // equal stamps (clamped future samples) too.
    let b = st.emit(vec![
        GpuSample { ts_ns: MONO + 800 * MS, util_pct: 90.0 },
        GpuSample { ts_ns: MONO + 900 * MS, util_pct: 90.0 },
        GpuSample { ts_ns: MONO + 950 * MS, util_pct: 90.0 },
        GpuSample { ts_ns: MONO + 950 * MS, util_pct: 91.0 },
    ]);
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].ts_ns, MONO + 950 * MS);
    assert_eq!(b[0].util_pct, 90.0);
}

#[test]
fn process_utilization_window() {
    let mut st = state(MONO);
    st.period_ns = Some(100 * MS); // staleness threshold 250 ms
    let t = |ms: u64| rt_us(MONO + ms * MS);
    let clock = clock_at(MONO + 1_000 * MS);
    let m = st
        .absorb_proc_util(vec![(7, t(900), 40), (7, t(950), 60), (8, t(800), 10), (9, t(990), 250)], &clock);
    assert_eq!(m[&7], 50.0);
    assert_eq!(m[&8], 10.0);
    assert_eq!(m[&9], 100.0, "clamped");
    assert_eq!(st.last_proc_raw_us, t(990));
    assert_eq!(st.last_proc_mono_ns, Some(MONO + 990 * MS));

    // Only newer samples count; pids absent from a fresh window are gone.
    let clock = clock_at(MONO + 1_100 * MS);
    let m = st.absorb_proc_util(vec![(7, t(950), 99), (7, t(1_090), 20)], &clock);
    assert_eq!(m.len(), 1);
    assert_eq!(m[&7], 20.0);

    // Nothing new shortly after: the last window carries over...
    let clock = clock_at(MONO + 1_300 * MS);
    assert_eq!(st.absorb_proc_util(vec![], &clock)[&7], 20.0);
    // ...until it is stale: then everything is idle.
    let clock = clock_at(MONO + 1_341 * MS + 1);
    assert!(st.absorb_proc_util(vec![], &clock).is_empty());
    // Never had a sample: idle at once.
    let mut st = state(MONO);
    assert!(st.absorb_proc_util(vec![], &clock).is_empty());
}

#[test]
fn processes_merge() {
    let rows = vec![
        // Listed as compute and graphics: counted once.
        (10, None, None, Some(1_000)),
        (10, None, None, Some(1_000)),
        // Unknown memory in one list, known in the other.
        (11, None, None, None),
        (11, None, None, Some(500)),
        // Two MIG instances: summed.
        (12, Some(1), Some(0), Some(100)),
        (12, Some(2), Some(0), Some(200)),
        // Unknown everywhere.
        (13, None, None, None),
    ];
    let util: HashMap<u32, f64> = [(10, 75.0)].into_iter().collect();
    let got = merge_processes(rows.clone(), Some(&util));
    let pids: Vec<u32> = got.iter().map(|p| p.pid).collect();
    assert_eq!(pids, vec![10, 11, 12, 13]);
    assert_eq!(got[0].used_mem_bytes, Some(1_000));
    assert_eq!(got[0].sm_util_pct, Some(75.0));
    assert_eq!(got[1].used_mem_bytes, Some(500));
    assert_eq!(got[1].sm_util_pct, Some(0.0), "absent from NVML's list = idle");
    assert_eq!(got[2].used_mem_bytes, Some(300));
    assert_eq!(got[3].used_mem_bytes, None);
    // Per-process accounting unavailable: unknown, not zero.
    let got = merge_processes(rows, None);
    assert!(got.iter().all(|p| p.sm_util_pct.is_none()));
}

#[test]
fn values_and_errors() {
    assert_eq!(sample_value(&SampleValue::U32(42)), 42.0);
    assert_eq!(sample_value(&SampleValue::U64(7)), 7.0);
    assert_eq!(sample_value(&SampleValue::I64(-1)), -1.0);
    assert_eq!(sample_value(&SampleValue::F64(12.5)), 12.5);
    assert_eq!(clamp_pct(f64::NAN), 0.0);
    assert_eq!(clamp_pct(-3.0), 0.0);
    assert!(is_permanent(&NvmlError::NotSupported));
    assert!(!is_permanent(&NvmlError::GpuLost));

    let e = init_error("libnvidia-ml.so.1", &NvmlError::DriverNotLoaded);
    assert_eq!(e.to_string(), "no NVML: GPU side not sampled (NVIDIA driver not loaded)");
    let e = init_error("libnvidia-ml.so.1", &NvmlError::LibraryNotFound);
    assert_eq!(e.to_string(), "no NVML: GPU side not sampled (libnvidia-ml.so.1 not found)");
    let e = init_error("x", &NvmlError::Unknown);
    assert!(e.to_string().starts_with("no NVML: GPU side not sampled (NVML init failed"));
}

#[test]
fn open_refuses_off_and_empty() {
    assert!(matches!(NvmlGpu::open(&GpuSelect::Off), Err(GpuError::BadSelect { .. })));
    assert!(matches!(NvmlGpu::open(&GpuSelect::Indices(vec![])), Err(GpuError::BadSelect { .. })));
}

#[test]
fn optional_readings_warn_once_and_stop_when_unsupported() {
    let mut w = Warnings::default();
    let mut usable = true;
    assert_eq!(read_optional(0, &mut usable, "power draw", || Ok(650_000), &mut w), Some(650_000));
    assert!(w.pending.is_empty());
    // Transient: None, one warning, asked again next time.
    for _ in 0..2 {
        assert_eq!(read_optional(0, &mut usable, "power draw", || Err(NvmlError::Unknown), &mut w), None);
    }
    assert!(usable);
    assert_eq!(w.pending.len(), 1);
    // Unsupported: never asked again.
    assert_eq!(read_optional(0, &mut usable, "power draw", || Err(NvmlError::NotSupported), &mut w), None);
    assert!(!usable);
    let asked = std::cell::Cell::new(false);
    let read = || {
        asked.set(true);
        Ok(1)
    };
    assert_eq!(read_optional(0, &mut usable, "power draw", read, &mut w), None);
    assert!(!asked.get());
    assert_eq!(w.pending.len(), 2);
    assert!(w.pending[1].starts_with("GPU 0: power draw unavailable"), "{:?}", w.pending);
}

#[test]
fn warnings_dedup() {
    let mut w = Warnings::default();
    w.warn("a\nb".into());
    w.warn("a b".into());
    w.warn("c".into());
    assert_eq!(w.pending, vec!["a b".to_string(), "c".to_string()]);
}
