#!/usr/bin/env python3
"""torch-load.py: time safetensors.torch.load_file(path, device="cuda:N").

FILE may also be a sharded checkpoint: its model.safetensors.index.json, or
a directory holding one (or else holding .safetensors files); every shard
is then loaded with load_file, one after the other, as transformers does,
and the run's time covers them all.

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

Usage: scripts/torch-load.py FILE|DIR|INDEX [--device cuda:0] [--repeat 3] [--drop-caches]
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


def shards(path):
    """The safetensors files of path: itself, or the shards of a checkpoint."""
    if os.path.isdir(path):
        index = os.path.join(path, "model.safetensors.index.json")
        if not os.path.exists(index):
            return sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".safetensors"))
        path = index
    if path.endswith(".index.json"):
        with open(path) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(os.path.dirname(path), n) for n in names]
    return [path]


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

    files = shards(a.file)
    runs = []
    nbytes = 0
    for _ in range(a.repeat):
        if a.drop_caches:
            drop_caches()
        t0 = time.perf_counter()
        tensors = {}
        for f in files:
            tensors.update(load_file(f, device=a.device))
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
        "file_bytes": sum(os.path.getsize(f) for f in files),
        "files": len(files),
        "versions": {"torch": torch.__version__, "safetensors": safetensors.__version__,
                     "cuda": torch.version.cuda, "python": sys.version.split()[0]},
        "runs": runs,
        "median_gbps": statistics.median(r["gbps"] for r in runs),
    }, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
