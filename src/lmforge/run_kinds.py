"""The run kinds in one table: each kind's config schema, default recipe, typed config from a recipe and overrides,
that config as the plain dict a run saves (what `config show` prints), the place a live `datasets` object may
stand, and its run. The commands (lmforge.cli), the Python API (lmforge.api) and the experiment runner (whose arms
are these commands) look a kind up here and run it with `run(kind, cfg, resume)` instead of branching on its name;
every kind trains in the one frame of `train/session.py`. No command-line code here: the commands read this
table, not the other way round."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmforge.errors import LMForgeError

ALIGN_DEFAULTS = {"sft": "sft-sentiment", "reward": "reward-continuation", "dpo": "dpo-continuation",
                  "ppo": "ppo-continuation"}  # fmt: skip
"""The recipe each `lmforge align METHOD` runs when none is named."""


@dataclass(frozen=True)
class DatasetSlot:
    """Where a live `datasets.Dataset` may stand in a kind's config (the Python API saves it into the run):
    `key` in the data section, a list of inputs when `many`, and the data keys it sets beside it."""

    key: str
    many: bool = False
    sets: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Finished:
    """A finished run: its dir, its final metrics (compress: the report's rows), the run object that trained
    (None where a kind has none to show), whether this process reports (rank 0), and the run's own table in words
    where it writes one (compress)."""

    run_dir: Path
    metrics: Any
    job: Any = None
    is_main: bool = True
    table: str | None = None


@dataclass(frozen=True)
class RunKind:
    """One run kind: `schema()` its config dataclass; `default_recipe(method)` the bundled recipe it runs when none
    is named; `config(recipe, overrides, init=, resume=, method=, teacher=, reward=)` its typed config;
    `to_dict(cfg)` that config as the plain dict a run saves; `execute(cfg, resume, on_start)` its run →
    Finished (`on_start(job)` is called once the run is built, before it trains; align and compress, which build
    their runs inside: with the config, before anything runs); `datasets` where a live dataset
    may stand."""

    schema: Callable[[], type]
    default_recipe: Callable[[str | None], str]
    config: Callable[..., Any]
    to_dict: Callable[[Any], dict]
    execute: Callable[[Any, bool, Callable[[Any], None] | None], Finished]
    datasets: DatasetSlot | None = None


def _fit(job, on_start: Callable[[Any], None] | None) -> Finished:
    """Train a built run object (Pretraining, FineTuner) → Finished."""
    if on_start is not None:
        on_start(job)
    final = job.fit()
    return Finished(Path(job.run_dir), final, job, job.dist.is_main)


def _pretrain_schema() -> type:
    from lmforge.pretraining.config import Config

    return Config


def _pretrain_config(recipe, overrides, init=None, resume=False, method=None, teacher=None, reward=None):
    from lmforge.pretraining.resolve import pretrain_config

    return pretrain_config(recipe, overrides, resume=resume)


def _pretrain_dict(cfg) -> dict:
    from lmforge.pretraining.config import to_dict

    return to_dict(cfg)


def _pretrain_execute(cfg, resume=False, on_start=None) -> Finished:
    from lmforge.pretraining.run import Pretraining

    return _fit(Pretraining(cfg, resume=resume), on_start)


def _finetune_schema() -> type:
    from lmforge.tasks.config import FinetuneConfig

    return FinetuneConfig


def _finetune_config(recipe, overrides, init=None, resume=False, method=None, teacher=None, reward=None):
    from lmforge.finetuning.resolve import finetune_config

    return finetune_config(recipe, init, overrides, resume)


def _finetune_dict(cfg) -> dict:
    from lmforge.tasks.config import finetune_to_dict

    return finetune_to_dict(cfg)


def _finetune_execute(cfg, resume=False, on_start=None) -> Finished:
    from lmforge.finetuning.run import FineTuner

    return _fit(FineTuner(cfg, resume=resume), on_start)


def _align_schema() -> type:
    from lmforge.align.config import AlignConfig

    return AlignConfig


def _align_config(recipe, overrides, init=None, resume=False, method=None, teacher=None, reward=None):
    from lmforge.align.config import load_align_config
    from lmforge.align.resolve import align_config

    recipe = recipe or ALIGN_DEFAULTS[method or "sft"]
    method = method or load_align_config(recipe, overrides).method
    return align_config(method, recipe, init, overrides, resume, reward)


def _align_dict(cfg) -> dict:
    from lmforge.align.config import align_to_dict

    return align_to_dict(cfg)


def _align_execute(cfg, resume=False, on_start=None) -> Finished:
    from lmforge.align.run import run_align

    if on_start is not None:
        on_start(cfg)
    return Finished(Path(cfg.run.dir), run_align(cfg, resume))


def _compress_schema() -> type:
    from lmforge.compress.config import CompressConfig

    return CompressConfig


def _compress_config(recipe, overrides, init=None, resume=False, method=None, teacher=None, reward=None):
    from lmforge.compress.config import load_compress_config

    return load_compress_config(recipe or "sentiment-gpt", list(overrides or []), teacher=teacher)


def _compress_execute(cfg, resume=False, on_start=None) -> Finished:
    from lmforge.compress.report import compression_report

    if on_start is not None:
        on_start(cfg)
    rows, table = compression_report(cfg, resume)
    return Finished(Path(cfg.out), rows, table=table)


RUN_KINDS: dict[str, RunKind] = {
    "pretrain": RunKind(_pretrain_schema, lambda m: "demo", _pretrain_config, _pretrain_dict, _pretrain_execute,
                        DatasetSlot("inputs", many=True)),
    "finetune": RunKind(_finetune_schema, lambda m: "sst2-gpt", _finetune_config, _finetune_dict, _finetune_execute,
                        DatasetSlot("dir", sets=(("source", "datasets"),))),
    "align": RunKind(_align_schema, lambda m: ALIGN_DEFAULTS[m or "sft"], _align_config, _align_dict,
                     _align_execute),
    "compress": RunKind(_compress_schema, lambda m: "sentiment-gpt", _compress_config, dataclasses.asdict,
                        _compress_execute),
}  # fmt: skip
"""Kind name → its entry (`m`: an align method)."""


def run_kind(kind: str) -> RunKind:
    """The table's entry of `kind`, or one line naming the kinds there are."""
    if kind not in RUN_KINDS:
        raise LMForgeError(f"unknown run kind '{kind}' (known: {', '.join(RUN_KINDS)})")
    return RUN_KINDS[kind]


def config(kind: str, recipe: str | None, overrides: list[str] | dict | None = None, **given: Any):
    """The typed config of a `kind` run from `recipe` (None: the kind's default) and `overrides`; `given`: init,
    resume, method, teacher, reward where the kind takes them."""
    return run_kind(kind).config(recipe, overrides if overrides is not None else [], **given)


def resolve(kind: str, recipe: str | None, overrides: list[str] | dict | None = None, **given: Any) -> dict:
    """The resolved config a `kind` run would save, as a plain dict (`config show`)."""
    return run_kind(kind).to_dict(config(kind, recipe, overrides, **given))


def run(kind: str, cfg, resume: bool = False, on_start: Callable[[Any], None] | None = None) -> Finished:
    """Run a loaded config of `kind` (`cfg`: an instance of its schema) → Finished. `on_start(job)` runs once the
    run is built (its data read, its model made), before its first step: the commands say there what will train."""
    return run_kind(kind).execute(cfg, resume, on_start)
