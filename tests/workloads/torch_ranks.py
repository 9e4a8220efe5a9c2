#!/usr/bin/env python3
"""A real PyTorch distributed training run (gloo, CPU), launched as people do.

Each rank trains a small model on batches from a DataLoader with --workers
worker processes (started by --worker-start: fork, forkserver or spawn)
reading its shard file, all-reduces its gradients with torch.distributed
every step, and stops when the run does (an all-reduced flag). Launches:

- torchrun (the default): run this script under `torch.distributed.run`;
  the rank comes from the environment torchrun gives.
- spawn: this script is the launcher: it sets MASTER_ADDR/MASTER_PORT and
  calls torch.multiprocessing.spawn(train, nprocs=--nprocs); each rank is
  its index, passed as the argument, and calls init_process_group with
  rank=NODE_RANK*nprocs+index (no RANK in any environment).
- spawn-environ: the same, but each rank puts RANK, WORLD_SIZE,
  MASTER_ADDR and MASTER_PORT into os.environ after it started and joins
  with init_process_group("gloo") from the environment.
- spawn-reversed: as spawn, but the launcher starts the ranks with torch's
  own wrapper from the last index to the first, 50 ms apart (as a launcher
  starting them in parallel may): their start order is not their rank.
- forkserver-parallel: as spawn, through
  torch.multiprocessing.start_processes(start_method="forkserver") with
  TORCH_MP_PARALLEL_START=1: a fork server forks the ranks, from a pool of
  threads, in any order.

The slow rank (--slow-rank) is held by its input: its workers spend
--slow-ms of CPU per sample, or with --slow-mbps read from storage throttled
to that rate (its shard dropped from the page cache before every read; the
shards live in --data-dir, on a block device). Each rank writes
rank_<r>.json (its pid and its DataLoader workers' pids) into --dir; the
launcher of a spawn run writes launcher_<node>.json.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing
from torch.utils.data import DataLoader, Dataset

SHARD = 32 << 20
SAMPLE = 64 << 10


def spin(ms):
    end = time.perf_counter() + ms / 1000.0
    while time.perf_counter() < end:
        pass


class Shard(Dataset):
    def __init__(self, path, slow_ms, cold):
        self.path, self.slow_ms, self.cold = path, slow_ms, cold

    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        off = (i * SAMPLE) % SHARD
        with open(self.path, "rb") as f:
            if self.cold:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            f.seek(off)
            raw = f.read(SAMPLE)
        if self.slow_ms:
            spin(self.slow_ms)
        return torch.frombuffer(bytearray(raw[:1024]), dtype=torch.uint8).float()[:256] / 255.0


def write_shard(path):
    with open(path + ".tmp", "wb") as f:
        f.write(os.urandom(SHARD))
    os.rename(path + ".tmp", path)


def throttled(args):
    """Moves this rank into a cgroup reading its shards' disk at --slow-mbps
    (its workers, started after, inherit it); returns the cgroup."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "demo"))
    from workload import setup_throttle

    throttle, note = setup_throttle(args.data_dir, args.slow_mbps, f"stall-ranks-{os.getpid()}")
    if throttle is None:
        raise SystemExit(f"slow storage: {note}")
    throttle.enter()
    return throttle


RANK_AS_ARGUMENT = ("spawn", "spawn-reversed", "forkserver-parallel")


def start_reversed(args):
    """torch.multiprocessing.spawn's work, its ranks started last first."""
    import multiprocessing

    from torch.multiprocessing.spawn import _wrap

    ctx = multiprocessing.get_context("spawn")
    ranks = [ctx.Process(target=_wrap, args=(train, i, (args,), os.path.join(args.dir, f"error_{i}")))
             for i in range(args.nprocs)]
    for p in reversed(ranks):
        p.start()
        time.sleep(0.05)
    for p in ranks:
        p.join()
    failed = [i for i, p in enumerate(ranks) if p.exitcode != 0]
    if failed:
        raise SystemExit(f"ranks {failed} failed")


def train(index, args):
    """One rank: `index` is mp.spawn's argument (None under torchrun)."""
    torch.set_num_threads(1)
    if args.launch in RANK_AS_ARGUMENT:
        rank = args.node_rank * args.nprocs + index
        dist.init_process_group("gloo", rank=rank, world_size=args.world)
    elif args.launch == "spawn-environ":
        rank = args.node_rank * args.nprocs + index
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(args.world), MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(args.port))
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    slow = rank == args.slow_rank
    throttle = throttled(args) if slow and args.slow_mbps else None
    path = os.path.join(args.data_dir or args.dir, f"shard_{rank}.bin")
    if not os.path.exists(path):
        write_shard(path)
    loader = DataLoader(Shard(path, args.slow_ms if slow else 0.0, throttle is not None), batch_size=4,
                        num_workers=args.workers, shuffle=True, multiprocessing_context=args.worker_start)
    batches = iter(loader)
    with open(os.path.join(args.dir, f"rank_{rank}.json"), "w") as f:
        json.dump({"rank": rank, "pid": os.getpid(), "workers": [w.pid for w in batches._workers]}, f)
    model = torch.nn.Linear(256, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    end = time.monotonic() + args.seconds
    in_collective = 0.0
    while True:
        x = next(batches)
        loss = model(x).pow(2).mean()
        loss.backward()
        t = time.monotonic()
        for param in model.parameters():
            dist.all_reduce(param.grad)
        in_collective += time.monotonic() - t
        opt.step()
        opt.zero_grad()
        going = torch.tensor([1.0 if time.monotonic() < end else 0.0])
        dist.all_reduce(going)
        if going.item() < world:
            break
    with open(os.path.join(args.dir, f"collective_{rank}.json"), "w") as f:
        json.dump({"rank": rank, "seconds": args.seconds, "in_collective_s": in_collective}, f)
    del batches
    dist.destroy_process_group()
    if throttle:
        throttle.remove()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--data-dir", default=None, help="where the shards are (default: --dir)")
    p.add_argument("--launch", choices=["torchrun", "spawn-environ", *RANK_AS_ARGUMENT], default="torchrun")
    p.add_argument("--nprocs", type=int, default=4, help="ranks this launcher spawns")
    p.add_argument("--world", type=int, default=None, help="ranks of the run (default: --nprocs)")
    p.add_argument("--node-rank", type=int, default=int(os.environ.get("NODE_RANK", "0")))
    p.add_argument("--port", type=int, default=29530)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--worker-start", choices=["fork", "forkserver", "spawn"], default="fork")
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--slow-mbps", type=float, default=0.0)
    p.add_argument("--seconds", type=float, default=12.0)
    args = p.parse_args()
    args.world = args.world or args.nprocs
    shards = args.data_dir or args.dir
    if args.launch == "torchrun":
        os.makedirs(shards, exist_ok=True)
        return train(None, args)
    # The launcher writes every shard of its node before the ranks start.
    for i in range(args.nprocs):
        path = os.path.join(shards, f"shard_{args.node_rank * args.nprocs + i}.bin")
        if not os.path.exists(path):
            write_shard(path)
    with open(os.path.join(args.dir, f"launcher_{args.node_rank}.json"), "w") as f:
        json.dump({"pid": os.getpid()}, f)
    if args.launch in RANK_AS_ARGUMENT:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(args.port)
    if args.launch == "spawn-reversed":
        start_reversed(args)
    elif args.launch == "forkserver-parallel":
        os.environ["TORCH_MP_PARALLEL_START"] = "1"
        torch.multiprocessing.start_processes(train, args=(args,), nprocs=args.nprocs, start_method="forkserver")
    else:
        torch.multiprocessing.spawn(train, args=(args,), nprocs=args.nprocs)


if __name__ == "__main__":
    main()
