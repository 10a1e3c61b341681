"""The config core: typed dataclasses built from YAML recipes and dotted CLI overrides, validated once (unknown
keys get a did-you-mean, values are checked against the field types). It knows no run kind: each kind's schema lives
beside the kind and is built with these functions."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml

from lmforge.config.types import Range
from lmforge.errors import LMForgeError, did_you_mean
from lmforge.files import write_atomic

RECIPES_DIR = Path(__file__).parents[1] / "recipes"


def field_types(cls: type) -> dict[str, Any]:
    """Field name → type of a config dataclass, range annotations (`Annotated[int, Range]`) kept."""
    return typing.get_type_hints(cls, include_extras=True)


def all_keys(cls: type, prefix: str = "") -> list[str]:
    keys = []
    hints = field_types(cls)
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        if dataclasses.is_dataclass(t):
            keys += all_keys(t, f"{prefix}{f.name}.")
        else:
            keys.append(f"{prefix}{f.name}")
    return keys


def type_name(t: Any) -> str:
    """A field type as users read it: "integer > 0", "one of 'a', 'b'", "number or null"."""
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is Annotated:
        ranges = [a for a in t.__metadata__ if isinstance(a, Range)]
        return type_name(args[0]) + "".join(f" {r.describe()}" for r in ranges)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in args)
    if origin is list:
        return f"list of {type_name(args[0])}"
    names = {int: "integer", float: "number", str: "string", bool: "true/false", type(None): "null"}
    return names.get(t, getattr(t, "__name__", str(t)))


def coerce(value: Any, t: Any, key: str) -> Any:
    """Check/convert one value against a field type; raise a one-line LMForgeError on mismatch."""
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is Annotated:
        value = coerce(value, args[0], key)
        for check in t.__metadata__:
            if isinstance(check, Range):
                check.check(key, value)
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return coerce(value, a, key)
            except LMForgeError as e:
                errors.append(e)
        raise errors[0]
    if origin is Literal:
        if value in args:
            return value
        raise LMForgeError(f"{key}: expected {type_name(t)}, got {value!r}")
    if origin is list:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            raise LMForgeError(f"{key}: expected a list, got {value!r}")
        return [coerce(v, args[0], key) for v in value]
    if t is bool:
        if isinstance(value, bool):
            return value
        raise LMForgeError(f"{key}: expected true or false, got {value!r}")
    if t is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise LMForgeError(f"{key}: expected an integer, got {value!r}")
    if t is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):  # YAML 1.1 reads "3e-4" (no dot) as a string
            try:
                number = float(value)
            except ValueError:
                pass
        if number is None:
            raise LMForgeError(f"{key}: expected a number, got {value!r}")
        # No setting means anything at NaN or infinity (1e400 overflows to it): refused here, for every field,
        # before a run trains into NaN or a range check compares against NaN (always false).
        if not math.isfinite(number):
            raise LMForgeError(f"{key} must be a finite number, got {value!r}")
        return number
    if t is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise LMForgeError(f"{key}: expected a string, got {value!r}")
    raise LMForgeError(f"{key}: unsupported field type {t}")


def build_dataclass(cls: type, raw: dict, prefix: str, known: list[str]) -> Any:
    """Validate a raw mapping against dataclass `cls` (recursively); `known` lists every valid dotted key for
    did-you-mean suggestions."""
    if not isinstance(raw, dict) and prefix:
        name, first = prefix.rstrip("."), dataclasses.fields(cls)[0].name
        raise LMForgeError(f"{name} is a section, not a value (got {raw!r}): set its keys, e.g. --{name}.{first}=…")
    if not isinstance(raw, dict):
        raise LMForgeError(f"config: expected a mapping, got {raw!r}")
    hints = field_types(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for k, v in raw.items():
        key = f"{prefix}{k}"
        if k not in names:
            from lmforge.flag_hints import foreign_name

            other = foreign_name(key) if not prefix else None
            if other is not None:
                raise LMForgeError(f"unknown config key '{key}': lmforge's name for it is {other}")
            raise LMForgeError(f"unknown config key '{key}'{did_you_mean(key, known)}")
        t = hints[k]
        kwargs[k] = build_dataclass(t, v, f"{key}.", known) if dataclasses.is_dataclass(t) else coerce(v, t, key)
    return cls(**kwargs)


def _set_dotted(tree: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise LMForgeError(f"config key '{key}': '{p}' is not a section")
        node = nxt
    node[parts[-1]] = value


def parse_overrides(args: list[str]) -> dict:
    """['--train.lr=3e-4', '--train.compile'] → nested dict; values parsed as YAML scalars."""
    tree: dict = {}
    for i, a in enumerate(args):
        if not a.startswith("--") or a == "--":
            before = args[i - 1] if i else ""
            tip = f": {before}={a}?" if before.startswith("--") and "=" not in before and "." in before else ""
            raise LMForgeError(f"unexpected argument '{a}' (overrides look like --section.key=value{tip})")
        body = a[2:]
        key, sep, text = body.partition("=")
        value: Any = True if not sep else _parse_scalar(text)
        _set_dotted(tree, key, value)
    return tree


def _parse_scalar(text: str) -> Any:
    try:
        return yaml.safe_load(text) if text else ""
    except yaml.YAMLError:
        return text


def merge_dicts(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge_dicts(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def resolve_recipe(recipe: str | None, kind: str = "pretrain") -> Path | None:
    """A recipe path, or the name of a bundled recipe (e.g. 'gpt' → recipes/pretrain/gpt.yaml)."""
    if recipe is None:
        return None
    p = Path(recipe)
    bundled = RECIPES_DIR / kind / f"{recipe}.yaml"
    if p.suffix in (".yaml", ".yml") or p.is_file() or (p.exists() and not bundled.is_file()):
        if not p.is_file():
            raise LMForgeError(f"recipe file not found: {recipe}")
        return p
    if bundled.is_file():  # a bundled name, also where a directory of that name stands in the working directory
        return bundled
    names = sorted(x.stem for x in (RECIPES_DIR / kind).glob("*.yaml"))
    raise LMForgeError(f"unknown recipe '{recipe}'{did_you_mean(recipe, names, 'bundled: ' + ', '.join(names))}")


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (plain YAML keeps the last value silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key}' given twice (line {key_node.start_mark.line + 1})", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path) -> dict:
    """A recipe (or saved config) file as a mapping; invalid YAML and repeated keys are one line."""
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506 (a safe loader)
    except yaml.YAMLError as e:
        raise LMForgeError(f"{path}: invalid YAML ({str(e).splitlines()[0]})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise LMForgeError(f"cannot read {path}: {e}") from None
    except RecursionError:  # [[[...]]] nested deeper than the parser's recursion limit
        raise LMForgeError(f"{path}: invalid YAML (nested too deeply)") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise LMForgeError(f"{path}: a recipe must be a YAML mapping")
    return data


def check_sections(
    tree: dict, schema: type, where: str, shorthand: dict[str, str] | None = None, prefix: str = ""
) -> dict:
    """`tree` (a recipe file's mapping, read from `where`) with every key that names a section of `schema` holding
    a mapping, checked before overrides are merged over it: an override's section would otherwise replace a
    section given a value (`train: 5`) without a word. A null section (its keys all commented out) is dropped;
    a string is `{shorthand[key]: string}` where `shorthand` allows it (pretraining's `model: gpt-tiny`)."""
    hints, out = field_types(schema), {}
    for k, v in tree.items():
        t = hints.get(k) if isinstance(k, str) else None
        if t is None or not dataclasses.is_dataclass(t):
            out[k] = v
            continue
        sub = (shorthand or {}).get(k) if not prefix else None
        if v is None:
            continue
        if isinstance(v, str) and sub is not None:
            v = {sub: v}
        if not isinstance(v, dict):
            alt = f" or a name ({k}.{sub})" if sub is not None else ""
            raise LMForgeError(f"{where}: {prefix}{k}: expected a mapping of keys{alt}, got {v!r}")
        out[k] = check_sections(v, t, where, None, f"{prefix}{k}.")
    return out


def recipe_dict(
    recipe: str | Path | None, kind: str, overrides: list[str] | dict | None = None, extra: dict | None = None,
    schema: type | None = None,
) -> dict:  # fmt: skip
    """The raw config tree of a recipe (path or bundled name in recipes/<kind>/) with dotted overrides and
    `extra` (e.g. a CLI flag's value) merged on top; with `schema`, the file's sections are checked first
    (`check_sections`); validation is the caller's `build_*`."""
    raw: dict = {}
    if recipe is not None:
        path = resolve_recipe(str(recipe), kind=kind)
        raw = read_yaml(path)
        if schema is not None:
            raw = check_sections(raw, schema, str(path))
    over = overrides if isinstance(overrides, dict) else parse_overrides(overrides or [])
    return merge_dicts(merge_dicts(raw, over), extra or {})


def write_yaml(path: Path, data: dict) -> None:
    """Write `data` as YAML at `path`, atomically and never through a symbolic link."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, yaml.safe_dump(data, sort_keys=False))


def flat_keys(tree: dict, prefix: str = "") -> list[str]:
    """The dotted keys a raw (nested) config dict sets."""
    out = []
    for k, v in tree.items():
        out += flat_keys(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"{prefix}{k}"]
    return out


def get_key(tree: dict, dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def has_key(tree: dict, dotted: str) -> bool:
    """Whether a raw (nested) config dict sets the dotted key."""
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True
