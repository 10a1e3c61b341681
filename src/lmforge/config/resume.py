"""What a resumed run may change: its saved config with the user's overrides on top, the keys the saved state depends
on held fixed, and the newest checkpoint's config standing in for a lost RUN/config.yaml."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lmforge.checkpoint.read import newest_config
from lmforge.config.core import flat_keys, get_key, merge_dicts, parse_overrides, read_yaml, resolve_recipe
from lmforge.errors import LMForgeError

CHANGEABLE_ON_RESUME = ("train.", "sample.", "run.dir")
FIXED_ON_RESUME = ("train.seq_len", "train.optimizer", "train.layer_decay")
"""Keys of the train section that the saved data position or optimizer state depends on. train.batch_size may
change with the number of processes: the loaders refuse a resume whose global batch (batch_size × processes)
differs from the saved one."""
RESUME_FIXED = ("train.optimizer", "train.layer_decay")
"""The same for runs over examples (fine-tuning, alignment): no sequence length."""


def resumed(
    run_dir: Path, recipe: str | None, overrides: list[str] | dict | None, build: Callable[[dict], Any],
    dump: Callable[[Any], dict], fixed: tuple[str, ...] = FIXED_ON_RESUME,
    unpack: Callable[[dict], dict] | None = None,
) -> Any | None:  # fmt: skip
    """The config a resumed run continues with: its own RUN/config.yaml with the user's overrides on top (None
    when the run has no config yet), built by `build` and dumped back by `dump`. Overrides may change train.*
    (except the `fixed` keys the saved data position depends on) and sample.*, and apply from the resumed step on;
    anything else is refused with one line. A missing or unreadable config.yaml gives way to the newest checkpoint's
    own config (`unpack` takes the run's config out of it, where the checkpoint holds more)."""
    saved = saved_run_config(Path(run_dir), build, unpack or (lambda c: c))
    if saved is None:
        return None
    user = overrides if isinstance(overrides, dict) else parse_overrides(overrides or [])
    made_with = get_key(saved, "run.recipe")
    if recipe is not None and made_with is not None and Path(str(recipe)).stem != Path(str(made_with)).stem:
        raise LMForgeError(f"cannot resume {run_dir} with recipe '{recipe}': the run was made with '{made_with}'")
    cfg = build(merge_dicts(saved, user))
    new = dump(cfg)
    for key in flat_keys(user):
        was, now = get_key(saved, key), get_key(new, key)
        if key == "model.preset" and was is None:  # a pretraining config keeps the preset's name, not the key
            was, now = get_key(saved, "model.name"), get_key(user, key)
        allowed = key.startswith(CHANGEABLE_ON_RESUME) and key not in fixed
        if not allowed and now != was:
            raise LMForgeError(
                f"cannot change {key} when resuming ({was!r} → {now!r}): start a new run with another --run.dir"
            )
    return cfg


def saved_run_config(run_dir: Path, build: Callable[[dict], Any], unpack: Callable[[dict], dict]) -> dict | None:
    """RUN/config.yaml; when it is missing, or not a config `build` accepts, the config of the newest checkpoint
    whose config.yaml is intact (every checkpoint carries its own), said in one note line. None when the run has
    neither; a damaged config.yaml without a checkpoint config to replace it is one error line."""
    path = run_dir / "config.yaml"
    problem = None
    if path.is_file():
        try:
            saved = read_yaml(path)
            build(saved)
            return saved
        except LMForgeError as e:
            problem = str(e)
    found = newest_config(run_dir)
    if found is None:
        if problem is not None:
            raise LMForgeError(f"cannot resume {run_dir}: {problem}, and no checkpoint holds a config to continue with")
        return None
    ckpt, config = found
    why = "is missing" if problem is None else f"is unreadable ({problem})"
    print(f"note: {path} {why}: resuming with the config saved in {ckpt}", file=sys.stderr)
    return unpack(config)


def never_started(run_dir: Path, kind: str) -> LMForgeError:
    """The line for --resume without a recipe on a run that has no config to continue with: killed before it saved
    one (while it trained its tokenizer or prepared its data), or never run. Its recipe is not known, and the
    default one would replace what the run made."""
    return LMForgeError(
        f"cannot resume {run_dir}: the run never started (it has no config.yaml and no checkpoint), so there is "
        f"nothing to resume: run the command that started it again, naming its recipe (lmforge {kind} RECIPE "
        f"--run.dir={run_dir} ...)"
    )


def resolved_run_dir(recipe: str | None, kind: str, user: dict, default: str | None = None) -> Path:
    """The run dir a command line names: --run.dir, else the recipe's run.dir, else `default`."""
    found = get_key(user, "run.dir")
    if found is None and recipe is not None:
        found = get_key(read_yaml(resolve_recipe(recipe, kind)), "run.dir")
    if found is None and default is None:
        raise LMForgeError("--resume needs the run: pass --run.dir=DIR")
    return Path(found or default)
