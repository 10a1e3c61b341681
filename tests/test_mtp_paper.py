"""Multi-token prediction as Gloeckle et al. 2024 §2 define it and their released code builds it (llama/model.py of
facebookresearch multi-token-prediction): a shared trunk f_s (every decoder block but the last) gives z; n heads, each
one transformer layer, read z independently (f_h1 is the last block, the others `extra_heads`); the shared
unembedding f_u (final norm, then the output matrix) maps each head to the logits of token t + i; the loss sums the
n cross-entropies (eq. 2); inference uses f_h1 alone."""

import pytest
import torch
import torch.nn.functional as F
from lm_objective_testing import objective, tokenizer

from lmforge.models import Transformer, get_preset
from lmforge.models.generate import decoding_steps, sample
from lmforge.models.layers import AttnInputs, Block

SIZE = dict(vocab_size=96, d_model=32, n_heads=4, d_ff=64, max_seq_len=64, dropout=0.0)
FAMILIES = {
    "gpt2": ("gpt-mtp-tiny", {}),  # learned positions, LayerNorm, tied unembedding
    "llama": ("llama-mtp-tiny", {"mtp_sequential": False}),  # RoPE, RMSNorm, SwiGLU, untied unembedding
}


def build(family: str, n_layers: int = 3, extra: int = 2, **kw) -> Transformer:
    name, fields = FAMILIES[family]
    torch.manual_seed(0)
    cfg = get_preset(name, **{**SIZE, **fields, "n_layers": n_layers, "mtp_heads": extra, **kw})
    return Transformer(cfg).eval()


def reference_logits(model: Transformer, ids: torch.Tensor) -> torch.Tensor:
    """The reference forward with return_all_heads=True: (B, T, n, V), head i predicting token t + i + 1."""
    dec, T = model.decoder, ids.shape[1]
    pos = torch.arange(T)
    inp = AttnInputs(None, True, pos, pos, pos)  # a plain causal mask, as the reference's `mask`
    last = dec.n_layers - 1
    h = dec.embed(model.tok_emb(ids), pos, None)
    for i, layer in enumerate(dec.blocks[:-1]):  # the trunk: self.layers[:-1]
        h = layer(h, inp, i)
    h_trunk = h
    heads = [dec.blocks[-1], *model.mtp.blocks]  # prediction_heads = [self.layers[-1]] + list(self.extra_heads)
    latents = [layer(h_trunk, inp, last) for layer in heads]
    h = dec.final_norm(torch.stack(latents, dim=-2))  # (B, T, n, d): one shared norm
    return F.linear(h, model.lm_head.weight)  # one shared output matrix (neither preset has a head bias)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_heads_are_layers_on_the_trunk_output_not_a_chain(family):
    model = build(family)
    assert len(model.decoder.blocks) == 3 and len(model.mtp.blocks) == 2
    assert all(type(b) is Block for b in model.mtp.blocks)
    # Nothing besides the layers: f_u's norm and output matrix are the shared ones.
    assert all(name.startswith("blocks.") for name, _ in model.mtp.named_parameters())
    seen: dict[str, torch.Tensor] = {}

    def keep(name):
        return lambda mod, args, out: seen.update({f"{name}.in": args[0], f"{name}.out": out})

    hooks = [model.decoder.blocks[i].register_forward_hook(keep(f"trunk{i}")) for i in (0, 1)]
    hooks.append(model.decoder.blocks[2].register_forward_hook(keep("head1")))
    hooks += [b.register_forward_hook(keep(f"head{k + 2}")) for k, b in enumerate(model.mtp.blocks)]
    model(torch.randint(0, 96, (2, 12)), mtp=True)
    for h in hooks:
        h.remove()
    z = seen["trunk1.out"]  # the trunk's output: two layers fewer than the three the model holds in all
    for head in ("head1", "head2", "head3"):
        torch.testing.assert_close(seen[f"{head}.in"], z, rtol=0, atol=0)
    assert not torch.allclose(seen["head3.in"], seen["head2.out"])  # head 3 does not read head 2


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_follow_the_reference_forward(family):
    model = build(family)
    ids = torch.randint(0, 96, (2, 12))
    ref = reference_logits(model, ids)  # (2, 12, 3, V)
    out = model(ids, mtp=True)
    torch.testing.assert_close(out.logits, ref[:, :, 0], rtol=1e-5, atol=1e-5)  # f_h1: the next token
    assert len(out.mtp_logits) == 2
    for k, logits in enumerate(out.mtp_logits, start=1):  # head k + 1: token t + k + 1, in-window positions
        torch.testing.assert_close(logits, ref[:, : 12 - k, k], rtol=1e-5, atol=1e-5)
    # Inference is the reference's return_all_heads=False: f_h1 alone.
    torch.testing.assert_close(model(ids).logits, ref[:, :, 0], rtol=1e-5, atol=1e-5)
    greedy = sample(decoding_steps(model, ids), max_new_tokens=1, temperature=0.0)
    assert torch.equal(greedy[:, -1], ref[:, -1, 0].argmax(-1))


def test_the_next_token_model_is_a_plain_decoder_of_n_layers():
    """Without its extra heads the model is a plain decoder: its weights load into one and compute the same."""
    model = build("gpt2", n_layers=3, extra=2)
    plain = build("gpt2", n_layers=3, extra=0)
    own = {k: v for k, v in model.state_dict().items() if not k.startswith("mtp.")}
    plain.load_state_dict(own, strict=True)
    ids = torch.randint(0, 96, (2, 12))
    torch.testing.assert_close(plain(ids).logits, reference_logits(model, ids)[:, :, 0], rtol=1e-5, atol=1e-5)
    # The paper's parameter-matched setup: n_layers = L - mtp_heads holds the blocks of an L-layer baseline.
    baseline = build("gpt2", n_layers=5, extra=0)
    blocks = [m for m in model.modules() if isinstance(m, Block)]
    assert len(blocks) == len(baseline.decoder.blocks) == 5
    assert model.num_params() == baseline.num_params()


def test_loss_is_the_sum_of_the_n_cross_entropies():
    tok = tokenizer("gpt")
    cfg = dict(SIZE, arch="decoder", n_layers=3, mtp_heads=2, vocab_size=tok.vocab_size)
    obj = objective("mtp", tok, model=cfg, seq_len=16)
    torch.manual_seed(4)
    model = Transformer(obj.cfg.model).train()  # the heads run in training; dropout is 0
    tokens = torch.randint(0, tok.vocab_size, (3, 17))
    ref = reference_logits(model, tokens[:, :-1])  # (3, 16, 3, V) from the 16 input tokens
    T, n = 16, 3
    # Eq. (2): -sum_i log P(x_{t+i} | z_{t:1}), each head averaged over the positions whose target is in the window.
    by_hand = sum(F.cross_entropy(ref[:, : T - i, i].flatten(0, 1), tokens[:, i + 1 :].flatten()) for i in range(n))
    out = obj.loss(model, obj.transform(tokens))
    torch.testing.assert_close(out.loss, by_hand, rtol=1e-5, atol=1e-5)
    out.loss.backward()  # every head and the trunk learn from it
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.mtp.parameters())
    assert model.decoder.blocks[0].mlp.up.weight.grad.abs().sum() > 0
