#!/usr/bin/env python3
"""Endurance run of `tandem serve`: 8 concurrent clients for a bounded time, mixing streaming chat,
plain completions, greedy completions checked against the first answer (a mixed-up or corrupted
response is an error), streams the client cancels after a few tokens, and over-long prompts (which must
be refused with 400). Reports requests served, errors, tokens/s over time and the server's RSS.

    bench/soak.py [--model M] [--duration 600] [--clients 8] [--threads 2] [--json OUT] [-- SERVE ARGS...]

The model defaults to stories260K from ../shared/models. RSS "start" is the median of the first three
samples after a warm-up (the first 10% of the run, at most 30 s: the KV cache and allocator pools are touched
by then), "end" the median of the last three: a single sample can catch a request's transient buffers (the
tokenizer's work on an over-long prompt is ~0.6 MiB, a few percent of this small server), a leak moves the
medians. Exits 1 when a valid request failed or RSS grew by 5% or more. Python 3 standard library only.
"""
import argparse
import http.client
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=os.path.join(ROOT, "..", "shared", "models", "stories260K.gguf"))
    p.add_argument("--tandem", default=os.environ.get("TANDEM", os.path.join(ROOT, "build", "release", "tandem")))
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ctx-per-slot", type=int, default=512)
    p.add_argument("--sample", type=float, default=5.0, help="seconds between RSS / tokens samples")
    p.add_argument("--json", help="write the report as JSON here too")
    p.add_argument("serve_args", nargs="*", help="extra `tandem serve` arguments (after --)")
    return p.parse_args()


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def metric(text, name):
    m = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


class Client:
    def __init__(self, port):
        self.port = port

    def conn(self, timeout=120):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def get(self, path):
        c = self.conn(10)
        c.request("GET", path)
        r = c.getresponse()
        body = r.read().decode()
        c.close()
        return r.status, body

    def post(self, path, body):
        c = self.conn()
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read().decode()
        c.close()
        return r.status, data

    def stream(self, path, body, stop_after=None):
        """Returns (status, events, done, n_text_events); stop_after: hang up after that many events."""
        c = self.conn()
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            data = r.read().decode()
            c.close()
            return r.status, [data], False
        events, done, buf = [], False, b""
        while True:
            chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1024)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                ev = ev.decode()
                if not ev.startswith("data: "):
                    raise ValueError(f"not an SSE event: {ev[:80]!r}")
                data = ev[6:]
                if data == "[DONE]":
                    done = True
                else:
                    events.append(json.loads(data))
            if stop_after is not None and len(events) >= stop_after:
                c.sock.shutdown(socket.SHUT_RDWR)
                c.close()
                return 200, events, False
        c.close()
        return 200, events, done


class Soak:
    def __init__(self, args, port, pid):
        self.args, self.client, self.pid = args, Client(port), pid
        self.lock = threading.Lock()
        self.counts = {"chat_stream": 0, "completion": 0, "greedy": 0, "cancelled": 0, "too_long": 0}
        self.errors = []
        self.greedy_text = None
        self.stop_at = 0.0
        self.long_prompt = "Once upon a time there was a little girl. " * (args.ctx_per_slot // 2)

    def error(self, what):
        with self.lock:
            self.errors.append(what)
            if len(self.errors) <= 20:
                print(f"soak: error: {what}", file=sys.stderr)

    def ok(self, kind):
        with self.lock:
            self.counts[kind] += 1

    def one(self, kind, rng):
        c = self.client
        if kind == "chat_stream":
            body = {"messages": [{"role": "user", "content": f"Tell me a story about {rng.choice(['a cat', 'a dog', 'the sea'])}"}],
                    "max_tokens": rng.randint(16, 96), "stream": True, "temperature": 0.8, "seed": rng.randint(0, 1 << 30)}
            status, events, done = c.stream("/v1/chat/completions", body)
            if status != 200 or not done or not events or "error" in events[-1]:
                return self.error(f"chat stream: status {status}, done {done}, last {events[-1] if events else None}")
            if events[-1]["choices"][0].get("finish_reason") not in ("stop", "length"):
                return self.error(f"chat stream: finish {events[-1]}")
        elif kind == "completion":
            body = {"prompt": "The little dog", "max_tokens": rng.randint(8, 64), "temperature": 0.7,
                    "seed": rng.randint(0, 1 << 30)}
            status, data = c.post("/v1/completions", body)
            if status != 200:
                return self.error(f"completion: status {status}: {data[:200]}")
            j = json.loads(data)
            if j["usage"]["completion_tokens"] < 1:
                return self.error(f"completion: no tokens: {data[:200]}")
        elif kind == "greedy":
            body = {"prompt": "Once upon a time", "max_tokens": 32, "temperature": 0}
            status, data = c.post("/v1/completions", body)
            if status != 200:
                return self.error(f"greedy: status {status}: {data[:200]}")
            text = json.loads(data)["choices"][0]["text"]
            with self.lock:
                if self.greedy_text is None:
                    self.greedy_text = text
                elif text != self.greedy_text:
                    self.errors.append(f"greedy: got {text!r}, first answer was {self.greedy_text!r}")
                    return
        elif kind == "cancelled":
            body = {"prompt": "Once upon a time", "max_tokens": 400, "stream": True, "seed": rng.randint(0, 1 << 30)}
            status, events, _ = c.stream("/v1/completions", body, stop_after=3)
            if status != 200 or len(events) < 3:
                return self.error(f"cancelled stream: status {status}, {len(events)} events")
        elif kind == "too_long":
            status, data = c.post("/v1/completions", {"prompt": self.long_prompt, "max_tokens": 8})
            if status != 400 or "invalid_request_error" not in data:
                return self.error(f"over-long prompt: status {status} (want 400): {data[:200]}")
        self.ok(kind)

    def worker(self, i):
        rng = random.Random(i)
        kinds = ["chat_stream", "chat_stream", "completion", "greedy", "cancelled", "too_long"]
        while time.time() < self.stop_at:
            kind = rng.choice(kinds)
            try:
                self.one(kind, rng)
            except Exception as e:  # a connection error, malformed JSON or SSE
                self.error(f"{kind}: {type(e).__name__}: {e}")

    def run(self):
        a = self.args
        t0 = time.time()
        self.stop_at = t0 + a.duration
        threads = [threading.Thread(target=self.worker, args=(i,)) for i in range(a.clients)]
        for t in threads:
            t.start()
        samples = []
        last_tokens, last_t = 0.0, t0
        warm = min(30.0, 0.1 * a.duration)
        while any(t.is_alive() for t in threads):
            time.sleep(min(a.sample, max(0.1, self.stop_at - time.time())) if time.time() < self.stop_at else 0.2)
            now = time.time()
            try:
                _, m = self.client.get("/metrics")
            except OSError as e:
                self.error(f"/metrics: {e}")
                continue
            tokens = metric(m, "tandem_generated_tokens_total")
            samples.append({"t": round(now - t0, 1), "rss_kib": rss_kib(self.pid),
                            "tokens_per_s": round((tokens - last_tokens) / max(1e-6, now - last_t), 1),
                            "served": sum(self.counts.values()), "loaded": now <= self.stop_at})
            last_tokens, last_t = tokens, now
        for t in threads:
            t.join()
        after_warm = [s for s in samples if s["t"] >= warm] or samples
        median = lambda xs: sorted(xs)[len(xs) // 2]
        rss_start = median([s["rss_kib"] for s in after_warm[:3]])
        rss_end = median([s["rss_kib"] for s in samples[-3:]])
        status, health = self.client.get("/health")
        return {
            "duration_s": a.duration, "clients": a.clients,
            "served": sum(self.counts.values()), "by_kind": self.counts,
            "errors": len(self.errors), "first_errors": self.errors[:10],
            "rss_start_kib": rss_start, "rss_end_kib": rss_end,
            "rss_growth_pct": round(100.0 * (rss_end - rss_start) / max(1, rss_start), 2),
            "rss_warmup_s": warm,
            "tokens_per_s": [s["tokens_per_s"] for s in samples if s["loaded"]],  # not the wind-down
            "samples": samples, "health_after": status,
        }


def main():
    args = parse_args()
    if not os.access(args.tandem, os.X_OK):
        sys.exit(f"no tandem binary at {args.tandem} (set TANDEM or --tandem)")
    if not os.path.exists(args.model):
        sys.exit(f"no model at {args.model}")
    log = tempfile.NamedTemporaryFile(prefix="tandem-soak-", suffix=".log", delete=False)
    cmd = [args.tandem, "serve", "-m", args.model, "--port", "0", "--parallel", str(args.clients),
           "--ctx-size", str(args.clients * args.ctx_per_slot), "--ctx-per-seq", str(args.ctx_per_slot), "-t", str(args.threads),
           "--queue", str(args.clients * 4)] + args.serve_args
    proc = subprocess.Popen(cmd, stderr=log, stdout=subprocess.DEVNULL)
    try:
        port = None
        for _ in range(600):
            m = re.search(r"listening on http://[^:]+:(\d+)", open(log.name).read())
            if m:
                port = int(m.group(1))
                break
            time.sleep(0.1)
        if port is None:
            sys.exit("serve never listened:\n" + open(log.name).read())
        c = Client(port)
        for _ in range(600):
            try:
                if c.get("/health")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        report = Soak(args, port, proc.pid).run()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    tps = report["tokens_per_s"]
    mid = sorted(tps)[len(tps) // 2] if tps else 0
    print(f"| soak | {args.duration:.0f} s | {args.clients} clients | {report['served']} requests "
          f"({', '.join(f'{k} {v}' for k, v in report['by_kind'].items())}) | {report['errors']} errors | "
          f"tokens/s median {mid:.0f} (min {min(tps, default=0):.0f}, max {max(tps, default=0):.0f}) | "
          f"RSS {report['rss_start_kib'] / 1024:.1f} -> {report['rss_end_kib'] / 1024:.1f} MiB "
          f"({report['rss_growth_pct']:+.2f}%) | /health after: {report['health_after']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    bad = report["errors"] > 0 or report["rss_growth_pct"] >= 5.0 or report["health_after"] != 200
    if bad:
        print("soak: FAILED (errors, RSS growth >= 5%, or unhealthy)", file=sys.stderr)
    os.unlink(log.name)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
