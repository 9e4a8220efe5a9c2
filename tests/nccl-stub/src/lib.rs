//! `libstall_nccl_stub.so`: a stand-in for NCCL 2.x (`libnccl.so.2`) whose
//! collectives run over TCP between processes (or threads), so that stall's
//! uprobes on a job's NCCL calls can be tested without GPUs. A job loads it
//! where it would load the real library (tests/workloads/nccl_job.py does,
//! through ctypes) and calls NCCL's real entry points with their real C
//! signatures from `nccl.h` (see [`EXPORTED`]): a uprobe cannot tell the two
//! apart.
//!
//! # Transport
//!
//! `ncclGetUniqueId` binds a TCP listener and writes its address (IPv4,
//! port) and a random nonce into the 128-byte id. Rank 0 of
//! `ncclCommInitRank` accepts on it, every other rank connects to it: a star
//! through rank 0. Rank 0 gathers each collective's contributions, reduces
//! them (sum, prod, max, min, avg over NCCL's integer and float types; f16
//! is copied from rank 0, not reduced) and sends each rank its part;
//! `ncclSend`'s data goes through rank 0 to the peer, so rank 0's
//! `ncclCommDestroy` waits for the others to leave. Buffers are host
//! memory (the stand-in CUDA's `cudaMalloc` returns host memory).
//!
//! # Completion, as with NCCL and CUDA
//!
//! A collective or point-to-point call only enqueues the operation on the
//! communicator's progress thread and returns `ncclSuccess`. It also
//! enqueues, on the CUDA stream it was given, a host function
//! (`cudaLaunchHostFunc`, found with `dlsym(RTLD_DEFAULT)`: the job loads
//! libcudart with RTLD_GLOBAL, as PyTorch does) that lets the progress
//! thread start the exchange once the stream reaches it (after the kernels
//! before it) and returns when the exchange is done. So the caller's next
//! `cudaStreamSynchronize` waits for the collective, as it would for NCCL's
//! kernel. Without a `cudaLaunchHostFunc` in the process the call itself
//! blocks until done.
//!
//! Calls between `ncclGroupStart` and `ncclGroupEnd` are queued and issued
//! at `ncclGroupEnd`. Operations run in the order they are issued, on every
//! rank: as with NCCL, every rank must issue a communicator's collectives in
//! the same order.
#![allow(non_snake_case, non_camel_case_types, clippy::missing_safety_doc)]

use stall_stub_calls::Calls;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Every function this library exports.
pub const EXPORTED: [&str; 22] = [
    "ncclGetVersion",
    "ncclGetUniqueId",
    "ncclCommInitRank",
    "ncclCommInitRankConfig",
    "ncclCommSplit",
    "ncclCommDestroy",
    "ncclCommAbort",
    "ncclCommCount",
    "ncclCommUserRank",
    "ncclCommCuDevice",
    "ncclGetErrorString",
    "ncclGetLastError",
    "ncclAllReduce",
    "ncclBroadcast",
    "ncclReduce",
    "ncclAllGather",
    "ncclReduceScatter",
    "ncclSend",
    "ncclRecv",
    "ncclGroupStart",
    "ncclGroupEnd",
    "stallNcclStubCallCount",
];

/// Calls of each exported function so far, in the order of [`EXPORTED`].
static CALLS: Calls<{ EXPORTED.len() }> = Calls::new();

/// Counts a call of the exported function `name`.
macro_rules! count {
    ($name:literal) => {
        stall_stub_calls::count!(CALLS, EXPORTED, $name)
    };
}

/// NCCL 2.21.5, as `NCCL_VERSION_CODE` spells it (major*10000+minor*100+patch).
pub const VERSION_CODE: c_int = 22105;

// ncclResult_t.
pub const SUCCESS: c_int = 0;
pub const SYSTEM_ERROR: c_int = 2;
pub const INTERNAL_ERROR: c_int = 3;
pub const INVALID_ARGUMENT: c_int = 4;
pub const INVALID_USAGE: c_int = 5;
pub const REMOTE_ERROR: c_int = 6;

// ncclDataType_t.
pub const INT8: c_int = 0;
pub const UINT8: c_int = 1;
pub const INT32: c_int = 2;
pub const UINT32: c_int = 3;
pub const INT64: c_int = 4;
pub const UINT64: c_int = 5;
pub const FLOAT16: c_int = 6;
pub const FLOAT32: c_int = 7;
pub const FLOAT64: c_int = 8;
pub const BFLOAT16: c_int = 9;

// ncclRedOp_t.
pub const SUM: c_int = 0;
pub const PROD: c_int = 1;
pub const MAX: c_int = 2;
pub const MIN: c_int = 3;
pub const AVG: c_int = 4;

/// ncclCommSplit's color for "not in any new communicator".
pub const SPLIT_NOCOLOR: c_int = -1;

pub type ncclResult_t = c_int;
/// A pointer to the stub's communicator.
pub type ncclComm_t = *mut c_void;
pub type cudaStream_t = *mut c_void;
/// ncclConfig_t is only passed by pointer, and its fields are ignored.
pub type ncclConfig_t = c_void;

/// `ncclUniqueId`: 128 opaque bytes, passed by value (on the stack, as the
/// SysV ABI passes a 128-byte struct).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclUniqueId {
    pub internal: [c_char; 128],
}

/// The id's first bytes: the stub's, not another library's.
const ID_MAGIC: &[u8; 8] = b"stalnccl";
/// How long a rank tries to reach rank 0 in init.
const CONNECT_FOR: Duration = Duration::from_secs(120);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn dtype_size(dt: c_int) -> Option<usize> {
    match dt {
        INT8 | UINT8 => Some(1),
        FLOAT16 | BFLOAT16 => Some(2),
        INT32 | UINT32 | FLOAT32 => Some(4),
        INT64 | UINT64 | FLOAT64 => Some(8),
        _ => None,
    }
}

// ---- The unique id ----

/// What an id carries: rank 0's address and the communicator's nonce.
struct Id {
    root: SocketAddrV4,
    nonce: u64,
}

impl Id {
    fn encode(&self) -> ncclUniqueId {
        let mut b = [0u8; 128];
        b[..8].copy_from_slice(ID_MAGIC);
        b[8..12].copy_from_slice(&self.root.ip().octets());
        b[12..14].copy_from_slice(&self.root.port().to_be_bytes());
        b[16..24].copy_from_slice(&self.nonce.to_le_bytes());
        ncclUniqueId { internal: b.map(|x| x as c_char) }
    }

    fn decode(id: &ncclUniqueId) -> Option<Id> {
        let b = id.internal.map(|x| x as u8);
        if &b[..8] != ID_MAGIC {
            return None;
        }
        let ip = Ipv4Addr::new(b[8], b[9], b[10], b[11]);
        let port = u16::from_be_bytes([b[12], b[13]]);
        Some(Id {
            root: SocketAddrV4::new(ip, port),
            nonce: u64::from_le_bytes(b[16..24].try_into().unwrap()),
        })
    }
}

/// Listeners bound by ncclGetUniqueId, by nonce, for this process's rank 0.
static LISTENERS: Mutex<Option<HashMap<u64, TcpListener>>> = Mutex::new(None);

fn random_u64() -> u64 {
    let mut v = 0u64;
    // SAFETY: getrandom writes at most 8 bytes into `v`.
    let n = unsafe { libc::getrandom((&raw mut v).cast(), 8, 0) };
    if n != 8 {
        // Not fatal: the nonce only tells communicators apart.
        v = Instant::now().elapsed().as_nanos() as u64 ^ (std::process::id() as u64) << 32;
    }
    v
}

/// The address the id advertises: $STALL_NCCL_STUB_ADDR (an IPv4 address
/// of this host, for ranks on other hosts), else loopback.
fn advertised_ip() -> Ipv4Addr {
    std::env::var("STALL_NCCL_STUB_ADDR").ok().and_then(|s| s.parse().ok()).unwrap_or(Ipv4Addr::LOCALHOST)
}

// ---- Frames ----

/// A collective's contribution, to rank 0.
const CONTRIB: u8 = 1;
/// A collective's result, from rank 0.
const RESULT: u8 = 2;
/// Point-to-point data: to rank 0 with the destination as peer, relayed
/// with the source as peer.
const P2P: u8 = 3;

fn write_frame(link: &Mutex<TcpStream>, kind: u8, peer: u32, data: &[u8]) -> std::io::Result<()> {
    let mut h = [0u8; 16];
    h[0] = kind;
    h[4..8].copy_from_slice(&peer.to_le_bytes());
    h[8..16].copy_from_slice(&(data.len() as u64).to_le_bytes());
    let mut s = lock(link);
    s.write_all(&h)?;
    s.write_all(data)
}

fn read_frame(s: &mut TcpStream) -> std::io::Result<(u8, u32, Vec<u8>)> {
    let mut h = [0u8; 16];
    s.read_exact(&mut h)?;
    let peer = u32::from_le_bytes(h[4..8].try_into().unwrap());
    let len = u64::from_le_bytes(h[8..16].try_into().unwrap()) as usize;
    let mut data = vec![0u8; len];
    s.read_exact(&mut data)?;
    Ok((h[0], peer, data))
}

/// Frames received and not yet taken, by (kind, peer): the links' reader
/// threads put, the progress thread takes in order.
struct Inbox {
    st: Mutex<InboxState>,
    cv: Condvar,
}

struct InboxState {
    frames: HashMap<(u8, u32), VecDeque<Vec<u8>>>,
    /// Why a link failed, by the link's index: takes that would wait for a
    /// frame from it fail instead. Only that link's: a rank that destroyed
    /// its communicator first must not fail rank 0's exchanges with others.
    broken: HashMap<u32, String>,
    /// Rank 0's inbox (a peer's frames come on its own link), or another
    /// rank's (all come from rank 0).
    root: bool,
}

impl Inbox {
    fn push(&self, kind: u8, peer: u32, data: Vec<u8>) {
        lock(&self.st).frames.entry((kind, peer)).or_default().push_back(data);
        self.cv.notify_all();
    }

    fn fail(&self, link: u32, why: String) {
        lock(&self.st).broken.entry(link).or_insert(why);
        self.cv.notify_all();
    }

    fn take(&self, kind: u8, peer: u32) -> Result<Vec<u8>, String> {
        let mut st = lock(&self.st);
        loop {
            if let Some(d) = st.frames.get_mut(&(kind, peer)).and_then(|q| q.pop_front()) {
                return Ok(d);
            }
            let link = if st.root { peer } else { 0 };
            if let Some(why) = st.broken.get(&link) {
                return Err(why.clone());
            }
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }
}

// ---- Operations ----

/// Buffers are addresses: the caller keeps them valid until the stream
/// passed the operation, as with NCCL.
#[derive(Clone, Copy)]
enum Kind {
    AllReduce {
        send: usize,
        recv: usize,
        count: usize,
        dt: c_int,
        op: c_int,
    },
    Broadcast {
        send: usize,
        recv: usize,
        count: usize,
        dt: c_int,
        root: usize,
    },
    Reduce {
        send: usize,
        recv: usize,
        count: usize,
        dt: c_int,
        op: c_int,
        root: usize,
    },
    AllGather {
        send: usize,
        recv: usize,
        count: usize,
        dt: c_int,
    },
    ReduceScatter {
        send: usize,
        recv: usize,
        count: usize,
        dt: c_int,
        op: c_int,
    },
    Send {
        buf: usize,
        count: usize,
        dt: c_int,
        peer: usize,
    },
    Recv {
        buf: usize,
        count: usize,
        dt: c_int,
        peer: usize,
    },
    /// ncclCommSplit's exchange: an all-gather of `Done::data`.
    Gather,
}

/// An operation's progress, shared by the caller (or its stream's host
/// function) and the progress thread.
struct Done {
    st: Mutex<DoneState>,
    cv: Condvar,
}

struct DoneState {
    /// The stream reached the operation: the exchange may start.
    gate: bool,
    finished: bool,
    result: c_int,
    /// Gather: this rank's part, then everyone's.
    data: Vec<u8>,
}

impl Done {
    fn new(gate: bool, data: Vec<u8>) -> Arc<Done> {
        Arc::new(Done {
            st: Mutex::new(DoneState { gate, finished: false, result: SUCCESS, data }),
            cv: Condvar::new(),
        })
    }

    fn open(&self) {
        lock(&self.st).gate = true;
        self.cv.notify_all();
    }

    /// Waits for the gate; false if the communicator was aborted meanwhile.
    fn wait_gate(&self, aborted: &AtomicBool) -> bool {
        let mut st = lock(&self.st);
        while !st.gate {
            if aborted.load(SeqCst) {
                return false;
            }
            st = self.cv.wait_timeout(st, Duration::from_millis(50)).unwrap_or_else(|e| e.into_inner()).0;
        }
        true
    }

    fn finish(&self, result: c_int, data: Vec<u8>) {
        let mut st = lock(&self.st);
        st.finished = true;
        st.result = result;
        st.data = data;
        drop(st);
        self.cv.notify_all();
    }

    fn wait(&self) -> (c_int, Vec<u8>) {
        let mut st = lock(&self.st);
        while !st.finished {
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        (st.result, std::mem::take(&mut st.data))
    }
}

struct Op {
    kind: Kind,
    done: Arc<Done>,
}

// ---- Reductions ----

/// An element type NCCL reduces.
trait Elem: Copy {
    const SIZE: usize;
    fn get(b: &[u8]) -> Self;
    fn put(self, out: &mut Vec<u8>);
    fn combine(self, other: Self, op: c_int) -> Self;
    fn div(self, n: usize) -> Self;
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn get(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b.try_into().unwrap())
            }
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes())
            }
            fn combine(self, o: Self, op: c_int) -> Self {
                match op {
                    PROD => self.wrapping_mul(o),
                    MAX => self.max(o),
                    MIN => self.min(o),
                    _ => self.wrapping_add(o),
                }
            }
            fn div(self, n: usize) -> Self {
                self / (n as $t)
            }
        }
    )*};
}
int_elem!(i8, u8, i32, u32, i64, u64);

macro_rules! float_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn get(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b.try_into().unwrap())
            }
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes())
            }
            fn combine(self, o: Self, op: c_int) -> Self {
                match op {
                    PROD => self * o,
                    MAX => self.max(o),
                    MIN => self.min(o),
                    _ => self + o,
                }
            }
            fn div(self, n: usize) -> Self {
                self / n as $t
            }
        }
    )*};
}
float_elem!(f32, f64);

/// bfloat16: the high half of an f32.
#[derive(Clone, Copy)]
struct Bf16(f32);

impl Elem for Bf16 {
    const SIZE: usize = 2;
    fn get(b: &[u8]) -> Self {
        Bf16(f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16))
    }
    fn put(self, out: &mut Vec<u8>) {
        // Rounded to nearest even.
        let bits = self.0.to_bits();
        let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1));
        out.extend_from_slice(&((rounded >> 16) as u16).to_le_bytes())
    }
    fn combine(self, o: Self, op: c_int) -> Self {
        Bf16(self.0.combine(o.0, op))
    }
    fn div(self, n: usize) -> Self {
        Bf16(self.0 / n as f32)
    }
}

fn reduce_as<T: Elem>(all: &[Vec<u8>], op: c_int) -> Vec<u8> {
    let mut acc: Vec<T> = all[0].chunks_exact(T::SIZE).map(T::get).collect();
    for other in &all[1..] {
        for (a, c) in acc.iter_mut().zip(other.chunks_exact(T::SIZE)) {
            *a = a.combine(T::get(c), op);
        }
    }
    let mut out = Vec::with_capacity(all[0].len());
    for a in acc {
        if op == AVG { a.div(all.len()) } else { a }.put(&mut out);
    }
    out
}

/// The element-wise reduction of equally long contributions.
fn reduce(all: &[Vec<u8>], dt: c_int, op: c_int) -> Vec<u8> {
    match dt {
        INT8 => reduce_as::<i8>(all, op),
        UINT8 => reduce_as::<u8>(all, op),
        INT32 => reduce_as::<i32>(all, op),
        UINT32 => reduce_as::<u32>(all, op),
        INT64 => reduce_as::<i64>(all, op),
        UINT64 => reduce_as::<u64>(all, op),
        FLOAT32 => reduce_as::<f32>(all, op),
        FLOAT64 => reduce_as::<f64>(all, op),
        BFLOAT16 => reduce_as::<Bf16>(all, op),
        // float16: not reduced, rank 0's data.
        _ => all[0].clone(),
    }
}

// ---- Communicators ----

struct Comm {
    rank: usize,
    nranks: usize,
    nonce: u64,
    /// This rank's address as its peers reach it (for ncclCommSplit's new
    /// rank 0).
    ip: Ipv4Addr,
    /// Rank 0: the link to each rank (none for itself); others: to rank 0.
    links: Arc<Vec<Option<Mutex<TcpStream>>>>,
    inbox: Arc<Inbox>,
    tx: Mutex<Option<mpsc::Sender<Op>>>,
    progress: Mutex<Option<JoinHandle<()>>>,
    readers: Mutex<Vec<JoinHandle<()>>>,
    aborted: AtomicBool,
    splits: AtomicU64,
    last_error: Mutex<&'static CStr>,
}

/// Live communicators, by handle.
static COMMS: Mutex<Option<HashMap<usize, Arc<Comm>>>> = Mutex::new(None);
/// The last error of a call without a valid communicator.
static LAST_ERROR: Mutex<&'static CStr> = Mutex::new(c"");

/// `ncclGetLastError` hands out pointers that must stay valid: each
/// distinct message is kept for the process's life.
fn intern(msg: &str) -> &'static CStr {
    static SEEN: Mutex<Option<HashSet<&'static CStr>>> = Mutex::new(None);
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    let mut seen = lock(&SEEN);
    let set = seen.get_or_insert_with(HashSet::new);
    if let Some(s) = set.get(c.as_c_str()) {
        return s;
    }
    let leaked: &'static CStr = Box::leak(c.into_boxed_c_str());
    set.insert(leaked);
    leaked
}

fn set_error(comm: Option<&Comm>, msg: &str) {
    let m = intern(&format!("stall-nccl-stub: {msg}"));
    match comm {
        Some(c) => *lock(&c.last_error) = m,
        None => *lock(&LAST_ERROR) = m,
    }
}

fn comm(handle: ncclComm_t) -> Option<Arc<Comm>> {
    lock(&COMMS).as_ref().and_then(|m| m.get(&(handle as usize))).cloned()
}

fn register(c: &Arc<Comm>) -> ncclComm_t {
    let handle = Arc::as_ptr(c) as ncclComm_t;
    lock(&COMMS).get_or_insert_with(HashMap::new).insert(handle as usize, c.clone());
    handle
}

fn unregister(handle: ncclComm_t) -> Option<Arc<Comm>> {
    lock(&COMMS).as_mut().and_then(|m| m.remove(&(handle as usize)))
}

/// Connects the ranks of a communicator: rank 0 accepts the others on
/// `listener` (else on one bound to `root`), each other rank connects to
/// `root`. Returns once all are connected, as NCCL's init does.
fn init(
    rank: usize,
    nranks: usize,
    nonce: u64,
    root: SocketAddrV4,
    listener: Option<TcpListener>,
) -> Result<Arc<Comm>, String> {
    let hello = |r: usize| {
        let mut h = [0u8; 16];
        h[..8].copy_from_slice(&nonce.to_le_bytes());
        h[8..12].copy_from_slice(&(r as u32).to_le_bytes());
        h[12..16].copy_from_slice(&(nranks as u32).to_le_bytes());
        h
    };
    let mut links: Vec<Option<Mutex<TcpStream>>> = Vec::new();
    let mut ip = root.ip().to_owned();
    if nranks > 1 && rank == 0 {
        let listener = match listener {
            Some(l) => l,
            None => match lock(&LISTENERS).as_mut().and_then(|m| m.remove(&nonce)) {
                Some(l) => l,
                None => {
                    TcpListener::bind(root).map_err(|e| format!("rank 0 cannot listen on {root}: {e}"))?
                }
            },
        };
        let mut by_rank: Vec<Option<TcpStream>> = (0..nranks).map(|_| None).collect();
        let mut joined = 0;
        while joined < nranks - 1 {
            let (mut s, _) = listener.accept().map_err(|e| format!("rank 0 cannot accept: {e}"))?;
            let mut h = [0u8; 16];
            if s.read_exact(&mut h).is_err() {
                continue;
            }
            let r = u32::from_le_bytes(h[8..12].try_into().unwrap()) as usize;
            // A stray connection, or one for another communicator: dropped.
            if h != hello(r) || r == 0 || r >= nranks || by_rank[r].is_some() {
                continue;
            }
            let _ = s.set_nodelay(true);
            by_rank[r] = Some(s);
            joined += 1;
        }
        for s in by_rank.iter_mut().flatten() {
            s.write_all(&[1]).map_err(|e| format!("rank 0 cannot answer: {e}"))?;
        }
        links = by_rank.into_iter().map(|s| s.map(Mutex::new)).collect();
    } else if nranks > 1 {
        let deadline = Instant::now() + CONNECT_FOR;
        let mut s = loop {
            match TcpStream::connect(root) {
                Ok(s) => break s,
                Err(e) if Instant::now() > deadline => {
                    return Err(format!("cannot reach rank 0 at {root}: {e}"))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let _ = s.set_nodelay(true);
        let mut ack = [0u8; 1];
        s.write_all(&hello(rank))
            .and_then(|()| s.read_exact(&mut ack))
            .map_err(|e| format!("rank {rank}: rank 0 at {root} did not let us in: {e}"))?;
        if let Ok(std::net::SocketAddr::V4(local)) = s.local_addr() {
            ip = *local.ip();
        }
        links.push(Some(Mutex::new(s)));
    }
    let (tx, rx) = mpsc::channel();
    let c = Arc::new(Comm {
        rank,
        nranks,
        nonce,
        ip,
        links: Arc::new(links),
        inbox: Arc::new(Inbox {
            st: Mutex::new(InboxState { frames: HashMap::new(), broken: HashMap::new(), root: rank == 0 }),
            cv: Condvar::new(),
        }),
        tx: Mutex::new(Some(tx)),
        progress: Mutex::new(None),
        readers: Mutex::new(Vec::new()),
        aborted: AtomicBool::new(false),
        splits: AtomicU64::new(0),
        last_error: Mutex::new(c""),
    });
    for (i, link) in c.links.iter().enumerate() {
        let Some(link) = link else { continue };
        let s = lock(link).try_clone().map_err(|e| format!("cannot read a link: {e}"))?;
        let from = if rank == 0 { i as u32 } else { 0 };
        let (inbox, links) = (c.inbox.clone(), c.links.clone());
        let reader = std::thread::Builder::new()
            .name("ncclstub-link".into())
            .spawn(move || read_link(s, from, rank == 0, &inbox, &links))
            .map_err(|e| format!("cannot start a reader thread: {e}"))?;
        lock(&c.readers).push(reader);
    }
    let worker = c.clone();
    let progress = std::thread::Builder::new()
        .name("ncclstub-progress".into())
        .spawn(move || worker.run(rx))
        .map_err(|e| format!("cannot start the progress thread: {e}"))?;
    *lock(&c.progress) = Some(progress);
    Ok(c)
}

/// A link's reader: files frames in the inbox; rank 0 relays
/// point-to-point data meant for another rank.
fn read_link(mut s: TcpStream, from: u32, root: bool, inbox: &Inbox, links: &[Option<Mutex<TcpStream>>]) {
    loop {
        let (kind, peer, data) = match read_frame(&mut s) {
            Ok(f) => f,
            Err(e) => return inbox.fail(from, format!("the link to rank {from} failed: {e}")),
        };
        match (kind, root) {
            (P2P, true) if peer != 0 => {
                // A rank that is not there, or gone: the data is dropped.
                if let Some(Some(to)) = links.get(peer as usize) {
                    if let Err(e) = write_frame(to, P2P, from, &data) {
                        inbox.fail(peer, format!("cannot relay to rank {peer}: {e}"));
                    }
                }
            }
            (P2P, true) => inbox.push(P2P, from, data),
            (_, true) => inbox.push(kind, from, data),
            (_, false) => inbox.push(kind, peer, data),
        }
    }
}

/// `len` bytes at `addr`.
unsafe fn read_buf(addr: usize, len: usize) -> Vec<u8> {
    if len == 0 {
        return Vec::new();
    }
    // SAFETY: the caller passes a buffer of `len` readable bytes.
    unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec()
}

unsafe fn write_buf(addr: usize, data: &[u8]) {
    if !data.is_empty() {
        // SAFETY: the caller passes a buffer of `data.len()` writable bytes.
        unsafe { std::ptr::copy(data.as_ptr(), addr as *mut u8, data.len()) };
    }
}

impl Comm {
    fn link(&self, i: usize) -> Result<&Mutex<TcpStream>, String> {
        self.links.get(i).and_then(|l| l.as_ref()).ok_or_else(|| format!("no link to rank {i}"))
    }

    /// One collective through rank 0: every rank contributes `mine`;
    /// rank 0 turns all contributions (in rank order) into each rank's
    /// result with `combine`. Returns this rank's.
    fn exchange(
        &self,
        mine: Vec<u8>,
        combine: impl FnOnce(Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>, String>,
    ) -> Result<Vec<u8>, String> {
        if self.rank != 0 {
            write_frame(self.link(0)?, CONTRIB, self.rank as u32, &mine).map_err(|e| e.to_string())?;
            return self.inbox.take(RESULT, 0);
        }
        let mut all = vec![mine];
        for r in 1..self.nranks {
            all.push(self.inbox.take(CONTRIB, r as u32)?);
        }
        let mut outs = combine(all)?;
        for (r, out) in outs.iter().enumerate().skip(1) {
            write_frame(self.link(r)?, RESULT, 0, out).map_err(|e| e.to_string())?;
        }
        Ok(std::mem::take(&mut outs[0]))
    }

    /// Runs one operation; its result for a gather.
    fn execute(&self, kind: Kind, mine: Vec<u8>) -> Result<Vec<u8>, String> {
        let n = self.nranks;
        let same_len = |all: &[Vec<u8>]| {
            if all.iter().any(|a| a.len() != all[0].len()) {
                Err("the ranks' counts differ".to_string())
            } else {
                Ok(())
            }
        };
        match kind {
            Kind::AllReduce { send, recv, count, dt, op } => {
                let len = count * dtype_size(dt).unwrap_or(1);
                // SAFETY: checked at the call: the caller's buffers of `len`
                // bytes, valid until the stream passed the operation.
                let mine = unsafe { read_buf(send, len) };
                let out = self.exchange(mine, |all| {
                    same_len(&all)?;
                    Ok(vec![reduce(&all, dt, op); n])
                })?;
                // SAFETY: as above.
                unsafe { write_buf(recv, &out) };
            }
            Kind::Broadcast { send, recv, count, dt, root } => {
                let len = count * dtype_size(dt).unwrap_or(1);
                // SAFETY: as AllReduce's; only the root's send buffer is read.
                let mine = if self.rank == root { unsafe { read_buf(send, len) } } else { Vec::new() };
                let out = self.exchange(mine, |mut all| Ok(vec![std::mem::take(&mut all[root]); n]))?;
                // SAFETY: as AllReduce's.
                unsafe { write_buf(recv, &out) };
            }
            Kind::Reduce { send, recv, count, dt, op, root } => {
                let len = count * dtype_size(dt).unwrap_or(1);
                // SAFETY: as AllReduce's.
                let mine = unsafe { read_buf(send, len) };
                let out = self.exchange(mine, |all| {
                    same_len(&all)?;
                    let mut outs = vec![Vec::new(); n];
                    outs[root] = reduce(&all, dt, op);
                    Ok(outs)
                })?;
                if self.rank == root {
                    // SAFETY: as AllReduce's; only the root's is written.
                    unsafe { write_buf(recv, &out) };
                }
            }
            Kind::AllGather { send, recv, count, dt } => {
                let len = count * dtype_size(dt).unwrap_or(1);
                // SAFETY: as AllReduce's (recv holds nranks * count).
                let mine = unsafe { read_buf(send, len) };
                let out = self.exchange(mine, |all| {
                    same_len(&all)?;
                    Ok(vec![all.concat(); n])
                })?;
                // SAFETY: as above.
                unsafe { write_buf(recv, &out) };
            }
            Kind::ReduceScatter { send, recv, count, dt, op } => {
                let len = count * dtype_size(dt).unwrap_or(1);
                // SAFETY: as AllReduce's (send holds nranks * count).
                let mine = unsafe { read_buf(send, len * n) };
                let out = self.exchange(mine, |all| {
                    same_len(&all)?;
                    Ok(reduce(&all, dt, op).chunks(len.max(1)).map(|c| c.to_vec()).collect())
                })?;
                // SAFETY: as above.
                unsafe { write_buf(recv, &out[..len.min(out.len())]) };
            }
            Kind::Send { buf, count, dt, peer } => {
                let len = count * dtype_size(dt).unwrap_or(1);
                // SAFETY: as AllReduce's.
                let data = unsafe { read_buf(buf, len) };
                if peer == self.rank {
                    self.inbox.push(P2P, peer as u32, data);
                } else if self.rank == 0 {
                    write_frame(self.link(peer)?, P2P, 0, &data).map_err(|e| e.to_string())?;
                } else {
                    write_frame(self.link(0)?, P2P, peer as u32, &data).map_err(|e| e.to_string())?;
                }
            }
            Kind::Recv { buf, count, dt, peer } => {
                let len = count * dtype_size(dt).unwrap_or(1);
                let data = self.inbox.take(P2P, peer as u32)?;
                if data.len() != len {
                    return Err(format!("rank {peer} sent {} bytes, {len} expected", data.len()));
                }
                // SAFETY: as AllReduce's.
                unsafe { write_buf(buf, &data) };
            }
            Kind::Gather => return self.exchange(mine, |all| Ok(vec![all.concat(); n])),
        }
        Ok(Vec::new())
    }

    /// The progress thread: operations in the order they were issued, each
    /// once its stream reached it.
    fn run(self: Arc<Comm>, rx: mpsc::Receiver<Op>) {
        for op in rx {
            if !op.done.wait_gate(&self.aborted) {
                op.done.finish(INVALID_USAGE, Vec::new());
                continue;
            }
            let mine = std::mem::take(&mut lock(&op.done.st).data);
            match self.execute(op.kind, mine) {
                Ok(data) => op.done.finish(SUCCESS, data),
                Err(e) => {
                    set_error(Some(&*self), &e);
                    op.done.finish(
                        if self.aborted.load(SeqCst) { INVALID_USAGE } else { REMOTE_ERROR },
                        Vec::new(),
                    );
                }
            }
        }
    }

    fn shutdown_links(&self) {
        for l in self.links.iter().flatten() {
            let _ = lock(l).shutdown(Shutdown::Both);
        }
    }
}

// ---- Issuing operations ----

/// `cudaLaunchHostFunc(stream, fn, userData)`.
type LaunchHostFunc =
    unsafe extern "C" fn(cudaStream_t, Option<unsafe extern "C" fn(*mut c_void)>, *mut c_void) -> c_int;

/// A `cudaLaunchHostFunc` the unit tests set (the test binary's symbols
/// are not visible to dlsym); 0: none.
static HOST_FUNC_FOR_TESTS: AtomicUsize = AtomicUsize::new(0);

/// The process's `cudaLaunchHostFunc`, looked up until found: libcudart
/// may be loaded after this library.
fn launch_host_func() -> Option<LaunchHostFunc> {
    static FOUND: AtomicUsize = AtomicUsize::new(0);
    let mut p = HOST_FUNC_FOR_TESTS.load(SeqCst);
    if p == 0 {
        p = FOUND.load(SeqCst);
    }
    if p == 0 {
        // SAFETY: a NUL-terminated name; RTLD_DEFAULT searches the global scope.
        p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"cudaLaunchHostFunc".as_ptr()) } as usize;
        FOUND.store(p, SeqCst);
    }
    // SAFETY: a non-null address of a function with CUDA's signature of
    // cudaLaunchHostFunc.
    (p != 0).then(|| unsafe { std::mem::transmute::<usize, LaunchHostFunc>(p) })
}

/// The host function enqueued on the caller's stream: lets the exchange
/// start, and holds the stream until it is done.
unsafe extern "C" fn on_stream(data: *mut c_void) {
    // SAFETY: `issue` leaked one reference for this one call.
    let done = unsafe { Arc::from_raw(data as *const Done) };
    done.open();
    done.wait();
}

fn issue(c: &Comm, kind: Kind, stream: cudaStream_t) -> c_int {
    let host = launch_host_func();
    let done = Done::new(host.is_none(), Vec::new());
    let Some(tx) = lock(&c.tx).clone() else { return INVALID_USAGE };
    if tx.send(Op { kind, done: done.clone() }).is_err() {
        return INVALID_USAGE;
    }
    if let Some(launch) = host {
        let data = Arc::into_raw(done.clone()) as *mut c_void;
        // SAFETY: the real signature; `on_stream` takes the reference back.
        if unsafe { launch(stream, Some(on_stream), data) } == 0 {
            return SUCCESS;
        }
        // Not enqueued: the reference comes back here, the call blocks.
        // SAFETY: leaked just above, not passed on.
        drop(unsafe { Arc::from_raw(data as *const Done) });
        done.open();
    }
    done.wait().0
}

/// A call queued in a group: its communicator, what, and on which stream.
type Queued = (Arc<Comm>, Kind, usize);

thread_local! {
    /// ncclGroupStart's depth and the calls queued meanwhile.
    static GROUP: RefCell<(u32, Vec<Queued>)> = const { RefCell::new((0, Vec::new())) };
}

/// Issues an operation now, or at the group's end.
fn enqueue(handle: ncclComm_t, kind: Kind, stream: cudaStream_t) -> c_int {
    let Some(c) = comm(handle) else {
        set_error(None, "not a communicator");
        return INVALID_ARGUMENT;
    };
    let queued = GROUP.with_borrow_mut(|g| {
        if g.0 > 0 {
            g.1.push((c.clone(), kind, stream as usize));
            true
        } else {
            false
        }
    });
    if queued {
        SUCCESS
    } else {
        issue(&c, kind, stream)
    }
}

/// Checks a buffer argument: its byte length.
fn checked(
    c: ncclComm_t,
    bufs: &[*const c_void],
    count: usize,
    dt: c_int,
    op: Option<c_int>,
) -> Result<usize, c_int> {
    let Some(size) = dtype_size(dt) else {
        set_error(comm(c).as_deref(), &format!("invalid data type {dt}"));
        return Err(INVALID_ARGUMENT);
    };
    if op.is_some_and(|op| !(SUM..=AVG).contains(&op)) {
        set_error(comm(c).as_deref(), &format!("invalid reduction {op:?}"));
        return Err(INVALID_ARGUMENT);
    }
    let Some(len) = count.checked_mul(size) else { return Err(INVALID_ARGUMENT) };
    if len > 0 && bufs.iter().any(|b| b.is_null()) {
        set_error(comm(c).as_deref(), "a NULL buffer");
        return Err(INVALID_ARGUMENT);
    }
    Ok(len)
}

/// A rank argument (root or peer) in range for the communicator.
fn rank_ok(c: ncclComm_t, r: c_int) -> bool {
    comm(c).is_some_and(|c| r >= 0 && (r as usize) < c.nranks)
}

fn init_rank(out: *mut ncclComm_t, nranks: c_int, id: &ncclUniqueId, rank: c_int) -> c_int {
    if out.is_null() || nranks < 1 || rank < 0 || rank >= nranks {
        set_error(None, "invalid arguments to init");
        return INVALID_ARGUMENT;
    }
    let Some(id) = Id::decode(id) else {
        set_error(None, "not a unique id of this library");
        return INVALID_ARGUMENT;
    };
    match init(rank as usize, nranks as usize, id.nonce, id.root, None) {
        Ok(c) => {
            // SAFETY: checked non-null; the caller passes a writable ncclComm_t.
            unsafe { *out = register(&c) };
            SUCCESS
        }
        Err(e) => {
            set_error(None, &e);
            SYSTEM_ERROR
        }
    }
}

// ---- Exported API ----
//
// No exported function calls another: a uprobe on one symbol fires for the
// calls to that symbol only.

#[no_mangle]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> ncclResult_t {
    count!("ncclGetVersion");
    if version.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: checked non-null; the caller passes a writable int.
    unsafe { *version = VERSION_CODE };
    SUCCESS
}

/// Binds rank 0's listener now, so that the other ranks can connect as
/// soon as they have the id.
#[no_mangle]
pub unsafe extern "C" fn ncclGetUniqueId(unique_id: *mut ncclUniqueId) -> ncclResult_t {
    count!("ncclGetUniqueId");
    if unique_id.is_null() {
        return INVALID_ARGUMENT;
    }
    let ip = advertised_ip();
    let bind_ip = if ip.is_loopback() { ip } else { Ipv4Addr::UNSPECIFIED };
    let listener = match TcpListener::bind((bind_ip, 0)) {
        Ok(l) => l,
        Err(e) => {
            set_error(None, &format!("cannot listen: {e}"));
            return SYSTEM_ERROR;
        }
    };
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    let nonce = random_u64();
    lock(&LISTENERS).get_or_insert_with(HashMap::new).insert(nonce, listener);
    // SAFETY: checked non-null; the caller passes a writable ncclUniqueId.
    unsafe { *unique_id = Id { root: SocketAddrV4::new(ip, port), nonce }.encode() };
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRank(
    comm: *mut ncclComm_t,
    nranks: c_int,
    comm_id: ncclUniqueId,
    rank: c_int,
) -> ncclResult_t {
    count!("ncclCommInitRank");
    init_rank(comm, nranks, &comm_id, rank)
}

/// As ncclCommInitRank; the configuration is ignored (always blocking).
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankConfig(
    comm: *mut ncclComm_t,
    nranks: c_int,
    comm_id: ncclUniqueId,
    rank: c_int,
    _config: *mut ncclConfig_t,
) -> ncclResult_t {
    count!("ncclCommInitRankConfig");
    init_rank(comm, nranks, &comm_id, rank)
}

/// Collective over `comm`'s ranks: those of one color form a new
/// communicator, ranked by key (ties by rank in `comm`).
#[no_mangle]
pub unsafe extern "C" fn ncclCommSplit(
    comm_handle: ncclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut ncclComm_t,
    _config: *mut ncclConfig_t,
) -> ncclResult_t {
    count!("ncclCommSplit");
    let Some(parent) = comm(comm_handle) else { return INVALID_ARGUMENT };
    if newcomm.is_null() || (color < 0 && color != SPLIT_NOCOLOR) {
        return INVALID_ARGUMENT;
    }
    // Every rank listens, in case it becomes the new rank 0.
    let listener =
        match TcpListener::bind((if parent.ip.is_loopback() { parent.ip } else { Ipv4Addr::UNSPECIFIED }, 0))
        {
            Ok(l) => l,
            Err(e) => {
                set_error(Some(&parent), &format!("cannot listen: {e}"));
                return SYSTEM_ERROR;
            }
        };
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    let mut mine = Vec::with_capacity(16);
    mine.extend_from_slice(&color.to_le_bytes());
    mine.extend_from_slice(&key.to_le_bytes());
    mine.extend_from_slice(&parent.ip.octets());
    mine.extend_from_slice(&(port as u32).to_le_bytes());
    // In order with the collectives issued before it, blocking as NCCL's.
    let done = Done::new(true, mine);
    let Some(tx) = lock(&parent.tx).clone() else { return INVALID_USAGE };
    if tx.send(Op { kind: Kind::Gather, done: done.clone() }).is_err() {
        return INVALID_USAGE;
    }
    let (rc, table) = done.wait();
    if rc != SUCCESS {
        return rc;
    }
    let seq = parent.splits.fetch_add(1, SeqCst);
    if color == SPLIT_NOCOLOR {
        // SAFETY: checked non-null; the caller passes a writable ncclComm_t.
        unsafe { *newcomm = std::ptr::null_mut() };
        return SUCCESS;
    }
    let field = |r: usize, i: usize| {
        i32::from_le_bytes(table[r * 16 + i * 4..r * 16 + i * 4 + 4].try_into().unwrap())
    };
    let mut members: Vec<usize> = (0..parent.nranks).filter(|&r| field(r, 0) == color).collect();
    members.sort_by_key(|&r| (field(r, 1), r));
    let new_rank = members.iter().position(|&r| r == parent.rank).expect("this rank has its color");
    let root = members[0];
    let ip: [u8; 4] = table[root * 16 + 8..root * 16 + 12].try_into().unwrap();
    let root_addr = SocketAddrV4::new(Ipv4Addr::from(ip), field(root, 3) as u16);
    // The same on every member: the parent's nonce, which split, which color.
    let nonce = parent.nonce ^ (seq + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (color as u64).rotate_left(32);
    let own = (new_rank == 0).then_some(listener);
    match init(new_rank, members.len(), nonce, root_addr, own) {
        Ok(c) => {
            // SAFETY: checked non-null; the caller passes a writable ncclComm_t.
            unsafe { *newcomm = register(&c) };
            SUCCESS
        }
        Err(e) => {
            set_error(Some(&parent), &e);
            SYSTEM_ERROR
        }
    }
}

/// Waits for the operations issued so far, then closes the links.
#[no_mangle]
pub extern "C" fn ncclCommDestroy(comm_handle: ncclComm_t) -> ncclResult_t {
    count!("ncclCommDestroy");
    let Some(c) = unregister(comm_handle) else { return INVALID_ARGUMENT };
    drop(lock(&c.tx).take());
    if let Some(p) = lock(&c.progress).take() {
        let _ = p.join();
    }
    if c.rank == 0 {
        // The hub relays the other ranks' point-to-point data: a peer's
        // send to a third rank may still be on its way through here when
        // rank 0 is done with its own operations. It stays until each
        // peer closed its link (destroyed its communicator, or exited),
        // for a while at most (a peer that never leaves).
        let deadline = Instant::now() + HUB_LINGER;
        while Instant::now() < deadline && !lock(&c.readers).iter().all(JoinHandle::is_finished) {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    c.shutdown_links();
    for r in lock(&c.readers).drain(..) {
        let _ = r.join();
    }
    SUCCESS
}

/// How long rank 0's `ncclCommDestroy` waits for its peers to leave.
const HUB_LINGER: Duration = Duration::from_secs(30);

/// Closes the links at once: pending operations fail.
#[no_mangle]
pub extern "C" fn ncclCommAbort(comm_handle: ncclComm_t) -> ncclResult_t {
    count!("ncclCommAbort");
    let Some(c) = unregister(comm_handle) else { return INVALID_ARGUMENT };
    c.aborted.store(true, SeqCst);
    drop(lock(&c.tx).take());
    c.shutdown_links();
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommCount(comm_handle: ncclComm_t, count: *mut c_int) -> ncclResult_t {
    count!("ncclCommCount");
    match comm(comm_handle) {
        Some(c) if !count.is_null() => {
            // SAFETY: checked non-null; the caller passes a writable int.
            unsafe { *count = c.nranks as c_int };
            SUCCESS
        }
        _ => INVALID_ARGUMENT,
    }
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommUserRank(comm_handle: ncclComm_t, rank: *mut c_int) -> ncclResult_t {
    count!("ncclCommUserRank");
    match comm(comm_handle) {
        Some(c) if !rank.is_null() => {
            // SAFETY: checked non-null; the caller passes a writable int.
            unsafe { *rank = c.rank as c_int };
            SUCCESS
        }
        _ => INVALID_ARGUMENT,
    }
}

/// Device 0, the stand-in CUDA's only one.
#[no_mangle]
pub unsafe extern "C" fn ncclCommCuDevice(comm_handle: ncclComm_t, device: *mut c_int) -> ncclResult_t {
    count!("ncclCommCuDevice");
    match comm(comm_handle) {
        Some(_) if !device.is_null() => {
            // SAFETY: checked non-null; the caller passes a writable int.
            unsafe { *device = 0 };
            SUCCESS
        }
        _ => INVALID_ARGUMENT,
    }
}

#[no_mangle]
pub extern "C" fn ncclGetErrorString(result: ncclResult_t) -> *const c_char {
    count!("ncclGetErrorString");
    let s: &'static CStr = match result {
        SUCCESS => c"no error",
        1 => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        SYSTEM_ERROR => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        INTERNAL_ERROR => c"internal error - please report this issue to the NCCL developers",
        INVALID_ARGUMENT => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        INVALID_USAGE => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        REMOTE_ERROR => c"remote process exited or there was a network error",
        7 => c"NCCL operation in progress",
        _ => c"unknown result code",
    };
    s.as_ptr()
}

#[no_mangle]
pub extern "C" fn ncclGetLastError(comm_handle: ncclComm_t) -> *const c_char {
    count!("ncclGetLastError");
    match comm(comm_handle) {
        Some(c) => lock(&c.last_error).as_ptr(),
        None => lock(&LAST_ERROR).as_ptr(),
    }
}

#[no_mangle]
pub extern "C" fn ncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    op: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    count!("ncclAllReduce");
    if let Err(e) = checked(comm, &[sendbuff, recvbuff], count, datatype, Some(op)) {
        return e;
    }
    let kind = Kind::AllReduce { send: sendbuff as usize, recv: recvbuff as usize, count, dt: datatype, op };
    enqueue(comm, kind, stream)
}

#[no_mangle]
pub extern "C" fn ncclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    count!("ncclBroadcast");
    if let Err(e) = checked(comm, &[recvbuff], count, datatype, None) {
        return e;
    }
    if !rank_ok(comm, root) {
        return INVALID_ARGUMENT;
    }
    let kind = Kind::Broadcast {
        send: sendbuff as usize,
        recv: recvbuff as usize,
        count,
        dt: datatype,
        root: root as usize,
    };
    enqueue(comm, kind, stream)
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn ncclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    op: c_int,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    count!("ncclReduce");
    if let Err(e) = checked(comm, &[sendbuff], count, datatype, Some(op)) {
        return e;
    }
    if !rank_ok(comm, root) {
        return INVALID_ARGUMENT;
    }
    let kind = Kind::Reduce {
        send: sendbuff as usize,
        recv: recvbuff as usize,
        count,
        dt: datatype,
        op,
        root: root as usize,
    };
    enqueue(comm, kind, stream)
}

#[no_mangle]
pub extern "C" fn ncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    count!("ncclAllGather");
    if let Err(e) = checked(comm, &[sendbuff, recvbuff], sendcount, datatype, None) {
        return e;
    }
    let kind =
        Kind::AllGather { send: sendbuff as usize, recv: recvbuff as usize, count: sendcount, dt: datatype };
    enqueue(comm, kind, stream)
}

#[no_mangle]
pub extern "C" fn ncclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: c_int,
    op: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    count!("ncclReduceScatter");
    if let Err(e) = checked(comm, &[sendbuff, recvbuff], recvcount, datatype, Some(op)) {
        return e;
    }
    let kind = Kind::ReduceScatter {
        send: sendbuff as usize,
        recv: recvbuff as usize,
        count: recvcount,
        dt: datatype,
        op,
    };
    enqueue(comm, kind, stream)
}

#[no_mangle]
pub extern "C" fn ncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: c_int,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    count!("ncclSend");
    if let Err(e) = checked(comm, &[sendbuff], count, datatype, None) {
        return e;
    }
    if !rank_ok(comm, peer) {
        return INVALID_ARGUMENT;
    }
    enqueue(comm, Kind::Send { buf: sendbuff as usize, count, dt: datatype, peer: peer as usize }, stream)
}

#[no_mangle]
pub extern "C" fn ncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    count!("ncclRecv");
    if let Err(e) = checked(comm, &[recvbuff], count, datatype, None) {
        return e;
    }
    if !rank_ok(comm, peer) {
        return INVALID_ARGUMENT;
    }
    enqueue(comm, Kind::Recv { buf: recvbuff as usize, count, dt: datatype, peer: peer as usize }, stream)
}

#[no_mangle]
pub extern "C" fn ncclGroupStart() -> ncclResult_t {
    count!("ncclGroupStart");
    GROUP.with_borrow_mut(|g| g.0 += 1);
    SUCCESS
}

/// The outermost end issues the queued calls, in the order they were made.
#[no_mangle]
pub extern "C" fn ncclGroupEnd() -> ncclResult_t {
    count!("ncclGroupEnd");
    let queued = GROUP.with_borrow_mut(|g| {
        if g.0 == 0 {
            return Err(INVALID_USAGE);
        }
        g.0 -= 1;
        Ok(if g.0 == 0 { std::mem::take(&mut g.1) } else { Vec::new() })
    });
    let queued = match queued {
        Ok(q) => q,
        Err(e) => return e,
    };
    // Sends first: a send never waits (the peer's link reader keeps its
    // data), so a group's receives cannot hold up the sends they wait for,
    // whatever order the calls came in (NCCL runs a group as one kernel).
    let (sends, others): (Vec<_>, Vec<_>) =
        queued.into_iter().partition(|(_, k, _)| matches!(k, Kind::Send { .. }));
    let mut rc = SUCCESS;
    for (c, kind, stream) in sends.into_iter().chain(others) {
        let r = issue(&c, kind, stream as cudaStream_t);
        if rc == SUCCESS {
            rc = r;
        }
    }
    rc
}

// ---- Exported knob (the stub's own; a real program never calls it) ----

/// How many times the exported function `name` (a C string) was called,
/// this call included for `stallNcclStubCallCount` itself; `u64::MAX` for
/// a name this library does not export. Not `stallStubCallCount`: the
/// stand-in CUDA exports that one, into the same global scope.
#[no_mangle]
pub unsafe extern "C" fn stallNcclStubCallCount(name: *const c_char) -> u64 {
    count!("stallNcclStubCallCount");
    // SAFETY: as the caller promises, null or a NUL-terminated string.
    unsafe { CALLS.of_c_name(&EXPORTED, name) }
}

/// For the unit tests: the `cudaLaunchHostFunc` to couple to (0: dlsym's).
#[doc(hidden)]
pub fn set_launch_host_func_for_tests(f: usize) {
    HOST_FUNC_FOR_TESTS.store(f, SeqCst);
}

#[cfg(test)]
mod tests;
