"""bench/: the CPU configuration of the GPU benchmark, its parity check, error handling and synthetic batches."""

import importlib.util
import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from lmforge.errors import LMForgeError
from lmforge.models import Transformer, get_preset

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--preset", "gpt-tiny", "--batch", "2", "--seq", "64", "--steps", "2", "--device", "cpu"]


def _load_run():
    spec = importlib.util.spec_from_file_location("bench_run", ROOT / "bench" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench_run = _load_run()
import model_table  # noqa: E402  (importable once bench/run.py has put bench/ on sys.path)


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """The documented CPU command, as the GPU machine runs it: a script with PYTHONPATH=src, results to $OUT."""
    out = tmp_path_factory.mktemp("bench")
    env = os.environ | {"PYTHONPATH": str(ROOT / "src"), "OUT": str(out)}
    proc = subprocess.run(
        [sys.executable, "bench/run.py", *TINY, "--compile", "off"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    files = sorted(out.glob("*.json"))
    return proc, files, out


def test_cpu_run_writes_both_rows_with_equal_initial_loss(cpu_run):
    proc, files, _ = cpu_run
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(files) == 1
    results = json.loads(files[0].read_text())
    rows = {r["impl"]: r for r in results["rows"]}
    assert sorted(rows) == ["hf", "lmforge"]
    ours, theirs = rows["lmforge"], rows["hf"]
    for r in (ours, theirs):
        assert r["preset"] == "gpt-tiny" and r["compile"] is False and (r["batch"], r["seq_len"]) == (2, 64)
        assert r["tokens_per_s"] > 0 and "error" not in r
        assert r["mfu"] is None and r["peak_mem_gib"] is None  # no peak FLOP/s or CUDA memory on CPU
        # Random init gives near-uniform predictions over the 512-token vocabulary.
        assert abs(r["loss_step0"] - math.log(512)) < 0.05
    assert theirs["hf_attn"] == "sdpa"
    # Identical weights and batch in fp32: identical loss before any update, and after 7 identical AdamW steps.
    assert abs(ours["loss_step0"] - theirs["loss_step0"]) < 1e-4
    assert abs(ours["loss_last"] - theirs["loss_last"]) < 1e-3
    assert ours["loss_last"] < ours["loss_step0"] - 0.1  # the optimizer really stepped
    [ratio] = results["ratios"]
    assert ratio["compile"] is False
    assert ratio["tokens_per_s"] == pytest.approx(ours["tokens_per_s"] / theirs["tokens_per_s"])


def test_cpu_run_counts_flops_as_6n_plus_12ldt(cpu_run):
    _, files, _ = cpu_run
    row = json.loads(files[0].read_text())["rows"][0]
    cfg = get_preset("gpt-tiny")
    model = Transformer(cfg)
    # N: every weight but the position table (the tied token embedding is the LM head's matmul).
    n = model.num_params() - cfg.max_seq_len * cfg.d_model
    assert n == 132864
    assert row["flops_per_token"] == 6 * n + 12 * cfg.n_layers * cfg.d_model * 64


def test_cpu_run_prints_and_writes_markdown_table(cpu_run):
    proc, files, _ = cpu_run
    table = files[0].with_suffix(".md").read_text()
    assert table.strip() in proc.stdout
    lines = [ln for ln in table.splitlines() if ln.startswith("| gpt2")]
    assert len(lines) == 2
    ours = [c.strip() for c in lines[0].split("|")]
    assert ours[2] == "lmforge" and ours[6] == "n/a"  # MFU column on CPU
    ratio = json.loads(files[0].read_text())["ratios"][0]["tokens_per_s"]
    assert ours[-2] == f"{ratio:.3f}"


def test_failing_variant_is_reported_and_the_others_still_run(tmp_path, monkeypatch, capsys):
    def broken(model, batch):
        raise RuntimeError("simulated compile failure\nsecond line")

    spec = model_table.BENCH_MODELS["gpt2"]
    patched = {"gpt2": replace(spec, loss=replace(spec.loss, hf=broken))}
    monkeypatch.setattr(bench_run, "BENCH_MODELS", patched)
    out = tmp_path / "r.json"
    code = bench_run.main([*TINY, "--compile", "off", "--warmup", "1", "--out", str(out)])
    assert code == 1
    rows = {r["impl"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["hf"]["error"] == "RuntimeError: simulated compile failure"
    assert rows["lmforge"]["tokens_per_s"] > 0
    assert "gpt2 hf eager: error: RuntimeError: simulated compile failure" in capsys.readouterr().out
    assert json.loads(out.read_text())["ratios"] == []


def test_missing_preset_is_not_available():
    spec = model_table.BENCH_MODELS["gpt2"]
    with pytest.raises(LMForgeError, match="^bench model 'x' is not available: lmforge has no 'nope' preset$"):
        model_table.require_available("x", replace(spec, preset="nope"))


def test_without_hf_twin_the_lmforge_rows_still_run(tmp_path, monkeypatch):
    def no_converter(model):
        raise LMForgeError("model 'gpt-tiny' has no Hugging Face equivalent")

    patched = {"gpt2": replace(model_table.BENCH_MODELS["gpt2"], build_hf=no_converter)}
    monkeypatch.setattr(bench_run, "BENCH_MODELS", patched)
    out = tmp_path / "r.json"
    assert bench_run.main([*TINY, "--compile", "off", "--warmup", "1", "--out", str(out)]) == 1
    rows = {r["impl"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["lmforge"]["tokens_per_s"] > 0
    assert rows["hf"]["error"] == (
        "no Hugging Face twin for 'gpt-tiny': LMForgeError: model 'gpt-tiny' has no Hugging Face equivalent"
    )


def test_hf_twin_checks_the_model_class():
    torch.manual_seed(0)
    model = Transformer(get_preset("gpt-tiny"))
    twin = model_table.hf_twin(model, "GPT2LMHeadModel")
    assert twin.training and twin.config._attn_implementation == "sdpa"
    torch.testing.assert_close(twin.transformer.wte.weight, model.tok_emb.weight)
    with pytest.raises(LMForgeError, match="^to_hf_model builds GPT2LMHeadModel for 'gpt-tiny', not BertForMaskedLM$"):
        model_table.hf_twin(model, "BertForMaskedLM")


def test_seq_longer_than_the_preset_is_an_error_row(tmp_path):
    args = bench_run.parse_args([*TINY[:4], "--seq", "200", "--device", "cpu", "--out", str(tmp_path / "r.json")])
    [row] = bench_run.bench_model("gpt2", args)
    assert row["error"] == "--seq 200 exceeds preset 'gpt-tiny' max_seq_len 128"


@pytest.mark.parametrize(
    "argv", [["--models", "gpt2", "bert", "--preset", "gpt-tiny"], ["--steps", "0"], ["--models", "llama9"]]
)
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        bench_run.parse_args([*argv, "--device", "cpu"])
    assert e.value.code == 2


def test_masked_lm_batch_masks_15_percent_per_row():
    cfg = get_preset("gpt-tiny")
    batch = model_table.MASKED_LM.make_batch(cfg, 3, 100, torch.Generator().manual_seed(0))
    selected = batch["labels"] != -100
    assert selected.sum(1).tolist() == [15, 15, 15]
    assert (batch["input_ids"][selected] == 103).all()
    assert (batch["labels"][selected] >= 0).all() and (batch["labels"][selected] < cfg.vocab_size).all()


def test_span_corruption_shapes_follow_t5():
    assert model_table.t5_target_len(512) == 114  # T5 pretraining: 568 raw tokens → 512 inputs, 114 targets
    cfg = get_preset("gpt-tiny", decoder_start_id=0)
    batch = model_table.SPAN_CORRUPTION.make_batch(cfg, 2, 512, torch.Generator().manual_seed(0))
    assert batch["input_ids"].shape == (2, 512) and batch["labels"].shape == (2, 114)
    assert (batch["decoder_input_ids"][:, 0] == 0).all()
    assert torch.equal(batch["decoder_input_ids"][:, 1:], batch["labels"][:, :-1])  # shifted right


@pytest.mark.parametrize(("name", "preset"), [("gpt2", "gpt-tiny"), ("bert", "bert-tiny"), ("t5", "t5-tiny")])
def test_lmforge_and_hf_losses_agree_on_tiny_models(name, preset):
    """The bench's two loss functions score the same thing: MLM with the head on masked positions only (lmforge)
    equals HF's all-position logits with ignored labels; span corruption equals T5ForConditionalGeneration's."""
    spec = model_table.BENCH_MODELS[name]
    cfg = get_preset(preset, dropout=0.0, attn_dropout=0.0, **spec.overrides)
    torch.manual_seed(0)
    model = Transformer(cfg).train()
    twin = spec.build_hf(model)
    batch = spec.loss.make_batch(cfg, 2, 48, torch.Generator().manual_seed(1))
    ours, theirs = spec.loss.lmforge(model, batch), spec.loss.hf(twin, batch)
    assert abs(ours.item() - theirs.item()) < 1e-4
    # A real cross-entropy over the vocabulary: near ln V for GPT-2's and BERT's N(0, 0.02) init; T5's tied N(0, 1)
    # embedding gives logits of std ~1 after the d_model^-0.5 rescale, ~ln V + 1/2 (+ sampling spread).
    margin = 1.0 if cfg.init_scheme == "t5" else 0.5
    assert abs(ours.item() - math.log(cfg.vocab_size)) < margin
