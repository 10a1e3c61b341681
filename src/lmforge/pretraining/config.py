"""The pretraining run's config: its sections (run, model, data, objective, train, sample, prune), how a recipe,
run.init and the user's overrides make one, and how its data and train values are fitted to the model
(`fit_to_model`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from lmforge.checkpoint.read import read_config
from lmforge.checkpoint.verify import model_checkpoint
from lmforge.config import (
    all_keys,
    build_dataclass,
    check_sections,
    get_key,
    has_key,
    merge_dicts,
    parse_overrides,
    read_yaml,
    resolve_recipe,
    resumed,
    write_yaml,
)
from lmforge.config.sections import LoopConfig, OptimConfig, RunConfig
from lmforge.config.types import NonNegFloat, NonNegInt, PosFloat, PosInt, Range
from lmforge.errors import LMForgeError
from lmforge.models.config import ModelConfig
from lmforge.tokenizers.specials import Family
from lmforge.train.gradual_prune import PruneConfig
from lmforge.train.seq_len_schedule import check_schedule


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
    tokenizer_family: Family | None = None
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
    decontaminate: list[str] = field(default_factory=list)
    """Labelled sets (bundled, fetched by `lmforge data fetch`, or labelled-set dirs) whose dev and test texts are kept
    out of the inputs: every paragraph sharing a word n-gram (data.decontaminate_n words) with them is dropped."""
    decontaminate_n: PosInt = 8
    """Words per n-gram of data.decontaminate."""


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
    seq_len_schedule: list[list[float]] | None = None
    """Sequence-length warmup: [[fraction, length], ...] pairs, each starting a stage at that fraction of the planned
    steps (the time budget's plan where one is set), e.g. [[0.0, 64], [0.5, 128]] with seq_len 128: windows of 64
    tokens for the first half, full windows after. Fractions start at 0.0, strictly increase and stay below 1;
    lengths strictly increase and divide seq_len; the last stage runs to the end (a last length below seq_len never
    trains on full windows; validation always scores them). Tokens per step stay batch_size·seq_len: each window is
    cut into seq_len/length pieces (more, shorter rows). Token and FLOPs accounting keep the full-length count
    (attention's share is smaller on short windows); torch.compile compiles once per stage. Packed-window objectives
    only (not sentence pairs, document chunks or Transformer-XL/XLNet memory). None = seq_len throughout."""
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
    prune: PruneConfig = field(default_factory=PruneConfig)
    """Gradual magnitude pruning while pretraining (train/gradual_prune.py)."""


SECTION_NAMES = {"model": "preset", "objective": "name"}
"""Sections a recipe may give as one name: `model: gpt-tiny` is `model: {preset: gpt-tiny}`."""


def load_config(recipe: str | Path | None = None, overrides: list[str] | dict | None = None) -> Config:
    """Recipe YAML (path or bundled name) + dotted overrides → validated Config.

    `model.preset` picks a registered architecture; other model.* keys override its fields. What the user asks
    for wins over the recipe, and a preset's limits over recipe values the user did not set (`fit_to_model`)."""
    user = overrides if isinstance(overrides, dict) else parse_overrides(overrides or [])
    user = {k: {SECTION_NAMES[k]: v} if k in SECTION_NAMES and isinstance(v, str) else v for k, v in user.items()}
    base: dict = {}
    if recipe is not None:
        path = resolve_recipe(str(recipe), "pretrain")
        base = check_sections(read_yaml(path), Config, str(path), SECTION_NAMES)
    base, user = with_init_model(base, user)
    cfg = build_config(merge_dicts(base, user))
    if recipe is not None and cfg.run.recipe is None:
        cfg.run.recipe = str(recipe)
    fit_to_model(cfg, base, user)
    check_schedule(cfg)  # after fit_to_model: it may lower train.seq_len
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


def load_resume_config(run_dir: Path, recipe: str | None, overrides: list[str] | dict | None) -> Config | None:
    """A resumed pretraining run's config (`resumed`), None when the run has none yet."""
    return resumed(run_dir, recipe, overrides, build_config, to_dict)


def fit_to_model(cfg: Config, recipe: dict, user: dict) -> None:
    """Reconcile the recipe's data and train values with the model, before any work is done.

    - Vocabulary: a tokenizer trained for the run has data.vocab_size tokens, and the model's vocab_size follows
      it. The user's data.vocab_size (or model.vocab_size) wins; a preset the user names wins over the recipe's
      data.vocab_size; otherwise the recipe's value stands. A given tokenizer sets the model's vocab_size unless
      the user pinned model.vocab_size (to at least the tokenizer's size).
    - Sequence length: train.seq_len may not exceed the model's max_seq_len. A value the user gave is refused;
      a recipe's value gives way to the preset's limit.
    - Learning rate and warmup: a preset with its own (models/presets.py PRETRAIN_DEFAULTS) brings them as it
      brings its vocabulary (`fit_schedule`)."""
    from lmforge.progress import status

    notes = fit_schedule(cfg, recipe, user)
    m, d, t = cfg.model, cfg.data, cfg.train
    user_model_vocab = has_key(user, "model.vocab_size")
    if d.prepared and not d.tokenizer and not cfg.run.init:  # the tokenizer `data prepare` recorded (run.init: its own)
        from lmforge.data.corpus.prepare import prepared_tokenizer

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


def fit_schedule(cfg: Config, recipe: dict, user: dict) -> list[str]:
    """The preset's pretraining lr and warmup in place of the recipe's: where the user names the preset (or the
    recipe names it and sets no value of its own) and gives no value of their own. Returns the notes to print."""
    from lmforge.models.presets import pretrain_defaults

    named = has_key(user, "model.preset")
    preset = get_key(user if named else recipe, "model.preset")
    own = pretrain_defaults(str(preset)) if preset is not None else None
    if own is None:
        return []
    t, notes = cfg.train, []
    if not has_key(user, "train.lr") and (named or not has_key(recipe, "train.lr")):
        if t.lr != own.lr:
            notes.append(f"train.lr {_num(t.lr)} → {_num(own.lr)} (model {preset}'s learning rate)")
        t.lr = own.lr
    warmup = ("train.warmup_steps", "train.warmup_ratio")
    if not any(has_key(user, k) for k in warmup) and (named or not any(has_key(recipe, k) for k in warmup)):
        if t.warmup_ratio is not None:
            notes.append(f"train.warmup_ratio {t.warmup_ratio:g} → train.warmup_steps {own.warmup_steps} (model "
                         f"{preset}'s warmup)")  # fmt: skip
        elif t.warmup_steps != own.warmup_steps:
            notes.append(f"train.warmup_steps {t.warmup_steps} → {own.warmup_steps} (model {preset}'s warmup)")
        t.warmup_steps, t.warmup_ratio = own.warmup_steps, None
    return notes


def _num(x: float) -> str:
    """1e-3, 2.5e-4: a learning rate as the recipes write it."""
    mantissa, exponent = f"{x:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def build_config(raw: dict) -> Config:
    raw = dict(raw)
    model_raw = raw.get("model")
    model_raw = {} if model_raw is None else model_raw
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
    objective_raw = raw.pop("objective", None)
    cfg = build_dataclass(Config, raw, "", all_keys(Config) + ["model.preset"])
    cfg.objective = build_objective_config(objective_raw)
    cfg.model.validate()
    return cfg


def build_objective_config(raw: dict | None) -> ObjectiveConfig:
    """`name` picks the objective; every other key is validated against that objective's Options dataclass."""
    from lmforge.objectives import OBJECTIVES

    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise LMForgeError(f"objective: expected a mapping, got {raw!r}")
    raw = dict(raw)
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
