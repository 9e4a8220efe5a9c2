//! `bench-wl`: the workloads `cargo xtask bench` runs under each tracer.
//!
//! Every workload times only its own operation loop (process start, file
//! opening and thread creation excluded) and writes one line to `--out`:
//! `ops=N ns=T` and, for some, more `key=value` pairs. `rusage` is the odd
//! one: it runs a command and writes that command's own CPU time and peak RSS.
//!
//! ```text
//! bench-wl pread     --file F --out O [--ops N] [--rate R] [--secs S] [--threads T] [--ready-file P] [--stop-file P]
//!                    [--copy-to D]
//! bench-wl openclose --file F --out O [--secs S] [--rate R]
//! bench-wl getppid   --ops N --out O
//! bench-wl cuda      --lib PATH --call launch|sync --out O [--ops N] [--secs S] [--stop-file P] [--settle S]
//! bench-wl nccl      --lib PATH --nccl-lib PATH --out O [--ops N] [--secs S] [--stop-file P] [--settle S]
//! bench-wl loader    --files A,B,C,D --passes P --out O
//! bench-wl futex     --iters N --out O
//! bench-wl fork      --n N --out O
//! bench-wl rusage    --out O -- CMD...
//! bench-wl bpf-prof  --pid STALL --secs S --out O
//! bench-wl bpf-progs            (prints how many tracing BPF programs are loaded)
//! ```
use std::{
    collections::HashMap,
    ffi::CString,
    fs::File,
    io::Write,
    os::unix::fs::FileExt,
    path::Path,
    process::ExitCode,
    sync::{
        atomic::{AtomicBool, AtomicU32, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

const PAGE: usize = 4096;
const CHUNK: usize = 1 << 20;
/// `pread --copy-to`: the destination's size in pages (1 MiB).
const COPY_WINDOW_PAGES: u64 = 256;

type Res<T> = Result<T, String>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((cmd, rest)) = args.split_first() else {
        eprintln!(
            "usage: bench-wl pread|openclose|getppid|cuda|loader|futex|fork|rusage ... (see the source)"
        );
        return ExitCode::from(2);
    };
    let r = match cmd.as_str() {
        "rusage" => rusage(rest),
        "bpf-prof" => Opts::parse(rest).and_then(|o| bpf_prof(&o)),
        "bpf-progs" => {
            println!("tracing_progs={}", tracing_progs());
            Ok(())
        }
        _ => Opts::parse(rest).and_then(|o| {
            let line = match cmd.as_str() {
                "pread" => pread(&o),
                "getppid" => getppid(&o),
                "cuda" => cuda(&o),
                "nccl" => nccl(&o),
                "openclose" => openclose(&o),
                "loader" => loader(&o),
                "futex" => futex(&o),
                "fork" => fork(&o),
                other => Err(format!("unknown workload {other:?}")),
            }?;
            write_out(&o.req("out")?, &line)
        }),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-wl {cmd}: {e}");
            ExitCode::FAILURE
        }
    }
}

struct Opts(HashMap<String, String>);

impl Opts {
    fn parse(args: &[String]) -> Res<Self> {
        let mut m = HashMap::new();
        let mut it = args.iter();
        while let Some(k) = it.next() {
            let key = k.strip_prefix("--").ok_or_else(|| format!("unexpected argument {k:?}"))?;
            let v = it.next().ok_or_else(|| format!("{k} needs a value"))?;
            m.insert(key.to_string(), v.clone());
        }
        Ok(Self(m))
    }

    fn get(&self, k: &str) -> Option<&str> {
        self.0.get(k).map(String::as_str)
    }

    fn req(&self, k: &str) -> Res<String> {
        self.get(k).map(str::to_string).ok_or_else(|| format!("--{k} is required"))
    }

    fn num<T: std::str::FromStr>(&self, k: &str) -> Res<Option<T>> {
        self.get(k).map(|v| v.parse().map_err(|_| format!("--{k}: bad number {v:?}"))).transpose()
    }
}

fn write_out(path: &str, line: &str) -> Res<()> {
    std::fs::write(path, format!("{line}\n")).map_err(|e| format!("writing {path}: {e}"))
}

fn result(ops: u64, t: Duration, extra: &str) -> String {
    let mut s = format!("ops={ops} ns={}", t.as_nanos());
    if !extra.is_empty() {
        s.push(' ');
        s.push_str(extra);
    }
    s
}

/// When a loop stops: an op count, a duration, or a stop file.
struct Stop {
    ops: Option<u64>,
    secs: Option<f64>,
    file: Option<String>,
    flag: Arc<AtomicBool>,
}

impl Stop {
    fn from(o: &Opts, threads: u64) -> Res<Self> {
        let ops = o.num::<u64>("ops")?.map(|n| n.div_ceil(threads));
        let secs = o.num::<f64>("secs")?;
        let file = o.get("stop-file").map(str::to_string);
        let counted = ["iters", "n"].iter().any(|k| o.get(k).is_some());
        if ops.is_none() && secs.is_none() && file.is_none() && !counted {
            return Err("give a count, --secs or --stop-file".into());
        }
        Ok(Self { ops, secs, file, flag: Arc::new(AtomicBool::new(false)) })
    }

    /// Checked every so often, not per op.
    fn done(&self, ops: u64, start: Instant) -> bool {
        if self.flag.load(Ordering::Relaxed) {
            return true;
        }
        let hit = self.ops.is_some_and(|n| ops >= n)
            || self.secs.is_some_and(|s| start.elapsed().as_secs_f64() >= s)
            || self.file.as_deref().is_some_and(|f| Path::new(f).exists());
        if hit {
            self.flag.store(true, Ordering::Relaxed);
        }
        hit
    }

    fn clone_for_thread(&self) -> Self {
        Self { ops: self.ops, secs: self.secs, file: self.file.clone(), flag: self.flag.clone() }
    }
}

/// Paces a loop at `rate` ops/s: returns how many ops may run now (catching
/// up after oversleeping), sleeping in ~1 ms steps when ahead.
struct Pacer {
    rate: Option<f64>,
}

impl Pacer {
    fn allowance(&self, done: u64, start: Instant) -> u64 {
        let Some(rate) = self.rate else { return 256 };
        loop {
            let due = (start.elapsed().as_secs_f64() * rate) as u64;
            if due > done {
                return (due - done).min(4096);
            }
            thread::sleep(Duration::from_micros(1000));
        }
    }
}

/// `getppid` in a loop: a syscall no hook of stall's is on, for what the
/// syscall hooks cost a process that makes other calls.
fn getppid(o: &Opts) -> Res<String> {
    let ops = o.num::<u64>("ops")?.ok_or("--ops is required")?;
    let start = Instant::now();
    for _ in 0..ops {
        // The raw syscall: glibc might answer from a cache one day.
        unsafe { libc::syscall(libc::SYS_getppid) };
    }
    Ok(result(ops, start.elapsed(), ""))
}

/// `cudaLaunchKernel`'s grid and block sizes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
struct Dim3 {
    x: u32,
    y: u32,
    z: u32,
}

/// `cudaStream_t`; null is the legacy default stream.
type CudaStream = *mut libc::c_void;
type LaunchKernel = unsafe extern "C" fn(
    *const libc::c_void,
    Dim3,
    Dim3,
    *mut *mut libc::c_void,
    usize,
    CudaStream,
) -> libc::c_int;
type StreamSynchronize = unsafe extern "C" fn(CudaStream) -> libc::c_int;
type SetKernelMicros = unsafe extern "C" fn(libc::c_uint);

/// Launches between two synchronizations in `cuda --call launch`, as a
/// training step would.
const LAUNCHES_PER_SYNC: u64 = 1_000;

/// Calls into a CUDA runtime library loaded from `--lib` (the stand-in
/// `libstall_cuda_stub.so` under a real library's name, so that stall
/// probes it): `launch` times `cudaLaunchKernel`s on the legacy stream with
/// a `cudaStreamSynchronize` after every [`LAUNCHES_PER_SYNC`] (timed, not
/// counted as ops); `sync` times `cudaStreamSynchronize`s of the idle
/// legacy stream. The stub's kernels are set to take no time first.
/// A library `dlopen`ed (RTLD_GLOBAL, as PyTorch loads libcudart) and a
/// lookup of its symbols.
fn open_library(lib: &str) -> Res<impl Fn(&str) -> Res<*mut libc::c_void> + '_> {
    let name = CString::new(lib).map_err(|_| format!("{lib}: a NUL in the path"))?;
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if handle.is_null() {
        let why = unsafe { std::ffi::CStr::from_ptr(libc::dlerror()) };
        return Err(format!("dlopen {lib}: {}", why.to_string_lossy()));
    }
    Ok(move |s: &str| -> Res<*mut libc::c_void> {
        let c = CString::new(s).expect("a symbol name");
        let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
        if p.is_null() {
            Err(format!("{lib} has no {s}"))
        } else {
            Ok(p)
        }
    })
}

fn cuda(o: &Opts) -> Res<String> {
    let lib = o.req("lib")?;
    let call = o.req("call")?;
    if call != "launch" && call != "sync" {
        return Err(format!("--call: launch or sync, not {call:?}"));
    }
    let stop = Stop::from(o, 1)?;
    let sym = open_library(&lib)?;
    // SAFETY: the symbols have these C signatures in libcudart (and the stub).
    let launch: LaunchKernel = unsafe { std::mem::transmute(sym("cudaLaunchKernel")?) };
    let sync: StreamSynchronize = unsafe { std::mem::transmute(sym("cudaStreamSynchronize")?) };
    if let Ok(p) = sym("stallStubSetKernelMicros") {
        let set: SetKernelMicros = unsafe { std::mem::transmute(p) };
        unsafe { set(0) };
    }
    // A tracer attaches its probes once it sees the library opened, a little
    // after `dlopen`: the clock starts once both calls carry one (or after
    // --settle seconds, untraced).
    let settle = Duration::from_secs_f64(o.num::<f64>("settle")?.unwrap_or(1.0));
    let t0 = Instant::now();
    let probed = wait_probed(&[launch as *const u8, sync as *const u8], settle);
    let waited = t0.elapsed();
    let (legacy, one) = (std::ptr::null_mut(), Dim3 { x: 1, y: 1, z: 1 });
    let kernel = cuda as *const libc::c_void;
    let check =
        |what: &str, rc: libc::c_int| if rc == 0 { Ok(()) } else { Err(format!("{what} returned {rc}")) };
    // One call of each outside the clock: the library's setting up (the
    // stub starts the legacy stream's worker thread) is not what is measured.
    check("cudaLaunchKernel", unsafe { launch(kernel, one, one, std::ptr::null_mut(), 0, legacy) })?;
    check("cudaStreamSynchronize", unsafe { sync(legacy) })?;
    let mut ops = 0u64;
    let start = Instant::now();
    while !stop.done(ops, start) {
        for _ in 0..LAUNCHES_PER_SYNC {
            if call == "launch" {
                check("cudaLaunchKernel", unsafe {
                    launch(kernel, one, one, std::ptr::null_mut(), 0, legacy)
                })?;
            } else {
                check("cudaStreamSynchronize", unsafe { sync(legacy) })?;
            }
        }
        if call == "launch" {
            check("cudaStreamSynchronize", unsafe { sync(legacy) })?;
        }
        ops += LAUNCHES_PER_SYNC;
    }
    Ok(result(
        ops,
        start.elapsed(),
        &format!(
            "probed={} wait_ms={}",
            probed.map_or("unknown", |p| if p { "1" } else { "0" }),
            waited.as_millis()
        ),
    ))
}

/// `ncclUniqueId`: 128 bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
struct NcclUniqueId([u8; 128]);
type NcclComm = *mut libc::c_void;
type NcclGetUniqueId = unsafe extern "C" fn(*mut NcclUniqueId) -> libc::c_int;
type NcclCommInitRank =
    unsafe extern "C" fn(*mut NcclComm, libc::c_int, NcclUniqueId, libc::c_int) -> libc::c_int;
type NcclAllReduce = unsafe extern "C" fn(
    *const libc::c_void,
    *mut libc::c_void,
    usize,
    libc::c_int,
    libc::c_int,
    NcclComm,
    CudaStream,
) -> libc::c_int;
const NCCL_FLOAT32: libc::c_int = 7;
const NCCL_SUM: libc::c_int = 0;

/// NCCL all-reduces of one float on a communicator of one rank, through
/// `--nccl-lib` (the stand-in under libnccl's name) on the legacy stream of
/// `--lib` (the CUDA stand-in, which completes them): each op is an
/// `ncclAllReduce` and the `cudaStreamSynchronize` that waits for it, as a
/// step ends.
fn nccl(o: &Opts) -> Res<String> {
    let (lib, nccl_lib) = (o.req("lib")?, o.req("nccl-lib")?);
    let stop = Stop::from(o, 1)?;
    let cuda = open_library(&lib)?;
    let nccl = open_library(&nccl_lib)?;
    // SAFETY: the symbols have these C signatures in libcudart and libnccl
    // (and the stand-ins).
    let sync: StreamSynchronize = unsafe { std::mem::transmute(cuda("cudaStreamSynchronize")?) };
    let unique: NcclGetUniqueId = unsafe { std::mem::transmute(nccl("ncclGetUniqueId")?) };
    let init: NcclCommInitRank = unsafe { std::mem::transmute(nccl("ncclCommInitRank")?) };
    let all_reduce: NcclAllReduce = unsafe { std::mem::transmute(nccl("ncclAllReduce")?) };
    let settle = Duration::from_secs_f64(o.num::<f64>("settle")?.unwrap_or(1.0));
    let t0 = Instant::now();
    let probed = wait_probed(&[all_reduce as *const u8, sync as *const u8, init as *const u8], settle);
    let waited = t0.elapsed();
    let check =
        |what: &str, rc: libc::c_int| if rc == 0 { Ok(()) } else { Err(format!("{what} returned {rc}")) };
    let mut id = NcclUniqueId([0; 128]);
    check("ncclGetUniqueId", unsafe { unique(&mut id) })?;
    let mut comm: NcclComm = std::ptr::null_mut();
    check("ncclCommInitRank", unsafe { init(&mut comm, 1, id, 0) })?;
    let legacy: CudaStream = std::ptr::null_mut();
    let mut value = [1.0f32];
    let buf = value.as_mut_ptr().cast::<libc::c_void>();
    let step = || -> Res<()> {
        check("ncclAllReduce", unsafe { all_reduce(buf, buf, 1, NCCL_FLOAT32, NCCL_SUM, comm, legacy) })?;
        check("cudaStreamSynchronize", unsafe { sync(legacy) })
    };
    // The first outside the clock: the stand-ins start their threads.
    step()?;
    let mut ops = 0u64;
    let start = Instant::now();
    while !stop.done(ops, start) {
        for _ in 0..100 {
            step()?;
        }
        ops += 100;
    }
    Ok(result(
        ops,
        start.elapsed(),
        &format!(
            "probed={} wait_ms={}",
            probed.map_or("unknown", |p| if p { "1" } else { "0" }),
            waited.as_millis()
        ),
    ))
}

/// Waits up to `limit` until every function in `fns` starts with a
/// breakpoint (a uprobe's int3, written into this process's copy of the
/// page), polling each millisecond; whether they all did. Elsewhere than
/// x86-64 it cannot tell (None), and waits the whole `limit`.
fn wait_probed(fns: &[*const u8], limit: Duration) -> Option<bool> {
    let t0 = Instant::now();
    loop {
        // SAFETY: each is the first byte of a function of a loaded library.
        let all = cfg!(target_arch = "x86_64") && fns.iter().all(|f| unsafe { f.read_volatile() } == 0xCC);
        if all {
            return Some(true);
        }
        if t0.elapsed() >= limit {
            return cfg!(target_arch = "x86_64").then_some(false);
        }
        thread::sleep(Duration::from_millis(1));
    }
}

/// 4 KiB `pread`s walking a (cached) file, optionally paced and threaded.
fn pread(o: &Opts) -> Res<String> {
    let path = o.req("file")?;
    let threads = o.num::<u64>("threads")?.unwrap_or(1).max(1);
    let stop = Stop::from(o, threads)?;
    let rate = o.num::<f64>("rate")?.map(|r| r / threads as f64);
    let file = File::open(&path).map_err(|e| format!("{path}: {e}"))?;
    let pages = (file.metadata().map_err(|e| e.to_string())?.len() / PAGE as u64).max(1);
    // A copy loop (dd's): each block read is written to D, over a window of
    // COPY_WINDOW_PAGES so that the dirty pages stay few and in memory.
    let copy_to = o.get("copy-to").map(|p| p.to_string());
    if let Some(p) = o.get("ready-file") {
        write_out(p, "ready")?;
    }
    let start = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|i| {
            // Each thread opens the file itself, as DataLoader workers do, so
            // the bench times the file path (stall does not follow dup'd
            // descriptors: their reads count as non-file reads).
            let f = File::open(&path).expect("reopen");
            let dst = copy_to.as_ref().map(|d| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(d)
                    .expect("copy destination")
            });
            let stop = stop.clone_for_thread();
            thread::spawn(move || {
                let pacer = Pacer { rate };
                let mut buf = vec![0u8; PAGE];
                let mut page = i * pages / threads;
                let mut done = 0u64;
                while !stop.done(done, start) {
                    let n = pacer.allowance(done, start);
                    let n = stop.ops.map_or(n, |lim| n.min(lim - done));
                    for _ in 0..n {
                        if f.read_at(&mut buf, page * PAGE as u64).unwrap_or(0) != PAGE {
                            eprintln!("short read");
                        }
                        if let Some(d) = &dst {
                            let at = (page % COPY_WINDOW_PAGES) * PAGE as u64;
                            if d.write_at(&buf, at).unwrap_or(0) != PAGE {
                                eprintln!("short write");
                            }
                        }
                        page += 1;
                        if page == pages {
                            page = 0;
                        }
                    }
                    done += n;
                }
                done
            })
        })
        .collect();
    let ops: u64 = workers.into_iter().map(|w| w.join().unwrap_or(0)).sum();
    Ok(result(ops, start.elapsed(), ""))
}

/// open + 4 KiB pread + close: every iteration puts an open and a close
/// through stall's ring buffer.
fn openclose(o: &Opts) -> Res<String> {
    let path = o.req("file")?;
    let stop = Stop::from(o, 1)?;
    let pacer = Pacer { rate: o.num::<f64>("rate")? };
    let mut buf = vec![0u8; PAGE];
    let start = Instant::now();
    let mut done = 0u64;
    while !stop.done(done, start) {
        let n = pacer.allowance(done, start).min(64);
        for _ in 0..n {
            let f = File::open(&path).map_err(|e| format!("{path}: {e}"))?;
            let _ = f.read_at(&mut buf, 0);
        }
        done += n;
    }
    Ok(result(done, start.elapsed(), ""))
}

fn pipe_pair() -> Res<(i32, i32)> {
    let mut fds = [0i32; 2];
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    Ok((fds[0], fds[1]))
}

/// DataLoader-like: one forked worker per file, each reading it in 1 MiB
/// `read`s, `--passes` times (open, read to the end, close). The clock starts
/// once every worker is up and waiting, and stops when the last has exited.
fn loader(o: &Opts) -> Res<String> {
    let files: Vec<String> = o.req("files")?.split(',').map(str::to_string).collect();
    let passes = o.num::<u64>("passes")?.unwrap_or(1);
    // --cold 1: each pass evicts its file from the page cache first, so the
    // reads go to storage (and fill the cache: the storage hook's cost).
    let cold = o.num::<u8>("cold")?.unwrap_or(0) != 0;
    // --mmap 1: each pass maps its file and touches every page instead of
    // reading it (the bytes arrive by page faults: the mapping hooks' cost).
    let mapped = o.num::<u8>("mmap")?.unwrap_or(0) != 0;
    let mut chunks = 0u64;
    let mut lens = Vec::new();
    for f in &files {
        let len = std::fs::metadata(f).map_err(|e| format!("{f}: {e}"))?.len();
        chunks += len.div_ceil(CHUNK as u64) * passes;
        lens.push(len as usize);
    }
    let (ready_r, ready_w) = pipe_pair()?;
    let (go_r, go_w) = pipe_pair()?;
    let mut pids = Vec::new();
    for (f, &len) in files.iter().zip(&lens) {
        let cpath = CString::new(f.as_str()).map_err(|e| e.to_string())?;
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(format!("fork: {}", std::io::Error::last_os_error()));
        }
        if pid == 0 {
            // Child: only raw syscalls from here on.
            unsafe {
                libc::close(ready_r);
                libc::close(go_w);
                let buf = libc::mmap(
                    std::ptr::null_mut(),
                    CHUNK,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                    -1,
                    0,
                );
                let mut b = 0u8;
                libc::write(ready_w, (&raw const b).cast(), 1);
                libc::read(go_r, (&raw mut b).cast(), 1);
                for _ in 0..passes {
                    let fd = libc::open(cpath.as_ptr(), libc::O_RDONLY);
                    if fd < 0 {
                        libc::_exit(1);
                    }
                    if cold {
                        libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED);
                    }
                    if mapped {
                        let m =
                            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_PRIVATE, fd, 0);
                        libc::close(fd);
                        if m == libc::MAP_FAILED {
                            libc::_exit(1);
                        }
                        let mut sum = 0u8;
                        for off in (0..len).step_by(4096) {
                            sum = sum.wrapping_add(std::ptr::read_volatile(m.cast::<u8>().add(off)));
                        }
                        std::hint::black_box(sum);
                        libc::munmap(m, len);
                        continue;
                    }
                    while libc::read(fd, buf, CHUNK) > 0 {}
                    libc::close(fd);
                }
                libc::_exit(0);
            }
        }
        pids.push(pid);
    }
    unsafe {
        libc::close(ready_w);
        libc::close(go_r);
    }
    let mut b = [0u8; 1];
    for _ in &pids {
        if unsafe { libc::read(ready_r, b.as_mut_ptr().cast(), 1) } != 1 {
            return Err("a worker died before starting".into());
        }
    }
    let start = Instant::now();
    unsafe { libc::close(go_w) };
    let mut failed = 0;
    for pid in pids {
        let mut st = 0;
        unsafe { libc::waitpid(pid, &mut st, 0) };
        if !(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0) {
            failed += 1;
        }
    }
    let t = start.elapsed();
    if failed > 0 {
        return Err(format!("{failed} workers failed"));
    }
    Ok(result(chunks, t, &format!("workers={}", files.len())))
}

fn pin(cpu: usize) {
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn futex_wait(w: &AtomicU32, val: u32) {
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            w.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            val,
            std::ptr::null::<libc::timespec>(),
        );
    }
}

fn futex_wake(w: &AtomicU32, n: i32) {
    unsafe {
        libc::syscall(libc::SYS_futex, w.as_ptr(), libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG, n);
    }
}

fn switches() -> u64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    (ru.ru_nvcsw + ru.ru_nivcsw) as u64
}

/// Two threads pinned to one CPU hand a futex word back and forth: every
/// hand-off is a wakeup and a context switch. `ops` is the process's context
/// switches during the loop (getrusage). `--iters N` round trips, or `--secs`
/// / `--stop-file`.
fn futex(o: &Opts) -> Res<String> {
    let iters = o.num::<u64>("iters")?;
    let cpu = o.num::<usize>("cpu")?.unwrap_or(0);
    let mut stop = Stop::from(o, 1)?;
    stop.ops = iters;
    let turn = Arc::new(AtomicU32::new(2)); // 2: not started
    let quit = Arc::new(AtomicBool::new(false));
    let start = Arc::new(std::sync::OnceLock::<Instant>::new());
    let player = |me: u32| {
        let (turn, quit, start, stop) = (turn.clone(), quit.clone(), start.clone(), stop.clone_for_thread());
        move || -> u64 {
            pin(cpu);
            let mut i = 0u64;
            loop {
                loop {
                    if quit.load(Ordering::Acquire) {
                        return i;
                    }
                    let v = turn.load(Ordering::Acquire);
                    if v == me {
                        break;
                    }
                    futex_wait(&turn, v);
                }
                // Player 0 decides when to stop, and tells player 1 on its turn.
                let t0 = *start.get().expect("set before the first turn");
                if me == 0 && (stop.ops == Some(i) || (i.is_multiple_of(1024) && stop.done(i, t0))) {
                    quit.store(true, Ordering::Release);
                    turn.store(1, Ordering::Release);
                    futex_wake(&turn, 1);
                    return i;
                }
                turn.store(1 - me, Ordering::Release);
                futex_wake(&turn, 1);
                i += 1;
            }
        }
    };
    let a = thread::spawn(player(0));
    let b = thread::spawn(player(1));
    thread::sleep(Duration::from_millis(20));
    let sw0 = switches();
    let t0 = *start.get_or_init(Instant::now);
    turn.store(0, Ordering::Release);
    // Both may be asleep on the "not started" value.
    futex_wake(&turn, i32::MAX);
    let n = a.join().unwrap_or(0);
    let _ = b.join();
    let t = t0.elapsed();
    let sw = switches().saturating_sub(sw0);
    Ok(result(sw, t, &format!("handoffs={}", 2 * n)))
}

/// fork + child `_exit(0)` + waitpid: `--n` times, or `--secs` / `--stop-file`.
fn fork(o: &Opts) -> Res<String> {
    let mut stop = Stop::from(o, 1)?;
    stop.ops = o.num::<u64>("n")?;
    let start = Instant::now();
    let mut i = 0u64;
    while stop.ops.is_none_or(|n| i < n) && !(i.is_multiple_of(16) && stop.done(i, start)) {
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(format!("fork: {}", std::io::Error::last_os_error()));
        }
        if pid == 0 {
            unsafe { libc::_exit(0) };
        }
        let mut st = 0;
        unsafe { libc::waitpid(pid, &mut st, 0) };
        i += 1;
    }
    Ok(result(i, start.elapsed(), ""))
}

/// Runs a command and writes its own CPU seconds and peak RSS (wait4), then
/// exits with its status.
fn rusage(args: &[String]) -> Res<()> {
    let (out, cmd) = match args {
        [flag, out, sep, cmd @ ..] if flag == "--out" && sep == "--" && !cmd.is_empty() => (out, cmd),
        _ => return Err("usage: bench-wl rusage --out O -- CMD...".into()),
    };
    let child = std::process::Command::new(&cmd[0])
        .args(&cmd[1..])
        .spawn()
        .map_err(|e| format!("{}: {e}", cmd[0]))?;
    let pid = child.id() as i32;
    let mut st = 0;
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::wait4(pid, &mut st, 0, &mut ru) } != pid {
        return Err(format!("wait4: {}", std::io::Error::last_os_error()));
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let code = if libc::WIFEXITED(st) { libc::WEXITSTATUS(st) } else { 128 + libc::WTERMSIG(st) };
    let line = format!(
        "utime_s={} stime_s={} maxrss_kb={} status={code}",
        secs(ru.ru_utime),
        secs(ru.ru_stime),
        ru.ru_maxrss
    );
    let mut f = File::create(out).map_err(|e| format!("{out}: {e}"))?;
    writeln!(f, "{line}").map_err(|e| e.to_string())?;
    if code != 0 {
        return Err(format!("{} exited with {code}", cmd[0]));
    }
    Ok(())
}

const BPF_PROG_GET_FD_BY_ID: i64 = 13;
const BPF_OBJ_GET_INFO_BY_FD: i64 = 15;
const BPF_ENABLE_STATS: i64 = 32;
/// `struct bpf_prog_info` offsets (stable UAPI).
const BPF_PROG_GET_NEXT_ID: i64 = 11;
const INFO_TYPE: usize = 0;
const INFO_NAME: usize = 64;
const INFO_RUN_TIME_NS: usize = 192;
const INFO_RUN_CNT: usize = 200;

/// `bpf(2)` with a zeroed 128-byte attribute whose head is `words`.
fn bpf(cmd: i64, words: &[u64]) -> i64 {
    let mut attr = [0u64; 16];
    attr[..words.len()].copy_from_slice(words);
    unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_ptr(), std::mem::size_of_val(&attr)) }
}

/// The BPF programs a process holds, by id (from its fdinfo).
fn prog_ids(pid: &str) -> Vec<u32> {
    let mut ids = Vec::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else { return ids };
    for e in dir.flatten() {
        let info = std::fs::read_to_string(e.path()).unwrap_or_default();
        if let Some(id) = info.lines().find_map(|l| l.strip_prefix("prog_id:")?.trim().parse().ok()) {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    ids
}

/// Loaded programs of the kinds a tracer uses (kprobe, tracepoint, perf
/// event, raw tracepoint, tracing): anyone else's would skew the baseline.
fn tracing_progs() -> usize {
    let mut id = 0u64;
    let mut n = 0;
    loop {
        let mut attr = [0u64; 16];
        attr[0] = id;
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_PROG_GET_NEXT_ID,
                attr.as_mut_ptr(),
                std::mem::size_of_val(&attr),
            )
        };
        if r < 0 {
            return n;
        }
        id = attr[0] >> 32; // next_id
        if prog_info(id as u32).is_some_and(|b| matches!(u32_at(&b, INFO_TYPE), 2 | 5 | 7 | 17 | 26)) {
            n += 1;
        }
    }
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}

/// The raw `struct bpf_prog_info` of a program.
fn prog_info(id: u32) -> Option<Vec<u8>> {
    let fd = bpf(BPF_PROG_GET_FD_BY_ID, &[u64::from(id)]);
    if fd < 0 {
        return None;
    }
    let mut info = [0u64; 64];
    let len = std::mem::size_of_val(&info) as u64;
    let r = bpf(BPF_OBJ_GET_INFO_BY_FD, &[fd as u64 | (len << 32), info.as_mut_ptr() as u64]);
    unsafe { libc::close(fd as i32) };
    (r >= 0).then(|| info.iter().flat_map(|w| w.to_le_bytes()).collect())
}

/// (name, run_cnt, run_time_ns) of one program.
fn prog_stats(id: u32) -> Option<(String, u64, u64)> {
    let bytes = prog_info(id)?;
    let name = &bytes[INFO_NAME..INFO_NAME + 16];
    let name = String::from_utf8_lossy(&name[..name.iter().position(|&b| b == 0).unwrap_or(16)]).into_owned();
    let word = |off: usize| u64::from_le_bytes(bytes[off..off + 8].try_into().expect("8 bytes"));
    Some((name, word(INFO_RUN_CNT), word(INFO_RUN_TIME_NS)))
}

/// Per-program run counts and in-program time of a process's BPF programs
/// over `--secs`, with run-time statistics enabled for that span only
/// (`BPF_ENABLE_STATS`: off again when this process exits). Lines of
/// `prog=NAME runs=N ns=T`, then `secs=S`.
fn bpf_prof(o: &Opts) -> Res<()> {
    let pid = o.req("pid")?;
    let secs = o.num::<f64>("secs")?.unwrap_or(2.0);
    let stats_fd = bpf(BPF_ENABLE_STATS, &[0]); // BPF_STATS_RUN_TIME
    if stats_fd < 0 {
        return Err(format!("BPF_ENABLE_STATS: {}", std::io::Error::last_os_error()));
    }
    let ids = prog_ids(&pid);
    if ids.is_empty() {
        return Err(format!("process {pid} holds no BPF programs"));
    }
    let snap = || -> Vec<Option<(String, u64, u64)>> { ids.iter().map(|&id| prog_stats(id)).collect() };
    let a = snap();
    let t0 = Instant::now();
    thread::sleep(Duration::from_secs_f64(secs));
    let b = snap();
    let dt = t0.elapsed().as_secs_f64();
    unsafe { libc::close(stats_fd as i32) };
    let mut out = String::new();
    for (a, b) in a.into_iter().zip(b) {
        if let (Some((name, c0, t0)), Some((_, c1, t1))) = (a, b) {
            out.push_str(&format!("prog={name} runs={} ns={}\n", c1 - c0, t1 - t0));
        }
    }
    out.push_str(&format!("secs={dt}"));
    write_out(&o.req("out")?, &out)
}
