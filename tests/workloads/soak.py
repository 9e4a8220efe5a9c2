#!/usr/bin/env python3
"""Soak test for `stall daemon` (cargo xtask soak): jobs start and stop in
cgroups every few seconds for --minutes; the daemon's memory is sampled and
must stay flat; after SIGTERM none of its BPF programs may remain.

Prints a table of samples and a verdict line; exit 1 if memory grew or
programs leaked.
"""
import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
JOBS = os.path.join(HERE, "jobs.py")
libc = ctypes.CDLL(None, use_errno=True)
SYS_BPF = 321  # x86-64
BPF_PROG_GET_FD_BY_ID = 13


def prog_loaded(prog_id):
    attr = (ctypes.c_uint32 * 4)(prog_id, 0, 0, 0)
    fd = libc.syscall(SYS_BPF, BPF_PROG_GET_FD_BY_ID, ctypes.byref(attr), ctypes.sizeof(attr))
    if fd >= 0:
        os.close(fd)
        return True
    return False


def prog_ids(pid):
    ids = set()
    d = f"/proc/{pid}/fdinfo"
    for name in os.listdir(d):
        try:
            with open(os.path.join(d, name)) as f:
                for line in f:
                    if line.startswith("prog_id:"):
                        ids.add(int(line.split()[1]))
        except OSError:
            pass
    return ids


def status_kb(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def cgroup2_mount():
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, post = line.split(" - ", 1)
            if post.split()[0] == "cgroup2":
                return pre.split()[4]
    raise SystemExit("no cgroup2 mount")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stall", required=True)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--every", type=float, default=2.0, help="seconds between job starts")
    ap.add_argument("--port", type=int, default=19555)
    a = ap.parse_args()

    mount = cgroup2_mount()
    root_rel = f"stall-soak-{os.getpid()}"
    root = os.path.join(mount, root_rel)
    os.makedirs(root)
    data = f"/var/tmp/stall-soak-{os.getpid()}"
    os.makedirs(data)
    files = []
    for i in range(4):
        p = os.path.join(data, f"f{i}.bin")
        with open(p, "wb") as f:
            f.write(os.urandom(2_000_000 + i))
        files.append(p)

    daemon = subprocess.Popen([a.stall, "daemon", "--cgroup-root", root_rel, "--all-jobs", "--gpu", "off",
                               "--interval", "1", "--listen", f"127.0.0.1:{a.port}"], stderr=subprocess.DEVNULL)
    time.sleep(2)
    ids = prog_ids(daemon.pid)
    print(f"soak: daemon pid {daemon.pid} holds {len(ids)} BPF programs; {a.minutes:g} min, a job every {a.every:g} s",
          flush=True)

    live = {}  # job dir -> Popen
    started = 0
    samples = []
    t0 = time.monotonic()
    next_job = t0
    next_sample = t0
    try:
        while time.monotonic() - t0 < a.minutes * 60:
            now = time.monotonic()
            if now >= next_job:
                d = os.path.join(root, f"job{started}")
                os.makedirs(d)
                kind = ["family", "waits", "family", "grandchild"][started % 4]
                args = {"family": files, "waits": ["1.5"], "grandchild": files[:1]}[kind]
                # A pause first, so the daemon (1 s interval) attaches before the work.
                cmd = (f"echo $$ > {d}/cgroup.procs && sleep 1.2 && exec {sys.executable} {JOBS} {kind} "
                       + " ".join(args))
                live[d] = subprocess.Popen(["sh", "-c", cmd], stdout=subprocess.DEVNULL)
                started += 1
                next_job += a.every
            for d, p in list(live.items()):
                if p.poll() is not None:
                    try:
                        os.rmdir(d)
                        del live[d]
                    except OSError:
                        pass  # not empty yet
            if now >= next_sample:
                try:
                    jobs = json.load(urllib.request.urlopen(f"http://127.0.0.1:{a.port}/jobs", timeout=5))
                except Exception:
                    jobs = []
                samples.append((now - t0, status_kb(daemon.pid, "VmRSS"), status_kb(daemon.pid, "VmHWM"),
                                started, len(jobs)))
                s = samples[-1]
                print(f"  t={s[0]:6.0f}s rss={s[1] / 1024:6.1f} MiB hwm={s[2] / 1024:6.1f} MiB "
                      f"jobs started={s[3]:4d} watched={s[4]:3d}", flush=True)
                next_sample += 30
            time.sleep(0.1)
    finally:
        for d, p in live.items():
            p.wait()
            try:
                os.rmdir(d)
            except OSError:
                pass
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(timeout=30)
        time.sleep(0.5)
        left = [i for i in ids if prog_loaded(i)]
        try:
            os.rmdir(root)
        except OSError:
            pass
        for p in files:
            os.unlink(p)
        os.rmdir(data)

    # Flat: after the first minute (maps and caches warm), RSS may not grow by
    # more than 10 % or 4 MiB, whichever is larger.
    warm = [s for s in samples if s[0] >= 60] or samples
    first, last = warm[0][1], warm[-1][1]
    growth = last - first
    flat = growth <= max(0.10 * first, 4096)
    print(f"soak: {started} jobs in {a.minutes:g} min; RSS after warm-up {first / 1024:.1f} -> {last / 1024:.1f} MiB "
          f"({'flat' if flat else 'GREW'}); peak {max(s[2] for s in samples) / 1024:.1f} MiB; daemon exit {code}; "
          f"programs left after SIGTERM: {len(left)}")
    sys.exit(0 if flat and not left and code == 0 else 1)


if __name__ == "__main__":
    main()
