"""`model(ids, output_hidden_states=True)`: the embedding output and every block's output (n_layers + 1 tensors, the
last after the final norm), equal to transformers' `output_hidden_states` for the twins of every family."""

from __future__ import annotations

import pytest
import torch
from model_testing import ATOL, V, padded_batch, tiny

from lmforge.models.hf import to_hf_model


def _close(ours: tuple, theirs: tuple, real: torch.Tensor | None = None) -> None:
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        if real is not None:  # padded positions are free to differ
            a, b = a[real], b[real]
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


@pytest.mark.parametrize("preset", ["gpt-tiny", "llama-tiny"])
def test_decoder_hidden_states_equal_transformers(preset):
    model = tiny(preset)
    hf = to_hf_model(model)
    ids = torch.randint(0, V, (2, 9))
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
        ref = hf(input_ids=ids, output_hidden_states=True).hidden_states
    assert len(out.hidden_states) == model.config.n_layers + 1
    _close(out.hidden_states, ref)
    assert torch.equal(out.hidden_states[-1], out.last_hidden_state)


@pytest.mark.parametrize("preset", ["bert-tiny", "albert-tiny"])
def test_encoder_hidden_states_equal_transformers(preset):
    model = tiny(preset)
    hf = to_hf_model(model)
    ids, mask = padded_batch(model.config.pad_id)
    with torch.no_grad():
        out = model(ids, mask, output_hidden_states=True)
        ref = hf(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    assert len(out.hidden_states) == model.config.n_layers + 1
    _close(out.hidden_states, ref, mask.bool())


@pytest.mark.parametrize("preset", ["bart-tiny", "t5-tiny"])
def test_encoder_decoder_returns_both_stacks_like_transformers(preset):
    model = tiny(preset)
    hf = to_hf_model(model)
    ids, mask = padded_batch(model.config.pad_id)
    dec = torch.randint(4, V, (3, 7))
    with torch.no_grad():
        out = model(ids, mask, decoder_input_ids=dec, output_hidden_states=True)
        ref = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=dec, output_hidden_states=True)
    n = model.config.n_layers + 1
    assert len(out.encoder_hidden_states) == n and len(out.hidden_states) == model.config.decoder_layers + 1
    _close(out.encoder_hidden_states, ref.encoder_hidden_states, mask.bool())
    _close(out.hidden_states, ref.decoder_hidden_states)


def test_hidden_states_are_off_by_default_and_recurrent_stacks_have_them():
    model = tiny("gpt-tiny")
    assert model(torch.randint(0, V, (1, 4))).hidden_states is None
    xl = tiny("transformer-xl-tiny")
    out = xl(torch.randint(0, V, (1, 4)), output_hidden_states=True)
    assert len(out.hidden_states) == xl.config.n_layers + 1
    assert torch.equal(out.hidden_states[-1], out.last_hidden_state)
