"""A documented command is a tested command: every shell and Python block of the README, the commands `make demo`
runs, and every recipe's "CPU smoke run" line run here as written — with one change, fewer steps, so the suite
stays fast: `--train.max_steps=N` becomes a few steps (and is added to the demo commands). The lmforge commands run
in the test's process, through lmforge.cli.main as the `lmforge` script does; the Python blocks run as scripts."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from training_testing import run_main

from lmforge.config import RECIPES_DIR

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "LMFORGE_QUIET": "1"}
STEPS = {"200": "8", "400": "12", "50": "3"}  # README / recipe step counts → the test's


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, re.S)


def shell_commands(block: str) -> list[list[str]]:
    """The lmforge commands of a shell block (setup lines such as `source` and `make` are the README's own)."""
    out = []
    for line in block.splitlines():
        line = line.split("  #")[0].strip()
        if line.startswith("lmforge "):
            out.append(shlex.split(line))
    return out


def fewer_steps(args: list[str]) -> list[str]:
    return [
        re.sub(r"^--train\.max_steps=(\d+)$", lambda m: f"--train.max_steps={STEPS.get(m[1], m[1])}", a) for a in args
    ]


@pytest.fixture
def lmforge(monkeypatch, capsys, torch_globals) -> Callable[[list[str], Path], subprocess.CompletedProcess]:
    """`lmforge(args, cwd)` runs the command as the `lmforge` script does (lmforge.cli.main), in this process, in cwd,
    with ENV's settings (one torch thread: torch_globals)."""
    monkeypatch.setenv("LMFORGE_QUIET", "1")

    def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
        monkeypatch.chdir(cwd)
        rc, out, err = run_main(capsys, *args[1:])
        assert rc == 0, f"{shlex.join(args)}\n{err[-3000:]}"
        return subprocess.CompletedProcess(args, rc, out, err)

    return run


def test_the_readme_quickstart_and_python_blocks_run_as_written(tmp_path, lmforge):
    quickstart = [c for b in blocks("bash") for c in shell_commands(b)]
    assert quickstart[0][:2] == ["lmforge", "pretrain"] and "--resume" in quickstart[2]
    outputs = [lmforge(fewer_steps(cmd), tmp_path) for cmd in quickstart]
    assert outputs[1].stdout.startswith("It is a truth universally acknowledged")  # generate
    rows = [json.loads(x) for x in (tmp_path / "runs/tiny/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [8, 10, 12]  # resumed at 8 (log_every 10), on to 12
    assert "train.max_steps: integer > 0 = 2000 (default 1000)" in outputs[3].stdout  # pretrain gpt --help
    assert "name: gpt-tiny" in outputs[4].stdout  # config show
    assert "rotten-tomatoes" in outputs[5].stdout  # data fetch --list
    for i, code in enumerate(blocks("python")):
        script = tmp_path / f"block{i}.py"
        script.write_text(code, encoding="utf-8")
        res = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                             timeout=900)  # fmt: skip
        assert res.returncode == 0, f"README python block {i}:\n{res.stderr[-3000:]}"


def test_the_demo_commands_run(tmp_path, lmforge):
    demo = re.findall(r"^\d\. `(lmforge [^`]+)`", README, re.M)
    assert [d.split()[:2] for d in demo] == [["lmforge", "pretrain"], ["lmforge", "finetune"], ["lmforge", "eval"]]
    lmforge([*shlex.split(demo[0]), "--train.max_steps=4", "--train.eval_batches=2"], tmp_path)
    lmforge([*shlex.split(demo[1]), "--train.max_steps=3", "--data.max_eval=32"], tmp_path)
    assert "accuracy" in lmforge(shlex.split(demo[2]), tmp_path).stdout


SMOKE = {
    p.stem: re.search(r"CPU smoke run: (lmforge [^\n]+)", p.read_text()) for p in RECIPES_DIR.glob("pretrain/*.yaml")
}


@pytest.mark.parametrize("recipe", sorted(SMOKE))
def test_every_pretraining_recipe_runs_its_documented_smoke_line(recipe, tmp_path, lmforge):
    m = SMOKE[recipe]
    if recipe == "demo":  # the demo is the README's (test_the_demo_commands_run)
        return
    assert m is not None, f"recipes/pretrain/{recipe}.yaml has no 'CPU smoke run: lmforge ...' line"
    args = shlex.split(m[1])
    assert args[:3] == ["lmforge", "pretrain", recipe]
    lmforge([*fewer_steps(args), "--run.dir=run", "--train.eval_batches=2", "--sample.max_new_tokens=4"], tmp_path)
    assert list((tmp_path / "run" / "checkpoints").iterdir())
