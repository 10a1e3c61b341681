"""`lmforge config show` (and `--print-config` of every training command): the resolved config a command would
run, as the YAML its run would save."""

from __future__ import annotations

import yaml

from lmforge.config import RECIPES_DIR, resolve_recipe
from lmforge.run_kinds import RUN_KINDS, resolve, run_kind

KINDS = tuple(RUN_KINDS)


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
    return run_kind(kind).default_recipe(method)


def resolved_tree(
    recipe: str | None, kind: str, overrides: list[str] | dict, init: str | None = None, resume: bool = False,
    method: str | None = None, teacher: str | None = None,
) -> dict:  # fmt: skip
    """The resolved config of `recipe` (default: the kind's) with `overrides`, as the plain dict a run saves."""
    return resolve(kind, recipe, overrides, init=init, resume=resume, method=method, teacher=teacher)


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
