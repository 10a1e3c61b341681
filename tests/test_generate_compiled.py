"""Static KV cache and compiled decoding: static-cache steps equal dynamic-cache steps and full forwards; compiled
greedy, seeded sampling and beam search equal eager generation token for token; unsupported models fall back."""

from __future__ import annotations

import pytest
import torch
from test_generate import CharTokenizer, V, decoder, full_forward_logits, left_padded, right_padded, seq2seq

from lmforge.cli import main
from lmforge.models import Transformer, get_preset
from lmforge.models.beam import beam_search
from lmforge.models.generate import decoding_steps, generate, sample
from lmforge.models.static_cache import _POOL, StaticKVCache
from lmforge.models.static_decode import StaticSteps

# ------------------------------------------------------------------------------ static cache, eager


def llama(**kw) -> Transformer:
    """Llama-style: RoPE, grouped-query attention (4 query heads, 2 key/value heads), RMSNorm, SwiGLU."""
    torch.manual_seed(0)
    return Transformer(get_preset("llama-tiny", vocab_size=V, max_seq_len=64, init_std=0.3, **kw)).eval()


STATIC_CASES = {
    "gpt-learned": lambda: (decoder("learned"), *left_padded()),
    "sinusoidal": lambda: (decoder("sinusoidal"), *left_padded()),
    "llama-rope-gqa": lambda: (llama(), *left_padded()),
    "alibi": lambda: (decoder("alibi"), *left_padded()),
    "shaw": lambda: (decoder("shaw", shaw_values=True), *left_padded()),
    "prefix-lm": lambda: (decoder("learned", mask="prefix"), *left_padded()),
    "t5": lambda: (seq2seq("t5"), *right_padded()),
    "bart": lambda: (seq2seq("bart"), *right_padded()),
}


@pytest.mark.parametrize("make", STATIC_CASES.values(), ids=STATIC_CASES.keys())
def test_static_cache_steps_equal_dynamic_cache_and_full_forward(make) -> None:
    model, x, mask = make()
    dynamic = decoding_steps(model, x, mask)
    static = StaticSteps(decoding_steps(model, x, mask), 8, mode=None)
    tokens = torch.zeros(3, 0, dtype=torch.long)
    fed = x.shape[1] if model.config.arch == "decoder" else 1  # the prompt, or the decoder start token
    with torch.no_grad():
        logits, ref = static.start(), dynamic.start()
        for i in range(8):
            torch.testing.assert_close(logits, ref, atol=1e-4, rtol=0)
            torch.testing.assert_close(logits, full_forward_logits(model, x, mask, tokens), atol=1e-4, rtol=0)
            tok = logits.argmax(-1)
            tokens = torch.cat([tokens, tok[:, None]], 1)
            logits, ref = static.step(tok), dynamic.step(tok)
            assert isinstance(static.cache, StaticKVCache) and int(static.cache.slot) == fed + i + 1
    assert len(set(tokens.flatten().tolist())) >= 3


@pytest.mark.parametrize("kind", ["gpt-learned", "llama-rope-gqa", "alibi", "t5", "bart"])
def test_static_beam_search_reorders_the_cache_in_place(kind: str) -> None:
    model, x, mask = STATIC_CASES[kind]()
    for eos in (None, 7):
        eager = generate(model, x, mask, max_new_tokens=10, num_beams=3, eos_id=eos)
        steps = StaticSteps(decoding_steps(model, x, mask), 10, mode=None)
        with torch.no_grad():
            new = beam_search(steps, num_beams=3, max_new_tokens=10, eos_id=eos)
        assert steps.cache is not None and steps.cache.rows == 9  # 3 rows x 3 beams, reordered in place
        assert torch.equal(steps.output(new), eager)


def test_static_buffers_are_reused_and_stale_slots_stay_masked() -> None:
    model, x, mask = decoder(), *left_padded()
    steps = StaticSteps(decoding_steps(model, x, mask), 20, mode=None)
    with torch.no_grad():
        sample(steps, max_new_tokens=20, temperature=0)  # fills slots 0..25 with this generation's keys
    first = steps.cache.k[0].data_ptr()
    short_mask = mask.clone()
    short_mask[:, :5] = 0  # fewer real prompt keys: slots that held real keys are padding now
    short_mask[1, :6] = 0
    steps = StaticSteps(decoding_steps(model, x, short_mask), 20, mode=None)
    with torch.no_grad():
        out = steps.output(sample(steps, max_new_tokens=20, temperature=0))
    assert steps.cache.k[0].data_ptr() == first
    assert torch.equal(out, generate(model, x, short_mask, max_new_tokens=20, temperature=0))
    assert _POOL[model][1][0].data_ptr() == first


@pytest.mark.parametrize("every", [3, 8])
def test_checking_for_finished_rows_less_often_gives_the_same_tokens(every: int) -> None:
    model, x, mask = decoder(), *left_padded()
    free = generate(model, x, mask, max_new_tokens=20, temperature=0)[:, x.shape[1] :]

    def run(check: int, eos: int, temperature: float) -> torch.Tensor:
        steps, g = decoding_steps(model, x, mask), torch.Generator().manual_seed(1)
        return sample(steps, max_new_tokens=20, eos_id=eos, check_every=check, generator=g, temperature=temperature)

    lengths = set()
    for eos in [int(free[0, 2]), int(free[1, 9]), V - 1]:  # early, late, (almost surely) never
        for temperature in (0.0, 1.0):
            every_step = run(1, eos, temperature)
            assert torch.equal(run(every, eos, temperature), every_step), (eos, temperature)
            lengths.add(every_step.shape[1])
    assert len(lengths) >= 3  # generations that ended at different steps, and one that ran to the end
    assert 20 in lengths


def test_static_cache_keeps_its_row_count() -> None:
    model, x, mask = decoder(), *left_padded()
    steps = StaticSteps(decoding_steps(model, x, mask), 4, mode=None)
    with torch.no_grad():
        steps.step(steps.start().argmax(-1))
    with pytest.raises(ValueError, match="a static cache of 3 rows cannot take 6 rows"):
        steps.select(torch.arange(3).repeat_interleave(2))


# ------------------------------------------------------------------------------ compiled = eager

# Four prompt rows (left-padded for decoders, right-padded sources for T5) and 2 rows x 2 beams: every decoding
# below has 4 rows and capacity 64, so each model compiles its step once.


def four_rows(arch: str) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randint(3, V, (4, 9), generator=torch.Generator().manual_seed(2))
    mask = (torch.arange(9) >= torch.tensor([[0], [4], [2], [6]])).long()  # 9, 5, 7 and 3 real tokens
    if arch == "encoder-decoder":
        mask = mask.flip(1)
    return x.masked_fill(mask == 0, 0), mask


COMPILED_CASES = {"gpt": decoder, "llama": llama, "t5": lambda: seq2seq("t5")}


@pytest.fixture(scope="module", autouse=True)
def fresh_compiler():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("name", COMPILED_CASES)
def test_compiled_generation_equals_eager(name: str) -> None:
    model = COMPILED_CASES[name]()
    x, mask = four_rows(model.config.arch)
    keep = x.shape[1] if model.config.arch == "decoder" else 1
    free = generate(model, x, mask, max_new_tokens=12, temperature=0)
    eos = int(free[1, keep + 3])  # row 1 stops at its 4th new token, the other rows when they reach it
    runs = [
        dict(temperature=0, eos_id=eos),
        dict(temperature=0.9, top_k=12, top_p=0.95),
        dict(temperature=1.0, eos_id=eos),
    ]
    for kw in runs:
        seed = lambda: torch.Generator().manual_seed(5)  # noqa: E731
        eager = generate(model, x, mask, max_new_tokens=12, generator=seed(), **kw)
        _POOL.pop(model, None)
        compiled = generate(model, x, mask, max_new_tokens=12, generator=seed(), compile=True, **kw)
        assert model in _POOL  # the compiled path ran over a static cache
        assert torch.equal(compiled, eager), kw
    assert (generate(model, x, mask, max_new_tokens=12, temperature=0, eos_id=eos)[1, keep + 4 :] == eos).all()
    # Beam search: 2 rows x 2 beams, the same 4 cache rows.
    for eos_id in (None, eos):
        eager = generate(model, x[:2], mask[:2], max_new_tokens=12, num_beams=2, eos_id=eos_id, length_penalty=1.5)
        compiled = generate(
            model, x[:2], mask[:2], max_new_tokens=12, num_beams=2, eos_id=eos_id, length_penalty=1.5, compile=True
        )
        assert torch.equal(compiled, eager)
    assert len(set(free[:, keep:].flatten().tolist())) >= 4  # real continuations, not one repeated token


def test_compiled_generation_stops_at_max_seq_len() -> None:
    model = decoder()  # learned positions, max_seq_len 64
    x = torch.randint(3, V, (4, 60), generator=torch.Generator().manual_seed(3))
    out = generate(model, x, max_new_tokens=10, temperature=0, compile=True)
    assert out.shape == (4, 64)
    assert torch.equal(out, generate(model, x, max_new_tokens=10, temperature=0))


@pytest.mark.parametrize(
    "preset,reason",
    [
        ("transformer-xl-tiny", "Transformer-XL / XLNet relative attention (model.position='xl')"),
        ("sparse-strided-tiny", "sparse attention layers (model.attn_pattern='strided')"),
    ],
)
def test_unsupported_models_say_so_once_and_decode_eagerly(preset: str, reason: str, capsys) -> None:
    torch.manual_seed(0)
    model = Transformer(get_preset(preset, vocab_size=V, init_std=0.3)).eval()
    x = torch.randint(3, V, (2, 6), generator=torch.Generator().manual_seed(0))
    eager = generate(model, x, max_new_tokens=6, temperature=0)
    assert capsys.readouterr().err == ""
    for _ in range(2):
        assert torch.equal(generate(model, x, max_new_tokens=6, temperature=0, compile=True), eager)
    assert capsys.readouterr().err == f"note: compiled generation does not support {reason}; generating eagerly\n"
    assert model not in _POOL


# ------------------------------------------------------------------------------ adapted models


def adapted(preset: str, method: str) -> Transformer:
    """A tiny model with a `method` adapter whose parameters are moved off their (often identity) initialisation."""
    from adapt_testing import tiny

    from lmforge.adapt.peft import apply_peft

    model = apply_peft(tiny(preset, init_std=0.3), method)[0]
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return model.eval()


@pytest.mark.parametrize(
    "preset,method",
    [("gpt-tiny", "lora"), ("gpt-tiny", "prefix"), ("gpt-tiny", "houlsby"), ("t5-tiny", "prompt"), ("t5-tiny", "lora")],
)
def test_adapted_models_decode_over_the_static_cache(preset: str, method: str) -> None:
    model = adapted(preset, method)
    x = torch.randint(4, 120, (3, 7), generator=torch.Generator().manual_seed(1))
    mask = (torch.arange(7) >= torch.tensor([[0], [2], [4]])).long()
    mask = mask.flip(1) if model.config.arch == "encoder-decoder" else mask
    for kw in (dict(temperature=0), dict(num_beams=2)):
        steps = StaticSteps(decoding_steps(model, x, mask), 8, mode=None)
        with torch.no_grad():
            new = (
                beam_search(steps, max_new_tokens=8, **kw)
                if kw.get("num_beams")
                else sample(steps, max_new_tokens=8, **kw)
            )
        assert steps.cache is not None
        assert torch.equal(steps.output(new), generate(model, x, mask, max_new_tokens=8, **kw))


def test_compiled_prefix_tuned_generation_equals_eager() -> None:
    model = adapted("gpt-tiny", "prefix")  # learned keys/values before every layer's cached ones
    x = torch.randint(4, 120, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = (torch.arange(7) >= torch.tensor([[0], [3]])).long()
    eager = generate(model, x, mask, max_new_tokens=8, temperature=0)
    assert torch.equal(generate(model, x, mask, max_new_tokens=8, temperature=0, compile=True), eager)
    assert model in _POOL


def test_prompt_tuned_decoder_decodes_eagerly(capsys) -> None:
    model = adapted("gpt-tiny", "prompt")
    x = torch.randint(4, 120, (2, 7), generator=torch.Generator().manual_seed(1))
    eager = generate(model, x, max_new_tokens=5, temperature=0)
    assert torch.equal(generate(model, x, max_new_tokens=5, temperature=0, compile=True), eager)
    assert capsys.readouterr().err == (
        "note: compiled generation does not support a wrapped decoder stack (prompt tuning); generating eagerly\n"
    )


# ------------------------------------------------------------------------------ CLI


def test_cli_generate_compile_prints_the_eager_text(monkeypatch, capsys) -> None:
    model = decoder()
    monkeypatch.setattr("lmforge.loading.load", lambda path, device="cpu": (model, CharTokenizer()))
    args = ["generate", "ckpt", "--prompt", "abcdefg", "--prompt", "hij", "--greedy", "--max-new-tokens", "8"]
    assert main(args) == 0
    eager = capsys.readouterr().out
    _POOL.pop(model, None)
    assert main([*args, "--compile"]) == 0
    assert capsys.readouterr().out == eager
    assert model in _POOL
    assert len(eager.splitlines()) == 2 and eager.startswith("abcdefg") and len(eager.splitlines()[0]) > 7


def test_cli_generate_rejects_an_unknown_device(monkeypatch, capsys) -> None:
    monkeypatch.setattr("lmforge.loading.load", lambda path, device="cpu": (decoder(), CharTokenizer()))
    assert main(["generate", "ckpt", "--prompt", "ab", "--device", "tpu9", "--quiet"]) == 2
    assert capsys.readouterr().err.strip() == "error: --device: unknown device 'tpu9' (cpu, cuda, cuda:1, ...)"
