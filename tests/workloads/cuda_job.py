#!/usr/bin/env python3
"""A job that drives a GPU through the CUDA runtime and driver libraries, for
the tests of stall's uprobes on them. It loads the library with ctypes the
way PyTorch loads libcudart (dlopen, RTLD_GLOBAL), normally the stand-in
libstall_cuda_stub.so (tests/cuda-stub), whose streams are threads and whose
kernels take the GPU time its knob says. Standard library only (the VMs carry
nothing else). The main thread makes every CUDA call.

  sync    each step launches --kernels (8) kernels of --kernel-us (5000) µs
          on the legacy stream, waits for them (--sync: stream,
          device, event or driver), does ~1 ms of Python work and logs a
          line: the main thread is inside the synchronization ~95 % of the
          time, on CPU or not as --schedule says
  launch  launch-bound: each step launches --kernels (2000) kernels of
          --kernel-us (2) µs with ~30 µs of Python work between launches,
          then one synchronization; a log line per step
  copy    each step one synchronous cudaMemcpy device to host of --bytes
          (64 MiB) from a cudaMalloc'd buffer into a bytearray, at
          --copy-mbps (the library's default rate when absent), then ~1 ms
          of Python work; a log line per step

The library is loaded --load-after seconds after start (so a tracer started
first sees it mapped later), then steps run for --seconds. At the end (or on
SIGTERM/SIGINT, after the current step) the truth goes to --truth as JSON:
pid, tid_main, mode, schedule, steps, seconds (of the steps), sync_s (time
the main thread spent inside the synchronization calls, perf_counter around
each), sync_calls, launches, launch_s, copies, copy_bytes, copy_s, lib,
loaded_at_s (since start), the settings used, and lib_calls: the calls of
each function the job uses as the stand-in counted them.
"""
import argparse
import ctypes
import json
import os
import signal
import threading
import time

c_int, c_uint, c_size_t, c_void_p = ctypes.c_int, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p
VOIDPP = ctypes.POINTER(c_void_p)
MIB = 1 << 20

# cudaDeviceSchedule* flags.
SCHEDULES = {"auto": 0, "spin": 1, "yield": 2, "block": 4}
MEMCPY_DEVICE_TO_HOST = 2
DEFAULTS = {  # mode: (kernels per step, kernel µs)
    "sync": (8, 5000),
    "launch": (2000, 2),
    "copy": (0, 1000),
}


class Dim3(ctypes.Structure):
    _fields_ = [("x", c_uint), ("y", c_uint), ("z", c_uint)]


# (name, restype, argtypes) of every function the job calls.
PROTOTYPES = [
    ("cudaSetDeviceFlags", c_int, [c_uint]),
    ("cudaGetDeviceFlags", c_int, [ctypes.POINTER(c_uint)]),
    ("cudaSetDevice", c_int, [c_int]),
    ("cudaLaunchKernel", c_int, [c_void_p, Dim3, Dim3, VOIDPP, c_size_t, c_void_p]),
    ("cudaStreamSynchronize", c_int, [c_void_p]),
    ("cudaDeviceSynchronize", c_int, []),
    ("cudaEventCreate", c_int, [VOIDPP]),
    ("cudaEventRecord", c_int, [c_void_p, c_void_p]),
    ("cudaEventSynchronize", c_int, [c_void_p]),
    ("cudaEventDestroy", c_int, [c_void_p]),
    ("cudaMalloc", c_int, [VOIDPP, c_size_t]),
    ("cudaFree", c_int, [c_void_p]),
    ("cudaMemcpy", c_int, [c_void_p, c_void_p, c_size_t, c_int]),
    ("cuInit", c_int, [c_uint]),
    # f, grid x y z, block x y z, shared bytes, stream, params, extra.
    ("cuLaunchKernel", c_int, [c_void_p] + [c_uint] * 7 + [c_void_p, VOIDPP, VOIDPP]),
    ("cuStreamSynchronize", c_int, [c_void_p]),
]
# The stand-in's own knobs and call counts; a real library has none of them.
STUB_PROTOTYPES = [
    ("stallStubSetKernelMicros", None, [c_uint]),
    ("stallStubSetCopyMBps", None, [c_uint]),
    ("stallStubCallCount", ctypes.c_uint64, [ctypes.c_char_p]),
]

stop = False


def on_signal(_sig, _frame):
    global stop
    stop = True


def load(path):
    """The library and whether it is the stand-in (it has the knobs)."""
    lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    for name, restype, argtypes in PROTOTYPES:
        f = getattr(lib, name)
        f.restype = restype
        f.argtypes = argtypes
    stub = True
    for name, restype, argtypes in STUB_PROTOTYPES:
        try:
            f = getattr(lib, name)
        except AttributeError:
            stub = False
            continue
        f.restype = restype
        f.argtypes = argtypes
    return lib, stub


def check(rc, what):
    if rc != 0:
        raise SystemExit(f"cuda_job: {what} failed: error {rc}")


def host_work(seconds):
    """Pure-Python arithmetic for about `seconds` (the host side of a step)."""
    end = time.perf_counter() + seconds
    acc = 0
    while time.perf_counter() < end:
        for j in range(50):
            acc += j * j
    return acc


def calibrate(target_s):
    """How many iterations of `small_work` take about `target_s`."""
    n, took = 100, 0.0
    while took < 0.02:
        t = time.perf_counter()
        for _ in range(100):
            small_work(n)
        took = time.perf_counter() - t
        if took < 0.02:
            n *= 2
    return max(1, int(n * target_s / (took / 100)))


def small_work(n):
    acc = 0
    for j in range(n):
        acc += j * 3 + 1
    return (acc, n)


class Job:
    def __init__(self, a, lib):
        self.a, self.lib = a, lib
        self.t = {"sync_s": 0.0, "sync_calls": 0, "launches": 0, "launch_s": 0.0, "copies": 0,
                  "copy_bytes": 0, "copy_s": 0.0}
        self.kernel = ctypes.create_string_buffer(16)  # stands for a kernel's host stub
        self.arg = ctypes.c_int(7)
        self.args = (c_void_p * 1)(ctypes.addressof(self.arg))
        self.one = Dim3(1, 1, 1)
        self.block = Dim3(128, 1, 1)
        self.event = None

    def launch(self):
        lib, t = self.lib, time.perf_counter()
        if self.a.launch == "driver":
            rc = lib.cuLaunchKernel(ctypes.addressof(self.kernel), 1, 1, 1, 128, 1, 1, 0, None, self.args, None)
        else:
            rc = lib.cudaLaunchKernel(ctypes.addressof(self.kernel), self.one, self.block, self.args, 0, None)
        self.t["launch_s"] += time.perf_counter() - t
        self.t["launches"] += 1
        check(rc, "launch")

    def synchronize(self):
        lib, how = self.lib, self.a.sync
        if how == "event":
            check(lib.cudaEventRecord(self.event, None), "cudaEventRecord")
        t = time.perf_counter()
        if how == "stream":
            rc = lib.cudaStreamSynchronize(None)
        elif how == "device":
            rc = lib.cudaDeviceSynchronize()
        elif how == "event":
            rc = lib.cudaEventSynchronize(self.event)
        else:
            rc = lib.cuStreamSynchronize(None)
        self.t["sync_s"] += time.perf_counter() - t
        self.t["sync_calls"] += 1
        check(rc, f"{how} synchronization")


def probed_names(a):
    """The functions the mode's steps call that a tracer would probe."""
    sync = {"stream": "cudaStreamSynchronize", "device": "cudaDeviceSynchronize",
            "event": "cudaEventSynchronize", "driver": "cuStreamSynchronize"}[a.sync]
    launch = "cudaLaunchKernel" if a.launch == "runtime" else "cuLaunchKernel"
    # stall probes the launches last: once they are in, so is the rest.
    return {"sync": [sync, launch], "launch": [launch, sync], "copy": ["cudaMemcpy", launch]}[a.mode]


def wait_probed(lib, names, limit):
    """Waits until the first byte of each of `names` is an int3 (a uprobe
    is in: the kernel wrote it into this process's copy of the page);
    returns (all probed, seconds waited)."""
    t = time.monotonic()
    addrs = [ctypes.cast(getattr(lib, n), c_void_p).value for n in names]
    while time.monotonic() - t < limit:
        if all(ctypes.string_at(at, 1) == b"\xcc" for at in addrs):
            return True, time.monotonic() - t
        time.sleep(0.01)
    return False, time.monotonic() - t


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["sync", "launch", "copy"])
    p.add_argument("--lib", required=True, help="the CUDA library to load (libstall_cuda_stub.so)")
    p.add_argument("--truth", required=True, help="where the truth JSON goes")
    p.add_argument("--seconds", type=float, required=True, help="how long the steps run")
    p.add_argument("--load-after", type=float, default=0.0, help="seconds to sleep before loading the library")
    p.add_argument("--log", help="a line per step is appended here")
    p.add_argument("--wait-probed", type=float, default=0.0,
                   help="after loading, wait up to this many seconds until a tracer's uprobes are in the "
                        "functions the mode calls (their first byte an int3), so that the truth counts what a "
                        "tracer could see; the truth says whether they were"),
    p.add_argument("--kernels", type=int, help="kernels per step (sync 8, launch 2000)")
    p.add_argument("--kernel-us", type=int, help="GPU time of a kernel, µs (sync 5000, launch 2)")
    p.add_argument("--sync", choices=["stream", "device", "event", "driver"], default="stream",
                   help="cudaStreamSynchronize(NULL), cudaDeviceSynchronize, cudaEventRecord + "
                        "cudaEventSynchronize, or cuStreamSynchronize(NULL)")
    p.add_argument("--launch", choices=["runtime", "driver"], default="runtime",
                   help="cudaLaunchKernel or cuLaunchKernel")
    p.add_argument("--schedule", choices=list(SCHEDULES),
                   help="cudaSetDeviceFlags first (absent: not called, which is auto)")
    p.add_argument("--bytes", type=int, default=64 * MIB, help="bytes per copy (copy mode)")
    p.add_argument("--copy-mbps", type=int, help="copy rate, MB/s (the stand-in's knob)")
    a = p.parse_args()
    kernels, kernel_us = DEFAULTS[a.mode]
    a.kernels = kernels if a.kernels is None else a.kernels
    a.kernel_us = kernel_us if a.kernel_us is None else a.kernel_us

    start = time.monotonic()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if a.load_after > 0:
        time.sleep(a.load_after)
    lib, stub = load(a.lib)
    loaded_at = time.monotonic() - start
    probed, probed_wait = None, 0.0
    if a.wait_probed > 0:
        probed, probed_wait = wait_probed(lib, probed_names(a), a.wait_probed)

    if a.schedule is not None:
        check(lib.cudaSetDeviceFlags(SCHEDULES[a.schedule]), "cudaSetDeviceFlags")
    check(lib.cudaSetDevice(0), "cudaSetDevice")
    if a.sync == "driver" or a.launch == "driver":
        check(lib.cuInit(0), "cuInit")
    flags = c_uint(0)
    check(lib.cudaGetDeviceFlags(ctypes.byref(flags)), "cudaGetDeviceFlags")
    if stub:
        lib.stallStubSetKernelMicros(a.kernel_us)
        if a.copy_mbps is not None:
            lib.stallStubSetCopyMBps(a.copy_mbps)

    job = Job(a, lib)
    if a.sync == "event":
        ev = c_void_p()
        check(lib.cudaEventCreate(ctypes.byref(ev)), "cudaEventCreate")
        job.event = ev
    dev, host, host_buf, work_n = None, None, None, 0
    if a.mode == "copy":
        dev = c_void_p()
        check(lib.cudaMalloc(ctypes.byref(dev), a.bytes), "cudaMalloc")
        host = bytearray(a.bytes)
        host_buf = (ctypes.c_char * a.bytes).from_buffer(host)
    if a.mode == "launch":
        work_n = calibrate(30e-6)

    log = open(a.log, "a", buffering=1) if a.log else None
    steps = 0
    t0 = time.monotonic()
    while not stop and time.monotonic() - t0 < a.seconds:
        if a.mode == "sync":
            for _ in range(a.kernels):
                job.launch()
            job.synchronize()
            host_work(1e-3)
        elif a.mode == "launch":
            for _ in range(a.kernels):
                small_work(work_n)
                job.launch()
            job.synchronize()
        else:
            t = time.perf_counter()
            rc = lib.cudaMemcpy(ctypes.addressof(host_buf), dev, a.bytes, MEMCPY_DEVICE_TO_HOST)
            job.t["copy_s"] += time.perf_counter() - t
            check(rc, "cudaMemcpy")
            job.t["copies"] += 1
            job.t["copy_bytes"] += a.bytes
            host_work(1e-3)
        steps += 1
        if log:
            log.write(f"step {steps} t={time.monotonic() - t0:.3f} sync_s={job.t['sync_s']:.3f} "
                      f"launches={job.t['launches']} copies={job.t['copies']}\n")
    seconds = time.monotonic() - t0
    if log:
        log.close()
    if job.event is not None:
        check(lib.cudaEventDestroy(job.event), "cudaEventDestroy")
    if dev is not None:
        del host_buf
        check(lib.cudaFree(dev), "cudaFree")

    truth = {
        "pid": os.getpid(),
        "tid_main": threading.get_native_id(),
        "mode": a.mode,
        "schedule": a.schedule or "auto",
        "device_flags": flags.value,
        "steps": steps,
        "seconds": seconds,
        **job.t,
        "lib": a.lib,
        "loaded_at_s": loaded_at,
        "probed": probed,
        "probed_wait_s": probed_wait,
        "sync": a.sync,
        "launch": a.launch,
        "kernels_per_step": a.kernels,
        "kernel_us": a.kernel_us,
        "bytes_per_copy": a.bytes if a.mode == "copy" else 0,
        "copy_mbps": a.copy_mbps,
        "host_work_iterations": work_n,
        # What the stand-in counted, per function the job calls (empty for
        # a real library).
        "lib_calls": {name: lib.stallStubCallCount(name.encode()) for name, _, _ in PROTOTYPES} if stub else {},
    }
    with open(a.truth + ".tmp", "w") as f:
        json.dump(truth, f)
    os.rename(a.truth + ".tmp", a.truth)


if __name__ == "__main__":
    main()
