#!/usr/bin/env python3
"""A real PyTorch distributed training run for torchrun (gloo, CPU).

Each rank trains a small model on batches from a DataLoader with --workers
worker processes reading its shard file, all-reduces its gradients with
torch.distributed every step, and stops when the run does (an all-reduced
flag). The workers of --slow-rank spend --slow-ms of CPU per sample, so the
other ranks wait for it in all_reduce. Each rank writes rank_<r>.json (its
pid and its DataLoader workers' pids) into --dir.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


def spin(ms):
    end = time.perf_counter() + ms / 1000.0
    while time.perf_counter() < end:
        pass


class Shard(Dataset):
    def __init__(self, path, slow_ms):
        self.path, self.slow_ms = path, slow_ms

    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        with open(self.path, "rb") as f:
            f.seek((i * 4096) % (1 << 20))
            raw = f.read(1024)
        if self.slow_ms:
            spin(self.slow_ms)
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).float()[:256] / 255.0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=30.0)
    p.add_argument("--seconds", type=float, default=12.0)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    path = os.path.join(args.dir, f"shard_{rank}.bin")
    with open(path, "wb") as f:
        f.write(os.urandom(1 << 20))
    slow = args.slow_ms if rank == args.slow_rank else 0.0
    loader = DataLoader(Shard(path, slow), batch_size=4, num_workers=args.workers, shuffle=True)
    batches = iter(loader)
    with open(os.path.join(args.dir, f"rank_{rank}.json"), "w") as f:
        json.dump({"rank": rank, "pid": os.getpid(), "workers": [w.pid for w in batches._workers]}, f)
    model = torch.nn.Linear(256, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    end = time.monotonic() + args.seconds
    while True:
        x = next(batches)
        loss = model(x).pow(2).mean()
        loss.backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)
        opt.step()
        opt.zero_grad()
        going = torch.tensor([1.0 if time.monotonic() < end else 0.0])
        dist.all_reduce(going)
        if going.item() < world:
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
