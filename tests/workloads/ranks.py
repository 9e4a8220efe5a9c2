#!/usr/bin/env python3
"""A distributed run as torchrun or mp.spawn starts one, without torch.

A launcher starts --ranks rank processes, each with the environment
torchrun gives its workers (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, TORCHELASTIC_RUN_ID), or with --launch srun / mpirun the one
Slurm's srun or Open MPI's mpirun gives its tasks, then waits for them. Each rank is a
trainer with --workers DataLoader-like workers (forked, feeding it batches
through multiprocessing queues) and ends every step in a collective: an
all-reduce over TCP through rank 0, as gloo's would on one host. The workers
of --slow-rank spend --slow-ms of CPU per batch, so every other rank waits
for it in the collective; --hang-rank stops for good before a collective, so
every other rank waits in it forever. The ground truth (pids of the launcher,
each rank and its workers, and each rank's own time in the collective) goes
to $TRUTH. With --cgroups each rank moves itself into a cgroup of its own
before its workers start: ranks on two "nodes".
"""
import argparse
import json
import multiprocessing as mp
import os
import socket
import struct
import subprocess
import sys
import threading
import time


def spin(ms):
    end = time.perf_counter() + ms / 1000.0
    x = 0
    while time.perf_counter() < end:
        x += 1
    return x


def worker(index, path, slow_ms, requests, batches):
    with open(path, "rb") as f:
        while True:
            step = requests.get()
            if step is None:
                return
            f.seek((step * 65536) % (1 << 20))
            data = f.read(65536)
            if slow_ms:
                spin(slow_ms)
            batches.put((step, len(data)))


def recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("peer closed")
        buf += chunk
    return buf


def reduce_through_root(rank, world, server, peers, value):
    """All-reduce of one number through rank 0 (a star, as a tiny gloo).
    Named as no collective library names one: stall must find the ranks
    inside it by what they wait on, not by the function's name."""
    if rank == 0:
        total = value
        for p in peers:
            total += struct.unpack("!d", recv_exact(p, 8))[0]
        for p in peers:
            p.sendall(struct.pack("!d", total))
        return total
    server.sendall(struct.pack("!d", value))
    return struct.unpack("!d", recv_exact(server, 8))[0]


def stuck():
    """A rank that never reaches the next collective (a deadlock of its own)."""
    threading.Event().wait()


def connect(rank, world, addr, port):
    """Rank 0 listens, the others connect: (its link to rank 0, or its peers)."""
    if rank == 0:
        lsock = socket.socket()
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lsock.bind((addr, port))
        lsock.listen(world)
        peers = [lsock.accept()[0] for _ in range(world - 1)]
        return None, peers
    deadline = time.time() + 30
    while True:
        try:
            return socket.create_connection((addr, port)), []
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.05)


def own_rank():
    """(rank, world size) from whichever launcher started this process."""
    for rank, world in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"),
                        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if rank in os.environ:
            return int(os.environ[rank]), int(os.environ[world])
    raise SystemExit("no rank in the environment")


def rank_main(args):
    rank, world = own_rank()
    if args.cgroups:
        # Each rank on its own "node": its cgroup, before its workers fork.
        with open(os.path.join(args.cgroups.split(",")[rank], "cgroup.procs"), "w") as f:
            f.write("0")
    addr, port = "127.0.0.1", args.port
    path = os.path.join(args.dir, f"shard_{rank}.bin")
    with open(path, "wb") as f:
        f.write(os.urandom(1 << 20))
    slow_ms = args.slow_ms if rank == args.slow_rank else 0.0
    ctx = mp.get_context("fork")
    requests, batches = ctx.Queue(), ctx.Queue()
    workers = [ctx.Process(target=worker, args=(i, path, slow_ms, requests, batches), daemon=True)
               for i in range(args.workers)]
    for w in workers:
        w.start()
    server, peers = connect(rank, world, addr, port)
    report = {"rank": rank, "pid": os.getpid(), "workers": [w.pid for w in workers]}
    with open(os.path.join(args.dir, f"rank_{rank}.json"), "w") as f:
        json.dump(report, f)
    # Prefetch two batches per worker, as a DataLoader does.
    step = 0
    for _ in range(2 * args.workers):
        requests.put(step)
        step += 1
    end = time.monotonic() + args.seconds
    hang_at = time.monotonic() + args.hang_after
    total = 0.0
    in_collective = 0.0
    while True:
        _, n = batches.get()
        requests.put(step)
        step += 1
        spin(args.compute_ms)
        # Every rank takes part in every collective, so all stop together.
        if rank == args.hang_rank and time.monotonic() > hang_at:
            stuck()
        t = time.monotonic()
        go_on = reduce_through_root(rank, world, server, peers, 1.0 if time.monotonic() < end else 0.0)
        in_collective += time.monotonic() - t
        total += n
        if go_on < world:
            break
    with open(os.path.join(args.dir, f"collective_{rank}.json"), "w") as f:
        json.dump({"rank": rank, "seconds": args.seconds, "in_collective_s": in_collective}, f)
    for _ in workers:
        requests.put(None)
    for w in workers:
        w.join(5)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--slow-rank", type=int, default=-1, help="rank whose workers are slow (-1: none)")
    p.add_argument("--slow-ms", type=float, default=120.0, help="CPU per batch of the slow rank's workers")
    p.add_argument("--hang-rank", type=int, default=-1, help="rank that stops before a collective (-1: none)")
    p.add_argument("--hang-after", type=float, default=3.0, help="seconds before --hang-rank stops")
    p.add_argument("--compute-ms", type=float, default=2.0, help="CPU per step of each trainer")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--port", type=int, default=29517)
    p.add_argument("--launch", choices=["torchrun", "spawn", "srun", "mpirun"], default="torchrun",
                   help="start ranks as new programs with torchrun's, Slurm's or Open MPI's environment, or "
                        "as multiprocessing spawn children (mp.spawn with torchrun's environment)")
    p.add_argument("--dir", required=True)
    p.add_argument("--cgroups", default=None,
                   help="comma-separated cgroup directories, one per rank, each rank moves itself into its own")
    p.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_main:
        return rank_main(args)

    n = str(args.ranks)
    children = []
    for r in range(args.ranks):
        if args.launch == "srun":
            # What srun gives each task (no torch variables).
            env = dict(os.environ, SLURM_JOB_ID="4242", SLURM_PROCID=str(r), SLURM_LOCALID=str(r),
                       SLURM_NTASKS=n)
        elif args.launch == "mpirun":
            env = dict(os.environ, OMPI_COMM_WORLD_RANK=str(r), OMPI_COMM_WORLD_LOCAL_RANK=str(r),
                       OMPI_COMM_WORLD_SIZE=n, PMIX_NAMESPACE="stall-test-run")
        else:
            env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), GROUP_RANK="0", WORLD_SIZE=n,
                       LOCAL_WORLD_SIZE=n, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port),
                       TORCHELASTIC_RUN_ID="stall-test-run")
        if args.launch != "spawn":
            cmd = [sys.executable, os.path.abspath(__file__), "--rank-main"] + sys.argv[1:]
            children.append(subprocess.Popen(cmd, env=env))
        else:
            # mp.spawn: the child execs a fresh interpreter with this
            # environment (set around its start).
            saved = dict(os.environ)
            os.environ.update(env)
            proc = mp.get_context("spawn").Process(target=rank_main, args=(args,))
            proc.start()
            os.environ.clear()
            os.environ.update(saved)
            children.append(proc)
    failed = 0
    for c in children:
        if isinstance(c, subprocess.Popen):
            failed += c.wait() != 0
        else:
            c.join()
            failed += c.exitcode != 0
    truth = {"launcher": os.getpid(), "ranks": []}
    for r in range(args.ranks):
        with open(os.path.join(args.dir, f"rank_{r}.json")) as f:
            report = json.load(f)
        collective = os.path.join(args.dir, f"collective_{r}.json")
        if os.path.exists(collective):
            with open(collective) as f:
                report["in_collective_s"] = json.load(f)["in_collective_s"]
        truth["ranks"].append(report)
    path = os.environ.get("TRUTH")
    if path:
        with open(path, "w") as f:
            json.dump(truth, f)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
