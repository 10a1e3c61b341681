"""bench/train_parity.py at test size: both sides see identical batches, the twin has its own init, training lowers
both losses on a repeated batch, and --report writes the table and the plot."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import train_parity as tp  # noqa: E402

NANOGPT = Path(__file__).resolve().parents[1] / ".peers" / "nanoGPT"
TINY = ["train.seq_len=32", "train.batch_size=4", "model.max_seq_len=64"]


def run(family: str, impls: list[str], out: Path, corpus: Path, *extra: str) -> int:
    args = ["--family", family, "--impls", *impls, "--size", "tiny", "--data-inputs", str(corpus), "--seeds", "0",
            "--out", str(out), "--val-batches", "2", "--device", "cpu", "--set", *TINY, *extra]  # fmt: skip
    return tp.main(args)


def result(out: Path, family: str, impl: str) -> dict:
    return json.loads((out / f"{family}-{impl}-seed0.json").read_text())


@pytest.mark.parametrize("family", ["gpt2", "bart"])
def test_same_batches_own_init_and_report(family, parity_corpus, tmp_path):
    impls = ["lmforge", "hf"] + (["nanogpt"] if family == "gpt2" and NANOGPT.is_dir() else [])
    extra = ["--nanogpt", str(NANOGPT)] if "nanogpt" in impls else []
    assert run(family, impls, tmp_path, parity_corpus, "--steps", "4", "--eval-every", "2", *extra) == 0
    runs = {impl: result(tmp_path, family, impl) for impl in impls}
    lm = runs["lmforge"]
    assert len(lm["batch_hash"]) == 4 and len(set(lm["batch_hash"])) == 4  # a new batch every step
    for impl, r in runs.items():
        assert r["batch_hash"] == lm["batch_hash"], impl  # identical training batches
        assert r["val_hash"] == lm["val_hash"], impl  # identical validation batches
        assert r["n_weights"] == lm["n_weights"], impl  # the same architecture...
        assert [s for s, _ in r["val"]] == [0, 2, 4]
        assert r["plateau"] == lm["plateau"] and 0 < r["plateau"] < 20, impl  # the floor of the same targets
    for impl in impls[1:]:  # ...each from its own init: the initial weights (and so the first losses) differ
        assert runs[impl]["init_hash"] != lm["init_hash"]
        assert runs[impl]["val"][0][1] != lm["val"][0][1]

    tp.main(["--report", str(tmp_path)])
    report = (tmp_path / "report.md").read_text()
    assert f"### {family}" in report and "lmforge − hf:" in report and "seed 0: yes" in report
    assert "does not count: a side ends at the unigram plateau" in report  # 4 steps learn no more than frequencies
    assert "no interval (one seed)" in report
    assert "of which" not in report  # a loss of one part has no parts to list
    png = tmp_path / f"parity-{family}.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_training_lowers_both_losses_on_a_repeated_batch(parity_corpus, tmp_path):
    assert run("gpt2", ["lmforge", "hf"], tmp_path, parity_corpus, "--steps", "20", "--eval-every", "20", "--overfit",
               "--set", "train.lr=3e-3", "train.warmup_steps=2") == 0  # fmt: skip
    for impl in ("lmforge", "hf"):
        r = result(tmp_path, "gpt2", impl)
        assert len(set(r["batch_hash"])) == 1
        first, last = r["train_loss"][0], r["train_loss"][-1]
        assert last < first - 1.0, (impl, first, last)


def test_twin_is_built_from_the_config_not_the_weights():
    """The HF twin of a T5 v1.1 config has lmforge's size, its own (untied) output matrix and HF's init."""
    from parity_refs import hf_from_config

    from lmforge.models import Transformer, get_preset

    cfg = get_preset("t5-v1_1-tiny")
    torch.manual_seed(0)
    ours = Transformer(cfg)
    hf = hf_from_config(cfg, ours.state_dict())
    assert type(hf).__name__ == "T5ForConditionalGeneration"
    assert sum(p.numel() for p in hf.parameters()) == sum(p.numel() for p in ours.parameters())
    assert hf.lm_head.weight is not hf.shared.weight
    assert not torch.equal(hf.shared.weight, ours.tok_emb.weight)
    assert hf.shared.weight.std().item() == pytest.approx(1.0, abs=0.1)  # T5's _init_weights: N(0, 1)


def test_bad_input_gets_one_line(tmp_path, capsys):
    assert tp.main(["--family", "gpt2", "--impls", "nanogpt", "--nanogpt", str(tmp_path / "nope")]) == 1
    assert capsys.readouterr().err.strip() == f"error: {tmp_path / 'nope'} does not exist"
    assert tp.main(["--family", "bert", "--impls", "lmforge", "nanogpt", "--out", str(tmp_path)]) == 1
    assert capsys.readouterr().err.strip() == "error: family bert has no reference 'nanogpt' (its references: hf)"
    assert tp.main(["--report", str(tmp_path / "empty")]) == 1
    assert "is not a directory" in capsys.readouterr().err


def test_electra_reports_the_discriminator_metrics_on_both_sides(parity_corpus, tmp_path):
    assert run("electra", ["lmforge", "hf"], tmp_path, parity_corpus, "--steps", "2", "--eval-every", "2") == 0
    for impl in ("lmforge", "hf"):
        evals = result(tmp_path, "electra", impl)["val_metrics"]
        assert [s for s, _ in evals] == [0, 2]
        for _, m in evals:
            assert set(m) == {"mlm_loss", "disc_loss", "disc_acc", "replaced_frac"}, impl
            assert 0 < m["replaced_frac"] < 0.15 and 0 <= m["disc_acc"] <= 1 and m["disc_loss"] > 0, impl
    tp.main(["--report", str(tmp_path)])  # the combined loss's difference, then where it comes from
    report = (tmp_path / "report.md").read_text()
    ours, ref = (result(tmp_path, "electra", impl)["val_metrics"][-1][1] for impl in ("lmforge", "hf"))
    for part in ("disc_loss", "mlm_loss"):
        assert f"  - of which {part}: {ours[part] - ref[part]:+.4f} nats (no interval (one seed))" in report
