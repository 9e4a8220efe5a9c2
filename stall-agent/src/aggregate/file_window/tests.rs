//! Files on hand-made data: where their bytes came from, as the report
//! words it, and what counts as a process's input.
use super::*;
use crate::aggregate::ProcWindow;

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
