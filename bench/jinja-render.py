#!/usr/bin/env python3
"""The chat template's cost per request, tandem's interpreter beside python3-jinja2, in one run.

Runs build/release/bench/jinja-render over ../shared/templates (a 45-message conversation with a tool round
trip and two tools, each template rendered ROUNDS times) and renders the same templates with the same variables
through python3-jinja2 set up as Hugging Face does (tests/jinja/reference.py), one after the other; prints
the medians over templates as a Markdown row.
  bench/jinja-render.py [--rounds 20] [--templates DIR]
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "jinja"))
import reference  # noqa: E402


def conversation():
    msgs = [{"role": "system", "content": "You are a helpful assistant."}]
    for t in range(20):
        msgs.append({"role": "user", "content": f"Question number {t}: tell me more."})
        msgs.append({"role": "assistant", "content": f"Here is answer {t}, in some detail."})
    msgs.append({"role": "user", "content": "Weather in Paris?"})
    msgs.append({"role": "assistant", "content": "", "tool_calls": [{"id": "call12345", "type": "function",
                 "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]})
    msgs.append({"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "21C"})
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
             {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
                 "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
    return {"messages": msgs, "tools": tools, "add_generation_prompt": True, "bos_token": "<s>", "eos_token": "</s>"}


def python_medians(folder, rounds):
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                       extensions=[reference.Generation, loopcontrols])
    env.filters["tojson"] = reference.tojson
    env.globals["raise_exception"] = reference.raise_exception
    env.globals["strftime_now"] = reference.strftime_now
    variables = conversation()
    medians = []
    for name in sorted(f for f in os.listdir(folder) if f.endswith(".jinja")):
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            t = env.from_string(f.read())
        us = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            try:
                t.render(**variables)
            except Exception:
                pass
            us.append((time.perf_counter() - t0) * 1e6)
        us.sort()
        medians.append(us[len(us) // 2])
    medians.sort()
    return medians


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--templates", default=os.path.join(ROOT, "..", "shared", "templates"))
    p.add_argument("--binary", default=os.path.join(ROOT, "build", "release", "bench", "jinja-render"))
    a = p.parse_args()
    out = subprocess.run([a.binary, a.templates, str(a.rounds)], check=True, capture_output=True, text=True).stdout
    last = out.strip().splitlines()[-1]
    print(last)
    tandem = {}
    for key in ("render median", "p90", "max"):
        tail = last.split(key, 1)[1].strip()
        tandem[key] = float(tail.split(" ", 1)[0])
    py = python_medians(a.templates, a.rounds)
    pyv = {"render median": py[len(py) // 2], "p90": py[len(py) * 9 // 10], "max": py[-1]}
    print("| renderer | median over templates | p90 | worst |")
    print("|---|---|---|---|")
    print(f"| tandem (text/jinja) | {tandem['render median']:.0f} µs | {tandem['p90']:.0f} µs | {tandem['max']:.0f} µs |")
    print(f"| python3-jinja2 (Hugging Face's setup) | {pyv['render median']:.0f} µs | {pyv['p90']:.0f} µs | "
          f"{pyv['max']:.0f} µs |")
    print(f"| ratio | {pyv['render median'] / tandem['render median']:.1f}x faster | | |")


if __name__ == "__main__":
    main()
