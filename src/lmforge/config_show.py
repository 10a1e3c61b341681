"""`lmforge config show` (and `--print-config` of every training command): the resolved config a command would
run, as the YAML its run would save."""

from __future__ import annotations

import yaml

from lmforge.config import RECIPES_DIR, resolve_recipe
from lmforge.errors import LMForgeError

KINDS = ("pretrain", "finetune", "align", "compress")
DEFAULT_RECIPES = {"pretrain": "demo", "finetune": "sst2-gpt", "compress": "sentiment-gpt"}
ALIGN_DEFAULTS = {"sft": "sft-sentiment", "reward": "reward-continuation", "dpo": "dpo-continuation",
                  "ppo": "ppo-continuation"}  # fmt: skip
"""The recipe each `lmforge align METHOD` runs when none is named."""


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


def default_recipe(kind: str, method: str | None = None) -> str:
    """The bundled recipe a command of `kind` (an align `method`) runs when none is named."""
    return ALIGN_DEFAULTS[method or "sft"] if kind == "align" else DEFAULT_RECIPES[kind]


def resolved_tree(
    recipe: str | None, kind: str, overrides: list[str] | dict, init: str | None = None, resume: bool = False,
    method: str | None = None, teacher: str | None = None,
) -> dict:  # fmt: skip
    """The resolved config of `recipe` (default: the kind's) with `overrides`, as the plain dict a run saves."""
    if kind == "pretrain":
        from lmforge.api import pretrain_config
        from lmforge.config import to_dict

        return to_dict(pretrain_config(recipe, overrides, resume=resume))
    if kind == "finetune":
        from lmforge.finetune_cli import finetune_config
        from lmforge.tasks.config import finetune_to_dict

        return finetune_to_dict(finetune_config(recipe, init, overrides, resume))
    if kind == "align":
        from lmforge.align.cli import align_config
        from lmforge.align.config import align_to_dict, load_align_config

        recipe = recipe or default_recipe("align", method)
        method = method or load_align_config(recipe, overrides).method
        return align_to_dict(align_config(method, recipe, init, overrides, resume))
    import dataclasses

    from lmforge.compress.config import load_compress_config

    if resume:
        raise LMForgeError("a compression report resumes from its recipe: drop --resume")
    return dataclasses.asdict(load_compress_config(recipe or default_recipe(kind), overrides, teacher=teacher))


def show_config(
    recipe: str | None, kind: str | None, overrides: list[str], init: str | None = None, resume: bool = False,
    method: str | None = None, teacher: str | None = None,
) -> str:  # fmt: skip
    """The resolved YAML of `recipe` (default: the pretraining demo) with `overrides`."""
    kind = kind or recipe_kind(recipe)
    tree = resolved_tree(recipe, kind, overrides, init, resume, method, teacher)
    if recipe is not None:
        resolve_recipe(recipe, kind)  # a typo gets its did-you-mean even when the name was looked up elsewhere
    return yaml.safe_dump(tree, sort_keys=False, allow_unicode=True)
