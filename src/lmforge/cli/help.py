"""What `lmforge pretrain --help` (and finetune, align, compress) lists: the bundled recipes and every config key
with its type, value and docstring, read from the config dataclasses themselves (attribute docstrings).

`lmforge pretrain gpt --help` shows the values that recipe resolves to (its preset's model fields, its steps and
run dir, the overrides on the line), each beside the schema default it replaces. `kind_help` picks a run kind's
epilog."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
from functools import cache
from pathlib import Path
from typing import Any

from lmforge.config import RECIPES_DIR, field_types, get_key, has_key, resolve_recipe, type_name

WIDTH = 118
_NAME_COL = 22
_COMMAND_LINE = re.compile(r"^\s+lmforge |^(CPU smoke run|GPU at|GPU:|CPU:)")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(<`\"'])")
_ABBREVIATIONS = ("al.", "App.", "Fig.", "Eq.", "Sec.", "vs.", "e.g.", "i.e.", "cf.", "Ch.")
_SUMMARY_CHARS = 290
"""A summary longer than this (about three lines of the listing) ends at its last clause that fits, with '…'."""


@cache
def attribute_docs(cls: type) -> dict[str, str]:
    """Field name → the docstring written under it, for a dataclass and its bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, nxt in zip(body, body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _fmt(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return repr(value) if isinstance(value, str) else str(value)


def _wrap(text: str, indent: int) -> list[str]:
    pad = " " * indent
    return textwrap.wrap(text, WIDTH, initial_indent=pad, subsequent_indent=pad, break_on_hyphens=False)


def key_lines(cls: type, prefix: str, skip: tuple[str, ...] = (), values: dict | None = None) -> list[str]:
    """One entry per key of dataclass `cls` (nested dataclasses recursively): "prefix.key: type = value", then its
    docstring indented. `values`: a resolved config tree; a key whose value differs from the schema default shows
    both ("= 2000 (default 1000)")."""
    lines: list[str] = []
    docs, types = attribute_docs(cls), field_types(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        t, key = types[f.name], f"{prefix}{f.name}"
        if dataclasses.is_dataclass(t):
            lines += key_lines(t, f"{key}.", values=values)
            continue
        default = _fmt(_default(f))
        shown = default
        if values is not None and has_key(values, key):
            shown = _fmt(get_key(values, key))
            shown += f" (default {default})" if shown != default else ""
        lines.append(f"  {key}: {type_name(t)} = {shown}")
        if f.name in docs:
            lines += _wrap(docs[f.name], 6)
    return lines


def recipe_comment(path: Path) -> list[str]:
    """The leading comment of a recipe file, one entry per line, without the '# '."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        out.append(line[1:].removeprefix(" ").rstrip())
    return out


def recipe_summary(path: Path) -> str:
    """The first sentence of a recipe's description (its comment up to the first example command), whole."""
    prose = []
    for line in recipe_comment(path):
        if _COMMAND_LINE.search(line):
            break
        prose.append(line.strip())
    text = " ".join(x for x in prose if x)
    first = text
    for m in _SENTENCE_END.finditer(text):
        if not text[: m.start()].endswith(_ABBREVIATIONS):
            first = text[: m.start()]
            break
    first = first.strip().rstrip(":;,").strip()
    return first if len(first) <= _SUMMARY_CHARS else _clause_cut(first)


def _clause_cut(text: str) -> str:
    """`text` ended, with '…', at its last clause boundary outside parentheses that fits the summary length: a
    semicolon or dash past the opening words, else a comma, else a colon, else a space."""
    depth, strong, comma, colon = 0, -1, -1, -1
    for i, ch in enumerate(text[:_SUMMARY_CHARS]):
        depth += (ch in "([") - (ch in ")]")
        if depth:
            continue
        if text.startswith(("; ", " — "), i):
            strong = i
        elif text.startswith(", ", i):
            comma = i
        elif text.startswith(": ", i):
            colon = i
    floor = _SUMMARY_CHARS // 3
    cut = next((c for c in (strong, comma) if c > floor), max(colon, strong, comma))
    if cut <= 0:
        cut = text.rfind(" ", 0, _SUMMARY_CHARS)
    return text[:cut].rstrip(" ,;:—") + " …"


def recipe_lines(kind: str) -> list[str]:
    """The bundled recipes of a kind, each with the first sentence of its description wrapped under it."""
    out = []
    for path in sorted((RECIPES_DIR / kind).glob("*.yaml")):
        lines = textwrap.wrap(recipe_summary(path), WIDTH - _NAME_COL - 2, break_on_hyphens=False) or [""]
        out.append(f"  {path.stem:{_NAME_COL - 2}}{lines[0]}".rstrip() if len(path.stem) < _NAME_COL - 2 else "")
        if not out[-1]:  # a long name takes its own line
            out[-1] = f"  {path.stem}"
            lines = [""] + lines
        out += [" " * _NAME_COL + x for x in lines[1:] if x]
    return out


def _header(kind: str, recipe: str | None, default: str, overrides: list[str]) -> list[str]:
    """The recipe list (no recipe named) or the named recipe's whole description, and where the values come from."""
    name = recipe or default
    path = resolve_recipe(name, kind)
    assert path is not None
    shown = [f"values below: recipe {name}" + (" (the default)" if recipe is None else "") + f" ({path})"]
    if overrides:
        shown[0] += " with " + " ".join(overrides)
    if recipe is None:
        return [f"recipes (recipes/{kind}):", *recipe_lines(kind), "", *shown]
    return [f"recipe {name}:", *["  " + x if x else "" for x in recipe_comment(path)], "", *shown]


def _options(title: str, registry, key: str, values: dict | None = None) -> list[str]:
    """Per registered name, the keys of its Options dataclass (objective, task type, PEFT method); the chosen
    name's keys with the resolved `values`."""
    lines = [f"{title} (the other keys of the section depend on {key}):"]
    chosen = get_key(values, key) if values is not None else None
    for name in registry.names():
        opts = getattr(registry.get(name), "Options", None)
        mine = values if name == chosen else None
        usable = opts is not None and dataclasses.is_dataclass(opts)
        sub = key_lines(opts, f"{key.split('.')[0]}.", values=mine) if usable else []
        mark = (" (this recipe's)" if mine is not None else "") + ("" if sub else " (no options)")
        lines.append(f"  {key}={name}{mark}")
        lines += ["  " + s for s in sub]
    return lines


def pretrain_help(recipe: str | None, overrides: list[str], values: dict) -> str:
    """`lmforge pretrain --help`'s epilog; `values`: the resolved config of `recipe` with `overrides`."""
    from lmforge.models.config import ModelConfig
    from lmforge.objectives import OBJECTIVES
    from lmforge.pretraining.config import Config
    from lmforge.registry import MODELS

    parts = [*_header("pretrain", recipe, "demo", list(overrides)), "", "config keys (--section.key=value):"]
    preset = _fmt(get_key(values, "model.name"))
    parts += [f"  model.preset: string = {preset}"]
    parts += _wrap("One of the presets (lmforge model info all): its fields are the model.* values below.", 6)
    parts += _wrap("presets: " + ", ".join(MODELS.names()), 6)
    for f in dataclasses.fields(Config):
        if f.name == "objective":
            continue
        cls = ModelConfig if f.name == "model" else field_types(Config)[f.name]
        parts += key_lines(cls, f"{f.name}.", values=values)
    parts += ["", *_options("objectives", OBJECTIVES, "objective.name", values)]
    return "\n".join(parts)


def finetune_help(recipe: str | None, overrides: list[str], values: dict) -> str:
    """`lmforge finetune --help`'s epilog; `values`: the resolved config of `recipe` with `overrides`."""
    from lmforge.adapt.peft import ADAPTERS
    from lmforge.registry import TASKS
    from lmforge.tasks.config import FinetuneConfig

    parts = [*_header("finetune", recipe, "sst2-gpt", list(overrides)), "", "config keys (--section.key=value):"]
    for f in dataclasses.fields(FinetuneConfig):
        if f.name not in ("task", "peft"):
            parts += key_lines(field_types(FinetuneConfig)[f.name], f"{f.name}.", values=values)
    parts += ["", *_options("task types", TASKS, "task.type", values)]
    parts += ["", *_options("PEFT methods", ADAPTERS, "peft.method", values)]
    return "\n".join(parts)


def schema_help(kind: str, schema: type, recipe: str | None, overrides: list[str], values: dict, default: str) -> str:
    """Recipes of `kind` (`default`: the one it runs when none is named) and every key of `schema` (alignment,
    compression) with its value in `values`, the resolved config of `recipe` with `overrides`."""
    parts = [*_header(kind, recipe, default, list(overrides)), ""]
    return "\n".join(parts + ["config keys (--section.key=value):", *key_lines(schema, "", values=values)])


LISTING_COMMANDS = {"experiments": "lmforge experiment", "scaling": "lmforge scaling"}
"""Recipe directory of a listing → the command that runs its files."""


def listing_help(kind: str, name: str | None) -> str:
    """`lmforge experiment --help` / `lmforge scaling --help`: the bundled files, or the named one's description."""
    if name is None:
        return "\n".join([f"bundled (recipes/{kind}):", *recipe_lines(kind)])
    path = resolve_recipe(name, kind)
    assert path is not None
    return "\n".join([f"{name} ({path}):", *["  " + x if x else "" for x in recipe_comment(path)], "",
                      f"its runs, without running them: {LISTING_COMMANDS[kind]} {name} --dry-run"])  # fmt: skip


_EPILOGS = {"pretrain": pretrain_help, "finetune": finetune_help}
"""Kinds with an epilog of their own (presets, objectives; task types, PEFT methods); the others list their schema."""


def kind_help(kind: str, recipe: str | None, overrides: list[str], init: str | None = None,
              method: str | None = None) -> str:  # fmt: skip
    """The --help epilog of a training command of run kind `kind` (an align `method`): the recipes, or the named
    one, and every key with the value `recipe` with `--init` and `overrides` resolves to."""
    from lmforge.run_kinds import resolve, run_kind

    entry = run_kind(kind)
    values = resolve(kind, recipe, list(overrides), init=init, method=method)
    if kind in _EPILOGS:
        return _EPILOGS[kind](recipe, overrides, values)
    return schema_help(kind, entry.schema(), recipe, overrides, values, entry.default_recipe(method))
