#!/usr/bin/env python3
"""Jobs of shapes beyond "a trainer and its worker processes", for the
tests that follow what a trainer waits on (tests/tests/waits.rs). Standard
library only (the VMs carry nothing else). Each job writes its own truth as
JSON (--truth): pids, tids, bytes, what it waited on.

  loader-threads  a ThreadPoolExecutor-style pool of threads in the trainer
                  reads shards from storage throttled with a cgroup and
                  hands the main thread 1 MiB batches through a queue
  gil             a pure-Python metrics thread keeps the GIL; the main
                  thread makes short GIL-releasing calls and logs a line
                  per step
  deadlock        logs steps, then two of its threads take two locks in
                  opposite orders while the main thread joins one of them
  sleepy-workers  forked workers whose __getitem__ sleeps (a rate limit)
                  feed the trainer through a multiprocessing queue
  produce         a preprocessor on CPU writing 64 KiB records to stdout
                  (or --fifo: a named pipe)
  consume         a trainer reading those records from stdin or --fifo
                  (the two run as `sh -c "produce | consume"`)
  pipe-writer     prints 64 KiB per step to stdout (a pipe the test drains
                  slowly with slow-reader)
  upload          every few steps PUTs a checkpoint over HTTP to
                  slow-server, which takes the body at a set rate
  upload-thread   a thread PUTs a checkpoint to slow-server while the main
                  thread, done with its step, joins it
  stream-reader   no workers: the trainer reads its samples from a socket
                  that slow-source (outside the job) feeds at a set rate
  feature-server  outside the job: answers each request on a Unix socket
                  (--unix) or on 127.0.0.1 after computing it in Python,
                  or (--dir) with bytes read from cold files on storage
                  throttled with a cgroup
  feature-client  the trainer: asks feature-server for each step's
                  features and waits for the answer
  flock           logs a line, then waits in flock on a lock hold-lock holds
  eval-child      runs a CPU-bound evaluation subprocess every few steps
                  (--shell: through /bin/sh -c, which waits for it)
  upload-child    every few steps uploads a checkpoint to slow-server
                  with a subprocess (put) and waits for it (--parts N: the
                  subprocess sends N parts from N threads and joins them)
  timer-sleeper   sleeps 2 ms at a time while spinning processes keep the
                  CPUs busy (wakeups made in timer interrupts)
"""
import argparse
import ctypes
import fcntl
import http.client
import json
import multiprocessing as mp
import os
import queue
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "demo"))
import workload as demo  # noqa: E402  (the demo's shards and blkio throttle)

libc = ctypes.CDLL(None, use_errno=True)
PR_SET_NAME = 15
MIB = 1 << 20


def name_thread(name):
    libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def gettid():
    return threading.get_native_id()


def write_truth(path, obj):
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f)
    os.rename(path + ".tmp", path)


def announce():
    print(f"PID {os.getpid()}", flush=True)


# Pure-Python arithmetic for about `ms` milliseconds (a training step).
spin = demo.compute


# ------------------------------------------------------------ loader threads

def loader_threads(a):
    paths = [os.path.join(a.dir, n) for n in demo.file_names(a.files)]
    throttle, note = demo.setup_throttle(a.dir, a.mbps, f"stall-waits-{os.getpid()}")
    if throttle is None:
        sys.exit(f"loader-threads needs its reads throttled: {note}")
    throttle.enter()
    batches = queue.Queue(maxsize=8)
    read = {}
    tids = []
    lock = threading.Lock()

    def loader(mine):
        name_thread("loader")
        with lock:
            tids.append(gettid())
        for path in mine:
            fd = os.open(path, os.O_RDONLY)
            try:
                # Not from the page cache: every byte from the throttled disk.
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                total = 0
                while True:
                    chunk = os.read(fd, MIB)
                    if not chunk:
                        break
                    total += len(chunk)
                    batches.put(len(chunk))
            finally:
                os.close(fd)
            with lock:
                read[path] = total
        batches.put(None)

    try:
        pool = [threading.Thread(target=loader, args=(paths[i :: a.threads],)) for i in range(a.threads)]
        for t in pool:
            t.start()
        done, steps = 0, 0
        while done < len(pool):
            b = batches.get()
            if b is None:
                done += 1
                continue
            steps += 1
            spin(1)
        for t in pool:
            t.join()
    finally:
        throttle.remove()
    write_truth(a.truth, {"trainer": os.getpid(), "loaders": tids, "files": read, "steps": steps,
                          "throttle": throttle.description})


# ---------------------------------------------------------------------- GIL

def gil(a):
    stop = threading.Event()
    metrics_tid = []

    def metrics():
        name_thread("metrics")
        metrics_tid.append(gettid())
        x = 0
        while not stop.is_set():
            for i in range(1000):
                x = (x * 31 + i) & 0xFFFFFFFF

    t = threading.Thread(target=metrics)
    t.start()
    end = time.monotonic() + a.seconds
    steps = 0
    with open(a.log, "a") as log:
        while time.monotonic() < end:
            # Short calls that release the GIL, as a loop over small reads,
            # a C extension's quick kernels or a queue poll do.
            for _ in range(10):
                time.sleep(0.0001)
            log.write(f"step {steps}\n")
            log.flush()
            steps += 1
    stop.set()
    t.join()
    write_truth(a.truth, {"trainer": os.getpid(), "metrics": metrics_tid[0], "steps": steps})


# ----------------------------------------------------------------- deadlock

def deadlock(a):
    """Logs a step every 0.1 s, then its prefetch and writer threads take
    two locks in opposite orders and block each other for good; the main
    thread, done with its step, joins the prefetcher. Nothing moves until
    a watchdog ends the process --hang-s later (a real job would stay)."""
    first, second = threading.Lock(), threading.Lock()
    tids = {}
    both = threading.Barrier(2)

    def take(name, one, other):
        name_thread(name)
        tids[name] = gettid()
        with one:
            both.wait()  # each holds its first lock before either goes on
            with other:
                pass

    steps = 0
    with open(a.log, "a") as log:
        for _ in range(a.steps):
            time.sleep(0.1)
            log.write(f"step {steps}\n")
            log.flush()
            steps += 1
    prefetch = threading.Thread(target=take, args=("prefetch", first, second), daemon=True)
    writer = threading.Thread(target=take, args=("writer", second, first), daemon=True)
    prefetch.start()
    writer.start()
    while len(tids) < 2:
        time.sleep(0.01)
    # Written as the job hangs: nothing is written after.
    write_truth(a.truth, {"trainer": os.getpid(), "steps": steps, **tids})

    def watchdog():
        time.sleep(a.hang_s)
        os._exit(0)

    threading.Thread(target=watchdog, daemon=True).start()
    prefetch.join()


# ----------------------------------------------------------- sleepy workers

def sleepy_worker(q, items, nap):
    name_thread("pt_data_worker")
    for i in range(items):
        time.sleep(nap)  # a rate limit in __getitem__
        q.put(bytes(1024))
    q.put(None)


def sleepy_workers(a):
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    workers = [ctx.Process(target=sleepy_worker, args=(q, a.items, a.nap)) for _ in range(a.workers)]
    for w in workers:
        w.start()
    done, got = 0, 0
    while done < len(workers):
        b = q.get()
        if b is None:
            done += 1
        else:
            got += 1
    for w in workers:
        w.join()
    write_truth(a.truth, {"trainer": os.getpid(), "workers": [w.pid for w in workers], "batches": got})


# ----------------------------------------------------------------- pipeline

RECORD = 64 * 1024


def produce(a):
    """A preprocessor on CPU: each record takes --record-ms of pure Python
    work, then goes to stdout (a pipe to the trainer)."""
    out = open(a.fifo, "wb") if a.fifo else sys.stdout.buffer
    for _ in range(a.records):
        spin(a.record_ms)
        out.write(bytes(RECORD))
        out.flush()
    write_truth(a.truth, {"producer": os.getpid(), "records": a.records, "bytes": a.records * RECORD})


def consume(a):
    """The trainer at the pipeline's end: takes each record from stdin,
    steps on it briefly and logs the step."""
    got = 0
    source = open(a.fifo, "rb") if a.fifo else sys.stdin.buffer
    with open(a.log, "a") as log:
        while True:
            record = source.read(RECORD)
            if not record:
                break
            spin(1)
            got += len(record)
            log.write(f"step {got // RECORD}\n")
            log.flush()
    write_truth(a.truth, {"trainer": os.getpid(), "bytes": got})


# ------------------------------------------------------------- stdout, pipe

def pipe_writer(a):
    line = (b"x" * 1023 + b"\n") * (a.kib)
    out = sys.stdout.buffer
    written = 0
    start = time.monotonic()
    for _ in range(a.steps):
        spin(1)
        out.write(line)
        out.flush()
        written += len(line)
    write_truth(a.truth, {"trainer": os.getpid(), "bytes": written, "secs": time.monotonic() - start})


def slow_reader(a):
    write_truth(a.truth, {"reader": os.getpid()})
    chunk = max(1, int(a.kbps * 1000 / 100))
    fd = sys.stdin.fileno()
    while os.read(fd, chunk):
        time.sleep(0.01)


# ------------------------------------------------------------------- upload

def slow_server(a):
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # A small receive buffer, inherited by what it accepts: the sender
    # feels the server's pace, as with a slow object store.
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    write_truth(a.truth, {"server": os.getpid(), "port": srv.getsockname()[1]})
    chunk = max(1, int(a.kbps * 1000 / 100))
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=serve_slowly, args=(conn, chunk), daemon=True).start()


def serve_slowly(conn, chunk):
    buf = b""
    with conn:
        while True:
            while b"\r\n\r\n" not in buf:
                more = conn.recv(4096)
                if not more:
                    return
                buf += more
            head, buf = buf.split(b"\r\n\r\n", 1)
            length = 0
            for line in head.split(b"\r\n")[1:]:
                k, _, v = line.partition(b":")
                if k.strip().lower() == b"content-length":
                    length = int(v)
            got = len(buf)
            buf = b""
            while got < length:
                more = conn.recv(min(chunk, length - got))
                if not more:
                    return
                got += len(more)
                time.sleep(0.01)
            buf = b""
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")


def steps_with_uploads(a, upload_one):
    """--steps steps of 20 ms, each logged; every --every steps,
    upload_one(step) while the trainer waits. Returns the time waited."""
    waited = 0.0
    with open(a.log, "a") as log:
        for step in range(a.steps):
            spin(20)
            log.write(f"step {step}\n")
            log.flush()
            if step % a.every == a.every - 1:
                t0 = time.monotonic()
                upload_one(step)
                waited += time.monotonic() - t0
    return waited


def upload(a):
    body = os.urandom(a.mb * MIB)
    conn = http.client.HTTPConnection("127.0.0.1", a.port)
    uploads = []

    def put_one(step):
        conn.request("PUT", f"/ckpt/{step}", body=body)
        conn.getresponse().read()
        uploads.append(step)

    waited = steps_with_uploads(a, put_one)
    write_truth(a.truth, {"trainer": os.getpid(), "uploads": len(uploads), "bytes": len(uploads) * len(body),
                          "upload_s": waited, "port": a.port})


def upload_thread(a):
    body = os.urandom(a.mb * MIB)
    done = {}

    def put():
        name_thread("ckpt-upload")
        done["tid"] = gettid()
        conn = http.client.HTTPConnection("127.0.0.1", a.port)
        conn.request("PUT", "/ckpt/last", body=body)
        conn.getresponse().read()

    spin(200)
    t0 = time.monotonic()
    uploader = threading.Thread(target=put)
    uploader.start()
    uploader.join()
    write_truth(a.truth, {"trainer": os.getpid(), "uploader": done["tid"], "bytes": len(body),
                          "upload_s": time.monotonic() - t0, "port": a.port})


# ------------------------------------------------------------------- stream

def slow_source(a):
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    write_truth(a.truth, {"source": os.getpid(), "port": srv.getsockname()[1]})
    # 20 chunks a second: few enough that a slow machine's Python keeps up.
    chunk = max(1, int(a.kbps * 1000 / 20))
    while True:
        conn, _ = srv.accept()
        with conn:
            conn.recv(16)
            try:
                for _ in range(a.chunks):
                    conn.sendall(b"s" * chunk)
                    time.sleep(0.05)
            except OSError:
                pass


def stream_reader(a):
    sock = socket.create_connection(("127.0.0.1", a.port))
    sock.sendall(b"GO\n")
    got, start = 0, time.monotonic()
    while True:
        more = sock.recv(64 * 1024)
        if not more:
            break
        got += len(more)
        spin(1)
    write_truth(a.truth, {"trainer": os.getpid(), "bytes": got, "secs": time.monotonic() - start,
                          "port": a.port})


# ----------------------------------------------------------- feature server

def feature_server(a):
    if a.unix:
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(a.unix)
        where = {"path": a.unix}
    else:
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        where = {"port": srv.getsockname()[1]}
    srv.listen(4)
    answer = a.answer_kib * 1024
    throttle, paths = None, []
    if a.dir:
        paths = [os.path.join(a.dir, n) for n in demo.file_names(a.files)]
        throttle, note = demo.setup_throttle(a.dir, a.mbps, f"stall-featsrv-{os.getpid()}")
        if throttle is None:
            sys.exit(f"feature-server --dir needs its reads throttled: {note}")
        throttle.enter()
    write_truth(a.truth, {"server": os.getpid(), **where})
    read = [0]

    def cold_answer(k):
        # Each answer from the next file, never from the page cache.
        path = paths[k % len(paths)]
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            data = os.pread(fd, answer, (k // len(paths)) * answer)
        finally:
            os.close(fd)
        read[0] += len(data)
        return data.ljust(answer, b"\0")

    try:
        k = 0
        while True:
            conn, _ = srv.accept()
            with conn:
                f = conn.makefile("rb")
                while f.readline():
                    if paths:
                        body = cold_answer(k)
                    else:
                        spin(a.answer_ms)
                        body = bytes(answer)
                    k += 1
                    conn.sendall(body)
    finally:
        if throttle is not None:
            throttle.remove()


def feature_client(a):
    if a.unix:
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(a.unix)
    else:
        sock = socket.create_connection(("127.0.0.1", a.port))
    answer = a.answer_kib * 1024
    got, start = 0, time.monotonic()
    with open(a.log, "a") as log:
        for step in range(a.steps):
            sock.sendall(b"features\n")
            want = answer
            while want:
                more = sock.recv(want)
                if not more:
                    sys.exit("the feature server hung up")
                want -= len(more)
                got += len(more)
            spin(1)
            log.write(f"step {step}\n")
            log.flush()
    write_truth(a.truth, {"trainer": os.getpid(), "bytes": got, "steps": a.steps,
                          "secs": time.monotonic() - start})


# --------------------------------------------------------------------- flock

def hold_lock(a):
    fd = os.open(a.lock, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    write_truth(a.truth, {"holder": os.getpid()})
    announce()
    while True:
        time.sleep(60)


def flock_job(a):
    announce()
    with open(a.log, "a") as log:
        log.write("building the extension\n")
        log.flush()
    fd = os.open(a.lock, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # blocks while hold-lock lives


# ---------------------------------------------------------------- eval child

EVAL = "import time\nend = time.perf_counter() + {s}\nx = 0\nwhile time.perf_counter() < end:\n    x = (x * 31 + 1) & 0xFFFF\n"


def eval_child(a):
    children, waited = [], 0.0
    cmd = [sys.executable, "-c", EVAL.format(s=a.eval_s)]
    if a.shell:
        # As `os.system` or a launcher script runs it: a shell that waits
        # for the evaluation (the `; exit` keeps it from exec'ing it).
        cmd = ["/bin/sh", "-c", " ".join(f"'{x}'" for x in cmd) + '; exit "$?"']
    for step in range(a.steps):
        spin(a.step_ms)
        if step % a.every == a.every - 1:
            t0 = time.monotonic()
            p = subprocess.Popen(cmd)
            children.append(p.pid)
            p.wait()
            waited += time.monotonic() - t0
    write_truth(a.truth, {"trainer": os.getpid(), "children": children, "wait_s": waited})


def upload_child(a):
    """Every --every steps, uploads a checkpoint with a subprocess (`put`)
    and waits for it, as a trainer calling a CLI uploader does."""
    children = []

    def run_put(_step):
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "put",
                              "--port", str(a.port), "--mb", str(a.mb), "--parts", str(a.parts)])
        children.append(p.pid)
        if p.wait() != 0:
            raise SystemExit("waits: the upload failed")

    waited = steps_with_uploads(a, run_put)
    write_truth(a.truth, {"trainer": os.getpid(), "children": children, "bytes": len(children) * a.mb * MIB,
                          "upload_s": waited, "port": a.port})


def put(a):
    """PUTs --mb MiB: in one request, or --parts requests from as many
    threads that the main thread joins (a multipart upload)."""
    name_thread("ckpt-put")
    body = os.urandom(a.mb * MIB)

    def put_part(k):
        conn = http.client.HTTPConnection("127.0.0.1", a.port)
        part = len(body) // a.parts
        end = len(body) if k == a.parts - 1 else (k + 1) * part
        conn.request("PUT", f"/ckpt/last.part{k}", body=body[k * part:end])
        conn.getresponse().read()

    if a.parts == 1:
        return put_part(0)
    parts = [threading.Thread(target=put_part, args=(k,)) for k in range(a.parts)]
    for t in parts:
        t.start()
    for t in parts:
        t.join()


# ------------------------------------------------------------- timer wakeups

def spinner(seconds):
    name_thread("spinner")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        spin(10)


def timer_sleeper(a):
    """Sleeps `sleeps` times 2 ms while `spinners` processes keep the CPUs
    busy: each sleep ends in a timer interrupt, often on a spinner's CPU."""
    ctx = mp.get_context("fork")
    spinners = [ctx.Process(target=spinner, args=(a.sleeps * 0.004 + 2,)) for _ in range(a.spinners)]
    for p in spinners:
        p.start()
    time.sleep(0.5)
    for _ in range(a.sleeps):
        time.sleep(0.002)
    write_truth(a.truth, {"sleeper": gettid(), "spinners": [p.pid for p in spinners], "sleeps": a.sleeps})
    for p in spinners:
        p.kill()
        p.join()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="job", required=True)

    s = sub.add_parser("loader-threads")
    s.add_argument("--dir", required=True)
    s.add_argument("--files", type=int, default=8)
    s.add_argument("--mbps", type=float, default=16)
    s.add_argument("--threads", type=int, default=4)
    s.set_defaults(fn=loader_threads)

    s = sub.add_parser("gil")
    s.add_argument("--log", required=True)
    s.add_argument("--seconds", type=float, default=5)
    s.set_defaults(fn=gil)

    s = sub.add_parser("deadlock")
    s.add_argument("--log", required=True)
    s.add_argument("--steps", type=int, default=10)
    s.add_argument("--hang-s", type=float, default=12)
    s.set_defaults(fn=deadlock)

    s = sub.add_parser("sleepy-workers")
    s.add_argument("--workers", type=int, default=2)
    s.add_argument("--items", type=int, default=40)
    s.add_argument("--nap", type=float, default=0.1)
    s.set_defaults(fn=sleepy_workers)

    s = sub.add_parser("pipe-writer")
    s.add_argument("--steps", type=int, default=100)
    s.add_argument("--kib", type=int, default=64)
    s.set_defaults(fn=pipe_writer)

    s = sub.add_parser("produce")
    s.add_argument("--records", type=int, default=100)
    s.add_argument("--record-ms", type=float, default=30)
    s.add_argument("--fifo")
    s.set_defaults(fn=produce)

    s = sub.add_parser("consume")
    s.add_argument("--log", required=True)
    s.add_argument("--fifo")
    s.set_defaults(fn=consume)

    s = sub.add_parser("slow-reader")
    s.add_argument("--kbps", type=float, default=1600)
    s.set_defaults(fn=slow_reader)

    s = sub.add_parser("slow-server")
    s.add_argument("--kbps", type=float, default=4000)
    s.set_defaults(fn=slow_server)

    s = sub.add_parser("upload")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--log", required=True)
    s.add_argument("--mb", type=int, default=8)
    s.add_argument("--steps", type=int, default=12)
    s.add_argument("--every", type=int, default=4)
    s.set_defaults(fn=upload)

    s = sub.add_parser("upload-thread")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--mb", type=int, default=16)
    s.set_defaults(fn=upload_thread)
    s = sub.add_parser("slow-source")
    s.add_argument("--kbps", type=float, required=True)
    s.add_argument("--chunks", type=int, default=80)
    s.set_defaults(fn=slow_source)
    s = sub.add_parser("stream-reader")
    s.add_argument("--port", type=int, required=True)
    s.set_defaults(fn=stream_reader)
    s = sub.add_parser("feature-server")
    s.add_argument("--unix")
    s.add_argument("--answer-ms", type=float, default=40)
    s.add_argument("--answer-kib", type=int, default=16)
    s.add_argument("--dir")
    s.add_argument("--files", type=int, default=8)
    s.add_argument("--mbps", type=float, default=4)
    s.set_defaults(fn=feature_server)
    s = sub.add_parser("feature-client")
    s.add_argument("--unix")
    s.add_argument("--port", type=int)
    s.add_argument("--answer-kib", type=int, default=16)
    s.add_argument("--steps", type=int, default=150)
    s.add_argument("--log", required=True)
    s.set_defaults(fn=feature_client)
    s = sub.add_parser("hold-lock")
    s.add_argument("--lock", required=True)
    s.set_defaults(fn=hold_lock)

    s = sub.add_parser("flock")
    s.add_argument("--lock", required=True)
    s.add_argument("--log", required=True)
    s.set_defaults(fn=flock_job)

    s = sub.add_parser("eval-child")
    s.add_argument("--steps", type=int, default=12)
    s.add_argument("--every", type=int, default=4)
    s.add_argument("--step-ms", type=float, default=50)
    s.add_argument("--eval-s", type=float, default=1.5)
    s.add_argument("--shell", action="store_true", help="run the evaluation through /bin/sh -c")
    s.set_defaults(fn=eval_child)

    s = sub.add_parser("upload-child")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--log", required=True)
    s.add_argument("--mb", type=int, default=8)
    s.add_argument("--steps", type=int, default=8)
    s.add_argument("--every", type=int, default=4)
    s.add_argument("--parts", type=int, default=1)
    s.set_defaults(fn=upload_child)

    s = sub.add_parser("put")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--mb", type=int, default=8)
    s.add_argument("--parts", type=int, default=1)
    s.set_defaults(fn=put)

    s = sub.add_parser("timer-sleeper")
    s.add_argument("--sleeps", type=int, default=500)
    s.add_argument("--spinners", type=int, default=2)
    s.set_defaults(fn=timer_sleeper)

    for s in sub.choices.values():
        s.add_argument("--truth", required=s.prog.split()[-1] not in ("flock", "put"))
    a = p.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
