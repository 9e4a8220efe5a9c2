#!/usr/bin/env python3
"""Samples from an object store: a DataLoader-shaped job whose workers fetch
their samples over HTTP, and the slow server outside the job they fetch
from. Standard library only.

`serve PORT_FILE MBPS STATS_FILE`: an HTTP/1.1 server on a free loopback
port (written to PORT_FILE) answering `GET /sample/N` (and `/warmup/N`)
with a 4 MiB body, all connections together paced to MBPS. It stops on
SIGTERM, and then writes the bytes it sent (status lines, headers and
bodies: what went into its sockets), for samples and for warm-ups apart,
to STATS_FILE.

`load PORT WORKERS SAMPLES TRUTH [GATE]`: the trainer forks WORKERS
processes; each fetches its share of SAMPLES samples with urllib (one
connection per sample, as urlopen does) and hands each to the trainer over
a multiprocessing queue; the trainer waits for them. With GATE (a path),
each worker instead opens one keep-alive connection first, fetches one
warm-up sample on it, and waits for GATE to exist before fetching its
samples on the same connection (a pooled client, connected before a tracer
attaches). Writes the truth: the trainer's and workers' pids and the body
bytes each worker received for its samples.
"""
import http.client
import json
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SAMPLE = 4 << 20
CHUNK = 64 << 10


class Pace:
    """A token bucket shared by every connection: MBPS in all."""

    def __init__(self, mbps):
        self.rate = mbps * 1e6
        self.lock = threading.Lock()
        self.next = time.monotonic()

    def take(self, n):
        with self.lock:
            now = time.monotonic()
            self.next = max(self.next, now) + n / self.rate
            wait = self.next - n / self.rate - now
        if wait > 0:
            time.sleep(wait)


def serve(port_file, mbps, stats_file):
    pace = Pace(mbps)
    sent = {"samples": 0, "warmup": 0}
    lock = threading.Lock()
    body = os.urandom(SAMPLE)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            head = (f"{self.protocol_version} 200 OK\r\nContent-Type: application/octet-stream\r\n"
                    f"Content-Length: {SAMPLE}\r\n\r\n").encode()
            self.wfile.write(head)
            n = len(head)
            for off in range(0, SAMPLE, CHUNK):
                chunk = body[off:off + CHUNK]
                pace.take(len(chunk))
                self.wfile.write(chunk)
                n += len(chunk)
            self.wfile.flush()
            with lock:
                sent["warmup" if self.path.startswith("/warmup/") else "samples"] += n

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True

    def stop(*_):
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    tmp = port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.server_address[1]))
    os.replace(tmp, port_file)
    server.serve_forever()
    with lock:
        stats = {"sent_bytes": sent["samples"], "warmup_bytes": sent["warmup"]}
    with open(stats_file, "w") as f:
        json.dump(stats, f)


def fetch_loop(port, indices, results, gate):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    got = 0
    if gate:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        conn.request("GET", f"/warmup/{os.getpid()}")
        conn.getresponse().read()
        results.put((os.getpid(), -1, 0))
        while not os.path.exists(gate):
            time.sleep(0.02)
    for i in indices:
        if gate:
            conn.request("GET", f"/sample/{i}")
            data = conn.getresponse().read()
        else:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/sample/{i}", timeout=120) as r:
                data = r.read()
        got += len(data)
        results.put((os.getpid(), i, len(data)))
    results.put((os.getpid(), None, got))


def load(port, workers, samples, truth_path, gate=None):
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    procs = [ctx.Process(target=fetch_loop, args=(port, list(range(w, samples, workers)), results, gate),
                         daemon=True)
             for w in range(workers)]
    for p in procs:
        p.start()
    if gate:
        for _ in procs:
            results.get()  # each worker's warm-up
        print(f"PID {os.getpid()}", flush=True)
    got, done = {}, 0
    while done < workers:
        pid, i, n = results.get()
        if i is None:
            got[pid] = n
            done += 1
    for p in procs:
        p.join()
    with open(truth_path, "w") as f:
        json.dump({"trainer": os.getpid(), "workers": got}, f)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2], float(sys.argv[3]), sys.argv[4])
    else:
        load(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], *sys.argv[6:7])
