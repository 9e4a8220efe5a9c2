#!/usr/bin/env python3
"""A small PyTorch training job whose DataLoader workers are slowed by file reads.

For `cargo xtask gpu-check`: a tiny model trains on the GPU, fed by a
DataLoader with num_workers=4 whose Dataset reads each sample from shard files
evicted from the page cache first (posix_fadvise DONTNEED), so the GPU waits
on the input pipeline. Prints `PID <pid>` first, then trains for --seconds.
"""
import argparse
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset

SAMPLE = 4 << 20  # bytes read per sample


class Shards(Dataset):
    def __init__(self, paths, samples_per_file):
        self.paths = paths
        self.per = samples_per_file

    def __len__(self):
        return len(self.paths) * self.per

    def __getitem__(self, i):
        path = self.paths[i // self.per]
        off = (i % self.per) * SAMPLE
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, off, SAMPLE, os.POSIX_FADV_DONTNEED)
            data = os.pread(fd, SAMPLE, off)
        finally:
            os.close(fd)
        x = torch.frombuffer(bytearray(data[: 4 * 1024]), dtype=torch.float32)
        return x, x.sum().remainder(10).long()


def make_shards(d, n, mb):
    os.makedirs(d, exist_ok=True)
    paths = []
    for k in range(n):
        p = os.path.join(d, f"rows_{k * 2000:05d}-{(k + 1) * 2000:05d}.bin")
        if not os.path.exists(p) or os.path.getsize(p) != mb << 20:
            with open(p, "wb") as f:
                for _ in range(mb):
                    f.write(os.urandom(1 << 20))
        paths.append(p)
    return paths


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/tmp/stall-gpu-check-data")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--file-mb", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=40)
    args = ap.parse_args()
    paths = make_shards(args.data, args.files, args.file_mb)
    ds = Shards(paths, (args.file_mb << 20) // SAMPLE)
    dl = DataLoader(ds, batch_size=16, shuffle=True, num_workers=4, persistent_workers=True)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    print(f"PID {os.getpid()}", flush=True)
    time.sleep(1.0)
    end = time.monotonic() + args.seconds
    steps = 0
    while time.monotonic() < end:
        for x, y in dl:
            x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
            if time.monotonic() >= end:
                break
    torch.cuda.synchronize()
    print(f"train: {steps} steps in {args.seconds:.0f}s", flush=True)


if __name__ == "__main__":
    main()
