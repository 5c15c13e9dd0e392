#!/usr/bin/env python3
"""The KV cache's type (`--kv-type`, llama.cpp's -ctk/-ctv) against generation speed deep into a context,
`tandem bench` side by side with a plain memory read.

    bench/kv-types.py --model M [--types f16,q8_0,q4_0] [--depths 0,2048] [--gen 32] [--rounds 3]
                      [--threads 2] [--tandem PATH] [--membw PATH]

Each round first measures a plain read (bench/membw, one buffer per thread), then runs
`tandem bench -p 0 -n GEN -d DEPTHS --kv-type T --no-warmup` once per type (filling the context to a depth
warms the weights), the order rotating between rounds. The table
gives per type and depth the median tokens/s, the median of the paired ratios against the first type, the KV
cache a sequence holds at that depth, and the bytes a token reads (the model file plus the K and V rows of every
earlier position, both halves of every layer) times tokens/s against the same round's plain read. Python 3
standard library only.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# Bytes per cached value (ggml's block layouts: q8_0 34 per 32, q4_0 18, q4_1 20, q5_0 22, q5_1 24).
BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
         "q5_0": 22 / 32, "q5_1": 24 / 32}


def kv_f16_per_token(tandem, model):
    """The f16 cache's bytes per position, all layers, from `tandem info`."""
    p = subprocess.run([tandem, "info", "-m", model], capture_output=True, text=True, check=True)
    layers = re.search(r"^layers:\s+(\d+)", p.stdout, re.M)
    m = re.search(r"KV cache ([\d.]+) (B|KiB|MiB) per token \(f16\)", p.stdout)
    if not m or not layers:
        sys.exit(f"cannot read the KV cache's size from `tandem info`:\n{p.stdout}")
    scale = {"B": 1, "KiB": 1024, "MiB": 1024 * 1024}[m.group(2)]
    return float(m.group(1)) * scale * int(layers.group(1))


def plain_read(membw, threads):
    p = subprocess.run([membw, str(threads), "256", "3"], capture_output=True, text=True, check=True)
    return float(re.search(r"([\d.]+) GB/s", p.stdout).group(1))


def bench(tandem, model, kv, depths, gen, threads):
    args = [tandem, "bench", "-m", model, "-p", "0", "-n", str(gen), "-d", depths, "--kv-type", kv, "-r", "1",
            "-t", str(threads), "--no-warmup", "-o", "jsonl"]
    p = subprocess.run(args, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        sys.exit(f"{' '.join(args)}: {p.stderr}")
    out = {}
    for line in p.stdout.splitlines():
        r = json.loads(line)
        out[r["n_depth"]] = r["avg_ts"]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--types", default="f16,q8_0,q4_0")
    ap.add_argument("--depths", default="0,2048")
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tandem", default=os.path.join(ROOT, "build", "release", "tandem"))
    ap.add_argument("--membw", default=os.path.join(ROOT, "build", "release", "bench", "membw"))
    a = ap.parse_args()
    types = a.types.split(",")
    depths = [int(d) for d in a.depths.split(",")]
    kv16 = kv_f16_per_token(a.tandem, a.model)
    weights = os.path.getsize(a.model)
    speed = {(t, d): [] for t in types for d in depths}
    reads, streamed = [], {(t, d): [] for t in types for d in depths}
    for r in range(a.rounds):
        bw = plain_read(a.membw, a.threads)
        reads.append(bw)
        for t in types[r % len(types):] + types[:r % len(types)]:
            got = bench(a.tandem, a.model, t, a.depths, a.gen, a.threads)
            for d in depths:
                speed[(t, d)].append(got[d])
                # A token at depth d + gen/2 on average reads the weights and that many positions' K and V.
                kv_bytes = kv16 * BYTES[t] / 2.0 * (d + a.gen / 2)
                streamed[(t, d)].append((weights + kv_bytes) * got[d] / 1e9 / bw)
    print(f"plain read ({a.threads} threads): {', '.join(f'{x:.1f}' for x in reads)} GB/s by round")
    print("| KV type | depth | KV cache of the sequence | tokens/s (median) | rounds | vs "
          f"{types[0]} (median of paired) | bytes read per token x tokens/s, of the plain read |")
    print("| --- | ---: | ---: | ---: | --- | ---: | ---: |")
    for d in depths:
        for t in types:
            ratios = [s / b for s, b in zip(speed[(t, d)], speed[(types[0], d)])]
            mib = kv16 * BYTES[t] / 2.0 * (d + a.gen) / 2**20
            spread = f"{min(speed[(t, d)]):.1f}-{max(speed[(t, d)]):.1f}"
            print(f"| {t} | {d} | {mib:.0f} MiB | {statistics.median(speed[(t, d)]):.2f} | {spread} | "
                  f"{statistics.median(ratios):.2f}x | {statistics.median(streamed[(t, d)]):.2f} |", flush=True)


if __name__ == "__main__":
    main()
