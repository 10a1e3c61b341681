"""Data and run dirs under attack, round 3: two `data prepare` into one --out at once, prepared shards shared through
the cache and tampered with, a run killed before its config.yaml existed and then resumed, and a run dir that cannot
be written. Each case asserts the exit code, the one error line, and what is left on disk."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_reliability_data_inputs import _PAUSED_PREPARE, TEXTS, jsonl, run_cli, scratch, tok  # noqa: F401 (tok: a fixture)
from training_testing import write_docs

from lmforge.cli import main
from lmforge.data.corpus import prepared_cache

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
prepare = importlib.import_module("lmforge.data.corpus.prepare")
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


# --- 7: prepared shards shared through the cache -------------------------------------------------------------------


def _pretrain_on(capsys, run: Path, corpus: Path) -> list[str]:
    rc, err = cli(capsys, "pretrain", "gpt", f"--run.dir={run}", f"--data.inputs=[{corpus}]",
                  "--data.vocab_size=300", "--train.max_steps=1", *TINY)  # fmt: skip
    assert rc == 0, err
    return err


def _tamper_in_place(path: Path) -> None:
    """Other ids, all inside the vocabulary, written into the file itself (not a new file in its place)."""
    ids = np.fromfile(path, dtype=np.uint16)
    with open(path, "r+b") as f:
        f.write(((ids.astype(np.int64) + 7) % 300).astype(np.uint16).tobytes())


def test_prepared_shards_are_a_runs_own_and_a_tampered_cache_entry_is_never_reused(tmp_path, caches, capsys):
    corpus = write_docs(tmp_path / "docs.jsonl", 6)
    a, b, c, d = (tmp_path / n for n in "abcd")
    assert "preparing token shards in" in "\n".join(_pretrain_on(capsys, a, corpus))
    (entry,) = [p for p in (caches / "prepared").iterdir() if not p.name.startswith(".")]
    good = (a / "data" / "train.bin").read_bytes()
    assert "reusing the token shards" in "\n".join(_pretrain_on(capsys, b, corpus))
    assert (b / "data" / "train.bin").read_bytes() == good

    _tamper_in_place(a / "data" / "train.bin")  # one run's data changed...
    assert (b / "data" / "train.bin").read_bytes() == good  # ...changes no other run's
    assert (entry / "train.bin").read_bytes() == good  # ...nor the cache

    _tamper_in_place(entry / "train.bin")  # the cache entry itself, with ids a run would train on silently
    err = _pretrain_on(capsys, c, corpus)
    assert (
        f"warning: the cached token shards in {entry} are damaged (train.bin: its sha256 is not the one recorded when "
        "it was cached): preparing them again"
    ) in err
    assert any(line.startswith("preparing token shards in") for line in err)
    assert (c / "data" / "train.bin").read_bytes() == good
    assert (b / "data" / "train.bin").read_bytes() == good
    err = _pretrain_on(capsys, d, corpus)  # the entry was made again: reused, without a warning
    assert "reusing the token shards" in "\n".join(err) and not any(x.startswith("warning") for x in err)
    assert (d / "data" / "train.bin").read_bytes() == good


# --- 8: kill -9 before config.yaml exists, then --resume -----------------------------------------------------------


def test_resume_of_a_run_killed_before_its_config_existed_never_takes_another_recipe(tmp_path, caches, capsys):
    corpus = write_docs(tmp_path / "docs.jsonl", 6)
    run = tmp_path / "run"
    own = [f"--run.dir={run}", f"--data.inputs=[{corpus}]", "--data.vocab_size=300", "--train.max_steps=2", *TINY]
    proc = subprocess.Popen([sys.executable, "-c", _PAUSED_PREPARE, "pretrain", "gpt", *own],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENV)  # fmt: skip
    try:
        assert proc.stdout.readline() == "writing\n"  # tokenizer trained, token shards half written
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    tokenizer = run / "tokenizer" / "tokenizer.json"
    made = (tokenizer.read_bytes(), tokenizer.stat().st_ino)
    assert not (run / "config.yaml").exists()

    rc, err = cli(capsys, "--quiet", "pretrain", f"--run.dir={run}", "--resume", "--train.max_steps=1")
    assert (rc, err) == (2, [
        f"error: cannot resume {run}: the run never started (it has no config.yaml and no checkpoint), so there is "
        f"nothing to resume: run the command that started it again, naming its recipe (lmforge pretrain RECIPE "
        f"--run.dir={run} ...)"
    ])  # fmt: skip
    rc, err = cli(capsys, "--quiet", "pretrain", "demo", f"--run.dir={run}", "--resume", "--train.max_steps=1")
    assert (rc, err) == (2, [
        f"error: cannot resume {run}: its tokenizer was trained with other settings (data.inputs {[str(corpus)]!r} "
        "→ [], data.vocab_size 300 → 4096), and a resumed run keeps its tokenizer: name the recipe and options the "
        "run was started with, or start a new run with another --run.dir"
    ])  # fmt: skip
    assert (tokenizer.read_bytes(), tokenizer.stat().st_ino) == made and not (run / "config.yaml").exists()

    rc, err = cli(capsys, "pretrain", "gpt", *own, "--resume")  # the recipe named: it starts, with its own tokenizer
    assert rc == 0 and f"warning: --resume: no checkpoint in {run} yet, starting at step 0" in err
    assert not any("tokenizer of" in line for line in err)  # not trained again
    assert (tokenizer.read_bytes(), tokenizer.stat().st_ino) == made
    assert [p.name for p in run.iterdir() if ".tmp-" in p.name] == []  # the killed prepare's scratch removed
    assert (run / "checkpoints" / "step_2").is_dir()


# --- 16: a run dir that cannot be written --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_run(prepared_docs, tmp_path_factory) -> tuple[Path, list[str]]:
    tokenizer, data = prepared_docs(24)
    run = tmp_path_factory.mktemp("ro") / "run"
    args = ["pretrain", "gpt", f"--data.tokenizer={tokenizer}", f"--data.prepared={data}", "--model.vocab_size=512"]
    args += TINY
    assert main([*args, f"--run.dir={run}", "--train.max_steps=2", "--train.save_every=2", "--quiet"]) == 0
    return run, args


def _listing(d: Path) -> dict[str, tuple[int, float]]:
    return {str(p.relative_to(d)): (p.stat().st_size, p.stat().st_mtime) for p in sorted(d.rglob("*"))}


def _read_only(d: Path, *command: str) -> subprocess.CompletedProcess:
    """`lmforge COMMAND` with `d` a read-only bind mount (EROFS, which even root gets), in a mount namespace of its
    own so that nothing outside the process sees it."""
    mount = f"mount --bind '{d}' '{d}' && mount -o remount,ro,bind '{d}' '{d}' && exec \"$@\""
    cmd = ["unshare", "--map-root-user", "--mount", "sh", "-c", mount, "sh", sys.executable, "-m", "lmforge.cli"]
    return subprocess.run([*cmd, *command], capture_output=True, text=True, env=ENV, timeout=300)


def _can_mount_read_only(tmp_path: Path) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--map-root-user", "--mount", "sh", "-c",
                            f"mount --bind '{tmp_path}' '{tmp_path}' && mount -o remount,ro,bind '{tmp_path}' "
                            f"'{tmp_path}' && ! touch '{tmp_path}/x' 2>/dev/null"], capture_output=True)  # fmt: skip
    return probe.returncode == 0


def test_a_read_only_run_dir_is_one_line_before_any_work_and_still_reads(finished_run, tmp_path):
    if not _can_mount_read_only(tmp_path):
        pytest.skip("no user and mount namespaces here to mount a dir read-only")
    run, args = finished_run
    before = _listing(run.parent)
    done = _read_only(run, *args, f"--run.dir={run}", "--resume", "--train.max_steps=4", "--quiet")
    assert (done.returncode, done.stderr.splitlines()) == (2, [
        f"error: run dir {run} is not writable (Read-only file system): make it writable, or choose another --run.dir"
    ]), done.stderr  # fmt: skip
    new = tmp_path / "deeper" / "run"
    done = _read_only(tmp_path, *args, f"--run.dir={new}", "--quiet")
    assert (done.returncode, done.stderr.splitlines()) == (2, [
        f"error: cannot create run dir {new}: {tmp_path} is not writable (Read-only file system): choose another "
        "--run.dir"
    ]), done.stderr  # fmt: skip
    text = tmp_path / "text.txt"
    text.write_text("It was the best of times, it was the worst of times.\n" * 4)
    for command in (["generate", str(run), "--prompt", "The", "--max-new-tokens", "4"],
                    ["eval", str(run), "--text", str(text)]):  # fmt: skip
        done = _read_only(run, *command)
        assert done.returncode == 0, done.stderr  # reading a read-only run works
    assert _listing(run.parent) == before and sorted(p.name for p in tmp_path.iterdir()) == ["text.txt"]


def _refuse_new_entries_in(monkeypatch, d: Path) -> None:
    """What the kernel does to a process that is not root in a dir without write permission (chmod 555): making an
    entry there fails with EACCES, while files already there stay writable."""
    real_open, real_mkdir = os.open, os.mkdir

    def in_d(path) -> bool:
        return Path(os.path.abspath(path)).parent == d

    def denied(path):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    def fake_open(path, flags, mode=0o777, *, dir_fd=None):
        if dir_fd is None and flags & os.O_CREAT and in_d(path) and not os.path.lexists(path):
            denied(path)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    def fake_mkdir(path, mode=0o777, *, dir_fd=None):
        if dir_fd is None and in_d(path):
            denied(path)
        return real_mkdir(path, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "mkdir", fake_mkdir)


def test_a_run_dir_without_write_permission_is_one_line_before_any_work(finished_run, tmp_path, capsys,
                                                                         monkeypatch):  # fmt: skip
    run, args = finished_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    before = _listing(tmp_path)
    with monkeypatch.context() as m:
        _refuse_new_entries_in(m, copy)  # its .lock is there, and writable: taking the lock works
        rc, err = cli(capsys, *args, f"--run.dir={copy}", "--resume", "--train.max_steps=4", "--quiet")
    assert (rc, err) == (2, [
        f"error: run dir {copy} is not writable (Permission denied): make it writable, or choose another --run.dir"
    ])  # fmt: skip
    parent = tmp_path / "locked"
    parent.mkdir()
    with monkeypatch.context() as m:
        _refuse_new_entries_in(m, parent)
        rc, err = cli(capsys, *args, f"--run.dir={parent / 'run'}", "--quiet")
    assert (rc, err) == (2, [
        f"error: cannot create run dir {parent / 'run'}: {parent} is not writable (Permission denied): choose "
        "another --run.dir"
    ])  # fmt: skip
    assert _listing(tmp_path) == {**before, "locked": _listing(tmp_path)["locked"]}
    assert list(parent.iterdir()) == []


def test_finetune_resume_of_a_run_that_never_started_is_refused_without_a_recipe(tmp_path, capsys):
    run = tmp_path / "ft"
    run.mkdir()
    rc = main(["finetune", f"--run.dir={run}", "--resume", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.strip().splitlines() == [
        f"error: cannot resume {run}: the run never started (it has no config.yaml and no checkpoint), so there is "
        f"nothing to resume: run the command that started it again, naming its recipe (lmforge finetune RECIPE "
        f"--run.dir={run} ...)"
    ]
    assert sorted(p.name for p in run.iterdir()) == []
