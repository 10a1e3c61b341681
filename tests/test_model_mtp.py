"""Multi-token prediction heads: they leave the model's logits and generations unchanged, see only what their depth
allows, and the parallel heads are independent while the sequential depths chain."""

import pytest
import torch

from lmforge.errors import LMForgeError
from lmforge.models import ModelConfig, Transformer, get_preset
from lmforge.models.generate import decoding_steps, sample

TINY = dict(arch="decoder", vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=32)


def build(**kw) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(**{**TINY, **kw})).eval()


@pytest.mark.parametrize("sequential", [False, True])
def test_heads_leave_logits_and_generation_unchanged(sequential):
    plain = build()
    with_heads = build(mtp_heads=2, mtp_sequential=sequential)
    trunk = plain.state_dict()
    own = with_heads.state_dict()
    assert set(own) - set(trunk) and all(k.startswith("mtp.") for k in set(own) - set(trunk))
    for name, t in trunk.items():  # the heads are registered last: the trunk initialises identically
        assert torch.equal(t, own[name]), name
    ids = torch.randint(0, 64, (3, 12))
    assert torch.equal(plain(ids).logits, with_heads(ids).logits)
    assert with_heads(ids).mtp_logits is None  # heads run only when asked
    outs = [sample(decoding_steps(m, ids), max_new_tokens=10, temperature=0.0) for m in (plain, with_heads)]
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("sequential, head", [(False, "block"), (False, "linear"), (True, "block")])
def test_depth_k_sees_tokens_up_to_its_horizon_and_never_its_target(sequential, head):
    model = build(mtp_heads=3, mtp_sequential=sequential, mtp_head=head)
    ids = torch.randint(0, 64, (1, 16))
    base = model(ids, mtp=True).mtp_logits
    assert [tuple(x.shape) for x in base] == [(1, 15, 64), (1, 14, 64), (1, 13, 64)]
    for j in range(16):
        changed = ids.clone()
        changed[0, j] = (changed[0, j] + 1) % 64
        out = model(changed, mtp=True).mtp_logits
        for k in (1, 2, 3):
            # Parallel heads read the trunk at position t (tokens <= t); sequential depth k also embeds token t + k.
            horizon = k if sequential else 0
            moved = (out[k - 1][0] - base[k - 1][0]).abs().amax(-1) > 1e-6  # (T - k,) positions that changed
            t = torch.arange(16 - k)
            assert torch.equal(moved, t + horizon >= j), (j, k)  # target t + k + 1 > t + horizon: never seen


def test_parallel_heads_are_independent_and_sequential_depths_chain():
    ids = torch.randint(0, 64, (2, 10))
    for sequential in (False, True):
        model = build(mtp_heads=2, mtp_sequential=sequential)
        before = model(ids, mtp=True).mtp_logits
        with torch.no_grad():
            model.mtp.blocks[0].mlp.up.weight.mul_(3.0)  # perturb depth 1 only
        after = model(ids, mtp=True).mtp_logits
        assert not torch.allclose(before[0], after[0])
        assert torch.allclose(before[1], after[1]) != sequential


def test_presets_and_bad_configs():
    assert get_preset("gpt-mtp-tiny").mtp_heads == 2 and not get_preset("gpt-mtp-tiny").mtp_sequential
    assert get_preset("llama-mtp-tiny").mtp_sequential
    with pytest.raises(LMForgeError, match="model.mtp_heads needs a causal decoder with an LM head"):
        ModelConfig(**{**TINY, "arch": "encoder", "mtp_heads": 2}).validate()
    with pytest.raises(LMForgeError, match="model.mtp_heads must be >= 0, got -1"):
        ModelConfig(**{**TINY, "mtp_heads": -1}).validate()
    with pytest.raises(LMForgeError, match="has no multi-token prediction heads"):
        build()(torch.zeros(1, 4, dtype=torch.long), mtp=True)
