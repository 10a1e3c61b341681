"""The fine-tuning config a run resolves to: the recipe with `--init` and the overrides, or, resuming, the run's
saved config with the overrides on top (what `lmforge finetune`, `lmforge.finetune` and `config show` run)."""

from __future__ import annotations

from lmforge.errors import LMForgeError


def finetune_config(recipe: str | None, init: str | None, overrides: list[str] | dict, resume: bool = False):
    """The FinetuneConfig `lmforge finetune` runs: with --resume, the run's saved config with the overrides on top;
    else the recipe (default sst2-gpt) with `--init` and the overrides. A --resume of a run that has no config
    needs the recipe named."""
    from lmforge.config import RESUME_FIXED, parse_overrides, resolved_run_dir, resumed
    from lmforge.config.resume import never_started
    from lmforge.tasks.backbone import SECTIONS
    from lmforge.tasks.config import build_finetune_config, finetune_to_dict, load_finetune_config

    user = overrides if isinstance(overrides, dict) else parse_overrides(overrides)
    if resume:
        run_dir = resolved_run_dir(recipe or "sst2-gpt", "finetune", user)
        cfg = resumed(
            run_dir, recipe, user, build_finetune_config, finetune_to_dict, fixed=RESUME_FIXED,
            unpack=lambda saved: {k: v for k, v in saved.items() if k in SECTIONS},  # not the backbone and labels
        )  # fmt: skip
        if cfg is not None:
            if init is not None and init != cfg.model.init:
                raise LMForgeError(f"cannot resume {run_dir} with --init {init}: the run fine-tunes {cfg.model.init}")
            return cfg
        if recipe is None:  # never the default recipe in place of the one a run stopped before its config had
            raise never_started(run_dir, "finetune")
    return load_finetune_config(recipe or "sst2-gpt", user, init=init)
