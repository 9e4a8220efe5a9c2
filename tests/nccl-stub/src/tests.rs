//! The exported functions, called directly: ranks are threads of this
//! process over loopback, their streams the stand-in CUDA's, to which the
//! collectives couple through its `cudaLaunchHostFunc`.

use super::*;
use stall_cuda_stub as cuda;
use stall_stub_calls::{assert_distinct, assert_library_distinct};
use std::ptr::null_mut;

/// Couples collectives to the stand-in CUDA's streams (dlsym cannot see
/// the test binary's own symbols).
fn couple() {
    set_launch_host_func_for_tests(cuda::cudaLaunchHostFunc as *const () as usize);
}

fn new_stream() -> cudaStream_t {
    let mut s = null_mut();
    // SAFETY: a valid out pointer.
    assert_eq!(unsafe { cuda::cudaStreamCreate(&mut s) }, 0);
    s
}

fn new_id() -> ncclUniqueId {
    let mut id = ncclUniqueId { internal: [0; 128] };
    // SAFETY: a valid out pointer.
    assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, SUCCESS);
    id
}

/// Runs `body(rank, comm, stream)` on `n` ranks, one thread each, then
/// synchronizes the stream and destroys the communicator.
fn ranks<T: Send>(n: usize, body: impl Fn(usize, ncclComm_t, cudaStream_t) -> T + Sync) -> Vec<T> {
    couple();
    let id = new_id();
    std::thread::scope(|sc| {
        let threads: Vec<_> = (0..n)
            .map(|r| {
                let body = &body;
                sc.spawn(move || {
                    let mut c = null_mut();
                    // SAFETY: a valid out pointer; the id by value.
                    assert_eq!(unsafe { ncclCommInitRank(&mut c, n as c_int, id, r as c_int) }, SUCCESS);
                    let s = new_stream();
                    let out = body(r, c, s);
                    assert_eq!(cuda::cudaStreamSynchronize(s), 0);
                    assert_eq!(cuda::cudaStreamDestroy(s), 0);
                    assert_eq!(ncclCommDestroy(c), SUCCESS);
                    out
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

fn ptr<T>(v: &[T]) -> *const c_void {
    v.as_ptr().cast()
}

fn mut_ptr<T>(v: &mut [T]) -> *mut c_void {
    v.as_mut_ptr().cast()
}

#[test]
fn all_reduce_reduces_every_type_and_op() {
    let out = ranks(4, |r, c, s| {
        let x = r as f32 + 1.0;
        let send: Vec<f32> = (0..1000).map(|i| x * i as f32).collect();
        let mut sum = vec![0f32; 1000];
        assert_eq!(ncclAllReduce(ptr(&send), mut_ptr(&mut sum), 1000, FLOAT32, SUM, c, s), SUCCESS);
        let send64 = [r as i64 - 2, 7 * r as i64];
        let mut max = [0i64; 2];
        assert_eq!(ncclAllReduce(ptr(&send64), mut_ptr(&mut max), 2, INT64, MAX, c, s), SUCCESS);
        let sendd = [r as f64];
        let mut avg = [0f64];
        assert_eq!(ncclAllReduce(ptr(&sendd), mut_ptr(&mut avg), 1, FLOAT64, AVG, c, s), SUCCESS);
        let send32 = [r as i32 + 1];
        let mut prod = [0i32];
        assert_eq!(ncclAllReduce(ptr(&send32), mut_ptr(&mut prod), 1, INT32, PROD, c, s), SUCCESS);
        // In place.
        let mut min = [10u8 + r as u8, 3];
        assert_eq!(ncclAllReduce(ptr(&min), mut_ptr(&mut min), 2, UINT8, MIN, c, s), SUCCESS);
        let bf = [0x3f80u16]; // 1.0
        let mut bfsum = [0u16];
        assert_eq!(ncclAllReduce(ptr(&bf), mut_ptr(&mut bfsum), 1, BFLOAT16, SUM, c, s), SUCCESS);
        assert_eq!(cuda::cudaStreamSynchronize(s), 0);
        (sum, max, avg, prod, min, bfsum)
    });
    for (sum, max, avg, prod, min, bfsum) in out {
        assert!(sum.iter().enumerate().all(|(i, v)| *v == 10.0 * i as f32));
        assert_eq!(max, [1, 21]);
        assert_eq!(avg, [1.5]);
        assert_eq!(prod, [24]);
        assert_eq!(min, [10, 3]);
        assert_eq!(bfsum, [0x4080]); // 4.0
    }
}

#[test]
fn collectives_return_at_once_and_complete_in_order() {
    const STEPS: usize = 200;
    let out = ranks(3, |r, c, s| {
        let sends: Vec<[i64; 1]> = (0..STEPS).map(|i| [(i * (r + 1)) as i64]).collect();
        let mut recvs = vec![[0i64; 1]; STEPS];
        let t = Instant::now();
        for (send, recv) in sends.iter().zip(recvs.iter_mut()) {
            assert_eq!(ncclAllReduce(ptr(send), mut_ptr(recv), 1, INT64, SUM, c, s), SUCCESS);
        }
        let issued = t.elapsed();
        assert_eq!(cuda::cudaStreamSynchronize(s), 0);
        (issued, recvs)
    });
    for (issued, recvs) in out {
        // Enqueued only: no call waited for the others' ranks.
        assert!(issued < Duration::from_millis(200), "{issued:?}");
        assert!(recvs.iter().enumerate().all(|(i, v)| v[0] == 6 * i as i64));
    }
}

#[test]
fn broadcast_reduce_allgather_reducescatter() {
    let out = ranks(3, |r, c, s| {
        let mine = [r as i32 * 10, r as i32 * 10 + 1];
        let mut bcast = [0i32; 2];
        assert_eq!(ncclBroadcast(ptr(&mine), mut_ptr(&mut bcast), 2, INT32, 1, c, s), SUCCESS);
        let mut reduced = [-1i32; 2];
        assert_eq!(ncclReduce(ptr(&mine), mut_ptr(&mut reduced), 2, INT32, SUM, 2, c, s), SUCCESS);
        let mut gathered = [0i32; 6];
        assert_eq!(ncclAllGather(ptr(&mine), mut_ptr(&mut gathered), 2, INT32, c, s), SUCCESS);
        let big: Vec<f64> = (0..6).map(|i| (i + r) as f64).collect();
        let mut scattered = [0f64; 2];
        assert_eq!(ncclReduceScatter(ptr(&big), mut_ptr(&mut scattered), 2, FLOAT64, SUM, c, s), SUCCESS);
        assert_eq!(cuda::cudaStreamSynchronize(s), 0);
        (r, bcast, reduced, gathered, scattered)
    });
    for (r, bcast, reduced, gathered, scattered) in out {
        assert_eq!(bcast, [10, 11]);
        assert_eq!(reduced, if r == 2 { [30, 33] } else { [-1, -1] });
        assert_eq!(gathered, [0, 1, 10, 11, 20, 21]);
        // Sum over ranks of i + r, for i = 2r' and 2r' + 1.
        let i = 2.0 * r as f64;
        assert_eq!(scattered, [3.0 * i + 3.0, 3.0 * i + 6.0]);
    }
}

#[test]
fn send_recv_in_a_ring_and_to_rank_zero() {
    let n = 4;
    let out = ranks(n, |r, c, s| {
        let mine = [r as u32 + 100; 3];
        let mut from_left = [0u32; 3];
        let (right, left) = ((r + 1) % n, (r + n - 1) % n);
        assert_eq!(ncclGroupStart(), SUCCESS);
        // Receive first: in a group the order cannot deadlock.
        assert_eq!(ncclRecv(mut_ptr(&mut from_left), 3, UINT32, left as c_int, c, s), SUCCESS);
        assert_eq!(ncclSend(ptr(&mine), 3, UINT32, right as c_int, c, s), SUCCESS);
        assert_eq!(ncclGroupEnd(), SUCCESS);
        // Not grouped: rank 3 to rank 0, and rank 0 to itself in a group.
        let mut at_zero = [0u32; 3];
        let mut to_self = [0u32; 3];
        if r == 3 {
            assert_eq!(ncclSend(ptr(&mine), 3, UINT32, 0, c, s), SUCCESS);
        } else if r == 0 {
            assert_eq!(ncclRecv(mut_ptr(&mut at_zero), 3, UINT32, 3, c, s), SUCCESS);
            assert_eq!(ncclGroupStart(), SUCCESS);
            assert_eq!(ncclSend(ptr(&mine), 3, UINT32, 0, c, s), SUCCESS);
            assert_eq!(ncclRecv(mut_ptr(&mut to_self), 3, UINT32, 0, c, s), SUCCESS);
            assert_eq!(ncclGroupEnd(), SUCCESS);
        }
        assert_eq!(cuda::cudaStreamSynchronize(s), 0);
        (r, from_left, at_zero, to_self)
    });
    for (r, from_left, at_zero, to_self) in out {
        assert_eq!(from_left, [(r + n - 1) as u32 % n as u32 + 100; 3]);
        if r == 0 {
            assert_eq!(at_zero, [103; 3]);
            assert_eq!(to_self, [100; 3]);
        }
    }
}

/// Rank 0 relays the others' point-to-point data: done with its own work
/// at once, it stays until they leave, so a send from rank 1 to rank 2
/// made after that still arrives.
#[test]
fn the_hub_relays_until_the_others_leave() {
    let out = ranks(3, |r, c, s| {
        let mine = [7u32; 2];
        let mut got = [0u32; 2];
        if r == 1 {
            std::thread::sleep(Duration::from_millis(100));
            assert_eq!(ncclSend(ptr(&mine), 2, UINT32, 2, c, s), SUCCESS);
        } else if r == 2 {
            assert_eq!(ncclRecv(mut_ptr(&mut got), 2, UINT32, 1, c, s), SUCCESS);
        }
        assert_eq!(cuda::cudaStreamSynchronize(s), 0);
        (r, got)
    });
    assert_eq!(out[2], (2, [7, 7]));
}

#[test]
fn split_ranks_by_key_within_a_color() {
    let out = ranks(4, |r, c, s| {
        // Colors: 0 for ranks 0 and 2, 1 for rank 1, none for rank 3; keys
        // reverse the order.
        let color = [0, 1, 0, SPLIT_NOCOLOR][r];
        let mut sub = null_mut();
        // SAFETY: a valid out pointer; no config.
        assert_eq!(unsafe { ncclCommSplit(c, color, -(r as c_int), &mut sub, null_mut()) }, SUCCESS);
        if color == SPLIT_NOCOLOR {
            assert!(sub.is_null());
            return (r, -1, -1, 0);
        }
        let (mut n, mut me) = (0, 0);
        // SAFETY: valid out pointers.
        unsafe {
            assert_eq!(ncclCommCount(sub, &mut n), SUCCESS);
            assert_eq!(ncclCommUserRank(sub, &mut me), SUCCESS);
        }
        let send = [r as i32];
        let mut sum = [0i32];
        assert_eq!(ncclAllReduce(ptr(&send), mut_ptr(&mut sum), 1, INT32, SUM, sub, s), SUCCESS);
        assert_eq!(cuda::cudaStreamSynchronize(s), 0);
        assert_eq!(ncclCommDestroy(sub), SUCCESS);
        (r, n, me, sum[0])
    });
    assert_eq!(out, [(0, 2, 1, 2), (1, 1, 0, 1), (2, 2, 0, 2), (3, -1, -1, 0)]);
}

#[test]
fn a_late_rank_holds_the_others_streams() {
    const LATE: Duration = Duration::from_millis(150);
    let out = ranks(3, |r, c, s| {
        let send = [1f32; 16];
        let mut recv = [0f32; 16];
        // A warm-up collective: all ranks are in step after it.
        assert_eq!(ncclAllReduce(ptr(&send), mut_ptr(&mut recv), 16, FLOAT32, SUM, c, s), SUCCESS);
        assert_eq!(cuda::cudaStreamSynchronize(s), 0);
        if r == 2 {
            std::thread::sleep(LATE);
        }
        let t = Instant::now();
        assert_eq!(ncclAllReduce(ptr(&send), mut_ptr(&mut recv), 16, FLOAT32, SUM, c, s), SUCCESS);
        let call = t.elapsed();
        assert_eq!(cuda::cudaStreamSynchronize(s), 0);
        (r, call, t.elapsed(), recv[0])
    });
    for (r, call, sync, v) in out {
        assert_eq!(v, 3.0);
        assert!(call < Duration::from_millis(20), "rank {r}: the call took {call:?}");
        if r == 2 {
            assert!(sync < Duration::from_millis(100), "the late rank waited {sync:?}");
        } else {
            assert!(sync >= LATE - Duration::from_millis(30), "rank {r} waited only {sync:?}");
        }
    }
}

#[test]
fn bad_arguments_are_refused() {
    couple();
    let x = [0f32; 4];
    let mut y = [0f32; 4];
    assert_eq!(
        ncclAllReduce(ptr(&x), mut_ptr(&mut y), 4, FLOAT32, SUM, null_mut(), null_mut()),
        INVALID_ARGUMENT
    );
    assert_eq!(ncclAllReduce(ptr(&x), mut_ptr(&mut y), 4, 42, SUM, null_mut(), null_mut()), INVALID_ARGUMENT);
    assert_eq!(ncclGroupEnd(), INVALID_USAGE);
    assert_eq!(ncclCommDestroy(null_mut()), INVALID_ARGUMENT);
    let id = ncclUniqueId { internal: [0; 128] };
    let mut c = null_mut();
    // SAFETY: valid pointers; the id is not one of ours.
    unsafe {
        assert_eq!(ncclCommInitRank(&mut c, 2, id, 0), INVALID_ARGUMENT);
        assert_eq!(ncclCommInitRank(&mut c, 2, new_id(), 2), INVALID_ARGUMENT);
    }
    // SAFETY: NCCL's strings are static and NUL-terminated.
    let last = unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) };
    assert!(last.to_str().unwrap().starts_with("stall-nccl-stub: "), "{last:?}");
    // SAFETY: as above.
    let s = unsafe { CStr::from_ptr(ncclGetErrorString(INVALID_ARGUMENT)) };
    assert!(s.to_str().unwrap().starts_with("invalid argument"));
    let mut v = 0;
    // SAFETY: a valid out pointer.
    assert_eq!(unsafe { ncclGetVersion(&mut v) }, SUCCESS);
    assert_eq!(v, VERSION_CODE);
}

#[test]
fn one_rank_alone() {
    let out = ranks(1, |_, c, s| {
        let mut d = -1;
        // SAFETY: a valid out pointer.
        assert_eq!(unsafe { ncclCommCuDevice(c, &mut d) }, SUCCESS);
        let x = [5i64];
        let mut y = [0i64];
        assert_eq!(ncclAllReduce(ptr(&x), mut_ptr(&mut y), 1, INT64, SUM, c, s), SUCCESS);
        assert_eq!(cuda::cudaStreamSynchronize(s), 0);
        (d, y[0])
    });
    assert_eq!(out, [(0, 5)]);
}

#[test]
fn c_layouts_match_nccl() {
    assert_eq!(std::mem::size_of::<ncclUniqueId>(), 128);
    assert_eq!(EXPORTED.len(), 22);
}

/// Every exported function, as the address a uprobe would go on.
fn exported_addresses() -> Vec<(&'static str, usize)> {
    let addrs = [
        ncclGetVersion as *const () as usize,
        ncclGetUniqueId as *const () as usize,
        ncclCommInitRank as *const () as usize,
        ncclCommInitRankConfig as *const () as usize,
        ncclCommSplit as *const () as usize,
        ncclCommDestroy as *const () as usize,
        ncclCommAbort as *const () as usize,
        ncclCommCount as *const () as usize,
        ncclCommUserRank as *const () as usize,
        ncclCommCuDevice as *const () as usize,
        ncclGetErrorString as *const () as usize,
        ncclGetLastError as *const () as usize,
        ncclAllReduce as *const () as usize,
        ncclBroadcast as *const () as usize,
        ncclReduce as *const () as usize,
        ncclAllGather as *const () as usize,
        ncclReduceScatter as *const () as usize,
        ncclSend as *const () as usize,
        ncclRecv as *const () as usize,
        ncclGroupStart as *const () as usize,
        ncclGroupEnd as *const () as usize,
        stallNcclStubCallCount as *const () as usize,
    ];
    EXPORTED.iter().copied().zip(addrs).collect()
}

#[test]
fn every_function_has_an_address_of_its_own() {
    assert_distinct(&exported_addresses());
    // The same in the built library, where cargo built it.
    assert_library_distinct("libstall_nccl_stub.so", &EXPORTED);
}

#[test]
fn calls_are_counted() {
    let n = |name: &CStr| {
        // SAFETY: a NUL-terminated name.
        unsafe { stallNcclStubCallCount(name.as_ptr()) }
    };
    let before = n(c"ncclGetVersion");
    let mut v = 0;
    // SAFETY: a valid out pointer.
    unsafe {
        ncclGetVersion(&mut v);
        ncclGetVersion(&mut v);
    }
    assert!(n(c"ncclGetVersion") >= before + 2);
    assert_eq!(n(c"ncclNoSuchThing"), u64::MAX);
    // SAFETY: null is refused.
    assert_eq!(unsafe { stallNcclStubCallCount(std::ptr::null()) }, u64::MAX);
}
