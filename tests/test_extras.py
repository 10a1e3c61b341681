"""Optional dependencies: `lmforge.extras` mirrors pyproject's extras, and a feature whose library is missing says
in one line which package (and which lmforge extra) to install — at its use site, or before the work that needs it."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from lmforge import extras
from lmforge.errors import LMForgeError

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
PYPROJECT = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text(encoding="utf-8"))
EXTRAS = PYPROJECT["project"]["optional-dependencies"]


def hide(monkeypatch, *modules: str) -> None:
    """Make `modules` look uninstalled to lmforge's checks (find_spec answers None)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in modules else real(name, *a))


def test_every_optional_module_names_the_requirement_of_its_extra_in_pyproject():
    for module, (spec, extra) in extras.PACKAGES.items():
        assert spec in EXTRAS[extra], f"{module}: {spec} is not in pyproject's `{extra}` extra"
    core = {re.split("[<>=]", r)[0] for r in PYPROJECT["project"]["dependencies"]}
    assert core == {"torch", "numpy", "tokenizers", "safetensors", "pyyaml", "tqdm"}
    named = {e for spec in EXTRAS["all"] for e in re.search(r"\[(.*)\]", spec)[1].split(",")}
    assert named == set(EXTRAS) - {"all", "dev"}  # `all` is every extra, and dev builds on it
    assert "lmforge[all]" in EXTRAS["dev"]


def test_require_imports_an_installed_module_and_refuses_a_missing_one_in_one_line(monkeypatch):
    assert extras.require("scipy.stats", "Spearman correlation").spearmanr
    hide(monkeypatch, "sklearn")
    with pytest.raises(LMForgeError) as e:
        extras.require("sklearn.metrics", "F1")
    assert str(e.value) == (
        "F1 needs scikit-learn, which is not installed (lmforge's `eval` extra): pip install 'scikit-learn>=1.3'"
    )
    with pytest.raises(KeyError):  # a module that is no optional dependency is a programming error
        extras.require("json", "x")


def test_a_metric_without_its_library_fails_at_its_use_site_and_before_fine_tuning(monkeypatch):
    from lmforge import metrics
    from lmforge.tasks.scoring import require_metric_packages

    hide(monkeypatch, "scipy", "sklearn")
    assert metrics.accuracy([1, 0], [1, 1]) == 0.5  # accuracy needs no extra
    with pytest.raises(LMForgeError, match=r"^Pearson correlation needs scipy, .*pip install 'scipy>=1.10'$"):
        metrics.pearson([1.0, 2.0], [1.0, 3.0])
    with pytest.raises(LMForgeError, match=r"^metric 'mcc' needs scikit-learn, which is not installed"):
        require_metric_packages(["accuracy", "mcc"])
    require_metric_packages(["accuracy"])


def test_without_matplotlib_a_run_skips_its_plots_with_one_note(monkeypatch, tmp_path, capsys):
    from lmforge.train.metrics import MetricsLogger, plot_metrics

    with MetricsLogger(tmp_path) as log:
        log.log(1, loss=2.0)
    hide(monkeypatch, "matplotlib")
    assert plot_metrics(tmp_path) == [] and not (tmp_path / "plots").exists()
    assert capsys.readouterr().err == (
        "note: plots/loss.png needs matplotlib, which is not installed (lmforge's `plot` extra): "
        "pip install 'matplotlib>=3.7'\n"
    )


def test_parquet_input_without_pyarrow_is_one_line(monkeypatch, tmp_path):
    from lmforge.data.corpus.readers import read_documents

    path = tmp_path / "corpus.parquet"
    path.write_bytes(b"PAR1")
    hide(monkeypatch, "pyarrow")
    with pytest.raises(LMForgeError, match=r"^reading Parquet files needs pyarrow, .*pip install 'pyarrow>=14'$"):
        list(read_documents([path]))


def test_an_experiment_without_matplotlib_is_refused_before_its_runs(monkeypatch, tmp_path):
    from lmforge.experiments.experiment import cmd_experiment

    hide(monkeypatch, "matplotlib")
    with pytest.raises(LMForgeError) as e:
        cmd_experiment("electra-vs-mlm-tiny", out=str(tmp_path / "exp"))
    assert str(e.value) == (
        "an experiment's figures needs matplotlib, which is not installed (lmforge's `plot` extra): "
        "pip install 'matplotlib>=3.7'"
    )
    assert not (tmp_path / "exp").exists()  # no run started, no lock taken


def test_the_readme_extras_table_and_pip_commands_are_pyprojects():
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    table = readme.split("| extra | installs | for |\n| --- | --- | --- |\n", 1)[1].split("\n\n", 1)[0]
    rows = {m[0]: m[1] for m in re.findall(r"^\| `(\w+)` \| ([^|]*) \|", table, re.M)}
    assert set(rows) == set(EXTRAS)
    for extra, listed in rows.items():
        if extra == "all":
            continue
        names = [re.split("[<>=\\[]", r)[0] for r in EXTRAS[extra]]
        names = ["all" if n == "lmforge" else n for n in names]
        assert [x.strip(" `") for x in listed.split(",")] == names, extra
    for group in re.findall(r"\.\[([\w,]+)\]", readme):  # pip install '.[eval,harness]' and the like
        assert set(group.split(",")) <= set(EXTRAS), group


def test_the_austen_fetch_without_rdata_is_refused_before_its_download(monkeypatch, tmp_path):
    from lmforge.data.fetch import packages
    from lmforge.data.fetch.build import fetch

    def download(*a, **k):
        raise AssertionError("downloaded although rdata is missing")

    monkeypatch.setattr(packages, "apt_fetch", download)
    hide(monkeypatch, "rdata")
    with pytest.raises(LMForgeError) as e:
        fetch("austen", cache_dir=tmp_path)
    assert str(e.value) == (
        "the austen fetch recipe needs rdata, which is not installed (lmforge's `data` extra): "
        "pip install 'rdata>=0.11'"
    )
