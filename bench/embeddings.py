#!/usr/bin/env python3
"""Embeddings of `tandem serve`: what one /v1/embeddings request of many passages costs, against the same
passages' prompts computed by /v1/completions (max_tokens 1, no prompt cache), in one run.

    bench/embeddings.py --model M [--passages 32] [--tokens 128] [--rounds 3] [--threads 2] [--json OUT]

Each round draws fresh passages of random token ids (no round hits another's cache) and sends them both ways,
in turn first: as one /v1/embeddings request (its inputs go a slot's worth at a time), and as one
/v1/completions request with the passages as its batch of prompts, max_tokens 1 and "cache_prompt": false (the
prompt processing an embedding needs, plus one sampled token each). The table gives each round's times, the
embeddings' inputs/s and tokens/s, and the median of the paired ratios. Python 3 standard library only.
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


def request(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request(method, path, json.dumps(body) if body is not None else None, {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status != 200:
        sys.exit(f"{path}: status {r.status}: {data[:300]!r}")
    return json.loads(data)


def timed(port, path, body):
    t0 = time.perf_counter()
    j = request(port, "POST", path, body)
    return time.perf_counter() - t0, j


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=os.path.join(ROOT, "..", "shared", "models", "stories260K.gguf"))
    p.add_argument("--tandem", default=os.environ.get("TANDEM", os.path.join(ROOT, "build", "release", "tandem")))
    p.add_argument("--passages", type=int, default=32)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json")
    a = p.parse_args()

    server = subprocess.Popen([a.tandem, "serve", "-m", a.model, "--port", "0", "--parallel", "4",
                               "--queue", str(a.passages), "-t", str(a.threads)],
                              stderr=subprocess.PIPE, text=True)
    port = None
    for line in server.stderr:
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    if port is None:
        sys.exit("tandem serve did not start")
    while True:
        try:
            request(port, "GET", "/health")
            break
        except SystemExit:
            time.sleep(0.1)
    n_vocab = request(port, "GET", "/v1/models")["data"][0]["meta"]["n_vocab"]
    rng = random.Random(1)

    rows = []
    for r in range(a.rounds):
        passages = [[1] + [rng.randrange(100, n_vocab) for _ in range(a.tokens - 1)] for _ in range(a.passages)]
        got = {}
        for embed in ([True, False] if r % 2 == 0 else [False, True]):
            if embed:
                s, j = timed(port, "/v1/embeddings", {"input": passages})
                assert len(j["data"]) == a.passages
                got[True] = (s, j["usage"]["prompt_tokens"])
            else:
                s, j = timed(port, "/v1/completions", {"prompt": passages, "max_tokens": 1, "temperature": 0,
                                                       "cache_prompt": False})
                assert len(j["choices"]) == a.passages
                got[False] = (s, j["usage"]["prompt_tokens"])
        rows.append({"embed_s": got[True][0], "embed_tokens": got[True][1], "complete_s": got[False][0],
                     "complete_tokens": got[False][1]})
        print(f"round {r + 1}: embeddings {got[True][0] * 1000:.0f} ms, completions (max_tokens 1) "
              f"{got[False][0] * 1000:.0f} ms", file=sys.stderr)
    server.terminate()
    server.wait()

    med = lambda k: statistics.median(x[k] for x in rows)
    n_tokens = a.passages * a.tokens
    report = {"model": os.path.basename(a.model), "passages": a.passages, "tokens": a.tokens, "rounds": rows,
              "embed_ms": med("embed_s") * 1e3, "complete_ms": med("complete_s") * 1e3,
              "inputs_per_s": a.passages / med("embed_s"), "tokens_per_s": n_tokens / med("embed_s"),
              "ratio": statistics.median(x["embed_s"] / x["complete_s"] for x in rows)}
    print(f"| {report['model']} | {a.passages} × {a.tokens} tokens | {report['embed_ms']:.0f} ms | "
          f"{report['complete_ms']:.0f} ms | {report['ratio']:.2f}x | {report['inputs_per_s']:.1f} | "
          f"{report['tokens_per_s']:.0f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
