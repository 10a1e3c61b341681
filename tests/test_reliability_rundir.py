"""A run dir under attack: symbolic links planted at the files a run writes, a missing or corrupt RUN/config.yaml
on --resume, a deleted RUN/.lock while the run is live, and an experiment runner killed with SIGKILL while its arm
trains."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from lmforge import files
from lmforge.cli import main
from lmforge.errors import LMForgeError

TINY = ["--model.preset=gpt-tiny", "--model.vocab_size=512", "--train.batch_size=4", "--train.seq_len=32"]
TINY += ["--train.warmup_steps=2", "--train.log_every=1", "--sample.prompts=[]", "--train.eval_batches=2"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


pytestmark = pytest.mark.usefixtures("torch_globals")


@pytest.fixture(scope="module")
def prepared(prepared_docs) -> tuple[Path, Path]:
    return prepared_docs(30)


def pretrain_args(prepared, run: Path, *extra: str) -> list[str]:
    tok, data = prepared
    return ["pretrain", "gpt", f"--run.dir={run}", f"--data.tokenizer={tok}", f"--data.prepared={data}", *TINY, *extra]


def cli(capsys, *args: str) -> tuple[int, str]:
    """Run the CLI in this process → (exit code, stderr)."""
    rc = main(list(args))
    return rc, capsys.readouterr().err


# --- symbolic links planted in a run dir ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", [".lock", "metrics.jsonl", "config.yaml"])
def test_a_link_planted_at_a_run_file_is_refused_and_its_target_untouched(name, prepared, tmp_path, capsys):
    run, outside = tmp_path / "run", tmp_path / "precious.txt"
    outside.write_text("keep me\n")
    run.mkdir()
    (run / name).symlink_to(outside)
    rc, err = cli(capsys, *pretrain_args(prepared, run, "--train.max_steps=2"))
    assert rc == 2
    assert err.strip().splitlines()[-1] == (
        f"error: refusing to write {run / name}: it is a symbolic link (to {outside}); a run writes only its own "
        "files, so remove the link"
    )
    assert outside.read_text() == "keep me\n"
    assert not (run / "checkpoints").exists()


def test_atomic_writes_refuse_a_link_at_the_name_and_never_follow_one_at_the_scratch_name(tmp_path):
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me\n")
    plots = tmp_path / "run" / "plots"
    plots.mkdir(parents=True)
    (plots / "loss.png").symlink_to(outside)
    with pytest.raises(LMForgeError, match=r"refusing to write .*loss\.png: it is a symbolic link"):
        files.write_atomic(plots / "loss.png", b"png")
    # A link planted at the scratch file's name (pid and nonce guessed) is removed, not written through.
    target = plots / "eval.json"
    (plots / f".eval.json.tmp-{os.getpid()}-{files._NONCE}").symlink_to(outside)
    files.write_atomic(target, "{}\n")
    assert target.read_text() == "{}\n" and not target.is_symlink()
    assert outside.read_text() == "keep me\n"
    assert sorted(p.name for p in plots.iterdir()) == ["eval.json", "loss.png"]


# --- a missing or corrupt RUN/config.yaml on --resume ---------------------------------------------------------------


def test_resume_without_a_readable_config_yaml_uses_the_newest_checkpoint_config(prepared, tmp_path, capsys):
    """gpt-tiny, not the demo recipe's gpt-mini: every checkpoint carries the run's config."""
    run = tmp_path / "run"
    rc, err = cli(capsys, *pretrain_args(prepared, run, "--train.max_steps=4", "--train.save_every=2"))
    assert rc == 0, err
    (run / "config.yaml").unlink()
    rc, err = cli(capsys, "pretrain", f"--run.dir={run}", "--resume", "--train.max_steps=6")
    assert rc == 0, err
    assert f"note: {run}/config.yaml is missing: resuming with the config saved in {run}/checkpoints/step_4\n" in err
    assert f"resumed from {run}/checkpoints/step_4 at step 4" in err
    assert yaml.safe_load((run / "config.yaml").read_text())["model"]["name"] == "gpt-tiny"  # written again
    (run / "config.yaml").write_text("model: {name: [gpt-tiny\n")  # torn: invalid YAML
    rc, err = cli(capsys, "pretrain", f"--run.dir={run}", "--resume", "--train.max_steps=8")
    assert rc == 0, err
    assert f"note: {run}/config.yaml is unreadable ({run}/config.yaml: invalid YAML (" in err
    assert f"): resuming with the config saved in {run}/checkpoints/step_6\n" in err
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "lr" in r] == list(range(1, 9))  # one train line a step, on to step 8


def test_a_corrupt_config_yaml_and_no_checkpoint_config_is_one_line(prepared, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("train: {lrr: 1}\n")  # YAML, but not a config
    rc, err = cli(capsys, "pretrain", f"--run.dir={run}", "--resume")
    assert rc == 2
    assert err.strip().splitlines() == [
        f"error: cannot resume {run}: unknown config key 'train.lrr' — did you mean 'train.lr'?, and no checkpoint "
        "holds a config to continue with"
    ]


def test_a_fine_tuning_resume_takes_the_run_config_out_of_its_checkpoint(tmp_path):
    """A fine-tuned checkpoint's config.yaml also holds the backbone and labels, which are not run settings."""
    from lmforge.files import hash_file
    from lmforge.finetuning.resolve import finetune_config
    from lmforge.tasks.config import finetune_to_dict, load_finetune_config

    run = tmp_path / "run"
    cfg = load_finetune_config("demo-sentiment", {"run": {"dir": str(run)}, "train": {"lr": 0.00123}}, init="gpt-tiny")
    ckpt = run / "checkpoints" / "step_2"
    ckpt.mkdir(parents=True)
    saved = {**finetune_to_dict(cfg), "backbone": {"d_model": 64}, "labels": ["neg", "pos"], "adapter_only": False}
    (ckpt / "config.yaml").write_text(yaml.safe_dump(saved))
    size, digest = hash_file(ckpt / "config.yaml")
    (ckpt / "manifest.json").write_text(json.dumps({"files": {"config.yaml": {"size": size, "sha256": digest}}}))
    resumed = finetune_config(None, None, {"run": {"dir": str(run)}}, resume=True)
    assert finetune_to_dict(resumed) == finetune_to_dict(cfg)


# --- RUN/.lock deleted while the run is live ------------------------------------------------------------------------

# The CLI, waiting inside the checkpoint writes of the given steps (scratch dir partly written, nothing published)
# until the test creates the file GO-<step>.
HOLDING_CLI = """
import sys, time
from pathlib import Path
from lmforge.cli import main
from lmforge.train.callbacks import install
go, steps = sys.argv[1], {int(s) for s in sys.argv[2].split(",")}
def hold(step):
    if step in steps:
        print(f"holding checkpoint {step}", file=sys.stderr, flush=True)
        while not Path(f"{go}-{step}").exists():
            time.sleep(0.02)
install("checkpoint", hold)
sys.exit(main(sys.argv[3:]))
"""


class Holding:
    """A CLI run in HOLDING_CLI, its stderr collected line by line in a thread (so the test can wait for a line)."""

    def __init__(self, prepared, run: Path, steps: str) -> None:
        args = pretrain_args(prepared, run, "--train.max_steps=6", "--train.save_every=2")
        cmd = [sys.executable, "-c", HOLDING_CLI, str(run.parent / "go"), steps, *args]
        self.proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(x.rstrip("\n") for x in self.proc.stderr))
        self.reader.start()

    def wait_line(self, start: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [x for x in list(self.lines) if x.startswith(start)]
            if found:
                return found[-1]
            if self.proc.poll() is not None and not self.reader.is_alive():
                break
            time.sleep(0.02)
        self.proc.kill()
        pytest.fail(f"no line {start!r}:\n" + "\n".join(self.lines[-20:]))

    def finish(self) -> int:
        rc = self.proc.wait(timeout=120)
        self.reader.join(timeout=10)
        return rc


def second_run(prepared, run: Path) -> subprocess.CompletedProcess:
    args = pretrain_args(prepared, run, "--train.max_steps=6", "--train.save_every=2", "--resume")
    return subprocess.run([sys.executable, "-m", "lmforge.cli", *args], env=ENV, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def test_a_run_whose_lock_file_another_process_replaced_stops_before_publishing(prepared, tmp_path):
    from lmforge.checkpoint.layout import list_checkpoints
    from lmforge.checkpoint.verify import verify_checkpoint

    run = tmp_path / "run"
    first = Holding(prepared, run, "4")
    first.wait_line("holding checkpoint 4")
    (run / ".lock").unlink()  # a second writer gets in, resumes from step_2 and finishes
    second = second_run(prepared, run)
    assert second.returncode == 0, second.stderr
    assert f"resumed from {run}/checkpoints/step_2 at step 2" in second.stderr
    manifests = {c.name: (c / "manifest.json").read_bytes() for c in list_checkpoints(run)}
    (tmp_path / "go-4").touch()  # the first one goes on: it must not publish over the second's step_4
    assert first.finish() == 2
    assert first.lines[-1] == (
        f"error: run dir {run} is no longer this process's: {run}/.lock was deleted or replaced while the run held "
        "it; checkpoint step_4 was not saved, so that two processes never write one run dir"
    )
    assert {c.name: (c / "manifest.json").read_bytes() for c in list_checkpoints(run)} == manifests
    assert all(verify_checkpoint(c) is None for c in list_checkpoints(run))
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_2", "step_4", "step_6"]  # no scratch


def test_a_deleted_lock_file_is_taken_again_at_the_next_checkpoint(prepared, tmp_path):
    run = tmp_path / "run"
    first = Holding(prepared, run, "2,4")
    first.wait_line("holding checkpoint 2")
    (run / ".lock").unlink()
    (tmp_path / "go-2").touch()
    warning = first.wait_line("warning: ", timeout=30)  # step_2 is published with the lock taken again
    assert warning == f"warning: {run}/.lock was deleted while this run held it: locked again"
    first.wait_line("holding checkpoint 4")
    second = second_run(prepared, run)
    assert second.returncode == 2
    refusal = second.stderr.strip().splitlines()[-1]
    assert refusal.startswith(f"error: run dir {run} is in use by process {first.proc.pid} on ")
    (tmp_path / "go-4").touch()
    assert first.finish() == 0, "\n".join(first.lines[-20:])


# --- an experiment runner killed with SIGKILL while an arm trains ---------------------------------------------------

RUNNER = """
import json, sys
from pathlib import Path
from lmforge.experiments.arms import Arm
from lmforge.experiments.runner import check_all_finished, run_arms
arm = Arm("pretrain/a", Path(sys.argv[1]), "gpt", json.loads(sys.argv[2]), max_steps=int(sys.argv[3]))
results = run_arms([arm], poll_s=0.1)
check_all_finished(results)
print(results[0].state, flush=True)
"""


def arm_overrides(prepared) -> dict:
    tok, data = prepared
    return {"data.tokenizer": str(tok), "data.prepared": str(data), "model.preset": "gpt-tiny",
            "model.vocab_size": 512, "train.batch_size": 4, "train.seq_len": 32, "train.warmup_steps": 2,
            "train.log_every": 1, "train.save_every": 5, "train.eval_batches": 2, "sample.prompts": []}  # fmt: skip


def runner(prepared, run: Path, max_steps: int) -> subprocess.Popen:
    cmd = [sys.executable, "-c", RUNNER, str(run), json.dumps(arm_overrides(prepared)), str(max_steps)]
    return subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (not yet reaped by init) has stopped
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def wait_until(test, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not test():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_arms_of_a_runner_killed_with_sigkill_stop_with_it_and_a_rerun_finishes(prepared, tmp_path):
    run = tmp_path / "pretrain" / "a"
    first = runner(prepared, run, 100_000)  # far more steps than it could train in the seconds it is given
    lines = lambda: (run / "metrics.jsonl").read_text().count("\n") if (run / "metrics.jsonl").exists() else 0  # noqa: E731
    wait_until(lambda: lines() >= 3, 120, "the arm did not start training")
    arm_pid = json.loads((run / ".lock").read_text())["pid"]
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=30)
    try:
        wait_until(lambda: not alive(arm_pid), 10, "the arm outlived its runner")
    finally:
        if alive(arm_pid):  # an orphan would train on for hours
            os.kill(arm_pid, signal.SIGKILL)
    log = (run / "arm.log").read_text()
    assert "error: stopped by SIGTERM at step" in log  # it saved a checkpoint on the way out
    second = runner(prepared, run, 40)  # a shorter run (train.max_steps may change on resume)
    out, err = second.communicate(timeout=180)
    assert second.returncode == 0, err
    assert out.strip() == "finished"
    assert "resuming pretrain/a" in err
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "lr" in r] == list(range(1, 41))  # no step lost or repeated


def test_a_rerun_waits_for_a_live_arm_it_did_not_start_instead_of_failing(prepared, tmp_path, capsys):
    """An orphan arm (of a runner killed where arms could outlive it) still trains in the run dir: the rerun waits
    for it, then finds the run finished."""
    from lmforge.experiments.arms import Arm, arm_command
    from lmforge.experiments.runner import run_arms

    arm = Arm("pretrain/a", tmp_path / "pretrain" / "a", "gpt", arm_overrides(prepared), max_steps=30)
    arm.run_dir.mkdir(parents=True)
    orphan = subprocess.Popen(arm_command(arm), env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(lambda: (arm.run_dir / "metrics.jsonl").exists(), 120, "the orphan did not start training")
    [result] = run_arms([arm], poll_s=0.1)
    err = capsys.readouterr().err
    assert orphan.wait(timeout=60) == 0
    assert f"pretrain/a: waiting for process {orphan.pid} on " in err
    assert result.state == "skipped" and result.final["step"] == 30, result.error
