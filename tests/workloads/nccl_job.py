#!/usr/bin/env python3
"""A multi-rank training job on NCCL and CUDA, without torch, for the tests
of stall's uprobes on NCCL. Standard library only (the VMs carry nothing
else).

  launch  starts --ranks rank processes with the environment torchrun gives
          its workers (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
          GROUP_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID), waits
          for them (forwarding SIGTERM/SIGINT) and merges their truths;
          --no-rank-env: none of those, each rank's on its command line
  rank    one rank (what `launch` starts; RANK and WORLD_SIZE from the
          environment, or --rank and --world)

Each rank loads --cuda-lib (libcudart.so.13, RTLD_GLOBAL) and --nccl-lib
(libnccl.so.2) with ctypes as PyTorch does: normally copies of the stand-ins
tests/cuda-stub and tests/nccl-stub; `launch` copies them into --dir under
those names when theirs differ. Rank 0 calls ncclGetUniqueId and hands the
128 bytes to the others through a file in --dir; every rank calls
ncclCommInitRank. Each step: --kernels kernels of --kernel-us µs on a
stream, ncclAllReduce(sum, float32) of a --count gradient on that stream,
cudaStreamSynchronize(stream), the result's first floats read back and
checked, ~1 ms of Python work, a log line. --late-rank R calls each
all-reduce --late-ms late (--late-how: sleep, spin on CPU, or block in a
read(2) of a pipe). The first float of the gradient says whether the rank
goes on: all ranks stop after the same collective once one ran --seconds or
got SIGTERM/SIGINT.

Truth (JSON), per rank in --dir/truth_RANK.json and, from `launch`, all of
them in --truth as {"launcher": pid, "world_size": n, "ranks": [...]}:
pid, tid_main, rank, local_rank, world_size, run_id, steps, collectives,
arrive_ns (CLOCK_MONOTONIC ns right before each ncclAllReduce), sync_ns
(time inside each cudaStreamSynchronize that followed), sync_s (their sum),
results_ok (collectives whose result was right), late_rank, late_ms,
late_how, kernels, kernel_us, count, probed, probed_wait_s, cuda_calls and
nccl_calls (the stand-ins' call counts of the functions used).
"""
import argparse
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

c_int, c_uint, c_size_t, c_void_p = ctypes.c_int, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p
VOIDPP = ctypes.POINTER(c_void_p)
SCHEDULES = {"auto": 0, "spin": 1, "yield": 2, "block": 4}
MEMCPY_HOST_TO_DEVICE, MEMCPY_DEVICE_TO_HOST = 1, 2
NCCL_FLOAT32, NCCL_SUM = 7, 0
# Floats of the gradient each step writes and reads back: the go-on flag,
# then three that must sum to the ranks' (rank + 1).
HEAD = 4


class Dim3(ctypes.Structure):
    _fields_ = [("x", c_uint), ("y", c_uint), ("z", c_uint)]


class UniqueId(ctypes.Structure):
    """ncclUniqueId: 128 bytes passed by value."""
    _fields_ = [("internal", ctypes.c_char * 128)]


CUDA = [
    ("cudaSetDevice", c_int, [c_int]),
    ("cudaSetDeviceFlags", c_int, [c_uint]),
    ("cudaStreamCreate", c_int, [VOIDPP]),
    ("cudaStreamDestroy", c_int, [c_void_p]),
    ("cudaLaunchKernel", c_int, [c_void_p, Dim3, Dim3, VOIDPP, c_size_t, c_void_p]),
    ("cudaStreamSynchronize", c_int, [c_void_p]),
    ("cudaMalloc", c_int, [VOIDPP, c_size_t]),
    ("cudaFree", c_int, [c_void_p]),
    ("cudaMemcpy", c_int, [c_void_p, c_void_p, c_size_t, c_int]),
    ("cudaLaunchHostFunc", c_int, [c_void_p, c_void_p, c_void_p]),
]
NCCL = [
    ("ncclGetVersion", c_int, [ctypes.POINTER(c_int)]),
    ("ncclGetUniqueId", c_int, [ctypes.POINTER(UniqueId)]),
    ("ncclCommInitRank", c_int, [VOIDPP, c_int, UniqueId, c_int]),
    ("ncclCommDestroy", c_int, [c_void_p]),
    ("ncclAllReduce", c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p]),
    ("ncclGetErrorString", ctypes.c_char_p, [c_int]),
    ("ncclGetLastError", ctypes.c_char_p, [c_void_p]),
]

stop = False


def on_signal(_sig, _frame):
    global stop
    stop = True


def bind(lib, protos):
    for name, restype, argtypes in protos:
        f = getattr(lib, name)
        f.restype, f.argtypes = restype, argtypes


def counts(lib, counter, protos):
    """The stand-in's call counts of `protos` ({} for a real library)."""
    try:
        f = getattr(lib, counter)
    except AttributeError:
        return {}
    f.restype, f.argtypes = ctypes.c_uint64, [ctypes.c_char_p]
    return {name: f(name.encode()) for name, _, _ in protos}


def check(rc, what, nccl=None, comm=None):
    if rc != 0:
        why = f"error {rc}"
        if nccl:
            last = nccl.ncclGetLastError(comm)
            why = nccl.ncclGetErrorString(rc).decode() + (f" ({last.decode()})" if last else "")
        raise SystemExit(f"nccl_job: {what} failed: {why}")


def spin(seconds):
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1
    return x


def blocked_read(seconds):
    """Blocks in read(2) on a pipe that a timer writes to after `seconds`."""
    r, w = os.pipe()
    t = threading.Timer(seconds, os.write, (w, b"x"))
    t.start()
    os.read(r, 1)
    t.join()
    os.close(r)
    os.close(w)


def wait_probed(libs_names, limit):
    """Waits until the first byte of each function is an int3 (a uprobe is
    in); returns (all probed, seconds waited)."""
    t = time.monotonic()
    addrs = [ctypes.cast(getattr(lib, n), c_void_p).value for lib, n in libs_names]
    while time.monotonic() - t < limit:
        if all(ctypes.string_at(at, 1) == b"\xcc" for at in addrs):
            return True, time.monotonic() - t
        time.sleep(0.01)
    return False, time.monotonic() - t


def unique_id(nccl, rank, path):
    """Rank 0 makes the id and writes it to `path`; the others read it."""
    uid = UniqueId()
    if rank == 0:
        check(nccl.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId", nccl)
        with open(path + ".tmp", "wb") as f:
            f.write(ctypes.string_at(ctypes.addressof(uid), 128))
        os.rename(path + ".tmp", path)
        return uid
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"nccl_job: no unique id at {path}")
        time.sleep(0.01)
    with open(path, "rb") as f:
        ctypes.memmove(ctypes.addressof(uid), f.read(128), 128)
    return uid


def rank_main(a):
    if a.rank is not None:
        # Started with no rank variable (--no-rank-env): only the
        # communicator will say which rank this is.
        rank, world, local_rank, run_id = a.rank, a.world, a.rank, a.run_id
    else:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if a.cgroups:
        # Each rank on its own "node": its cgroup, before it loads anything.
        with open(os.path.join(a.cgroups.split(",")[rank], "cgroup.procs"), "w") as f:
            f.write("0")
    cuda = ctypes.CDLL(a.cuda_lib, mode=ctypes.RTLD_GLOBAL)
    bind(cuda, CUDA)
    nccl = ctypes.CDLL(a.nccl_lib)
    bind(nccl, NCCL)
    try:
        cuda.stallStubSetKernelMicros.argtypes = [c_uint]
        cuda.stallStubSetKernelMicros(a.kernel_us)
    except AttributeError:
        pass
    probed, probed_wait = None, 0.0
    if a.wait_probed > 0:
        names = [(nccl, n) for n in a.probed.split(",") if n.startswith("nccl")]
        names += [(cuda, n) for n in a.probed.split(",") if n.startswith("cu")]
        probed, probed_wait = wait_probed(names, a.wait_probed)

    if a.schedule:
        check(cuda.cudaSetDeviceFlags(SCHEDULES[a.schedule]), "cudaSetDeviceFlags")
    check(cuda.cudaSetDevice(0), "cudaSetDevice")
    uid = unique_id(nccl, rank, os.path.join(a.dir, f"nccl_id_{run_id}"))
    comm = c_void_p()
    check(nccl.ncclCommInitRank(ctypes.byref(comm), world, uid, rank), "ncclCommInitRank", nccl)
    stream = c_void_p()
    check(cuda.cudaStreamCreate(ctypes.byref(stream)), "cudaStreamCreate")
    nbytes = 4 * a.count
    grad, out = c_void_p(), c_void_p()
    check(cuda.cudaMalloc(ctypes.byref(grad), nbytes), "cudaMalloc")
    check(cuda.cudaMalloc(ctypes.byref(out), nbytes), "cudaMalloc")
    head = (ctypes.c_float * HEAD)()
    back = (ctypes.c_float * HEAD)()
    kernel = ctypes.create_string_buffer(16)  # stands for a kernel's host stub
    one, block = Dim3(1, 1, 1), Dim3(128, 1, 1)
    want = world * (world + 1) / 2
    late_s = a.late_ms / 1000.0 if rank == a.late_rank else 0.0
    delay = {"sleep": time.sleep, "spin": spin, "read": blocked_read}[a.late_how]

    log = open(a.log.replace("{rank}", str(rank)), "a", buffering=1) if a.log else None
    arrive, syncs = [], []
    steps, ok = 0, 0
    t0 = time.monotonic()
    while True:
        go_on = not stop and time.monotonic() - t0 < a.seconds
        head[0] = 1.0 if go_on else 0.0
        for i in range(1, HEAD):
            head[i] = rank + 1.0
        check(cuda.cudaMemcpy(grad, head, ctypes.sizeof(head), MEMCPY_HOST_TO_DEVICE), "cudaMemcpy")
        for _ in range(a.kernels):
            check(cuda.cudaLaunchKernel(ctypes.addressof(kernel), one, block, None, 0, stream), "launch")
        if late_s:
            delay(late_s)
        arrive.append(time.monotonic_ns())
        check(nccl.ncclAllReduce(grad, out, a.count, NCCL_FLOAT32, NCCL_SUM, comm, stream), "ncclAllReduce", nccl, comm)
        t = time.monotonic_ns()
        check(cuda.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        syncs.append(time.monotonic_ns() - t)
        check(cuda.cudaMemcpy(back, out, ctypes.sizeof(back), MEMCPY_DEVICE_TO_HOST), "cudaMemcpy")
        ok += all(back[i] == want for i in range(1, HEAD))
        steps += 1
        spin(1e-3)
        if log:
            # wait_ms: from the collective's call to its synchronization's
            # return, what stall times as the collective's wait.
            log.write(f"rank {rank} step {steps} t={time.monotonic() - t0:.3f} "
                      f"sync_ms={syncs[-1] / 1e6:.1f} wait_ms={(t + syncs[-1] - arrive[-1]) / 1e6:.1f}\n")
        # Every rank goes on only while all do: they stop after the same
        # collective.
        if back[0] < world:
            break
    if log:
        log.close()
    check(cuda.cudaStreamDestroy(stream), "cudaStreamDestroy")
    check(cuda.cudaFree(grad), "cudaFree")
    check(cuda.cudaFree(out), "cudaFree")
    check(nccl.ncclCommDestroy(comm), "ncclCommDestroy", nccl)
    truth = {
        "pid": os.getpid(),
        "tid_main": threading.get_native_id(),
        "rank": rank,
        "local_rank": local_rank,
        "world_size": world,
        "run_id": run_id,
        "steps": steps,
        "collectives": len(arrive),
        "seconds": time.monotonic() - t0,
        "arrive_ns": arrive,
        "sync_ns": syncs,
        "sync_s": sum(syncs) / 1e9,
        "results_ok": ok,
        "late_rank": a.late_rank,
        "late_ms": a.late_ms,
        "late_how": a.late_how,
        "kernels": a.kernels,
        "kernel_us": a.kernel_us,
        "count": a.count,
        "cuda_lib": a.cuda_lib,
        "nccl_lib": a.nccl_lib,
        "probed": probed,
        "probed_wait_s": probed_wait,
        "cuda_calls": counts(cuda, "stallStubCallCount", CUDA),
        "nccl_calls": counts(nccl, "stallNcclStubCallCount", NCCL),
    }
    write_json(os.path.join(a.dir, f"truth_{rank}.json"), truth)
    if a.truth:
        write_json(a.truth.replace("{rank}", str(rank)), truth)


def write_json(path, obj):
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f)
    os.rename(path + ".tmp", path)


def named_copy(path, name, folder):
    """`path`, or a copy of it named `name` in `folder` if its name is not
    a form of `name` (stall finds the libraries by name)."""
    if os.path.basename(path).startswith(name.split(".so")[0] + ".so"):
        return path
    dst = os.path.join(folder, name)
    shutil.copyfile(path, dst)
    return dst


# What stall reads a rank from: none of it reaches a --no-rank-env rank.
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "NODE_RANK",
                  "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK",
                  "PMI_RANK")


def launch_main(a):
    os.makedirs(a.dir, exist_ok=True)
    cuda = named_copy(a.cuda_lib, "libcudart.so.13", a.dir)
    nccl = named_copy(a.nccl_lib, "libnccl.so.2", a.dir)
    n = str(a.ranks)
    run_id = f"stall-nccl-{os.getpid()}"
    for r in range(a.ranks):
        stale = os.path.join(a.dir, f"truth_{r}.json")
        if os.path.exists(stale):
            os.remove(stale)
    rest = [x for x in sys.argv[1:] if x not in ("launch", "--no-rank-env")]
    children = []
    for r in range(a.ranks):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), GROUP_RANK="0", WORLD_SIZE=n,
                   LOCAL_WORLD_SIZE=n, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port),
                   TORCHELASTIC_RUN_ID=run_id)
        given = []
        if a.no_rank_env:
            # As a launcher of its own would: the rank on the command line,
            # nothing in the environment.
            env = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
            given = ["--rank", str(r), "--world", n, "--run-id", run_id]
        cmd = [sys.executable, os.path.abspath(__file__), "rank"] + rest + given + [
            "--cuda-lib", cuda, "--nccl-lib", nccl, "--truth", ""]
        children.append(subprocess.Popen(cmd, env=env))

    def forward(sig, _frame):
        for c in children:
            if c.poll() is None:
                c.send_signal(sig)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    failed = sum(c.wait() != 0 for c in children)
    ranks = []
    for r in range(a.ranks):
        path = os.path.join(a.dir, f"truth_{r}.json")
        if os.path.exists(path):
            with open(path) as f:
                ranks.append(json.load(f))
    if a.truth:
        write_json(a.truth, {"launcher": os.getpid(), "world_size": a.ranks, "run_id": run_id, "ranks": ranks})
    sys.exit(1 if failed else 0)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["launch", "rank"])
    p.add_argument("--ranks", type=int, default=4, help="ranks to start (launch)")
    p.add_argument("--dir", required=True, help="a folder the ranks share (unique id, truths, library copies)")
    p.add_argument("--cuda-lib", required=True, help="the CUDA runtime to load (the stand-in's copy)")
    p.add_argument("--nccl-lib", required=True, help="the NCCL library to load (the stand-in's copy)")
    p.add_argument("--truth", default="", help="where the truth goes (launch: all ranks; rank: {rank} expands)")
    p.add_argument("--seconds", type=float, default=5.0, help="how long the steps run")
    p.add_argument("--kernels", type=int, default=4, help="kernels per step before the all-reduce")
    p.add_argument("--kernel-us", type=int, default=5000, help="GPU time of a kernel, µs")
    p.add_argument("--count", type=int, default=65536, help="floats in the all-reduced gradient")
    p.add_argument("--late-rank", type=int, default=-1, help="rank that calls each all-reduce late (-1: none)")
    p.add_argument("--late-ms", type=float, default=200.0, help="how late, ms")
    p.add_argument("--late-how", choices=["sleep", "spin", "read"], default="sleep",
                   help="what the late rank does meanwhile: sleep, spin on CPU, or block in read(2)")
    p.add_argument("--schedule", choices=list(SCHEDULES), help="cudaSetDeviceFlags first (absent: auto)")
    p.add_argument("--wait-probed", type=float, default=0.0,
                   help="after loading, wait up to this many seconds until the --probed functions' first "
                        "byte is an int3 (a tracer's uprobes are in); the truth says whether they were")
    p.add_argument("--probed", default="ncclAllReduce", help="comma-separated functions --wait-probed waits for")
    p.add_argument("--port", type=int, default=29531, help="MASTER_PORT in the ranks' environment")
    p.add_argument("--cgroups", default=None,
                   help="comma-separated cgroup directories, one per rank; each rank moves itself into its own")
    p.add_argument("--log", help="a line per step is appended here ({rank} expands)")
    p.add_argument("--no-rank-env", action="store_true",
                   help="launch: start the ranks with no rank variable, their rank on the command line")
    p.add_argument("--rank", type=int, help="rank: this rank (else $RANK)")
    p.add_argument("--world", type=int, help="rank: the number of ranks (with --rank)")
    p.add_argument("--run-id", default="none", help="rank: the run (with --rank)")
    a = p.parse_args()
    if a.mode == "launch":
        return launch_main(a)
    return rank_main(a)


if __name__ == "__main__":
    main()
