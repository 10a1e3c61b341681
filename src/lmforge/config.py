"""Run configuration: a tree of typed dataclasses loaded from YAML recipes with dotted CLI overrides.

Validation happens once, here: unknown keys get a did-you-mean, values are checked against the field types."""

from __future__ import annotations

import dataclasses
import math
import sys
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from difflib import get_close_matches
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml

from lmforge.checkpoints import model_checkpoint, newest_config, read_config
from lmforge.config_types import NonNegFloat, NonNegInt, PosFloat, PosInt, Range
from lmforge.errors import LMForgeError
from lmforge.files import write_atomic
from lmforge.models.config import ModelConfig
from lmforge.sections import LoopConfig, OptimConfig, RunConfig

RECIPES_DIR = Path(__file__).parent / "recipes"


@dataclass
class PretrainRunConfig(RunConfig):
    dir: str = "runs/demo"
    """Run directory: config.yaml, metrics.jsonl, checkpoints/, plots/, tokenizer/, data/."""
    init: str | None = None
    """Continue pretraining from this run's latest checkpoint (or this checkpoint dir): domain- or task-adaptive
    pretraining on new data. Its model section replaces model.*, and its tokenizer is used unless data.tokenizer
    names one; the optimizer, schedule and data start afresh."""


@dataclass
class DataConfig:
    inputs: list[str] = field(default_factory=list)
    """Text files/dirs (txt, jsonl, csv, parquet), save_to_disk dataset dirs, hf:NAME (a cached Hugging Face dataset,
    read offline), fetched corpora by name; empty = the bundled public-domain corpus."""
    text_field: str = "text"
    """The JSONL field, or CSV / Parquet / dataset column, that holds the text."""
    prepared: str | None = None
    """A directory made by `lmforge data prepare` to train on directly (skips tokenizer training and prepare)."""
    tokenizer: str | None = None
    """A tokenizer dir/file, or a published tokenizer by name (gpt2); None = train one on the inputs."""
    tokenizer_kind: Literal["bpe", "wordpiece", "unigram"] = "bpe"
    tokenizer_family: Literal["gpt", "bert", "t5", "bart", "llama"] | None = None
    """Special-token set of a tokenizer trained for this run (None: gpt for decoders, bert for encoders,
    t5 for encoder-decoders)."""
    tokenizer_sample_chars: NonNegInt | None = None
    """Train the run's tokenizer on a deterministic sample of this many characters (None: unigram 100 a token, at
    least 500k; bpe and wordpiece all of it; 0: all). Trained tokenizers are cached by content and settings."""
    vocab_size: PosInt = 4096
    """Vocabulary size of a tokenizer trained for this run. A recipe's value gives way to a preset the user
    names (--model.preset), and the model's vocab_size follows the tokenizer."""
    val_fraction: Annotated[float, Range(0, 1, lo_open=True, hi_open=True)] = 0.05
    """Fraction of the documents held out for validation."""
    clean: bool = False
    """Apply the C4 cleaning rules before tokenizing."""


@dataclass
class ObjectiveConfig:
    name: str = "causal_lm"
    """A registered objective (see `lmforge.objectives`)."""
    options: Any = None
    """The objective's own typed options (its `Options` dataclass), given as the other keys of the section."""


@dataclass
class TrainConfig(LoopConfig, OptimConfig):
    """The pretraining loop and its optimizer."""

    seq_len: PosInt = 256
    """Tokens per training sequence (at most the model's max_seq_len)."""
    eval_batches: PosInt = 20
    """Validation batches per evaluation."""
    target_loss: PosFloat | None = None
    """Stop at the first evaluation whose validation loss is at or below this (time-to-loss runs)."""


@dataclass
class SampleConfig:
    prompts: list[str] = field(default_factory=lambda: ["It is a truth universally acknowledged"])
    """Prompts sampled from at the end of a decoder's pretraining (empty = none)."""
    max_new_tokens: NonNegInt = 60
    temperature: NonNegFloat = 0.8
    top_k: PosInt | None = 40


@dataclass
class Config:
    run: PretrainRunConfig = field(default_factory=PretrainRunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)


# --- parsing ------------------------------------------------------------------------------------------------


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
            hint = get_close_matches(key, known, n=1, cutoff=0.6)
            tip = f" — did you mean '{hint[0]}'?" if hint else ""
            raise LMForgeError(f"unknown config key '{key}'{tip}")
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
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.is_file():
            raise LMForgeError(f"recipe file not found: {recipe}")
        return p
    bundled = RECIPES_DIR / kind / f"{recipe}.yaml"
    if bundled.is_file():
        return bundled
    names = sorted(x.stem for x in (RECIPES_DIR / kind).glob("*.yaml"))
    hint = get_close_matches(recipe, names, n=1)
    tip = f" — did you mean '{hint[0]}'?" if hint else f" (bundled: {', '.join(names)})"
    raise LMForgeError(f"unknown recipe '{recipe}'{tip}")


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
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise LMForgeError(f"{path}: a recipe must be a YAML mapping")
    return data


def recipe_dict(
    recipe: str | Path | None, kind: str, overrides: list[str] | dict | None = None, extra: dict | None = None
) -> dict:
    """The raw config tree of a recipe (path or bundled name in recipes/<kind>/) with dotted overrides and
    `extra` (e.g. a CLI flag's value) merged on top; validation is the caller's `build_*`."""
    raw = read_yaml(resolve_recipe(str(recipe), kind=kind)) if recipe is not None else {}
    over = overrides if isinstance(overrides, dict) else parse_overrides(overrides or [])
    return merge_dicts(merge_dicts(raw, over), extra or {})


def write_yaml(path: Path, data: dict) -> None:
    """Write `data` as YAML at `path`, atomically and never through a symbolic link."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, yaml.safe_dump(data, sort_keys=False))


def load_config(recipe: str | Path | None = None, overrides: list[str] | dict | None = None) -> Config:
    """Recipe YAML (path or bundled name) + dotted overrides → validated Config.

    `model.preset` picks a registered architecture; other model.* keys override its fields. What the user asks
    for wins over the recipe, and a preset's limits over recipe values the user did not set (`fit_to_model`)."""
    user = overrides if isinstance(overrides, dict) else parse_overrides(overrides or [])
    base = read_yaml(resolve_recipe(str(recipe), "pretrain")) if recipe is not None else {}
    base, user = with_init_model(base, user)
    cfg = build_config(merge_dicts(base, user))
    if recipe is not None and cfg.run.recipe is None:
        cfg.run.recipe = str(recipe)
    fit_to_model(cfg, base, user)
    return cfg


def with_init_model(recipe: dict, user: dict) -> tuple[dict, dict]:
    """(recipe, user) trees with run.init's model and tokenizer in place of the recipe's: continued pretraining
    goes on with the model it continues. The user's model.* keys still apply on top of it (a model.preset other
    than the run's replaces it), and so does the user's data.tokenizer. A run.init not on disk (yet: an
    experiment plans runs before their init runs exist) changes nothing; the run itself refuses it."""
    init = get_key(merge_dicts(recipe, user), "run.init")
    if not init or not Path(str(init)).exists():
        return recipe, user
    ckpt = model_checkpoint(Path(str(init)))
    saved = read_config(ckpt).get("model")
    if not isinstance(saved, dict):
        raise LMForgeError(f"run.init: {ckpt}/config.yaml has no model section")
    mine = user.get("model") if isinstance(user.get("model"), dict) else {}
    preset = mine.get("preset")
    if preset is not None and preset != saved.get("name"):
        return recipe, user  # the user asked for another model: theirs, from its preset
    recipe = {k: v for k, v in recipe.items() if k != "model"}
    model = {**saved, **{k: v for k, v in mine.items() if k != "preset"}}
    user = {**user, "model": model}
    if not has_key(user, "data.tokenizer"):
        if not (ckpt / "tokenizer.json").is_file():
            raise LMForgeError(f"run.init: {ckpt} holds no tokenizer.json; pass --data.tokenizer")
        user = merge_dicts(user, {"data": {"tokenizer": str(ckpt)}})
    return recipe, user


CHANGEABLE_ON_RESUME = ("train.", "sample.", "run.dir")
FIXED_ON_RESUME = ("train.seq_len", "train.optimizer", "train.layer_decay")
"""Keys of the train section that the saved data position or optimizer state depends on. train.batch_size may
change with the number of processes: the loaders refuse a resume whose global batch (batch_size × processes)
differs from the saved one."""
RESUME_FIXED = ("train.optimizer", "train.layer_decay")
"""The same for runs over examples (fine-tuning, alignment): no sequence length."""


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


def resumed(
    run_dir: Path, recipe: str | None, overrides: list[str] | dict | None, build: Callable[[dict], Any],
    dump: Callable[[Any], dict], fixed: tuple[str, ...] = FIXED_ON_RESUME,
    unpack: Callable[[dict], dict] | None = None,
) -> Any | None:  # fmt: skip
    """The config a resumed run continues with: its own RUN/config.yaml with the user's overrides on top (None
    when the run has no config yet), built by `build` and dumped back by `dump`. Overrides may change train.*
    (except the `fixed` keys the saved data position depends on) and sample.*, and apply from the resumed step on;
    anything else is refused with one line. A missing or unreadable config.yaml gives way to the newest checkpoint's
    own config (`unpack` takes the run's config out of it, where the checkpoint holds more)."""
    saved = saved_run_config(Path(run_dir), build, unpack or (lambda c: c))
    if saved is None:
        return None
    user = overrides if isinstance(overrides, dict) else parse_overrides(overrides or [])
    made_with = get_key(saved, "run.recipe")
    if recipe is not None and made_with is not None and Path(str(recipe)).stem != Path(str(made_with)).stem:
        raise LMForgeError(f"cannot resume {run_dir} with recipe '{recipe}': the run was made with '{made_with}'")
    cfg = build(merge_dicts(saved, user))
    new = dump(cfg)
    for key in flat_keys(user):
        was, now = get_key(saved, key), get_key(new, key)
        if key == "model.preset" and was is None:  # a pretraining config keeps the preset's name, not the key
            was, now = get_key(saved, "model.name"), get_key(user, key)
        allowed = key.startswith(CHANGEABLE_ON_RESUME) and key not in fixed
        if not allowed and now != was:
            raise LMForgeError(
                f"cannot change {key} when resuming ({was!r} → {now!r}): start a new run with another --run.dir"
            )
    return cfg


def saved_run_config(run_dir: Path, build: Callable[[dict], Any], unpack: Callable[[dict], dict]) -> dict | None:
    """RUN/config.yaml; when it is missing, or not a config `build` accepts, the config of the newest checkpoint
    whose config.yaml is intact (every checkpoint carries its own), said in one note line. None when the run has
    neither; a damaged config.yaml without a checkpoint config to replace it is one error line."""
    path = run_dir / "config.yaml"
    problem = None
    if path.is_file():
        try:
            saved = read_yaml(path)
            build(saved)
            return saved
        except LMForgeError as e:
            problem = str(e)
    found = newest_config(run_dir)
    if found is None:
        if problem is not None:
            raise LMForgeError(f"cannot resume {run_dir}: {problem}, and no checkpoint holds a config to continue with")
        return None
    ckpt, config = found
    why = "is missing" if problem is None else f"is unreadable ({problem})"
    print(f"note: {path} {why}: resuming with the config saved in {ckpt}", file=sys.stderr)
    return unpack(config)


def resolved_run_dir(recipe: str | None, kind: str, user: dict, default: str | None = None) -> Path:
    """The run dir a command line names: --run.dir, else the recipe's run.dir, else `default`."""
    found = get_key(user, "run.dir")
    if found is None and recipe is not None:
        found = get_key(read_yaml(resolve_recipe(recipe, kind)), "run.dir")
    if found is None and default is None:
        raise LMForgeError("--resume needs the run: pass --run.dir=DIR")
    return Path(found or default)


def load_resume_config(run_dir: Path, recipe: str | None, overrides: list[str] | dict | None) -> Config | None:
    """A resumed pretraining run's config (`resumed`), None when the run has none yet."""
    return resumed(run_dir, recipe, overrides, build_config, to_dict)


def has_key(tree: dict, dotted: str) -> bool:
    """Whether a raw (nested) config dict sets the dotted key."""
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def fit_to_model(cfg: Config, recipe: dict, user: dict) -> None:
    """Reconcile the recipe's data and train values with the model, before any work is done.

    - Vocabulary: a tokenizer trained for the run has data.vocab_size tokens, and the model's vocab_size follows
      it. The user's data.vocab_size (or model.vocab_size) wins; a preset the user names wins over the recipe's
      data.vocab_size; otherwise the recipe's value stands. A given tokenizer sets the model's vocab_size unless
      the user pinned model.vocab_size (to at least the tokenizer's size).
    - Sequence length: train.seq_len may not exceed the model's max_seq_len. A value the user gave is refused;
      a recipe's value gives way to the preset's limit."""
    from lmforge.progress import status

    notes = []
    m, d, t = cfg.model, cfg.data, cfg.train
    user_model_vocab = has_key(user, "model.vocab_size")
    if d.prepared and not d.tokenizer and not cfg.run.init:  # the tokenizer `data prepare` recorded (run.init: its own)
        from lmforge.data.prepare import prepared_tokenizer

        d.tokenizer = prepared_tokenizer(d.prepared)
        notes.append(f"data.tokenizer {d.tokenizer} (what {d.prepared} was prepared with)")
    if d.tokenizer:
        from lmforge.tokenizers.published import tokenizer_vocab_size

        size = tokenizer_vocab_size(d.tokenizer)
        if not user_model_vocab:
            m.vocab_size = size
        elif m.vocab_size < size:
            raise LMForgeError(f"model.vocab_size={m.vocab_size} is smaller than the tokenizer's {size} tokens")
    elif not d.prepared:
        if has_key(user, "data.vocab_size"):
            vocab = d.vocab_size
        elif user_model_vocab or has_key(user, "model.preset") or not has_key(recipe, "data.vocab_size"):
            vocab = m.vocab_size
            if has_key(recipe, "data.vocab_size") and vocab != d.vocab_size:
                notes.append(f"data.vocab_size {d.vocab_size} → {vocab} (model {m.name}'s vocabulary)")
        else:
            vocab = d.vocab_size
        d.vocab_size = vocab
        if not user_model_vocab:
            m.vocab_size = vocab
        elif m.vocab_size < vocab:
            raise LMForgeError(f"model.vocab_size={m.vocab_size} is smaller than data.vocab_size={vocab}")
    if t.seq_len > m.max_seq_len:
        if has_key(user, "train.seq_len"):
            raise LMForgeError(
                f"train.seq_len={t.seq_len} exceeds model {m.name}'s max_seq_len {m.max_seq_len}: lower "
                f"--train.seq_len or raise --model.max_seq_len"
            )
        notes.append(f"train.seq_len {t.seq_len} → {m.max_seq_len} (model {m.name}'s max_seq_len)")
        t.seq_len = m.max_seq_len
    for note in notes:
        status(f"note: {note}")


def build_config(raw: dict) -> Config:
    raw = dict(raw)
    model_raw = raw.get("model") or {}
    if isinstance(model_raw, str):  # --model=gpt-tiny
        model_raw = {"preset": model_raw}
    elif not isinstance(model_raw, dict):
        raise LMForgeError(f"model: expected a mapping or a preset name, got {model_raw!r}")
    model_raw = dict(model_raw)
    if isinstance(raw.get("objective"), str):  # --objective=bert_mlm
        raw["objective"] = {"name": raw["objective"]}
    preset = model_raw.pop("preset", None)
    if preset is not None:
        from lmforge.models.presets import get_preset

        base = dataclasses.asdict(get_preset(str(preset)))
        model_raw = {**base, **model_raw}
    raw["model"] = model_raw
    objective_raw = dict(raw.pop("objective", None) or {})
    cfg = build_dataclass(Config, raw, "", all_keys(Config) + ["model.preset"])
    cfg.objective = build_objective_config(objective_raw)
    cfg.model.validate()
    return cfg


def model_config_from_dict(d: dict) -> ModelConfig:
    """A validated ModelConfig from a saved model section (a checkpoint's config.yaml)."""
    return build_config({"model": d}).model


def build_objective_config(raw: dict) -> ObjectiveConfig:
    """`name` picks the objective; every other key is validated against that objective's Options dataclass."""
    from lmforge.objectives import OBJECTIVES

    if not isinstance(raw, dict):
        raise LMForgeError(f"objective: expected a mapping, got {raw!r}")
    name = str(raw.pop("name", ObjectiveConfig.name))
    options_cls = OBJECTIVES.get(name).Options
    keys = [f"objective.{k}" for k in all_keys(options_cls)] + ["objective.name"]
    return ObjectiveConfig(name, build_dataclass(options_cls, raw, "objective.", keys))


def to_dict(cfg: Config) -> dict:
    """The resolved config as a plain dict that is itself a valid recipe (objective options flattened)."""
    d = dataclasses.asdict(cfg)
    options = d["objective"].pop("options") or {}
    d["objective"].update(options)
    return d


def save_config(cfg: Config, path: Path) -> None:
    write_yaml(path, to_dict(cfg))
