"""Packing instruction examples: row assignment, restarted positions, document mask, and packed logits equal to
each example run alone."""

from __future__ import annotations

import pytest
import torch
from tasks_testing import model, tokenizer

from lmforge.align.datasets import sentiment_instructions
from lmforge.align.packing import document_mask, pack_batch, pack_groups, packed_hidden, pad_batch, segment_positions
from lmforge.align.sft import sft_loss, token_logprobs
from lmforge.align.templates import Encoded, add_role_tokens, get_template
from lmforge.errors import LMForgeError


def test_pack_groups_first_fit():
    assert pack_groups([5, 4, 3, 2, 6], 8) == [[0, 2], [1, 3], [4]]
    with pytest.raises(LMForgeError, match="example 1 has 9 tokens, more than the packed sequence length 8"):
        pack_groups([3, 9], 8)


def test_positions_and_mask_follow_segments():
    seg = torch.tensor([[1, 1, 1, 2, 2, 3, 0, 0]])
    assert segment_positions(seg).tolist() == [[0, 1, 2, 0, 1, 0, 0, 0]]
    m = document_mask(seg)[0, 0]
    assert m.shape == (8, 8)
    assert m[4].tolist() == [False, False, False, True, True, False, False, False]
    assert m[2].tolist() == [True, True, True, False, False, False, False, False]
    assert m[7].tolist() == [False] * 6 + [True, True]  # padding sees earlier padding only (finite rows)


def test_pack_batch_layout():
    ex = [Encoded([1, 2, 3], [-100, 2, 3]), Encoded([4, 5], [4, 5]), Encoded([6, 7, 8, 9], [-100, -100, 8, 9])]
    b = pack_batch(ex, seq_len=6, pad_id=0)
    assert b["input_ids"].tolist() == [[1, 2, 3, 4, 5, 0], [6, 7, 8, 9, 0, 0]]
    assert b["segment_ids"].tolist() == [[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 0, 0]]
    assert b["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 0]]
    # An example's first label is never trained: it would be predicted from the previous example's last token.
    assert b["labels"].tolist() == [[-100, 2, 3, -100, 5, -100], [-100, -100, 8, 9, -100, -100]]


@pytest.mark.parametrize(
    ("preset", "kw"),
    [("gpt-tiny", {}), ("llama-tiny", {}), ("gpt-tiny", {"position": "alibi"}), ("gpt-tiny", {"position": "shaw"})],
)
def test_packed_logits_equal_each_example_alone(preset, kw):
    tok = tokenizer("gpt")
    m = model(preset, tok, **kw).eval()
    add_role_tokens(m, tok)
    t = get_template("chat", tok)
    examples = [t.encode(c, 60) for c in sentiment_instructions("dev", 7)]
    b = pack_batch(examples, seq_len=128, pad_id=tok.pad_id)
    assert b["input_ids"].shape[0] < len(examples)  # several examples share a row
    with torch.no_grad():
        packed = m.logits(packed_hidden(m, b["input_ids"], b["segment_ids"], b["position_ids"]))
        seg = b["segment_ids"]
        checked = 0
        for r in range(seg.shape[0]):
            for s in seg[r].unique().tolist():
                if s == 0:
                    continue
                idx = (seg[r] == s).nonzero().squeeze(-1)
                alone = m(b["input_ids"][r, idx][None]).logits[0]
                torch.testing.assert_close(packed[r, idx], alone, atol=1e-5, rtol=1e-5)
                checked += 1
    assert checked == len(examples)


def test_packed_and_padded_losses_agree():
    tok = tokenizer("gpt")
    m = model("llama-tiny", tok).eval()
    t = get_template("alpaca", tok)
    examples = [t.encode(c, 200) for c in sentiment_instructions("dev", 6)]
    padded, packed = pad_batch(examples, tok.pad_id), pack_batch(examples, 600, tok.pad_id)
    with torch.no_grad():
        lp_pad, lp_pack = token_logprobs(m, padded), token_logprobs(m, packed)
        # Same response tokens scored with the same log-probabilities, however the batch is laid out.
        torch.testing.assert_close(lp_pad.sum(), lp_pack.sum(), atol=1e-4, rtol=1e-5)
        assert int((padded["labels"] != -100).sum()) == int((packed["labels"] != -100).sum())
        torch.testing.assert_close(sft_loss(m, padded).loss, sft_loss(m, packed).loss, atol=1e-5, rtol=1e-5)


def test_packing_refuses_non_causal_models():
    tok = tokenizer("bert")
    m = model("bert-tiny", tok)
    ids = torch.ones(1, 4, dtype=torch.long)
    with pytest.raises(LMForgeError, match="packing needs a causal decoder, got arch 'encoder'"):
        packed_hidden(m, ids, ids, ids)
