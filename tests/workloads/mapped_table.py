#!/usr/bin/env python3
"""hf_arrow.py's `loader` shape with the standard library alone (it runs in
the kernel VMs, which carry neither PyTorch nor `datasets`): a table the
trainer memory-maps before it forks its workers, which fault their rows in
through the inherited mapping without ever opening the file.

`prepare DIR ROWS`: writes DIR/table.bin, ROWS rows of 4 KiB of random
bytes, fsync'd; untraced.

`run DIR TRUTH WORKERS MBPS`: evicts the table from the page cache, caps the
job's disk reads at MBPS with a cgroup (the demo workload's throttle, where
the machine allows one), maps the table and reads it ahead into the page
cache (`madvise(MADV_WILLNEED)`, as pyarrow does for a file it maps, and
one untimed read of it to the end, so that it is all there), then
forks WORKERS workers (multiprocessing's fork context) that take batch
numbers from a queue, as a DataLoader's do (two batches in flight per
worker), touch every 4 KiB row of their batch through the mapping and send
a few bytes of it back over a queue. The trainer takes a pure-Python CPU
step of a few ms per batch, every row once: the trainer is what the job
waits for. Writes the truth: the trainer's pid, the workers' pids, the
table and its size, the rows, the throttle, and `received`: for each
batch, the seconds since the script started at which the trainer had it
and the rows received so far.
"""
import json
import mmap
import multiprocessing
import os
import sys
import time

# The script's start, near enough to the start of `stall run`'s tracing
# (what the JSON's times count from): an interpreter starts in some 50 ms.
STARTED = time.monotonic()

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "demo"))
import workload  # noqa: E402  (the throttle)

ROW = 4096
BATCH = 64
# Iterations of the trainer's step per batch: ~25 ms of one CPU here.
STEP = 400_000
IN_FLIGHT = 2


def table_path(dir):
    return os.path.join(dir, "table.bin")


def prepare(dir, rows):
    os.makedirs(dir, exist_ok=True)
    with open(table_path(dir), "wb") as f:
        for _ in range(rows):
            f.write(os.urandom(ROW))
        f.flush()
        os.fsync(f.fileno())


def worker(m, tasks, results):
    """Faults in each batch's rows through the trainer's mapping."""
    rows = len(m) // ROW
    while True:
        b = tasks.get()
        if b is None:
            return
        first, last = b * BATCH, min((b + 1) * BATCH, rows)
        total = 0
        for r in range(first, last):
            row = bytes(m[r * ROW:(r + 1) * ROW])
            total += row[0] + row[ROW // 2] + row[-1]
        results.put((b, last - first, total))


def step(seed):
    """The trainer's CPU step: a pure-Python loop."""
    acc = seed
    for i in range(STEP):
        acc = (acc * 31 + i) & 0xFFFFFF
    return acc


def run(dir, workers):
    fd = os.open(table_path(dir), os.O_RDONLY)
    m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    # Read ahead, as pyarrow does for a file it maps: the workers then find
    # every page in the page cache. MADV_WILLNEED only starts the reads; the
    # trainer reads the file once to wait for them (a worker faulting a page
    # still on its way would start read-ahead of its own, storage bytes
    # beyond its rows).
    m.madvise(mmap.MADV_WILLNEED)
    buf = bytearray(1 << 20)
    while os.readv(fd, [buf]):
        pass
    os.close(fd)
    rows = len(m) // ROW
    batches = (rows + BATCH - 1) // BATCH
    ctx = multiprocessing.get_context("fork")
    tasks, results = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(m, tasks, results)) for _ in range(workers)]
    for p in procs:
        p.start()
    sent = 0
    for _ in range(min(batches, IN_FLIGHT * workers)):
        tasks.put(sent)
        sent += 1
    done, acc, received = 0, 0, []
    for _ in range(batches):
        _, n, total = results.get()
        done += n
        received.append((time.monotonic() - STARTED, done))
        if sent < batches:
            tasks.put(sent)
            sent += 1
        acc = step(acc ^ total)
    for _ in procs:
        tasks.put(None)
    for p in procs:
        p.join()
    m.close()
    assert done == rows, (done, rows)
    return [p.pid for p in procs], rows, received


def main():
    dir = sys.argv[2]
    if sys.argv[1] == "prepare":
        prepare(dir, int(sys.argv[3]))
        return
    truth_path, workers, mbps = sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
    path = table_path(dir)
    (pids, rows, received), throttle = workload.cold_and_throttled(
        [path], dir, mbps, f"stall-mapped-{os.getpid()}", lambda: run(dir, workers)
    )
    with open(truth_path, "w") as f:
        json.dump({
            "trainer": os.getpid(),
            "workers": pids,
            "files": {path: os.path.getsize(path)},
            "rows": rows,
            "throttle": throttle,
            "received": received,
        }, f)


if __name__ == "__main__":
    main()
