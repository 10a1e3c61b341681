"""The Python API, for notebooks and scripts: `pretrain`, `finetune` and `evaluate` take plain Python values and run
what the CLI runs; `load(path)` gives a model and its tokenizer from a run, a checkpoint or a Hugging Face dir.

    import lmforge
    run = lmforge.pretrain("gpt", {"model.preset": "gpt-tiny", "train.max_steps": 50}, run={"dir": "runs/nb"})
    run.metrics["val_loss"], run.run_dir
    model, tokenizer = lmforge.load(run.run_dir)

A `datasets.Dataset` (or DatasetDict) may stand in `data.inputs` of a pretraining run or as `data.dir` of a
fine-tuning run: it is written with `save_to_disk` into RUN/inputs/N and the saved config names that dir, so the
run's config.yaml stays plain YAML and the run can be resumed or repeated from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lmforge.config import resolved_run_dir
from lmforge.errors import LMForgeError
from lmforge.loading import load
from lmforge.pretraining.resolve import overrides_tree
from lmforge.run_kinds import config, run, run_kind


@dataclass
class RunResult:
    """A finished run: its directory and its final evaluation metrics."""

    run_dir: Path
    metrics: dict[str, float] = field(default_factory=dict)

    def load(self, device: str | torch.device = "cpu"):
        """(model, tokenizer) of the run (its best checkpoint when it selects one, else its latest)."""
        return load(self.run_dir, device)


def _place_datasets(tree: dict, kind: str, recipe: str) -> dict[Path, Any]:
    """Replace the live datasets in `tree` where the run kind takes one (pretraining's data.inputs, fine-tuning's
    data.dir) by the dirs of the run they will be saved to, RUN/inputs/N; return {dir: dataset}."""
    from lmforge.data.hf_datasets import is_dataset

    slot, data = run_kind(kind).datasets, tree.get("data")
    if slot is None or not isinstance(data, dict):
        return {}
    values = data.get(slot.key)
    items = values if slot.many and isinstance(values, list | tuple) else [values]
    if not any(is_dataset(v) for v in items):
        return {}
    inputs = resolved_run_dir(recipe, kind, tree, run_kind(kind).schema()().run.dir) / "inputs"
    live = {inputs / str(i): v for i, v in enumerate(items) if is_dataset(v)}
    for ds in live.values():
        if not hasattr(ds, "save_to_disk"):
            raise LMForgeError(
                f"data.{slot.key}: a streamed {type(ds).__name__} cannot be saved with the run; pass a Dataset or "
                "DatasetDict (e.g. Dataset.from_generator) or a save_to_disk dir"
            )
    placed = [str(inputs / str(i)) if is_dataset(v) else v for i, v in enumerate(items)]
    data[slot.key] = placed if slot.many else placed[0]
    for key, value in slot.sets:
        data.setdefault(key, value)
    return live


def _save_datasets(live: dict[Path, Any], run_dir: Path, resume: bool) -> None:
    """Write each dataset to its dir (by a scratch dir, so a failed write leaves none). A resumed run keeps the copy
    it began with; a run dir with checkpoints and no resume is left alone (the run refuses it)."""
    import shutil

    from lmforge.checkpoint.layout import list_checkpoints

    if not resume and list_checkpoints(run_dir):
        return
    for where, ds in live.items():
        if resume and where.is_dir():
            continue
        scratch = where.with_name(f".tmp-{where.name}")
        shutil.rmtree(scratch, ignore_errors=True)
        ds.save_to_disk(str(scratch))
        shutil.rmtree(where, ignore_errors=True)
        scratch.rename(where)


def _train(kind: str, recipe: str | None, tree: dict, resume: bool, **given: Any) -> RunResult:
    """Run a `kind` run from `recipe` with the overrides `tree` (its live datasets saved into the run first)."""
    live = _place_datasets(tree, kind, recipe or run_kind(kind).default_recipe(None))
    cfg = config(kind, recipe, tree, resume=resume, **given)
    _save_datasets(live, Path(cfg.run.dir), resume)
    done = run(kind, cfg, resume)
    return RunResult(done.run_dir, done.metrics)


def pretrain(
    recipe: str | None = None, overrides: list[str] | dict | None = None, *, resume: bool = False, **sections: Any
) -> RunResult:
    """Pretrain as `lmforge pretrain` does. `overrides`: {"train.max_steps": 100} (or CLI-style strings);
    `sections`: train={"max_steps": 100}, model={"preset": "gpt-tiny"}. Returns the run dir and the last
    validation metrics."""
    return _train("pretrain", recipe, overrides_tree(overrides, sections), resume)


def finetune(
    recipe: str | None = None, init: str | None = None, overrides: list[str] | dict | None = None,
    *, resume: bool = False, **sections: Any,
) -> RunResult:  # fmt: skip
    """Fine-tune as `lmforge finetune RECIPE --init INIT` does; returns the run dir and the best checkpoint's dev
    metrics (also in RUN/eval.json)."""
    return _train("finetune", recipe, overrides_tree(overrides, sections), resume, init=init)


def evaluate(
    path: str | Path, tasks: list[str] | None = None, overrides: list[str] | dict | None = None,
    split: str | None = None,
) -> dict[str, dict[str, float]]:  # fmt: skip
    """Evaluate as `lmforge eval PATH [--task T ...]` does → {task: {metric: value}}, also written where the command
    writes them (RUN/eval-results.json for a fine-tuned run, else ./eval-results.json)."""
    from lmforge.eval.finetuned import evaluate_path, results_path
    from lmforge.eval.report import write_results

    results = evaluate_path(path, tasks, overrides_tree(overrides), split=split)
    write_results(results_path(path), results)
    return results
