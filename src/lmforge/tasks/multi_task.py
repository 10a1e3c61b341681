"""Multi-task training of one text-to-text model (Raffel et al. 2020 §3.5.2): several tasks, each a fine-tuning
recipe of a text-to-text task type (text_to_text, text_to_text_regression, seq2seq) with its task prefix in
`task.template` ("sst2 sentence: {text}") and its data section, trained together on one model by one loss (each
task's targets are text, so the mixture is a mixture of data sets), with examples drawn at the rates of
`task.mix` (tasks/mixing.py). Every dev evaluation scores each task with its own metrics (`TASK/METRIC`) and their
`average`: the mean of the tasks' main metrics, as T5 averages GLUE, which picks the best checkpoint.

    task: {type: multi_task, tasks: [sst2-t5, hedge-t5, drugs-t5], mix: {rate: proportional, limit: 2048}}

A task is named by its recipe's file stem. Each keeps its own `data.*`, template, label words and metrics; the run's
`model`, `train` and `peft` sections apply to all, and of its `data` section only `data.max_train` and
`data.max_eval`, which cap every task. Its examples carry their task in `Example.meta["task"]`, and the label set
saved with the run holds each task's labels as `TASK:LABEL`, so a reloaded run rebuilds every task."""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from torch import Tensor

from lmforge.data.labelled.examples import Dataset, Example
from lmforge.errors import LMForgeError
from lmforge.registry import TASKS
from lmforge.tasks.base import Task
from lmforge.tasks.config import FinetuneConfig, FtDataConfig, load_finetune_config
from lmforge.tasks.data import load_splits
from lmforge.tasks.mixing import MixOptions, MixtureSampler, mixture_sampler
from lmforge.tasks.model import TaskModel
from lmforge.tasks.seq2seq import Seq2Seq

TASK_KEY = "task"
"""The `Example.meta` key naming an example's task."""
RUN_DATA_KEYS = ("max_train", "max_eval")
"""The `data.*` keys of a multi-task run that apply (to every task)."""


@dataclass
class MultiTaskOptions:
    """The `task.*` keys of a multi_task run."""

    tasks: list[str] = field(default_factory=list)
    """The tasks' fine-tuning recipes (bundled names or paths), each of a text-to-text task type."""
    mix: MixOptions = field(default_factory=MixOptions)
    """How often each task's examples are drawn (tasks/mixing.py)."""


def task_recipes(options: MultiTaskOptions) -> dict[str, FinetuneConfig]:
    """Task name (its recipe's file stem) → its validated fine-tuning config, in `task.tasks` order."""
    if len(options.tasks) < 2:
        raise LMForgeError(f"task.tasks: a multi_task run mixes two or more tasks' recipes, got {options.tasks}")
    out: dict[str, FinetuneConfig] = {}
    for recipe in options.tasks:
        name = Path(recipe).stem if recipe.endswith((".yaml", ".yml")) else Path(recipe).name
        if name in out:
            raise LMForgeError(f"task.tasks: two tasks are named '{name}' (a task is named by its recipe's file stem)")
        if ":" in name or "/" in name:
            raise LMForgeError(f"task.tasks: task name '{name}' may not hold ':' or '/'")
        try:
            cfg = load_finetune_config(recipe)
        except LMForgeError as e:
            raise LMForgeError(f"task.tasks: {recipe}: {e}") from None
        if not issubclass(TASKS.get(cfg.task.type), Seq2Seq):
            raise LMForgeError(
                f"task.tasks: {recipe} is a {cfg.task.type} task; a multi_task run mixes text-to-text task types "
                "(text_to_text, text_to_text_regression, seq2seq), whose targets are text"
            )
        out[name] = cfg
    return out


def _check_run_data(data: FtDataConfig) -> None:
    """Refuse run-level data keys that a multi-task run does not read (each task reads its recipe's)."""
    default = FtDataConfig()
    for f in dataclasses.fields(FtDataConfig):
        if f.name not in RUN_DATA_KEYS and getattr(data, f.name) != getattr(default, f.name):
            raise LMForgeError(
                f"data.{f.name}: a multi_task run reads each task's data from its recipe (task.tasks); of the run's "
                f"data section only {', '.join('data.' + k for k in RUN_DATA_KEYS)} apply"
            )


def mixture_splits(options: MultiTaskOptions, data: FtDataConfig) -> dict[str, Dataset]:
    """Every task's splits, its examples tagged with their task, joined per split; each split's label set is every
    task's labels as `TASK:LABEL`. The run's data.max_train / max_eval cap each task."""
    _check_run_data(data)
    joined: dict[str, list[Example]] = {}
    labels: list[str] = []
    for name, cfg in task_recipes(options).items():
        caps = {k: getattr(data, k) for k in RUN_DATA_KEYS if getattr(data, k) is not None}
        splits = load_splits(dataclasses.replace(cfg.data, **caps))
        labels += [f"{name}:{x}" for x in TASKS.get(cfg.task.type).label_set(splits["train"]) or []]
        for split, ds in splits.items():
            joined.setdefault(split, []).extend(
                dataclasses.replace(ex, meta={**ex.meta, TASK_KEY: name}) for ex in ds.examples
            )
    source = "mixture of " + ", ".join(options.tasks)
    return {split: Dataset(exs, labels or None, f"{source} ({split})", "text_to_text") for split, exs in joined.items()}


def load_task_splits(cfg: FinetuneConfig) -> dict[str, Dataset]:
    """The labelled splits a fine-tuning run trains and evaluates on: its data section's, or for a multi_task run
    every task's (`mixture_splits`)."""
    if isinstance(cfg.task.options, MultiTaskOptions):
        return mixture_splits(cfg.task.options, cfg.data)
    return load_splits(cfg.data)


def train_sampler(task: Task, features: list[dict]) -> MixtureSampler | None:
    """The mixing sampler of a multi_task run's training features; None for other tasks (a plain shuffle)."""
    if not isinstance(task, MultiTask):
        return None
    return mixture_sampler([f["_task"] for f in features], len(task.subtasks), task.options.mix)


@TASKS.register("multi_task")
class MultiTask(Task):
    """Several text-to-text tasks on one model (see the module docstring)."""

    name = "multi_task"
    Options = MultiTaskOptions
    default_metrics = ("average",)

    def __init__(self, options: MultiTaskOptions, tokenizer, labels: list[str] | None = None) -> None:
        recipes = task_recipes(options)
        own: dict[str, list[str]] = {name: [] for name in recipes}
        for qualified in labels or []:
            name, _, label = qualified.partition(":")
            if name not in own:
                raise LMForgeError(f"label '{qualified}' names no task of task.tasks ({', '.join(recipes)})")
            own[name].append(label)
        self.subtasks: dict[str, Seq2Seq] = {
            name: TASKS.get(cfg.task.type)(cfg.task.options, tokenizer, own[name] or None)
            for name, cfg in recipes.items()
        }
        super().__init__(options, tokenizer, labels)
        self.majority: dict[str, str] = {}
        """Each classifying task's most frequent training label (set by `features` of the training split)."""

    @classmethod
    def label_set(cls, train: Dataset) -> list[str] | None:
        return list(train.labels) if train.labels else None

    @property
    def metric_names(self) -> list[str]:
        return ["average"] + [f"{name}/{m}" for name, sub in self.subtasks.items() for m in sub.metric_names]

    def build(self, backbone) -> TaskModel:
        models = [sub.build(backbone) for sub in self.subtasks.values()]  # one backbone and its LM head for all
        # max_len: the smallest, the one a too-long input first meets (each task cuts at its own)
        self.fmt, self.max_len = models[0].fmt, min(sub.max_len for sub in self.subtasks.values())
        return models[0]

    def by_task(self, dataset: Dataset) -> dict[str, Dataset]:
        """The dataset's examples of each task (in task order; a task without examples left out)."""
        parts: dict[str, list[Example]] = {name: [] for name in self.subtasks}
        for i, ex in enumerate(dataset.examples):
            name = ex.meta.get(TASK_KEY)
            if name not in parts:
                raise LMForgeError(
                    f"{dataset.source or 'data'} example {ex.id or i}: no task of task.tasks ({', '.join(parts)}) — a "
                    "multi_task run reads its data from its tasks' recipes, not from data.*"
                )
            parts[name].append(ex)
        out = {}
        for name, exs in parts.items():
            if exs:
                sub = self.subtasks[name]
                out[name] = Dataset(exs, sub.labels, f"{name} ({dataset.source})", dataset.task_type)
        return out

    def baselines(self, dataset: Dataset) -> dict[str, dict[str, float]]:
        """Per task: the majority class's accuracy (a classifying task), or the task's own baselines (seq2seq:
        copy-the-input), named `TASK/METRIC` like the task's scores."""
        out: dict[str, dict[str, float]] = {}
        for name, part in self.by_task(dataset).items():
            sub = self.subtasks[name]
            if name in self.majority:
                hits = sum(ex.label == self.majority[name] for ex in part.examples)
                out.setdefault("majority-class", {})[f"{name}/accuracy"] = hits / len(part.examples)
            elif sub.labels is None:
                for base, metrics in sub.baselines(part).items():
                    out.setdefault(base, {}).update({f"{name}/{k}": v for k, v in metrics.items()})
        return out

    def features(self, dataset: Dataset, train: bool = False) -> list[dict]:
        """Each task's features by its own input transformation, tagged with the task's index (`_task`)."""
        feats: list[dict] = []
        index = {name: i for i, name in enumerate(self.subtasks)}
        for name, part in self.by_task(dataset).items():
            sub = self.subtasks[name]
            feats += [{**f, "_task": index[name]} for f in sub.features(part, train=train)]
            classes = Counter(ex.label for ex in part.examples if isinstance(ex.label, str))
            if train and classes:
                self.majority[name] = classes.most_common(1)[0][0]
        self.n_truncated = sum(sub.n_truncated for sub in self.subtasks.values())
        return feats

    @property
    def _first(self) -> Seq2Seq:
        return next(iter(self.subtasks.values()))

    def scored(self, model: TaskModel, batch: dict[str, Tensor]):
        # Every task's features are (source, target text) pairs: one teacher-forced loss over the mixed batch.
        return self._first.scored(model, batch)

    def outputs(self, model: TaskModel, batch: dict[str, Tensor]):
        return self._first.outputs(model, batch)

    def divergence(self, a, b, batch: dict[str, Tensor]) -> Tensor:
        return self._first.divergence(a, b, batch)

    def evaluate(self, model: TaskModel, dataset: Dataset, batch_size: int = 64) -> dict[str, float]:
        """Each task's metrics on its examples (`TASK/METRIC`) and `average`, the mean of their main metrics."""
        out: dict[str, float] = {}
        mains = []
        for name, part in self.by_task(dataset).items():
            sub = self.subtasks[name]
            metrics = sub.evaluate(model, part, batch_size)
            out |= {f"{name}/{k}": v for k, v in metrics.items()}
            mains.append(metrics[sub.main_metric])
        if not mains:
            raise LMForgeError(f"{dataset.source or 'data'}: no examples to evaluate")
        return {"average": statistics.fmean(mains), **out}
