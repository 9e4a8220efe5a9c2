//! The exported functions, called directly. The device flags and knobs are
//! the process's: tests that use them hold [`serial`], and timing ones do
//! not share the CPUs with each other.

use super::*;
use stall_stub_calls::{assert_distinct, assert_library_distinct};
use std::ptr::null_mut;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    lock(&SERIAL)
}

const ONE: Dim3 = Dim3 { x: 1, y: 1, z: 1 };

fn launch_on(s: cudaStream_t) {
    assert_eq!(cudaLaunchKernel(std::ptr::null(), ONE, ONE, null_mut(), 0, s), SUCCESS);
}

/// What the calling thread did, from /proc/thread-self/schedstat: time on
/// a CPU, and time runnable but waiting for one.
#[derive(Clone, Copy, Debug)]
struct Sched {
    cpu: Duration,
    queued: Duration,
}

fn sched() -> Sched {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
    let ns: Vec<u64> = text.split_whitespace().map(|f| f.parse().unwrap()).collect();
    Sched { cpu: Duration::from_nanos(ns[0]), queued: Duration::from_nanos(ns[1]) }
}

/// Wall time of `f`, and what this thread did meanwhile. The machine's
/// other work may take the CPU from a spinning thread: a spinning thread
/// is on CPU or waiting for one (runnable) the whole time, a sleeping one
/// is neither.
fn timed(f: impl FnOnce()) -> (Duration, Sched) {
    let (t0, s0) = (Instant::now(), sched());
    f();
    let s1 = sched();
    (t0.elapsed(), Sched { cpu: s1.cpu - s0.cpu, queued: s1.queued - s0.queued })
}

/// The share of `wall` the thread was runnable (on CPU or waiting for one).
fn runnable(wall: Duration, s: Sched) -> f64 {
    (s.cpu + s.queued).as_secs_f64() / wall.as_secs_f64()
}

/// Runs a timing check until it passes, at most 5 times: the machine's
/// other work can take the CPU from a spinning thread now and then.
fn retried(mut check: impl FnMut() -> Result<(), String>) {
    let mut fails = Vec::new();
    for _ in 0..5 {
        match check() {
            Ok(()) => return,
            Err(e) => fails.push(e),
        }
    }
    panic!("failed 5 times: {fails:?}");
}

fn new_stream() -> cudaStream_t {
    let mut s = null_mut();
    // SAFETY: a valid out pointer.
    assert_eq!(unsafe { cudaStreamCreate(&mut s) }, SUCCESS);
    assert!(!s.is_null());
    s
}

fn new_event() -> cudaEvent_t {
    let mut e = null_mut();
    // SAFETY: a valid out pointer.
    assert_eq!(unsafe { cudaEventCreate(&mut e) }, SUCCESS);
    e
}

/// Launches 10 kernels of 2 ms on the legacy stream and synchronizes with
/// `sync` under `schedule`: (time from the first launch, wall and CPU time
/// of the synchronization).
fn ten_kernels(schedule: c_uint, sync: impl FnOnce()) -> (Duration, Duration, Sched) {
    assert_eq!(cudaSetDeviceFlags(schedule), SUCCESS);
    stallStubSetKernelMicros(2000);
    // A warm legacy stream, nothing pending.
    assert_eq!(cudaStreamSynchronize(null_mut()), SUCCESS);
    let t0 = Instant::now();
    for _ in 0..10 {
        launch_on(null_mut());
    }
    let (wall, cpu) = timed(sync);
    (t0.elapsed(), wall, cpu)
}

#[test]
fn spin_sync_keeps_the_caller_on_cpu() {
    let _g = serial();
    for schedule in [SCHEDULE_SPIN, SCHEDULE_AUTO] {
        retried(|| {
            let (total, wall, cpu) = ten_kernels(schedule, || {
                assert_eq!(cudaStreamSynchronize(null_mut()), SUCCESS);
            });
            assert!(total >= Duration::from_millis(20), "{total:?}");
            if runnable(wall, cpu) < 0.8 {
                return Err(format!("schedule {schedule}: {cpu:?} of {wall:?}"));
            }
            Ok(())
        });
    }
    assert_eq!(cudaSetDeviceFlags(SCHEDULE_AUTO), SUCCESS);
}

#[test]
fn blocking_sync_sleeps() {
    let _g = serial();
    for sync in [
        (|| assert_eq!(cudaStreamSynchronize(null_mut()), SUCCESS)) as fn(),
        || assert_eq!(cudaDeviceSynchronize(), SUCCESS),
        || assert_eq!(cuCtxSynchronize(), SUCCESS),
    ] {
        retried(|| {
            let (total, wall, cpu) = ten_kernels(SCHEDULE_BLOCKING_SYNC, sync);
            assert!(total >= Duration::from_millis(20), "{total:?}");
            if runnable(wall, cpu) >= 0.2 {
                return Err(format!("{cpu:?} of {wall:?}"));
            }
            Ok(())
        });
    }
    assert_eq!(cudaSetDeviceFlags(SCHEDULE_AUTO), SUCCESS);
}

#[test]
fn yield_sync_waits_on_sched_yield() {
    let _g = serial();
    let (total, _, _) = ten_kernels(SCHEDULE_YIELD, || {
        assert_eq!(cuStreamSynchronize(null_mut()), SUCCESS);
    });
    assert!(total >= Duration::from_millis(20), "{total:?}");
    assert_eq!(cudaSetDeviceFlags(SCHEDULE_AUTO), SUCCESS);
}

#[test]
fn device_flags() {
    let _g = serial();
    let mut f = 99;
    assert_eq!(cudaSetDeviceFlags(SCHEDULE_BLOCKING_SYNC | 0x08), SUCCESS);
    // SAFETY: a valid out pointer.
    assert_eq!(unsafe { cudaGetDeviceFlags(&mut f) }, SUCCESS);
    assert_eq!(f, SCHEDULE_BLOCKING_SYNC | 0x08);
    assert_eq!(stallStubGetDeviceSchedule(), SCHEDULE_BLOCKING_SYNC);
    // Two schedules at once, or unknown flags: refused, nothing changes.
    assert_eq!(cudaSetDeviceFlags(SCHEDULE_SPIN | SCHEDULE_YIELD), ERROR_INVALID_VALUE);
    assert_eq!(cudaSetDeviceFlags(0x100), ERROR_INVALID_VALUE);
    assert_eq!(stallStubGetDeviceSchedule(), SCHEDULE_BLOCKING_SYNC);
    // SAFETY: null is refused.
    assert_eq!(unsafe { cudaGetDeviceFlags(null_mut()) }, ERROR_INVALID_VALUE);
    assert_eq!(cudaSetDeviceFlags(SCHEDULE_AUTO), SUCCESS);
    assert_eq!(cudaSetDevice(0), SUCCESS);
    assert_eq!(cudaSetDevice(1), ERROR_INVALID_DEVICE);
    assert_eq!(cuInit(0), SUCCESS);
}

#[test]
fn a_synchronous_copy_spins_at_the_rate() {
    let _g = serial();
    assert_eq!(cudaSetDeviceFlags(SCHEDULE_BLOCKING_SYNC), SUCCESS);
    stallStubSetCopyMBps(400);
    let n = 8_000_000;
    let mut dev = null_mut();
    // SAFETY: valid out pointer.
    assert_eq!(unsafe { cudaMalloc(&mut dev, n) }, SUCCESS);
    assert_eq!(dev as usize % DEVICE_ALIGN, 0);
    let src: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
    let mut back = vec![1u8; n];
    // 8 MB at 400 MB/s: 20 ms, spent on CPU whatever the flags (the pages
    // are touched by the first try).
    retried(|| {
        // SAFETY: both buffers are n bytes.
        let (wall, cpu) = timed(|| unsafe {
            assert_eq!(cudaMemcpy(dev, src.as_ptr().cast(), n, MEMCPY_HOST_TO_DEVICE), SUCCESS);
        });
        assert!(wall >= Duration::from_millis(20), "{wall:?}");
        if wall > Duration::from_millis(30) || runnable(wall, cpu) < 0.8 {
            return Err(format!("{cpu:?} of {wall:?}"));
        }
        Ok(())
    });
    retried(|| {
        // SAFETY: both buffers are n bytes.
        let (wall, _) = timed(|| unsafe {
            assert_eq!(cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), dev as u64, n), SUCCESS);
        });
        assert!(wall >= Duration::from_millis(20), "{wall:?}");
        (wall <= Duration::from_millis(30)).then_some(()).ok_or(format!("{wall:?}"))
    });
    assert!(back == src);
    // The driver's HtoD too, and a copy first waits for the legacy stream.
    stallStubSetKernelMicros(15_000);
    let zeros = vec![0u8; 1000];
    let t0 = Instant::now();
    launch_on(null_mut());
    // SAFETY: 1000 bytes each.
    assert_eq!(unsafe { cuMemcpyHtoD_v2(dev as u64, zeros.as_ptr().cast(), 1000) }, SUCCESS);
    assert!(t0.elapsed() >= Duration::from_millis(15), "{:?}", t0.elapsed());
    assert_eq!(cudaStreamQuery(null_mut()), SUCCESS);
    // SAFETY: both buffers are n bytes.
    unsafe {
        assert_eq!(cudaMemcpy(back.as_mut_ptr().cast(), dev, n, MEMCPY_DEFAULT), SUCCESS);
    }
    assert!(back[..1000].iter().all(|b| *b == 0) && back[1000..] == src[1000..]);
    // Device sides outside the stub's allocations, and bad kinds, are refused.
    // SAFETY: refused before any access.
    unsafe {
        assert_eq!(cudaMemcpy(back.as_mut_ptr().cast(), src.as_ptr().cast(), 8, 2), ERROR_INVALID_VALUE);
        assert_eq!(cudaMemcpy(dev, src.as_ptr().cast(), n + 1, 1), ERROR_INVALID_VALUE);
        assert_eq!(cudaMemcpy(dev, src.as_ptr().cast(), 8, 7), ERROR_INVALID_MEMCPY_DIRECTION);
        assert_eq!(cudaFree(dev), SUCCESS);
        assert_eq!(cudaFree(dev), ERROR_INVALID_VALUE);
        assert_eq!(cudaFree(null_mut()), SUCCESS);
    }
    assert_eq!(cudaSetDeviceFlags(SCHEDULE_AUTO), SUCCESS);
}

#[test]
fn an_async_copy_takes_its_time_on_the_stream() {
    let _g = serial();
    stallStubSetCopyMBps(1000);
    let s = new_stream();
    let n = 50_000_000;
    let mut dev = null_mut();
    // SAFETY: valid out pointer.
    assert_eq!(unsafe { cudaMalloc(&mut dev, n) }, SUCCESS);
    let src = vec![7u8; n];
    let dev_bytes = || {
        // SAFETY: dev is n bytes; only the stream's worker writes it, and
        // not while this reads (it waits for the kernel, or is done).
        unsafe { std::slice::from_raw_parts(dev as *const u8, n) }
    };
    // Behind a kernel of 300 ms, so the copy has not started when the call
    // returns, however slowly this thread runs on a loaded machine.
    stallStubSetKernelMicros(300_000);
    let t0 = Instant::now();
    launch_on(s);
    // SAFETY: src and dev are n bytes and outlive the stream's work.
    let (wall, sc) = timed(|| unsafe {
        assert_eq!(cudaMemcpyAsync(dev, src.as_ptr().cast(), n, MEMCPY_HOST_TO_DEVICE, s), SUCCESS);
    });
    assert_eq!(cudaStreamQuery(s), ERROR_NOT_READY);
    // Its first and last bytes, not all 50 MB: a debug build takes longer
    // than the kernel's 300 ms to look at every byte on a loaded machine,
    // and the copy would have begun under the check.
    assert_eq!((dev_bytes()[0], dev_bytes()[n - 1]), (0, 0));
    assert!(sc.cpu < Duration::from_millis(2), "{sc:?} in {wall:?}");
    // 50 ms on the stream after the kernel.
    assert_eq!(cudaStreamSynchronize(s), SUCCESS);
    assert!(t0.elapsed() >= Duration::from_millis(350));
    assert_eq!(cudaStreamQuery(s), SUCCESS);
    assert!(dev_bytes().iter().all(|b| *b == 7));
    // SAFETY: allocated above.
    assert_eq!(unsafe { cudaFree(dev) }, SUCCESS);
    assert_eq!(cudaStreamDestroy(s), SUCCESS);
}

#[test]
fn launches_are_cheap() {
    let _g = serial();
    stallStubSetKernelMicros(0);
    let s = new_stream();
    let (wall, cpu) = timed(|| {
        for _ in 0..100_000 {
            launch_on(s);
        }
    });
    assert!(cpu.cpu < Duration::from_millis(500), "{cpu:?}");
    // The driver's launch too.
    let t0 = Instant::now();
    for _ in 0..10_000 {
        assert_eq!(cuLaunchKernel(null_mut(), 1, 1, 1, 32, 1, 1, 0, s, null_mut(), null_mut()), SUCCESS);
    }
    assert!(t0.elapsed() < Duration::from_millis(50), "{:?}", t0.elapsed());
    assert_eq!(cudaStreamSynchronize(s), SUCCESS);
    assert_eq!(cudaStreamDestroy(s), SUCCESS);
    eprintln!("100000 launches: {wall:?} wall, {:?} CPU", cpu.cpu);
}

#[test]
fn kernels_queue_back_to_back() {
    let _g = serial();
    assert_eq!(cudaSetDeviceFlags(SCHEDULE_BLOCKING_SYNC), SUCCESS);
    stallStubSetKernelMicros(100);
    let s = new_stream();
    // 200 kernels of 100 µs: 20 ms of GPU time, whatever the sleeps' slack.
    retried(|| {
        let t0 = Instant::now();
        for _ in 0..200 {
            launch_on(s);
        }
        assert_eq!(cudaStreamSynchronize(s), SUCCESS);
        let took = t0.elapsed();
        assert!(took >= Duration::from_millis(20), "{took:?}");
        (took < Duration::from_millis(25)).then_some(()).ok_or(format!("{took:?}"))
    });
    // A worker idle for longer than it polls sleeps until a launch wakes it.
    for idle in [IDLE_POLL_EVERY, IDLE_POLL_FOR / 2, IDLE_POLL_FOR * 2] {
        std::thread::sleep(idle);
        let t0 = Instant::now();
        launch_on(s);
        assert_eq!(cudaStreamSynchronize(s), SUCCESS);
        assert!(t0.elapsed() >= Duration::from_micros(100));
        assert!(t0.elapsed() < Duration::from_millis(100), "{:?}", t0.elapsed());
    }
    assert_eq!(cudaStreamDestroy(s), SUCCESS);
    assert_eq!(cudaSetDeviceFlags(SCHEDULE_AUTO), SUCCESS);
}

#[test]
fn events_mark_a_place_in_their_stream() {
    let _g = serial();
    for schedule in [SCHEDULE_SPIN, SCHEDULE_YIELD, SCHEDULE_BLOCKING_SYNC] {
        assert_eq!(cudaSetDeviceFlags(schedule), SUCCESS);
        let s = new_stream();
        let e = new_event();
        // Never recorded: complete.
        assert_eq!(cudaEventQuery(e), SUCCESS);
        assert_eq!(cudaEventSynchronize(e), SUCCESS);
        stallStubSetKernelMicros(5000);
        let t0 = Instant::now();
        launch_on(s);
        launch_on(s);
        assert_eq!(cudaEventRecord(e, s), SUCCESS);
        // Work after the record is not waited for.
        stallStubSetKernelMicros(200_000);
        launch_on(s);
        assert_eq!(cudaEventQuery(e), ERROR_NOT_READY);
        assert_eq!(cuEventSynchronize(e), SUCCESS);
        assert!(t0.elapsed() >= Duration::from_millis(10));
        assert_eq!(cudaEventQuery(e), SUCCESS);
        // The kernel after the record is still running.
        assert_eq!(cudaStreamQuery(s), ERROR_NOT_READY);
        assert_eq!(cudaEventDestroy(e), SUCCESS);
        assert_eq!(cudaEventDestroy(e), ERROR_INVALID_HANDLE);
        assert_eq!(cudaEventQuery(e), ERROR_INVALID_HANDLE);
        assert_eq!(cudaStreamSynchronize(s), SUCCESS);
        assert!(t0.elapsed() >= Duration::from_millis(210));
        assert_eq!(cudaStreamDestroy(s), SUCCESS);
    }
    assert_eq!(cudaSetDeviceFlags(SCHEDULE_AUTO), SUCCESS);
}

#[test]
fn device_synchronize_waits_for_every_stream() {
    let _g = serial();
    let (a, b) = (new_stream(), new_stream());
    // Long enough apart that a loaded machine's scheduling delays do not
    // blur them.
    stallStubSetKernelMicros(10_000);
    let t0 = Instant::now();
    launch_on(a);
    stallStubSetKernelMicros(200_000);
    launch_on(b);
    // Streams run side by side: a is done before b.
    assert_eq!(cudaStreamSynchronize(a), SUCCESS);
    assert_eq!(cudaStreamQuery(b), ERROR_NOT_READY);
    assert_eq!(cudaDeviceSynchronize(), SUCCESS);
    assert!(t0.elapsed() >= Duration::from_millis(200));
    // A destroyed stream still drains, and the device waits for it.
    stallStubSetKernelMicros(30_000);
    let t1 = Instant::now();
    launch_on(a);
    assert_eq!(cudaStreamDestroy(a), SUCCESS);
    assert_eq!(cudaStreamQuery(a), ERROR_INVALID_HANDLE);
    assert_eq!(cudaDeviceSynchronize(), SUCCESS);
    assert!(t1.elapsed() >= Duration::from_millis(30));
    assert_eq!(cudaStreamDestroy(b), SUCCESS);
}

fn stream_workers() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == "cudastub-stream")
        })
        .count()
}

#[test]
fn destroyed_streams_leave_no_threads() {
    let _g = serial();
    stallStubSetKernelMicros(1000);
    let streams: Vec<_> = (0..20).map(|_| new_stream()).collect();
    // A worker names itself once it runs.
    let t0 = Instant::now();
    while stream_workers() < 20 {
        assert!(t0.elapsed() < Duration::from_secs(2), "{} workers", stream_workers());
        std::thread::sleep(Duration::from_millis(1));
    }
    for &s in &streams {
        launch_on(s);
        assert_eq!(cudaStreamDestroy(s), SUCCESS);
        assert_eq!(cudaStreamDestroy(s), ERROR_INVALID_HANDLE);
        assert_eq!(cudaLaunchKernel(std::ptr::null(), ONE, ONE, null_mut(), 0, s), ERROR_INVALID_HANDLE);
    }
    let t0 = Instant::now();
    while stream_workers() > 0 {
        assert!(t0.elapsed() < Duration::from_secs(2), "{} workers left", stream_workers());
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(cudaStreamDestroy(null_mut()), ERROR_INVALID_HANDLE);
}

#[test]
fn bad_arguments_are_refused() {
    let _g = serial();
    let zero = Dim3 { x: 0, y: 1, z: 1 };
    assert_eq!(
        cudaLaunchKernel(std::ptr::null(), zero, ONE, null_mut(), 0, null_mut()),
        ERROR_INVALID_CONFIGURATION
    );
    assert_eq!(
        cuLaunchKernel(null_mut(), 1, 1, 1, 0, 1, 1, 0, null_mut(), null_mut(), null_mut()),
        ERROR_INVALID_CONFIGURATION
    );
    let bogus = 0x1234_5678usize as cudaStream_t;
    assert_eq!(cudaStreamSynchronize(bogus), ERROR_INVALID_HANDLE);
    assert_eq!(cudaEventRecord(bogus, null_mut()), ERROR_INVALID_HANDLE);
    assert_eq!(cudaEventSynchronize(bogus), ERROR_INVALID_HANDLE);
    // The special handles are the legacy stream.
    assert_eq!(cudaStreamSynchronize(STREAM_LEGACY as cudaStream_t), SUCCESS);
    assert_eq!(cudaStreamSynchronize(STREAM_PER_THREAD as cudaStream_t), SUCCESS);
    // SAFETY: null out pointers are refused.
    unsafe {
        assert_eq!(cudaStreamCreate(null_mut()), ERROR_INVALID_VALUE);
        assert_eq!(cudaEventCreate(null_mut()), ERROR_INVALID_VALUE);
        assert_eq!(cudaMalloc(null_mut(), 8), ERROR_INVALID_VALUE);
    }
    assert_eq!(cuInit(1), ERROR_INVALID_VALUE);
}

#[test]
fn c_layouts_match_cuda() {
    assert_eq!(std::mem::size_of::<Dim3>(), 12);
    assert_eq!(EXPORTED.len(), 32);
}

/// Every exported function, as the address a uprobe would go on.
fn exported_addresses() -> Vec<(&'static str, usize)> {
    let addrs = [
        cudaSetDeviceFlags as *const () as usize,
        cudaGetDeviceFlags as *const () as usize,
        cudaSetDevice as *const () as usize,
        cudaStreamCreate as *const () as usize,
        cudaStreamDestroy as *const () as usize,
        cudaLaunchKernel as *const () as usize,
        cudaStreamSynchronize as *const () as usize,
        cudaDeviceSynchronize as *const () as usize,
        cudaStreamQuery as *const () as usize,
        cudaEventCreate as *const () as usize,
        cudaEventRecord as *const () as usize,
        cudaEventSynchronize as *const () as usize,
        cudaEventQuery as *const () as usize,
        cudaEventDestroy as *const () as usize,
        cudaMemcpy as *const () as usize,
        cudaMemcpyAsync as *const () as usize,
        cudaMalloc as *const () as usize,
        cudaFree as *const () as usize,
        cudaLaunchHostFunc as *const () as usize,
        cuInit as *const () as usize,
        cuLaunchKernel as *const () as usize,
        cuStreamSynchronize as *const () as usize,
        cuCtxSynchronize as *const () as usize,
        cuEventSynchronize as *const () as usize,
        cuMemcpyDtoH_v2 as *const () as usize,
        cuMemcpyHtoD_v2 as *const () as usize,
        stallStubSetKernelMicros as *const () as usize,
        stallStubSetCopyMBps as *const () as usize,
        stallStubKernelMicros as *const () as usize,
        stallStubCopyMBps as *const () as usize,
        stallStubGetDeviceSchedule as *const () as usize,
        stallStubCallCount as *const () as usize,
    ];
    EXPORTED.iter().copied().zip(addrs).collect()
}

#[test]
fn every_function_has_an_address_of_its_own() {
    assert_distinct(&exported_addresses());
    // The same in the built library, where cargo built it.
    assert_library_distinct("libstall_cuda_stub.so", &EXPORTED);
}

#[test]
fn calls_are_counted() {
    let n = |name: &std::ffi::CStr| {
        // SAFETY: a NUL-terminated name.
        unsafe { stallStubCallCount(name.as_ptr()) }
    };
    let before = n(c"cuInit");
    assert_eq!(cuInit(0), SUCCESS);
    assert_eq!(cuInit(0), SUCCESS);
    // Other tests may call it meanwhile: at least ours.
    assert!(n(c"cuInit") >= before + 2);
    assert_eq!(n(c"cudaNoSuchThing"), u64::MAX);
    // SAFETY: null is refused.
    assert_eq!(unsafe { stallStubCallCount(std::ptr::null()) }, u64::MAX);
    assert!(n(c"stallStubCallCount") >= 2);
}

/// What [`host_fn_records`] saw: the order and time of its calls.
static HOST_CALLS: Mutex<Vec<(usize, Instant)>> = Mutex::new(Vec::new());

unsafe extern "C" fn host_fn_records(data: *mut c_void) {
    lock(&HOST_CALLS).push((data as usize, Instant::now()));
    std::thread::sleep(Duration::from_millis(30));
}

#[test]
fn host_functions_run_in_stream_order_and_hold_the_stream() {
    let _g = serial();
    stallStubSetKernelMicros(10_000);
    let s = new_stream();
    let t0 = Instant::now();
    launch_on(s);
    assert_eq!(cudaLaunchHostFunc(s, Some(host_fn_records), std::ptr::without_provenance_mut(1)), SUCCESS);
    assert_eq!(cudaLaunchHostFunc(s, Some(host_fn_records), std::ptr::without_provenance_mut(2)), SUCCESS);
    // Planned at launch to end 10 ms after the first kernel's end; the host
    // functions (30 ms each) push it back.
    launch_on(s);
    assert!(t0.elapsed() < Duration::from_millis(5), "cudaLaunchHostFunc must not wait");
    assert_eq!(cudaStreamSynchronize(s), SUCCESS);
    let took = t0.elapsed();
    let calls: Vec<(usize, Instant)> = lock(&HOST_CALLS).drain(..).collect();
    assert_eq!(calls.iter().map(|c| c.0).collect::<Vec<_>>(), [1, 2]);
    // The first ran after the kernel before it, the second after the first.
    assert!(calls[0].1 - t0 >= Duration::from_millis(10), "{:?}", calls[0].1 - t0);
    assert!(calls[1].1 - calls[0].1 >= Duration::from_millis(30));
    // 10 + 30 + 30 + 10 ms.
    assert!(took >= Duration::from_millis(80), "{took:?}");
    assert_eq!(cudaLaunchHostFunc(s, None, null_mut()), ERROR_INVALID_VALUE);
    assert_eq!(cudaStreamDestroy(s), SUCCESS);
    stallStubSetKernelMicros(DEFAULT_KERNEL_US);
}
