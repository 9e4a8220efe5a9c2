#!/usr/bin/env python3
"""A real PyTorch training loop stalled by synchronous checkpoints.

A small model trains on batches from a DataLoader with --workers worker
processes (samples made in memory: the input keeps up). Every --every steps
the trainer saves a --state-mb MiB state with torch.save to ckpt.pt.tmp in
--dir, fsyncs it and renames it over ckpt.pt, as checkpointing code does.
The job's disk writes are capped at --write-mbps with a cgroup (the demo
workload's throttle), so each save waits for storage. Writes the truth to
--truth: the trainer's pid, the checkpoints' bytes and the time in
torch.save and in fsync.
"""
import argparse
import json
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "demo"))
import workload  # noqa: E402  (the throttle)


class Samples(Dataset):
    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        return torch.full((256,), float(i % 7))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--truth", required=True)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--state-mb", type=int, default=24)
    p.add_argument("--write-mbps", type=float, default=12.0)
    args = p.parse_args()
    torch.set_num_threads(1)
    throttle, note = workload.setup_throttle(args.dir, args.write_mbps, f"stall-ckpt-{os.getpid()}", writes=True)
    truth = {"trainer": os.getpid(), "throttle": throttle.description if throttle else note, "saves": 0,
             "bytes": 0, "save_s": 0.0, "sync_s": 0.0, "tmp": os.path.join(args.dir, "ckpt.pt.tmp")}
    if throttle:
        throttle.enter()
    try:
        model = torch.nn.Linear(256, 256)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        # The "rest of the state": what a large model's weights and optimizer
        # moments add to a checkpoint.
        extra = {f"shard{i}": torch.randn(1 << 18) for i in range(args.state_mb)}
        loader = iter(DataLoader(Samples(), batch_size=8, num_workers=args.workers))
        for step in range(1, args.steps + 1):
            x = next(loader)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % args.every == 0:
                t0 = time.monotonic()
                with open(truth["tmp"], "wb") as f:
                    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), **extra}, f)
                    f.flush()
                    t1 = time.monotonic()
                    os.fsync(f.fileno())
                    t2 = time.monotonic()
                truth["bytes"] += os.path.getsize(truth["tmp"])
                os.replace(truth["tmp"], os.path.join(args.dir, "ckpt.pt"))
                truth["saves"] += 1
                truth["save_s"] += t1 - t0
                truth["sync_s"] += t2 - t1
        del loader
    finally:
        if throttle:
            throttle.remove()
    with open(args.truth, "w") as f:
        json.dump(truth, f)


if __name__ == "__main__":
    main()
