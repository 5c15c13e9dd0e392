#!/usr/bin/env bash
# Two-stage pipeline vs one node, with `tandem bench` on both sides (same tests, same report):
#   pp<N_PROMPT>  one prompt; the cluster cuts it into chunks that flow down the pipeline back to back
#   tg<N_GEN>     one sequence, token by token (each token's round trip through both stages)
#   tg<N_PAR_GEN> x PARALLEL sequences decoding together (aggregate tokens/s); the cluster keeps one
#                 micro-batch per stage in flight
# Each worker has one thread pinned to its own core (taskset -c 0 and -c 1); the one-node baseline has one
# thread on core 0. The head is not pinned (with --head-layers 0 it only queues steps and reads results).
# The machine may be shared: every round runs the baseline and the cluster back to back, and the table
# reports the median of the per-round ratios, with the load average before and after.
#
#   bench/cluster-pipeline.sh [MODEL] [ROUNDS]
#   env: TANDEM (binary), N_PROMPT (512), N_GEN (128), PARALLEL (16), N_PAR_GEN (32), WIRE (f16),
#        HEAD_LAYERS (0), CHUNK (0: automatic)
#
# MODEL defaults to /tmp/tandem-bench/1b-q4_0.gguf, a 1B-shaped Q4_0 model with random weights (made once
# with `tandem synth` when missing). Prints a markdown table (docs/benchmarks.md, "Cluster").
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${TANDEM:-$here/build/release/tandem}
model=${1:-/tmp/tandem-bench/1b-q4_0.gguf}
rounds=${2:-3}
n_prompt=${N_PROMPT:-512}
n_gen=${N_GEN:-128}
parallel=${PARALLEL:-16}
n_par_gen=${N_PAR_GEN:-32}
wire=${WIRE:-f16}
head_layers=${HEAD_LAYERS:-0}
chunk=${CHUNK:-0}

if [[ ! -x $bin ]]; then echo "no tandem binary at $bin (set TANDEM=...)" >&2; exit 1; fi
if [[ ! -f $model ]]; then
  mkdir -p "$(dirname "$model")"
  "$bin" synth -o "$model" --dim 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 5632 \
    --vocab-from "$here/../shared/vocab/ggml-vocab-llama-spm.gguf" --type q4_0
fi

tmp=$(mktemp -d)
source "$here/bench/workers.sh"

start_worker 0 "$tmp/a.log" --model "$model" --cache-dir "$tmp/cache"
start_worker 1 "$tmp/b.log" --model "$model" --cache-dir "$tmp/cache"
a=$(worker_address "$tmp/a.log")
b=$(worker_address "$tmp/b.log")
cluster=(--workers "$a,$b" --split "${SPLIT:-1,1}" --wire "$wire" --head-layers "$head_layers" --chunk "$chunk")

# tandem bench -o jsonl -> "avg_ts" per line, in test order.
ts() { python3 -c 'import json,sys; print(" ".join("%.3f" % json.loads(l)["avg_ts"] for l in sys.stdin if l.strip()))'; }

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
: > "$tmp/rows"
for r in $(seq 1 "$rounds"); do
  common=(-m "$model" -t 1 -r 1 -o jsonl)
  local_a=$(taskset -c 0 "$bin" bench "${common[@]}" -p "$n_prompt" -n "$n_gen" 2>/dev/null | ts)
  local_b=$(taskset -c 0 "$bin" bench "${common[@]}" -p 0 -n "$n_par_gen" --parallel "$parallel" 2>/dev/null | ts)
  cl_a=$("$bin" bench "${common[@]}" "${cluster[@]}" -p "$n_prompt" -n "$n_gen" 2>"$tmp/cluster.err" | ts)
  cl_b=$("$bin" bench "${common[@]}" "${cluster[@]}" -p 0 -n "$n_par_gen" --parallel "$parallel" 2>>"$tmp/cluster.err" | ts)
  echo "$local_a $local_b $cl_a $cl_b" >> "$tmp/rows"
  echo "round $r: local pp/tg/par $local_a $local_b | cluster $cl_a $cl_b" >&2
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$tmp/rows" "$n_prompt" "$n_gen" "$parallel" "$n_par_gen" "$wire" "$head_layers" "$load_before" "$load_after" <<'EOF'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
n_prompt, n_gen, par, n_par_gen, wire, head, lb, la = sys.argv[2:]
names = [f"pp{n_prompt}", f"tg{n_gen}", f"tg{n_par_gen} x{par} seqs (aggregate)"]
targets = [1.7, 0.97, 1.8]
print(f"| test | one node, 1 thread (core 0) t/s | 2 stages x 1 thread (cores 0, 1) t/s | ratio (median of {len(rows)} rounds) | target |")
print("|---|---:|---:|---:|---:|")
for k, name in enumerate(names):
    loc = [r[k] for r in rows]
    cl = [r[3 + k] for r in rows]
    ratios = [c / l for c, l in zip(cl, loc)]
    print(f"| {name} | {statistics.median(loc):.2f} | {statistics.median(cl):.2f} | "
          f"{statistics.median(ratios):.2f}x ({', '.join('%.2f' % x for x in ratios)}) | {targets[k]}x |")
print(f"\nwire {wire}, head layers {head}; load average before: {lb}, after: {la}")
EOF
grep -A6 "cluster stats" "$tmp/cluster.err" | tail -7 >&2 || true
