//! Windows on hand-made data: which files are the job's data and where
//! their bytes came from, the cap on ended processes, the recent span, and
//! one view of a run subtracted from a later one.
use super::*;

#[test]
fn code_files_are_not_data() {
    for code in [
        "/usr/bin/python3.11",
        "/root/.pyenv/versions/3.11.7/bin/python3.11",
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/opt/venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so",
        "/usr/lib/locale/C.utf8/LC_CTYPE",
        "/etc/ld.so.cache",
        "/etc/ssl/certs/ca-certificates.crt",
        "/usr/share/locale/locale.alias",
        "/opt/venv/torch-2.15.0.dist-info/entry_points.txt",
    ] {
        assert!(is_code_file(code), "{code}");
    }
    for data in
        ["/data/train/data-00000-of-00001.arrow", "/var/tmp/cache/rows_00000-02000.bin", "/ckpt/ckpt.pt"]
    {
        assert!(!is_code_file(data), "{data}");
    }
}

/// Where a file's bytes came from, as the report words it, and what a
/// mapping's bytes count as.
#[test]
fn a_files_source_and_its_bytes() {
    let f = |read_bytes, storage_bytes| FileWindow {
        read_bytes,
        storage_bytes,
        open_ns: 1,
        ..Default::default()
    };
    assert_eq!(f(1000, None).source(), None);
    assert_eq!(f(1000, Some(0)).source().as_deref(), Some("from the page cache"));
    assert_eq!(f(1000, Some(1000)).source().as_deref(), Some("from storage (page cache cold)"));
    assert_eq!(f(1000, Some(400)).source().as_deref(), Some("40 % from storage"));
    let proc_file = FileWindow { path: "/proc/self/maps".into(), ..f(1000, Some(0)) };
    assert_eq!(proc_file.source(), None, "no page cache behind /proc");
    let mapped = f(0, Some(4096));
    assert_eq!(mapped.source().as_deref(), Some("through a mapping, from storage"));
    assert_eq!(mapped.bytes_in(), 4096);
    assert_eq!(mapped.rate_secs(10.0), 10.0, "a mapping's rate is over the window");
    assert_eq!(f(1000, Some(400)).rate_secs(10.0), 1e-9);
    let p = ProcWindow {
        files: vec![f(1000, Some(400)), mapped],
        storage_bytes: Some(10_000),
        ..Default::default()
    };
    // Per file the larger of the two, plus what no opened file accounts for.
    assert_eq!(p.input_bytes(), 1000 + 4096 + (10_000 - 4496));

    // Where faults on mappings are followed: what was mapped counts,
    // and the storage share is of read and mapped bytes together.
    let m = |read_bytes, mmap_bytes, storage_bytes| FileWindow {
        mmap_bytes: Some(mmap_bytes),
        ..f(read_bytes, Some(storage_bytes))
    };
    assert_eq!(m(0, 8192, 0).source().as_deref(), Some("through a mapping, from the page cache"));
    assert_eq!(
        m(0, 8192, 8192).source().as_deref(),
        Some("through a mapping, from storage (page cache cold)")
    );
    assert_eq!(m(0, 10_000, 4000).source().as_deref(), Some("through a mapping, 40 % from storage"));
    assert_eq!(m(1000, 9000, 0).source().as_deref(), Some("from the page cache"));
    assert_eq!(m(1000, 9000, 0).bytes_in(), 10_000);
    // A fault on a page still being read set off 16.8 MB of read-ahead,
    // of which this process mapped 5.5 MB (its siblings map the rest from
    // the page cache): what it took in is what it mapped.
    assert_eq!(m(0, 5_500_000, 16_800_000).bytes_in(), 5_500_000);
    assert_eq!(f(0, Some(16_800_000)).bytes_in(), 16_800_000, "faults not followed: storage says");
    assert_eq!(m(0, 0, 0).source(), None, "nothing taken, nothing to say");
    let calls = |read_calls, mmap_bytes| FileWindow { read_calls, mmap_bytes, ..Default::default() };
    assert_eq!(calls(3, None).taken_by(), "in 3 reads");
    assert_eq!(calls(3, Some(0)).taken_by(), "in 3 reads");
    assert_eq!(calls(0, Some(4096)).taken_by(), "mapped");
    assert_eq!(calls(3, Some(4096)).taken_by(), "in 3 reads and mapped");
    let p = ProcWindow {
        files: vec![m(1000, 9000, 0)],
        storage_bytes: Some(0),
        mmap_bytes: Some(9000 + 5000),
        ..Default::default()
    };
    assert_eq!(p.input_bytes(), 10_000, "what files not seen opened had mapped is no input");
    let lib = FileWindow { path: "/usr/lib/libtorch_cpu.so".into(), ..m(0, 1 << 20, 0) };
    assert_eq!(lib.bytes_in(), 0, "a library's code mapped is no input");
    assert!(ProcWindow { files: vec![m(0, 4096, 0)], ..Default::default() }.moved());
}

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
fn recent_windows_span_at_least_five_seconds() {
    let mut recent = VecDeque::new();
    for i in 0..20u64 {
        let start = i * 999_000_000;
        push_recent(
            &mut recent,
            Window { start_ns: start, end_ns: start + 999_000_000, ..Default::default() },
        );
        let span = Window::merge(recent.make_contiguous()).secs();
        assert!(span >= 4.99 || i < 5, "{span}");
        assert!(span < 6.0, "{span}");
    }
}

#[test]
fn since_subtracts_an_earlier_view_of_the_same_run() {
    let thread = |tid: u32, on: u64, wakes: u64| ThreadWindow {
        tid,
        alive: true,
        delta: ThreadCounters { on_cpu_ns: on, ..Default::default() },
        woken_by: vec![Waker { tid: 9, tgid: 9, comm: "w".into(), count: wakes, blocked_ns: 0 }],
        ..Default::default()
    };
    let file = |bytes: u64| FileWindow {
        path: "/a".into(),
        read_bytes: bytes,
        read_calls: bytes / 10,
        ..Default::default()
    };
    let proc = |on: u64, wakes: u64, bytes: u64, alive: bool| ProcWindow {
        tgid: 1,
        alive,
        threads: vec![ThreadWindow { alive, ..thread(1, on, wakes) }],
        files: vec![file(bytes)],
        ..Default::default()
    };
    let before = Window {
        start_ns: 0,
        end_ns: 10,
        procs: vec![proc(100, 3, 50, true)],
        events: 4,
        ..Default::default()
    };
    let mut now = Window {
        start_ns: 0,
        end_ns: 30,
        procs: vec![proc(160, 10, 250, true)],
        events: 9,
        ..Default::default()
    };
    // A process that ended before, and one that came after.
    now.procs.push(ProcWindow { tgid: 2, ..proc(5, 0, 0, false) });
    let before = Window {
        procs: [before.procs.clone(), vec![ProcWindow { tgid: 2, ..proc(5, 0, 0, false) }]].concat(),
        ..before
    };
    now.procs.push(ProcWindow { tgid: 3, ..proc(7, 1, 20, true) });
    let d = now.since(&before);
    assert_eq!((d.start_ns, d.end_ns, d.events), (10, 30, 5));
    let p = d.proc(1).unwrap();
    assert_eq!(p.threads[0].delta.on_cpu_ns, 60);
    assert_eq!(p.threads[0].woken_by[0].count, 7);
    assert_eq!((p.files[0].read_bytes, p.files[0].read_calls), (200, 20));
    assert!(d.proc(2).is_none(), "ended before: nothing since");
    assert_eq!(d.proc(3).unwrap().threads[0].delta.on_cpu_ns, 7, "new since: all of it");
}
