#!/usr/bin/env python3
"""Samples from an object store: a DataLoader-shaped job whose workers fetch
their samples over HTTP, and the slow server outside the job they fetch
from. Standard library only.

`serve PORT_FILE MBPS STATS_FILE`: an HTTP server on a free loopback port
(written to PORT_FILE) answering `GET /sample/N` with a 4 MiB body, all
connections together paced to MBPS. It stops on SIGTERM, and then writes
the bytes it sent (status lines, headers and bodies: what went into its
sockets) to STATS_FILE.

`load PORT WORKERS SAMPLES TRUTH`: the trainer forks WORKERS processes; each
fetches its share of SAMPLES samples with urllib (one connection per
sample, as urlopen does) and hands each to the trainer over a
multiprocessing queue; the trainer waits for them. Writes the truth: the
trainer's and workers' pids and the body bytes each worker received.
"""
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
    sent = [0]
    lock = threading.Lock()
    body = os.urandom(SAMPLE)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, *args):
            pass

        def do_GET(self):
            head = (f"HTTP/1.0 200 OK\r\nContent-Type: application/octet-stream\r\n"
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
                sent[0] += n

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
        total = sent[0]
    with open(stats_file, "w") as f:
        json.dump({"sent_bytes": total}, f)


def fetch_loop(port, indices, results):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    got = 0
    for i in indices:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/sample/{i}", timeout=120) as r:
            data = r.read()
        got += len(data)
        results.put((os.getpid(), i, len(data)))
    results.put((os.getpid(), None, got))


def load(port, workers, samples, truth_path):
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    procs = [ctx.Process(target=fetch_loop, args=(port, list(range(w, samples, workers)), results), daemon=True)
             for w in range(workers)]
    for p in procs:
        p.start()
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
        load(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
