"""An experiment's arms: one run each (`lmforge pretrain`, `lmforge finetune` or `lmforge eval`), its result,
and the stage table that says, per arm kind, its command line, where its finished results are read, its headline
and the report columns it fills."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lmforge.errors import LMForgeError
from lmforge.files import loads_json

LOG_FILE = "arm.log"
"""The arm's stdout and stderr, in its run dir."""
EVAL_RESULTS = "results.json"
"""An evaluation arm's results ({task: {metric: value}}), in its run dir."""
ArmKind = Literal["pretrain", "finetune", "eval"]
VAL_LOSS = "val loss"
"""The report column of a pretraining run's final validation loss."""
BELOW_PLATEAU = "below plateau"
"""The report column of how far a pretraining run's final validation loss ends below its targets' unigram plateau
(`val_plateau`, lmforge.eval.plateau), in nats; for the objectives that score their labels alone."""


@dataclass
class Arm:
    """One run. pretrain: `lmforge pretrain RECIPE --run.dir=RUN_DIR OVERRIDES --train.max_steps=MAX_STEPS`;
    finetune: `lmforge finetune RECIPE --init INIT --run.dir=RUN_DIR OVERRIDES`; eval: `lmforge eval INIT --task
    TASK ... --out RUN_DIR/results.json OVERRIDES`."""

    name: str
    run_dir: Path
    recipe: str
    overrides: dict[str, Any]
    """Dotted config keys → values, as on the command line (run.dir and train.max_steps excluded)."""
    max_steps: int | None = None
    """Pretraining steps (None for the other kinds)."""
    info: dict[str, Any] = field(default_factory=dict)
    """Anything the experiment records about the arm (size, tokens, parameter count), for its tables."""
    kind: ArmKind = "pretrain"
    init: str | None = None
    """finetune: what `--init` starts from; eval: the model evaluated."""
    tasks: list[str] = field(default_factory=list)
    """eval: the `--task` recipes."""
    after: list[str] = field(default_factory=list)
    """Names of the arms whose runs this one needs; it starts once they have finished."""
    procs: int = 1
    """pretrain: processes it trains on (> 1: under torch.distributed.run, alone on the machine)."""


@dataclass
class ArmResult:
    arm: Arm
    state: str
    """'skipped' (already finished), 'finished', or 'failed'."""
    final: dict | None = None
    """pretrain: the metrics.jsonl record holding val_loss at max_steps; finetune: {"dev": eval.json, "test":
    eval_test.json or None}; eval: the results file."""
    seconds: float = 0.0
    error: str = ""


def format_value(value: Any) -> str:
    """A config value as the command line writes it (the command line parses values as YAML scalars)."""
    import yaml

    if isinstance(value, str):
        try:
            if value and yaml.safe_load(value) == value:
                return value
        except yaml.YAMLError:
            pass
    return json.dumps(value)


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """{'train': {'lr': 1}} → {'train.lr': 1}."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        out.update(flatten(v, key + ".") if isinstance(v, dict) else {key: v})
    return out


def cli_args(overrides: dict[str, Any]) -> list[str]:
    """Dotted keys → values as command-line overrides (--train.lr=0.001)."""
    return [f"--{k}={format_value(v)}" for k, v in overrides.items()]


def resolve_config(recipe: str, overrides: dict[str, Any]):
    """The validated pretraining Config an arm will run (bad keys and values fail here, before any run starts)."""
    from lmforge.pretraining.config import load_config

    return load_config(recipe, cli_args(overrides))


def has_checkpoint(run_dir: Path) -> bool:
    return any((Path(run_dir) / "checkpoints").glob("step_*"))


def final_record(run_dir: Path, step: int) -> dict | None:
    """The metrics.jsonl record with a val_loss at `step`, if the run got there."""
    from lmforge.train.metrics import read_metrics

    if not (Path(run_dir) / "metrics.jsonl").is_file():
        return None
    hits = [r for r in read_metrics(run_dir) if r.get("step") == step and r.get("val_loss") is not None]
    return hits[-1] if hits else None


def _clock_end(run_dir: Path) -> dict | None:
    """The final record of a run that ended on `train.time_budget` before `train.max_steps`: its newest checkpoint
    is at the step its budget planned last. None for any other run (one stopped early resumes)."""
    from lmforge.checkpoint.layout import list_checkpoints
    from lmforge.checkpoint.train_state import load_train_state

    found = list_checkpoints(run_dir)
    if not found:
        return None
    try:
        state = load_train_state(found[-1])
    except LMForgeError:
        return None
    budget, step = state.get("budget"), state.get("step")
    if not isinstance(budget, dict) or budget.get("total") != step:
        return None
    return final_record(run_dir, int(step))


def _read_json(path: Path) -> dict | None:
    try:
        data = loads_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # missing, or half written by a killed process
    return data if isinstance(data, dict) else None


def _pretrain_command(arm: Arm, base: list[str], over: list[str]) -> list[str]:
    cmd = base + ["pretrain", arm.recipe, f"--run.dir={arm.run_dir}", *over, f"--train.max_steps={arm.max_steps}"]
    if arm.procs > 1:  # the same global batch, cut across the processes
        launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={arm.procs}"]
        cmd = [cmd[0], *launcher, *cmd[1:], f"--train.batch_size={arm.info['batch_size'] // arm.procs}"]
    return cmd


def _finetune_command(arm: Arm, base: list[str], over: list[str]) -> list[str]:
    return base + ["finetune", arm.recipe, "--init", str(arm.init), f"--run.dir={arm.run_dir}", *over]


def _eval_command(arm: Arm, base: list[str], over: list[str]) -> list[str]:
    tasks = [x for t in arm.tasks for x in ("--task", t)]
    return base + ["eval", str(arm.init), *tasks, "--out", str(Path(arm.run_dir) / EVAL_RESULTS), *over]


def _pretrain_final(arm: Arm) -> dict | None:
    d = Path(arm.run_dir)
    return final_record(d, int(arm.max_steps or 0)) or _clock_end(d)


def _finetune_final(arm: Arm) -> dict | None:
    dev = _read_json(Path(arm.run_dir) / "eval.json")
    return None if dev is None else {"dev": dev, "test": _read_json(Path(arm.run_dir) / "eval_test.json")}


def _finetune_cells(info: dict, final: dict) -> list[tuple[str, float]]:
    return [(f"{info['task']} {split} {k}", 100 * v) for split in ("dev", "test")
            for k, v in (final.get(split) or {}).items()]  # fmt: skip


def _eval_cells(info: dict, final: dict) -> list[tuple[str, float]]:
    return [(f"{info['eval']} {k}", 100 * v) for metrics in final.values() for k, v in metrics.items()]


def _metrics(m: dict) -> str:
    return ", ".join(f"{k} {v:.4f}" for k, v in m.items())


@dataclass(frozen=True)
class Stage:
    """What an arm kind is to the runner and the report: `command(arm, base, overrides)` its command line (an arm
    that `resumes` adds --resume once it has a checkpoint), `final(arm)` its results once finished (None before),
    `summary(final)` its headline, `cells(info, final)` the report columns it fills, each (column, value) on the
    report's scale (task and evaluation metrics × 100), `rank` where its columns stand in the table; `spreads`: the
    arm may train on several processes (`--pretrain-procs`); `drops_checkpoints`: once finished, its resumable
    checkpoints go (its results and best/ stay: a grid of fine-tunes would fill the disk otherwise)."""

    command: Callable[[Arm, list[str], list[str]], list[str]]
    final: Callable[[Arm], dict | None]
    summary: Callable[[dict], str]
    cells: Callable[[dict, dict], list[tuple[str, float]]]
    rank: int
    resumes: bool = True
    spreads: bool = False
    drops_checkpoints: bool = False


def _pretrain_cells(info: dict, final: dict) -> list[tuple[str, float]]:
    loss, plateau = final["val_loss"], final.get("val_plateau")
    return [(VAL_LOSS, loss)] + ([(BELOW_PLATEAU, plateau - loss)] if plateau is not None else [])


STAGES: dict[str, Stage] = {
    "pretrain": Stage(_pretrain_command, _pretrain_final, lambda f: f"val_loss {f['val_loss']:.4f}",
                      _pretrain_cells, 0, spreads=True),
    "eval": Stage(_eval_command, lambda arm: _read_json(Path(arm.run_dir) / EVAL_RESULTS),
                  lambda f: "; ".join(f"{t}: {_metrics(m)}" for t, m in f.items()), _eval_cells, 1, resumes=False),
    "finetune": Stage(_finetune_command, _finetune_final, lambda f: f"dev {_metrics(f['dev'])}", _finetune_cells, 2,
                      drops_checkpoints=True),
}  # fmt: skip
"""Arm kind → its stage."""


def of_stage(items: Iterable, kind: ArmKind, arm: Callable[[Any], Arm] = lambda r: r.arm) -> list:
    """The results (or, with `arm=lambda a: a`, the arms) of the arms of one kind, in order."""
    by_kind: dict[str, list] = {k: [] for k in STAGES}
    for item in items:
        by_kind[arm(item).kind].append(item)
    return by_kind[kind]


def arm_final(arm: Arm) -> dict | None:
    """The arm's results if it has finished (see `ArmResult.final`), else None."""
    return STAGES[arm.kind].final(arm)


def arm_command(arm: Arm) -> list[str]:
    """The command line of an arm; a pretraining or fine-tuning arm adds --resume once it has a checkpoint."""
    stage = STAGES[arm.kind]
    cmd = stage.command(arm, [sys.executable, "-m", "lmforge.cli"], cli_args(arm.overrides))
    return cmd + (["--resume"] if stage.resumes and has_checkpoint(arm.run_dir) else [])


def summary(arm: Arm, final: dict) -> str:
    """A finished arm's headline numbers, e.g. 'val_loss 3.2100' or 'dev accuracy 0.7810'."""
    return STAGES[arm.kind].summary(final)
