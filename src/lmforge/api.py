"""The Python API, for notebooks and scripts: `pretrain`, `finetune` and `evaluate` take plain Python values and run
what the CLI runs; `load(path)` gives a model and its tokenizer from a run, a checkpoint or a Hugging Face dir.

    import lmforge
    run = lmforge.pretrain("gpt", {"model.preset": "gpt-tiny", "train.max_steps": 50}, run={"dir": "runs/nb"})
    run.metrics["val_loss"], run.run_dir
    model, tokenizer = lmforge.load(run.run_dir)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lmforge.config import (
    Config,
    load_config,
    load_resume_config,
    merge_dicts,
    parse_overrides,
    resolved_run_dir,
)
from lmforge.errors import LMForgeError
from lmforge.loading import load


@dataclass
class RunResult:
    """A finished run: its directory and its final evaluation metrics."""

    run_dir: Path
    metrics: dict[str, float] = field(default_factory=dict)

    def load(self, device: str | torch.device = "cpu"):
        """(model, tokenizer) of the run (its best checkpoint when it selects one, else its latest)."""
        return load(self.run_dir, device)


def overrides_tree(overrides: list[str] | dict | None = None, sections: dict | None = None) -> dict:
    """CLI-style overrides (["--train.lr=3e-4"]), a dict of dotted keys ({"train.lr": 3e-4}) or nested sections
    ({"train": {"lr": 3e-4}}), merged into one nested dict."""
    if overrides is None:
        tree: dict = {}
    elif isinstance(overrides, dict):
        tree = {}
        for key, value in overrides.items():
            node = tree
            parts = str(key).split(".")
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = value
    else:
        tree = parse_overrides(list(overrides))
    for name, section in (sections or {}).items():
        if not isinstance(section, dict):
            raise LMForgeError(f"section '{name}' must be a dict of its keys, got {section!r}")
        tree = merge_dicts(tree, {name: section})
    return tree


def pretrain_config(recipe: str | None, overrides: list[str] | dict | None = None, *, resume: bool = False) -> Config:
    """The config `lmforge pretrain RECIPE [overrides] [--resume]` runs: with --resume, the run's own saved config
    with the overrides on top; else the recipe (default: demo) with the overrides."""
    user = overrides_tree(overrides)
    if resume:
        cfg = load_resume_config(resolved_run_dir(recipe or "demo", "pretrain", user, Config().run.dir), recipe, user)
        if cfg is not None:
            return cfg
    return load_config(recipe or "demo", user)


def pretrain(
    recipe: str | None = None, overrides: list[str] | dict | None = None, *, resume: bool = False, **sections: Any
) -> RunResult:
    """Pretrain as `lmforge pretrain` does. `overrides`: {"train.max_steps": 100} (or CLI-style strings);
    `sections`: train={"max_steps": 100}, model={"preset": "gpt-tiny"}. Returns the run dir and the last
    validation metrics."""
    from lmforge.train.pretrain import Pretraining

    cfg = pretrain_config(recipe, overrides_tree(overrides, sections), resume=resume)
    run = Pretraining(cfg, resume=resume)
    return RunResult(run.run_dir, run.fit())


def finetune(
    recipe: str | None = None, init: str | None = None, overrides: list[str] | dict | None = None,
    *, resume: bool = False, **sections: Any,
) -> RunResult:  # fmt: skip
    """Fine-tune as `lmforge finetune RECIPE --init INIT` does; returns the run dir and the best checkpoint's dev
    metrics (also in RUN/eval.json)."""
    from lmforge.finetune_cli import finetune_config
    from lmforge.train.finetune import FineTuner

    cfg = finetune_config(recipe, init, overrides_tree(overrides, sections), resume=resume)
    tuner = FineTuner(cfg, resume=resume)
    return RunResult(tuner.run_dir, tuner.fit())


def evaluate(
    path: str | Path, tasks: list[str] | None = None, overrides: list[str] | dict | None = None,
    split: str | None = None,
) -> dict[str, dict[str, float]]:  # fmt: skip
    """Evaluate as `lmforge eval PATH [--task T ...]` does → {task: {metric: value}}."""
    from lmforge.finetune_cli import cmd_eval

    return cmd_eval(str(path), tasks, overrides_tree(overrides), split=split)
