"""XLNet two-stream attention: parity of both streams with transformers' XLNetLMHeadModel / XLNetModel for the same
perm_mask and target_mapping (with segments, padding and memory); the query stream never sees its own content;
the attention masks follow the factorisation order; the converter round-trips."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers
from model_testing import ATOL, V, save_hf, tiny
from xl_testing import boost_relative

from lmforge.models.hf import export_hf, import_hf
from lmforge.models.recurrence import stream_masks
from lmforge.objectives.xlnet import permutation_mask, sample_order

B, T, P = 3, 10, 4


def _hf_xlnet(tmp_path, head: bool = True):
    torch.manual_seed(0)
    cfg = transformers.XLNetConfig(
        vocab_size=V, d_model=32, n_layer=2, n_head=4, d_inner=64, mem_len=7, dropout=0.0, pad_token_id=0
    )
    hf = boost_relative((transformers.XLNetLMHeadModel if head else transformers.XLNetModel)(cfg))
    save_hf(hf, tmp_path)
    return hf.eval()


def _inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, V, (B, T), generator=g)
    rank = sample_order(B, T)
    targets = rank.argsort(-1)[:, -P:]  # the last P positions of each order
    types = (torch.arange(T)[None, :] >= torch.randint(1, T, (B, 1), generator=g)).long()
    mask = torch.ones(B, T)
    mask[1, 8:] = 0  # padding on one row
    return ids, permutation_mask(rank).float(), targets, types, mask


def test_both_streams_match_transformers_with_segments_padding_and_memory(tmp_path):
    hf = _hf_xlnet(tmp_path)
    ours = import_hf(tmp_path)
    cfg = ours.config
    assert (cfg.arch, cfg.two_stream, cfg.rel_segments, cfg.mem_len) == ("encoder", True, True, 7)
    theirs_mems = ours_mems = None
    with torch.no_grad():
        for seed in range(2):  # the second segment attends to the first one's memory
            ids, perm, targets, types, mask = _inputs(seed)
            mapping = F.one_hot(targets, T).float()  # (B, P, T) target_mapping
            a = hf(ids, attention_mask=mask, perm_mask=perm, target_mapping=mapping, token_type_ids=types,
                   mems=theirs_mems, use_mems=True, output_hidden_states=True)  # fmt: skip
            b = ours(ids, attention_mask=mask, perm_mask=perm, query_positions=targets, token_type_ids=types,
                     mems=ours_mems, use_mems=True, output_hidden_states=True)  # fmt: skip
            # Query stream: transformers' logits are the query stream's at the targets.
            torch.testing.assert_close(b.query_logits, a.logits, atol=ATOL, rtol=0)
            # Content stream, every layer: transformers interleaves (h, g) per layer.
            for h_hf, h in zip(a.hidden_states[0::2], b.hidden_states):
                torch.testing.assert_close(h, h_hf, atol=ATOL, rtol=0)
            theirs_mems, ours_mems = a.mems, b.mems
            assert ours_mems[0].shape == (B, 7, 32)  # the last mem_len of the segment (and memory)


def test_content_stream_of_a_bare_model_matches_xlnet_model(tmp_path):
    hf = _hf_xlnet(tmp_path, head=False)
    ours = import_hf(tmp_path)
    assert not ours.config.lm_head
    ids, perm, _, types, mask = _inputs(5)
    with torch.no_grad():
        a = hf(ids, attention_mask=mask, perm_mask=perm, token_type_ids=types).last_hidden_state
        b = ours(ids, attention_mask=mask, perm_mask=perm, token_type_ids=types).last_hidden_state
        torch.testing.assert_close(b, a, atol=ATOL, rtol=0)
        # Without a permutation mask both see everything (fine-tuning).
        torch.testing.assert_close(ours(ids).last_hidden_state, hf(ids).last_hidden_state, atol=ATOL, rtol=0)


def test_round_trip_lmforge_hf_lmforge_is_exact_and_loads_with_auto_class(tmp_path):
    model = tiny("xlnet-tiny")
    export_hf(model, tmp_path)
    back = import_hf(tmp_path)
    assert model.state_dict().keys() == back.state_dict().keys()
    assert all(torch.equal(v, back.state_dict()[k]) for k, v in model.state_dict().items())
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(hf).__name__ == "XLNetLMHeadModel"
    ids, perm, targets, _, _ = _inputs(1)
    with torch.no_grad():
        a = hf(ids, perm_mask=perm, target_mapping=F.one_hot(targets, T).float()).logits
        torch.testing.assert_close(
            model(ids, perm_mask=perm, query_positions=targets).query_logits, a, atol=ATOL, rtol=0
        )


@torch.no_grad()
def test_query_stream_never_sees_its_own_content():
    """Changing the token at a target leaves its query-stream output unchanged (it is what is predicted), and so
    does changing tokens later in the order; changing an earlier token changes it. The content stream at the
    target does see its own token."""
    model = boost_relative(tiny("xlnet-tiny"))
    ids = torch.randint(4, V, (1, T))
    rank = sample_order(1, T)
    perm = permutation_mask(rank)
    target = int(rank.argsort(-1)[0, T // 2])  # a position in the middle of the order
    later = int(rank.argsort(-1)[0, -1])
    earlier = int(rank.argsort(-1)[0, 0])
    q = torch.tensor([[target]])

    def run(x):
        out = model(x, perm_mask=perm, query_positions=q)
        return out.query_hidden_state[0, 0], out.last_hidden_state[0, target]

    g0, h0 = run(ids)
    for pos, query_changes in ((target, False), (later, False), (earlier, True)):
        x = ids.clone()
        x[0, pos] = (x[0, pos] + 1 - 4) % (V - 4) + 4
        g, h = run(x)
        assert (not torch.allclose(g, g0, atol=1e-6)) == query_changes, pos
        if pos == target:
            assert not torch.allclose(h, h0, atol=1e-6)


def test_attention_masks_follow_the_factorisation_order():
    """For thousands of sampled orders: the query stream of position i sees j iff j comes before i; the content
    stream also sees itself; memory is visible to all."""
    n, M = 2000, 3
    rank = sample_order(n, T)
    content, query = stream_masks(n, T, M, False, None, permutation_mask(rank), torch.device("cpu"))
    before = rank[:, None, :] < rank[:, :, None]  # [b, i, j]: j precedes i
    assert torch.equal(query[:, :, M:], before)
    assert torch.equal(content[:, :, M:], before | torch.eye(T, dtype=torch.bool))
    assert bool(content[:, :, :M].all()) and bool(query[:, :, :M].all())
    # A position at step t of the order sees exactly t others (query stream).
    assert torch.equal(query[:, :, M:].sum(-1), rank)
    # The order is uniform: every position is equally likely at every step (n / T per cell).
    counts = F.one_hot(rank, T).sum(0).float()  # (position, step)
    assert (counts - n / T).abs().max() < 5 * (n / T * (1 - 1 / T)) ** 0.5


@pytest.mark.parametrize("position", [0, 9])
def test_first_target_without_context_attends_uniformly_and_stays_finite(position):
    """A query whose row is fully masked (the first of the order, no memory) gets a finite output."""
    model = tiny("xlnet-tiny")
    rank = torch.arange(T)
    rank[[0, position]] = rank[[position, 0]]  # `position` comes first in the order
    rank = rank[None]
    out = model(
        torch.randint(4, V, (1, T)), perm_mask=permutation_mask(rank), query_positions=torch.tensor([[position]])
    )
    assert torch.isfinite(out.query_logits).all()
