"""The alignment config a run resolves to: the recipe with `--init` (and PPO's `--reward`) and the overrides, or,
resuming, the run's saved config with the overrides on top (what `lmforge align METHOD` and `config show` run)."""

from __future__ import annotations

from lmforge.errors import LMForgeError


def align_config(
    method: str, recipe: str, init: str | None, overrides: list[str] | dict, resume: bool = False,
    reward: str | None = None,
):  # fmt: skip
    """The AlignConfig `lmforge align METHOD` runs: with --resume, the run's saved config with the overrides on top;
    else the recipe with `--init` (and PPO's `--reward`) and the overrides."""
    from lmforge.align.config import align_to_dict, build_align_config, load_align_config
    from lmforge.config import RESUME_FIXED, merge_dicts, parse_overrides, resolved_run_dir, resumed

    user = overrides if isinstance(overrides, dict) else parse_overrides(list(overrides or []))
    cfg = None
    if resume:
        run_dir = resolved_run_dir(recipe, "align", user)
        given = merge_dicts(user, {"ppo": {"reward": reward}}) if reward else user  # must match the saved one
        cfg = resumed(
            run_dir, recipe, given, build_align_config, align_to_dict, fixed=RESUME_FIXED,
            unpack=lambda saved: saved.get("align") or {},  # a checkpoint holds the run's config under align
        )  # fmt: skip
    if cfg is None:
        cfg = load_align_config(recipe, user, init=init, reward=reward)
    if cfg.method != method:
        raise LMForgeError(f"recipe {recipe} is a '{cfg.method}' recipe, not '{method}'")
    return cfg
