#!/usr/bin/env python3
"""Single-machine throughput: tandem vs llama.cpp on the same synthetic models (1B-shaped, or with --shape
qwen0.5b Qwen2.5-0.5B-shaped).

Makes the models when missing (tandem synth, random weights, a real vocabulary), runs
`tandem bench -o json` on each and, when a llama.cpp `llama-bench` binary is given (--llama-bench or
$LLAMA_BENCH), runs it on the same files with the same tests and thread counts. Writes a side-by-side table
into docs/benchmarks.md between the shape's markers (only that section changes) and keeps the raw JSON of
both beside the models.

  bench/run-single.py                                   # tandem only
  LLAMA_BENCH=/path/to/llama-bench bench/run-single.py  # side by side
  bench/run-single.py --types q4_0 -t 1 --rounds 1 --no-doc   # quick look, nothing written to docs/
  bench/run-single.py --shape qwen0.5b --types q4_k_m,q5_k_m  # the K-quant files of a 896-wide model
  bench/run-single.py --types q2_k,q3_k_m,q5_k_m,q6_k --table "other K-quant files"  # a table of its own

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
# Model shapes (--shape): the label in the table, the file name prefix, synth's shape flags, the default
# vocabulary, the doc section's title and its markers.
SHAPES = {
    # Llama-3.2-1B-like (16 layers, 2048 wide, GQA 32/8) with the llama SPM vocabulary.
    "1b": {
        "label": "1B",
        "prefix": "1b",
        "synth": ["--dim", "2048", "--layers", "16", "--heads", "32", "--kv-heads", "8", "--ffn", "5632"],
        "vocab": "ggml-vocab-llama-spm.gguf",
        "title": "Single machine: tandem vs llama.cpp (1B synthetic)",
        "markers": "bench:run-single",
    },
    # Qwen2.5-0.5B-like (qwen2 biases, 24 layers, 896 wide, GQA 14/2, tied output). Rows of 896 are not a
    # multiple of 256, so its K-quant files are mostly llama.cpp's fallback types (q4_k_m: q5_0 and q8_0).
    # The GPT-2 vocabulary (50257 tokens) stands in for Qwen's 151936.
    "qwen0.5b": {
        "label": "0.5B qwen2",
        "prefix": "qwen05b",
        "synth": ["--arch", "qwen2", "--dim", "896", "--layers", "24", "--heads", "14", "--kv-heads", "2",
                  "--ffn", "4864", "--tied"],
        "vocab": "ggml-vocab-gpt-2.gguf",
        "title": "Single machine: tandem vs llama.cpp (Qwen2.5-0.5B-shaped synthetic)",
        "markers": "bench:run-single:qwen0.5b",
    },
}


def log(msg):
    print(f"run-single: {msg}", file=sys.stderr, flush=True)


def default_tandem():
    for rel in ("build/release/tandem", "build/tandem"):
        path = os.path.join(REPO, rel)
        if os.access(path, os.X_OK):
            return path
    return os.path.join(REPO, "build/release/tandem")


def make_model(tandem, vocab, out_dir, shape, wtype):
    """Returns (path, None) or (None, why it was skipped)."""
    path = os.path.join(out_dir, f"{shape['prefix']}-{wtype}.gguf")
    if os.path.exists(path):
        return path, None
    log(f"synthesizing {path}")
    cmd = [tandem, "synth", "-o", path + ".part", *shape["synth"], "--vocab-from", vocab, "--type", wtype]
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


def table(results, skipped, have_llama, label):
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
            row = f"| {label} {wtype} | {size} | {test_name(rec)} | {rec['n_threads']} | {median(ours):.2f} |"
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


def table_shape(args):
    """The shape's entry, with its markers and title made its own for a named --table."""
    shape = dict(SHAPES[args.shape])
    if args.table:
        slug = "-".join(args.table.lower().split())
        shape["markers"] = f"{shape['markers']}:{slug}"
        shape["title"] = f"{shape['title']}: {args.table}"
    return shape


def section(args, results, skipped, have_llama, tandem_commit, llama_commit):
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cmd = f"tandem bench -p {args.p} -n {args.n} -t {args.t} -r {args.r} -o json"
    rounds = (f"{args.rounds} rounds per model; in each, every test (one size at one thread count) runs once in"
              " each engine back to back, which engine goes first alternating")
    shape = table_shape(args)
    flags = "" if args.shape == "1b" else f" --shape {args.shape}"
    if args.table:
        flags += f" --types {args.types} --table \"{args.table}\""
    parts = [
        f"<!-- {shape['markers']}:begin -->",
        "",
        f"Measured {now} on {cpu_name()} ({os.cpu_count()} logical CPUs), tandem `{tandem_commit}`"
        + (f", llama.cpp `{llama_commit}`" if have_llama else "")
        + ".",
        f"Command: `bench/run-single.py{flags}` → `{cmd}`"
        + (" and `llama-bench` with the same -p/-n/-t/-r on the same files." if have_llama else "."),
        f"{rounds}; t/s is the median over the rounds of each round's mean; the ratio is the median of the"
        " per-round ratios (each listed), > 1 means tandem is faster. Pairs measured seconds apart, in alternating"
        " order, keep slow drifts of a shared host (its memory bandwidth varies over minutes) from landing on one"
        " engine only.",
    ]
    if args.note:
        parts += ["", f"**Caveat:** {args.note}"]
    parts += ["", table(results, skipped, have_llama, shape["label"]), "", f"<!-- {shape['markers']}:end -->"]
    return "\n".join(parts)


def write_doc(doc, text, shape):
    begin, end_marker = f"<!-- {shape['markers']}:begin -->", f"<!-- {shape['markers']}:end -->"
    content = ""
    if os.path.exists(doc):
        with open(doc) as f:
            content = f.read()
    if begin in content and end_marker in content:
        start = content.index(begin)
        end = content.index(end_marker) + len(end_marker)
        content = content[:start] + text + content[end:]
    else:
        if content and not content.endswith("\n"):
            content += "\n"
        content += f"\n## {shape['title']}\n\n" + text + "\n"
    with open(doc, "w") as f:
        f.write(content)
    log(f"updated {doc}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("llama_bench_pos", nargs="?", help="path of llama.cpp's llama-bench (or $LLAMA_BENCH)")
    ap.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH", ""))
    ap.add_argument("--tandem", default=os.environ.get("TANDEM_BIN", default_tandem()))
    ap.add_argument("--dir", default=os.environ.get("TANDEM_BENCH_DIR", "/tmp/tandem-bench"))
    ap.add_argument("--shape", default="1b", choices=sorted(SHAPES), help="model shape (default 1b)")
    ap.add_argument("--vocab", default="", help="vocabulary GGUF (default: the shape's, from ../shared/vocab)")
    ap.add_argument("--types", default="q4_0,q8_0,q4_k_m", help="weight types, comma-separated")
    ap.add_argument("-p", default="512")
    ap.add_argument("-n", default="128")
    ap.add_argument("-t", default="1,2")
    ap.add_argument("-r", default="2", help="repetitions per round (each engine's own -r)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per model (each runs every test in both engines)")
    ap.add_argument("--doc", default=os.path.join(REPO, "docs", "benchmarks.md"))
    ap.add_argument("--no-doc", action="store_true", help="print the table instead of updating the doc")
    ap.add_argument("--note", default="", help="caveat printed above the table (e.g. a shared machine)")
    ap.add_argument("--table", default="",
                    help="name of a table of its own for these types (default: the shape's main table)")
    args = ap.parse_args()
    llama = args.llama_bench_pos or args.llama_bench
    if not os.access(args.tandem, os.X_OK):
        sys.exit(f"run-single: no tandem binary at {args.tandem} (build it or pass --tandem)")
    if llama and not os.access(llama, os.X_OK):
        sys.exit(f"run-single: no llama-bench binary at {llama}")
    os.makedirs(args.dir, exist_ok=True)
    shape = SHAPES[args.shape]
    vocab = args.vocab or os.path.join(REPO, "..", "shared", "vocab", shape["vocab"])

    results, skipped = [], []
    tandem_commit, llama_commit = "?", "?"
    for wtype in [t for t in args.types.split(",") if t]:
        path, why = make_model(args.tandem, vocab, args.dir, shape, wtype)
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
        write_doc(args.doc, text, table_shape(args))
        print(text)


if __name__ == "__main__":
    main()
