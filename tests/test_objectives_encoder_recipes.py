"""The encoder recipes end to end: the CLI pretrains each on a small corpus with the loss falling; exact resume of
a sentence-pair run; `lmforge.load` of BERT and ELECTRA runs."""

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from encoder_testing import docs
from training_testing import run_main

from lmforge.api import load
from lmforge.checkpoint.read import read_weights
from lmforge.checkpoint.verify import latest_checkpoint

TINY = ["--data.vocab_size=512", "--data.val_fraction=0.2", "--train.batch_size=16", "--train.seq_len=64"]
TINY += ["--train.warmup_steps=3", "--train.lr=5e-3", "--train.log_every=1", "--train.eval_batches=4"]


@pytest.fixture
def run_cli(monkeypatch, capsys, torch_globals) -> Callable[..., subprocess.CompletedProcess]:
    """`run_cli(*args, cwd=...)`: `lmforge ARGS` in this process (lmforge.cli.main, as the `lmforge` script runs it),
    in cwd, on one torch thread (tiny models are fastest that way, above all on a busy machine)."""

    def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
        monkeypatch.chdir(cwd)
        rc, out, err = run_main(capsys, *args)
        return subprocess.CompletedProcess(args, rc, out, err)

    return run


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs(12)), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "recipe, preset, drop",
    [("bert", "bert-tiny", 0.4), ("roberta", "roberta-tiny", 0.5), ("encoder-fast", "encoder-fast-tiny", 0.5),
     ("spanbert", "bert-tiny", 0.4),
     ("albert", "albert-tiny", 0.5), ("electra", "electra-tiny", 8.0)],
)  # fmt: skip
def test_recipe_trains_on_cpu(recipe, preset, drop, corpus, tmp_path, run_cli):
    run = tmp_path / "run"
    res = run_cli(
        "pretrain", recipe, f"--model.preset={preset}", f"--run.dir={run}", f"--data.inputs=[{corpus}]", *TINY,
        "--train.max_steps=40", "--train.eval_every=20", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    rows = metrics(run)
    loss = [r["loss"] for r in rows if "loss" in r]
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    assert len(loss) == 40 and len(val) == 2
    start = sum(loss[:3]) / 3  # ≈ ln(512) = 6.24 for MLM, + ln 2 with NSP/SOP, + 50 ln 2 for ELECTRA
    assert sum(loss[-5:]) / 5 < start - drop, loss
    assert val[-1] < start - drop
    assert (run / "checkpoints" / "step_40" / "model.safetensors").is_file()
    if recipe == "electra":  # `load` returns the discriminator, the generator's weights stay in the checkpoint
        model, tok = load(run)
        assert model.config.rtd_head and not model.config.lm_head and tok is not None
        saved = read_weights(latest_checkpoint(run))
        assert any(k.startswith("generator.") for k in saved)
        assert torch.equal(model.encoder.blocks[1].mlp.up.weight, saved["discriminator.encoder.blocks.1.mlp.up.weight"])
        ids = torch.tensor([tok.encode("It is a truth universally acknowledged.")])
        assert model(ids).rtd_logits.shape == ids.shape
    if recipe == "spanbert":  # `load` returns the encoder, the span-boundary head stays in the checkpoint
        model, _ = load(run)
        saved = read_weights(latest_checkpoint(run))
        assert any(k.startswith("sbo.") for k in saved)
        assert {"mlm_acc", "mlm_loss", "sbo_loss"} <= set([r for r in rows if "loss" in r][-1])  # logged per step
        assert torch.equal(model.encoder.blocks[0].attn.qkv.weight, saved["backbone.encoder.blocks.0.attn.qkv.weight"])
    if recipe in ("bert", "albert"):  # the sentence-pair classifier's numbers carry its task's name
        task, other = ("nsp", "sop") if recipe == "bert" else ("sop", "nsp")
        last = [r for r in rows if "loss" in r][-1]
        assert {f"{task}_loss", f"{task}_acc"} <= set(last) and f"{other}_loss" not in last
    if recipe == "bert":
        model, tok = load(run)
        assert model.config.nsp_head and model(torch.tensor([[2, 40, 41, 3, 42, 3]])).nsp_logits.shape == (1, 2)


def test_sentence_pair_run_resumes_exactly(corpus, tmp_path, run_cli):
    common = [f"--data.inputs=[{corpus}]", "--model.preset=bert-tiny", *TINY, "--train.max_steps=8"]
    common += ["--train.eval_every=100", "--train.save_every=4", "--train.deterministic"]
    full, part = tmp_path / "full", tmp_path / "part"
    res = run_cli("pretrain", "bert", f"--run.dir={full}", *common, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    shutil.copytree(full, part)
    shutil.rmtree(part / "checkpoints" / "step_8")
    res = run_cli("pretrain", "bert", f"--run.dir={part}", "--resume", *common, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    a = [r["loss"] for r in metrics(full) if "loss" in r]
    b = [r["loss"] for r in metrics(part) if "loss" in r]
    assert [r["step"] for r in metrics(part) if "loss" in r] == list(range(1, 9))
    assert a == b  # same pairs, same masks after the restart: loader position and RNG state were restored
