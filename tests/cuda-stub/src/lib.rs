//! `libstall_cuda_stub.so`: a stand-in for the CUDA runtime and driver
//! libraries (`libcudart.so`, `libcuda.so.1`) whose "GPU" is a set of
//! threads, so that stall's uprobes on the job's CUDA calls can be tested on
//! machines without a GPU. A workload loads it where it would load the real
//! library (tests/workloads/cuda_job.py does, through ctypes) and calls the
//! real entry points with their real C signatures (see [`EXPORTED`]).
//!
//! # The simulated device
//!
//! One device (0). Each stream, and the legacy default stream (handle NULL,
//! or `cudaStreamLegacy` / `cudaStreamPerThread`, which are the same stream
//! here), is a worker thread (named `cudastub-legacy` or `cudastub-stream`)
//! running a FIFO of work items. A kernel occupies its stream for its GPU
//! time ([`stallStubSetKernelMicros`]; default `$STALL_CUDA_STUB_KERNEL_US`,
//! else 1000 µs): the worker sleeps until the item's end, which is fixed at
//! launch as `max(now, end of the previous item) + GPU time`, so that sleep
//! overshoots do not add up. A launch only enqueues and returns (well under
//! a microsecond of host time); the GPU is not the host CPU.
//!
//! # Synchronization
//!
//! `cudaStreamSynchronize`, `cudaDeviceSynchronize` (all streams),
//! `cudaEventSynchronize` (the event's stream up to where it was recorded)
//! and their driver twins wait the way the device flags
//! (`cudaSetDeviceFlags`, shared by the driver calls) say, as CUDA does:
//! - `cudaDeviceScheduleAuto` (0) and `cudaDeviceScheduleSpin` (1): spin on
//!   an atomic counter: the caller stays on CPU the whole time;
//! - `cudaDeviceScheduleYield` (2): loop on `sched_yield(2)`;
//! - `cudaDeviceScheduleBlockingSync` (4): sleep on a futex (a condition
//!   variable) until the stream's worker wakes it.
//!
//! # Copies
//!
//! Device memory is host memory the stub allocates (`cudaMalloc`, 256-byte
//! aligned, zeroed); the device side of a copy must lie inside such an
//! allocation, else the call fails with `cudaErrorInvalidValue`. Synchronous
//! copies (`cudaMemcpy` but device to device, `cuMemcpyDtoH_v2`,
//! `cuMemcpyHtoD_v2`) first wait for the legacy stream's work (the way the
//! flags say), then copy the bytes and spin until `count / rate` has passed
//! since the copy began, as a pageable copy keeps the CPU busy. The rate is
//! [`stallStubSetCopyMBps`] (default `$STALL_CUDA_STUB_COPY_MBPS`, else
//! 2000 MB/s, 1 MB = 10^6 bytes; 0: copies take no time).
//! `cudaMemcpyAsync` and device-to-device `cudaMemcpy` enqueue a work item of
//! that duration on the stream and return; the worker copies the bytes when
//! the item starts.
//!
//! # Host functions
//!
//! `cudaLaunchHostFunc` enqueues a host function: the stream's worker calls
//! it when the stream reaches it, and the stream's later work waits until it
//! returns (its kernels then take their GPU time from that moment on), as
//! CUDA does. NCCL couples a collective's completion to the caller's stream
//! this way (tests/nccl-stub).
//!
//! Not simulated: the legacy stream's implicit synchronization with other
//! streams, per-thread default streams, events' timing, kernels' arguments.
#![allow(non_snake_case, non_camel_case_types, clippy::missing_safety_doc)]

use stall_stub_calls::Calls;
use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// Every function this library exports.
pub const EXPORTED: [&str; 32] = [
    "cudaSetDeviceFlags",
    "cudaGetDeviceFlags",
    "cudaSetDevice",
    "cudaStreamCreate",
    "cudaStreamDestroy",
    "cudaLaunchKernel",
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaStreamQuery",
    "cudaEventCreate",
    "cudaEventRecord",
    "cudaEventSynchronize",
    "cudaEventQuery",
    "cudaEventDestroy",
    "cudaMemcpy",
    "cudaMemcpyAsync",
    "cudaMalloc",
    "cudaFree",
    "cudaLaunchHostFunc",
    "cuInit",
    "cuLaunchKernel",
    "cuStreamSynchronize",
    "cuCtxSynchronize",
    "cuEventSynchronize",
    "cuMemcpyDtoH_v2",
    "cuMemcpyHtoD_v2",
    "stallStubSetKernelMicros",
    "stallStubSetCopyMBps",
    "stallStubKernelMicros",
    "stallStubCopyMBps",
    "stallStubGetDeviceSchedule",
    "stallStubCallCount",
];

/// Calls of each exported function so far, in the order of [`EXPORTED`].
static CALLS: Calls<{ EXPORTED.len() }> = Calls::new();

/// Counts a call of the exported function `name`.
macro_rules! count {
    ($name:literal) => {
        stall_stub_calls::count!(CALLS, EXPORTED, $name)
    };
}

/// The environment variable with the default GPU time of a kernel, µs.
pub const KERNEL_US_ENV: &str = "STALL_CUDA_STUB_KERNEL_US";
/// The environment variable with the default copy rate, MB/s.
pub const COPY_MBPS_ENV: &str = "STALL_CUDA_STUB_COPY_MBPS";
const DEFAULT_KERNEL_US: u32 = 1000;
const DEFAULT_COPY_MBPS: u32 = 2000;

// cudaError_t and CUresult share these values.
const SUCCESS: c_int = 0;
const ERROR_INVALID_VALUE: c_int = 1;
const ERROR_MEMORY_ALLOCATION: c_int = 2;
const ERROR_INVALID_CONFIGURATION: c_int = 9;
const ERROR_INVALID_MEMCPY_DIRECTION: c_int = 21;
const ERROR_INVALID_DEVICE: c_int = 101;
const ERROR_INVALID_HANDLE: c_int = 400;
const ERROR_NOT_READY: c_int = 600;

/// cudaDeviceScheduleMask and its values.
const SCHEDULE_MASK: c_uint = 0x07;
pub const SCHEDULE_AUTO: c_uint = 0;
pub const SCHEDULE_SPIN: c_uint = 1;
pub const SCHEDULE_YIELD: c_uint = 2;
pub const SCHEDULE_BLOCKING_SYNC: c_uint = 4;
/// Every flag cudaSetDeviceFlags takes (schedule, MapHost, LmemResizeToMax).
const DEVICE_FLAGS_MASK: c_uint = 0x1f;

// cudaMemcpyKind.
pub const MEMCPY_HOST_TO_HOST: c_int = 0;
pub const MEMCPY_HOST_TO_DEVICE: c_int = 1;
pub const MEMCPY_DEVICE_TO_HOST: c_int = 2;
pub const MEMCPY_DEVICE_TO_DEVICE: c_int = 3;
pub const MEMCPY_DEFAULT: c_int = 4;

/// cudaStreamLegacy and cudaStreamPerThread: both the legacy stream here.
const STREAM_LEGACY: usize = 0x1;
const STREAM_PER_THREAD: usize = 0x2;
/// An idle worker looks for work this often, for this long, before it
/// sleeps until a launch wakes it.
const IDLE_POLL_EVERY: Duration = Duration::from_micros(50);
const IDLE_POLL_FOR: Duration = Duration::from_millis(20);
/// Device allocations are aligned like cudaMalloc's.
const DEVICE_ALIGN: usize = 256;

/// cudaStream_t / CUstream: a pointer to the stub's stream.
pub type cudaStream_t = *mut c_void;
/// cudaEvent_t / CUevent: a pointer to the stub's event.
pub type cudaEvent_t = *mut c_void;

/// dim3, passed by value as in the real ABI.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Dim3 {
    pub x: c_uint,
    pub y: c_uint,
    pub z: c_uint,
}

// ---- Settings ----

/// Not yet read from the environment.
const UNSET: u32 = u32::MAX;
static KERNEL_US: AtomicU32 = AtomicU32::new(UNSET);
static COPY_MBPS: AtomicU32 = AtomicU32::new(UNSET);
/// What cudaSetDeviceFlags stored (the schedule in its low 3 bits).
static DEVICE_FLAGS: AtomicU32 = AtomicU32::new(0);

fn setting(cell: &AtomicU32, env: &str, default: u32) -> u32 {
    let v = cell.load(SeqCst);
    if v != UNSET {
        return v;
    }
    let from_env = std::env::var(env).ok().and_then(|s| s.trim().parse::<u32>().ok()).filter(|v| *v != UNSET);
    // A knob set meanwhile wins over the environment.
    match cell.compare_exchange(UNSET, from_env.unwrap_or(default), SeqCst, SeqCst) {
        Ok(_) => from_env.unwrap_or(default),
        Err(now) => now,
    }
}

fn kernel_time() -> Duration {
    Duration::from_micros(setting(&KERNEL_US, KERNEL_US_ENV, DEFAULT_KERNEL_US).into())
}

/// How long `bytes` take at the copy rate.
fn copy_time(bytes: usize) -> Duration {
    match setting(&COPY_MBPS, COPY_MBPS_ENV, DEFAULT_COPY_MBPS) {
        0 => Duration::ZERO,
        mbps => Duration::from_secs_f64(bytes as f64 / (mbps as f64 * 1e6)),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

// ---- Streams ----

/// A copy the worker makes when its item starts.
struct Copy {
    dst: *mut u8,
    src: *const u8,
    len: usize,
}

// SAFETY: the pointers are only dereferenced by the stream's worker, which
// the caller allowed by enqueuing the copy: as with CUDA, both buffers must
// stay valid until the stream has passed the copy.
unsafe impl Send for Copy {}

/// A host function a stream calls (`cudaLaunchHostFunc`).
struct HostFn {
    f: unsafe extern "C" fn(*mut c_void),
    data: *mut c_void,
}

// SAFETY: CUDA calls a host function on a thread of its own; whoever
// enqueued it made `data` fit for that.
unsafe impl Send for HostFn {}

struct Item {
    /// When the item leaves the stream.
    end: Instant,
    /// Its GPU time: `end` less this is when it was planned to start.
    gpu: Duration,
    copy: Option<Copy>,
    host: Option<HostFn>,
}

struct Queue {
    items: VecDeque<Item>,
    /// End of the last item enqueued.
    tail: Instant,
    /// The worker waits for work.
    idle: bool,
    destroyed: bool,
}

/// One stream and its worker thread.
struct Stream {
    legacy: bool,
    q: Mutex<Queue>,
    work: Condvar,
    /// Items enqueued and items done so far: a position in the stream is an
    /// `enqueued` count, reached once `done` is at least that much.
    enqueued: AtomicU64,
    done: AtomicU64,
    /// Set with `Queue::destroyed`, for the idle worker's polls.
    closing: AtomicBool,
    /// Threads sleeping in [`Stream::wait_blocking`].
    sleepers: AtomicUsize,
    done_mx: Mutex<()>,
    done_cv: Condvar,
}

/// Every stream whose worker runs: live ones, and destroyed ones still
/// draining (a device synchronization waits for those too).
static STREAMS: Mutex<Vec<Arc<Stream>>> = Mutex::new(Vec::new());
static LEGACY: OnceLock<Arc<Stream>> = OnceLock::new();

impl Stream {
    fn start(legacy: bool) -> Arc<Stream> {
        let s = Arc::new(Stream {
            legacy,
            q: Mutex::new(Queue {
                items: VecDeque::new(),
                tail: Instant::now(),
                idle: false,
                destroyed: false,
            }),
            work: Condvar::new(),
            enqueued: AtomicU64::new(0),
            done: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            done_mx: Mutex::new(()),
            done_cv: Condvar::new(),
        });
        lock(&STREAMS).push(s.clone());
        let name = if legacy { "cudastub-legacy" } else { "cudastub-stream" };
        let worker = s.clone();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || worker.run())
            .expect("cannot start a stream's worker thread");
        s
    }

    fn handle(self: &Arc<Stream>) -> cudaStream_t {
        Arc::as_ptr(self) as cudaStream_t
    }

    /// Enqueues an item of `gpu` time; `Err` once destroyed.
    fn enqueue(&self, gpu: Duration, copy: Option<Copy>) -> Result<(), c_int> {
        self.enqueue_item(gpu, copy, None)
    }

    fn enqueue_item(&self, gpu: Duration, copy: Option<Copy>, host: Option<HostFn>) -> Result<(), c_int> {
        let now = Instant::now();
        let mut q = lock(&self.q);
        if q.destroyed {
            return Err(ERROR_INVALID_HANDLE);
        }
        let end = q.tail.max(now) + gpu;
        q.tail = end;
        q.items.push_back(Item { end, gpu, copy, host });
        self.enqueued.fetch_add(1, SeqCst);
        // A condvar's notify is a futex syscall: only when the worker sleeps,
        // and after unlocking, lest the woken worker wait for the lock.
        let wake = std::mem::replace(&mut q.idle, false);
        drop(q);
        if wake {
            self.work.notify_one();
        }
        Ok(())
    }

    fn run(self: Arc<Stream>) {
        // Sleeps end within a microsecond of their deadline, not the
        // default 50 µs.
        // SAFETY: PR_SET_TIMERSLACK takes a number and touches no memory.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong) };
        loop {
            let item = {
                let mut q = lock(&self.q);
                let mut idle_since = None;
                loop {
                    if let Some(item) = q.items.pop_front() {
                        break item;
                    }
                    if q.destroyed {
                        drop(q);
                        lock(&STREAMS).retain(|s| !Arc::ptr_eq(s, &self));
                        return;
                    }
                    // Idle: look for work every IDLE_POLL_EVERY for a while,
                    // so that a launch seldom has to wake the worker (a
                    // futex syscall, 8 to 40 µs of the launching thread's
                    // time in a VM); then sleep until woken.
                    let since = *idle_since.get_or_insert_with(Instant::now);
                    if since.elapsed() < IDLE_POLL_FOR {
                        drop(q);
                        let taken = self.done.load(SeqCst);
                        while since.elapsed() < IDLE_POLL_FOR
                            && self.enqueued.load(SeqCst) == taken
                            && !self.closing.load(SeqCst)
                        {
                            std::thread::sleep(IDLE_POLL_EVERY);
                        }
                        q = lock(&self.q);
                        continue;
                    }
                    q.idle = true;
                    q = self.work.wait(q).unwrap_or_else(|e| e.into_inner());
                }
            };
            if let Some(c) = item.copy {
                // SAFETY: the caller of cudaMemcpyAsync (or of a device to
                // device cudaMemcpy) keeps both buffers valid, `len` bytes
                // long, until the stream passes the copy; the device side
                // was checked against the stub's allocations.
                unsafe { std::ptr::copy(c.src, c.dst, c.len) };
            }
            if let Some(h) = item.host {
                // SAFETY: the caller of cudaLaunchHostFunc passed a function
                // and the data it expects.
                unsafe { (h.f)(h.data) };
                self.delay_queued();
            }
            let now = Instant::now();
            if item.end > now {
                std::thread::sleep(item.end - now);
            }
            self.done.fetch_add(1, SeqCst);
            if self.sleepers.load(SeqCst) > 0 {
                // Taking the lock orders this wake-up after the sleeper's
                // check of `done` (it holds the lock until it waits).
                drop(lock(&self.done_mx));
                self.done_cv.notify_all();
            }
        }
    }

    /// After a host function returned: the items queued behind it start
    /// no earlier than now, as a GPU's would (their ends were planned at
    /// launch, before anyone knew how long the function would take).
    fn delay_queued(&self) {
        let mut q = lock(&self.q);
        let mut t = Instant::now();
        for it in q.items.iter_mut() {
            let start = (it.end - it.gpu).max(t);
            it.end = start + it.gpu;
            t = it.end;
        }
        q.tail = q.tail.max(t);
    }

    /// The current end of the stream, as a position to wait for.
    fn position(&self) -> u64 {
        self.enqueued.load(SeqCst)
    }

    fn reached(&self, pos: u64) -> bool {
        self.done.load(SeqCst) >= pos
    }

    /// Waits until the stream passed `pos`, the way the device flags say.
    fn wait(&self, pos: u64) {
        match schedule() {
            SCHEDULE_YIELD => {
                while !self.reached(pos) {
                    // SAFETY: sched_yield has no preconditions.
                    unsafe { libc::sched_yield() };
                }
            }
            SCHEDULE_BLOCKING_SYNC => self.wait_blocking(pos),
            _ => {
                while !self.reached(pos) {
                    std::hint::spin_loop();
                }
            }
        }
    }

    fn wait_blocking(&self, pos: u64) {
        let mut g = lock(&self.done_mx);
        self.sleepers.fetch_add(1, SeqCst);
        while !self.reached(pos) {
            g = self.done_cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        self.sleepers.fetch_sub(1, SeqCst);
    }

    fn synchronize(&self) {
        self.wait(self.position());
    }
}

fn legacy() -> &'static Arc<Stream> {
    LEGACY.get_or_init(|| Stream::start(true))
}

/// The stream behind a handle; NULL and the special handles are the legacy
/// stream.
fn stream(handle: cudaStream_t) -> Result<Arc<Stream>, c_int> {
    let addr = handle as usize;
    if addr == 0 || addr == STREAM_LEGACY || addr == STREAM_PER_THREAD {
        return Ok(legacy().clone());
    }
    let streams = lock(&STREAMS);
    for s in streams.iter() {
        if Arc::as_ptr(s) as usize == addr && !s.legacy && !s.closing.load(SeqCst) {
            return Ok(s.clone());
        }
    }
    Err(ERROR_INVALID_HANDLE)
}

/// The schedule part of the device flags.
fn schedule() -> c_uint {
    DEVICE_FLAGS.load(SeqCst) & SCHEDULE_MASK
}

fn device_synchronize() {
    // The legacy stream exists from the first device-wide call on, as a
    // context does.
    legacy();
    let all: Vec<(Arc<Stream>, u64)> = lock(&STREAMS).iter().map(|s| (s.clone(), s.position())).collect();
    for (s, pos) in all {
        s.wait(pos);
    }
}

fn stream_synchronize(stream_handle: cudaStream_t) -> c_int {
    result(stream(stream_handle).map(|s| s.synchronize()))
}

fn event_synchronize(event_handle: cudaEvent_t) -> c_int {
    result(event(event_handle).map(|e| {
        if let Some((s, pos)) = e.target() {
            s.wait(pos);
        }
    }))
}

fn result(r: Result<(), c_int>) -> c_int {
    match r {
        Ok(()) => SUCCESS,
        Err(e) => e,
    }
}

fn launch(grid: [c_uint; 3], block: [c_uint; 3], stream_handle: cudaStream_t) -> c_int {
    if grid.contains(&0) || block.contains(&0) {
        return ERROR_INVALID_CONFIGURATION;
    }
    result(stream(stream_handle).and_then(|s| s.enqueue(kernel_time(), None)))
}

// ---- Events ----

/// An event: where in which stream it was last recorded.
struct Event {
    at: Mutex<Option<(Arc<Stream>, u64)>>,
}

static EVENTS: Mutex<Option<HashMap<usize, Arc<Event>>>> = Mutex::new(None);

fn event(handle: cudaEvent_t) -> Result<Arc<Event>, c_int> {
    lock(&EVENTS).as_ref().and_then(|m| m.get(&(handle as usize))).cloned().ok_or(ERROR_INVALID_HANDLE)
}

impl Event {
    /// Where to wait for; `None` if never recorded (then it is complete).
    fn target(&self) -> Option<(Arc<Stream>, u64)> {
        lock(&self.at).clone()
    }
}

// ---- Device memory ----

/// Live device allocations: start address to length.
static ALLOCATIONS: Mutex<Option<HashMap<usize, usize>>> = Mutex::new(None);

/// Whether `[addr, addr + len)` lies in one device allocation.
fn is_device(addr: usize, len: usize) -> bool {
    let allocs = lock(&ALLOCATIONS);
    let Some(m) = allocs.as_ref() else { return false };
    let Some(end) = addr.checked_add(len) else { return false };
    m.iter().any(|(&start, &n)| addr >= start && end <= start + n.max(1))
}

fn device_layout(size: usize) -> Option<std::alloc::Layout> {
    std::alloc::Layout::from_size_align(size.max(1), DEVICE_ALIGN).ok()
}

/// Checks a copy's direction against where its pointers are: `Err` for a
/// device side outside the stub's allocations. Returns whether it is a
/// device to device copy.
fn check_copy(dst: usize, src: usize, count: usize, kind: c_int) -> Result<bool, c_int> {
    let (dst_dev, src_dev) = match kind {
        MEMCPY_HOST_TO_HOST => (false, false),
        MEMCPY_HOST_TO_DEVICE => (true, false),
        MEMCPY_DEVICE_TO_HOST => (false, true),
        MEMCPY_DEVICE_TO_DEVICE => (true, true),
        MEMCPY_DEFAULT => (is_device(dst, count), is_device(src, count)),
        _ => return Err(ERROR_INVALID_MEMCPY_DIRECTION),
    };
    if count > 0 && (dst == 0 || src == 0) {
        return Err(ERROR_INVALID_VALUE);
    }
    if count > 0 && ((dst_dev && !is_device(dst, count)) || (src_dev && !is_device(src, count))) {
        return Err(ERROR_INVALID_VALUE);
    }
    Ok(dst_dev && src_dev)
}

/// A synchronous copy: waits for the legacy stream, copies, then spins
/// until the copy's time at the rate has passed.
unsafe fn copy_sync(dst: *mut u8, src: *const u8, count: usize) {
    legacy().synchronize();
    let start = Instant::now();
    let took = copy_time(count);
    if count > 0 {
        // SAFETY: the caller checked the device side against the stub's
        // allocations; the host side is the caller's promise, as in CUDA.
        unsafe { std::ptr::copy(src, dst, count) };
    }
    while start.elapsed() < took {
        std::hint::spin_loop();
    }
}

// ---- Exported runtime API ----
//
// No exported function calls another: a uprobe on one symbol fires for the
// calls to that symbol only, as with the real, separate libraries.

#[no_mangle]
pub extern "C" fn cudaSetDeviceFlags(flags: c_uint) -> c_int {
    count!("cudaSetDeviceFlags");
    let sched = flags & SCHEDULE_MASK;
    if flags & !DEVICE_FLAGS_MASK != 0
        || ![SCHEDULE_AUTO, SCHEDULE_SPIN, SCHEDULE_YIELD, SCHEDULE_BLOCKING_SYNC].contains(&sched)
    {
        return ERROR_INVALID_VALUE;
    }
    DEVICE_FLAGS.store(flags, SeqCst);
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cudaGetDeviceFlags(flags: *mut c_uint) -> c_int {
    count!("cudaGetDeviceFlags");
    if flags.is_null() {
        return ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null; the caller passes a writable c_uint.
    unsafe { *flags = DEVICE_FLAGS.load(SeqCst) };
    SUCCESS
}

/// There is one device, 0.
#[no_mangle]
pub extern "C" fn cudaSetDevice(device: c_int) -> c_int {
    count!("cudaSetDevice");
    if device == 0 {
        SUCCESS
    } else {
        ERROR_INVALID_DEVICE
    }
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreate(stream_out: *mut cudaStream_t) -> c_int {
    count!("cudaStreamCreate");
    if stream_out.is_null() {
        return ERROR_INVALID_VALUE;
    }
    let s = Stream::start(false);
    // SAFETY: checked non-null; the caller passes a writable cudaStream_t.
    unsafe { *stream_out = s.handle() };
    SUCCESS
}

/// Returns at once; the worker finishes the stream's work, then exits.
#[no_mangle]
pub extern "C" fn cudaStreamDestroy(stream_handle: cudaStream_t) -> c_int {
    count!("cudaStreamDestroy");
    if stream_handle.is_null() {
        return ERROR_INVALID_HANDLE;
    }
    let s = match stream(stream_handle) {
        Ok(s) if !s.legacy => s,
        Ok(_) => return ERROR_INVALID_HANDLE,
        Err(e) => return e,
    };
    let mut q = lock(&s.q);
    if q.destroyed {
        return ERROR_INVALID_HANDLE;
    }
    q.destroyed = true;
    s.closing.store(true, SeqCst);
    s.work.notify_one();
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cudaLaunchKernel(
    _func: *const c_void,
    grid: Dim3,
    block: Dim3,
    _args: *mut *mut c_void,
    _shared_mem: usize,
    stream_handle: cudaStream_t,
) -> c_int {
    count!("cudaLaunchKernel");
    launch([grid.x, grid.y, grid.z], [block.x, block.y, block.z], stream_handle)
}

#[no_mangle]
pub extern "C" fn cudaStreamSynchronize(stream_handle: cudaStream_t) -> c_int {
    count!("cudaStreamSynchronize");
    stream_synchronize(stream_handle)
}

#[no_mangle]
pub extern "C" fn cudaDeviceSynchronize() -> c_int {
    count!("cudaDeviceSynchronize");
    device_synchronize();
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cudaStreamQuery(stream_handle: cudaStream_t) -> c_int {
    count!("cudaStreamQuery");
    match stream(stream_handle) {
        Ok(s) if s.reached(s.position()) => SUCCESS,
        Ok(_) => ERROR_NOT_READY,
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cudaEventCreate(event_out: *mut cudaEvent_t) -> c_int {
    count!("cudaEventCreate");
    if event_out.is_null() {
        return ERROR_INVALID_VALUE;
    }
    let e = Arc::new(Event { at: Mutex::new(None) });
    let handle = Arc::as_ptr(&e) as cudaEvent_t;
    lock(&EVENTS).get_or_insert_with(HashMap::new).insert(handle as usize, e);
    // SAFETY: checked non-null; the caller passes a writable cudaEvent_t.
    unsafe { *event_out = handle };
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cudaEventRecord(event_handle: cudaEvent_t, stream_handle: cudaStream_t) -> c_int {
    count!("cudaEventRecord");
    let (e, s) = match (event(event_handle), stream(stream_handle)) {
        (Ok(e), Ok(s)) => (e, s),
        (Err(err), _) | (_, Err(err)) => return err,
    };
    let pos = s.position();
    *lock(&e.at) = Some((s, pos));
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cudaEventSynchronize(event_handle: cudaEvent_t) -> c_int {
    count!("cudaEventSynchronize");
    event_synchronize(event_handle)
}

#[no_mangle]
pub extern "C" fn cudaEventQuery(event_handle: cudaEvent_t) -> c_int {
    count!("cudaEventQuery");
    match event(event_handle).map(|e| e.target()) {
        Ok(Some((s, pos))) if !s.reached(pos) => ERROR_NOT_READY,
        Ok(_) => SUCCESS,
        Err(e) => e,
    }
}

#[no_mangle]
pub extern "C" fn cudaEventDestroy(event_handle: cudaEvent_t) -> c_int {
    count!("cudaEventDestroy");
    match lock(&EVENTS).as_mut().and_then(|m| m.remove(&(event_handle as usize))) {
        Some(_) => SUCCESS,
        None => ERROR_INVALID_HANDLE,
    }
}

/// Synchronous but for device to device copies, which are enqueued on the
/// legacy stream (CUDA does not synchronize the host for those either).
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpy(
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: c_int,
) -> c_int {
    count!("cudaMemcpy");
    // SAFETY: the caller's promise, as in CUDA.
    unsafe { copy_any(dst, src, count, kind) }
}

/// cudaMemcpy and the driver's synchronous copies.
unsafe fn copy_any(dst: *mut c_void, src: *const c_void, count: usize, kind: c_int) -> c_int {
    match check_copy(dst as usize, src as usize, count, kind) {
        Err(e) => e,
        Ok(true) => {
            let c = Copy { dst: dst.cast(), src: src.cast(), len: count };
            result(legacy().enqueue(copy_time(count), Some(c)))
        }
        Ok(false) => {
            // SAFETY: checked above; the host side is the caller's promise.
            unsafe { copy_sync(dst.cast(), src.cast(), count) };
            SUCCESS
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyAsync(
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: c_int,
    stream_handle: cudaStream_t,
) -> c_int {
    count!("cudaMemcpyAsync");
    if let Err(e) = check_copy(dst as usize, src as usize, count, kind) {
        return e;
    }
    let c = (count > 0).then(|| Copy { dst: dst.cast(), src: src.cast(), len: count });
    result(stream(stream_handle).and_then(|s| s.enqueue(copy_time(count), c)))
}

#[no_mangle]
pub unsafe extern "C" fn cudaMalloc(dev_ptr: *mut *mut c_void, size: usize) -> c_int {
    count!("cudaMalloc");
    if dev_ptr.is_null() {
        return ERROR_INVALID_VALUE;
    }
    let Some(layout) = device_layout(size) else {
        return ERROR_MEMORY_ALLOCATION;
    };
    // SAFETY: the layout's size is non-zero.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        return ERROR_MEMORY_ALLOCATION;
    }
    lock(&ALLOCATIONS).get_or_insert_with(HashMap::new).insert(p as usize, size);
    // SAFETY: checked non-null; the caller passes a writable pointer.
    unsafe { *dev_ptr = p.cast() };
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cudaFree(dev_ptr: *mut c_void) -> c_int {
    count!("cudaFree");
    if dev_ptr.is_null() {
        return SUCCESS;
    }
    let Some(size) = lock(&ALLOCATIONS).as_mut().and_then(|m| m.remove(&(dev_ptr as usize))) else {
        return ERROR_INVALID_VALUE;
    };
    let layout = device_layout(size).expect("allocated with this layout");
    // SAFETY: allocated by cudaMalloc with this layout, and removed from the
    // table, so freed once.
    unsafe { std::alloc::dealloc(dev_ptr.cast(), layout) };
    SUCCESS
}

/// Enqueues `host_fn(user_data)` on the stream: called by its worker in
/// stream order; the stream's later work waits until it returns.
#[no_mangle]
pub extern "C" fn cudaLaunchHostFunc(
    stream_handle: cudaStream_t,
    host_fn: Option<unsafe extern "C" fn(*mut c_void)>,
    user_data: *mut c_void,
) -> c_int {
    count!("cudaLaunchHostFunc");
    let Some(f) = host_fn else { return ERROR_INVALID_VALUE };
    let h = HostFn { f, data: user_data };
    result(stream(stream_handle).and_then(|s| s.enqueue_item(Duration::ZERO, None, Some(h))))
}

// ---- Exported driver API ----

#[no_mangle]
pub extern "C" fn cuInit(flags: c_uint) -> c_int {
    count!("cuInit");
    if flags != 0 {
        return ERROR_INVALID_VALUE;
    }
    SUCCESS
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cuLaunchKernel(
    _f: *mut c_void,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    _shared_mem_bytes: c_uint,
    stream_handle: cudaStream_t,
    _kernel_params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> c_int {
    count!("cuLaunchKernel");
    launch([grid_x, grid_y, grid_z], [block_x, block_y, block_z], stream_handle)
}

#[no_mangle]
pub extern "C" fn cuStreamSynchronize(stream_handle: cudaStream_t) -> c_int {
    count!("cuStreamSynchronize");
    stream_synchronize(stream_handle)
}

#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> c_int {
    count!("cuCtxSynchronize");
    device_synchronize();
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuEventSynchronize(event_handle: cudaEvent_t) -> c_int {
    count!("cuEventSynchronize");
    event_synchronize(event_handle)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst_host: *mut c_void, src_device: u64, count: usize) -> c_int {
    count!("cuMemcpyDtoH_v2");
    // SAFETY: as cudaMemcpy's; the device side is checked there.
    unsafe { copy_any(dst_host, src_device as usize as *const c_void, count, MEMCPY_DEVICE_TO_HOST) }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(dst_device: u64, src_host: *const c_void, count: usize) -> c_int {
    count!("cuMemcpyHtoD_v2");
    // SAFETY: as cudaMemcpy's; the device side is checked there.
    unsafe { copy_any(dst_device as usize as *mut c_void, src_host, count, MEMCPY_HOST_TO_DEVICE) }
}

// ---- Exported knobs (the stub's own; a real program never calls them) ----

/// Sets the GPU time of each kernel launched from now on, µs.
#[no_mangle]
pub extern "C" fn stallStubSetKernelMicros(us: c_uint) {
    count!("stallStubSetKernelMicros");
    KERNEL_US.store(us.min(UNSET - 1), SeqCst);
}

/// Sets the rate of the copies made from now on, MB/s (0: instant).
#[no_mangle]
pub extern "C" fn stallStubSetCopyMBps(mbps: c_uint) {
    count!("stallStubSetCopyMBps");
    COPY_MBPS.store(mbps.min(UNSET - 1), SeqCst);
}

/// The GPU time of a kernel launched now, µs.
#[no_mangle]
pub extern "C" fn stallStubKernelMicros() -> c_uint {
    count!("stallStubKernelMicros");
    setting(&KERNEL_US, KERNEL_US_ENV, DEFAULT_KERNEL_US)
}

/// The copy rate, MB/s.
#[no_mangle]
pub extern "C" fn stallStubCopyMBps() -> c_uint {
    count!("stallStubCopyMBps");
    setting(&COPY_MBPS, COPY_MBPS_ENV, DEFAULT_COPY_MBPS)
}

/// How many times the exported function `name` (a C string) was called,
/// this call included for `stallStubCallCount` itself; `u64::MAX` for a
/// name this library does not export.
#[no_mangle]
pub unsafe extern "C" fn stallStubCallCount(name: *const c_char) -> u64 {
    count!("stallStubCallCount");
    // SAFETY: as the caller promises, null or a NUL-terminated string.
    unsafe { CALLS.of_c_name(&EXPORTED, name) }
}

/// The schedule synchronizations follow now (0, 1, 2 or 4).
#[no_mangle]
pub extern "C" fn stallStubGetDeviceSchedule() -> c_uint {
    count!("stallStubGetDeviceSchedule");
    schedule()
}

#[cfg(test)]
mod tests;
