"""What `lmforge pretrain --help` (and finetune, align, compress) lists: the bundled recipes and every config key
with its type, default and docstring, read from the config dataclasses themselves (attribute docstrings)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from functools import cache
from typing import Any

from lmforge.config import RECIPES_DIR, field_types, type_name

WIDTH = 118


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
    return repr(value) if isinstance(value, str) else str(value)


def key_lines(cls: type, prefix: str, skip: tuple[str, ...] = ()) -> list[str]:
    """One entry per key of dataclass `cls` (nested dataclasses recursively): "prefix.key  type = default", then
    its docstring indented."""
    lines: list[str] = []
    docs, types = attribute_docs(cls), field_types(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        t = types[f.name]
        if dataclasses.is_dataclass(t):
            lines += key_lines(t, f"{prefix}{f.name}.")
            continue
        lines.append(f"  {prefix}{f.name}: {type_name(t)} = {_fmt(_default(f))}")
        if f.name in docs:
            lines += textwrap.wrap(docs[f.name], WIDTH, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return lines


def recipe_lines(kind: str) -> list[str]:
    """The bundled recipes of a kind, each with the first line of its leading comment."""
    out = []
    for path in sorted((RECIPES_DIR / kind).glob("*.yaml")):
        first = path.read_text(encoding="utf-8").split("\n", 1)[0]
        first = first.lstrip("# ").split(" CPU smoke run")[0].strip() if first.startswith("#") else ""
        out.append(f"  {path.stem:20} {first[:94]}")
    return out


def _options(title: str, registry, key: str) -> list[str]:
    """Per registered name, the keys of its Options dataclass (objective, task type, PEFT method)."""
    lines = [f"{title} (the other keys of the section depend on {key}):"]
    for name in registry.names():
        opts = getattr(registry.get(name), "Options", None)
        sub = key_lines(opts, f"{key.split('.')[0]}.") if opts is not None and dataclasses.is_dataclass(opts) else []
        lines.append(f"  {key}={name}" + ("" if sub else " (no options)"))
        lines += ["  " + s for s in sub]
    return lines


def pretrain_help() -> str:
    from lmforge.config import Config
    from lmforge.models.config import ModelConfig
    from lmforge.objectives import OBJECTIVES
    from lmforge.registry import MODELS

    parts = ["recipes (recipes/pretrain):", *recipe_lines("pretrain"), "", "config keys (--section.key=value):"]
    parts += ["  model.preset: one of the presets (lmforge model info all) — its fields are the model.* defaults"]
    parts += textwrap.wrap("presets: " + ", ".join(MODELS.names()), WIDTH, initial_indent=" " * 6,
                           subsequent_indent=" " * 6)  # fmt: skip
    for f in dataclasses.fields(Config):
        if f.name == "objective":
            continue
        cls = ModelConfig if f.name == "model" else field_types(Config)[f.name]
        parts += key_lines(cls, f"{f.name}.")
    parts += ["", *_options("objectives", OBJECTIVES, "objective.name")]
    return "\n".join(parts)


def finetune_help() -> str:
    from lmforge.adapt.peft import ADAPTERS
    from lmforge.registry import TASKS
    from lmforge.tasks.config import FinetuneConfig

    parts = ["recipes (recipes/finetune):", *recipe_lines("finetune"), "", "config keys (--section.key=value):"]
    for f in dataclasses.fields(FinetuneConfig):
        if f.name not in ("task", "peft"):
            parts += key_lines(field_types(FinetuneConfig)[f.name], f"{f.name}.")
    parts += ["", *_options("task types", TASKS, "task.type"), "", *_options("PEFT methods", ADAPTERS, "peft.method")]
    return "\n".join(parts)


def schema_help(kind: str, schema: type) -> str:
    """Recipes of `kind` and every key of `schema` (alignment, compression)."""
    parts = [f"recipes (recipes/{kind}):", *recipe_lines(kind), "", "config keys (--section.key=value):"]
    return "\n".join(parts + key_lines(schema, ""))
