#!/usr/bin/env bash
# Two-stage pipeline vs one node: prompt processing (pp) and generation (tg) tokens/s with `tandem run`.
# Each node gets one thread pinned to its own core (taskset): node A on core 0, node B on core 1; the
# single-node baseline runs on core 0. The head only tokenizes and queues steps.
#
#   bench/cluster-pipeline.sh [MODEL] [N_PROMPT] [N_GEN] [CHUNK]
#
# MODEL defaults to a 1B-shaped Q4_0 model with random weights (made once with `tandem synth`).
# CHUNK is the prompt chunk (-b) of the cluster run: chunks flow down the pipeline back to back.
# Prints a markdown table (docs/benchmarks.md, "Cluster: two-stage pipeline").
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${TANDEM:-$here/build/release/tandem}
model=${1:-/tmp/models/1b-q4_0.gguf}
n_prompt=${2:-512}
n_gen=${3:-128}
chunk=${4:-64}
wire=${WIRE:-f16}

if [[ ! -x $bin ]]; then echo "no tandem binary at $bin (set TANDEM=...)" >&2; exit 1; fi
if [[ ! -f $model ]]; then
  mkdir -p "$(dirname "$model")"
  "$bin" synth -o "$model" --dim 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 5632 \
    --vocab-from "$here/../shared/vocab/ggml-vocab-llama-spm.gguf" --type q4_0
fi

tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT

# A prompt of n_prompt tokens: " the" is one SPM token, after BOS.
python3 -c "import sys; sys.stdout.write(' '.join(['the'] * ($n_prompt - 1)))" > "$tmp/prompt.txt"

start_worker() {  # core, log: starts in this shell (so cleanup sees the pid)
  taskset -c "$1" "$bin" worker --listen 127.0.0.1:0 -t 1 --model "$model" --cache-dir "$tmp/cache" \
    </dev/null >/dev/null 2>"$2" &
  pids+=($!)
}
worker_address() {  # log
  for _ in $(seq 1 600); do
    grep -q "listening on" "$1" && break
    sleep 0.1
  done
  sed -n 's|.*listening on \(.*\)$|\1|p' "$1"
}

parse() {  # stderr of tandem run -> "pp tg"
  sed -n 's|.*prompt \([0-9]*\) tokens, \([0-9.]*\) tokens/s . generation \([0-9]*\) tokens, \([0-9.]*\) tokens/s.*|\2 \4|p' "$1"
}

common=(-m "$model" -f "$tmp/prompt.txt" -n "$n_gen" --temp 0 -c $((n_prompt + n_gen + 8)))
taskset -c 0 "$bin" run "${common[@]}" -t 1 -b "$n_prompt" >/dev/null 2>"$tmp/local.err"
read -r local_pp local_tg < <(parse "$tmp/local.err")

start_worker 0 "$tmp/a.log"
start_worker 1 "$tmp/b.log"
a=$(worker_address "$tmp/a.log")
b=$(worker_address "$tmp/b.log")
"$bin" run "${common[@]}" --workers "$a,$b" --split 1,1 --wire "$wire" -b "$chunk" --stats >/dev/null 2>"$tmp/cluster.err"
read -r cl_pp cl_tg < <(parse "$tmp/cluster.err")

echo "| setup | pp$n_prompt tok/s | tg$n_gen tok/s |"
echo "|---|---:|---:|"
echo "| one node, 1 thread (core 0), -b $n_prompt | $local_pp | $local_tg |"
echo "| 2 stages x 1 thread (cores 0,1), wire $wire, -b $chunk | $cl_pp | $cl_tg |"
python3 -c "print('| ratio | %.2fx | %.2fx |' % ($cl_pp / $local_pp, $cl_tg / $local_tg))"
grep -A10 "cluster stats" "$tmp/cluster.err" >&2 || true
