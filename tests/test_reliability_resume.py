"""Never lose a run: SIGKILL at random points (mid-step, mid-evaluation, mid-checkpoint-write, at startup) and
`--resume` reproduce an uninterrupted run bit for bit; a corrupt newest checkpoint falls back to the previous one;
a malicious train state or config is refused without running its payload; compiled and eager checkpoints are
interchangeable."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml

from lmforge.checkpoint.layout import list_checkpoints, step_of
from lmforge.checkpoint.read import read_weights
from lmforge.checkpoint.verify import latest_checkpoint, verify_checkpoint
from lmforge.checkpoint.write import save_checkpoint
from lmforge.cli import main
from lmforge.data.corpus.loader import TokenLoader

TINY = ["--model.preset=gpt-tiny", "--model.vocab_size=512", "--train.batch_size=4", "--train.seq_len=32"]
TINY += ["--train.warmup_steps=3", "--train.log_every=1", "--train.deterministic", "--sample.prompts=[]"]
TINY += ["--train.eval_batches=2"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
PAUSING_CLI = Path(__file__).with_name("pausing_cli.py")  # the CLI with callbacks that pause at loop points
RESUMED = re.compile(r"resumed from (\S+) at step (\d+) \(data position: epoch (\d+), batch (\d+)\)")


pytestmark = pytest.mark.usefixtures("torch_globals")


@pytest.fixture(scope="module")
def prepared(prepared_docs) -> tuple[Path, Path]:
    return prepared_docs(30)


def common(prepared, run: Path, *extra: str) -> list[str]:
    tok, data = prepared
    return ["pretrain", "gpt", f"--run.dir={run}", f"--data.tokenizer={tok}", f"--data.prepared={data}", *TINY, *extra]


def cli(capsys, *args: str) -> tuple[int, str]:
    """Run the CLI in this process → (exit code, stderr)."""
    rc = main(list(args))
    return rc, capsys.readouterr().err


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def train_rows(run: Path) -> list[dict]:
    return [r for r in rows(run) if "loss_hex" in r]


def rewrite_manifest(ckpt: Path) -> None:
    """Make the manifest agree with tampered files, as an attacker who controls the directory could."""
    manifest = json.loads((ckpt / "manifest.json").read_text())
    for rel in manifest["files"]:
        data = (ckpt / rel).read_bytes()
        manifest["files"][rel] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


# --- SIGKILL at random points ----------------------------------------------------------------------------------

KILL_ARGS = ["--train.grad_accum=2", "--train.max_steps=24", "--train.eval_every=6", "--train.save_every=4"]
KILL_ARGS += ["--train.keep_last=10"]


class Attempt:
    """One CLI process, its stderr collected line by line in a thread (so a test can wait for a line)."""

    def __init__(self, args: list[str], cwd: Path, fault: str | None = None) -> None:
        entry = [str(PAUSING_CLI), fault] if fault else ["-m", "lmforge.cli"]
        self.proc = subprocess.Popen(
            [sys.executable, *entry, *args], cwd=cwd, env=ENV, text=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, test, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not test():
            assert self.proc.poll() is None, "the run ended before the kill point:\n" + "\n".join(self.lines[-20:])
            assert time.monotonic() < deadline, "kill point not reached:\n" + "\n".join(self.lines[-20:])
            time.sleep(0.005)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(timeout=60) == -signal.SIGKILL
        self.reader.join(timeout=10)

    def finish(self) -> int:
        rc = self.proc.wait(timeout=300)
        self.reader.join(timeout=10)
        return rc


PROGRESS = re.compile(r"step (\d+)/\d+ ")


def reached(attempt: Attempt, step: int) -> bool:
    """Whether the attempt's progress lines (one per step on stderr) report `step` done."""
    return any(int(m[1]) >= step for m in map(PROGRESS.match, attempt.lines) if m)


def loader_at(data: Path, step: int, grad_accum: int = 2) -> tuple[int, int]:
    """(epoch, batch) of an uninterrupted loader after `step` optimizer steps."""
    loader = TokenLoader(data, "train", seq_len=32, batch_size=4, seed=0)
    for _ in range(step * grad_accum):
        next(loader)
    state = loader.state_dict()
    return state["epoch"], state["batch"]


def test_sigkill_at_random_points_then_resume_equals_uninterrupted_run(prepared, tmp_path):
    tok, data = prepared
    ref, run = tmp_path / "ref", tmp_path / "run"
    reference = Attempt(common(prepared, ref, *KILL_ARGS), tmp_path)
    assert reference.finish() == 0, "\n".join(reference.lines)

    rng = random.Random(20240601)
    ckpts = run / "checkpoints"
    # (kind, fault): "step" kills once the log reaches a random step beyond the newest checkpoint; "startup" after
    # a random delay; "eval" / "checkpoint" at the fault-injection pause inside evaluation / a checkpoint write.
    plan = [("step", None), ("eval", "eval:60"), ("checkpoint", "checkpoint:60"), ("startup", None), ("step", None)]
    resumes: list[tuple[int, int, int]] = []
    for kind, fault in plan:
        newest = max((step_of(c) for c in list_checkpoints(run)), default=0)
        attempt = Attempt(common(prepared, run, *KILL_ARGS, "--resume"), tmp_path, fault)
        if kind == "step":
            target = min(newest + rng.randint(1, 6), 23)
            attempt.wait_for(lambda: reached(attempt, target))  # noqa: B023
        elif kind == "startup":
            time.sleep(rng.uniform(0.2, 1.5))
        else:
            marker = f"pausing 60 s at {kind}"
            attempt.wait_for(lambda: any(line.startswith(marker) for line in attempt.lines))  # noqa: B023
            if kind == "checkpoint":  # the write is under way: its scratch dir exists, its step dir does not
                assert [p.name for p in ckpts.iterdir() if p.name.startswith(".tmp-step_")]
        attempt.kill()
        resumes += [tuple(map(int, m.groups()[1:])) for m in map(RESUMED.search, attempt.lines) if m]

    final = Attempt(common(prepared, run, *KILL_ARGS, "--resume"), tmp_path)
    assert final.finish() == 0, "\n".join(final.lines)
    resumes += [tuple(map(int, m.groups()[1:])) for m in map(RESUMED.search, final.lines) if m]

    # Bit for bit: every step's exact loss, gradient norm, lr and every validation loss.
    a, b = train_rows(ref), train_rows(run)
    assert [r["step"] for r in b] == list(range(1, 25))  # each step once: no gaps, no duplicates
    assert [(r["loss_hex"], r["grad_norm"], r["lr"]) for r in a] == [
        (r["loss_hex"], r["grad_norm"], r["lr"]) for r in b
    ]
    assert [r for r in rows(ref) if "val_loss" in r] == [r for r in rows(run) if "val_loss" in r]
    # Resumed with the data position of an uninterrupted loader at that step (no batch replayed or skipped).
    assert len(resumes) >= 3 and resumes[-1][0] > 0
    for step, epoch, batch in resumes:
        assert (epoch, batch) == loader_at(data, step)
    # The final weights are identical, and the interrupted checkpoint write left nothing behind.
    assert read_weights(latest_checkpoint(ref)).keys() == read_weights(latest_checkpoint(run)).keys()
    for name, t in read_weights(latest_checkpoint(ref)).items():
        assert torch.equal(t, read_weights(latest_checkpoint(run))[name]), name
    assert not [p.name for p in ckpts.iterdir() if p.name.startswith(".")]


# --- a second process, SIGTERM, a dead process's scratch dirs -----------------------------------------------------


def test_a_second_run_on_a_locked_run_dir_is_refused_naming_the_holder(prepared, tmp_path):
    run = tmp_path / "run"
    first = Attempt(common(prepared, run, "--train.max_steps=6"), tmp_path, fault="step@2:60")
    first.wait_for(lambda: any(line.startswith("pausing 60 s at step") for line in first.lines))
    second = subprocess.run(
        [sys.executable, "-m", "lmforge.cli", *common(prepared, run, "--train.max_steps=6", "--resume")],
        cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert second.returncode == 2
    line = second.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: run dir {run} is in use by process {first.proc.pid} on ")
    assert f"pretrain gpt --run.dir={run} --data.tokenizer=" in line  # the holder's command line
    assert line.endswith("--train.max_steps=6): wait for it to finish, or choose another --run.dir")
    first.kill()  # the holder dies: its lock goes with it, and the next run takes the dir over
    third = Attempt(common(prepared, run, "--train.max_steps=6", "--resume"), tmp_path)
    assert third.finish() == 0, "\n".join(third.lines)
    assert [r["step"] for r in train_rows(run)] == [1, 2, 3, 4, 5, 6]


def test_sigterm_saves_at_the_step_boundary_and_resume_is_bit_identical(prepared, tmp_path):
    ref, run = tmp_path / "ref", tmp_path / "run"
    args = ["--train.max_steps=10", "--train.save_every=100", "--train.eval_every=5"]
    reference = Attempt(common(prepared, ref, *args), tmp_path)
    assert reference.finish() == 0, "\n".join(reference.lines)
    attempt = Attempt(common(prepared, run, *args), tmp_path, fault="step@4:3")
    attempt.wait_for(lambda: any(line.startswith("pausing 3 s at step (step 4)") for line in attempt.lines))
    attempt.proc.send_signal(signal.SIGTERM)
    assert attempt.finish() == 143
    assert attempt.lines[-1] == (
        f"error: stopped by SIGTERM at step 4: checkpoint saved in {run}/checkpoints/step_4; continue with "
        f"lmforge pretrain --run.dir={run} --resume"
    )
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_4"]
    final = Attempt(["pretrain", f"--run.dir={run}", "--resume"], tmp_path)  # nothing repeated
    assert final.finish() == 0, "\n".join(final.lines)
    assert [(r["step"], r["loss_hex"]) for r in train_rows(ref)] == [
        (r["step"], r["loss_hex"]) for r in train_rows(run)
    ]
    assert [r for r in rows(ref) if "val_loss" in r] == [r for r in rows(run) if "val_loss" in r]


def test_scratch_dirs_of_a_dead_writer_with_this_process_id_are_removed(tmp_path):
    """Containers run every trainer as PID 1: a scratch dir named with this process's pid but another nonce (or the
    old name without one) was left by a dead predecessor, and the next save removes it."""
    root = tmp_path / "checkpoints"
    stale = [root / f".tmp-step_3-{os.getpid()}", root / f".tmp-step_4-{os.getpid()}-0badf00d"]
    for d in stale:
        d.mkdir(parents=True)
        (d / "config.yaml").write_text("{}")
    save_checkpoint(tmp_path, 5, torch.nn.Linear(2, 2), config={})
    assert [p.name for p in root.iterdir()] == ["step_5"]


# --- corrupt newest checkpoint ---------------------------------------------------------------------------------


def test_truncated_newest_checkpoint_falls_back_to_previous_with_warning(prepared, tmp_path, capsys):
    run = tmp_path / "run"
    args = common(prepared, run, "--train.save_every=2", "--train.eval_every=100")
    assert cli(capsys, *args, "--train.max_steps=4")[0] == 0
    first = train_rows(run)
    weights = run / "checkpoints" / "step_4" / "model.safetensors"
    size = weights.stat().st_size
    with open(weights, "r+b") as f:
        f.truncate(size // 2)
    rc, err = cli(capsys, *args, "--train.max_steps=6", "--resume")
    assert rc == 0, err
    assert f"warning: skipping checkpoint {run / 'checkpoints' / 'step_4'}: model.safetensors has {size // 2} bytes, " \
           f"the manifest says {size}" in err.splitlines()  # fmt: skip
    assert f"resumed from {run / 'checkpoints' / 'step_2'} at step 2 (data position: epoch 0, batch 2)" in err
    again = train_rows(run)
    assert [r["step"] for r in again] == [1, 2, 3, 4, 5, 6]
    assert [r["loss_hex"] for r in again[:4]] == [r["loss_hex"] for r in first]  # steps 3-4 recomputed exactly
    assert verify_checkpoint(run / "checkpoints" / "step_4") is None  # re-saved whole


def test_resume_with_no_checkpoint_yet_starts_fresh(prepared, tmp_path, capsys):
    run = tmp_path / "run"
    rc, err = cli(capsys, *common(prepared, run, "--train.max_steps=2", "--train.eval_every=100"), "--resume")
    assert rc == 0, err
    assert f"warning: --resume: no checkpoint in {run} yet, starting at step 0" in err.splitlines()
    assert [r["step"] for r in train_rows(run)] == [1, 2]


def test_resume_at_or_past_max_steps_says_there_is_nothing_to_train(prepared, tmp_path, capsys):
    run = tmp_path / "run"
    args = common(prepared, run, "--train.save_every=2", "--train.eval_every=100")
    assert cli(capsys, *args, "--train.max_steps=4")[0] == 0
    rc, err = cli(capsys, "pretrain", f"--run.dir={run}", "--resume", "--train.max_steps=3")
    assert rc == 0, err
    note = "note: the run is at step 4 and train.max_steps is 3: nothing to train"
    assert f"{note} (a larger --train.max_steps continues it)" in err.splitlines()
    assert [r["step"] for r in train_rows(run)] == [1, 2, 3, 4]


def test_unfinished_save_of_a_dead_process_is_ignored_and_removed(prepared, tmp_path, capsys):
    run = tmp_path / "run"
    args = common(prepared, run, "--train.save_every=2", "--train.eval_every=100")
    assert cli(capsys, *args, "--train.max_steps=2")[0] == 0
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    scratch = run / "checkpoints" / f".tmp-step_4-{int(dead.stdout)}"
    scratch.mkdir()
    (scratch / "tokenizer.json").write_text("{")  # a torn file of the killed save
    rc, err = cli(capsys, *args, "--train.max_steps=4", "--resume")
    assert rc == 0, err
    assert "resumed from" in err and "step_2 at step 2" in err
    assert not scratch.exists()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_2", "step_4"]


# --- safe loading ------------------------------------------------------------------------------------------------


class Payload:
    """Unpickling this runs code: it creates `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_train_state_of_a_resumed_run_is_refused_and_never_runs(prepared, tmp_path, capsys):
    run = tmp_path / "run"
    args = common(prepared, run, "--train.save_every=2", "--train.eval_every=100")
    assert cli(capsys, *args, "--train.max_steps=2")[0] == 0
    ckpt = run / "checkpoints" / "step_2"
    marker = tmp_path / "pwned"
    torch.save({"step": 2, "rng": Payload(marker)}, ckpt / "train_state.pt")
    rewrite_manifest(ckpt)  # the file passes verification: only the loader stands in the way
    rc, err = cli(capsys, *args, "--train.max_steps=4", "--resume")
    assert rc == 2
    assert err.strip().splitlines()[-1] == (
        f"error: refusing to load {ckpt / 'train_state.pt'}: it holds objects other than tensors and plain data"
    )
    assert "Traceback" not in err and not marker.exists()
    assert [r["step"] for r in train_rows(run)] == [1, 2]


def test_malicious_config_yaml_of_a_checkpoint_is_refused_and_never_runs(prepared, tmp_path, capsys):
    run = tmp_path / "run"
    args = common(prepared, run, "--train.save_every=2", "--train.eval_every=100")
    assert cli(capsys, *args, "--train.max_steps=2")[0] == 0
    ckpt = run / "checkpoints" / "step_2"
    marker = tmp_path / "pwned"
    (ckpt / "config.yaml").write_text(f"model: !!python/object/apply:os.system ['touch {marker}']\n")
    rewrite_manifest(ckpt)
    for command in (args + ["--train.max_steps=4", "--resume"], ["generate", str(run), "--prompt", "The"]):
        rc, err = cli(capsys, *command)
        assert rc == 2
        assert err.strip().splitlines() == [
            f"error: could not read {ckpt / 'config.yaml'}: could not determine a constructor for the tag "
            "'tag:yaml.org,2002:python/object/apply:os.system'"
        ]
        assert not marker.exists()


# --- compiled and eager checkpoints ------------------------------------------------------------------------------


@pytest.mark.slow
def test_checkpoint_of_a_compiled_run_resumes_in_eager(prepared, tmp_path, capsys):
    """A `--train.compile` run's checkpoint has plain keys and continues in eager mode like an eager run's (the
    CUDA-graph mode runs on CPU too, without graphs)."""
    compiled, eager = tmp_path / "compiled", tmp_path / "eager"
    extra = ["--train.save_every=2", "--train.eval_every=100", "--train.max_steps=2"]
    graphs = ["--train.compile", "--train.compile_mode=reduce-overhead"]
    rc, err = cli(capsys, *common(prepared, compiled, *extra), *graphs)
    assert rc == 0, err
    assert cli(capsys, *common(prepared, eager, *extra))[0] == 0
    ckpt = compiled / "checkpoints" / "step_2"
    saved = read_weights(ckpt)
    assert not [k for k in saved if "_orig_mod" in k]
    ref = read_weights(eager / "checkpoints" / "step_2")
    assert saved.keys() == ref.keys()
    for k in saved:  # compiled kernels may round differently, but train the same weights
        torch.testing.assert_close(saved[k], ref[k], rtol=1e-4, atol=1e-5)
    # A resumed run keeps its saved config; train.* may be changed (compile is not frozen): resume the compiled
    # run without compiling.
    resume = [
        "--train.save_every=2",
        "--train.eval_every=100",
        "--train.max_steps=4",
        "--resume",
        "--train.compile=false",
    ]
    rc, err = cli(capsys, *common(prepared, compiled, *resume))
    assert rc == 0, err
    assert cli(capsys, *common(prepared, eager, *resume))[0] == 0
    a, b = train_rows(compiled), train_rows(eager)
    assert [r["step"] for r in a] == [1, 2, 3, 4]
    assert yaml.safe_load((compiled / "config.yaml").read_text())["train"]["compile"] is False
    for x, y in zip(a[2:], b[2:]):
        assert abs(float.fromhex(x["loss_hex"]) - float.fromhex(y["loss_hex"])) < 1e-4


def test_loop_callbacks_name_known_points():
    from lmforge.train.callbacks import Callbacks

    seen: list[int] = []
    cbs = Callbacks()
    cbs.add("eval", seen.append)
    cbs.fire("eval", 7)
    cbs.fire("step", 8)
    assert seen == [7]
    with pytest.raises(ValueError, match="unknown loop point 'evaluate'"):
        cbs.add("evaluate", seen.append)  # type: ignore[arg-type]


# --- continued pretraining -----------------------------------------------------------------------------------------


def test_run_init_continues_from_a_run_with_its_model_and_tokenizer(prepared, tmp_path, capsys):
    """`--run.init=RUN` starts from RUN's latest weights, model config and tokenizer (here with lr 0, so its first
    checkpoint holds exactly those weights); optimizer and steps start afresh; a missing path is one clear line."""
    tok, data = prepared
    first, second = tmp_path / "first", tmp_path / "second"
    rc, err = cli(capsys, *common(prepared, first, "--train.max_steps=2", "--train.save_every=2"))
    assert rc == 0, err
    base = ["pretrain", "gpt", f"--run.dir={second}", f"--data.prepared={data}", *TINY[2:]]  # no preset, no tokenizer
    rc, err = cli(capsys, *base, f"--run.init={first}", "--train.max_steps=1", "--train.save_every=1", "--train.lr=0")
    assert rc == 0, err
    assert f"initialised from {first / 'checkpoints' / 'step_2'}" in err
    saved = yaml.safe_load((second / "config.yaml").read_text())
    assert saved["model"] == yaml.safe_load((first / "config.yaml").read_text())["model"]
    assert saved["model"]["name"] == "gpt-tiny" and saved["data"]["tokenizer"] == str(first / "checkpoints" / "step_2")
    before = read_weights(first / "checkpoints" / "step_2")
    after = read_weights(second / "checkpoints" / "step_1")
    assert before.keys() == after.keys()
    for k in before:
        torch.testing.assert_close(after[k], before[k], rtol=0, atol=0)
    assert [r["step"] for r in train_rows(second)] == [1]
    rc, err = cli(capsys, *base, f"--run.dir={tmp_path / 'third'}", f"--run.init={tmp_path / 'missing'}")
    assert rc != 0 and err.strip().count("\n") == 0 and "run.init" in err and "does not exist" in err
