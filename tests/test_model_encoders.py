"""Encoder family: BERT, RoBERTa, ALBERT and ELECTRA against transformers, in both conversion directions."""

from __future__ import annotations

import pytest
import torch
import transformers
from model_testing import ATOL, V, assert_parity, padded_batch, save_hf, tiny

from lmforge.models import Transformer, get_preset
from lmforge.models.hf import export_hf, import_hf, to_hf_model

_HF_SIZES = dict(
    vocab_size=V,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)


@pytest.mark.parametrize(
    "preset", ["bert-tiny", "roberta-tiny", "albert-tiny", "electra-tiny", "electra-tiny-generator"]
)
def test_lmforge_encoder_equals_transformers(preset):
    model = tiny(preset)
    assert_parity(model, to_hf_model(model), token_types=model.config.type_vocab_size > 1)


def _hf_models():
    return {
        "bert": lambda: transformers.BertForPreTraining(
            transformers.BertConfig(**_HF_SIZES, max_position_embeddings=64)
        ),
        "roberta": lambda: transformers.RobertaForMaskedLM(
            transformers.RobertaConfig(**_HF_SIZES, max_position_embeddings=66, pad_token_id=1, type_vocab_size=1)
        ),
        "albert": lambda: transformers.AlbertForPreTraining(
            transformers.AlbertConfig(**_HF_SIZES, embedding_size=16, max_position_embeddings=64)
        ),
        "electra-disc": lambda: transformers.ElectraForPreTraining(
            transformers.ElectraConfig(**_HF_SIZES, embedding_size=16, max_position_embeddings=64)
        ),
        "electra-gen": lambda: transformers.ElectraForMaskedLM(
            transformers.ElectraConfig(**_HF_SIZES, embedding_size=16, max_position_embeddings=64)
        ),
    }


@pytest.mark.parametrize("kind", ["bert", "roberta", "albert", "electra-disc", "electra-gen"])
def test_transformers_encoder_imports_exactly(kind, tmp_path):
    torch.manual_seed(0)
    hf = _hf_models()[kind]()
    save_hf(hf, tmp_path)
    ours = import_hf(tmp_path)
    assert_parity(ours, hf, token_types=ours.config.type_vocab_size > 1)


def test_bert_import_keeps_the_pooler_and_matches_bert_model(tmp_path):
    torch.manual_seed(0)
    hf = transformers.BertForPreTraining(transformers.BertConfig(**_HF_SIZES, max_position_embeddings=64))
    save_hf(hf, tmp_path)
    ours = import_hf(tmp_path)
    cfg = ours.config
    assert (cfg.pooler, cfg.lm_head, cfg.lm_head_transform, cfg.type_vocab_size) == (True, True, True, 2)
    ids, mask = padded_batch(0)
    with torch.no_grad():
        pooled = ours(ids, mask).pooled
        ref = hf.bert(input_ids=ids, attention_mask=mask).pooler_output
    torch.testing.assert_close(pooled, ref, atol=ATOL, rtol=0)
    assert ours.lm_head.weight is ours.tok_emb.weight  # BERT's MLM decoder is tied


def test_bert_base_model_checkpoint_without_prefix_or_heads(tmp_path):
    """A dir saved from BertModel has no 'bert.' prefix and no MLM head: it imports as a headless encoder."""
    torch.manual_seed(0)
    hf = transformers.BertModel(transformers.BertConfig(**_HF_SIZES, max_position_embeddings=64))
    save_hf(hf, tmp_path)
    ours = import_hf(tmp_path)
    assert not ours.config.lm_head and ours.config.pooler
    ids, mask = padded_batch(0)
    with torch.no_grad():
        out, ref = ours(ids, mask), hf(input_ids=ids, attention_mask=mask)
    torch.testing.assert_close(
        out.last_hidden_state[mask.bool()], ref.last_hidden_state[mask.bool()], atol=ATOL, rtol=0
    )
    torch.testing.assert_close(out.pooled, ref.pooler_output, atol=ATOL, rtol=0)
    assert out.logits is None


def test_segment_embeddings_change_the_output():
    model = tiny("bert-tiny")
    ids, _ = padded_batch(0)
    with torch.no_grad():
        a = model(ids).last_hidden_state
        b = model(ids, token_type_ids=torch.ones_like(ids)).last_hidden_state
    assert (a - b).abs().max() > 1e-3


def test_roberta_positions_start_at_two():
    model = tiny("roberta-tiny")
    ids = torch.randint(4, V, (1, 5))
    with torch.no_grad():
        h = model.encoder.embed(model.tok_emb(ids), torch.arange(5), None)
        # Rows 2..6 of the table are used, rows 0 and 1 never (fairseq: padding_idx + 1 = 2).
        expected = model.encoder.emb_norm(
            model.tok_emb(ids) + model.encoder.pos_emb.emb.weight[2:7] + model.encoder.type_emb.weight[0]
        )
    torch.testing.assert_close(h, expected)
    assert model.encoder.pos_emb.emb.weight.shape[0] == 128 + 2


def test_albert_shares_one_block_and_factorises_embeddings():
    cfg = get_preset("albert-tiny", vocab_size=V)
    shared = Transformer(cfg)
    unshared = Transformer(get_preset("albert-tiny", vocab_size=V, share_layers=False))
    block = sum(p.numel() for p in shared.encoder.blocks[0].parameters())
    assert len(shared.encoder.blocks) == 1 and len(unshared.encoder.blocks) == cfg.n_layers == 3
    assert unshared.num_params() - shared.num_params() == (cfg.n_layers - 1) * block
    assert shared.tok_emb.weight.shape == (V, 32)  # E = 32, projected to H = 64
    assert shared.encoder.emb_proj.weight.shape == (64, 32)
    assert shared.lm_head.weight.shape == (V, 32)  # MLM head maps back to E, tied
    ids, mask = padded_batch(0)
    with torch.no_grad():
        # Sharing still runs n_layers times: equal to an unshared model whose blocks all hold the shared weights.
        for blk in unshared.encoder.blocks:
            blk.load_state_dict(shared.encoder.blocks[0].state_dict())
        rest = {k: v for k, v in shared.state_dict().items() if ".blocks." not in k}
        unshared.load_state_dict(rest, strict=False)
        torch.testing.assert_close(shared(ids, mask).logits, unshared(ids, mask).logits)


def test_electra_discriminator_has_rtd_head_and_no_lm_head():
    model = tiny("electra-tiny")
    ids, mask = padded_batch(0)
    out = model(ids, mask)
    assert out.logits is None and out.rtd_logits.shape == ids.shape
    assert not hasattr(model, "lm_head")
    gen = tiny("electra-tiny-generator")
    assert gen(ids, mask).logits.shape == (*ids.shape, V) and gen(ids, mask).rtd_logits is None
    # Generator and discriminator share the embedding layout, so the generator's embeddings can be shared.
    assert gen.tok_emb.weight.shape == model.tok_emb.weight.shape == (V, 32)


def test_electra_small_sizes():
    disc, gen = get_preset("electra-small"), get_preset("electra-small-generator")
    assert (disc.embedding_dim, disc.d_model, disc.n_heads, disc.d_ff, disc.n_layers) == (128, 256, 4, 1024, 12)
    assert disc.rtd_head and not disc.lm_head and gen.lm_head and not gen.rtd_head


def test_exported_encoder_loads_with_auto_model_for_masked_lm(tmp_path):
    model = tiny("bert-tiny")
    export_hf(model, tmp_path)
    hf = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path)
    assert type(hf).__name__ == "BertForMaskedLM"
    base = transformers.AutoModel.from_pretrained(tmp_path).eval()  # BertModel, with the exported pooler
    ids, mask = padded_batch(0)
    with torch.no_grad():
        torch.testing.assert_close(model(ids, mask).pooled, base(input_ids=ids, attention_mask=mask).pooler_output)
