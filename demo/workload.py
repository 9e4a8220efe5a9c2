#!/usr/bin/env python3
"""A DataLoader-shaped training job whose input pipeline waits on the disk.

The demo workload for stall (`cargo xtask demo`); Python 3 standard library
only, no PyTorch. It does what torch.utils.data.DataLoader does with
num_workers=4:

  * a trainer process forks worker processes (multiprocessing, fork context);
  * it hands each worker sample indices through that worker's index queue;
  * the workers read the samples from disk and put small batch summaries on a
    shared result queue;
  * the trainer blocks in `result_queue.get(timeout=...)` (poll on the queue's
    pipe) until a batch arrives, then "computes" for a few milliseconds.

The samples are shard files of --file-mb MB each ("rows_00000-02000.bin"),
written once into --cache-dir and reused by later runs. Before a worker reads
a file it evicts it from the page cache (posix_fadvise DONTNEED), so every
read really goes to the disk.

Local disks are often fast enough (~1 GB/s) that the job would hardly wait.
To look like a job reading from slower (network) storage, the reads are
throttled to --throttle-mbps for this job only, with a cgroup: cgroup v1
blkio (blkio.throttle.read_bps_device) where it is mounted, else cgroup v2
io.max where the io controller can be enabled, on the disk that holds the
cache directory. The trainer moves itself into the cgroup before it forks
the workers, so they inherit it; the cgroup is removed at the end. Without
root or either controller the job runs unthrottled, and says so.

Defaults: 24 files x 100 MB = 2.4 GB read at 100 MB/s, about 25 s of reading
(generating the files the first time takes a few seconds more).

Output: the first stdout line is `PID <trainer pid>`, printed once the files
and the throttle are ready and just before the workers start (`cargo xtask
demo` attaches `stall attach --pid` to it); the job then waits --start-delay
seconds (and, with --start-after PATH, until PATH exists) so the tracer is in
place before the reading starts. Progress goes to stderr; a one-line summary
goes to stdout at the end. Exit status 0 on success (also when stopped by
--max-seconds), 130 when interrupted (Ctrl-C, SIGTERM).

Other input pipelines (--mode), for stall's scenario tests:

  io       the above (default): the workers wait on the disk -> input-io-bound
  mmap     as io, but the workers map each shard and copy batches out of the
           mapping (what torch.load(mmap=True), safetensors and Hugging Face
           datasets' Arrow files do): no read(2) at all, the bytes come by
           page faults -> input-io-bound; with --map-before-fork the trainer
           maps every shard before the workers fork (as datasets'
           load_from_disk does) and they fault the pages in through the
           mappings they inherited, never opening a shard
  cpu      no files: each worker "decodes/augments" every batch from memory
           with --decode-ms of CPU (zlib + Python) -> input-cpu-bound
  hang     the workers block forever on a multiprocessing Event that is never
           set, before reading anything; the trainer polls its result queue
           every 5 s like DataLoader -> hang (runs until killed or
           --max-seconds)
  checkpoint  the input keeps up (as in healthy mode, --decode-ms default 5,
           --compute-ms default 20), but every --checkpoint-every batches the
           trainer saves a --checkpoint-mb MB state as torch.save does with a
           safe rename: written in 1 MiB write(2) calls to
           <cache-dir>/ckpt-<pid>.bin.tmp, fsync'd, renamed over
           ckpt-<pid>.bin; --throttle-mbps caps the job's disk *writes* ->
           output-io-bound
  healthy  the trainer is the bottleneck: --compute-ms (default 200) per
           batch; the workers make batches from memory in --decode-ms
           (default 30) and then idle -> not an input verdict

In cpu, healthy and hang modes a batch is one index and the trainer keeps
--prefetch indices outstanding per worker, handing out the next one as it
takes a batch (DataLoader's prefetch_factor); in io mode an index is a file,
and all files of an epoch are handed out at its start, round-robin.
--respawn starts new workers every epoch (persistent_workers=False).

--truth PATH writes ground truth as JSON (atomically: a temporary file, then
rename) once the workers are started, after each epoch, every 5 s while
waiting for a batch, and at the end: the mode, the trainer's pid and its main
thread's CPU time, each worker process (pid, id, epoch, the exact bytes it
read from files as it counted them, per file the bytes and CLOCK_MONOTONIC
open/close times, and in cpu/healthy modes its CPU time at its last batch),
and the start/end times (CLOCK_MONOTONIC, seconds).
"""

import argparse
import contextlib
import ctypes
import json
import multiprocessing as mp
import os
import queue
import signal
import sys
import time
import zlib

ROWS_PER_FILE = 2000
CHUNK = 1 << 20  # bytes per read(2) call
# DataLoader's MP_STATUS_CHECK_INTERVAL: the trainer polls its result queue
# with this timeout and checks that its workers are alive in between.
STATUS_CHECK_S = 5.0
PR_SET_NAME = 15
PR_SET_PDEATHSIG = 1
TAG = "workload:"


def log(msg):
    print(f"{TAG} {msg}", file=sys.stderr, flush=True)


MODES = ("io", "mmap", "cpu", "hang", "healthy", "checkpoint")
# The modes whose workers read shard files.
FILE_MODES = ("io", "mmap")
# Per-mode defaults of --compute-ms and --decode-ms.
COMPUTE_MS = {"io": 2.0, "mmap": 2.0, "cpu": 2.0, "hang": 2.0, "healthy": 200.0, "checkpoint": 20.0}
DECODE_MS = {"io": 0.0, "mmap": 0.0, "cpu": 50.0, "hang": 0.0, "healthy": 30.0, "checkpoint": 5.0}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=MODES, default="io",
                   help="what the input pipeline does (see the top of this file; default: %(default)s)")
    p.add_argument("--cache-dir", default="/var/tmp/stall-demo-cache",
                   help="where the sample files are generated once (default: %(default)s)")
    p.add_argument("--files", type=int, default=24, help="number of sample files (default: %(default)s)")
    p.add_argument("--file-mb", type=int, default=100, help="size of each file in MB (default: %(default)s)")
    p.add_argument("--workers", type=int, default=4, help="DataLoader worker processes (default: %(default)s)")
    p.add_argument("--batch-kb", type=int, default=4096,
                   help="bytes per batch, in KiB, read in 1 MiB read(2) calls (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=1, help="passes over the files (default: %(default)s)")
    p.add_argument("--batches", type=int, default=100,
                   help="batches per epoch in cpu, healthy and hang modes (default: %(default)s)")
    p.add_argument("--prefetch", type=int, default=2,
                   help="outstanding batches per worker in cpu, healthy and hang modes (default: %(default)s)")
    p.add_argument("--compute-ms", type=float, default=None,
                   help="trainer 'compute' per batch, in ms (default: 200 in healthy mode, else 2)")
    p.add_argument("--decode-ms", type=float, default=None,
                   help="worker CPU time per batch, in ms, in cpu and healthy modes (default: 50 in cpu "
                        "mode, 30 in healthy mode)")
    p.add_argument("--respawn", action="store_true",
                   help="new worker processes every epoch; the old ones exit at its end")
    p.add_argument("--throttle-mbps", type=float, default=100.0,
                   help="cap the job's disk reads (its writes in checkpoint mode) at this many MB/s with "
                        "a cgroup; 0: no throttle (default: %(default)s; io, mmap and checkpoint modes)")
    p.add_argument("--map-before-fork", action="store_true",
                   help="mmap mode: the trainer maps the shards before forking the workers")
    p.add_argument("--cpu-limit", type=float, default=None, metavar="CPUS",
                   help="run the job in a cgroup whose CPU quota is this many CPUs (a Kubernetes CPU "
                        "limit: cgroup v1 cpu.cfs_quota_us or v2 cpu.max, 100 ms periods)")
    p.add_argument("--checkpoint-mb", type=int, default=64,
                   help="checkpoint mode: MB saved per checkpoint (default: %(default)s)")
    p.add_argument("--checkpoint-every", type=int, default=20,
                   help="checkpoint mode: batches between checkpoints (default: %(default)s)")
    p.add_argument("--cgroup-name", default=None,
                   help="name of the throttling cgroup (default: stall-demo-<pid>)")
    p.add_argument("--start-delay", type=float, default=1.5,
                   help="seconds between printing the PID line and starting the workers, so a tracer "
                        "can attach (default: %(default)s)")
    p.add_argument("--import-s", type=float, default=0.0,
                   help="seconds of CPU work in the trainer before the workers start, as `import torch` "
                        "does (default: %(default)s)")
    p.add_argument("--start-after", default=None, metavar="PATH",
                   help="after --start-delay, also wait until PATH exists before starting the workers")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="stop after this many seconds (workers stopped, cgroup removed), exit status 0")
    p.add_argument("--truth", default=None, metavar="PATH", help="write ground truth as JSON to PATH")
    p.add_argument("--prepare-only", action="store_true",
                   help="io mode: generate the sample files, then exit")
    a = p.parse_args(argv)
    for name in ("files", "file_mb", "workers", "batch_kb", "epochs", "batches", "prefetch", "checkpoint_mb",
                 "checkpoint_every"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if a.compute_ms is None:
        a.compute_ms = COMPUTE_MS[a.mode]
    if a.decode_ms is None:
        a.decode_ms = DECODE_MS[a.mode]
    if a.map_before_fork and a.mode != "mmap":
        p.error("--map-before-fork is for mmap mode")
    if a.cpu_limit is not None and a.cpu_limit <= 0:
        p.error("--cpu-limit must be positive")
    if a.throttle_mbps < 0 or a.compute_ms < 0 or a.decode_ms < 0 or a.start_delay < 0 or a.import_s < 0:
        p.error("--throttle-mbps, --compute-ms, --decode-ms, --start-delay and --import-s must not be negative")
    if a.max_seconds is not None and a.max_seconds <= 0:
        p.error("--max-seconds must be positive")
    if a.prepare_only and a.mode != "io":
        p.error("--prepare-only is for io mode (the other modes read no files)")
    return a


def set_comm(name):
    """Names the calling thread (and so, from the main thread, /proc/PID/comm)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def die_with_parent():
    """SIGKILL this process when its parent (the trainer) dies."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


# ---------------------------------------------------------------- sample files

def file_names(n):
    width = max(5, len(str(n * ROWS_PER_FILE)))
    return [f"rows_{i * ROWS_PER_FILE:0{width}d}-{(i + 1) * ROWS_PER_FILE:0{width}d}.bin" for i in range(n)]


def generate(cache_dir, names, size):
    """Writes the files that are missing or of the wrong size; returns their paths."""
    os.makedirs(cache_dir, exist_ok=True)
    paths = [os.path.join(cache_dir, n) for n in names]
    todo = [p for p in paths if not (os.path.isfile(p) and os.path.getsize(p) == size)]
    if not todo:
        log(f"{len(paths)} sample files of {size / 1e6:.0f} MB already in {cache_dir}")
        return paths
    log(f"generating {len(todo)} of {len(paths)} sample files of {size / 1e6:.0f} MB in {cache_dir} "
        f"(once; later runs reuse them)")
    t0 = time.monotonic()
    base = os.urandom(CHUNK)
    for path in todo:
        tmp = f"{path}.tmp{os.getpid()}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                done, n = 0, 0
                while done < size:
                    # A different chunk every MiB: no two blocks of the files are equal.
                    block = n.to_bytes(8, "little") + os.urandom(56) + base[64:]
                    block = block[: size - done]
                    done += os.write(fd, block)
                    n += 1
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        os.rename(tmp, path)
    log(f"generated {len(todo) * size / 1e9:.2f} GB in {time.monotonic() - t0:.1f} s")
    return paths


# -------------------------------------------------------------------- throttle

def block_device(path):
    """(major, minor, name) of the whole disk holding `path`, or None."""
    dev = os.stat(path).st_dev
    sys_dir = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    if not os.path.exists(sys_dir):
        return None
    real = os.path.realpath(sys_dir)
    if os.path.exists(os.path.join(real, "partition")):
        real = os.path.dirname(real)  # a partition: throttle its disk
    try:
        with open(os.path.join(real, "dev")) as f:
            major, minor = (int(x) for x in f.read().split(":"))
    except (OSError, ValueError):
        return None
    return major, minor, os.path.basename(real)


# Wall time of the trainer's writes to control files (cgroup.procs, io.max,
# ...): moving a process between cgroups waits for an RCU grace period, so
# these block in write() as a checkpoint's writes do, and the truth has them.
CONTROL_WRITES = {"calls": 0, "s": 0.0}


def write(path, text):
    t0 = time.monotonic()
    try:
        with open(path, "w") as f:
            f.write(text)
    finally:
        CONTROL_WRITES["calls"] += 1
        CONTROL_WRITES["s"] += time.monotonic() - t0


def cgroup2_mount():
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split()[:1] == ["cgroup2"]:
                    return left.split()[4]
    except OSError:
        pass
    return None


def own_cgroup(controller):
    """This process's cgroup path in the v1 hierarchy of `controller`, or v2 if None."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            if (controller is None and ctrls == "") or (controller and controller in ctrls.split(",")):
                return path
    return None


class Throttle:
    """A cgroup that caps disk reads or writes, or CPU; `description` says
    what was done."""

    def __init__(self, kind, path, back, description, undo=None):
        self.kind, self.path, self.back, self.description, self.undo = kind, path, back, description, undo

    def enter(self):
        write(os.path.join(self.path, "cgroup.procs"), str(os.getpid()))

    def remove(self):
        """Moves the trainer back, waits for the cgroup to empty, removes it."""
        try:
            write(os.path.join(self.back, "cgroup.procs"), str(os.getpid()))
        except OSError as e:
            log(f"could not leave {self.path}: {e}")
        for _ in range(50):
            try:
                os.rmdir(self.path)
                break
            except OSError:
                time.sleep(0.1)
        else:
            log(f"could not remove {self.path}; remove it by hand once it is empty")
        if self.undo:
            self.undo()


def remove_stale(parent):
    """Removes empty stall-demo-<pid> cgroups left by runs that were killed."""
    try:
        entries = os.listdir(parent)
    except OSError:
        return
    for name in entries:
        pid = name[len("stall-demo-"):]
        if not (name.startswith("stall-demo-") and pid.isdigit()) or os.path.exists(f"/proc/{pid}"):
            continue
        try:
            os.rmdir(os.path.join(parent, name))  # fails while any process is in it
            log(f"removed stale cgroup {os.path.join(parent, name)}")
        except OSError:
            pass


def cpu_stat(path):
    """The throttling counters of a cgroup's cpu.stat, throttled time in ns."""
    out = {}
    with open(os.path.join(path, "cpu.stat")) as f:
        for line in f:
            key, _, value = line.partition(" ")
            out[key] = int(value)
    ns = out.get("throttled_time", out.get("throttled_usec", 0) * 1000)
    return {"periods": out.get("nr_periods", 0), "throttled_periods": out.get("nr_throttled", 0),
            "throttled_ns": ns}


def setup_cpu_limit(cpus, name):
    """Returns (Throttle or None, a sentence saying what the job's CPU gets):
    a cgroup whose CFS quota is `cpus` CPUs per 100 ms period."""
    if os.geteuid() != 0:
        return None, "NOT limited: creating a cgroup needs root"
    quota, period = int(cpus * 100000), 100000
    errors = []
    v1 = "/sys/fs/cgroup/cpu"
    if os.path.exists(os.path.join(v1, "cpu.cfs_quota_us")):
        parent = os.path.join(v1, (own_cgroup("cpu") or "/").lstrip("/")).rstrip("/")
        remove_stale(parent)
        path = os.path.join(parent, name)
        try:
            os.mkdir(path)
            try:
                write(os.path.join(path, "cpu.cfs_period_us"), str(period))
                write(os.path.join(path, "cpu.cfs_quota_us"), str(quota))
            except OSError:
                os.rmdir(path)
                raise
            return Throttle("cpu", path, parent, f"limited to {cpus:g} CPU with cgroup v1 cpu ({path})"), None
        except OSError as e:
            errors.append(f"cgroup v1 cpu: {e}")
    mnt = cgroup2_mount()
    if mnt:
        own = os.path.join(mnt, (own_cgroup(None) or "/").lstrip("/")).rstrip("/")
        candidates = [os.path.dirname(own), mnt] if own != mnt.rstrip("/") else [mnt]
        for parent in dict.fromkeys(p.rstrip("/") or "/" for p in candidates):
            try:
                t = setup_v2(parent, name, own, 0, 0, None, 0, f"limited to {cpus:g} CPU with cgroup v2 cpu.max",
                             controller="cpu", setting=("cpu.max", f"{quota} {period}"))
                return t, None
            except OSError as e:
                errors.append(f"cgroup v2 cpu under {parent}: {e}")
    return None, "NOT limited (" + "; ".join(errors or ["no cgroup cpu controller found"]) + ")"


def setup_v2(parent, name, back, major, minor, key, bps, description, controller="io", setting=None):
    # io must be passed down from the root to `parent`: enable it on every
    # level that does not yet (each holds no processes, the root excepted).
    mnt = cgroup2_mount()
    levels, p = [], parent.rstrip("/")
    while True:
        levels.append(p)
        if p == mnt.rstrip("/") or p in ("", "/"):
            break
        p = os.path.dirname(p)
    enabled = []

    def undo():
        for control in reversed(enabled):
            try:
                write(control, f"-{controller}")
            except OSError:
                pass

    try:
        for level in reversed(levels):
            control = os.path.join(level, "cgroup.subtree_control")
            with open(control) as f:
                if controller in f.read().split():
                    continue
            write(control, f"+{controller}")
            enabled.append(control)
        remove_stale(parent)
        path = os.path.join(parent, name)
        os.mkdir(path)
        file, value = setting or ("io.max", f"{major}:{minor} {key}={bps}")
        try:
            write(os.path.join(path, file), value)
        except OSError:
            os.rmdir(path)
            raise
    except OSError:
        undo()
        raise
    return Throttle(file, path, back, f"{description} ({path}/{file})", undo)


def cold_and_throttled(paths, cache_dir, mbps, name, read):
    """Evicts `paths` from the page cache, caps the job's reads of
    `cache_dir`'s disk at `mbps` (where the machine allows), runs `read`
    and lifts the cap; returns (what `read` returned, the throttle's
    description or why there is none)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    throttle, note = setup_throttle(cache_dir, mbps, name)
    if throttle:
        throttle.enter()
    try:
        return read(), throttle.description if throttle else note
    finally:
        if throttle:
            throttle.remove()


def setup_throttle(cache_dir, mbps, name, writes=False):
    """Returns (Throttle or None, a sentence saying what the job's reads, or
    with `writes` its writes, get)."""
    what = "writes" if writes else "reads"
    if mbps <= 0:
        return None, f"not throttled (--throttle-mbps 0): {what} run at the disk's own speed"
    if os.geteuid() != 0:
        return None, f"NOT throttled: creating a cgroup needs root; {what} run at the disk's own speed"
    disk = block_device(cache_dir)
    if disk is None:
        return None, (f"NOT throttled: {cache_dir} is not on a block device that a cgroup can throttle; "
                      f"{what} run at the disk's own speed")
    major, minor, dev_name = disk
    bps = int(mbps * 1e6)
    rule = f"{major}:{minor} {bps}"
    errors = []

    v1 = "/sys/fs/cgroup/blkio"
    v1_file = "blkio.throttle.write_bps_device" if writes else "blkio.throttle.read_bps_device"
    if os.path.exists(os.path.join(v1, v1_file)):
        rel = (own_cgroup("blkio") or "/").lstrip("/")
        parent = os.path.join(v1, rel) if rel else v1
        remove_stale(parent)
        path = os.path.join(parent, name)
        try:
            os.mkdir(path)
            try:
                write(os.path.join(path, v1_file), rule)
            except OSError:
                os.rmdir(path)
                raise
            return (Throttle("blkio", path, parent,
                             f"throttled to {mbps:g} MB/s on {dev_name} ({major}:{minor}) with cgroup v1 "
                             f"blkio ({path}/{v1_file})"), None)
        except OSError as e:
            errors.append(f"cgroup v1 blkio: {e}")

    mnt = cgroup2_mount()
    if mnt:
        try:
            with open(os.path.join(mnt, "cgroup.controllers")) as f:
                has_io = "io" in f.read().split()
        except OSError:
            has_io = False
        if not has_io:
            errors.append(f"cgroup v2 at {mnt}: the io controller is not available")
        else:
            own = os.path.join(mnt, (own_cgroup(None) or "/").lstrip("/")).rstrip("/")
            # The new cgroup goes next to ours. Its parent must pass the io
            # controller down, which cgroup v2 allows only if that parent holds
            # no processes itself (the root is exempt): try there, then the root.
            candidates = [os.path.dirname(own), mnt] if own != mnt.rstrip("/") else [mnt]
            for parent in dict.fromkeys(p.rstrip("/") or "/" for p in candidates):
                try:
                    return (setup_v2(parent, name, own, major, minor, ("wbps" if writes else "rbps"), bps,
                                     f"throttled to {mbps:g} MB/s on {dev_name} ({major}:{minor}) with "
                                     f"cgroup v2 io.max"), None)
                except OSError as e:
                    errors.append(f"cgroup v2 io under {parent}: {e}")
    if not errors:
        errors.append("no cgroup v1 blkio or cgroup v2 mount found")
    return None, "NOT throttled (" + "; ".join(errors) + f"): {what} run at the disk's own speed"


# ------------------------------------------------------------------- the job

class TimeUp(Exception):
    """--max-seconds has passed."""


def file_worker_loop(worker_id, paths, batches, index_queue, result_queue):
    """An io- or mmap-mode DataLoader worker: file indices in, batch
    summaries out. `batches(path)` yields (bytes, crc) per batch of the
    file; each batch message carries those bytes, and after a file a "file"
    message carries the file's bytes and when it was open."""
    while True:
        idx = index_queue.get()
        if idx is None:
            break
        opened = time.monotonic()
        file_bytes = 0
        for got, crc in batches(paths[idx]):
            file_bytes += got
            result_queue.put(("batch", worker_id, idx, got, crc))
        result_queue.put(("file", worker_id, idx, file_bytes, (opened, time.monotonic())))


def read_batches(batch_bytes):
    """io mode: a file's batches by read(2), the bytes being what the calls
    returned; the file is evicted first so that the reads go to the disk."""
    buf = bytearray(CHUNK)
    view = memoryview(buf)

    def batches(path):
        with open(path, "rb", buffering=0) as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            while True:
                got, crc = 0, 0
                while got < batch_bytes:
                    n = f.readinto(view[: min(CHUNK, batch_bytes - got)])  # read(2)
                    if not n:
                        break
                    crc = zlib.crc32(view[:n], crc)  # "decode" the batch, cheaply
                    got += n
                if got == 0:
                    return
                yield got, crc

    return batches


# --map-before-fork: the shards' mappings, made by the trainer, by path.
PREMAPPED = {}


def map_file(path):
    """Maps the (evicted) file and closes the descriptor at once, as numpy
    and torch do."""
    import mmap

    with open(path, "rb", buffering=0) as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        return mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)


class SharedMap:
    """A file mapped with mmap(2) and its descriptor closed at once, as
    pyarrow's memory map (datasets' Arrow tables) leaves it: processes forked
    later inherit the pages, not a descriptor. (Python's mmap keeps a dup
    of the descriptor, which the workers would inherit too.)"""

    PROT_READ, MAP_SHARED = 1, 1

    def __init__(self, path):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        fd = os.open(path, os.O_RDONLY)
        try:
            self.size = os.fstat(fd).st_size
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            self.addr = libc.mmap(None, self.size, self.PROT_READ, self.MAP_SHARED, fd, 0)
        finally:
            os.close(fd)
        if self.addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap {path}")

    def __len__(self):
        return self.size

    def __getitem__(self, s):
        start, stop = s.start, min(s.stop, self.size)
        return ctypes.string_at(self.addr + start, stop - start)


def mapped_batches(batch_bytes):
    """mmap mode: maps the file (or takes the trainer's mapping of it) and
    copies the batches out of the mapping; the pages come from the disk by
    page faults and read-ahead."""

    def batches(path):
        m = PREMAPPED.get(path) or map_file(path)
        done = 0
        while done < len(m):
            batch = m[done:done + batch_bytes]  # the copy faults the pages in
            done += len(batch)
            yield len(batch), zlib.crc32(batch)
        if path not in PREMAPPED:
            m.close()

    return batches


def decode(data, ms, seed):
    """'Decodes and augments' a batch held in memory: zlib and Python
    arithmetic for about `ms` milliseconds of this thread's CPU time."""
    end = time.thread_time() + ms / 1000.0
    crc = seed & 0xFFFFFFFF
    while True:
        crc = zlib.crc32(zlib.compress(data, 1), crc)
        for i in range(64):
            crc = (crc * 31 + i) & 0xFFFFFFFF
        if time.thread_time() >= end:
            return crc


def memory_loop(worker_id, data, decode_ms, index_queue, result_queue):
    """A cpu/healthy-mode worker: batch indices in, batches made from memory out."""
    while True:
        idx = index_queue.get()
        if idx is None:
            break
        crc = decode(data, decode_ms, idx)
        # With this thread's CPU time so far: ground truth for on-CPU time.
        result_queue.put(("batch", worker_id, idx, 0, (crc, time.thread_time())))


def worker_main(worker_id, args, paths, data, never, index_queue, result_queue):
    die_with_parent()
    set_comm("pt_data_worker")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer handles Ctrl-C
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if args.mode == "hang":
        never.wait()  # never set: blocks in futex, before reading anything
    if args.mode in FILE_MODES:
        batches = (read_batches if args.mode == "io" else mapped_batches)(args.batch_kb * 1024)
        file_worker_loop(worker_id, paths, batches, index_queue, result_queue)
    else:
        memory_loop(worker_id, data, args.decode_ms, index_queue, result_queue)


def compute(ms):
    """Pure-Python arithmetic for about `ms` milliseconds (the training step)."""
    end = time.perf_counter() + ms / 1000.0
    x = 0
    while time.perf_counter() < end:
        for i in range(200):
            x = (x * 31 + i) & 0xFFFFFFFF
    return x


class Job:
    """The trainer: starts the workers, feeds them indices, takes their batches."""

    def __init__(self, args, paths, throttle_note, started):
        self.args, self.paths, self.note = args, paths, throttle_note
        self.ctx = mp.get_context("fork")
        self.result_queue = self.ctx.Queue()
        self.never = self.ctx.Event()  # hang mode: nobody sets it
        # cpu/healthy: the "encoded samples", in memory (getrandom(2), no file).
        self.data = os.urandom(64 * 1024) if args.mode in ("cpu", "healthy", "checkpoint") else None
        # checkpoint mode: what was saved, and the time in writes and fsync.
        self.ckpt = {"count": 0, "bytes": 0, "write_s": 0.0, "sync_s": 0.0,
                     "path": os.path.join(args.cache_dir, f"ckpt-{os.getpid()}.bin")}
        self.deadline = None if args.max_seconds is None else started + args.max_seconds
        self.workers, self.index_queues, self.current, self.records = [], [], [], []
        self.t0 = self.t_end = None
        self.stopped = None
        self.total_bytes = self.batches = 0
        self.per_worker = [0] * args.workers
        self.epochs_done = 0

    # ----------------------------------------------------------- ground truth

    def cpu_limit_truth(self):
        """The CPU limit's cgroup and its cpu.stat now, or as last read once
        the cgroup is gone (None: no limit)."""
        c = getattr(self, "cpu_limit", None)
        if c is None:
            return None
        try:
            self.cpu_limit_read = {"cgroup": c.path, "cpus": self.args.cpu_limit, **cpu_stat(c.path)}
        except OSError:
            pass
        return getattr(self, "cpu_limit_read", None)

    def write_truth(self, changed_only=False):
        """Writes what the job did so far; with `changed_only` (the status
        checks of a waiting trainer), only if something but its own CPU time
        changed: rewriting the same record every few seconds would be output
        of a job that moves nothing, a heartbeat."""
        path = self.args.truth
        if not path:
            return
        obj = {
            "mode": self.args.mode,
            "trainer": os.getpid(),
            # The trainer main thread's CPU time so far (seconds).
            "trainer_cpu_s": time.thread_time(),
            "respawn": self.args.respawn,
            "epochs": self.args.epochs,
            "epochs_done": self.epochs_done,
            "start": self.t0,
            "end": self.t_end,
            "done": self.t_end is not None,
            "stopped": self.stopped,
            "workers": self.records,
            "read_bytes": self.total_bytes,
            "batches": self.batches,
            "files": self.paths,
            "throttle": self.note,
            "checkpoint": self.ckpt,
            "control_writes": CONTROL_WRITES,
            "cpu_limit": self.cpu_limit_truth(),
        }
        same = json.dumps({k: v for k, v in obj.items() if k != "trainer_cpu_s"}, sort_keys=True)
        if changed_only and same == getattr(self, "last_truth", None):
            return
        self.last_truth = same
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(obj, f)
        os.replace(tmp, path)

    # ---------------------------------------------------------------- workers

    def pause(self, seconds):
        if self.deadline is not None and time.monotonic() + seconds >= self.deadline:
            time.sleep(max(0.0, self.deadline - time.monotonic()))
            raise TimeUp
        time.sleep(seconds)

    def start_workers(self, epoch):
        a = self.args
        self.index_queues = [self.ctx.Queue() for _ in range(a.workers)]
        self.workers, self.current = [], []
        for w in range(a.workers):
            p = self.ctx.Process(target=worker_main, name=f"pt_data_worker_{w}", daemon=True,
                                 args=(w, a, self.paths, self.data, self.never, self.index_queues[w],
                                       self.result_queue))
            p.start()
            self.workers.append(p)
            rec = {"pid": p.pid, "id": w, "epoch": epoch, "read_bytes": 0, "batches": 0, "cpu_s": None,
                   "files": []}
            self.current.append(rec)
            self.records.append(rec)
        if self.t0 is None:
            self.t0 = time.monotonic()
        self.write_truth()

    def stop_workers(self):
        """Asks the workers to finish (they exit once their queue is drained)."""
        for q in self.index_queues:
            q.put(None)
        for p in self.workers:
            p.join(timeout=30)
        self.kill_workers()

    def kill_workers(self):
        for p in self.workers:
            if p.is_alive():
                p.kill()
                p.join()

    def receive(self):
        """The next message from a worker, as DataLoader waits for one: in
        slices of STATUS_CHECK_S, checking the workers in between."""
        while True:
            timeout = STATUS_CHECK_S
            if self.deadline is not None:
                left = self.deadline - time.monotonic()
                if left <= 0:
                    raise TimeUp
                timeout = min(timeout, left)
            try:
                return self.result_queue.get(timeout=timeout)
            except queue.Empty:
                dead = [p for p in self.workers if not p.is_alive()]
                if dead:
                    raise RuntimeError(f"DataLoader worker (pid {dead[0].pid}) exited unexpectedly "
                                       f"with code {dead[0].exitcode}")
                self.write_truth(changed_only=True)

    def take_batch(self, w, nbytes, cpu_s=None):
        rec = self.current[w]
        if cpu_s is not None:
            rec["cpu_s"] = cpu_s
        rec["read_bytes"] += nbytes
        rec["batches"] += 1
        self.total_bytes += nbytes
        self.per_worker[w] += nbytes
        self.batches += 1

    # ----------------------------------------------------------------- epochs

    def file_epoch(self):
        """io mode: every file once, handed out round-robin at the start."""
        for i in range(len(self.paths)):
            self.index_queues[i % self.args.workers].put(i)
        files_left = len(self.paths)
        while files_left:
            kind, w, idx, nbytes, extra = self.receive()
            if kind == "file":
                opened, closed = extra
                self.current[w]["files"].append(
                    {"path": self.paths[idx], "bytes": nbytes, "open_t": opened, "close_t": closed})
                files_left -= 1
                continue
            self.take_batch(w, nbytes)
            compute(self.args.compute_ms)

    def batch_epoch(self):
        """cpu/healthy/hang: --batches indices, --prefetch outstanding per worker."""
        a = self.args
        n, nxt = a.batches, 0
        for _ in range(a.prefetch):
            for q in self.index_queues:
                if nxt < n:
                    q.put(nxt)
                    nxt += 1
        done = 0
        while done < n:
            _kind, w, _idx, nbytes, (_crc, cpu_s) = self.receive()
            self.take_batch(w, nbytes, cpu_s)
            done += 1
            # As DataLoader does: the next index goes out before the step.
            if nxt < n:
                self.index_queues[w].put(nxt)
                nxt += 1
            compute(a.compute_ms)
            if a.mode == "checkpoint" and done % a.checkpoint_every == 0:
                self.checkpoint()

    def checkpoint(self):
        """Saves the "state" as torch.save with a safe rename does: written,
        fsync'd, renamed over the last one."""
        c, chunk = self.ckpt, os.urandom(CHUNK)
        tmp = c["path"] + ".tmp"
        t0 = time.monotonic()
        with open(tmp, "wb", buffering=0) as f:
            for _ in range(self.args.checkpoint_mb):
                c["bytes"] += f.write(chunk)
            t1 = time.monotonic()
            os.fsync(f.fileno())
            t2 = time.monotonic()
        os.replace(tmp, c["path"])
        c["count"] += 1
        c["write_s"] += t1 - t0
        c["sync_s"] += t2 - t1

    def run(self):
        a = self.args
        what = (f"read {a.epochs} x {len(self.paths)} files, {a.batch_kb} KiB batches ({a.mode} mode)"
                if a.mode in FILE_MODES else f"make {a.epochs} x {a.batches} batches ({a.mode} mode)")
        # Progress goes out before the PID line: once stall is attached, its
        # screen is the demo's output.
        log(f"trainer pid {os.getpid()} (comm 'trainer') starts {a.workers} workers (comm 'pt_data_worker') "
            f"in {a.start_delay:g} s to {what}")
        print(f"PID {os.getpid()}", flush=True)
        try:
            self.pause(a.start_delay)
            if a.import_s > 0:
                compute(a.import_s * 1000.0)
            if a.start_after:
                while not os.path.exists(a.start_after):
                    self.pause(0.02)
            epoch_fn = self.file_epoch if a.mode in FILE_MODES else self.batch_epoch
            for epoch in range(a.epochs):
                if a.respawn or epoch == 0:
                    self.start_workers(epoch)
                epoch_fn()
                self.epochs_done += 1
                if a.respawn:
                    self.stop_workers()
                self.write_truth()
            if not a.respawn:
                self.stop_workers()
            self.stopped = "completed"
        except TimeUp:
            self.stopped = "max-seconds"
            log(f"stopping after --max-seconds {a.max_seconds:g}")
        except KeyboardInterrupt:
            self.stopped = "interrupted"
            raise
        finally:
            self.kill_workers()
            self.t_end = time.monotonic()
            if self.stopped is None:
                self.stopped = "failed"
            self.write_truth()
        self.report()

    def report(self):
        secs = max(self.t_end - (self.t0 or self.t_end), 1e-9)
        if self.args.mode in FILE_MODES:
            rate = self.total_bytes / 1e6 / secs
            shares = " ".join(f"{b / 1e6 / secs:.0f}" for b in self.per_worker)
            print(f"workload: read {self.total_bytes / 1e9:.2f} GB in {self.batches} batches in {secs:.1f} s = "
                  f"{rate:.0f} MB/s (per worker MB/s: {shares}); reads {self.note}", flush=True)
        else:
            print(f"workload: {self.args.mode} mode: {self.batches} batches in {secs:.1f} s = "
                  f"{self.batches / secs:.1f} batches/s ({self.stopped})", flush=True)
        if self.ckpt["count"]:
            c = self.ckpt
            print(f"workload: {c['count']} checkpoints, {c['bytes'] / 1e6:.0f} MB: {c['write_s']:.1f} s writing, "
                  f"{c['sync_s']:.1f} s in fsync; writes {self.note}", flush=True)


def on_sigterm(_signum, _frame):
    raise KeyboardInterrupt  # stop the workers and remove the cgroup, as for Ctrl-C


def main(argv=None):
    started = time.monotonic()
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    throttle = None
    if args.mode in FILE_MODES:
        name = args.cgroup_name or f"stall-demo-{os.getpid()}"
        paths = generate(args.cache_dir, file_names(args.files), args.file_mb * 1_000_000)
        if args.prepare_only:
            return 0
        throttle, note = setup_throttle(args.cache_dir, args.throttle_mbps, name)
        if throttle:
            note = throttle.description
        log(f"job's disk reads: {note}")
        if not throttle and args.throttle_mbps > 0:
            log("on a fast disk an unthrottled job may hardly wait for its input (then it does not look "
                "input-bound)")
    elif args.mode == "checkpoint":
        paths = []
        os.makedirs(args.cache_dir, exist_ok=True)
        throttle, note = setup_throttle(args.cache_dir, args.throttle_mbps,
                                        args.cgroup_name or f"stall-demo-{os.getpid()}", writes=True)
        if throttle:
            note = throttle.description
        log(f"job's disk writes: {note}")
    else:
        paths, note = [], f"none: {args.mode} mode reads no files"
    limit = None
    if args.cpu_limit is not None:
        limit, cpu_note = setup_cpu_limit(args.cpu_limit, f"stall-demo-cpu-{os.getpid()}")
        log(f"job's CPU: {limit.description if limit else cpu_note}")
    set_comm("trainer")
    job = None
    try:
        # Before forking: the workers inherit the cgroups.
        for cgroup in (throttle, limit):
            if cgroup:
                cgroup.enter()
        if args.map_before_fork:
            PREMAPPED.update((p, SharedMap(p)) for p in paths)
        job = Job(args, paths, note, started)
        job.cpu_limit = limit
        job.run()
    except KeyboardInterrupt:
        log("interrupted; workers stopped")
        return 130
    finally:
        for cgroup in (limit, throttle):
            if cgroup:
                cgroup.remove()
        if args.mode == "checkpoint":
            with contextlib.suppress(OSError):
                os.remove(os.path.join(args.cache_dir, f"ckpt-{os.getpid()}.bin"))
        if job is not None:
            job.write_truth()  # with the writes that left the cgroups
    return 0


if __name__ == "__main__":
    sys.exit(main())
