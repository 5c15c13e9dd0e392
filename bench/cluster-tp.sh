#!/usr/bin/env bash
# Tensor parallelism (--tp 2) against one node and against a 2-stage pipeline on the same two cores, with
# `tandem bench` on every side (same tests, same report):
#   pp<N_PROMPT>  one prompt
#   tg<N_GEN>     one sequence, token by token: what TP is for (both nodes work on every token)
#   tg<N_PAR_GEN> x PARALLEL sequences decoding together (aggregate tokens/s)
# Each worker has one thread pinned to its own core (taskset -c 0 and -c 1); the one-node baseline has one
# thread on core 0. The head is not pinned (the ranks embed and sample; the head only queues steps and reads
# the sampled tokens). A fourth side is what two boxes are: `--head-node`, the head itself rank 0 (head
# pinned to core 0 with one thread) and one worker on core 1. Every round runs every side back to back and also measures a plain read
# (bench/membw) with one thread on core 0 and with two threads on cores 0 and 1, each reading its own buffer
# as two nodes would: on a machine whose cores share one memory bus, generation (a memory stream) cannot gain
# more than that read does. The table reports medians of the per-round ratios.
#
#   bench/cluster-tp.sh [ROUNDS] [MODEL...]
#   env: TANDEM (binary), MEMBW (bench/membw binary), N_PROMPT (512), N_GEN (128), PARALLEL (16), N_PAR_GEN (32)
#
# MODELs default to 1B-shaped Q4_0 and Q4_K_M models with random weights in /tmp/tandem-bench (made once with
# `tandem synth`). Prints markdown tables (docs/benchmarks.md, "Tensor parallelism").
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${TANDEM:-$here/build/release/tandem}
membw=${MEMBW:-$here/build/release/bench/membw}
rounds=${1:-3}
shift || true
models=("$@")
n_prompt=${N_PROMPT:-512}
n_gen=${N_GEN:-128}
parallel=${PARALLEL:-16}
n_par_gen=${N_PAR_GEN:-32}

if [[ ! -x $bin ]]; then echo "no tandem binary at $bin (set TANDEM=...)" >&2; exit 1; fi
if [[ ! -x $membw ]]; then echo "no membw binary at $membw (set MEMBW=...)" >&2; exit 1; fi
if [[ ${#models[@]} -eq 0 ]]; then
  for t in q4_0 q4_k_m; do
    m=/tmp/tandem-bench/1b-$t.gguf
    if [[ ! -f $m ]]; then
      mkdir -p /tmp/tandem-bench
      "$bin" synth -o "$m" --dim 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 5632 \
        --vocab-from "$here/../shared/vocab/ggml-vocab-llama-spm.gguf" --type "$t" >&2
    fi
    models+=("$m")
  done
fi

tmp=$(mktemp -d)
source "$here/bench/workers.sh"
export TANDEM_CACHE_DIR=${TANDEM_CACHE_DIR:-/tmp/tandem-bench/cache}

start_worker 0 "$tmp/a.log" --cache-dir "$tmp/cache0"
start_worker 1 "$tmp/b.log" --cache-dir "$tmp/cache1"
a=$(worker_address "$tmp/a.log")
b=$(worker_address "$tmp/b.log")

# tandem bench -o jsonl -> "avg_ts" per line, in test order.
ts() { python3 -c 'import json,sys; print(" ".join("%.3f" % json.loads(l)["avg_ts"] for l in sys.stdin if l.strip()))'; }
bw() { "$@" | sed -n 's/.*: \([0-9.]*\) GB\/s.*/\1/p'; }

for model in "${models[@]}"; do
  : > "$tmp/rows"
  load_before=$(cut -d' ' -f1-3 /proc/loadavg)
  for r in $(seq 1 "$rounds"); do
    common=(-m "$model" -t 1 -r 1 -o jsonl)
    bw1=$(bw taskset -c 0 "$membw" 1 256 3)
    bw2=$(bw taskset -c 0,1 "$membw" 2 256 3)
    one=$(taskset -c 0 "$bin" bench "${common[@]}" -p "$n_prompt" -n "$n_gen" 2>/dev/null | ts)
    one_par=$(taskset -c 0 "$bin" bench "${common[@]}" -p 0 -n "$n_par_gen" --parallel "$parallel" 2>/dev/null | ts)
    tp=(--workers "$a,$b" --tp 2 --split 1,1 --wire f16)
    tp2=$("$bin" bench "${common[@]}" "${tp[@]}" -p "$n_prompt" -n "$n_gen" 2>"$tmp/tp.err" | ts)
    tp2_par=$("$bin" bench "${common[@]}" "${tp[@]}" -p 0 -n "$n_par_gen" --parallel "$parallel" 2>>"$tmp/tp.err" | ts)
    pipe=(--workers "$a,$b" --split 1,1 --wire f16)
    pp=$("$bin" bench "${common[@]}" "${pipe[@]}" -p "$n_prompt" -n "$n_gen" 2>"$tmp/pipe.err" | ts)
    pp_par=$("$bin" bench "${common[@]}" "${pipe[@]}" -p 0 -n "$n_par_gen" --parallel "$parallel" 2>>"$tmp/pipe.err" | ts)
    # Two boxes as people have them: the head is rank 0 (pinned with its rank's thread to core 0), one worker.
    hn=(--workers "$b" --tp 2 --split 1,1 --wire f16 --head-node)
    hn2=$(taskset -c 0 "$bin" bench "${common[@]}" "${hn[@]}" -p "$n_prompt" -n "$n_gen" 2>"$tmp/hn.err" | ts)
    hn2_par=$(taskset -c 0 "$bin" bench "${common[@]}" "${hn[@]}" -p 0 -n "$n_par_gen" --parallel "$parallel" 2>>"$tmp/hn.err" | ts)
    echo "$one $one_par $tp2 $tp2_par $pp $pp_par $bw1 $bw2 $hn2 $hn2_par" >> "$tmp/rows"
    echo "round $r $(basename "$model"): one $one $one_par | tp2 $tp2 $tp2_par | pipeline $pp $pp_par | head+1 $hn2 $hn2_par | read $bw1 $bw2 GB/s" >&2
  done
  load_after=$(cut -d' ' -f1-3 /proc/loadavg)
  python3 - "$tmp/rows" "$(basename "$model")" "$n_prompt" "$n_gen" "$parallel" "$n_par_gen" "$load_before" "$load_after" <<'EOF'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
model, n_prompt, n_gen, par, n_par_gen, lb, la = sys.argv[2:]
names = [f"pp{n_prompt}", f"tg{n_gen}", f"tg{n_par_gen} x{par} seqs (aggregate)"]
med = statistics.median
def col(k): return [r[k] for r in rows]
def f(xs): return ", ".join("%.2f" % x for x in xs)
print(f"\n**{model}**, {len(rows)} rounds (t/s: medians; ratios: median of the per-round ratios, each listed)\n")
print("| test | one node, 1 thread | --tp 2 (1 thread on each of 2 cores) | tp2 / one | 2-stage pipeline, same cores | pipeline / one | tp2 / pipeline |")
print("|---|---:|---:|---:|---:|---:|---:|")
for k, name in enumerate(names):
    one, tp, pipe = col(k), col(3 + k), col(6 + k)
    rt = [t / o for t, o in zip(tp, one)]
    rp = [p / o for p, o in zip(pipe, one)]
    rtp = [t / p for t, p in zip(tp, pipe)]
    print(f"| {name} | {med(one):.2f} | {med(tp):.2f} | **{med(rt):.2f}x** ({f(rt)}) | {med(pipe):.2f} | "
          f"{med(rp):.2f}x ({f(rp)}) | {med(rtp):.2f}x |")
print(f"\n`--tp 2 --head-node` with one worker (the head is rank 0: two boxes, not three processes):\n")
print("| test | head + 1 worker, --tp 2 | head+1 / one | head+1 / two workers |")
print("|---|---:|---:|---:|")
for k, name in enumerate(names):
    one, tp, hn = col(k), col(3 + k), col(11 + k)
    rh = [h / o for h, o in zip(hn, one)]
    rht = [h / t for h, t in zip(hn, tp)]
    print(f"| {name} | {med(hn):.2f} | **{med(rh):.2f}x** ({f(rh)}) | {med(rht):.2f}x |")
bw1, bw2 = col(9), col(10)
ceil = [b2 / b1 for b1, b2 in zip(bw1, bw2)]
print(f"\nPlain read, same rounds: one thread on core 0 {med(bw1):.1f} GB/s, two threads on cores 0 and 1 "
      f"{med(bw2):.1f} GB/s together: two nodes on this machine can stream {med(ceil):.2f}x what one does "
      f"({f(ceil)}), the ceiling for generation (tg{n_gen}: --tp 2 reached "
      f"{med([r[4] / r[1] for r in rows]) / med(ceil) * 100:.0f}% of it). Load average before {lb}, after {la}.")
EOF
  # Peak RSS of each rank: fresh workers (weights streamed from the head), one --tp 2 run, then VmHWM.
  start_worker 0 "$tmp/ra.log" --cache-dir "$tmp/rss0-$(basename "$model")"
  ra_pid=${pids[-1]}
  start_worker 1 "$tmp/rb.log" --cache-dir "$tmp/rss1-$(basename "$model")"
  rb_pid=${pids[-1]}
  ra=$(worker_address "$tmp/ra.log")
  rb=$(worker_address "$tmp/rb.log")
  # The head's own peak RSS too (ru_maxrss of the child): over the two workers, and as rank 0 over one of them.
  maxrss() { python3 -c 'import resource, subprocess, sys
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)' "$@"; }
  head_kib=$(maxrss "$bin" bench -m "$model" -t 1 -r 1 --workers "$ra,$rb" --tp 2 --split 1,1 -p "$n_prompt" -n "$n_gen")
  hwm() { sed -n 's/VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$1/status"; }
  file_kib=$(( $(stat -c %s "$model") / 1024 ))
  kv_kib=$(( 2 * 16 * 2048 / 4 * 2 * (n_prompt + n_gen) / 1024 ))  # K and V, f16, 16 layers, 512 of 2048 (8 of 32 heads)
  a_hwm=$(hwm "$ra_pid")
  b_hwm=$(hwm "$rb_pid")
  hn_kib=$(maxrss taskset -c 0 "$bin" bench -m "$model" -t 1 -r 1 --workers "$rb" --tp 2 --split 1,1 --head-node -p "$n_prompt" -n "$n_gen")
  python3 - "$a_hwm" "$b_hwm" "$file_kib" "$kv_kib" "$head_kib" "$hn_kib" <<'EOF2'
import sys
a, b, f, kv, head, hn = map(int, sys.argv[1:])
limit = 0.6 * (f + kv) + 64 * 1024
print(f"\nPeak RSS per rank (fresh workers, weights streamed, one --tp 2 pp/tg run): {a / 1024:.1f} and "
      f"{b / 1024:.1f} MiB; 0.6 x (file {f / 1024:.1f} MiB + KV {kv / 1024:.1f} MiB) + 64 MiB = {limit / 1024:.1f} MiB. "
      f"The head's: {head / 1024:.1f} MiB over the two workers, {hn / 1024:.1f} MiB as rank 0 itself (--head-node).")
EOF2
  kill "$ra_pid" "$rb_pid" 2>/dev/null || true
done
grep -A4 "cluster stats" "$tmp/tp.err" | tail -4 >&2 || true
