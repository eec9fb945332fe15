#!/usr/bin/env python3
"""make-checkpoint.py: write a sharded safetensors checkpoint for `pinmem
bench load` and scripts/torch-load.py, with the Python standard library only.

Usage: scripts/make-checkpoint.py DIR [--gib 4] [--shards 4]

DIR gets model-0000N-of-0000M.safetensors shards and
model.safetensors.index.json. Each shard holds, in file order, a few small
tensors (as a model's norms and biases) and then 64 MiB F32 tensors up to
its share of the size. The bytes are pseudo-random (a 64 MiB random block,
each tensor a different rotation of it), so that nothing compresses them.
"""
import argparse
import json
import os
import struct

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--gib", type=float, default=4)
    ap.add_argument("--shards", type=int, default=4)
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    big = 64 << 20
    block = os.urandom(big)
    per_shard = int(a.gib * (1 << 30)) // a.shards
    weight_map = {}
    k = 0
    for s in range(a.shards):
        name = f"model-{s + 1:05d}-of-{a.shards:05d}.safetensors"
        tensors = [(f"layers.{s}.norm{i}.weight", 16 << 10) for i in range(4)]
        left = per_shard - sum(n for _, n in tensors)
        i = 0
        while left >= big:
            tensors.append((f"layers.{s}.proj{i}.weight", big))
            left -= big
            i += 1
        if left >= 4:
            tensors.append((f"layers.{s}.proj{i}.weight", left // 4 * 4))
        header, off = {}, 0
        for t, n in tensors:
            header[t] = {"dtype": "F32", "shape": [n // 4], "data_offsets": [off, off + n]}
            off += n
            weight_map[t] = name
        h = json.dumps(header, separators=(",", ":")).encode()
        h += b" " * (-len(h) % 8)
        with open(os.path.join(a.dir, name), "wb") as f:
            f.write(struct.pack("<Q", len(h)))
            f.write(h)
            for t, n in tensors:
                r = (k * 4099) % big
                k += 1
                data = (block[r:] + block[:r])[:n]
                f.write(data)
    with open(os.path.join(a.dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    print(f"{a.dir}: {a.shards} shards, {len(weight_map)} tensors")

if __name__ == "__main__":
    main()
