//! Windows on hand-made data: the cap on ended processes and the recent
//! span.
use super::*;

#[test]
fn a_window_lists_at_most_so_many_ended_processes_and_sums_the_rest() {
    let proc_with = |tgid: u32, alive: bool, on_cpu_ns: u64| ProcWindow {
        tgid,
        alive,
        threads: vec![ThreadWindow {
            tid: tgid,
            delta: ThreadCounters { on_cpu_ns, ..Default::default() },
            ..Default::default()
        }],
        ..Default::default()
    };
    let n = MAX_ENDED_PER_WINDOW + 500;
    let mut procs: Vec<ProcWindow> = (1..=n as u32).map(|i| proc_with(i, false, u64::from(i))).collect();
    procs.push(proc_with(99_999, true, 1));
    let total: u64 = procs.iter().map(|p| p.sum().on_cpu_ns).sum();
    fold_small_ended(&mut procs);
    assert_eq!(procs.len(), MAX_ENDED_PER_WINDOW + 2, "kept ended + the alive one + the sum");
    assert_eq!(procs.iter().map(|p| p.sum().on_cpu_ns).sum::<u64>(), total, "nothing lost");
    assert!(procs.iter().any(|p| p.tgid == 99_999), "alive processes are never folded");
    assert!(procs.iter().any(|p| p.tgid == n as u32), "the busiest ended ones stay");
    assert!(!procs.iter().any(|p| p.tgid == 1), "the least busy are summed");
    assert!(procs.iter().any(|p| p.tgid == 0 && p.comm == "(500 ended processes, summed)"));
}
#[test]
fn recent_windows_span_five_seconds_whatever_the_ticks_jitter() {
    // Ticks a little early, and a little late: never under 4.75 s (the
    // hang's 4 s is never missed), never a whole tick over.
    for tick_ns in [999_000_000u64, 1_010_000_000, 1_250_000_000] {
        let mut recent = VecDeque::new();
        for i in 0..20u64 {
            let start = i * tick_ns;
            push_recent(
                &mut recent,
                Window { start_ns: start, end_ns: start + tick_ns, ..Default::default() },
            );
            let span = Window::merge(recent.make_contiguous()).secs();
            if (i + 1) * tick_ns >= 5_000_000_000 {
                assert!(span >= 4.75, "{tick_ns}: {span}");
            }
            assert!(span < 4.75 + tick_ns as f64 / 1e9, "{tick_ns}: {span}");
        }
    }
}
