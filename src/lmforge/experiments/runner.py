"""Run many pretraining runs ("arms") as `lmforge pretrain` subprocesses: one at a time or `jobs` at once, each an
ordinary run dir. An arm whose metrics.jsonl already holds a validation loss at its final step is skipped; an arm
killed midway continues from its latest checkpoint (the same overrides again, with --resume)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmforge.errors import LMForgeError
from lmforge.progress import status

LOG_FILE = "arm.log"
"""The arm's stdout and stderr, in its run dir."""


@dataclass
class Arm:
    """One pretraining run: `lmforge pretrain RECIPE --run.dir=RUN_DIR OVERRIDES --train.max_steps=MAX_STEPS`."""

    name: str
    run_dir: Path
    recipe: str
    overrides: dict[str, Any]
    """Dotted config keys → values, as on the pretrain command line (run.dir and train.max_steps excluded)."""
    max_steps: int
    info: dict[str, Any] = field(default_factory=dict)
    """Anything the experiment records about the arm (size, tokens, parameter count), for its tables."""


@dataclass
class ArmResult:
    arm: Arm
    state: str
    """'skipped' (already finished), 'finished', or 'failed'."""
    final: dict | None = None
    """The arm's metrics.jsonl record holding val_loss at max_steps."""
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


def resolve_config(recipe: str, overrides: dict[str, Any]):
    """The validated pretraining Config an arm will run (bad keys and values fail here, before any run starts)."""
    from lmforge.config import load_config

    return load_config(recipe, [f"--{k}={format_value(v)}" for k, v in overrides.items()])


def has_checkpoint(run_dir: Path) -> bool:
    return any((Path(run_dir) / "checkpoints").glob("step_*"))


def final_record(run_dir: Path, step: int) -> dict | None:
    """The metrics.jsonl record with a val_loss at `step`, if the run got there."""
    from lmforge.train.metrics import read_metrics

    if not (Path(run_dir) / "metrics.jsonl").is_file():
        return None
    hits = [r for r in read_metrics(run_dir) if r.get("step") == step and r.get("val_loss") is not None]
    return hits[-1] if hits else None


def arm_command(arm: Arm) -> list[str]:
    """The pretrain command line of an arm; --resume once it has a checkpoint to continue from."""
    cmd = [sys.executable, "-m", "lmforge.cli", "pretrain", arm.recipe, f"--run.dir={arm.run_dir}"]
    cmd += [f"--{k}={format_value(v)}" for k, v in arm.overrides.items()]
    cmd.append(f"--train.max_steps={arm.max_steps}")
    return cmd + (["--resume"] if has_checkpoint(arm.run_dir) else [])


def _last_error(log: Path) -> str:
    try:
        lines = [x for x in log.read_text(encoding="utf-8", errors="replace").splitlines() if x.strip()]
    except OSError:
        return "no log"
    errors = [x for x in lines if x.startswith("error:")]
    return (errors or lines or ["no output"])[-1][:300]


def _launch(arm: Arm, device: str | None, threads: str) -> tuple[subprocess.Popen, float]:
    arm.run_dir.mkdir(parents=True, exist_ok=True)
    env = {"OMP_NUM_THREADS": threads} | dict(os.environ, LMFORGE_QUIET="1")
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
    log = open(arm.run_dir / LOG_FILE, "a", encoding="utf-8")  # noqa: SIM115  (closed when the arm ends)
    proc = subprocess.Popen(arm_command(arm), stdout=log, stderr=subprocess.STDOUT, env=env)
    proc.log = log  # type: ignore[attr-defined]
    return proc, time.monotonic()


def run_arms(arms: list[Arm], jobs: int = 1, devices: list[str] | None = None, poll_s: float = 0.5) -> list[ArmResult]:
    """Run every unfinished arm (at most `jobs` at once; with `devices`, job slot i sees only GPU devices[i %
    len(devices)]) and return one result per arm, in order. Failures do not stop the other arms."""
    if jobs < 1:
        raise LMForgeError(f"--jobs must be >= 1, got {jobs}")
    names = [a.name for a in arms]
    if len(set(names)) != len(names):
        raise LMForgeError("arm names must be unique")
    results: dict[str, ArmResult] = {}
    todo = []
    for arm in arms:
        final = final_record(arm.run_dir, arm.max_steps)
        if final is not None:
            results[arm.name] = ArmResult(arm, "skipped", final)
        else:
            todo.append(arm)
    if len(todo) < len(arms):
        status(f"{len(arms) - len(todo)} of {len(arms)} arms already finished: skipped")
    running: dict[int, tuple[Arm, subprocess.Popen, float]] = {}  # slot -> arm
    total, started = len(todo), 0
    threads = str(max(1, (os.cpu_count() or 1) // jobs))  # CPU runs: no more threads than cores
    try:
        while todo or running:
            for slot in range(jobs):
                if slot not in running and todo:
                    arm = todo.pop(0)
                    device = devices[slot % len(devices)] if devices else None
                    started += 1
                    verb = "resuming" if has_checkpoint(arm.run_dir) else "starting"
                    status(f"[{started}/{total}] {verb} {arm.name} ({arm.run_dir})")
                    running[slot] = (arm, *_launch(arm, device, threads))
            time.sleep(poll_s)
            for slot, (arm, proc, t0) in list(running.items()):
                if proc.poll() is None:
                    continue
                proc.log.close()  # type: ignore[attr-defined]
                del running[slot]
                results[arm.name] = _finish(arm, proc.returncode, time.monotonic() - t0)
    finally:  # interrupted: stop the arms still running (a rerun resumes them from their checkpoints)
        for _, proc, _ in running.values():
            proc.terminate()
            proc.wait()
            proc.log.close()  # type: ignore[attr-defined]
    return [results[a.name] for a in arms]


def _finish(arm: Arm, returncode: int, seconds: float) -> ArmResult:
    final = final_record(arm.run_dir, arm.max_steps) if returncode == 0 else None
    if final is None:
        error = _last_error(arm.run_dir / LOG_FILE) if returncode else "no val_loss at the final step"
        status(f"{arm.name}: failed after {seconds:.0f} s: {error}")
        return ArmResult(arm, "failed", None, seconds, error)
    status(f"{arm.name}: val_loss {final['val_loss']:.4f} after {seconds:.0f} s")
    return ArmResult(arm, "finished", final, seconds)


def check_all_finished(results: list[ArmResult]) -> None:
    """Raise one line naming the failed arms and where their logs are."""
    failed = [r for r in results if r.state == "failed"]
    if failed:
        first = failed[0]
        raise LMForgeError(
            f"{len(failed)} of {len(results)} arms failed ({', '.join(r.arm.name for r in failed)}); "
            f"{first.arm.name}: {first.error} (log: {first.arm.run_dir / LOG_FILE}); rerun to retry them"
        )
