#!/usr/bin/env bash
# Load test for `tandem serve`: aggregate generation tokens/s with 1 stream vs N concurrent streams, and
# time to first token (p50/p99) under load. Python 3 standard library only.
#
#   bench/server-load.sh [MODEL] [THREADS] [STREAMS] [MAX_TOKENS]
#
# MODEL defaults to the 1B-shaped Q4_0 model with random weights at /tmp/tandem-bench/1b-q4_0.gguf (made once
# with `tandem synth` when absent). ROUNDS (2) rounds per concurrency, best round reported. EXTRA_ARGS are
# passed to `tandem serve` (e.g. "--workers 127.0.0.1:9001,127.0.0.1:9002" to measure through a cluster).
# Results go to stdout as a markdown table (docs/benchmarks.md, "Server"), plus the scheduler's own time
# from /metrics: busy time outside engine submit/wait (building steps, detokenizing, dispatching).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${TANDEM:-$here/build/release/tandem}
model=${1:-/tmp/tandem-bench/1b-q4_0.gguf}
threads=${2:-2}
streams=${3:-8}
max_tokens=${4:-64}
rounds=${ROUNDS:-2}

if [[ ! -x $bin ]]; then echo "no tandem binary at $bin (set TANDEM=...)" >&2; exit 1; fi
if [[ ! -f $model ]]; then
  mkdir -p "$(dirname "$model")"
  "$bin" synth -o "$model" --dim 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 5632 \
    --vocab-from "$here/../shared/vocab/ggml-vocab-llama-spm.gguf" --type q4_0
fi

log=$(mktemp)
"$bin" serve -m "$model" --port 0 --parallel "$streams" --ctx-size $((streams * 512)) --ctx-per-seq 512 -t "$threads" \
  --queue $((streams * 4)) ${EXTRA_ARGS:-} 2>"$log" &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -f "$log"' EXIT
port=""
for _ in $(seq 1 600); do
  port=$(sed -n 's|.*listening on http://[^:]*:\([0-9]*\).*|\1|p' "$log")
  [[ -n $port ]] && break
  sleep 0.1
done
[[ -n $port ]] || { cat "$log" >&2; exit 1; }

python3 - "$port" "$streams" "$max_tokens" "$rounds" "$threads" <<'PY'
import http.client, json, sys, threading, time

port, streams, max_tokens, rounds, threads = (int(a) for a in sys.argv[1:6])

def wait_ready():
    for _ in range(3000):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit("server never became ready")

def one_stream(i, out):
    body = json.dumps({"prompt": f"Once upon a time number {i}", "max_tokens": max_tokens,
                       "temperature": 0.8, "seed": i, "stream": True,
                       "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    ttft, n = None, 0
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("choices") and ev["choices"][0].get("text") and ttft is None:
            ttft = time.perf_counter() - t0
        if ev.get("usage"):
            n = ev["usage"]["completion_tokens"]
    out[i] = (ttft if ttft is not None else time.perf_counter() - t0, n, time.perf_counter() - t0)

def run(concurrency):
    best = None
    ttfts = []
    for _ in range(rounds):
        out = [None] * concurrency
        ts = [threading.Thread(target=one_stream, args=(i, out)) for i in range(concurrency)]
        t0 = time.perf_counter()
        for t in ts: t.start()
        for t in ts: t.join()
        wall = time.perf_counter() - t0
        tokens = sum(o[1] for o in out)
        rate = tokens / wall
        ttfts += [o[0] for o in out]
        best = rate if best is None else max(best, rate)
    ttfts.sort()
    pct = lambda p: ttfts[min(len(ttfts) - 1, int(round(p / 100 * (len(ttfts) - 1))))]
    return best, pct(50), pct(99)

def metrics():
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    out = {}
    for line in c.getresponse().read().decode().splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out

wait_ready()
one_stream(0, [None])  # warm up (page in the weights)
m0 = metrics()
r1, t1_50, t1_99 = run(1)
rn, tn_50, tn_99 = run(streams)
print(f"| threads | streams | max_tokens | 1 stream tok/s | {streams} streams tok/s | speedup | TTFT p50/p99 (1) | TTFT p50/p99 ({streams}) |")
print("|---|---|---|---|---|---|---|---|")
print(f"| {threads} | {streams} | {max_tokens} | {r1:.1f} | {rn:.1f} | {rn / r1:.2f}x | "
      f"{t1_50 * 1000:.0f}/{t1_99 * 1000:.0f} ms | {tn_50 * 1000:.0f}/{tn_99 * 1000:.0f} ms |")
m1 = metrics()
d = lambda k: m1.get(k, 0.0) - m0.get(k, 0.0)
steps = d("tandem_steps_total")
print()
print(f"scheduler: {steps:.0f} steps, busy {d('tandem_busy_seconds_total'):.2f} s, outside the engine "
      f"{d('tandem_scheduler_overhead_seconds_total') * 1000:.1f} ms "
      f"({d('tandem_scheduler_overhead_seconds_total') * 1e6 / max(steps, 1):.0f} us/step), "
      f"micro-batches in flight {m1.get('tandem_micro_batches', 1):.0f}")
PY
