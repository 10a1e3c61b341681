"""Fine-tuning configuration: typed sections (run, model, task, data, train) loaded from YAML recipes in
`recipes/finetune/` with dotted CLI overrides, parsed and validated by `lmforge.config`'s helpers.

The `task` section names a registered task type (`task.type`); its other keys are validated against that task's
own `Options` dataclass, as the `objective` section of a pretraining recipe is."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lmforge.adapt.finetune import PeftSection, build_peft_section, peft_section_to_dict
from lmforge.adapt.peft import peft_lr
from lmforge.config import RECIPES_DIR, all_keys, build_dataclass, parse_overrides, recipe_dict, write_yaml
from lmforge.config.core import get_key, has_key
from lmforge.config.sections import InitModel, LoopConfig, OptimConfig, RunConfig, optim_defaults
from lmforge.config.types import NonNegInt, OpenFraction, PosInt
from lmforge.errors import LMForgeError
from lmforge.progress import status

RECIPES = RECIPES_DIR / "finetune"
"""The bundled fine-tuning recipes."""


@dataclass
class FtRunConfig(RunConfig):
    dir: str = "runs/finetune"
    """Run directory: config.yaml, metrics.jsonl, eval.json, best/ (the best dev checkpoint), checkpoints/ (the
    resumable ones)."""


@dataclass
class FtModelConfig(InitModel):
    init: str = "none"
    """What to fine-tune: a pretrained lmforge run/checkpoint dir, a Hugging Face model dir, a fine-tuned run
    (its backbone), a registered preset name (random init) or "none" (random init of `preset`)."""
    preset: str = "gpt-tiny"
    """Architecture of a randomly initialised backbone (GPT-1 Table 5, "w/o pre-training")."""
    tokenizer_kind: Literal["bpe", "wordpiece", "unigram"] = "bpe"
    dropout: OpenFraction | None = None
    """Residual, embedding and attention dropout of the backbone during fine-tuning (None = the model's own)."""
    reinit_top: NonNegInt = 0
    """Draw the backbone's last N blocks afresh before fine-tuning, with the norm and pooler above them, as the
    model's own init scheme draws them (Zhang et al. 2021, "Revisiting few-sample BERT fine-tuning": the top blocks
    of a pretrained encoder fit its pretraining objective, and small sets fine-tune better without them). The blocks
    are the decoder's in a model that has one. 0 = off."""


@dataclass
class TaskSection:
    type: str = "classification"
    """A registered task type (`lmforge.registry.TASKS`)."""
    options: Any = None
    """The task type's own typed options (its `Options` dataclass), given as the other keys of the section."""


@dataclass
class FtDataConfig:
    source: str = "bundled"
    """Where the labelled splits come from: bundled, glue, superglue, squad, conll2003, table, dir, fetched, race,
    wsc, dpr, datasets (see tasks/data.py)."""
    name: str = "sentiment"
    """The bundled set, GLUE task (sst2, mrpc, ...) or SuperGLUE task."""
    dir: str | None = None
    """Data directory (GLUE task dir; a dir with train/dev/test files for the other sources; for datasets, a
    save_to_disk dir or hf:NAME[:CONFIG[:SPLIT]], read offline from the local Hugging Face cache)."""
    train: str | None = None
    """Explicit file of the train split (overrides dir's)."""
    dev: str | None = None
    test: str | None = None
    text_field: str = "text"
    """Table and datasets sources: the column/key holding the text."""
    text_pair_field: str | None = None
    label_field: str = "label"
    """Table and datasets sources: the column/key holding the label (a dataset's ClassLabel gives the names)."""
    target_field: str | None = None
    """Table sources: the column/key holding the target text (a translation, a summary) of a seq2seq or
    text-to-text example; with it set, no label is read."""
    labels: list[str] | None = None
    """Table, dir and datasets sources: the label set, in class order. A label outside it stops the run with an
    error naming the file, line and value. Without it the labels are the sorted distinct labels found."""
    min_label_count: NonNegInt = 2
    """Table sources without `labels`: warn about a label seen fewer times than this, or in only one labelled split
    (a typo silently becomes a new class otherwise); 0 turns the warnings off."""
    max_train: PosInt | None = None
    """Use only the first N training examples (None = all)."""
    max_eval: PosInt | None = None
    """Use only the first N dev/test examples (None = all)."""


@dataclass
@optim_defaults(lr=6.25e-5, schedule="linear", min_lr_ratio=0.0, warmup_ratio=0.002, weight_decay=0.01, beta2=0.999)
class FtTrainConfig(LoopConfig, OptimConfig):
    """The fine-tuning loop and its optimizer: AdamW, linear warmup then linear decay to 0 (GPT-1 §4.1, BERT §4).
    Learning rate GPT-1's 6.25e-5 (BERT §4: one of 5e-5, 3e-5, 2e-5); warmup over GPT-1's 0.2% of the steps
    (BERT: 10%)."""

    epochs: PosInt = 3
    max_steps: PosInt | None = None
    """Stop after this many optimizer steps (None = `epochs` full passes)."""
    min_steps: NonNegInt = 0
    """Train for more than `epochs` full passes where they would take fewer optimizer steps than this: as many whole
    epochs as reach it (Mosbach et al. 2021: small sets fine-tune stably when trained for more steps). 0 = off;
    ignored when max_steps is set."""
    batch_size: PosInt = 32
    group_by_length: bool = False
    """Batch examples of similar length together (each epoch's shuffle sorted by length within pools of 50 batches,
    the batches shuffled): fewer padded tokens where lengths vary, at some cost to the batches' randomness; faster
    only where a step's arithmetic, not its kernel launches, sets the pace (docs/classify.md). Off: the plain
    shuffle."""
    eval_batch_size: PosInt = 64
    eval_every: PosInt | None = None
    """Evaluate on dev every N steps as well as after each epoch (None = after each epoch only)."""
    save_every: PosInt | None = None
    """Save a resumable checkpoint every N steps (None = at each dev evaluation)."""
    keep_last: PosInt = 1
    select_metric: str | None = None
    """Dev metric that picks the best checkpoint (None = the task's main metric)."""
    deterministic: bool = True
    """Deterministic algorithms (bitwise-reproducible CPU runs)."""


@dataclass
class FinetuneConfig:
    run: FtRunConfig = field(default_factory=FtRunConfig)
    model: FtModelConfig = field(default_factory=FtModelConfig)
    task: TaskSection = field(default_factory=TaskSection)
    data: FtDataConfig = field(default_factory=FtDataConfig)
    train: FtTrainConfig = field(default_factory=FtTrainConfig)
    peft: PeftSection = field(default_factory=PeftSection)


def build_task_section(raw: dict | None) -> TaskSection:
    """`type` picks the task; every other key is validated against that task type's Options dataclass."""
    from lmforge.registry import TASKS  # filled by this package's __init__, which runs before this module

    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise LMForgeError(f"task: expected a mapping, got {raw!r}")
    raw = dict(raw)
    name = str(raw.pop("type", TaskSection.type))
    options_cls = TASKS.get(name).Options
    keys = [f"task.{k}" for k in all_keys(options_cls)] + ["task.type"]
    return TaskSection(name, build_dataclass(options_cls, raw, "task.", keys))


def build_finetune_config(raw: dict) -> FinetuneConfig:
    """A validated FinetuneConfig from a plain (recipe-shaped) dict."""
    raw = dict(raw)
    task_raw = raw.pop("task", None)
    peft_raw = raw.pop("peft", None)
    cfg = build_dataclass(FinetuneConfig, raw, "", all_keys(FinetuneConfig))
    cfg.task = build_task_section(task_raw)
    cfg.peft = build_peft_section(peft_raw)
    if cfg.model.reinit_top and cfg.peft.method != "none":
        raise LMForgeError(f"model.reinit_top: peft.method={cfg.peft.method} keeps the backbone's blocks frozen, "
                           "so re-initialised ones would stay random; use one or the other")  # fmt: skip
    if cfg.data.labels is not None and len(set(cfg.data.labels)) != len(cfg.data.labels):
        raise LMForgeError(f"data.labels: each label once, got {cfg.data.labels}")
    return cfg


def load_finetune_config(
    recipe: str | Path | None = None, overrides: list[str] | dict | None = None, init: str | None = None
) -> FinetuneConfig:
    """Recipe (path or bundled name in recipes/finetune/) + dotted overrides (+ `--init`) → FinetuneConfig.

    Overriding the recipe's `task.type` drops the recipe's task keys that the new type does not have, with one
    warning line naming them; task keys given on the command line are still checked."""
    extra = {"model": {"init": init}} if init is not None else None
    over = overrides if isinstance(overrides, dict) else parse_overrides(overrides or [])
    raw = recipe_dict(recipe, "finetune", over, extra, schema=FinetuneConfig)
    if recipe is not None and isinstance(over.get("task"), dict) and "type" in over["task"]:
        base = recipe_dict(recipe, "finetune", schema=FinetuneConfig).get("task") or {}
        raw["task"] = _without_stale_task_keys(raw["task"], base, over["task"])
    cfg = build_finetune_config(raw)
    if has_key(over, "peft.method") and not has_key(over, "train.lr"):  # a PEFT method turned on here, no lr given
        base = recipe_dict(recipe, "finetune", schema=FinetuneConfig) if recipe is not None else {}
        recipe_method = str(get_key(base, "peft.method") or PeftSection.method)
        cfg.train.lr, note = peft_lr(cfg.peft.method, cfg.train.lr, recipe_method)
        if note:
            status(f"note: {note}")
    if recipe is not None and cfg.run.recipe is None:
        cfg.run.recipe = str(recipe)
    return cfg


def _without_stale_task_keys(task: dict, recipe_task: dict, override_task: dict) -> dict:
    """`task` less the recipe's keys that the overriding task type has no option for (warned about, one line)."""
    from lmforge.registry import TASKS  # filled by this package's __init__, which runs before this module

    old, new = str(recipe_task.get("type", TaskSection.type)), str(override_task["type"])
    if old == new or new not in TASKS:
        return task
    valid = {f.name for f in dataclasses.fields(TASKS.get(new).Options)}
    stale = [k for k in recipe_task if k != "type" and k not in override_task and k not in valid]
    if stale:
        names = ", ".join(f"task.{k}" for k in stale)
        print(f"warning: --task.type={new} replaces the recipe's {old}; dropped the recipe keys that {new} does not "
              f"have: {names}", file=sys.stderr)  # fmt: skip
    return {k: v for k, v in task.items() if k not in stale}


def finetune_to_dict(cfg: FinetuneConfig) -> dict:
    """The resolved config as a plain dict that is itself a valid recipe (task options flattened)."""
    d = dataclasses.asdict(cfg)
    options = d["task"].pop("options") or {}
    d["task"].update(options)
    d["peft"] = peft_section_to_dict(cfg.peft)
    return d


def save_finetune_config(cfg: FinetuneConfig, path: Path) -> None:
    write_yaml(path, finetune_to_dict(cfg))
