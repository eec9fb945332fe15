#!/usr/bin/env python3
"""torch-load.py: time safetensors.torch.load_file(path, device="cuda:N").

The PyTorch reference for pinmem's loader (package load, `pinmem bench
load`): run it on the GPU machine against the same file, in the same
session, and compare the GB/s. It prints one JSON object on stdout:

  {"tool": "safetensors.torch.load_file", "path": ..., "device": "cuda:0",
   "bytes": <tensor bytes>, "file_bytes": ..., "versions": {...},
   "runs": [{"seconds": ..., "gbps": ..., "cold": false}, ...],
   "median_gbps": ...}

GB/s is 10^9 tensor bytes per second, from the call until
torch.cuda.synchronize() returns (CUDA is initialised before the first
timed run). With --drop-caches (root only) every run is preceded by
`sync; echo 3 > /proc/sys/vm/drop_caches`, as `pinmem bench load
--drop-caches` does for its cold rows.

Usage: scripts/torch-load.py FILE [--device cuda:0] [--repeat 3] [--drop-caches]
"""
import argparse
import json
import os
import statistics
import sys
import time


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--drop-caches", action="store_true")
    a = ap.parse_args()
    if a.repeat < 1:
        ap.error("--repeat must be at least 1")
    if a.drop_caches and os.geteuid() != 0:
        ap.error("--drop-caches needs root")

    import torch
    import safetensors
    from safetensors.torch import load_file

    torch.cuda.init()
    torch.zeros(1, device=a.device)  # create the context before timing
    torch.cuda.synchronize(a.device)

    runs = []
    nbytes = 0
    for _ in range(a.repeat):
        if a.drop_caches:
            drop_caches()
        t0 = time.perf_counter()
        tensors = load_file(a.file, device=a.device)
        torch.cuda.synchronize(a.device)
        dt = time.perf_counter() - t0
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        runs.append({"seconds": dt, "gbps": nbytes / dt / 1e9, "cold": a.drop_caches})
        del tensors
        torch.cuda.empty_cache()

    json.dump({
        "tool": "safetensors.torch.load_file",
        "path": a.file,
        "device": a.device,
        "bytes": nbytes,
        "file_bytes": os.path.getsize(a.file),
        "versions": {"torch": torch.__version__, "safetensors": safetensors.__version__,
                     "cuda": torch.version.cuda, "python": sys.version.split()[0]},
        "runs": runs,
        "median_gbps": statistics.median(r["gbps"] for r in runs),
    }, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
