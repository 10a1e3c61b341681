"""A run dir under attack: symbolic links planted at the files a run writes, a missing or corrupt RUN/config.yaml
on --resume, a deleted RUN/.lock while the run is live, and an experiment runner killed with SIGKILL while its arm
trains."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from training_testing import make_prepared, restore_torch_globals

from lmforge import files
from lmforge.cli import main
from lmforge.errors import LMForgeError

TINY = ["--model.preset=gpt-tiny", "--model.vocab_size=512", "--train.batch_size=4", "--train.seq_len=32"]
TINY += ["--train.warmup_steps=2", "--train.log_every=1", "--sample.prompts=[]", "--train.eval_batches=2"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> tuple[Path, Path]:
    return make_prepared(tmp_path_factory.mktemp("prepared"), 30)


@pytest.fixture(autouse=True)
def _torch_globals():
    yield from restore_torch_globals()


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
    from lmforge.finetune_cli import finetune_config
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
