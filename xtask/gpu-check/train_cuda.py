#!/usr/bin/env python3
"""Two PyTorch jobs for `cargo xtask gpu-check` that keep the GPU itself busy
or starve it from the host, for stall's CUDA probes on the real libraries.

  sync    each step multiplies --size square matrices --matmuls times and
          calls torch.cuda.synchronize(): the GPU is the bottleneck, and the
          main thread waits for it inside cudaDeviceSynchronize (spinning,
          CUDA's default schedule): stall should say gpu-busy, with the share
          inside the synchronizations
  launch  each step runs --ops tiny element-wise kernels on a 256-float
          tensor, then one .item(): the host cannot launch fast enough, the
          GPU idles between kernels: stall should name the launch rate

Prints `PID <pid>` first, then a line per step; runs for --seconds.
"""
import argparse
import os
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["sync", "launch"])
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--size", type=int, default=8192)
    p.add_argument("--matmuls", type=int, default=20)
    p.add_argument("--ops", type=int, default=2000)
    a = p.parse_args()
    print(f"PID {os.getpid()}", flush=True)
    dev = torch.device("cuda")
    end = time.monotonic() + a.seconds
    step = 0
    if a.mode == "sync":
        x = torch.randn(a.size, a.size, device=dev)
        while time.monotonic() < end:
            y = x
            for _ in range(a.matmuls):
                y = torch.mm(y, x).clamp_(-1, 1)
            torch.cuda.synchronize()
            step += 1
            print(f"step {step}", flush=True)
    else:
        x = torch.zeros(256, device=dev)
        while time.monotonic() < end:
            for _ in range(a.ops):
                x.add_(1.0)
            x.sum().item()
            step += 1
            print(f"step {step}", flush=True)


if __name__ == "__main__":
    main()
