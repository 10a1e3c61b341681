"""The argument plumbing shared by `lmforge`'s commands: a parser whose --help shows the named recipe's resolved
values (`lmforge pretrain gpt --help`), RECIPE or `--config FILE`, `--print-config`, `--SECTION=value` shorthands
(`--model=gpt-tiny`), overrides with their value after a space as after '=' (`--train.max_steps 5`, as argparse,
transformers and litgpt take them), one-line hints for the flags other trainers use (`--lr`, `--output_dir`), and
the checks of a training command's overrides."""

from __future__ import annotations

import argparse
import dataclasses
import math
import typing
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from lmforge.errors import LMForgeError

if TYPE_CHECKING:  # the config package imports torch, which a command line is read without
    from lmforge.config.types import Range

HELP_FLAGS = ("-h", "--help")

SHORTHANDS: dict[str, dict[str, str]] = {
    "pretrain": {"model": "preset", "objective": "name"},
    "finetune": {"model": "init", "task": "type", "peft": "method"},
    "align": {"model": "init"},
    "compress": {"teacher": "run"},
}
SHORTHANDS["experiment"] = SHORTHANDS["scaling"] = SHORTHANDS["pretrain"]  # their overrides go to pretraining arms
"""Per kind, the sections a bare `--SECTION=value` names a key of: `--model=gpt-tiny` is `--model.preset=gpt-tiny`."""
OWN_NAMES = {"experiment": {"seeds", "budget", "finetune", "eval"}}
"""Top-level override names of commands whose overrides are not one config schema."""
OPTION_REGISTRIES = {"objective": "OBJECTIVES", "task": "TASKS", "peft": "ADAPTERS"}
"""Sections whose other keys are the options of the entry they name (an objective, a task type, a PEFT method)."""


class _QuietParse(Exception):
    """A parse error while only looking for the recipe --help should describe."""


class Parser(argparse.ArgumentParser):
    """An argument parser whose epilog is built only when help is shown, from the arguments given beside --help
    (`epilog_fn(namespace, other_args)`): `lmforge pretrain gpt --model.preset=gpt-tiny --help` lists the values
    that line resolves to. Listing every key imports the registries, which the other commands need not wait for."""

    def __init__(self, *args, epilog_fn: Callable[[argparse.Namespace | None, list[str]], str] | None = None,
                 **kwargs) -> None:  # fmt: skip
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)
        self.epilog_fn = epilog_fn
        self._help_args: tuple[argparse.Namespace | None, list[str]] = (None, [])

    def parse_known_args(self, args=None, namespace=None):
        takes, kind = self._override_kind()
        if takes and args is not None:
            args = join_spaced_values(list(args), kind)
        if self.epilog_fn is not None and args is not None and _asks_help(list(args)):
            rest = [a for a in args if a not in HELP_FLAGS]
            self._help_args = self._parse_quietly(rest)
        return super().parse_known_args(args, namespace)

    def _parse_quietly(self, args: list[str]) -> tuple[argparse.Namespace | None, list[str]]:
        def fail(message: str):
            raise _QuietParse(message)

        error, self.error = self.error, fail  # type: ignore[method-assign]
        try:
            return super().parse_known_args(args, argparse.Namespace())
        except _QuietParse:
            return None, []
        finally:
            self.error = error  # type: ignore[method-assign]

    def _override_kind(self) -> tuple[bool, str | None]:
        """(whether this command takes config overrides, the run kind they are of; None: known only from the
        recipe, as for `config show`)."""
        kind, command = self._defaults.get("kind"), self.prog.split()[-1]
        if kind is not None or command in SHORTHANDS:
            return True, kind or command
        return self.prog.endswith(" config show"), None

    def format_help(self) -> str:
        if self.epilog_fn is not None:
            self.epilog = self.epilog_fn(*self._help_args)
        return super().format_help()


def _asks_help(args: list[str]) -> bool:
    head = args[: args.index("--")] if "--" in args else args
    return any(a in HELP_FLAGS for a in head)


def add_recipe_args(p: argparse.ArgumentParser, kind: str, what: str, method: str | None = None) -> None:
    """RECIPE, --config FILE and --print-config of a training command of `kind` (an align `method`)."""
    p.add_argument("recipe", nargs="?", help=what)
    p.add_argument("--config", dest="config_file", metavar="FILE", help="the recipe file (the same as RECIPE)")
    p.add_argument(
        "--print-config", action="store_true",
        help="print the resolved config (as `lmforge config show` does) and run nothing",
    )  # fmt: skip
    p.set_defaults(kind=kind, method=method)


def recipe_of(args: argparse.Namespace, field: str = "recipe") -> str | None:
    """The recipe a command line names: RECIPE or --config FILE, not both."""
    given, file = getattr(args, field, None), getattr(args, "config_file", None)
    if given is not None and file is not None:
        raise LMForgeError(f"give the recipe once: {given} or --config {file}, not both")
    return file if file is not None else given


def recipe_help(kind: str, method: str | None = None) -> Callable[[argparse.Namespace | None, list[str]], str]:
    """The --help epilog of a training command: the recipes, or the named one, and every key with its value."""

    def build(ns: argparse.Namespace | None, extra: list[str]) -> str:
        from lmforge.cli.help import kind_help

        recipe = recipe_of(ns) if ns is not None else None
        init = getattr(ns, "init", None)
        return kind_help(kind, recipe, check_overrides(kind, extra), init, method)

    return build


def listing_help(kind: str, field: str) -> Callable[[argparse.Namespace | None, list[str]], str]:
    """The --help epilog of `experiment` / `scaling`: the bundled files, or the named one's description."""

    def build(ns: argparse.Namespace | None, extra: list[str]) -> str:
        from lmforge.cli.help import listing_help as text

        return text(kind, recipe_of(ns, field) if ns is not None else None)

    return build


def named(args: argparse.Namespace, field: str) -> str:
    """The experiment / sweep file a command line names (as the positional or --config FILE)."""
    name = recipe_of(args, field)
    if name is None:
        raise LMForgeError(f"name the {field}: a file or a bundled name (see lmforge {args.command} --help)")
    return name


def positive(text: str) -> int:
    """An argparse type: a positive integer."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def check_numbers(args: argparse.Namespace, ranges: dict[str, Range]) -> None:
    """Refuse a numeric option (argparse dest → allowed range) that is out of its range or not finite (argparse's
    float takes "nan" and "inf") in one line naming the flag, before the command loads anything:
    `--temperature must be >= 0, got -1.0`. Options not given (None) are skipped; a repeatable one is checked
    value by value."""
    for dest, allowed in ranges.items():
        given = getattr(args, dest, None)
        flag = "--" + dest.replace("_", "-")
        for value in given if isinstance(given, list) else [given]:
            if value is None:
                continue
            if isinstance(value, float) and not math.isfinite(value):
                raise LMForgeError(f"{flag} must be a finite number, got {value}")
            allowed.check(flag, value)


def devices_of(args: argparse.Namespace) -> list[str] | None:
    """The GPUs of `--devices 0,1,2,3` (None when not given)."""
    return args.devices.split(",") if args.devices else None


def schema_of(kind: str) -> type:
    """The config dataclass of a run kind (of pretraining for the commands that pretrain: scaling, experiment)."""
    from lmforge.run_kinds import RUN_KINDS

    return RUN_KINDS.get(kind, RUN_KINDS["pretrain"]).schema()


def check_overrides(kind: str, overrides: list[str]) -> list[str]:
    """The overrides of a command of `kind` with `--SECTION=value` shorthands spelled out; a bare section with no
    shorthand, or a flag of another trainer (`--lr`), is refused in one line saying what lmforge calls it."""
    from lmforge.flag_hints import foreign_hint

    out: list[str] = []
    for arg in overrides:
        key, sep, value = arg[2:].partition("=") if arg.startswith("--") and arg != "--" else ("", "", "")
        if not key or "." in key:
            out.append(arg)
            continue
        schema = schema_of(kind)
        top = {f.name for f in dataclasses.fields(schema)}
        if key not in top and key not in OWN_NAMES.get(kind, ()) and foreign_hint(arg):
            raise LMForgeError(str(foreign_hint(arg)))
        section = _field_type(schema, key) if key in top else None
        if section is None or not dataclasses.is_dataclass(section):
            out.append(arg)
            continue
        sub = SHORTHANDS.get(kind, {}).get(key)
        if sub is not None and sep and value:
            out.append(f"--{key}.{sub}={value}")
            continue
        fields = [f.name for f in dataclasses.fields(section)]
        example = f"--{key}.{sub or fields[0]}=…"
        got = f"--{key}={value}" if sep else f"--{key}"
        raise LMForgeError(f"{got}: {key} is a section of keys ({', '.join(fields[:4])}, …): set one, e.g. {example}")
    _check_model_names(kind, out)
    return out


def _check_model_names(kind: str, overrides: list[str]) -> None:
    """Refuse a model preset that does not exist (`--model=gpt2`) before any work, with the presets it most likely
    means (gpt2 → gpt2-124m, ...); a fine-tuning or alignment `model.init` that is no path and no preset likewise."""
    key = "model.preset" if SHORTHANDS.get(kind, {}).get("model") == "preset" else "model.init"
    for arg in overrides:
        name, sep, value = arg[2:].partition("=")
        if name != key or not sep or not value or value.lower() in ("none", "null", "~"):
            continue
        if key == "model.init" and (Path(value).exists() or "/" in value or "\\" in value):
            continue
        import lmforge.models  # noqa: F401  (registers the presets)
        from lmforge.flag_hints import suggest
        from lmforge.registry import MODELS

        if value in MODELS:
            continue
        tip = suggest(value, MODELS.names()) or f" (known: {', '.join(MODELS.names())})"
        if key == "model.preset":
            raise LMForgeError(f"unknown model preset '{value}'{tip}")
        raise LMForgeError(f"model.init: '{value}' is neither a run/checkpoint/model dir nor a model preset{tip}")


def training_overrides(kind: str, argv: list[str], extra: list[str]) -> list[str]:
    """The extra arguments of a training command of `kind` as its config overrides, checked (shorthands, other
    trainers' flags). `argv` is the command line; its spaced values were joined when it was parsed
    (`join_spaced_values`)."""
    return check_overrides(kind, extra)


def join_spaced_values(args: list[str], kind: str | None) -> list[str]:
    """`--train.max_steps 5` → `--train.max_steps=5`, `--model gpt-tiny` for a section with a shorthand and `--seeds
    0,1` for an experiment's own names, so that the value is not taken for the recipe. A value starting with '-' is
    one only as a number (`--train.lr -1e-3`); a switch (`--train.compile`) takes only true/false after it
    (`--train.compile gpt`: a switch, then the recipe). Nothing after `--` is touched. `kind`: the run kind whose
    schema says which keys are switches (None: any kind's)."""
    out: list[str] = []
    i = 0
    while i < len(args):
        flag = args[i]
        if flag == "--":
            return out + args[i:]
        if i + 1 < len(args) and _takes_spaced_value(flag, args[i + 1], kind):
            out.append(f"{flag}={args[i + 1]}")
            i += 2
            continue
        out.append(flag)
        i += 1
    return out


def _takes_spaced_value(flag: str, value: str, kind: str | None) -> bool:
    if not flag.startswith("--") or "=" in flag or flag == "--" or value == "--":
        return False
    key = flag[2:]
    sections = SHORTHANDS.get(kind, {}) if kind else {k for names in SHORTHANDS.values() for k in names}
    if "." not in key and key not in sections and key not in OWN_NAMES.get(kind or "", ()):
        return False
    if value.startswith("-") and not _is_number(value):
        return False
    if "." in key and _is_switch(kind, key):
        return _parse_bool(value) is not None
    return True


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _parse_bool(text: str) -> bool | None:
    """True or False for the words YAML reads as them (true, false, yes, no, on, off), else None."""
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    return value if isinstance(value, bool) else None


def _is_switch(kind: str | None, key: str) -> bool:
    """Whether the dotted `key` is a true/false field of `kind`'s config (of any kind's when None), an option of
    an objective, task type or PEFT method included."""
    from lmforge.run_kinds import RUN_KINDS

    schemas = [schema_of(kind)] if kind else [k.schema() for k in RUN_KINDS.values()]
    return any(_is_bool(t) for schema in schemas for t in _key_types(schema, key.split(".")))


def _key_types(schema: type, parts: list[str]) -> list:
    """The types `parts` (a dotted key) can have in `schema`: one, or one per entry of an options registry."""
    from lmforge.config import field_types

    t = field_types(schema).get(parts[0])
    if t is None:
        return []
    if len(parts) == 1:
        return [t]
    if dataclasses.is_dataclass(t):
        inner = _key_types(t, parts[1:])
        return inner or (_option_types(parts[0], parts[1:]) if "options" in field_types(t) else [])
    return []


def _option_types(section: str, parts: list[str]) -> list:
    """The types of an option key in every options class of the section's registry (task: each task type's)."""
    if section not in OPTION_REGISTRIES or len(parts) != 1:
        return []
    import lmforge.adapt.peft  # noqa: F401  (each module registers its entries)
    import lmforge.objectives  # noqa: F401
    import lmforge.tasks  # noqa: F401
    from lmforge import registry
    from lmforge.config import field_types

    found = []
    for name in getattr(registry, OPTION_REGISTRIES[section]).names():
        options = getattr(getattr(registry, OPTION_REGISTRIES[section]).get(name), "Options", None)
        if options is not None and dataclasses.is_dataclass(options) and parts[0] in field_types(options):
            found.append(field_types(options)[parts[0]])
    return found


def _is_bool(t) -> bool:
    while typing.get_origin(t) is typing.Annotated:
        t = typing.get_args(t)[0]
    return t is bool or bool in typing.get_args(t)


def _field_type(schema: type, name: str) -> type:
    from lmforge.config import field_types

    return field_types(schema)[name]
