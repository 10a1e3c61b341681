"""Generation: cached decoding equals full forwards, EOS handling, top-k/top-p, both families, HF GPT-2 parity."""

from __future__ import annotations

import pytest
import torch

from lmforge.errors import LMForgeError
from lmforge.models import ModelConfig, Transformer, get_preset
from lmforge.models.generate import decoding_steps, filter_logits, generate, generate_text, next_token

V = 40


def decoder(position: str = "learned", **kw) -> Transformer:
    torch.manual_seed(0)
    # A larger init gives peaked next-token distributions, so greedy choices are far from ties.
    cfg = get_preset("gpt-tiny", vocab_size=V, max_seq_len=64, position=position, init_std=0.3, **kw)
    return Transformer(cfg).eval()


SEQ2SEQ = {
    # T5-like: pre-RMSNorm, relative bias, no biases, decoder starts with pad.
    "t5": dict(norm="rmsnorm", position="t5_bias", bias=False, activation="relu", decoder_start_id=0),
    # BART-like: post-LN, learned positions offset by 2, embedding norm, decoder starts with </s> (2).
    "bart": dict(
        norm_position="post",
        final_norm=False,
        embedding_norm=True,
        position="learned",
        position_offset=2,
        activation="gelu",
        decoder_start_id=2,
    ),
}


def seq2seq(kind: str = "t5", **kw) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(
        arch="encoder-decoder",
        vocab_size=V,
        d_model=32,
        n_layers=2,
        n_heads=4,
        d_ff=64,
        max_seq_len=64,
        pad_id=0,
        **{"init_std": 1.0, **SEQ2SEQ[kind], **kw},
    )
    return Transformer(cfg).eval()


def left_padded() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randint(3, V, (3, 7), generator=g)
    mask = torch.ones_like(x)
    mask[0, :3] = 0  # rows of 4, 7 and 5 real tokens
    mask[2, :2] = 0
    return x.masked_fill(mask == 0, 0), mask


def right_padded() -> tuple[torch.Tensor, torch.Tensor]:
    x, mask = left_padded()
    return x.flip(1), mask.flip(1)


# ------------------------------------------------------------------------------ cache = full forward


@torch.no_grad()
def full_forward_logits(model: Transformer, x, mask, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token logits (B, V) after feeding `tokens` (B, t), recomputing everything without a cache."""
    if model.config.arch == "encoder-decoder":
        start = torch.full((x.shape[0], 1), model.config.decoder_start_id)
        return model(x, mask, decoder_input_ids=torch.cat([start, tokens], 1)).logits[:, -1]
    ids = torch.cat([x, tokens], 1)
    m = torch.cat([mask, torch.ones_like(tokens)], 1)
    prefix = x.shape[1] if model.config.mask == "prefix" else None  # the prompt is the prefix
    return model(ids, m, position_ids=(m.cumsum(-1) - 1).clamp(min=0), prefix_len=prefix).logits[:, -1]


@pytest.mark.parametrize(
    "make",
    [
        lambda: (decoder("learned"), *left_padded()),
        lambda: (decoder("rope", bias=False), *left_padded()),
        lambda: (decoder("alibi"), *left_padded()),
        lambda: (decoder("learned", mask="prefix"), *left_padded()),
        lambda: (seq2seq("t5"), *right_padded()),
        lambda: (seq2seq("bart"), *right_padded()),
    ],
    ids=["gpt-learned", "gpt-rope", "gpt-alibi", "prefix-lm", "t5", "bart"],
)
def test_cached_greedy_decoding_equals_full_forward_each_step(make) -> None:
    model, x, mask = make()
    steps = decoding_steps(model, x, mask)
    tokens = torch.zeros(3, 0, dtype=torch.long)
    with torch.no_grad():
        logits = steps.start()
        for _ in range(8):
            torch.testing.assert_close(logits, full_forward_logits(model, x, mask, tokens), atol=1e-4, rtol=0)
            tok = logits.argmax(-1)
            tokens = torch.cat([tokens, tok[:, None]], 1)
            logits = steps.step(tok)
    out = generate(model, x, mask, max_new_tokens=8, temperature=0)
    prefix = x if model.config.arch == "decoder" else torch.full((3, 1), model.config.decoder_start_id)
    assert torch.equal(out, torch.cat([prefix, tokens], 1))
    assert len(set(tokens.flatten().tolist())) >= 3  # a real continuation, not one repeated token


def test_padded_rows_generate_as_if_alone() -> None:
    for model, (x, mask) in [(decoder(), left_padded()), (seq2seq("bart"), right_padded())]:
        batch = generate(model, x, mask, max_new_tokens=6, temperature=0)
        for i in range(3):
            real = x[i][mask[i].bool()][None]
            alone = generate(model, real, max_new_tokens=6, temperature=0)
            tail = alone.shape[1] - (real.shape[1] if model.config.arch == "decoder" else 0)
            assert torch.equal(batch[i, -tail:], alone[0, -tail:])


# ------------------------------------------------------------------------------ EOS and length


@pytest.mark.parametrize("family", ["decoder", "encoder-decoder"])
def test_eos_stops_each_row_and_pads_it_with_eos(family: str) -> None:
    model, (x, mask) = (decoder(), left_padded()) if family == "decoder" else (seq2seq(), right_padded())
    keep = x.shape[1] if family == "decoder" else 1
    free = generate(model, x, mask, max_new_tokens=10, temperature=0)[:, keep:]  # (3, 10), no EOS
    # EOS := the first token that row 0 emits for the first time after step 0.
    j = next(j for j in range(1, 10) if int(free[0, j]) not in free[0, :j].tolist())
    eos = int(free[0, j])
    out = generate(model, x, mask, max_new_tokens=10, temperature=0, eos_id=eos)
    expected = free.clone()
    ends = []
    for i in range(3):
        hits = (free[i] == eos).nonzero()
        end = int(hits[0]) + 1 if len(hits) else 10
        expected[i, end:] = eos
        ends.append(end)
    assert ends[0] == j + 1 < 10
    assert torch.equal(out[:, keep:], expected[:, : max(ends)])


def test_generation_stops_when_every_row_is_done() -> None:
    model = decoder()
    x = torch.randint(3, V, (1, 5))
    first = int(generate(model, x, max_new_tokens=1, temperature=0)[0, -1])
    out = generate(model, x, max_new_tokens=20, temperature=0, eos_id=first)
    assert out.tolist() == [x[0].tolist() + [first]]


def test_learned_positions_cap_the_length_at_max_seq_len() -> None:
    model = decoder()  # max_seq_len 64
    x = torch.randint(3, V, (2, 60))
    assert generate(model, x, max_new_tokens=10, temperature=0).shape == (2, 64)
    assert generate(model, x, max_new_tokens=10, num_beams=2).shape == (2, 64)
    assert generate(seq2seq("bart"), x[:, :8], max_new_tokens=100, temperature=0).shape == (2, 64)
    # Relative positions have no cap.
    assert generate(decoder("rope", bias=False), x, max_new_tokens=10, temperature=0).shape == (2, 70)


def test_zero_new_tokens_returns_the_prompt_and_train_mode_is_restored() -> None:
    x = torch.randint(3, V, (2, 5))
    model = decoder().train()
    assert torch.equal(generate(model, x, max_new_tokens=0), x)
    assert model.training
    assert generate(seq2seq(), x, max_new_tokens=0).tolist() == [[0], [0]]


# ------------------------------------------------------------------------------ top-k / top-p / sampling


def test_top_k_and_top_p_on_hand_made_logits() -> None:
    probs = torch.tensor([[0.125, 0.5, 0.0625, 0.25, 0.0625]])  # ranks: 1, 3, 0, (2, 4)
    logits = probs.log()
    kept = lambda **kw: torch.isfinite(filter_logits(logits, **kw))[0].nonzero().flatten().tolist()  # noqa: E731
    assert kept(top_k=1) == [1]
    assert kept(top_k=2) == [1, 3]
    assert kept(top_k=3) == [0, 1, 3]
    assert kept(top_k=0) == kept(top_k=9) == [0, 1, 2, 3, 4]
    assert kept(top_p=0.5) == [1]  # 0.5 alone reaches 0.5
    assert kept(top_p=0.6) == [1, 3]
    assert kept(top_p=0.75) == [1, 3]  # smallest set with mass >= 0.75
    assert kept(top_p=0.8) == [0, 1, 3]
    assert kept(top_p=0.95) == [0, 1, 2, 3, 4]  # 0.9375 < 0.95: both 0.0625 tokens are needed
    assert kept(top_p=0.8, top_k=2) == [1, 3]
    assert filter_logits(logits, top_k=2)[0, 1] == logits[0, 1]  # kept logits are unchanged


def test_sampling_follows_the_filtered_distribution() -> None:
    logits = torch.tensor([[0.125, 0.5, 0.0625, 0.25, 0.0625]]).log().expand(20000, -1)
    g = torch.Generator().manual_seed(0)
    counts = torch.bincount(next_token(logits, 1.0, top_k=2, generator=g), minlength=5).float() / 20000
    torch.testing.assert_close(counts, torch.tensor([0, 2 / 3, 0, 1 / 3, 0]), atol=0.015, rtol=0)
    counts = torch.bincount(next_token(logits, 1.0, generator=g), minlength=5).float() / 20000
    torch.testing.assert_close(counts, torch.tensor([0.125, 0.5, 0.0625, 0.25, 0.0625]), atol=0.015, rtol=0)
    # Temperature 2 flattens: p ∝ sqrt(p).
    counts = torch.bincount(next_token(logits, 2.0, generator=g), minlength=5).float() / 20000
    flat = torch.tensor([0.125, 0.5, 0.0625, 0.25, 0.0625]).sqrt()
    torch.testing.assert_close(counts, flat / flat.sum(), atol=0.015, rtol=0)


@pytest.mark.parametrize("make", [lambda: (decoder(), *left_padded()), lambda: (seq2seq(), *right_padded())])
def test_sampling_is_seeded_and_top_k_1_is_greedy(make) -> None:
    model, x, mask = make()
    run = lambda seed, **kw: generate(  # noqa: E731
        model, x, mask, max_new_tokens=12, generator=torch.Generator().manual_seed(seed), **kw
    )
    assert torch.equal(run(3), run(3))
    assert not torch.equal(run(3), run(4))
    assert torch.equal(run(5, top_k=1), generate(model, x, mask, max_new_tokens=12, temperature=0))


# ------------------------------------------------------------------------------ text and errors


class CharTokenizer:
    """Characters a..z as ids 3..28; 0 pad, 1 bos, 2 eos."""

    pad_id, bos_id, eos_id = 0, 1, 2

    def encode(self, text: str) -> list[int]:
        return [ord(c) - ord("a") + 3 for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i - 3 + ord("a")) if 3 <= i < 29 else f"<{i}>" for i in ids if i > 2)


@pytest.mark.parametrize("family", ["decoder", "encoder-decoder"])
def test_generate_text_frames_pads_and_decodes(family: str) -> None:
    model = decoder() if family == "decoder" else seq2seq()
    tok = CharTokenizer()
    texts = generate_text(model, tok, ["abc", "hello"], max_new_tokens=5, temperature=0)
    if family == "decoder":
        x = torch.tensor([[0, 0, 3, 4, 5], tok.encode("hello")])
        mask = (torch.arange(5) >= torch.tensor([[2], [0]])).long()
        new = generate(model, x, mask, max_new_tokens=5, temperature=0, eos_id=2)[:, 5:]
    else:  # BOS + text + EOS, right-padded
        x = torch.tensor([[1, 3, 4, 5, 2, 0, 0], [1, *tok.encode("hello"), 2]])
        mask = (x != 0).long()
        new = generate(model, x, mask, max_new_tokens=5, temperature=0, eos_id=2)[:, 1:]
    assert texts == [tok.decode(row.tolist()) for row in new]
    assert all(len(t) > 0 for t in texts)


def test_generation_errors() -> None:
    x = torch.randint(3, V, (2, 5))
    encoder = Transformer(ModelConfig(arch="encoder", vocab_size=V, d_model=32, n_layers=1, n_heads=4, d_ff=64))
    with pytest.raises(LMForgeError, match=r"model 'custom' \(encoder\) cannot generate"):
        generate(encoder, x)
    mask = torch.ones_like(x)
    mask[1, -1] = 0
    with pytest.raises(LMForgeError, match="decoder prompts must be non-empty and left-padded"):
        generate(decoder(), x, mask)
    with pytest.raises(LMForgeError, match=r"top_k / top_p sampling does not apply to beam search"):
        generate(decoder(), x, top_k=5, num_beams=2)
    with pytest.raises(LMForgeError, match=r"top_p must be in \(0, 1\], got 1.5"):
        generate(decoder(), x, top_p=1.5)
    with pytest.raises(LMForgeError, match="num_beams must be >= 1, got 0"):
        generate(decoder(), x, num_beams=0)


# ------------------------------------------------------------------------------ transformers parity


# Presets with a `transformers` twin; init_std chosen so that greedy continuations are not one repeated token (for T5
# it is the factor of its fan-in init: at the reference's 1.0 this tiny model repeats one token).
HF_CASES = {"gpt-tiny": 0.3, "llama-tiny": 0.3, "t5-tiny": 3.0, "bart-tiny": 0.2}


@pytest.mark.parametrize(
    "preset,num_beams,length_penalty",
    [(p, k, lp) for p in HF_CASES for k, lp in [(1, 1.0), (3, 1.0), (4, 2.0)]],
)
def test_ids_equal_transformers_generate(preset: str, num_beams: int, length_penalty: float) -> None:
    transformers = pytest.importorskip("transformers")
    from lmforge.models.hf import to_hf_model

    torch.manual_seed(0)
    model = Transformer(get_preset(preset, vocab_size=V, init_std=HF_CASES[preset])).eval()
    cfg = model.config
    hf = to_hf_model(model)
    x, mask = left_padded() if cfg.arch == "decoder" else right_padded()
    x = x.masked_fill(mask == 0, cfg.pad_id)
    keep = x.shape[1] if cfg.arch == "decoder" else 1
    kw = dict(max_new_tokens=12, temperature=0, num_beams=num_beams, length_penalty=length_penalty)
    free = generate(model, x, mask, **kw)[:, keep:]
    eos = int(free[1, 3])  # row 1's 4th token without EOS: with it, that hypothesis ends there
    ours = generate(model, x, mask, eos_id=eos, **kw)
    # A fresh generation config: no model defaults (forced EOS, n-gram blocking, minimum length) apply.
    gen = transformers.GenerationConfig(
        max_new_tokens=12,
        do_sample=False,
        num_beams=num_beams,
        early_stopping=True,
        length_penalty=length_penalty,
        eos_token_id=eos,
        pad_token_id=eos,
        decoder_start_token_id=cfg.decoder_start_id,
    )
    theirs = hf.generate(input_ids=x, attention_mask=mask, generation_config=gen)
    assert torch.equal(ours, theirs)
    assert len(set(free.flatten().tolist())) >= 3
    if num_beams == 1:
        assert (ours[1, keep + 3 :] == eos).all()  # row 1 stopped at its EOS and is padded with it
