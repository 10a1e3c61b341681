"""Fine-tuning configuration: typed sections (run, model, task, data, train) loaded from YAML recipes in
`recipes/finetune/` with dotted CLI overrides, parsed and validated by `lmforge.config`'s helpers.

The `task` section names a registered task type (`task.type`); its other keys are validated against that task's
own `Options` dataclass, as the `objective` section of a pretraining recipe is."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lmforge.adapt.finetune import PeftSection, build_peft_section, peft_section_to_dict
from lmforge.config import RECIPES_DIR, all_keys, build_dataclass, recipe_dict, write_yaml
from lmforge.errors import LMForgeError

RECIPES = RECIPES_DIR / "finetune"
"""The bundled fine-tuning recipes."""


@dataclass
class FtRunConfig:
    dir: str = "runs/finetune"
    """Run directory: config.yaml, metrics.jsonl, eval.json, checkpoints/ (the best dev checkpoint)."""
    seed: int = 0


@dataclass
class FtModelConfig:
    init: str = "none"
    """What to fine-tune: a pretrained lmforge run/checkpoint dir, a Hugging Face model dir, a fine-tuned run
    (its backbone), a registered preset name (random init) or "none" (random init of `preset`)."""
    preset: str = "gpt-tiny"
    """Architecture of a randomly initialised backbone (GPT-1 Table 5, "w/o pre-training")."""
    tokenizer: str | None = None
    """Tokenizer dir/file for a random init (None = train one on the training texts) or when `init` has none."""
    tokenizer_kind: Literal["bpe", "wordpiece", "unigram"] = "bpe"
    vocab_size: int = 2048
    """Vocabulary of a tokenizer trained for a random init."""
    dropout: float | None = None
    """Residual, embedding and attention dropout of the backbone during fine-tuning (None = the model's own)."""


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
    wsc, dpr (see tasks/data.py)."""
    name: str = "sentiment"
    """The bundled set, GLUE task (sst2, mrpc, ...) or SuperGLUE task."""
    dir: str | None = None
    """Data directory (GLUE task dir; a dir with train/dev/test files for the other sources)."""
    train: str | None = None
    """Explicit file of the train split (overrides dir's)."""
    dev: str | None = None
    test: str | None = None
    text_field: str = "text"
    """Table sources: the column/key holding the text."""
    text_pair_field: str | None = None
    label_field: str = "label"
    max_train: int | None = None
    """Use only the first N training examples (None = all)."""
    max_eval: int | None = None
    """Use only the first N dev/test examples (None = all)."""


@dataclass
class FtTrainConfig:
    epochs: int = 3
    max_steps: int | None = None
    """Stop after this many optimizer steps (None = `epochs` full passes)."""
    batch_size: int = 32
    eval_batch_size: int = 64
    lr: float = 6.25e-5
    """GPT-1 §4.1: 6.25e-5; BERT §4: one of 5e-5, 3e-5, 2e-5."""
    warmup_ratio: float = 0.002
    """Linear warmup over this fraction of the steps (GPT-1: 0.2%; BERT: 10%), then linear decay to 0."""
    weight_decay: float = 0.01
    layer_decay: float = 1.0
    """Layer-wise learning-rate decay (ELECTRA: 0.8 for small and base models): layer l of L learns at
    lr · layer_decay^(L + 1 − l), the embeddings at lr · layer_decay^(L + 1), the head at lr (1.0 = off)."""
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    grad_clip: float = 1.0
    """Clip the global gradient norm (0 = off)."""
    eval_every: int | None = None
    """Evaluate on dev every N steps as well as after each epoch (None = after each epoch only)."""
    log_every: int = 10
    select_metric: str | None = None
    """Dev metric that picks the best checkpoint (None = the task's main metric)."""
    device: str = "auto"
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """auto = bf16 autocast on GPUs that support it (weights and optimizer stay fp32), fp32 on CPU."""
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


def build_task_section(raw: dict) -> TaskSection:
    """`type` picks the task; every other key is validated against that task type's Options dataclass."""
    from lmforge.tasks import TASKS

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
    task_raw = dict(raw.pop("task", None) or {})
    peft_raw = raw.pop("peft", None)
    cfg = build_dataclass(FinetuneConfig, raw, "", all_keys(FinetuneConfig))
    cfg.task = build_task_section(task_raw)
    cfg.peft = build_peft_section(peft_raw)
    _validate(cfg)
    return cfg


def _validate(cfg: FinetuneConfig) -> None:
    t = cfg.train
    for name in ("epochs", "batch_size", "eval_batch_size", "log_every"):
        if getattr(t, name) <= 0:
            raise LMForgeError(f"train.{name} must be positive, got {getattr(t, name)}")
    if t.max_steps is not None and t.max_steps <= 0:
        raise LMForgeError(f"train.max_steps must be positive or null, got {t.max_steps}")
    if not 0 < t.layer_decay <= 1:
        raise LMForgeError(f"train.layer_decay must be in (0, 1], got {t.layer_decay}")
    if not 0 <= t.warmup_ratio < 1:
        raise LMForgeError(f"train.warmup_ratio must be in [0, 1), got {t.warmup_ratio}")
    if t.lr <= 0:
        raise LMForgeError(f"train.lr must be positive, got {t.lr}")
    if cfg.model.dropout is not None and not 0 <= cfg.model.dropout < 1:
        raise LMForgeError(f"model.dropout must be in [0, 1), got {cfg.model.dropout}")


def load_finetune_config(
    recipe: str | Path | None = None, overrides: list[str] | dict | None = None, init: str | None = None
) -> FinetuneConfig:
    """Recipe (path or bundled name in recipes/finetune/) + dotted overrides (+ `--init`) → FinetuneConfig."""
    extra = {"model": {"init": init}} if init is not None else None
    return build_finetune_config(recipe_dict(recipe, "finetune", overrides, extra))


def finetune_to_dict(cfg: FinetuneConfig) -> dict:
    """The resolved config as a plain dict that is itself a valid recipe (task options flattened)."""
    d = dataclasses.asdict(cfg)
    options = d["task"].pop("options") or {}
    d["task"].update(options)
    d["peft"] = peft_section_to_dict(cfg.peft)
    return d


def save_finetune_config(cfg: FinetuneConfig, path: Path) -> None:
    write_yaml(path, finetune_to_dict(cfg))
