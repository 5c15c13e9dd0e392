#!/usr/bin/env bash
# Predicted against measured: for loopback clusters of 1, 2 and 3 workers (one thread each, pinned to cores
# 0, 1, 0 ...), each with every link delayed by 0, 0.1 and 1 ms one way (`tandem relay` in front of every
# worker), runs `tandem plan` (which measures the nodes and links) and then `tandem bench` on the layouts it
# ranks: one node, the pipeline over all workers, tensor parallelism over all workers, and the recommended
# one (and any layout a later round's plan recommends, from that round on). Generation is tg N_GEN at batch 1
# and 16 (PARALLEL) for every layout run, prompt is pp N_PROMPT at batch 1. Prints one
# markdown row per (cluster, layout, test) with predicted, measured and their ratio, and per (cluster, batch)
# whether the recommended layout was the measured fastest (or within 5% of it). Links stay on TCP
# (--transport tcp): shared memory between these processes would pass the relays by.
#
# This host's memory bandwidth and CPU share move from minute to minute, and plan's probes take seconds while
# the benches take minutes: a plain read (bench/membw, one thread on core 0) is timed right before plan and
# right before each layout's benches, and each row also shows the measured value scaled back to the read plan
# saw (measured x read at plan / read at bench: what the bench would have measured on the host plan measured).
# Two cores' read over one core's is recorded at both times too: where it moved between plan and bench, two
# nodes streaming weights at once (tensor parallelism at batch 1) run at another speed than plan measured; and
# so is the CPU time the hypervisor gave to others (steal, from /proc/stat) while plan and each bench ran.
# The benches run in paired rounds (ROUNDS, each bench once per round, the order rotating), and plan runs again
# right before every round (REPLAN=1): each round's benches are checked against the plan made a minute or two
# before them, not against one made ten minutes earlier on a host that has moved since (back to back, one
# node's tg128 read 43.6 and then 32.4 tokens/s, and --tp 2 over it 1.33x and then 1.84x). Each row's ratio is
# the median of its rounds' ratios, its predicted and measured figures the medians of their rounds; the first
# plan picks the layouts, and a round whose plan recommends one not yet run adds it (benched from that round
# on, so its figures are the medians of fewer rounds). A row is marked recommended for the layout most rounds'
# plans recommended, and the recommendation is judged on the medians and round by round (each round's plan's
# choice against that round's fastest).
# A row whose host moved between plan and bench (two cores' read over one core's off by more than 20% from
# plan's in most rounds, or more than 5% of the CPU time stolen) is marked, and the summary also counts the
# rows where the host held still: on a moved host a prediction is checked against another machine than the one
# plan measured.
#
#   bench/plan-check.sh [MODEL]
#   env: TANDEM (binary), MEMBW (bench/membw binary), NODES ("1 2 3"), DELAYS_MS ("0 0.1 1"), N_GEN (128),
#        N_PROMPT (512), PARALLEL (16), ROUNDS (3: paired rounds of the benches), REPLAN (1: plan before every
#        round; 0: the first plan's figures for every round), PLAN_DIR (keep each cluster's plan JSON there as
#        plan-N-Dms.json, and plan-N-Dms-rR.json for round R's)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${TANDEM:-$here/build/release/tandem}
membw=${MEMBW:-$here/build/release/bench/membw}
if [[ ! -x $membw ]]; then echo "no membw binary at $membw (set MEMBW=...)" >&2; exit 1; fi
read_gbs() { taskset -c 0 "$membw" 1 256 3 | sed -n 's/.*: \([0-9.]*\) GB\/s.*/\1/p'; }
# The CPU time the hypervisor gave others since steal_mark (steal / all, of every core), as a fraction.
steal_mark() { awk '/^cpu /{t=0; for (i=2;i<=NF;i++) t+=$i; print $9, t}' /proc/stat; }
steal_since() { steal_mark | awk -v s0="${1% *}" -v t0="${1#* }" '{printf "%.3f", ($2 > t0) ? ($1 - s0) / ($2 - t0) : 0}'; }
# Two cores' plain read over one core's (1.0: the two share the bus's whole rate; 2.0: each has its own).
bus_ratio() { taskset -c 0,1 "$membw" 2 256 3 | sed -n 's/.*: \([0-9.]*\) GB\/s.*/\1/p' | awk -v one="$1" '{printf "%.2f", $1 / one}'; }
model=${1:-/tmp/tandem-bench/1b-q4_0.gguf}
nodes_list=${NODES:-"1 2 3"}
delays=${DELAYS_MS:-"0 0.1 1"}
n_gen=${N_GEN:-128}
n_prompt=${N_PROMPT:-512}
parallel=${PARALLEL:-16}
rounds=${ROUNDS:-3}
replan=${REPLAN:-1}
plan_dir=${PLAN_DIR:-}
if [[ ! -f $model ]]; then
  mkdir -p "$(dirname "$model")"
  "$bin" synth -o "$model" --dim 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 5632 \
    --vocab-from "$here/../shared/vocab/ggml-vocab-llama-spm.gguf" --type q4_0 >&2
fi
tmp=$(mktemp -d)
source "$here/bench/workers.sh"
export TANDEM_CACHE_DIR=${TANDEM_CACHE_DIR:-/tmp/tandem-bench/cache}

# A bench that fails leaves its row at nan; say why on stderr.
bench_failed() {
  echo "bench $1 failed: $(tail -n 3 "$tmp/bench.err")" >&2
  for w in "$tmp"/w*.log; do echo "  $(basename "$w"): $(tail -n 2 "$w")" >&2; done
}

# plan_round R: the plain read, two cores' read over one core's and the CPU steal while `tandem plan` runs on
# $list, its JSON in $tmp/plan-R.json (and $PLAN_DIR), and one line of $tmp/preds: what that plan predicts for
# the layouts of $tmp/layouts (round 0 picks them) and which it recommends per batch.
plan_round() {
  local r=$1 bw bus mark steal
  bw=$(read_gbs)
  bus=$(bus_ratio "$bw")
  mark=$(steal_mark)
  "$bin" plan -m "$model" --workers "$list" --transport tcp -t 1 --batch "1,$parallel" -n "$n_gen" -p "$n_prompt" --json \
    > "$tmp/plan-$r.json" 2>/dev/null
  steal=$(steal_since "$mark")
  if [[ -n $plan_dir ]]; then
    mkdir -p "$plan_dir"
    cp "$tmp/plan-$r.json" "$plan_dir/plan-$n-${d}ms$( ((r > 0)) && echo "-r$r").json"
  fi
  python3 - "$tmp/plan-$r.json" "$r" "$bw" "$bus" "$steal" >> "$tmp/preds" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
pred, rec = {}, {}
for b in plan["batches"]:
    rec[str(b["batch"])] = b["recommended"]["flags"]
    for l in b["layouts"]:
        if l["fits"]:
            e = pred.setdefault(l["flags"], {"gen": {}, "prompt": l["prompt"]["tokens_per_s"]})
            e["gen"][str(b["batch"])] = l["generation"]["tokens_per_s"]
print(json.dumps({"round": int(sys.argv[2]), "pred": pred, "rec": rec, "read": float(sys.argv[3]),
                  "bus": float(sys.argv[4]), "steal": float(sys.argv[5])}))
PY
}

# pick_layouts R: appends to $tmp/layouts (one JSON line per layout: flags, label, the round it joined) the
# layouts round R's plan names that are not there yet. Round 0 picks one node, the pipeline and tensor
# parallelism over all the cluster's workers, and the recommended layout per batch; a later round adds the
# layout its plan recommends where it is new, so every round's choice is benched in that round and judged.
pick_layouts() {
  python3 - "$tmp/plan-$1.json" "$n" "$1" "$tmp/layouts" >> "$tmp/layouts" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1])); n = int(sys.argv[2]); r = int(sys.argv[3])
have = {json.loads(l)["flags"] for l in open(sys.argv[4]) if l.strip()}
names = [x["name"] for x in plan["nodes"]]
want = {}
for b in plan["batches"]:
    for l in b["layouts"]:
        if not l["fits"] or l["flags"] in have: continue
        take = l["flags"] == b["recommended"]["flags"] or (r == 0 and (
            (l["kind"] == "one node" and l["flags"].split()[1] == names[0]) or
            (l["kind"] in ("pipeline", "tensor parallel") and l["nodes"] == n)))
        if take and l["flags"] not in want:
            ws = l["flags"].split()[1].split(",")
            split = l["flags"].split("--split ")[1].split()[0] if "--split " in l["flags"] else ""
            want[l["flags"]] = l["label"] + (" split " + split if split else "") + \
                " [" + ",".join("w%d" % names.index(w) for w in ws) + "]"
for f, label in want.items():
    print(json.dumps({"flags": f, "label": label, "joined": r}))
PY
}

max_nodes=0
for n in $nodes_list; do (( n > max_nodes )) && max_nodes=$n; done
addrs=()
for ((i = 0; i < max_nodes; i++)); do
  start_worker $((i % 2)) "$tmp/w$i.log" --cache-dir "$tmp/cache$i"
  addrs+=("$(worker_address "$tmp/w$i.log")")
done

echo "| workers | delay | layout | test | predicted t/s | measured t/s (median) | rounds | measured / predicted | read at bench / at plan | drift-scaled / predicted | 2 cores' read / 1 core's: plan, bench | CPU steal %: plan, bench | host moved |"
echo "| ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: |"
: > "$tmp/summary"
for n in $nodes_list; do
  for d in $delays; do
    relays=()
    list=""
    for ((i = 0; i < n; i++)); do
      a=${addrs[$i]}
      if [[ $d != 0 ]]; then
        "$bin" relay "$a" --delay-ms "$d" 2>"$tmp/r$i.log" &
        pids+=($!)
        relays+=($!)
        a=$(sed -n 's|.*listening on \([^,]*\),.*|\1|p' "$tmp/r$i.log")
        while [[ -z $a ]]; do sleep 0.1; a=$(sed -n 's|.*listening on \([^,]*\),.*|\1|p' "$tmp/r$i.log"); done
      fi
      list+="${list:+,}$a"
    done
    : > "$tmp/preds"
    plan_round 0
    : > "$tmp/layouts"
    pick_layouts 0
    # Paired rounds: every round benches each layout once, the order rotating from round to round, so a minute
    # of a slower host falls on all of them rather than on one; each figure is the median of its rounds.
    mapfile -t lines < "$tmp/layouts"
    : > "$tmp/rounds"
    for ((r = 0; r < rounds; r++)); do
      if ((r > 0 && replan)); then
        plan_round "$r"
        pick_layouts "$r"
        mapfile -t lines < "$tmp/layouts"
      fi
      for ((k = 0; k < ${#lines[@]}; k++)); do
        li=$(((k + r) % ${#lines[@]}))
        line=${lines[$li]}
        flags=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["flags"])' "$line")
        bw_bench=$(read_gbs)
        bus_bench=$(bus_ratio "$bw_bench")
        mark=$(steal_mark)
        # shellcheck disable=SC2086
        "$bin" bench -m "$model" $flags --transport tcp -t 1 -p 0 -n "$n_gen" --parallel "1,$parallel" -r 1 -o jsonl \
          2>"$tmp/bench.err" > "$tmp/gen.jsonl" || bench_failed "$flags"
        # shellcheck disable=SC2086
        "$bin" bench -m "$model" $flags --transport tcp -t 1 -p "$n_prompt" -n 0 --parallel 1 -r 1 -o jsonl \
          2>"$tmp/bench.err" > "$tmp/pp.jsonl" || bench_failed "$flags"
        steal=$(steal_since "$mark")
        python3 - "$li" "$r" "$tmp/gen.jsonl" "$tmp/pp.jsonl" "$bw_bench" "$bus_bench" "$steal" >> "$tmp/rounds" <<'PY'
import json, sys
gen = {}
for l in open(sys.argv[3]):
    if l.strip():
        x = json.loads(l); gen[int(x.get("n_parallel", x.get("seqs", 1)))] = x["avg_ts"]
pp = [json.loads(l)["avg_ts"] for l in open(sys.argv[4]) if l.strip()]
print(json.dumps({"layout": int(sys.argv[1]), "round": int(sys.argv[2]), "gen": gen, "pp": pp[0] if pp else None,
                  "read": float(sys.argv[5]), "bus": float(sys.argv[6]), "steal": float(sys.argv[7])}))
PY
      done
    done
    python3 - "$tmp/layouts" "$tmp/rounds" "$tmp/preds" "$n" "$d" "$n_gen" "$n_prompt" >> "$tmp/summary" <<'PY'
import json, statistics, sys
layouts = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rounds = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
preds = {p["round"]: p for p in (json.loads(l) for l in open(sys.argv[3]) if l.strip())}
n, d, ng, npr = sys.argv[4], sys.argv[5], sys.argv[6], sys.argv[7]
med = lambda xs: statistics.median(xs) if xs else None
plan_of = lambda k: preds.get(k, preds[0])  # the plan made right before round k (REPLAN=0: the first)
batches = sorted({int(b) for p in preds.values() for b in p["rec"]})
# The layout each round's plan recommends per batch; a row is marked recommended for the layout most rounds'
# plans recommended (the first plan's on a tie).
rec_of = {}
for b in batches:
    picks = [plan_of(x["round"])["rec"][str(b)] for x in rounds if x["layout"] == 0]
    rec_of[b] = max(dict.fromkeys([preds[0]["rec"][str(b)]] + picks), key=picks.count)
for i, e in enumerate(layouts):
    mine = [x for x in rounds if x["layout"] == i]
    drift = [x["read"] / plan_of(x["round"])["read"] for x in mine]  # read at bench / read at plan, per round
    bus_plan = med([plan_of(x["round"])["bus"] for x in mine])
    bus_bench = med([x["bus"] for x in mine])
    steal_plan = max(plan_of(x["round"])["steal"] for x in mine)
    steal_bench = max(x["steal"] for x in mine)
    moved = med([abs(x["bus"] / plan_of(x["round"])["bus"] - 1) for x in mine]) > 0.2 or max(steal_plan, steal_bench) > 0.05
    tests = [(b, f"tg{ng} x{b}", lambda p, b=b: p["gen"].get(str(b)), lambda x, b=b: x["gen"].get(str(b)))
             for b in batches]
    tests.append((0, f"pp{npr}", lambda p: p["prompt"], lambda x: x["pp"]))
    for b, test, pred_in, meas_in in tests:
        per_round, pred_round, ratio, scaled = {}, [], [], []
        for x, dr in zip(mine, drift):
            p = plan_of(x["round"])["pred"].get(e["flags"])
            pv, mv = (pred_in(p) if p else None), meas_in(x)
            per_round[x["round"]] = mv
            if pv: pred_round.append(pv)
            if pv and mv:
                ratio.append(mv / pv)
                scaled.append(mv / pv / dr)
        vals = [v for v in per_round.values() if v]
        print(json.dumps({"n": n, "d": d, "label": e["label"], "flags": e["flags"], "test": test, "batch": b,
                          "pred": med(pred_round), "meas": med(vals), "ratio": med(ratio), "scaled": med(scaled),
                          "spread": [min(vals), max(vals)] if vals else None,
                          "rounds": {str(k): v for k, v in per_round.items()},
                          "rec": b > 0 and rec_of.get(b) == e["flags"],
                          "rec_flags": {str(k): plan_of(k)["rec"].get(str(b)) for k in per_round} if b > 0 else {},
                          "drift": med(drift), "bus": f"{bus_plan:.2f}, {bus_bench:.2f}",
                          "steal": f"{100 * steal_plan:.0f}, {100 * steal_bench:.0f}", "moved": moved}))
PY
    for r in "${relays[@]}"; do kill "$r" 2>/dev/null || true; wait "$r" 2>/dev/null || true; done
    python3 - "$tmp/summary" "$n" "$d" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if r["n"] == sys.argv[2] and r["d"] == sys.argv[3]]
nan = float("nan")
for r in rows:
    spread = f'{r["spread"][0]:.0f}–{r["spread"][1]:.0f}' if r["spread"] else ""
    print(f'| {r["n"]} | {r["d"]} ms | {r["label"]}{" (recommended)" if r["rec"] else ""} | {r["test"]} | '
          f'{r["pred"] or nan:.1f} | {r["meas"] or nan:.1f} | {spread} | {r["ratio"] or nan:.2f} | {r["drift"]:.2f} | '
          f'{r["scaled"] or nan:.2f} | {r["bus"]} | {r["steal"]} | {"yes" if r.get("moved") else ""} |')
PY
  done
done
echo
echo "| workers | delay | batch | recommended | measured fastest | recommended / fastest (median of paired rounds) | rounds it was within 5% of that round's fastest |"
echo "| ---: | ---: | ---: | --- | --- | ---: | ---: |"
python3 - "$tmp/summary" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
groups = {}
for r in rows:
    if r["batch"] > 0 and r["meas"]: groups.setdefault((r["n"], r["d"], r["batch"]), []).append(r)
within, not_run = [], 0
for (n, d, b), rs in groups.items():
    rec = [r for r in rs if r["rec"]]
    if not rec: continue
    # On the medians of paired rounds: the recommended layout against each other one over the rounds both ran
    # (a layout a later round added ran in fewer rounds than the others).
    q, fast = 1.0, rec[0]
    for x in rs:
        pairs = [v / x["rounds"][k] for k, v in rec[0]["rounds"].items() if v and x["rounds"].get(k)]
        if x is not rec[0] and pairs and statistics.median(pairs) < q:
            q, fast = statistics.median(pairs), x
    within.append(q >= 0.95)
    # Round by round: the layout that round's plan recommended against that round's fastest.
    choices = {}
    for x in rs: choices.update(x["rec_flags"])
    per_round = []
    for k, flags in sorted(choices.items()):
        mine = [x for x in rs if x["flags"] == flags]
        best = max((x["rounds"].get(k) or 0) for x in rs)
        if not mine or not mine[0]["rounds"].get(k):
            not_run += 1
            continue
        v = mine[0]["rounds"][k]
        if v and best: per_round.append(v >= 0.95 * best)
    print(f'| {n} | {d} ms | {b} | {rec[0]["label"]} | {fast["label"]} | {q:.2f} | {sum(per_round)} of {len(per_round)} |')
ratios = [r["ratio"] for r in rows if r["ratio"]]
scaled = [r["scaled"] for r in rows if r["scaled"]]
ok = sum(1 for q in ratios if 0.8 <= q <= 1.2)
ok_scaled = sum(1 for q in scaled if 0.8 <= q <= 1.2)
held = [r["ratio"] for r in rows if r["ratio"] and not r.get("moved")]
ok_held = sum(1 for q in held if 0.8 <= q <= 1.2)
print(f"\npredictions within 20%: {ok} of {len(ratios)} as measured, {ok_scaled} of {len(scaled)} scaled by the read's "
      f"drift, {ok_held} of {len(held)} where the host held still; recommended within 5% of the fastest: "
      f"{sum(within)} of {len(within)}" + (f"; {not_run} round(s) recommended a layout not run" if not_run else ""))
PY
