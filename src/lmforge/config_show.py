"""`lmforge config show`: the resolved config a command would run, as the YAML its run would save."""

from __future__ import annotations

import yaml

from lmforge.config import RECIPES_DIR, resolve_recipe
from lmforge.errors import LMForgeError

KINDS = ("pretrain", "finetune", "align", "compress")


def recipe_kind(recipe: str | None) -> str:
    """The kind of a recipe: the bundled dir holding it (by name or path), else pretrain."""
    if recipe is None:
        return "pretrain"
    for kind in KINDS:
        folder = RECIPES_DIR / kind
        if (folder / f"{recipe}.yaml").is_file() or str(recipe).startswith(str(folder)):
            return kind
        if "/" in str(recipe) and f"/{kind}/" in str(recipe):
            return kind
    return "pretrain"


def show_config(
    recipe: str | None, kind: str | None, overrides: list[str], init: str | None = None, resume: bool = False
) -> str:
    """The resolved YAML of `recipe` (default: the pretraining demo) with `overrides`."""
    kind = kind or recipe_kind(recipe)
    if kind == "pretrain":
        from lmforge.api import pretrain_config
        from lmforge.config import to_dict

        tree = to_dict(pretrain_config(recipe, overrides, resume=resume))
    elif kind == "finetune":
        from lmforge.finetune_cli import finetune_config
        from lmforge.tasks.config import finetune_to_dict

        tree = finetune_to_dict(finetune_config(recipe, init, overrides, resume))
    elif kind == "align":
        from lmforge.align.cli import align_config
        from lmforge.align.config import align_to_dict, load_align_config

        method = load_align_config(recipe, overrides).method
        tree = align_to_dict(align_config(method, recipe or "sft-sentiment", init, overrides, resume))
    else:
        import dataclasses

        from lmforge.compress.config import load_compress_config

        if resume:
            raise LMForgeError("a compression report resumes from its recipe: drop --resume")
        tree = dataclasses.asdict(load_compress_config(recipe or "sentiment-gpt", overrides))
    if recipe is not None:
        resolve_recipe(recipe, kind)  # a typo gets its did-you-mean even when the name was looked up elsewhere
    return yaml.safe_dump(tree, sort_keys=False, allow_unicode=True)
