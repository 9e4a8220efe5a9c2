#!/usr/bin/env python3
"""A Hugging Face `datasets` table read by a PyTorch DataLoader's workers
through the memory mapping the trainer made before they were forked.

`prepare DIR ROWS [SHARD_MB]`: writes a dataset of ROWS rows of 4 KiB
(`save_to_disk`, in shards of at most SHARD_MB MB where given), untraced.

`run DIR TRUTH WORKERS MBPS`: evicts the Arrow files from the page cache,
caps the job's disk reads at MBPS with a cgroup (the demo workload's
throttle), `load_from_disk` (the trainer maps the Arrow files), then
iterates a DataLoader with WORKERS fork-started workers over every row once:
the workers fault the pages in without ever opening the files (from the
page cache: pyarrow reads a file it maps ahead as the table is opened).
Writes the truth: the trainer's pid, the workers' pids, the Arrow files
and their sizes, the throttle, and `received`: for each batch, the
seconds since the script started at which the trainer had it and the
rows received so far.

`loader DIR TRUTH WORKERS MBPS`: the ordinary user's shape, as above
(evicted, throttled) but with nothing of the job's own between `datasets`
and the DataLoader: `load_from_disk(DIR).with_format("torch")` handed to a
DataLoader with WORKERS workers (the default start method), every row once,
the trainer taking a step of a small model on its CPU for each batch of 64
rows (one thread, about 4 ms): the trainer is what the job waits for. The
workers fault their rows in through the mapping `load_from_disk` made (the
file is in the page cache by then: pyarrow has read it ahead). Writes the
same truth.
"""
import json
import os
import sys
import time

# The script's start, near enough to the start of `stall run`'s tracing
# (what the JSON's times count from): an interpreter starts in some 50 ms.
STARTED = time.monotonic()

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "demo"))
import workload  # noqa: E402  (the throttle)

ROW = 4096


def prepare(dir, rows, shard_mb=None):
    import datasets
    import pyarrow as pa

    data = [os.urandom(ROW) for _ in range(rows)]
    table = pa.table({"idx": list(range(rows)), "data": data})
    # A fingerprint of our own: hashing an in-memory table pickles it with
    # dill, which fails for datasets 5.2's dill 0.4.1 and pyarrow 26.
    shard = {"max_shard_size": f"{shard_mb}MB"} if shard_mb else {}
    datasets.Dataset(table, fingerprint=f"stall-{rows}").save_to_disk(dir, **shard)


def arrow_files(dir):
    return sorted(os.path.join(dir, f) for f in os.listdir(dir) if f.endswith(".arrow"))


class Rows:
    """A map-style dataset over the table's rows (what a Dataset with a
    torch format does, without the conversion)."""

    def __init__(self, table):
        self.table = table

    def __len__(self):
        return len(self.table)

    def __getitem__(self, i):
        return len(self.table[i]["data"])


def throttled(dir, truth_path, mbps, read):
    """Evicts the Arrow files from the page cache, caps the job's disk
    reads at MBPS, and runs `read`, which returns (its workers' pids, the
    rows read, when they were received); writes the truth."""
    (pids, rows, received), throttle = workload.cold_and_throttled(
        arrow_files(dir), dir, mbps, f"stall-arrow-{os.getpid()}", read
    )
    with open(truth_path, "w") as f:
        json.dump({
            "trainer": os.getpid(),
            "workers": pids,
            "files": {p: os.path.getsize(p) for p in arrow_files(dir)},
            "rows": rows,
            "throttle": throttle,
            "received": received,
        }, f)


def run(dir, workers):
    """The Rows dataset over the table the trainer mapped, fork-started
    workers."""
    import datasets
    import torch
    from torch.utils.data import DataLoader

    table = datasets.load_from_disk(dir)
    loader = DataLoader(Rows(table), batch_size=64, num_workers=workers,
                        multiprocessing_context="fork", persistent_workers=False)
    it = iter(loader)
    pids = [w.pid for w in it._workers]
    total, rows, received = 0, 0, []
    for b in it:
        total += int(b.sum())
        rows += len(b)
        received.append((time.monotonic() - STARTED, rows))
    del it
    assert total == ROW * len(table), total
    return pids, len(table), received


def loader(dir, workers):
    """The table as datasets formats it for torch, straight to a
    DataLoader; the trainer takes a CPU step per batch."""
    import datasets
    import torch
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers = [torch.randn(512, 512) / 512**0.5 for _ in range(6)]
    ds = datasets.load_from_disk(dir).with_format("torch")
    loader = DataLoader(ds, batch_size=64, num_workers=workers)
    it = iter(loader)
    pids = [w.pid for w in it._workers]
    rows, received = 0, []
    for batch in it:
        rows += len(batch["idx"])
        received.append((time.monotonic() - STARTED, rows))
        # The format gives numpy bytes, trailing zero bytes stripped.
        rows_bytes = b"".join(d.ljust(ROW, b"\0") for d in batch["data"])
        x = torch.frombuffer(bytearray(rows_bytes), dtype=torch.uint8)
        x = x.view(-1, ROW)[:, :512].float() / 255
        for w in layers:
            x = torch.tanh(x @ w)
    del it
    assert rows == len(ds), rows
    return pids, len(ds), received


if __name__ == "__main__":
    if sys.argv[1] == "prepare":
        prepare(sys.argv[2], int(sys.argv[3]), *(int(a) for a in sys.argv[4:5]))
    else:
        mode = loader if sys.argv[1] == "loader" else run
        dir, workers = sys.argv[2], int(sys.argv[4])
        throttled(dir, sys.argv[3], float(sys.argv[5]), lambda: mode(dir, workers))
