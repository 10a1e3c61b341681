"""The run kinds in one table: each kind's config schema, default recipe, resolved config (what `config show`
prints and a run saves) and run function. `config show`, `--help` and `run(kind, cfg, resume)` look a kind up
here instead of branching on its name; every kind trains in the one frame of `train/session.py`. No command-line
code: the commands (lmforge.cli) read this table, not the other way round."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lmforge.errors import LMForgeError

ALIGN_DEFAULTS = {"sft": "sft-sentiment", "reward": "reward-continuation", "dpo": "dpo-continuation",
                  "ppo": "ppo-continuation"}  # fmt: skip
"""The recipe each `lmforge align METHOD` runs when none is named."""


@dataclass(frozen=True)
class RunKind:
    """One run kind: `schema()` its config dataclass, `default_recipe(method)` the bundled recipe it runs when none
    is named, `resolve(recipe, overrides, init, resume, method, teacher)` its resolved config as the plain dict a
    run saves, and `run(cfg, resume)` the run of a loaded config (→ its final metrics, or the report's rows)."""

    schema: Callable[[], type]
    default_recipe: Callable[[str | None], str]
    resolve: Callable[..., dict]
    run: Callable[[Any, bool], Any]


def _pretrain_schema() -> type:
    from lmforge.train.pretrain_config import Config

    return Config


def _pretrain_resolve(recipe, overrides, init=None, resume=False, method=None, teacher=None) -> dict:
    from lmforge.train.pretrain_config import to_dict
    from lmforge.train.pretrain_resolve import pretrain_config

    return to_dict(pretrain_config(recipe, overrides, resume=resume))


def _pretrain_run(cfg, resume: bool = False) -> dict[str, float]:
    from lmforge.train.pretrain import Pretraining

    return Pretraining(cfg, resume=resume).fit()


def _finetune_schema() -> type:
    from lmforge.tasks.config import FinetuneConfig

    return FinetuneConfig


def _finetune_resolve(recipe, overrides, init=None, resume=False, method=None, teacher=None) -> dict:
    from lmforge.tasks.config import finetune_to_dict
    from lmforge.tasks.resolve import finetune_config

    return finetune_to_dict(finetune_config(recipe, init, overrides, resume))


def _finetune_run(cfg, resume: bool = False) -> dict[str, float]:
    from lmforge.train.finetune import FineTuner

    return FineTuner(cfg, resume=resume).fit()


def _align_schema() -> type:
    from lmforge.align.config import AlignConfig

    return AlignConfig


def _align_resolve(recipe, overrides, init=None, resume=False, method=None, teacher=None) -> dict:
    from lmforge.align.config import align_to_dict, load_align_config
    from lmforge.align.resolve import align_config

    recipe = recipe or ALIGN_DEFAULTS[method or "sft"]
    method = method or load_align_config(recipe, overrides).method
    return align_to_dict(align_config(method, recipe, init, overrides, resume))


def _align_run(cfg, resume: bool = False) -> dict[str, float]:
    from lmforge.align.run import run_align

    return run_align(cfg, resume)


def _compress_schema() -> type:
    from lmforge.compress.config import CompressConfig

    return CompressConfig


def _compress_resolve(recipe, overrides, init=None, resume=False, method=None, teacher=None) -> dict:
    from lmforge.compress.config import load_compress_config

    if resume:
        raise LMForgeError("a compression report resumes from its recipe: drop --resume")
    return dataclasses.asdict(load_compress_config(recipe or "sentiment-gpt", overrides, teacher=teacher))


def _compress_run(cfg, resume: bool = False) -> list:
    from lmforge.compress.report import compression_report

    return compression_report(cfg, resume)[0]


RUN_KINDS: dict[str, RunKind] = {
    "pretrain": RunKind(_pretrain_schema, lambda m: "demo", _pretrain_resolve, _pretrain_run),
    "finetune": RunKind(_finetune_schema, lambda m: "sst2-gpt", _finetune_resolve, _finetune_run),
    "align": RunKind(_align_schema, lambda m: ALIGN_DEFAULTS[m or "sft"], _align_resolve, _align_run),
    "compress": RunKind(_compress_schema, lambda m: "sentiment-gpt", _compress_resolve, _compress_run),
}
"""Kind name → its entry (`m`: an align method)."""


def run_kind(kind: str) -> RunKind:
    """The table's entry of `kind`, or one line naming the kinds there are."""
    if kind not in RUN_KINDS:
        raise LMForgeError(f"unknown run kind '{kind}' (known: {', '.join(RUN_KINDS)})")
    return RUN_KINDS[kind]


def run(kind: str, cfg, resume: bool = False):
    """Run a loaded config of `kind` (`cfg`: an instance of its schema) → its final metrics (compress: the report's
    rows)."""
    return run_kind(kind).run(cfg, resume)
