"""train.compile on a Python that compiles torch's sources in every process (no .pyc files, none written): one
warning line, on the main rank only; nothing where the bytecode is cached or may be written."""

import importlib.util
import sys
from types import SimpleNamespace

import pytest
import torch

from lmforge.config.sections import LoopConfig
from lmforge.models import Transformer, get_preset
from lmforge.train.distributed import DistInfo
from lmforge.train.parallel import bytecode_cached, parallelize


@pytest.fixture
def pyc(tmp_path, monkeypatch):
    """Points torch's compiler module at a .pyc path under tmp_path (absent until the test writes it)."""
    path = tmp_path / "compile_fx.cpython.pyc"
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec",
        lambda name, *a: SimpleNamespace(cached=str(path)) if name == "torch._inductor.compile_fx" else real(name, *a),
    )  # fmt: skip
    return path


@pytest.mark.parametrize(
    ("exists", "no_writes", "cached"), [(True, True, True), (False, False, True), (False, True, False)]
)
def test_bytecode_counts_as_cached_when_on_disk_or_writable(pyc, monkeypatch, exists, no_writes, cached):
    if exists:
        pyc.write_bytes(b"")
    monkeypatch.setattr(sys, "dont_write_bytecode", no_writes)
    assert bytecode_cached() is cached


def _warnings(capsys, compile: bool, rank: int = 0) -> list[str]:
    model = Transformer(get_preset("gpt-fast-tiny"))
    parallelize(model, LoopConfig(compile=compile, compile_scope="head"), DistInfo(rank=rank), torch.device("cpu"))
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]


def test_compiling_without_cached_bytecode_warns_once_on_the_main_rank(pyc, monkeypatch, capsys):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    (line,) = _warnings(capsys, compile=True)
    assert "torch's bytecode is not cached" in line and "train.compile_scope=head" in line
    assert _warnings(capsys, compile=True, rank=1) == []
    assert _warnings(capsys, compile=False) == []
    pyc.write_bytes(b"")
    assert _warnings(capsys, compile=True) == []
