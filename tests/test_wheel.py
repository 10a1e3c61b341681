"""The wheel: built from the checkout's files, installed by pip into a fresh venv that holds lmforge's core
dependencies and nothing else (no extras), and the CLI run from that venv's bin/: the demo pretrains, fine-tunes
and evaluates with the core dependencies only, and the wheel carries every recipe, asset and data file.

The fresh venv gets its dependencies as hard links of the running environment's installed distributions (the
core requirements of lmforge's metadata and, recursively, theirs): the same files pip would unpack from the same
wheels, in seconds instead of the 80-100 s that unpacking torch (1 GB) and sympy alone take on 2 cores. pip then
installs the wheel with --no-index, so a requirement of the wheel that the closure does not meet fails the test."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
OPTIONAL = ("sklearn", "scipy", "rouge_score", "sacrebleu", "pyarrow", "rdata", "matplotlib", "lm_eval",
            "transformers", "tensorboard", "wandb", "mlflow", "torchao", "pandas", "nltk", "datasets")  # fmt: skip


def checkout_files() -> list[str]:
    """The files a fresh clone has (tracked, and new ones not ignored) under src/, plus pyproject and README."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the files a clone would have are unknown")
    res = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "--", "src", "pyproject.toml", "README.md"],
                         cwd=ROOT, capture_output=True, text=True, check=True)  # fmt: skip
    return [f for f in res.stdout.splitlines() if (ROOT / f).is_file()]


def build_wheel(out: Path) -> Path:
    """`pip wheel --no-deps` of a copy of the checkout (the build writes build/ and *.egg-info beside its input)."""
    src = out / "checkout"
    for f in checkout_files():
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f)
    try:  # the running environment's setuptools when it is new enough (no download), else pip's isolated build
        isolated = int(importlib.metadata.version("setuptools").split(".")[0]) < 68
    except importlib.metadata.PackageNotFoundError:
        isolated = True
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out / "dist"), str(src)]
    subprocess.run(cmd + ([] if isolated else ["--no-build-isolation"]), check=True, capture_output=True)
    (wheel,) = (out / "dist").glob("lmforge-*.whl")
    return wheel


def wheel_requires(wheel: Path) -> list[str]:
    """The wheel's own requirements (Requires-Dist without an extra), from its METADATA."""
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    reqs = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    return sorted(r for r in reqs if "extra ==" not in r)


def dependency_closure(names: list[str]) -> list[importlib.metadata.Distribution]:
    """The installed distributions `names` need, with what they need in turn (markers evaluated here)."""
    seen: dict[str, importlib.metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        dist = seen[name] = importlib.metadata.distribution(name)
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def link_distributions(dists: list[importlib.metadata.Distribution], site: Path) -> None:
    """Hard-link (copy across file systems) each installed distribution's files into `site`: what pip would unpack
    there from the same wheels, in a second."""
    for dist in dists:
        base = Path(dist.locate_file(""))
        for f in dist.files or []:
            if f.parts[0] == "..":  # console scripts in bin/: not needed to import the package
                continue
            dst = site / f
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(base / f, dst)
            except FileNotFoundError:  # a RECORD line for a file that is not there (*.pyc of another Python)
                continue
            except OSError:
                shutil.copy2(base / f, dst)


def venv_python(venv: Path, code: str) -> str:
    res = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True)
    return res.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("build"))


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed by pip, without any extra."""
    tmp = tmp_path_factory.mktemp("wheel")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(venv_python(venv, "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    core = [Requirement(r).name for r in wheel_requires(wheel)]
    link_distributions(dependency_closure(core), site)
    # pip 22.3+ installs into another interpreter's environment (--python): the venv needs no pip of its own.
    # --no-index: every requirement of the wheel, and of what it requires, must already be met in the venv.
    res = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                          "--no-index", str(wheel)], capture_output=True, text=True)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return venv


def lmforge(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"OMP_NUM_THREADS": "1", "PATH": f"{venv / 'bin'}:{env.get('PATH', '')}"}
    res = subprocess.run([str(venv / "bin" / "lmforge"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=900)  # fmt: skip
    assert res.returncode == 0, f"lmforge {' '.join(args)}\n{res.stderr[-3000:]}"
    return res


def test_the_wheel_carries_every_data_file_of_the_package(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    data = [f.removeprefix("src/") for f in checkout_files() if f.startswith("src/lmforge/") and not f.endswith(".py")]
    assert data and [f for f in data if f not in names] == []
    code = [f.removeprefix("src/") for f in checkout_files() if f.startswith("src/lmforge/") and f.endswith(".py")]
    assert [f for f in code if f not in names] == []  # namespace packages (train/, eval/) included
    core = [Requirement(r).name for r in wheel_requires(wheel)]
    assert core == ["numpy", "pyyaml", "safetensors", "tokenizers", "torch", "tqdm"]


def test_the_installed_wheel_runs_the_demo_with_the_core_dependencies_only(installed, tmp_path):
    where = venv_python(installed, "import lmforge, sys; print(lmforge.__file__); print(sys.prefix)").split()
    assert where[0].startswith(str(installed)) and where[1] == str(installed)  # not the checkout's src/
    missing = venv_python(installed, f"import importlib.util as u; print([m for m in {OPTIONAL!r} if u.find_spec(m)])")
    assert missing.strip() == "[]"  # no extra came along
    res = lmforge(installed, "pretrain", "demo", "--train.max_steps=5", "--train.eval_batches=2", cwd=tmp_path)
    run = tmp_path / "runs" / "demo"
    assert (run / "checkpoints" / "step_5").is_dir() and (run / "tokenizer" / "tokenizer.json").is_file()
    assert [r for r in (run / "metrics.jsonl").read_text().splitlines() if '"val_loss"' in r]
    assert not (run / "plots").exists()
    assert "note: plots/loss.png needs matplotlib, which is not installed (lmforge's `plot` extra)" in res.stderr
    lmforge(installed, "finetune", "demo-sentiment", "--init", "runs/demo", "--train.max_steps=3",
            "--data.max_eval=32", cwd=tmp_path)  # fmt: skip
    out = lmforge(installed, "eval", "runs/demo-sentiment", cwd=tmp_path).stdout
    assert "accuracy" in out
