#!/usr/bin/env python3
"""`tandem perplexity` against llama.cpp's llama-perplexity on the same model and text, in one run: the
perplexity each prints (they compute the same quantity, so they should agree to the rounding of the kernels)
and the speed of each, in paired rounds.

    bench/perplexity.py --llama-perplexity PATH [--model M] [--text FILE] [--ctx 128] [--threads 2]
                        [--rounds 3] [--json OUT]

Each round runs both on the whole text (chunks of --ctx tokens, the second half of each scored), in turn first.
The table gives each tool's PPL and its +/- and tokens/s: chunks x ctx over the process's wall
time (loading the model and tokenizing included, for both: llama-perplexity times only its first pass), and
the median of the paired speed ratios. Without --llama-perplexity only tandem runs. Python 3 standard library only.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run_tandem(a):
    t0 = time.perf_counter()
    p = subprocess.run([a.tandem, "perplexity", "-m", a.model, "-f", a.text, "-c", str(a.ctx), "-t", str(a.threads),
                        "--json"], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"tandem perplexity failed: {p.stderr[-500:]}")
    j = json.loads(p.stdout)
    return {"ppl": j["ppl"], "err": j["ppl_error"], "chunks": j["chunks"],
            "tps": j["chunks"] * a.ctx / wall, "wall": wall}


def run_llama(a):
    # llama.cpp's logger writes from a thread of its own, and now and then the process exits before the last
    # lines are out: such a run is run again.
    for _ in range(3):
        r = run_llama_once(a)
        if r:
            return r
    sys.exit("llama-perplexity printed no final estimate three times")


def run_llama_once(a):
    t0 = time.perf_counter()
    p = subprocess.run([a.llama_perplexity, "-m", a.model, "-f", a.text, "-c", str(a.ctx), "-t", str(a.threads),
                        "-b", "2048"], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    out = p.stdout + p.stderr
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", out)
    chunks = re.search(r"calculating perplexity over (\d+) chunks, n_ctx=(\d+), batch_size=(\d+), n_seq=(\d+)", out)
    if p.returncode != 0:
        sys.exit(f"llama-perplexity failed: {out[-800:]}")
    if not m or not chunks:
        return None
    n_chunks = int(chunks.group(1))
    return {"ppl": float(m.group(1)), "err": float(m.group(2)), "chunks": n_chunks,
            "tps": n_chunks * a.ctx / wall, "wall": wall}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=os.path.join(ROOT, "..", "shared", "models", "stories260K.gguf"))
    p.add_argument("--text", default=os.path.join(ROOT, "README.md"))
    p.add_argument("--tandem", default=os.environ.get("TANDEM", os.path.join(ROOT, "build", "release", "tandem")))
    p.add_argument("--llama-perplexity", default="")
    p.add_argument("--ctx", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json")
    a = p.parse_args()

    rows = []
    for r in range(a.rounds):
        order = ["tandem", "llama"] if r % 2 == 0 else ["llama", "tandem"]
        row = {}
        for who in order:
            if who == "llama" and not a.llama_perplexity:
                continue
            row[who] = run_tandem(a) if who == "tandem" else run_llama(a)
        rows.append(row)

    name = os.path.basename(a.model)
    print(f"model {name}, text {os.path.basename(a.text)}, chunks of {a.ctx}, {a.threads} threads")
    print("| round | tandem PPL | tandem tokens/s | llama.cpp PPL | llama.cpp tokens/s | tandem / llama.cpp |")
    print("|---|---|---|---|---|---|")
    ratios = []
    for i, row in enumerate(rows):
        t = row["tandem"]
        line = f"| {i + 1} | {t['ppl']:.4f} ± {t['err']:.4f} | {t['tps']:.0f} |"
        if "llama" in row:
            l = row["llama"]
            ratio = t["tps"] / l["tps"] if l["tps"] > 0 else float("nan")
            ratios.append(ratio)
            line += f" {l['ppl']:.4f} ± {l['err']:.4f} | {l['tps']:.0f} | {ratio:.2f}x |"
        else:
            line += " - | - | - |"
        print(line)
    summary = {"model": name, "ctx": a.ctx, "threads": a.threads, "rounds": rows}
    if ratios:
        med = statistics.median(ratios)
        rel = abs(rows[0]["tandem"]["ppl"] - rows[0]["llama"]["ppl"]) / rows[0]["llama"]["ppl"]
        print(f"median speed ratio {med:.2f}x; PPL differs by {rel * 100:.3f}% "
              f"({rows[0]['tandem']['chunks']} chunks each)")
        summary["median_ratio"] = med
        summary["ppl_rel_diff"] = rel
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
