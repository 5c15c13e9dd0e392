#!/usr/bin/env python3
"""Single-machine throughput: tandem vs llama.cpp on the same 1B-shaped synthetic models.

Makes the models when missing (tandem synth, random weights, llama SPM vocabulary), runs
`tandem bench -o json` on each and, when a llama.cpp `llama-bench` binary is given (--llama-bench or
$LLAMA_BENCH), runs it on the same files with the same tests and thread counts. Writes a side-by-side table
into docs/benchmarks.md between its markers (only that section changes) and keeps the raw JSON of both
beside the models.

  bench/run-single.py                                   # tandem only
  LLAMA_BENCH=/path/to/llama-bench bench/run-single.py  # side by side
  bench/run-single.py --types q4_0 -t 1 --rounds 1 --no-doc   # quick look, nothing written to docs/

Models live outside the repository: $TANDEM_BENCH_DIR or /tmp/tandem-bench. Only the Python standard
library is used.
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN = "<!-- bench:run-single:begin -->"
END = "<!-- bench:run-single:end -->"

# Llama-3.2-1B-like shape (16 layers, 2048 wide, GQA 32/8) with the llama SPM vocabulary.
SHAPE = ["--dim", "2048", "--layers", "16", "--heads", "32", "--kv-heads", "8", "--ffn", "5632"]


def log(msg):
    print(f"run-single: {msg}", file=sys.stderr, flush=True)


def default_tandem():
    for rel in ("build/release/tandem", "build/tandem"):
        path = os.path.join(REPO, rel)
        if os.access(path, os.X_OK):
            return path
    return os.path.join(REPO, "build/release/tandem")


def make_model(tandem, vocab, out_dir, wtype):
    """Returns (path, None) or (None, why it was skipped)."""
    path = os.path.join(out_dir, f"1b-{wtype}.gguf")
    if os.path.exists(path):
        return path, None
    log(f"synthesizing {path}")
    cmd = [tandem, "synth", "-o", path + ".part", *SHAPE, "--vocab-from", vocab, "--type", wtype]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        why = (r.stderr.strip().splitlines() or ["synth failed"])[-1]
        log(f"skipping {wtype}: {why}")
        try:
            os.remove(path + ".part")
        except OSError:
            pass
        return None, why
    os.replace(path + ".part", path)
    return path, None


def run_json(cmd, raw_path):
    log(" ".join(cmd))
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with open(raw_path, "w") as f:
        f.write(r.stdout)
    if r.returncode != 0:
        raise RuntimeError(f"{cmd[0]} exited with {r.returncode}: {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout)


def key(rec):
    return (int(rec["n_prompt"]), int(rec["n_gen"]), int(rec["n_threads"]))


def test_name(rec):
    p, n = int(rec["n_prompt"]), int(rec["n_gen"])
    return f"pp{p}" if n == 0 else (f"tg{n}" if p == 0 else f"pp{p}+tg{n}")


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def table(results, skipped, have_llama):
    """results: (wtype, rounds) with rounds a list of (tandem records, llama records), one per round."""
    head = "| model | size | test | threads | tandem t/s |"
    sep = "| --- | ---: | --- | ---: | ---: |"
    if have_llama:
        head += " llama.cpp t/s | tandem / llama.cpp (rounds) |"
        sep += " ---: | ---: |"
    lines = [head, sep]
    for wtype, rounds in results:
        first = rounds[0][0]
        for rec in first:
            k = key(rec)
            ours = [r["avg_ts"] for t_recs, _ in rounds for r in t_recs if key(r) == k]
            size = f"{int(rec['model_size']) / 2**30:.2f} GiB"
            row = f"| 1B {wtype} | {size} | {test_name(rec)} | {rec['n_threads']} | {median(ours):.2f} |"
            if have_llama:
                ratios, theirs = [], []
                for t_recs, l_recs in rounds:
                    t = next((r for r in t_recs if key(r) == k), None)
                    l = next((r for r in l_recs if key(r) == k), None)
                    if t and l and l["avg_ts"]:
                        ratios.append(t["avg_ts"] / l["avg_ts"])
                        theirs.append(l["avg_ts"])
                if ratios:
                    each = ", ".join(f"{x:.2f}" for x in ratios)
                    row += f" {median(theirs):.2f} | {median(ratios):.2f} ({each}) |"
                else:
                    row += " — | — |"
            lines.append(row)
    for wtype, why in skipped:
        lines.append("")
        lines.append(f"- `{wtype}` skipped: {why}")
    return "\n".join(lines)


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def section(args, results, skipped, have_llama, tandem_commit, llama_commit):
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cmd = f"tandem bench -p {args.p} -n {args.n} -t {args.t} -r {args.r} -o json"
    rounds = (f"{args.rounds} rounds per model; in each, every test (one size at one thread count) runs once in"
              " each engine back to back, which engine goes first alternating")
    parts = [
        BEGIN,
        "",
        f"Measured {now} on {cpu_name()} ({os.cpu_count()} logical CPUs), tandem `{tandem_commit}`"
        + (f", llama.cpp `{llama_commit}`" if have_llama else "")
        + ".",
        f"Command: `bench/run-single.py` → `{cmd}`"
        + (" and `llama-bench` with the same -p/-n/-t/-r on the same files." if have_llama else "."),
        f"{rounds}; t/s is the median over the rounds of each round's mean; the ratio is the median of the"
        " per-round ratios (each listed), > 1 means tandem is faster. Pairs measured seconds apart, in alternating"
        " order, keep slow drifts of a shared host (its memory bandwidth varies over minutes) from landing on one"
        " engine only.",
    ]
    if args.note:
        parts += ["", f"**Caveat:** {args.note}"]
    parts += ["", table(results, skipped, have_llama), "", END]
    return "\n".join(parts)


def write_doc(doc, text):
    content = ""
    if os.path.exists(doc):
        with open(doc) as f:
            content = f.read()
    if BEGIN in content and END in content:
        start = content.index(BEGIN)
        end = content.index(END) + len(END)
        content = content[:start] + text + content[end:]
    else:
        if content and not content.endswith("\n"):
            content += "\n"
        content += "\n## Single machine: tandem vs llama.cpp (1B synthetic)\n\n" + text + "\n"
    with open(doc, "w") as f:
        f.write(content)
    log(f"updated {doc}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("llama_bench_pos", nargs="?", help="path of llama.cpp's llama-bench (or $LLAMA_BENCH)")
    ap.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH", ""))
    ap.add_argument("--tandem", default=os.environ.get("TANDEM_BIN", default_tandem()))
    ap.add_argument("--dir", default=os.environ.get("TANDEM_BENCH_DIR", "/tmp/tandem-bench"))
    ap.add_argument("--vocab", default=os.path.join(REPO, "..", "shared", "vocab", "ggml-vocab-llama-spm.gguf"))
    ap.add_argument("--types", default="q4_0,q8_0,q4_k_m", help="weight types, comma-separated")
    ap.add_argument("-p", default="512")
    ap.add_argument("-n", default="128")
    ap.add_argument("-t", default="1,2")
    ap.add_argument("-r", default="2", help="repetitions per round (each engine's own -r)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per model (each runs every test in both engines)")
    ap.add_argument("--doc", default=os.path.join(REPO, "docs", "benchmarks.md"))
    ap.add_argument("--no-doc", action="store_true", help="print the table instead of updating the doc")
    ap.add_argument("--note", default="", help="caveat printed above the table (e.g. a shared machine)")
    args = ap.parse_args()
    llama = args.llama_bench_pos or args.llama_bench
    if not os.access(args.tandem, os.X_OK):
        sys.exit(f"run-single: no tandem binary at {args.tandem} (build it or pass --tandem)")
    if llama and not os.access(llama, os.X_OK):
        sys.exit(f"run-single: no llama-bench binary at {llama}")
    os.makedirs(args.dir, exist_ok=True)

    results, skipped = [], []
    tandem_commit, llama_commit = "?", "?"
    for wtype in [t for t in args.types.split(",") if t]:
        path, why = make_model(args.tandem, args.vocab, args.dir, wtype)
        if path is None:
            skipped.append((wtype, why))
            continue
        # Each test (one -p or -n value at one thread count) runs as a pair, tandem then llama-bench or the
        # other way round (alternating), seconds apart: the host's memory bandwidth drifts over minutes, and a
        # pair measured back to back sees the same conditions.
        tests = [(p, "0") for p in args.p.split(",") if p and p != "0"]
        tests += [("0", n) for n in args.n.split(",") if n and n != "0"]
        threads = [t for t in args.t.split(",") if t]
        rounds = []
        for rnd in range(max(1, args.rounds)):
            tandem_recs, llama_recs = [], []
            for i, (t, (p, n)) in enumerate((t, pn) for t in threads for pn in tests):
                common = ["-m", path, "-p", p, "-n", n, "-t", t, "-r", args.r, "-o", "json"]
                tag = f"{wtype}-p{p}-n{n}-t{t}-r{rnd}"

                def run_tandem():
                    return run_json([args.tandem, "bench", *common], os.path.join(args.dir, f"tandem-{tag}.json"))

                def run_llama():
                    return run_json([llama, *common], os.path.join(args.dir, f"llama-{tag}.json")) if llama else []

                if (rnd + i) % 2 == 0:
                    ours, theirs = run_tandem(), run_llama()
                else:
                    theirs, ours = run_llama(), run_tandem()
                tandem_recs += ours
                llama_recs += theirs
            if tandem_recs:
                tandem_commit = tandem_recs[0]["build_commit"]
            if llama_recs:
                llama_commit = f"{llama_recs[0]['build_commit']} ({llama_recs[0]['build_number']})"
            rounds.append((tandem_recs, llama_recs))
        results.append((wtype, rounds))

    text = section(args, results, skipped, bool(llama), tandem_commit, llama_commit)
    if args.no_doc:
        print(text)
    else:
        write_doc(args.doc, text)
        print(text)


if __name__ == "__main__":
    main()
