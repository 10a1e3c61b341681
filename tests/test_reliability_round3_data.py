"""Data and run dirs under attack, round 3: two `data prepare` into one --out at once, prepared shards shared through
the cache and tampered with, a run killed before its config.yaml existed and then resumed, and a run dir that cannot
be written. Each case asserts the exit code, the one error line, and what is left on disk."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from test_reliability_data_inputs import TEXTS, jsonl, run_cli, scratch, tok  # noqa: F401 (tok: a fixture)

from lmforge.cli import main
from lmforge.data import prepared_cache

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
TINY = ["--model.preset=gpt-tiny", "--train.batch_size=2", "--train.seq_len=32", "--train.eval_batches=1"]
TINY += ["--sample.prompts=[]", "--train.warmup_steps=1"]

pytestmark = pytest.mark.usefixtures("torch_globals")


def cli(capsys, *args: str) -> tuple[int, list[str]]:
    """(exit code, stderr lines) of `lmforge ARGS` in this process; never a traceback."""
    rc = main(list(args))
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err
    return rc, err.strip().splitlines()


@pytest.fixture
def caches(tmp_path: Path, monkeypatch) -> Path:
    """Tokenizer and prepared-shard caches of this test only (also for the CLI processes it starts)."""
    monkeypatch.setenv("LMFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(prepared_cache.ENV_VAR, str(tmp_path / "cache" / "prepared"))
    return tmp_path / "cache"


# --- 6: two `data prepare` into one --out at once ------------------------------------------------------------------

_HELD_PREPARE = """
import importlib, pathlib, sys, time
prepare = importlib.import_module("lmforge.data.prepare")
tokenize = prepare._tokenize_into
def held(*args):
    print("tokenizing", flush=True)
    while not pathlib.Path(sys.argv[1]).exists():
        time.sleep(0.05)
    return tokenize(*args)
prepare._tokenize_into = held
from lmforge.cli import main
sys.exit(main(sys.argv[2:]))
"""


def test_a_second_prepare_into_an_out_being_prepared_is_refused(tmp_path, tok, capsys):  # noqa: F811
    first, second = jsonl(tmp_path / "a.jsonl", TEXTS), jsonl(tmp_path / "b.jsonl", TEXTS[:4])
    parent, release = tmp_path / "data", tmp_path / "release"
    out = parent / "out"
    args = ["data", "prepare", "--tokenizer", str(tok), "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-c", _HELD_PREPARE, str(release), *args, str(first)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)  # fmt: skip
    try:
        assert proc.stdout.readline() == "tokenizing\n"  # the first holds --out, mid-prepare
        before = scratch(parent)
        rc, err = run_cli(capsys, *args, str(second))
        assert rc == 2 and len(err) == 1, err
        holder = rf"process {proc.pid} on {re.escape(socket.gethostname())} \(started [^)]+\)"
        assert re.fullmatch(rf"error: {re.escape(str(out))} is being prepared by {holder}: wait for it to finish, or "
                            r"choose another --out", err[0]), err[0]  # fmt: skip
        assert scratch(parent) == before and not out.exists()  # the refused one wrote nothing
        release.touch()
        assert proc.wait(timeout=120) == 0, proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
    meta = json.loads((out / "meta.json").read_text())
    assert meta["train"]["n_docs"] + meta["val"]["n_docs"] == len(TEXTS)  # the first's data, not replaced
    assert run_cli(capsys, *args, str(second))[0] == 0  # once it is done, a new prepare replaces it (as documented)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["train"]["n_docs"] + meta["val"]["n_docs"] == 4
    assert sorted(p.name for p in parent.iterdir()) == ["out"]  # no lock or scratch left behind
