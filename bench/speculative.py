#!/usr/bin/env python3
"""Speculative decoding by prompt lookup (`--draft N`) and with a draft model (`--model-draft D --draft N`)
against plain decoding, `tandem run` side by side.

    bench/speculative.py --model M [--model M2 ...] [--draft 2,6] [--tokens 160] [--rounds 3] [--threads 2]
                         [--model-draft D [--model-draft D2 ...] [--model-draft-n 4,8] [--draft-p-min P]]
                         [--run-args "--workers A,B --transport tcp"]

Each round runs every setting once (no drafts, then each --draft value, then each draft model with each
--model-draft-n value; the order rotates between rounds) with
greedy sampling on the same prompt, checks that every setting printed the same text, and reads the
generation tokens/s and the guesses accepted from tandem's stderr. The table gives per model and setting the
median tokens/s, the median of the paired ratios against no drafts, the guesses accepted and tokens per
step. `--run-args` adds flags to every run (a cluster: start the workers, and `tandem relay`s for a slower link,
first). A guess is only accepted where the text repeats earlier text, so the gain depends on the model and the
prompt as much as on the machine. Python 3 standard library only.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PROMPT = ("Once upon a time, there was a little girl named Lily. Lily liked to play with her ball. "
          "One day, Lily went to the park with her mom. Once upon a time")


def run(tandem, model, tokens, threads, setting, extra):
    args = [tandem, "run", "-m", model, "-p", PROMPT, "-n", str(tokens), "--temp", "0", "-t", str(threads)]
    args += setting + extra
    p = subprocess.run(args, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        sys.exit(f"{' '.join(args)}: {p.stderr}")
    m = re.search(r"generation (\d+) tokens, ([\d.]+) tokens/s", p.stderr)
    d = re.search(r"draft: (\d+) of (\d+) guessed tokens accepted \| ([\d.]+) tokens per step", p.stderr)
    return p.stdout, float(m.group(2)), (int(d.group(1)), int(d.group(2)), float(d.group(3))) if d else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--draft", default="2,6", help="prompt lookup's --draft values ('' for none)")
    ap.add_argument("--model-draft", action="append", default=[], help="a draft model (repeatable)")
    ap.add_argument("--model-draft-n", default="4,8", help="--draft values with a draft model")
    ap.add_argument("--draft-p-min", default="0.75")
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tandem", default=os.path.join(ROOT, "build", "release", "tandem"))
    ap.add_argument("--run-args", default="", help="more flags for every `tandem run`")
    a = ap.parse_args()
    # (label, flags); the first is the baseline.
    settings = [("none", ["--draft", "0"])]
    settings += [(f"lookup {d}", ["--draft", d]) for d in a.draft.split(",") if d]
    for md in a.model_draft:
        for d in a.model_draft_n.split(","):
            settings.append((f"{os.path.basename(md)} {d}",
                             ["--draft", d, "--model-draft", md, "--draft-p-min", a.draft_p_min]))
    print("| model | guesses (--draft) | tokens/s (median) | rounds | vs no drafts (median of paired) | "
          "guesses accepted | tokens per step |")
    print("| --- | --- | ---: | --- | ---: | ---: | ---: |")
    for model in a.model:
        speed = {label: [] for label, _ in settings}
        stats = {}
        for r in range(a.rounds):
            order = settings[r % len(settings):] + settings[:r % len(settings)]
            texts = {}
            for label, flags in order:
                text, tps, st = run(a.tandem, model, a.tokens, a.threads, flags, a.run_args.split())
                texts[label] = text
                speed[label].append(tps)
                if st:
                    stats[label] = st
            if len(set(texts.values())) != 1:
                sys.exit(f"{model}: the texts differ between settings in round {r}")
        name = os.path.basename(model)
        base = settings[0][0]
        for label, _ in settings:
            ratios = [s / b for s, b in zip(speed[label], speed[base])]
            acc = f"{stats[label][0]} of {stats[label][1]}" if label in stats else "-"
            per = f"{stats[label][2]:.2f}" if label in stats else "1.00"
            spread = f"{min(speed[label]):.0f}-{max(speed[label]):.0f}"
            print(f"| {name} | {label} | {statistics.median(speed[label]):.1f} | {spread} | "
                  f"{statistics.median(ratios):.2f}x | {acc} | {per} |", flush=True)


if __name__ == "__main__":
    main()
