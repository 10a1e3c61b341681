"""train.seq_len_schedule: windows cut into shorter pieces at the same tokens per step, the length of each batch
following its own step (prefetched batches included), exact resume across a stage boundary, one-line config errors,
and a tiny CLI run of encoder-fast."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from encoder_testing import prepared as encoder_prepared
from encoder_testing import tokenizer as encoder_tokenizer
from lm_objective_testing import TINY_DECODER, objective, write_corpus

from lmforge.data.corpus.loader import TokenLoader
from lmforge.errors import LMForgeError
from lmforge.objectives import OBJECTIVES
from lmforge.pretraining.config import load_config
from lmforge.pretraining.run import ObjectiveBatches
from lmforge.tokenizers import Tokenizer
from lmforge.train.prefetch import Prefetcher
from lmforge.train.seq_len_schedule import DrawLengths, cut_windows, length_at

B, T = 4, 32
SCHEDULE = [[0.0, 8.0], [0.25, 16.0], [0.5, 32.0]]  # steps 0-1: 8, 2-3: 16, 4-7: 32 of 8


@pytest.fixture(scope="module")
def gpt_data(prepared_docs):
    return prepared_docs(12)


@pytest.fixture(scope="module")
def bert_data(tmp_path_factory):
    tok = encoder_tokenizer()
    return tok, encoder_prepared(tmp_path_factory.mktemp("bert"), tok)


def test_cut_windows_overlap_by_one_token():
    tokens = torch.arange(2 * 9).reshape(2, 9)  # two windows of T = 8 (+1)
    pieces = cut_windows(tokens, 4)
    assert pieces.tolist() == [[0, 1, 2, 3, 4], [4, 5, 6, 7, 8], [9, 10, 11, 12, 13], [13, 14, 15, 16, 17]]
    assert cut_windows(tokens, 8) is tokens
    with pytest.raises(LMForgeError):
        cut_windows(tokens, 3)


def test_length_follows_the_planned_steps_and_grad_accum():
    assert [length_at(SCHEDULE, s, 8) for s in range(8)] == [8, 8, 16, 16, 32, 32, 32, 32]
    assert [length_at(SCHEDULE, s, 4) for s in range(4)] == [8, 16, 32, 32]
    total = [8]
    lengths = DrawLengths(SCHEDULE, grad_accum=2, total=lambda: total[0])
    assert [lengths(n) for n in range(6)] == [8, 8, 8, 8, 16, 16]
    total[0] = 4  # a time budget replans: the stages move with it
    assert [lengths(n) for n in range(6)] == [8, 8, 16, 16, 32, 32]


def _causal_source(gpt_data, seed: int = 3, schedule=SCHEDULE, total: int = 8) -> ObjectiveBatches:
    tok_dir, data = gpt_data
    obj = objective("causal_lm", Tokenizer.load(tok_dir), model=TINY_DECODER, seq_len=T)
    loader = TokenLoader(data, "train", seq_len=T, batch_size=B, seed=1)
    lengths = DrawLengths(schedule, 1, lambda: total) if schedule else None
    return ObjectiveBatches(loader, obj.transform, seed, lengths)


def test_causal_lm_batches_per_step(gpt_data):
    plain, scheduled = _causal_source(gpt_data, schedule=None), _causal_source(gpt_data)
    for step, t in enumerate([8, 8, 16, 16, 32, 32, 32, 32]):
        full, cut = next(plain).data, next(scheduled).data
        assert cut["input_ids"].shape == cut["labels"].shape == (B * T // t, t), step
        assert cut["input_ids"].numel() == B * T  # the same tokens per step
        # Every target is the next token of its input: the pieces of a window put back together are the window.
        assert torch.equal(cut["input_ids"].reshape(B, T), full["input_ids"])
        assert torch.equal(cut["labels"].reshape(B, T), full["labels"])
        assert torch.equal(cut["labels"][:, :-1], cut["input_ids"][:, 1:])


def test_mlm_batches_per_step(bert_data):
    tok, data = bert_data
    cfg = load_config(None, ["--objective.name=mlm", f"--train.seq_len={T}", "--model.arch=encoder"])
    obj = OBJECTIVES.get("mlm")(cfg, tok)
    loader = TokenLoader(data, "train", seq_len=T, batch_size=B, seed=1)
    source = ObjectiveBatches(loader, obj.transform, 5, DrawLengths(SCHEDULE, 1, lambda: 8))
    raw = TokenLoader(data, "train", seq_len=T, batch_size=B, seed=1)
    for step, t in enumerate([8, 8, 16, 16, 32, 32, 32, 32]):
        batch, window = next(source).data, next(raw)
        ids = batch["input_ids"]
        assert ids.shape == batch["labels"].shape == (B * T // t, t), step
        assert ids.numel() == B * T
        # Each piece is framed [CLS] text [SEP]: its text the first t - 2 tokens of its slice of the window.
        originals = torch.where(batch["labels"] >= 0, batch["labels"], ids)
        assert (originals[:, 0] == obj.cls_id).all() and (originals[:, -1] == obj.sep_id).all()
        pieces = cut_windows(window, t)
        assert torch.equal(originals[:, 1:-1], pieces[:, : t - 2])


def _same(a, b) -> bool:
    return a.data.keys() == b.data.keys() and all(torch.equal(a.data[k], b.data[k]) for k in a.data)


@pytest.mark.parametrize("depth", [0, 2])
def test_resume_across_a_stage_boundary_is_exact(gpt_data, depth):
    first = Prefetcher(_causal_source(gpt_data), depth=depth)
    for _ in range(3):  # steps 0-2: the state after step 2 (length 16), the next stage starts at step 4
        next(first)
    state = first.state_dict()
    assert state["draws"] == 3
    rest = [next(first) for _ in range(4)]  # 16, 32, 32, 32
    first.close()
    again = Prefetcher(_causal_source(gpt_data), depth=depth)
    again.load_state_dict(state)
    resumed = [next(again) for _ in range(4)]
    again.close()
    assert [b.data["input_ids"].shape[1] for b in resumed] == [16, 32, 32, 32]
    assert all(_same(a, b) for a, b in zip(rest, resumed))


def _error(*overrides: str) -> str:
    with pytest.raises(LMForgeError) as e:
        load_config(None, ["--train.seq_len=128", *overrides])
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("train.seq_len_schedule"), msg
    return msg


def test_bad_schedules_are_one_line_errors():
    assert "first fraction" in _error("--train.seq_len_schedule=[[0.1,64]]")
    assert "strictly increase" in _error("--train.seq_len_schedule=[[0.0,32],[0.5,64],[0.5,128]]")
    assert "below 1" in _error("--train.seq_len_schedule=[[0.0,64],[1.0,128]]")
    assert "lengths must strictly increase" in _error("--train.seq_len_schedule=[[0.0,64],[0.5,32]]")
    assert "does not divide" in _error("--train.seq_len_schedule=[[0.0,48]]")
    assert "does not divide" in _error("--train.seq_len_schedule=[[0.0,64],[0.5,256]]")
    assert "pair" in _error("--train.seq_len_schedule=[[0.0,64,1]]")
    assert "whole numbers" in _error("--train.seq_len_schedule=[[0.0,64.5]]")
    ok = load_config(None, ["--train.seq_len=128", "--train.seq_len_schedule=[[0.0,64],[0.5,128]]"])
    assert ok.train.seq_len_schedule == [[0.0, 64.0], [0.5, 128.0]]


@pytest.mark.parametrize(
    "objective_args", [["--objective.name=bert"], ["--objective.name=transformer_xl"], ["--objective.name=unilm"],
                       ["--objective.name=roberta", "--objective.inputs=doc_sentences"]],
)  # fmt: skip
def test_objectives_without_packed_windows_are_refused(objective_args):
    msg = _error(*objective_args, "--train.seq_len_schedule=[[0.0,64],[0.5,128]]")
    assert "packed independent windows" in msg
    load_config(None, ["--objective.name=roberta", "--train.seq_len=128", "--train.seq_len_schedule=[[0.0,64]]"])


def test_cli_run_of_encoder_fast_finishes(tmp_path):
    corpus = write_corpus(tmp_path / "docs.jsonl")
    run = tmp_path / "run"
    res = subprocess.run(
        [sys.executable, "-m", "lmforge.cli", "pretrain", "encoder-fast", "--model.preset=encoder-fast-tiny",
         f"--run.dir={run}", f"--data.inputs=[{corpus}]", "--data.vocab_size=512", "--train.max_steps=6",
         "--train.batch_size=4", "--train.seq_len=64", "--train.seq_len_schedule=[[0.0,32]]",
         "--train.log_every=1", "--train.eval_every=6", "--train.eval_batches=2", "--train.warmup_steps=1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len([r for r in rows if "loss" in r]) == 6 and any("val_loss" in r for r in rows)
    saved = (run / "config.yaml").read_text()
    assert "seq_len_schedule" in saved
    assert Path(run / "checkpoints").is_dir()


def test_pretraining_cuts_by_the_loops_planned_steps(gpt_data, tmp_path, torch_globals):
    from lmforge.pretraining.run import Pretraining

    tok_dir, data = gpt_data
    cfg = load_config(
        "gpt", [f"--run.dir={tmp_path / 'run'}", f"--data.prepared={data}", f"--data.tokenizer={tok_dir}",
                "--model.preset=gpt-tiny", f"--train.seq_len={T}", f"--train.batch_size={B}", "--train.max_steps=4",
                "--train.grad_accum=2", "--train.prefetch=0", "--train.seq_len_schedule=[[0.0,8],[0.5,32]]"],
    )  # fmt: skip
    p = Pretraining(cfg)
    try:
        shapes = [tuple(next(p.loop.batches).data["input_ids"].shape) for _ in range(8)]  # 4 steps of 2 micro-batches
        assert shapes == [(B * 4, 8)] * 4 + [(B, T)] * 4
        lengths = p.loop.batches.source.lengths
        assert lengths(6) == 32  # step 3 of 4
        p.loop._set_total(8)  # a replanned run: the full length starts at step 4 of 8
        assert lengths(6) == 8 and lengths(8) == 32
    finally:
        p.lock.release()
