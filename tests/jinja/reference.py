#!/usr/bin/env python3
"""Renders chat templates the way Hugging Face's apply_chat_template does, with Debian's python3-jinja2.

The reference for tests/test-jinja.cpp. Usage: reference.py CASES.json OUT.json, where CASES.json is
[{"id": ..., "source": template text, "variables": {...}}, ...]; OUT.json gets
{id: {"text": rendered} or {"error": message, "raised": true when raise_exception raised it}}.
"""
import datetime
import json
import sys

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

# A fixed clock, the one the C++ test gives tandem's renderer.
NOW = datetime.datetime(2026, 7, 26, 12, 0, 0)


class TemplateError(Exception):
    pass


class Generation(Extension):
    """{% generation %}...{% endgeneration %}: Hugging Face's AssistantTracker, which renders its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return NOW.strftime(fmt)


def render_case(env, case):
    try:
        template = env.from_string(case["source"])
        return {"text": template.render(**case["variables"])}
    except TemplateError as e:
        return {"error": str(e), "raised": True}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    out = {case["id"]: render_case(env, case) for case in cases}
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
