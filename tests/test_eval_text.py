"""`lmforge eval RUN --text FILE`: perplexity and bits per byte against per-token log-probs computed by hand."""

import dataclasses
import json
import math
import subprocess
import sys

import pytest
import tasks_testing as T
import torch

from lmforge.checkpoint.write import save_checkpoint
from lmforge.errors import LMForgeError
from lmforge.eval.lm import LM
from lmforge.eval.text import score_text

CONTEXT = 16


@pytest.fixture(scope="module")
def gpt():
    tok = T.tokenizer("gpt")
    return T.model("gpt-tiny", tok, seed=5, max_seq_len=CONTEXT).eval(), tok


@torch.no_grad()
def token_logprobs_by_hand(model, full: list[int], stride: int) -> list[float]:
    """log P(full[j] | its window) for j = 1..n, one unbatched forward per token. Token j > CONTEXT is predicted
    by the window ending at CONTEXT + k·stride ≥ j (capped at n), which feeds the CONTEXT tokens before that end."""
    n, out = len(full) - 1, []
    for j in range(1, n + 1):
        end = min(n, CONTEXT if j <= CONTEXT else CONTEXT + stride * math.ceil((j - CONTEXT) / stride))
        start = max(0, end - CONTEXT)
        logits = model(torch.tensor([full[start:end]])).logits[0]
        out.append(float(logits[j - 1 - start].log_softmax(-1)[full[j]]))
    return out


@pytest.mark.parametrize("stride", [CONTEXT, 6, 1])
def test_score_text_equals_per_token_hand_computation(gpt, stride):
    model, tok = gpt
    docs = [T.TEXTS[1][:300], "Four score and seven years ago."]
    want_nll, want_tokens = 0.0, 0
    for d in docs:
        lps = token_logprobs_by_hand(model, [tok.eos_id] + tok.encode(d), stride)
        want_nll -= sum(lps)
        want_tokens += len(lps)
    assert want_tokens > 3 * CONTEXT  # the first document needs several windows
    got = score_text(LM(model, tok, batch_size=3), docs, stride=stride)
    assert (got.tokens, got.documents, got.stride, got.context) == (want_tokens, 2, stride, CONTEXT)
    assert got.nll == pytest.approx(want_nll, abs=1e-3)
    assert got.loss == pytest.approx(want_nll / want_tokens, abs=1e-5)
    assert got.perplexity == pytest.approx(math.exp(want_nll / want_tokens), rel=1e-4)
    n_bytes = sum(len(d.encode()) for d in docs)
    assert got.bytes == n_bytes and got.bits_per_byte == pytest.approx(want_nll / math.log(2) / n_bytes, rel=1e-5)


def test_the_stride_changes_the_context_not_the_tokens_scored(gpt):
    model, tok = gpt
    text = [T.TEXTS[0]]
    full, small = score_text(LM(model, tok), text), score_text(LM(model, tok), text, stride=4)
    assert full.tokens == small.tokens and full.nll != pytest.approx(small.nll, abs=1e-3)


def test_empty_input_and_bad_stride_are_refused(gpt):
    model, tok = gpt
    with pytest.raises(LMForgeError, match="no text to score"):
        score_text(LM(model, tok), ["", ""])
    with pytest.raises(LMForgeError, match="stride must be between 1 and the context length 16, got 17"):
        score_text(LM(model, tok), ["some text"], stride=17)


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "lmforge.cli", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_cli_eval_text_prints_and_writes_the_scores(gpt, tmp_path):
    model, tok = gpt
    run = tmp_path / "run"
    save_checkpoint(run, 10, model, config={"model": dataclasses.asdict(model.config)}, tokenizer=tok)
    text = tmp_path / "austen.txt"
    text.write_text(T.TEXTS[2], encoding="utf-8")
    r = run_cli("eval", str(run), "--text", str(text), "--stride", "8", "--out", str(tmp_path / "ppl.json"))
    assert r.returncode == 0, r.stderr
    want = score_text(LM(model, tok), [T.TEXTS[2]], stride=8)
    got = json.loads((tmp_path / "ppl.json").read_text())
    assert got["tokens"] == want.tokens and got["perplexity"] == pytest.approx(want.perplexity, rel=1e-4)
    assert f"perplexity {want.perplexity:.2f}, {want.bits_per_byte:.4f} bits/byte" in r.stdout

    r = run_cli("eval", str(run), "--text", str(tmp_path / "missing.txt"))
    assert r.returncode != 0 and r.stderr.strip() == f"error: text file not found: {tmp_path / 'missing.txt'}"
    r = run_cli("eval", str(run), "--text", str(text), "--task", "copa-zeroshot")
    assert (
        r.returncode != 0
        and r.stderr.strip() == "error: --text scores the text alone; it takes no --task=copa-zeroshot"
    )
