#!/usr/bin/env python3
"""Prefix cache of `tandem serve`: time to first token of a request whose prompt shares a long prefix with the
request before it, against the first request's, and a 10-turn chat's prompt tokens computed per turn.

    bench/prefix-cache.py --model M [--prefix 1000] [--rounds 5] [--threads 2] [--json OUT]

Each round draws a fresh prefix of random token ids (no round hits another's cache): request 1 is the prefix
and 16 tokens, request 2 the same prefix and 16 other tokens, request 3 request 2 again with
"cache_prompt": false (the same work without the cache). Time to first token is measured on the client, from
sending the request to the first streamed text. The table gives medians over the rounds and the ratios. The
chat part sends 10 turns of a growing conversation and reports, per turn, the prompt tokens, the ones found
in the cache and the ones computed (from /metrics). The choices part sends, per round, a fresh prompt with
n = 4 choices twice, in turn first: shared (the choices compute the prompt once) and with "cache_prompt": false
(each choice computes it), and reports the request's time and the prompt tokens computed (/metrics).
Python 3 standard library only.
"""
import argparse
import http.client
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def post_stream(port, path, body):
    """(seconds to the first streamed text, usage of the final chunk)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = dict(body, stream=True, stream_options={"include_usage": True})
    t0 = time.perf_counter()
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        sys.exit(f"{path}: status {r.status}: {r.read()[:300]!r}")
    ttft, usage, buf = None, None, b""
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            data = ev[len(b"data: "):]
            if data == b"[DONE]":
                continue
            j = json.loads(data)
            if j.get("usage"):
                usage = j["usage"]
            for ch in j.get("choices", []):
                if ttft is None and (ch.get("text") or ch.get("delta", {}).get("content")):
                    ttft = time.perf_counter() - t0
    c.close()
    return ttft, usage


def get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", path)
    r = c.getresponse()
    return r.status, r.read().decode()


def post(port, path, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    return json.loads(r.read())


def metric(text, name):
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=os.path.join(ROOT, "..", "shared", "models", "stories260K.gguf"))
    p.add_argument("--tandem", default=os.environ.get("TANDEM", os.path.join(ROOT, "build", "release", "tandem")))
    p.add_argument("--prefix", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json")
    a = p.parse_args()

    ctx = max(4096, 2 * (a.prefix + 64))
    server = subprocess.Popen([a.tandem, "serve", "-m", a.model, "--port", "0", "--parallel", "4", "-c", str(4 * ctx),
                               "--ctx-per-seq", str(ctx), "-t", str(a.threads)],
                              stderr=subprocess.PIPE, text=True)
    port = None
    for line in server.stderr:
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    if port is None:
        sys.exit("tandem serve did not start")
    while get(port, "/health")[0] != 200:
        time.sleep(0.1)
    n_vocab = json.loads(get(port, "/v1/models")[1])["data"][0]["meta"]["n_vocab"]
    rng = random.Random(1)

    rows = []
    for r in range(a.rounds):
        prefix = [rng.randrange(100, n_vocab) for _ in range(a.prefix)]
        tail1 = [rng.randrange(100, n_vocab) for _ in range(16)]
        tail2 = [rng.randrange(100, n_vocab) for _ in range(16)]
        req = {"max_tokens": 4, "temperature": 0}
        t1, _ = post_stream(port, "/v1/completions", dict(req, prompt=prefix + tail1))
        t2, u2 = post_stream(port, "/v1/completions", dict(req, prompt=prefix + tail2))
        t3, u3 = post_stream(port, "/v1/completions", dict(req, prompt=prefix + tail2, cache_prompt=False))
        rows.append({"first_s": t1, "hit_s": t2, "no_cache_s": t3,
                     "cached_tokens": u2["prompt_tokens_details"]["cached_tokens"],
                     "cached_without": u3["prompt_tokens_details"]["cached_tokens"]})
        print(f"round {r + 1}: first {t1 * 1000:.1f} ms, shared prefix {t2 * 1000:.1f} ms "
              f"({u2['prompt_tokens_details']['cached_tokens']} cached), without the cache {t3 * 1000:.1f} ms",
              file=sys.stderr)

    turns = []
    messages = [{"role": "system", "content": "You are a helpful assistant who tells short stories."}]
    for t in range(10):
        messages.append({"role": "user", "content": f"Now tell me what happened on day {t + 1} of the trip."})
        before = metric(get(port, "/metrics")[1], "tandem_prompt_tokens_total")
        j = post(port, "/v1/chat/completions", {"messages": messages, "max_tokens": 24, "temperature": 0})
        after = metric(get(port, "/metrics")[1], "tandem_prompt_tokens_total")
        u = j["usage"]
        turns.append({"turn": t + 1, "prompt": u["prompt_tokens"],
                      "cached": u["prompt_tokens_details"]["cached_tokens"], "computed": int(after - before)})
        messages.append({"role": "assistant", "content": j["choices"][0]["message"]["content"]})
    choices = []
    for r in range(a.rounds):
        prompt = [rng.randrange(100, n_vocab) for _ in range(a.prefix + 16)]
        got = {}
        for shared in ([True, False] if r % 2 == 0 else [False, True]):
            before = metric(get(port, "/metrics")[1], "tandem_prompt_tokens_total")
            t0 = time.perf_counter()
            j = post(port, "/v1/completions", {"prompt": prompt, "n": 4, "max_tokens": 4, "temperature": 0.8,
                                               "seed": r, "cache_prompt": shared})
            got[shared] = (time.perf_counter() - t0,
                           int(metric(get(port, "/metrics")[1], "tandem_prompt_tokens_total") - before),
                           [c["text"] for c in j["choices"]])
        if got[True][2] != got[False][2]:
            sys.exit(f"round {r + 1}: the choices' texts differ with and without sharing")
        choices.append({"shared_s": got[True][0], "shared_computed": got[True][1],
                        "alone_s": got[False][0], "alone_computed": got[False][1]})
        print(f"round {r + 1}: n=4 shared {got[True][0] * 1000:.1f} ms ({got[True][1]} prompt tokens computed), "
              f"each alone {got[False][0] * 1000:.1f} ms ({got[False][1]})", file=sys.stderr)
    server.terminate()
    server.wait()

    med = lambda k: statistics.median(x[k] for x in rows)
    report = {"model": os.path.basename(a.model), "prefix": a.prefix, "rounds": rows, "turns": turns,
              "first_ms": med("first_s") * 1e3, "hit_ms": med("hit_s") * 1e3, "no_cache_ms": med("no_cache_s") * 1e3,
              "ratio": statistics.median(x["hit_s"] / x["first_s"] for x in rows),
              "ratio_no_cache": statistics.median(x["hit_s"] / x["no_cache_s"] for x in rows)}
    print(f"| model | shared prefix | first request TTFT | shared prefix TTFT | ratio | same request without the cache |")
    print(f"|---|---|---|---|---|---|")
    print(f"| {report['model']} | {a.prefix} tokens | {report['first_ms']:.1f} ms | {report['hit_ms']:.1f} ms "
          f"({rows[0]['cached_tokens']} cached) | {report['ratio']:.3f}x | {report['no_cache_ms']:.1f} ms "
          f"({report['ratio_no_cache']:.3f}x) |")
    print()
    print("| turn | prompt tokens | found in the cache | computed |")
    print("|---|---|---|---|")
    for t in turns:
        print(f"| {t['turn']} | {t['prompt']} | {t['cached']} | {t['computed']} |")
    print()
    med_c = lambda k: statistics.median(x[k] for x in choices)
    report["choices"] = choices
    report["choices_ratio"] = statistics.median(x["shared_s"] / x["alone_s"] for x in choices)
    print("| request | prompt | time, shared | prompt tokens computed | time, each choice alone | computed | ratio |")
    print("|---|---|---|---|---|---|---|")
    print(f"| n = 4, 4 tokens each | {a.prefix + 16} tokens | {med_c('shared_s') * 1000:.1f} ms | "
          f"{int(med_c('shared_computed'))} | {med_c('alone_s') * 1000:.1f} ms | {int(med_c('alone_computed'))} | "
          f"**{report['choices_ratio']:.3f}x** |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
