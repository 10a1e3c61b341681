"""ELECTRA: generator/discriminator pair with shared embeddings, replaced-token labels, joint loss."""

import pytest
import torch
from encoder_testing import objective, one_thread, overfit, tiny_encoder, tokenizer, windows  # noqa: F401
from training_testing import no_device_reads

from lmforge.errors import LMForgeError
from lmforge.models import get_preset
from lmforge.objectives import masking as M
from lmforge.objectives.electra import ElectraModel

T = 64


@pytest.fixture(scope="module")
def tok():
    return tokenizer("wordpiece", "bert")


@pytest.fixture(scope="module")
def batch(tok):
    obj = objective("electra", tok)
    torch.manual_seed(0)
    return obj.transform(windows(tok, T, 4000)[:8])


def build(tok, *overrides: str) -> tuple:
    obj = objective("electra", tok, *overrides)
    torch.manual_seed(0)
    return obj, obj.build_model(get_preset("electra-tiny", vocab_size=tok.vocab_size, dropout=0.0, attn_dropout=0.0))


def test_pair_shares_embeddings_and_scales_the_generator(tok):
    _, model = build(tok)
    g, d = model.generator, model.discriminator
    assert isinstance(model, ElectraModel)
    assert g.tok_emb is d.tok_emb and g.lm_head.weight is d.tok_emb.weight
    for name in ("pos_emb", "type_emb", "emb_norm"):
        assert getattr(g.encoder, name) is getattr(d.encoder, name)
    assert g.encoder.blocks[0] is not d.encoder.blocks[0]
    gc, dc = g.config, d.config
    assert (gc.d_model, gc.n_heads, gc.d_ff) == (dc.d_model // 4, max(1, dc.n_heads // 4), dc.d_ff // 4)
    assert gc.embedding_dim == dc.embedding_dim == 32 and not dc.lm_head and dc.rtd_head
    # Shared tensors are counted once.
    unique = {id(p): p.numel() for p in model.parameters()}
    assert model.num_params() == sum(unique.values())


def test_generator_preset_and_bad_models(tok):
    _, model = build(tok, "--objective.generator_preset=electra-tiny-generator")
    assert model.generator.config.d_model == 64
    obj = objective("electra", tok, "--objective.generator_preset=bert-tiny")
    with pytest.raises(LMForgeError, match="has embedding width 64, the discriminator 32"):
        obj.build_model(get_preset("electra-tiny", vocab_size=tok.vocab_size))
    with pytest.raises(LMForgeError, match=r"needs arch 'encoder' and model.rtd_head=true"):
        objective("electra", tok).build_model(tiny_encoder(tok.vocab_size))


def test_masking_defaults_follow_the_released_recipe(tok):
    obj = objective("electra", tok)
    torch.manual_seed(0)
    b = obj.transform(windows(tok, 128, 30_000))
    sel = b["labels"] != M.IGNORE
    masked = (b["input_ids"][sel] == tok.mask_id).double().mean()
    assert abs(masked - 0.85) < 0.02  # 85% [MASK], 15% unchanged, no random tokens
    assert torch.equal(
        b["input_ids"][sel][b["input_ids"][sel] != tok.mask_id], b["labels"][sel][b["input_ids"][sel] != tok.mask_id]
    )


def test_replaced_labels_follow_the_samples(tok, batch):
    _, model = build(tok)
    sel = batch["labels"] != M.IGNORE
    original = torch.where(sel, batch["labels"], batch["input_ids"])
    vocab = tok.vocab_size

    def forced(target):  # a generator whose softmax puts all mass on `target` at each masked position
        return lambda h: torch.nn.functional.one_hot(target, vocab).float() * 1e4

    model.generator.logits = forced(original[sel])
    out = model(batch["input_ids"], batch["labels"])
    assert not out.replaced.any()  # sampling the original token counts as "original"
    other = (original[sel] + 1 - 5) % (vocab - 5) + 5  # some other non-special token
    model.generator.logits = forced(other)
    out = model(batch["input_ids"], batch["labels"])
    assert torch.equal(out.replaced, sel)
    assert out.rtd_logits.shape == original.shape and out.gen_logits.shape == (int(sel.sum()), vocab)


def test_loss_is_mlm_plus_weighted_disc_and_sampling_blocks_gradients(tok, batch, one_thread):  # noqa: F811
    obj, model = build(tok)
    torch.manual_seed(1)
    out = obj.loss(model, batch)
    m = out.metrics
    assert abs(float(out.loss.detach()) - (m["mlm_loss"] + 50.0 * m["disc_loss"])) < 1e-3
    assert out.n_tokens == batch["input_ids"].numel()  # the discriminator scores every token
    assert 0.05 < m["replaced_frac"] < 0.2
    # The discriminator loss does not reach the generator's own layers (samples are not differentiable).
    model.zero_grad()
    torch.manual_seed(1)
    res = model(batch["input_ids"], batch["labels"])
    torch.nn.functional.binary_cross_entropy_with_logits(res.rtd_logits, res.replaced.float()).backward()
    assert all(p.grad is None for p in model.generator.encoder.blocks.parameters())
    assert model.discriminator.tok_emb.weight.grad.abs().sum() > 0


def test_the_batch_index_and_padding_weights_give_the_boolean_selection(tok, batch):
    """The loss gathers the masked positions through the batch's `mlm_index` (no device sync) and weights padding
    out; it equals the discriminator loss over the real tokens of the model run without the index."""
    obj, model = build(tok)
    assert "mlm_index" in batch
    mask = torch.ones_like(batch["input_ids"])
    mask[:, -7:] = 0
    padded = {**batch, "attention_mask": mask}
    torch.manual_seed(3)
    out = obj.loss(model, padded)
    torch.manual_seed(3)
    res = model(batch["input_ids"], batch["labels"], mask)  # positions found on the device
    real = mask.bool()
    want = torch.nn.functional.binary_cross_entropy_with_logits(res.rtd_logits[real], res.replaced[real].float())
    torch.testing.assert_close(out.metrics["disc_loss"], want)
    torch.testing.assert_close(out.metrics["replaced_frac"], res.replaced[real].float().mean())
    assert int(out.n_tokens) == int(real.sum())
    with no_device_reads():  # nothing in the loss waits for the device
        obj.loss(model, padded).loss.backward()


def test_overfits_one_batch(tok, batch, one_thread):  # noqa: F811
    obj, model = build(tok)
    losses = overfit(model, obj, batch, steps=40, lr=3e-3)
    assert losses[-1] < 0.5 * losses[0]
