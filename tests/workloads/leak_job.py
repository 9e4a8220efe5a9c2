#!/usr/bin/env python3
"""A job that names every kind of detail the daemon keeps to itself without
--expose-details, each carrying a marker the test looks for in every byte
the daemon serves and logs (tests/tests/redaction.rs). Standard library
only (the VMs carry nothing else).

  job     (in the job's cgroup) a thread named <m>thr reads <dir>/<m>data/
          shard.bin throughout; the main thread, one phase after another:
          waits in flock on <dir>/<m>lock (held by `hold`), waits for a
          child whose command line carries <m>child, uploads to a server on
          127.0.0.1:PORT (`serve`), writes stdout into a pipe read by `read`.
          Its own command line carries <m>cmd.
  hold    (outside) holds the lock for --seconds, named <m>hold
  serve   (outside) takes uploads slowly on PORT
  read    (outside) reads stdin slowly, named <m>pipe
"""
import argparse
import ctypes
import fcntl
import os
import socket
import subprocess
import sys
import threading
import time

libc = ctypes.CDLL(None, use_errno=True)
PR_SET_NAME = 15


def name_thread(name):
    libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def read_throughout(path, stop):
    name_thread(os.path.basename(os.path.dirname(path)).replace("data", "thr"))
    with open(path, "rb") as f:
        while not stop.is_set():
            if not f.read(1 << 20):
                f.seek(0)
            time.sleep(0.02)


def job(a):
    data = os.path.join(a.dir, f"{a.marker}data", "shard.bin")
    stop = threading.Event()
    t = threading.Thread(target=read_throughout, args=(data, stop))
    t.start()
    with open(os.path.join(a.dir, f"{a.marker}lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held by `hold` for a while
        fcntl.flock(lock, fcntl.LOCK_UN)
    subprocess.run([sys.executable, "-c", "import time, sys; time.sleep(float(sys.argv[1]))",
                    str(a.phase_s), f"{a.marker}child"], check=True)
    with socket.create_connection(("127.0.0.1", a.port)) as s:
        end = time.monotonic() + a.phase_s
        while time.monotonic() < end:
            s.sendall(bytes(1 << 16))
    end = time.monotonic() + a.phase_s
    while time.monotonic() < end:
        sys.stdout.buffer.write(bytes(1 << 16))
        sys.stdout.flush()
    stop.set()
    t.join()


def hold(a):
    name_thread(f"{a.marker}hold")
    with open(os.path.join(a.dir, f"{a.marker}lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        print("held", flush=True)
        time.sleep(a.phase_s)


def serve(a):
    srv = socket.create_server(("127.0.0.1", a.port))
    print("listening", flush=True)
    conn, _ = srv.accept()
    while conn.recv(1 << 14):
        time.sleep(0.05)


def read(a):
    name_thread(f"{a.marker}pipe")
    while sys.stdin.buffer.read(1 << 14):
        time.sleep(0.05)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["job", "hold", "serve", "read"])
    p.add_argument("--marker", required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--phase-s", type=float, default=6.0)
    p.add_argument("--tag", help="carried on the command line only")
    a = p.parse_args()
    {"job": job, "hold": hold, "serve": serve, "read": read}[a.mode](a)


if __name__ == "__main__":
    main()
