"""A stand-in for `helm template` over a small Go-template subset, for machines without helm.

Neither Debian nor PyPI ships helm, so the chart's tests render it with this module: each Go-template
action is translated to a Jinja2 expression and evaluated with Helm's semantics for the subset below.
Anything outside the subset raises ``Unsupported`` — a template that grows past it fails its test
instead of being rendered wrongly (then extend this module, or check with a real helm).

Supported: ``{{ .Values.a.b }}`` / ``.Release.Name`` / ``.Chart.X`` / ``.``; literals; pipelines
``x | f a b`` (the piped value becomes f's last argument, as in Go); ``if`` / ``else if`` / ``else`` /
``end``; ``define`` blocks and ``include``; comments ``{{/* */}}``; ``{{-`` / ``-}}`` trimming; functions
``include printf quote toYaml nindent indent trunc trimSuffix mul not and or default``.
Values lookups are strict: a misspelt key is an error, not an empty string.
"""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import jinja2
import yaml

ACTION = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.S)
PATH = re.compile(r"^\.(?:[A-Za-z_][A-Za-z0-9_]*)(?:\.[A-Za-z_][A-Za-z0-9_]*)*$")


class Unsupported(ValueError):
    """The template uses Go-template syntax outside this module's subset."""


def _to_yaml(value) -> str:
    return yaml.safe_dump(value, default_flow_style=False, sort_keys=True).rstrip("\n")


def _indent(n, text) -> str:
    return "\n".join((" " * int(n) + line) if line else line for line in str(text).split("\n"))


FUNCS = {
    "printf": lambda fmt, *args: fmt % tuple(args),
    "quote": lambda v: json.dumps(str(v)),
    "toYaml": _to_yaml,
    "nindent": lambda n, text: "\n" + _indent(n, text),
    "indent": _indent,
    "trunc": lambda n, s: str(s)[: int(n)],
    "trimSuffix": lambda suffix, s: str(s)[: -len(suffix)] if suffix and str(s).endswith(suffix) else str(s),
    "mul": lambda a, b: int(a) * int(b),
    "not": lambda v: not v,
    "and": lambda *a: all(a),
    "or": lambda *a: any(a),
    "default": lambda d, v: v if v else d,
}


def _split_pipeline(expr: str) -> list[str]:
    stages, depth, quote, cur = [], 0, False, ""
    for ch in expr:
        if ch == '"':
            quote = not quote
        elif not quote and ch == "(":
            depth += 1
        elif not quote and ch == ")":
            depth -= 1
        if ch == "|" and not quote and depth == 0:
            stages.append(cur.strip())
            cur = ""
        else:
            cur += ch
    stages.append(cur.strip())
    return stages


def _tokens(stage: str) -> list[str]:
    out, depth, cur, quote = [], 0, "", False
    for ch in stage:
        if ch == '"':
            quote = not quote
        if not quote and ch == "(":
            depth += 1
        if not quote and ch == ")":
            depth -= 1
        if ch.isspace() and not quote and depth == 0:
            if cur:
                out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        out.append(cur)
    return out


def _operand(tok: str) -> str:
    if tok == ".":
        return "ctx"
    if PATH.match(tok):  # subscripts, so a key named like a dict method (items, keys) is still the key
        return "ctx" + "".join(f"[{part!r}]" for part in tok[1:].split("."))
    if tok.startswith('"'):
        return repr(shlex.split(tok)[0])
    if re.fullmatch(r"-?\d+(\.\d+)?", tok):
        return tok
    if tok in ("true", "false"):
        return tok.capitalize()
    if tok.startswith("(") and tok.endswith(")"):
        return "(" + expression(tok[1:-1]) + ")"
    raise Unsupported(f"operand {tok!r}")


def _call(name: str, args: list[str]) -> str:
    if name not in FUNCS:
        raise Unsupported(f"function {name!r}")
    return f"F[{name!r}]({', '.join(args)})"


def expression(expr: str) -> str:
    """A Go-template pipeline -> a Jinja2 expression."""
    stages = _split_pipeline(expr)
    toks = _tokens(stages[0])
    if toks[0] == "include":
        value = f"include({_operand(toks[1])}, {_operand(toks[2])})"
    elif toks[0] in FUNCS:
        value = _call(toks[0], [_operand(t) for t in toks[1:]])
    elif len(toks) == 1:
        value = _operand(toks[0])
    else:
        raise Unsupported(f"expression {expr!r}")
    for stage in stages[1:]:
        toks = _tokens(stage)
        value = _call(toks[0], [_operand(t) for t in toks[1:]] + [value])
    return value


def _split_defines(text: str) -> tuple[str, dict[str, str]]:
    """Remove ``define`` blocks from ``text``; return (rest, name -> body)."""
    defines, rest, pos = {}, "", 0
    for m in ACTION.finditer(text):
        if m.start() < pos:
            continue
        body = m.group(2)
        if not body.startswith("define "):
            continue
        name = shlex.split(body[len("define "):])[0]
        depth, j = 1, m.end()
        for inner in ACTION.finditer(text, m.end()):
            word = inner.group(2).split(" ", 1)[0]
            if word in ("if", "range", "with", "define"):
                depth += 1
            elif word == "end":
                depth -= 1
                if depth == 0:
                    # Keep the trim markers: the body starts after "-}}" and ends before "{{-".
                    lead = text[m.end():inner.start()]
                    if m.group(3):
                        lead = lead.lstrip()
                    if inner.group(1):
                        lead = lead.rstrip()
                    defines[name] = lead
                    j = inner.end()
                    break
        else:
            raise Unsupported(f"define {name!r} has no end")
        rest += text[pos:m.start()]
        pos = j
    return rest + text[pos:], defines


def to_jinja(text: str) -> str:
    out, pos, stack = [], 0, []
    for m in ACTION.finditer(text):
        out.append(text[pos:m.start()].replace("{#", "{{ '{#' }}"))
        pos = m.end()
        ltrim, body, rtrim = m.group(1), m.group(2), m.group(3)
        lt, rt = ("-" if ltrim else ""), ("-" if rtrim else "")
        if body.startswith("/*"):
            if not body.endswith("*/"):
                raise Unsupported("unterminated comment")
            out.append(f"{{#{lt} comment {rt}#}}")
            continue
        word = body.split(" ", 1)[0]
        if word == "if":
            stack.append("if")
            out.append(f"{{%{lt} if {expression(body[3:])} {rt}%}}")
        elif body.startswith("else if "):
            out.append(f"{{%{lt} elif {expression(body[8:])} {rt}%}}")
        elif body == "else":
            out.append(f"{{%{lt} else {rt}%}}")
        elif body == "end":
            if not stack:
                raise Unsupported("end without if")
            out.append(f"{{%{lt} end{stack.pop()} {rt}%}}")
        elif word in ("range", "with", "define", "template", "block", "tpl") or ":=" in body or "$" in body:
            raise Unsupported(f"action {body!r}")
        else:
            out.append(f"{{{{{lt} {expression(body)} {rt}}}}}")
    out.append(text[pos:].replace("{#", "{{ '{#' }}"))
    if stack:
        raise Unsupported("if without end")
    return "".join(out)


class Chart:
    """A chart folder rendered with its values.yaml merged with ``overrides`` (one level deep per key)."""

    def __init__(self, folder: Path, release: str = "demo", namespace: str = "default"):
        self.folder = Path(folder)
        self.meta = yaml.safe_load((self.folder / "Chart.yaml").read_text())
        self.values = yaml.safe_load((self.folder / "values.yaml").read_text())
        self.release = {"Name": release, "Namespace": namespace, "Service": "Helm"}
        self.defines: dict[str, str] = {}
        self.templates: dict[str, str] = {}
        for path in sorted((self.folder / "templates").iterdir()):
            rest, defines = _split_defines(path.read_text())
            self.defines.update(defines)
            if not path.name.startswith("_") and path.suffix in (".yaml", ".yml"):
                self.templates[path.name] = rest
        self.env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                                      autoescape=False)

    def _render(self, text: str, ctx: dict) -> str:
        tmpl = self.env.from_string(to_jinja(text))
        return tmpl.render(ctx=ctx, F=FUNCS, include=lambda name, c: self._render(self.defines[name], c))

    def render(self, overrides: dict | None = None) -> dict[str, str]:
        """Template file name -> rendered text."""
        values = merge(self.values, overrides or {})
        meta = {"Name": self.meta["name"], "Version": self.meta["version"], "AppVersion": self.meta["appVersion"]}
        ctx = {"Values": values, "Release": self.release, "Chart": meta}
        return {name: self._render(text, ctx) for name, text in self.templates.items()}

    def manifests(self, overrides: dict | None = None) -> list[dict]:
        docs = []
        for name, text in self.render(overrides).items():
            docs += [d for d in yaml.safe_load_all(text) if d]
        return docs


def merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out
