#!/usr/bin/env bash
# The same cluster over TCP, shared memory and UCX, side by side: two workers on this host (one thread each,
# pinned to cores 0 and 1), `tandem bench` through them with --transport tcp, shm and ucx (when built):
#   --tp 2, tg<N_GEN>: one sequence token by token (two all-reduces per layer per token: latency decides)
#   2-stage pipeline, tg<N_PAR_GEN> x PARALLEL sequences (aggregate tokens/s)
# Every round runs them all back to back, rotating which transport goes first; the table reports medians
# of the per-round ratios to tcp. The round trips of the links themselves are bench/transport-rtt's.
#
#   bench/cluster-transport.sh [ROUNDS] [MODEL...]
#   env: TANDEM (binary), N_GEN (128), PARALLEL (16), N_PAR_GEN (32)
#
# MODELs default to the 1B-shaped Q4_0 model of bench/cluster-tp.sh and a 100M-shaped one (dim 512, 16 layers),
# whose layers are short enough that the links' latency shows (/tmp/tandem-bench, made once with
# `tandem synth`). Prints markdown tables (docs/benchmarks.md, "Transports").
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${TANDEM:-$here/build/release/tandem}
rounds=${1:-5}
shift || true
models=("$@")
n_gen=${N_GEN:-128}
parallel=${PARALLEL:-16}
n_par_gen=${N_PAR_GEN:-32}

if [[ ! -x $bin ]]; then echo "no tandem binary at $bin (set TANDEM=...)" >&2; exit 1; fi
if [[ ${#models[@]} -eq 0 ]]; then
  mkdir -p /tmp/tandem-bench
  vocab="$here/../shared/vocab/ggml-vocab-llama-spm.gguf"
  m=/tmp/tandem-bench/1b-q4_0.gguf
  [[ -f $m ]] || "$bin" synth -o "$m" --dim 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 5632 --vocab-from "$vocab" --type q4_0 >&2
  models+=("$m")
  m=/tmp/tandem-bench/100m-q4_0.gguf
  [[ -f $m ]] || "$bin" synth -o "$m" --dim 512 --layers 16 --heads 8 --kv-heads 4 --ffn 1408 --vocab-from "$vocab" --type q4_0 >&2
  models+=("$m")
fi

tmp=$(mktemp -d)
source "$here/bench/workers.sh"
export TANDEM_CACHE_DIR=${TANDEM_CACHE_DIR:-/tmp/tandem-bench/cache}
start_worker 0 "$tmp/a.log" --cache-dir "$tmp/cache0"
start_worker 1 "$tmp/b.log" --cache-dir "$tmp/cache1"
a=$(worker_address "$tmp/a.log")
b=$(worker_address "$tmp/b.log")

# tcp and shm always; ucx when this build has it.
transports=(tcp shm)
"$bin" bench -m "${models[0]}" --workers "$a" --transport ucx -p 0 -n 1 -r 1 -o jsonl >/dev/null 2>&1 && transports+=(ucx)
ts() { python3 -c 'import json,sys; print(" ".join("%.3f" % json.loads(l)["avg_ts"] for l in sys.stdin if l.strip()))'; }
for model in "${models[@]}"; do
  common=(-m "$model" -t 1 -r 1 -o jsonl --workers "$a,$b" --split 1,1 --wire f16)
  # run TRANSPORT -> "tp2_tg pipeline_par"
  run() {
    local tp pipe
    tp=$("$bin" bench "${common[@]}" --tp 2 --transport "$1" -p 0 -n "$n_gen" 2>>"$tmp/$1.err" | ts)
    pipe=$("$bin" bench "${common[@]}" --transport "$1" -p 0 -n "$n_par_gen" --parallel "$parallel" 2>>"$tmp/$1.err" | ts)
    echo "$tp $pipe"
  }
  run shm >/dev/null  # warm-up: stage files cached, weights paged in
  load_before=$(cut -d' ' -f1-3 /proc/loadavg)
  : > "$tmp/rows"
  for r in $(seq 1 "$rounds"); do
    declare -A got=()
    n=${#transports[@]}
    for k in $(seq 0 $((n - 1))); do
      t=${transports[$(( (k + r) % n ))]}
      got[$t]=$(run "$t")
    done
    row=""
    for t in "${transports[@]}"; do row+="${got[$t]} "; done
    echo "$row" >> "$tmp/rows"
    echo "round $r: ${transports[*]}: $row" >&2
    unset got
  done
  load_after=$(cut -d' ' -f1-3 /proc/loadavg)
  python3 - "$tmp/rows" "$(basename "$model")" "$n_gen" "$parallel" "$n_par_gen" "$load_before" "$load_after" "${transports[@]}" <<'EOF'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
model, n_gen, par, n_par_gen, lb, la = sys.argv[2:8]
names = sys.argv[8:]
med = statistics.median
print(f"\n**{model}**, {len(rows)} rounds, two workers on cores 0 and 1 of this host (t/s: medians; x / tcp: "
      f"median of the per-round ratios, each listed)\n")
print("| test | " + " | ".join(f"over {n}" for n in names) + " | " + " | ".join(f"{n} / tcp" for n in names[1:]) + " |")
print("|---|" + "---:|" * (2 * len(names) - 1))
for k, name in enumerate([f"--tp 2, tg{n_gen} (one sequence)", f"2-stage pipeline, tg{n_par_gen} x {par} seqs (aggregate)"]):
    cols = [[r[2 * i + k] for r in rows] for i in range(len(names))]
    cells = [f"{med(c):.2f}" for c in cols]
    for i in range(1, len(names)):
        ratio = [b / a for a, b in zip(cols[0], cols[i])]
        cells.append(f"**{med(ratio):.2f}x** ({', '.join('%.2f' % x for x in ratio)})")
    print(f"| {name} | " + " | ".join(cells) + " |")
print(f"\nLoad average before {lb}, after {la}.")
EOF
done
