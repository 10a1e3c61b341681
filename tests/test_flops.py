"""Training FLOP formulas of the three families: weight counts against the built models, hand-computed totals."""

import pytest
from torch import nn

from lmforge.models import Transformer, get_preset
from lmforge.models.flops import flops_per_token, matmul_weights, model_flops_per_token, training_flops


def counted_weights(model: Transformer) -> dict[str, int]:
    """Matmul weights of the built model by where they apply, from its nn.Linear modules."""
    out = {"encoder": 0, "decoder": 0, "cross_kv": 0, "head": 0}
    enc_dec = model.config.arch == "encoder-decoder"
    for name, m in model.named_modules():
        if not isinstance(m, nn.Linear) or name.startswith(("pooler", "nsp_head", "mtp")):
            continue
        n = m.weight.numel()
        if name.startswith(("lm_head", "head_dense", "rtd_head")):
            out["head"] += n
        elif name.endswith("cross_attn.kv"):
            out["cross_kv"] += n
        elif name.startswith("decoder") and enc_dec:
            out["decoder"] += n
        else:
            out["encoder"] += n
    return out


@pytest.mark.parametrize(
    "preset", ["gpt-tiny", "llama-tiny", "bert-tiny", "electra-tiny", "roberta-tiny", "bart-tiny", "t5-tiny"]
)
def test_weight_groups_match_the_built_model(preset):
    cfg = get_preset(preset)
    w = matmul_weights(cfg)
    assert counted_weights(Transformer(cfg)) == {
        "encoder": w.encoder, "decoder": w.decoder, "cross_kv": w.cross_kv, "head": w.head,
    }  # fmt: skip


def test_albert_sharing_counts_every_layer_application():
    cfg = get_preset("albert-tiny")  # one block shared by 3 layers, factorised 32 -> 64 embeddings
    assert cfg.share_layers and cfg.n_layers == 3
    held = counted_weights(Transformer(cfg))["encoder"]  # the projection and one block
    proj = cfg.embedding_dim * cfg.d_model
    assert matmul_weights(cfg).encoder == proj + 3 * (held - proj)
    assert matmul_weights(cfg) == matmul_weights(get_preset("albert-tiny", share_layers=False))


def test_decoder_flops_are_palm_6n_plus_attention():
    cfg = get_preset("gpt2-124m")
    w = matmul_weights(cfg)
    # GPT-2 small: 12 layers of 4·768² (attention) + 8·768² (MLP) weights, tied 50257×768 head.
    assert w.encoder == 12 * 12 * 768**2 and w.head == 50257 * 768
    per_token = 6 * (12 * 12 * 768**2 + 50257 * 768) + 12 * 12 * 768 * 1024
    assert model_flops_per_token(cfg, 1024) == per_token
    assert training_flops(cfg, 1024) == 1024 * per_token
    assert model_flops_per_token(cfg, 1024) == flops_per_token(w.total, 12, 768, 1024)


def test_encoder_decoder_counts_source_and_target_tokens_separately():
    cfg = get_preset("t5-tiny")
    w = matmul_weights(cfg)
    L, d_attn, S, T = cfg.n_layers, cfg.n_heads * cfg.dim_head, 40, 10
    want = (
        6 * w.encoder * S + 12 * L * d_attn * S * S  # encoder over the source
        + 6 * (w.decoder + w.head) * T + 12 * cfg.decoder_layers * d_attn * T * T  # decoder self-attention
        + 6 * w.cross_kv * S + 12 * cfg.decoder_layers * d_attn * T * S  # cross-attention
    )  # fmt: skip
    assert training_flops(cfg, S, T) == want
    assert model_flops_per_token(cfg, S, T) == pytest.approx(want / (S + T))
    # More target tokens cost more than more source tokens: the LM head runs on targets only.
    assert training_flops(cfg, S, T + 1) - training_flops(cfg, S, T) > 6 * w.head


def test_gated_mlp_and_grouped_query_attention_weights():
    cfg = get_preset("llama-tiny")  # SwiGLU (3 matrices), 2 key/value heads of 4
    d, hd = cfg.d_model, cfg.dim_head
    block = d * (4 * hd + 2 * 2 * hd) + 4 * hd * d + 3 * d * cfg.d_ff
    assert matmul_weights(cfg).encoder == cfg.n_layers * block


def test_negative_lengths_are_refused():
    with pytest.raises(ValueError):
        training_flops(get_preset("gpt-tiny"), -1)
