#!/usr/bin/env python3
"""Workloads with known ground truth for stall's integration tests.

Each job writes what it did (tids, byte counts, measured durations) as JSON
to the path in $TRUTH, so tests compare stall's figures with the job's own.
"""
import ctypes
import json
import mmap
import os
import resource
import select
import signal
import sys
import threading
import time

libc = ctypes.CDLL(None, use_errno=True)
PR_SET_NAME = 15


def name_thread(name):
    libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def write_truth(obj):
    path = os.environ.get("TRUTH")
    if path:
        with open(path + ".tmp", "w") as f:
            json.dump(obj, f)
        os.rename(path + ".tmp", path)


def cap_eff():
    """This process's effective capabilities (CapEff of /proc/self/status)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return None


def run_together(start, *fns):
    """Runs `fns` on threads of their own, released together by the barrier
    `start` (one party each, plus this thread), and waits for them. Returns
    when each join returned (monotonic s): no later than that, the thread
    had ended."""
    threads = [threading.Thread(target=f) for f in fns]
    for t in threads:
        t.start()
    start.wait()
    joined = []
    for t in threads:
        t.join()
        joined.append(time.monotonic())
    return joined


def make_file(path, size):
    with open(path, "wb") as f:
        f.write(os.urandom(size))


def read_fd(fd, chunk):
    """Reads fd to its end with read(2); returns bytes read."""
    total = 0
    while True:
        n = len(os.read(fd, chunk))
        if n == 0:
            return total
        total += n


def read_with(path, how, chunk):
    """Reads the whole file with one syscall family; returns bytes read."""
    fd = os.open(path, os.O_RDONLY)
    total = 0
    try:
        while True:
            if how == "read":
                n = len(os.read(fd, chunk))
            elif how == "pread":
                n = len(os.pread(fd, chunk, total))
            elif how == "readv":
                bufs = [bytearray(chunk // 2), bytearray(chunk - chunk // 2)]
                n = os.readv(fd, bufs)
            elif how == "preadv":
                bufs = [bytearray(chunk // 3), bytearray(chunk - chunk // 3)]
                n = os.preadv(fd, bufs, total)
            else:
                raise SystemExit(f"unknown read kind {how}")
            if n == 0:
                break
            total += n
    finally:
        os.close(fd)
    return total


def job_exact(args):
    """Reads one file fully in odd-sized chunks; exits with the given code."""
    path, chunk, code = args[0], int(args[1]), int(args[2])
    total = read_with(path, "read", chunk)
    write_truth({"pid": os.getpid(), "bytes": total, "uid": os.getuid(), "cap_eff": cap_eff()})
    sys.exit(code)


def job_grandchild(args):
    """The child forks after a pause; the grandchild reads the file."""
    path = args[0]
    time.sleep(0.3)
    pid = os.fork()
    if pid == 0:
        gc = os.fork()
        if gc == 0:
            total = read_with(path, "read", 7777)
            write_truth({"grandchild": os.getpid(), "bytes": total})
            os._exit(0)
        os.waitpid(gc, 0)
        os._exit(0)
    os.waitpid(pid, 0)


def job_family(args):
    """N workers read their own files with read/pread/readv/preadv and send
    results to the parent over a pipe (which must not count as file reads)."""
    files = args
    kinds = ["read", "pread", "readv", "preadv"]
    chunks = [4093, 10007, 65537, 33331]
    r, w = os.pipe()
    pids = {}
    for i, path in enumerate(files):
        pid = os.fork()
        if pid == 0:
            os.close(r)
            name_thread(f"worker{i}")
            total = read_with(path, kinds[i % 4], chunks[i % 4])
            msg = json.dumps({"pid": os.getpid(), "path": path, "bytes": total}).encode()
            # Pad so the parent reads a fair amount of pipe data.
            os.write(w, msg.ljust(4000) + b"\n")
            os._exit(0)
        pids[pid] = path
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 512)
        if not chunk:
            break
        data += chunk
    for pid in pids:
        os.waitpid(pid, 0)
    results = [json.loads(line) for line in data.split(b"\n") if line.strip()]
    write_truth({"parent": os.getpid(), "pipe_bytes": len(data), "workers": results})


def job_waits(args):
    """One thread blocked on a futex, one in poll on a pipe, one burning CPU,
    each for `secs`; reports tids and measured times."""
    secs = float(args[0])
    truth = {}
    lock = threading.Lock()
    lock.acquire()
    r, w = os.pipe()
    start = threading.Barrier(4)

    def run_delay():
        """This thread's runqueue-wait total so far (kernel schedstat), s."""
        try:
            with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
                return int(f.read().split()[1]) / 1e9
        except OSError:
            return None

    def blocked(key, t0, rd0):
        # The wall time of a wait includes the wait for a CPU after the
        # wakeup (long when the CPUs are busy), which stall counts as
        # runqueue: the kernel's own runqueue total over the same span says
        # how much.
        truth[key + "_s"] = time.monotonic() - t0
        rd1 = run_delay()
        # 6.12's delayed dequeue can leave a sleeping task queued, and its
        # run_delay then grows through the sleep itself (seen: 1.99 s of a
        # 2 s futex wait): a total above half the wait is not a CPU wait.
        if rd0 is not None and rd1 is not None and rd1 - rd0 <= truth[key + "_s"] / 2:
            truth[key + "_blocked_s"] = truth[key + "_s"] - (rd1 - rd0)

    def futexer():
        name_thread("futexer")
        truth["futex_tid"] = threading.get_native_id()
        # The barrier is a futex wait too (long when the CPUs are busy and
        # the other threads are slow to start): counted from before it.
        rd0 = run_delay()
        t0 = time.monotonic()
        start.wait()
        lock.acquire(timeout=secs)
        blocked("futex", t0, rd0)

    def poller():
        name_thread("poller")
        truth["poll_tid"] = threading.get_native_id()
        p = select.poll()
        p.register(r, select.POLLIN)
        start.wait()
        rd0 = run_delay()
        t0 = time.monotonic()
        p.poll(secs * 1000)
        blocked("poll", t0, rd0)

    def burner():
        name_thread("burner")
        truth["burn_tid"] = threading.get_native_id()
        start.wait()
        t0 = time.monotonic()
        c0 = time.thread_time()
        x = 0
        while time.monotonic() - t0 < secs:
            for i in range(10000):
                x += i
        # The thread's whole CPU time (it is cumulative from the thread's
        # start), as stall counts it, not just the loop's: under emulation
        # the thread's start-up is a few percent of it.
        truth["burn_cpu_s"] = time.thread_time()
        truth["burn_loop_cpu_s"] = time.thread_time() - c0
        truth["burn_wall_s"] = time.monotonic() - t0
        # The kernel's own totals for this thread since it was created
        # (on-CPU and runqueue-wait ns), when it keeps them.
        try:
            with open(f"/proc/self/task/{truth['burn_tid']}/schedstat") as f:
                run_ns, wait_ns = f.read().split()[:2]
            truth["burn_sched_s"] = int(run_ns) / 1e9
            truth["burn_runq_s"] = int(wait_ns) / 1e9
        except OSError:
            pass
        truth["burn_read_t"] = time.monotonic()

    spawned = time.monotonic()
    joined = run_together(start, futexer, poller, burner)
    # The futexer also waits for the GIL (a futex) before its window opens
    # and after it closes, which stall rightly counts: its whole life bounds
    # what the window missed.
    truth["futex_life_s"] = joined[0] - spawned
    # The thread runs on after those reads (its teardown; under emulation,
    # with every CPU busy, tens of ms in the runqueue and on CPU), and stall
    # counts it to its end: its totals lie between the reads and the reads
    # plus this tail.
    truth["burn_tail_s"] = joined[2] - truth["burn_read_t"]
    write_truth(truth)


def job_wake(args):
    """A sleeper blocks on an event that a named waker thread sets."""
    delay = float(args[0])
    ev = threading.Event()
    truth = {}

    def sleeper():
        name_thread("sleeper")
        truth["sleeper_tid"] = threading.get_native_id()
        ev.wait()

    def waker():
        name_thread("waker")
        truth["waker_tid"] = threading.get_native_id()
        time.sleep(delay)
        ev.set()

    ts = [threading.Thread(target=sleeper), threading.Thread(target=waker)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    write_truth(truth)


def job_pingpong(args):
    """Two processes on one CPU hand a byte back and forth over two pipes.
    The ping blocks in its read until the pong writes, at most once a
    round; the kernel counts each block (a voluntary context switch)."""
    rounds = int(args[0])
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    to_pong, from_ping = os.pipe()
    from_pong, to_ping = os.pipe()
    pong = os.fork()
    if pong == 0:
        name_thread("pong")
        for _ in range(rounds):
            os.read(to_pong, 1)
            os.write(to_ping, b"x")
        os._exit(0)
    name_thread("ping")
    blocked = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
    for _ in range(rounds):
        os.write(from_ping, b"x")
        os.read(from_pong, 1)
    blocked = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - blocked
    os.waitpid(pong, 0)
    write_truth({"ping_tid": os.getpid(), "pong_tid": pong, "rounds": rounds, "blocked": blocked})


def job_wait_for(args):
    """A waiter that waits, in turn, for each of two feeder processes and
    for its own sleeps. Each round it tells a feeder to go (a byte on the
    feeder's pipe) and blocks reading the feeder's answer, which comes
    after the feeder slept its delay; then it sleeps. It measures how long
    each wait took: the time stall must give to whoever ended it (each
    feeder; the kernel's timer for the sleeps), and to the pipe it read
    (each feeder's answers come on a pipe of their own)."""
    rounds, slow, fast, nap = int(args[0]), float(args[1]), float(args[2]), float(args[3])
    feeders = {}
    for name, delay in (("feed-slow", slow), ("feed-fast", fast)):
        go_r, go_w = os.pipe()
        data_r, data_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            name_thread(name)
            for _ in range(rounds):
                os.read(go_r, 1)
                time.sleep(delay)
                os.write(data_w, b"x")
            os._exit(0)
        feeders[name] = {"pid": pid, "go": go_w, "data": data_r, "waited_s": 0.0}
    name_thread("waiter")
    slept = 0.0
    for _ in range(rounds):
        for f in feeders.values():
            os.write(f["go"], b"g")
            t0 = time.monotonic()
            os.read(f["data"], 1)
            f["waited_s"] += time.monotonic() - t0
        t0 = time.monotonic()
        time.sleep(nap)
        slept += time.monotonic() - t0
    for f in feeders.values():
        os.waitpid(f["pid"], 0)
    write_truth(
        {
            "waiter_tid": os.getpid(),
            "slept_s": slept,
            "feeders": {
                n: {"pid": f["pid"], "fd": f["data"], "waited_s": f["waited_s"]} for n, f in feeders.items()
            },
        }
    )


def job_exec(args):
    """Forks a child that execs a fresh python which reads the file."""
    path = args[0]
    pid = os.fork()
    if pid == 0:
        os.execv(sys.executable, [sys.executable, __file__, "exact", path, "5555", "0"])
    os.waitpid(pid, 0)


def job_many_opens(args):
    """Opens and closes a file many times, fast (floods the ring buffer)."""
    path, n = args[0], int(args[1])
    for _ in range(n):
        os.close(os.open(path, os.O_RDONLY))


def wait_go(arg):
    """A number: sleep that long. A path: wait until it exists (the test
    creates it once stall has attached, however long its start-up took)."""
    try:
        time.sleep(float(arg))
        return
    except ValueError:
        pass
    deadline = time.monotonic() + 300
    while not os.path.exists(arg):
        if time.monotonic() > deadline:
            sys.exit(f"{arg} never appeared")
        time.sleep(0.01)


def job_idle_then_read(args):
    """Announces itself, waits (attach happens now), then forks a reader."""
    path, pause = args[0], args[1]
    print(os.getpid(), flush=True)
    wait_go(pause)
    pid = os.fork()
    if pid == 0:
        total = read_with(path, "pread", 9999)
        write_truth({"reader": os.getpid(), "bytes": total})
        os._exit(0)
    os.waitpid(pid, 0)
    time.sleep(0.3)


def job_reader_loop(args):
    """Reads a file over and over until killed (a process outside the job)."""
    path = args[0]
    print(os.getpid(), flush=True)
    while True:
        read_with(path, "read", 65536)
        time.sleep(0.01)


def job_open_before(args):
    """Opens the file, announces itself (attach happens now), then reads it."""
    path, pause = args[0], args[1]
    fd = os.open(path, os.O_RDONLY)
    print(os.getpid(), flush=True)
    wait_go(pause)
    total = read_fd(fd, 8191)
    os.close(fd)
    write_truth({"pid": os.getpid(), "bytes": total, "fd": fd})


def job_reuse(args):
    """Opens, reads and closes each file in turn: they all get the same fd."""
    fds, totals = [], {}
    for path in args:
        fd = os.open(path, os.O_RDONLY)
        fds.append(fd)
        totals[path] = read_fd(fd, 3001)
        os.close(fd)
    write_truth({"pid": os.getpid(), "fds": fds, "bytes": totals})


def job_mapped_after_temp(args):
    """`rounds` times: opens a data file by a path relative to the working
    directory (DIR), maps it, touches every page and closes it; then at
    once creates a temporary file, which takes the data file's descriptor
    number, unlinks it and keeps it open. Lives on a second with the
    temporary files open, so that each data file's open is looked at while
    its number is a temporary file's: its pages must count under its own
    path, none under a temporary file's."""
    dir, rounds = args[0], int(args[1])
    os.chdir(dir)
    files, pairs, temporaries = {}, [], []
    for i in range(rounds):
        name = f"data-{i}.bin"
        size = 256 * 1024 + 4096 * i
        make_file(name, size)
        files[os.path.join(dir, name)] = size
        fd = os.open(name, os.O_RDONLY)
        with mmap.mmap(fd, size, prot=mmap.PROT_READ) as m:
            sum(m[o] for o in range(0, size, 4096))
        os.close(fd)
        tmp = os.path.join(dir, f"tmp-{i}")
        temporaries.append(os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(tmp)
        pairs.append((fd, temporaries[-1]))
    time.sleep(1)
    for fd in temporaries:
        os.close(fd)
    write_truth({"pid": os.getpid(), "pairs": pairs, "files": files})


class Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_char_p), ("len", ctypes.c_size_t)]


def pwritev(fd, bufs, offset):
    """pwritev(2) itself, through libc (os.pwritev calls pwritev2)."""
    iov = (Iovec * len(bufs))(*[Iovec(b, len(b)) for b in bufs])
    n = libc.pwritev(fd, iov, len(bufs), ctypes.c_long(offset))
    if n < 0:
        raise OSError(ctypes.get_errno(), "pwritev")
    return n


def job_writes(args):
    """A writer thread writes known byte counts to two files with write,
    pwrite, writev, pwritev and pwritev2 (odd sizes; one failed write on a
    read-only descriptor, which must not count), then to both in turn with
    reads of the first between, as a copy loop does; a printer thread writes
    lines to stdout and stderr, whatever they are (pipe or file)."""
    path_a, path_b = args[0], args[1]
    truth = {
        "pid": os.getpid(),
        "files": {path_a: 0, path_b: 0},
        "calls": {path_a: 0, path_b: 0},
        "reads": {path_a: 0, path_b: 0},
    }
    start = threading.Barrier(3)

    def writer():
        name_thread("writer")
        truth["writer_tid"] = threading.get_native_id()
        start.wait()
        fa = os.open(path_a, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        fb = os.open(path_b, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        ro = os.open(path_a, os.O_RDONLY)

        def done(path, n):
            truth["files"][path] += n
            truth["calls"][path] += 1

        for i in range(7):
            done(path_a, os.write(fa, b"a" * (1001 + i)))
        off = 0
        for i in range(5):
            n = os.pwrite(fb, b"b" * 2003, off)
            off += n
            done(path_b, n)
        for i in range(3):
            done(path_a, os.writev(fa, [b"c" * 333, b"d" * 4444]))
        for i in range(4):
            n = pwritev(fb, [b"e" * 55, b"f" * 6666, b"g" * 7], off)
            off += n
            done(path_b, n)
        # Python's os.pwritev is pwritev2.
        n = os.pwritev(fb, [b"h" * 12345], off, os.RWF_DSYNC)
        off += n
        done(path_b, n)
        # A copy loop's pattern: the two descriptors in turn, with reads
        # between (stall caches the last written descriptor apart from the
        # last read one).
        for i in range(6):
            done(path_a, os.write(fa, b"i" * (77 + i)))
            truth["reads"][path_a] += len(os.pread(ro, 64, 0))
            n = os.pwrite(fb, b"j" * (99 + i), off)
            off += n
            done(path_b, n)
        try:
            os.write(ro, b"refused")
            raise SystemExit("a write on a read-only descriptor succeeded")
        except OSError:
            pass
        for fd in (fa, fb, ro):
            os.close(fd)

    def printer():
        name_thread("printer")
        truth["printer_tid"] = threading.get_native_id()
        start.wait()
        out = err = 0
        for i in range(40):
            out += os.write(1, f"step {i} loss {1.0 / (i + 1):.6f}\n".encode())
            if i % 10 == 0:
                err += os.write(2, f"warning at step {i}\n".encode())
        truth["stdout_bytes"] = out
        truth["stderr_bytes"] = err

    run_together(start, writer, printer)
    write_truth(truth)


def log_line(log, step):
    log.write(f"step {step} loss {1.0 / (step + 1):.4f}\n")
    log.flush()


def job_log_then_hang(args):
    """A trainer that logs `lines` steps to `log`, one every `every` s, then
    blocks forever in a futex (an Event nobody sets), as a training loop
    stuck behind a wedged GPU does. Announces its pid, and writes it to
    $PID_FILE (the scripted GPU lists it as holding a context)."""
    log_path, lines, every = args[0], int(args[1]), float(args[2])
    pid_file = os.environ.get("PID_FILE")
    if pid_file:
        with open(pid_file, "w") as f:
            f.write(str(os.getpid()))
    print(os.getpid(), flush=True)
    stuck = threading.Event()
    with open(log_path, "a") as log:
        for step in range(lines):
            log_line(log, step)
            stuck.wait(every)
        write_truth({"last_write": time.time(), "pid": os.getpid()})
        stuck.wait()  # the hang: Python stack tests look for this line


def job_log_every(args):
    """A healthy trainer that waits on its GPU (a futex, as a blocking CUDA
    synchronize does) and logs a line every `every` s, for `secs` s."""
    log_path, every, secs = args[0], float(args[1]), float(args[2])
    pid_file = os.environ.get("PID_FILE")
    if pid_file:
        with open(pid_file, "w") as f:
            f.write(str(os.getpid()))
    synchronize = threading.Event()
    end = time.monotonic() + secs
    step = 0
    with open(log_path, "a") as log:
        while time.monotonic() < end:
            log_line(log, step)
            step += 1
            synchronize.wait(min(every, max(0.0, end - time.monotonic())))
    write_truth({"steps": step})


def job_signals(args):
    """Counts SIGINT, SIGTERM and SIGHUP; exits with status 3 once 0.7 s
    have passed since the first SIGINT or SIGTERM (time for a second
    delivery to show). Creates $TRUTH.ready once its handlers are in."""
    counts = {"INT": 0, "TERM": 0, "HUP": 0}
    first = []

    def on(sig, _frame):
        name = signal.Signals(sig).name[3:]
        counts[name] += 1
        if name != "HUP" and not first:
            first.append(time.monotonic())

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on)
    open(os.environ["TRUTH"] + ".ready", "w").close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (first and time.monotonic() - first[0] > 0.7):
        time.sleep(0.05)
    write_truth({"pid": os.getpid(), "pgid": os.getpgrp(), "counts": counts})
    sys.exit(3)


def job_brief(args):
    """Forks three children that live half as long, lives `secs`, exits:
    a target that may be gone while stall attaches."""
    secs = float(args[0])
    for _ in range(3):
        if os.fork() == 0:
            time.sleep(secs / 2)
            os._exit(0)
    time.sleep(secs)
    os._exit(0)


def job_fork_on_cue(args):
    """Announces itself; on "fork" from stdin forks a child that reads the
    file and exits, reaps it and prints its PID; on "exit" exits."""
    path = args[0]
    print(os.getpid(), flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "fork":
            pid = os.fork()
            if pid == 0:
                read_with(path, "read", 4096)
                os._exit(0)
            os.waitpid(pid, 0)
            print(pid, flush=True)
        elif cmd == "exit":
            return


def job_take_pid(args):
    """Gets PID `want` for a child (writing want-1 to ns_last_pid before
    each fork) which reads the file; writes whether it got it."""
    want, path = int(args[0]), args[1]
    for attempt in range(2000):
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(want - 1))
        pid = os.fork()
        if pid == 0:
            if os.getpid() == want:
                total = read_with(path, "read", 4096)
                write_truth({"pid": want, "bytes": total, "attempts": attempt + 1})
            os._exit(0)
        os.waitpid(pid, 0)
        if pid == want:
            return
    write_truth({"pid": None})


def job_fork_storm(args):
    """Forks `n` children at once; child i reads the first 1000 + i bytes
    of the file in one read and exits. Writes {pid: bytes}."""
    path, n = args[0], int(args[1])
    want = {}
    for i in range(n):
        k = 1000 + i
        pid = os.fork()
        if pid == 0:
            fd = os.open(path, os.O_RDONLY)
            got = len(os.read(fd, k))
            os._exit(0 if got == k else 1)
        want[pid] = k
    bad = [pid for pid in want if os.waitpid(pid, 0)[1] != 0]
    write_truth({"children": {str(p): k for p, k in want.items()}, "bad": bad})


def job_threads(args):
    """`n` threads, all alive at once; thread i preads the first 100 + i
    bytes of the file once. Writes per tid the bytes it read of the file
    and of every file: its own I/O accounting (rchar, before the read of
    /proc/thread-self/io, plus that read), since glibc reads too (a new
    malloc arena reads /sys/devices/system/cpu/online)."""
    path, n = args[0], int(args[1])
    # No heap trimming: glibc's first trim of a thread's arena reads 1 byte
    # of /proc/sys/vm/overcommit_memory (once per process), which could be
    # in a worker after it took its own count.
    M_TRIM_THRESHOLD = -1
    libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)
    threading.stack_size(256 * 1024)
    fd = os.open(path, os.O_RDONLY)
    start = threading.Barrier(n + 1)
    done = threading.Barrier(n + 1)
    tids = {}

    def worker(i):
        start.wait()
        k = 100 + i
        assert len(os.pread(fd, k, 0)) == k
        io = os.open("/proc/thread-self/io", os.O_RDONLY)
        text = os.read(io, 4096)
        os.close(io)
        fields = dict(l.split(b": ") for l in text.split(b"\n") if b": " in l)
        rchar, syscr = int(fields[b"rchar"]), int(fields[b"syscr"])
        # syscr: its read calls (this one included), for when bytes disagree.
        tids[threading.get_native_id()] = {"data": k, "read": rchar + len(text), "calls": syscr + 1}
        done.wait()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    start.wait()
    done.wait()
    for t in threads:
        t.join()
    write_truth({"pid": os.getpid(), "threads": {str(t): v for t, v in tids.items()}})


def job_deny_memory_reads(args):
    """Execs `args` under a seccomp filter that fails process_vm_readv with
    EACCES: what a hardened host's policy does to a process that would read
    another's memory (stall's Python stacks), whatever its capabilities.
    (EACCES, not EPERM: on EPERM readers fall back to /proc/PID/mem.)"""
    import struct

    if os.uname().machine != "x86_64":
        sys.exit("deny-memory-reads: x86-64 only")
    nr_process_vm_readv = 310
    audit_arch_x86_64 = 0xC000003E
    bpf = lambda code, jt, jf, k: struct.pack("HBBI", code, jt, jf, k)
    ld_w_abs, jeq_k, ret_k = 0x20, 0x15, 0x06
    allow, errno_eacces = 0x7FFF0000, 0x00050000 | 13
    prog = b"".join([
        bpf(ld_w_abs, 0, 0, 4),  # seccomp_data.arch
        bpf(jeq_k, 1, 0, audit_arch_x86_64),
        bpf(ret_k, 0, 0, allow),
        bpf(ld_w_abs, 0, 0, 0),  # seccomp_data.nr
        bpf(jeq_k, 0, 1, nr_process_vm_readv),
        bpf(ret_k, 0, 0, errno_eacces),
        bpf(ret_k, 0, 0, allow),
    ])
    buf = ctypes.create_string_buffer(prog)
    fprog = struct.pack("HxxxxxxQ", len(prog) // 8, ctypes.addressof(buf))
    fbuf = ctypes.create_string_buffer(fprog)
    PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
    ul = ctypes.c_ulong
    if libc.prctl(PR_SET_NO_NEW_PRIVS, ul(1), ul(0), ul(0), ul(0)) != 0:
        sys.exit("deny-memory-reads: PR_SET_NO_NEW_PRIVS failed")
    if libc.prctl(PR_SET_SECCOMP, ul(SECCOMP_MODE_FILTER), ul(ctypes.addressof(fbuf)), ul(0), ul(0)) != 0:
        sys.exit(f"deny-memory-reads: seccomp failed (errno {ctypes.get_errno()})")
    cmd = args[1:] if args[:1] == ["--"] else args
    os.execvp(cmd[0], cmd)


def job_read_paths(args):
    """Names files every way but openat, and reads them every way but the
    read family: open(2), openat2(2) and creat(2) by raw syscall; reads
    through dup, dup2, dup3 and fcntl(F_DUPFD) copies of a descriptor
    (the original closed first for one); sendfile, copy_file_range and
    splice from files (sendfile and copy_file_range into a sink file,
    splice into a pipe). Each file is read by one path, in odd amounts.
    Writes per path the bytes read, or written (creat's file, the sink)."""
    d = args[0]
    truth = {"pid": os.getpid(), "read": {}, "written": {}}
    sys_open, sys_creat, sys_openat2 = 2, 85, 437
    at_fdcwd = -100

    def make(name, size):
        path = os.path.join(d, name)
        with open(path, "wb") as f:
            f.write(os.urandom(size))
        return path

    def checked(fd, what):
        if fd < 0:
            raise OSError(ctypes.get_errno(), what)
        return fd

    def until_eof(step):
        """Calls `step` (bytes moved by one call) until it moves none; the sum."""
        n = 0
        while k := step():
            n += k
        return n

    def drain(fd, chunk):
        return until_eof(lambda: len(os.read(fd, chunk)))

    # open(2): Python and glibc use openat.
    p = make("by-open.bin", 10_007)
    fd = checked(libc.syscall(sys_open, p.encode(), os.O_RDONLY), "open")
    truth["read"][p] = drain(fd, 999)
    os.close(fd)

    # openat2(2): struct open_how {u64 flags, mode, resolve}.
    p = make("by-openat2.bin", 20_011)
    how = (ctypes.c_uint64 * 3)(os.O_RDONLY, 0, 0)
    fd = checked(libc.syscall(sys_openat2, at_fdcwd, p.encode(), ctypes.byref(how), 24), "openat2")
    truth["read"][p] = drain(fd, 1001)
    os.close(fd)

    # creat(2), then writes.
    p = os.path.join(d, "by-creat.bin")
    fd = checked(libc.syscall(sys_creat, p.encode(), 0o644), "creat")
    truth["written"][p] = os.write(fd, b"c" * 3_001) + os.write(fd, b"d" * 4_003)
    os.close(fd)

    # Copies of one descriptor: each reads a part; the original is closed
    # before the last copies read.
    p = make("by-dup.bin", 50_021)
    fd = os.open(p, os.O_RDONLY)
    copies = [os.dup(fd), os.dup2(fd, 60), os.dup2(fd, 61, inheritable=False)]
    import fcntl

    copies.append(fcntl.fcntl(fd, fcntl.F_DUPFD, 70))
    n = len(os.read(fd, 5_003))
    os.close(fd)
    for i, c in enumerate(copies):
        n += len(os.read(c, 7_001 + i))
    for c in copies:
        n += drain(c, 3_333)
        os.close(c)
    truth["read"][p] = n

    # What sendfile and copy_file_range read, they write to the sink.
    sink_path = os.path.join(d, "sink.bin")
    sink = os.open(sink_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    p = make("by-sendfile.bin", 30_013)
    fd = os.open(p, os.O_RDONLY)
    truth["read"][p] = until_eof(lambda: os.sendfile(sink, fd, None, 8_191))
    os.close(fd)

    p = make("by-copy-file-range.bin", 40_009)
    fd = os.open(p, os.O_RDONLY)
    truth["read"][p] = until_eof(lambda: os.copy_file_range(fd, sink, 6_007))
    os.close(fd)
    truth["written"][sink_path] = truth["read"][p] + truth["read"][os.path.join(d, "by-sendfile.bin")]

    p = make("by-splice.bin", 25_013)
    fd = os.open(p, os.O_RDONLY)
    r, w = os.pipe()

    def spliced():
        k = os.splice(fd, w, 4_093)
        if k:
            # Emptied, so the pipe never fills (read: IPC bytes, not the file's).
            os.read(r, k)
        return k

    truth["read"][p] = until_eof(spliced)
    # The pipe's side: written by splice, read back (IPC, not files).
    truth["piped"] = truth["read"][p]
    for x in (fd, r, w, sink):
        os.close(x)
    write_truth(truth)


def job_uring_read(args):
    """Reads the file at args[0] to its end through io_uring alone
    (IORING_OP_READ, `chunk` bytes at a time at increasing offsets), by raw
    syscalls and mapped rings, as liburing would. Writes the bytes read."""
    import mmap

    path, chunk = args[0], int(args[1])
    sys_setup, sys_enter = 425, 426
    op_read, enter_getevents = 22, 1
    params = (ctypes.c_uint32 * 30)()  # struct io_uring_params, 120 bytes
    ring = libc.syscall(sys_setup, 4, ctypes.byref(params))
    if ring < 0:
        raise OSError(ctypes.get_errno(), "io_uring_setup")
    sq_entries, cq_entries = params[0], params[1]
    # struct io_sqring_offsets at byte 40, io_cqring_offsets at byte 80.
    sq_tail, sq_mask, sq_array = params[11], params[12], params[16]
    cq_head, cq_tail, cq_mask, cq_cqes = params[20], params[21], params[22], params[25]
    sq = mmap.mmap(ring, sq_array + 4 * sq_entries, offset=0)
    cq = mmap.mmap(ring, cq_cqes + 16 * cq_entries, offset=0x8000000)
    sqes = mmap.mmap(ring, 64 * sq_entries, offset=0x10000000)
    u32 = lambda m, at: int.from_bytes(m[at : at + 4], "little")
    fd = os.open(path, os.O_RDONLY)
    buf = ctypes.create_string_buffer(chunk)
    total, offset, user_data = 0, 0, 7
    while True:
        tail = u32(sq, sq_tail)
        i = tail & u32(sq, sq_mask)
        sqe = bytearray(64)
        sqe[0] = op_read
        sqe[4:8] = fd.to_bytes(4, "little", signed=True)
        sqe[8:16] = offset.to_bytes(8, "little")
        sqe[16:24] = ctypes.addressof(buf).to_bytes(8, "little")
        sqe[24:28] = chunk.to_bytes(4, "little")
        sqe[32:40] = user_data.to_bytes(8, "little")
        sqes[64 * i : 64 * i + 64] = bytes(sqe)
        sq[sq_array + 4 * i : sq_array + 4 * i + 4] = i.to_bytes(4, "little")
        sq[sq_tail : sq_tail + 4] = (tail + 1).to_bytes(4, "little")
        if libc.syscall(sys_enter, ring, 1, 1, enter_getevents, None, 0) < 0:
            raise OSError(ctypes.get_errno(), "io_uring_enter")
        head = u32(cq, cq_head)
        assert u32(cq, cq_tail) != head, "no completion"
        at = cq_cqes + 16 * (head & u32(cq, cq_mask))
        got_data = int.from_bytes(cq[at : at + 8], "little")
        res = int.from_bytes(cq[at + 8 : at + 12], "little", signed=True)
        cq[cq_head : cq_head + 4] = (head + 1).to_bytes(4, "little")
        assert got_data == user_data, (got_data, user_data)
        if res < 0:
            raise OSError(-res, "io_uring read")
        if res == 0:
            break
        total += res
        offset += res
        user_data += 1
    os.close(fd)
    for m in (sq, cq, sqes):
        m.close()
    os.close(ring)
    # Every read submitted, the last (end of file, 0 bytes) too.
    write_truth({"pid": os.getpid(), "bytes": total, "calls": user_data - 6})


def job_storage(args):
    """Four files in `dir` (on a block device): two evicted from the page
    cache (written, synced, POSIX_FADV_DONTNEED), two left cached; one of
    each read with read(), one of each mapped with every page touched
    (twice).
    Writes per path its size and how it was read."""
    import mmap

    d = args[0]
    files = {"cold-read.bin": 4_000_037, "warm-read.bin": 3_000_029, "cold-map.bin": 5_000_011, "warm-map.bin": 2_000_003}
    truth = {"pid": os.getpid(), "files": {}}
    for name, size in files.items():
        path = os.path.join(d, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        left = size
        while left:
            left -= os.write(fd, os.urandom(min(left, 1 << 20)))
        os.fsync(fd)
        if name.startswith("cold"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        truth["files"][path] = {"size": size, "cold": name.startswith("cold"), "mapped": "map" in name}
    for path, f in truth["files"].items():
        fd = os.open(path, os.O_RDONLY)
        if f["mapped"]:
            m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
            os.close(fd)
            # Twice: pages already mapped do not fault again.
            touched = sum(m[i] for _ in range(2) for i in range(0, f["size"], mmap.PAGESIZE))
            m.close()
            f["touched"] = touched >= 0
        else:
            n = 0
            while True:
                b = os.read(fd, 65_537)
                if not b:
                    break
                n += len(b)
            os.close(fd)
            f["read"] = n
    write_truth(truth)


def job_socket(args):
    """Connects to 127.0.0.1:PORT, sends SEND bytes with sendall (send and
    sendmsg), receives until the peer closes with recv and recvmsg in
    turns; reports what it sent and received."""
    import socket

    port, send = int(args[0]), int(args[1])
    s = socket.create_connection(("127.0.0.1", port))
    half = send // 2
    s.sendall(b"x" * half)
    s.sendmsg([b"y" * (send - half)])
    got, turn = 0, 0
    while True:
        if turn % 2:
            data = s.recvmsg(65536)[0]
        else:
            data = s.recv(65536)
        if not data:
            break
        got += len(data)
        turn += 1
    s.close()
    write_truth({"pid": os.getpid(), "sent": send, "received": got})


JOBS = {
    "socket": job_socket,
    "deny-memory-reads": job_deny_memory_reads,
    "log-then-hang": job_log_then_hang,
    "log-every": job_log_every,
    "writes": job_writes,
    "open-before": job_open_before,
    "reuse": job_reuse,
    "exact": job_exact,
    "grandchild": job_grandchild,
    "family": job_family,
    "waits": job_waits,
    "wake": job_wake,
    "pingpong": job_pingpong,
    "wait-for": job_wait_for,
    "exec": job_exec,
    "many-opens": job_many_opens,
    "idle-then-read": job_idle_then_read,
    "reader-loop": job_reader_loop,
    "signals": job_signals,
    "brief": job_brief,
    "fork-on-cue": job_fork_on_cue,
    "take-pid": job_take_pid,
    "fork-storm": job_fork_storm,
    "threads": job_threads,
    "read-paths": job_read_paths,
    "uring-read": job_uring_read,
    "storage": job_storage,
    "mapped-after-temp": job_mapped_after_temp,
}

if __name__ == "__main__":
    JOBS[sys.argv[1]](sys.argv[2:])
