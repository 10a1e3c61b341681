"""Helpers for the model and Hugging Face tests: tiny models with non-trivial weights, padded batches, parity."""

from __future__ import annotations

import torch
import transformers

from lmforge.models import Transformer, get_preset

transformers.logging.set_verbosity_error()

V = 300  # vocabulary of every tiny test model
ATOL = 1e-4


@torch.no_grad()
def perturb(model: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """Add noise to every 1-D parameter: norm weights of exactly 1 and zero biases would hide a dropped tensor."""
    g = torch.Generator().manual_seed(seed)
    # BART's final_logits_bias is a buffer in transformers.
    tensors = [p for _, p in model.named_parameters()]
    tensors += [b for n, b in model.named_buffers() if n.endswith("final_logits_bias")]
    for t in tensors:
        if t.dim() == 1 or t.shape[0] == 1:
            t.add_(0.1 * torch.randn(t.shape, generator=g))
    return model


def tiny(name: str, **kw) -> Transformer:
    """A preset's test size, vocab V, no dropout, eval mode, its family's own init, perturbed 1-D weights."""
    torch.manual_seed(0)
    model = Transformer(get_preset(name, **{"vocab_size": V, "dropout": 0.0, "attn_dropout": 0.0, **kw})).eval()
    return perturb(model)


def padded_batch(pad_id: int, B: int = 3, T: int = 20, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask): row 1 right-padded after 13 tokens with pad_id; real ids avoid the special ids 0..3."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, V, (B, T), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 13:] = 0
    return ids.masked_fill(mask == 0, pad_id), mask


def assert_parity(ours: Transformer, hf, token_types: bool = False) -> None:
    """Hidden states and logits of `ours` and the HF model agree within ATOL on every real (unpadded) position."""
    cfg = ours.config
    ids, mask = padded_batch(cfg.pad_id)
    real = mask.bool()
    kw = {}
    if token_types:
        kw["token_type_ids"] = (torch.arange(ids.shape[1]) >= 8).long().expand_as(ids).contiguous()
    with torch.no_grad():
        if cfg.arch == "encoder-decoder":
            dec, dec_mask = padded_batch(cfg.pad_id, T=11, seed=1)
            dec_mask[:] = 1
            dec_mask[2, 7:] = 0
            out = ours(ids, mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask)
            theirs = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask)
            dreal = dec_mask.bool()
            torch.testing.assert_close(out.logits[dreal], theirs.logits[dreal], atol=ATOL, rtol=0)
            enc = theirs.encoder_last_hidden_state
            torch.testing.assert_close(out.encoder_last_hidden_state[real], enc[real], atol=ATOL, rtol=0)
            return
        out = ours(ids, mask, **kw)
        theirs = hf(input_ids=ids, attention_mask=mask, output_hidden_states=True, **kw)
    torch.testing.assert_close(out.last_hidden_state[real], theirs.hidden_states[-1][real], atol=ATOL, rtol=0)
    if cfg.rtd_head:
        torch.testing.assert_close(out.rtd_logits[real], theirs.logits[real], atol=ATOL, rtol=0)
    if cfg.lm_head:
        lm = getattr(theirs, "prediction_logits", None)  # *ForPreTraining models
        lm = theirs.logits if lm is None else lm
        torch.testing.assert_close(out.logits[real], lm[real], atol=ATOL, rtol=0)
        assert out.logits.std() > 0.05  # logits of real size, so ATOL is a meaningful bound


def save_hf(hf_model, path) -> None:
    """Perturb an HF model's 1-D parameters and save it as an HF dir (config.json + model.safetensors)."""
    perturb(hf_model, seed=2)
    hf_model.eval().save_pretrained(path)
