"""The pretraining config a run resolves to (what `lmforge pretrain`, `lmforge.pretrain` and `config show` run),
and overrides given as CLI strings, dotted keys or nested sections merged into one tree."""

from __future__ import annotations

from pathlib import Path

from lmforge.config import merge_dicts, parse_overrides, resolved_run_dir
from lmforge.config.resume import never_started
from lmforge.errors import LMForgeError
from lmforge.pretraining.config import Config, load_config, load_resume_config
from lmforge.pretraining.setup import keep_run_tokenizer


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
    with the overrides on top; else the recipe (default: demo) with the overrides. A --resume of a run that has no
    config yet (it was stopped before saving one) needs the recipe named, and keeps the run's tokenizer."""
    user = overrides_tree(overrides)
    if not resume:
        return load_config(recipe or "demo", user)
    run_dir = resolved_run_dir(recipe or "demo", "pretrain", user, Config().run.dir)
    cfg = load_resume_config(run_dir, recipe, user)
    if cfg is not None:
        return cfg
    if recipe is None:  # never the demo recipe in place of the one a run killed before its config was saved had
        raise never_started(run_dir, "pretrain")
    cfg = load_config(recipe, user)  # the run starts afresh, keeping what it made before (its tokenizer)
    keep_run_tokenizer(cfg, Path(cfg.run.dir))
    return cfg
