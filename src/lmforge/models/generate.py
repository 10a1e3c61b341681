"""Text generation with a KV cache for decoder and encoder-decoder models.

Greedy, temperature, top-k and top-p (nucleus) sampling live here; beam search in `lmforge.models.beam`. Both drive a
family-specific *decoding state* (`DecoderSteps`, `Seq2SeqSteps`) through three calls: `start()` for the first
next-token logits, `step(tokens)` to feed one token per row, `select(index)` to reorder rows (beams)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from lmforge.errors import LMForgeError
from lmforge.models.beam import beam_search, finite_logits
from lmforge.models.model import TransformerCore
from lmforge.models.static_decode import StaticSteps, can_compile, compile_mode

Overlong = Literal["error", "truncate"]
"""What generation does with a prompt longer than the model's max_seq_len."""


def filter_logits(logits: Tensor, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """Set logits outside the top-k / nucleus (smallest set with probability ≥ top_p) to -inf. logits: (B, V).

    Tokens tied with the k-th logit are all kept."""
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and 0 < top_p < 1:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens ranked above it already reach top_p (the first token always stays).
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def next_token(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Pick the next token per row from last-position logits (B, V); temperature 0 = greedy."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = filter_logits(logits.float() / temperature, top_k, top_p).softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class DecoderSteps:
    """Incremental decoding state of a decoder-only model over left-padded prompts (B, T)."""

    def __init__(self, model: TransformerCore, input_ids: Tensor, attention_mask: Tensor | None = None) -> None:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if input_ids.shape[1] == 0 or not bool(attention_mask[:, -1].all()):
            raise LMForgeError("decoder prompts must be non-empty and left-padded (attention_mask[:, -1] all 1)")
        self.model, self.input_ids, self.mask = model, input_ids, attention_mask
        self.batch_size, self.device = input_ids.shape[0], input_ids.device
        # Left padding: each row's positions count its real tokens only.
        self.positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (B, T)
        self.next_pos = self.positions[:, -1:] + 1  # (B, 1): position of the next fed token
        self.cache = None

    def max_steps(self, max_new_tokens: int) -> int:
        """New tokens that fit: learned positions end at max_seq_len (every output token needs a position)."""
        limit = self.model.config.max_positions
        if limit is None:
            return max_new_tokens
        return max(0, min(max_new_tokens, limit - int(self.next_pos.max())))

    def _logits(self, out) -> Tensor:
        return self.model.logits(out.last_hidden_state[:, -1])  # (N, V): the head runs on the last position only

    def start(self) -> Tensor:
        # A prefix-LM sees the whole prompt bidirectionally (padding stays masked); generated tokens are causal.
        prefix = self.input_ids.shape[1] if self.model.config.mask == "prefix" else None
        out = self.model(
            self.input_ids,
            self.mask,
            position_ids=self.positions,
            prefix_len=prefix,
            use_cache=True,
            return_logits=False,
        )
        self.cache = out.cache
        return self._logits(out)

    def step(self, tokens: Tensor) -> Tensor:
        """Feed tokens (N,) and return next-token logits (N, V)."""
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(tokens), 1)], dim=1)  # (N, T_past + 1)
        out = self.model(tokens[:, None], self.mask, position_ids=self.next_pos, cache=self.cache, return_logits=False)
        self.next_pos = self.next_pos + 1
        return self._logits(out)

    def select(self, index: Tensor) -> None:
        """Keep (and repeat) rows `index` (N',) of the state: cache, mask, positions."""
        self.cache.reorder(index)
        self.mask, self.next_pos = self.mask[index], self.next_pos[index]

    def output(self, new_tokens: Tensor) -> Tensor:
        """Prompt + continuation (B, T + n)."""
        return torch.cat([self.input_ids, new_tokens], dim=1)


class Seq2SeqSteps:
    """Incremental decoding state of an encoder-decoder: the source is encoded once, the decoder runs cached.

    The decoder starts from `config.decoder_start_id`; cross-attention keys/values are computed at the first
    step and kept in the cache (`KVCache.cross_kv`)."""

    def __init__(self, model: TransformerCore, input_ids: Tensor, attention_mask: Tensor | None = None) -> None:
        self.model, self.input_ids, self.enc_mask = model, input_ids, attention_mask
        self.batch_size, self.device = input_ids.shape[0], input_ids.device
        self.memory: Tensor | None = None  # encoder output (B, S, d_model), computed by start()
        self.start_ids = torch.full((self.batch_size, 1), model.config.decoder_start_id, device=input_ids.device)
        self.cache = None

    def max_steps(self, max_new_tokens: int) -> int:
        limit = self.model.config.max_positions
        if limit is None:
            return max_new_tokens
        return max(0, min(max_new_tokens, limit - 1))  # position 0 holds the start token

    def start(self) -> Tensor:
        self.memory = self.model.encode(self.input_ids, self.enc_mask)
        return self.step(self.start_ids[:, 0])

    def step(self, tokens: Tensor) -> Tensor:
        """Feed decoder tokens (N,) and return next-token logits (N, V)."""
        out = self.model(
            self.input_ids,  # not re-encoded: encoder_hidden_states is given
            self.enc_mask,
            decoder_input_ids=tokens[:, None],
            encoder_hidden_states=self.memory,
            cache=self.cache,
            use_cache=True,
            return_logits=False,
        )
        self.cache = out.cache
        return self.model.logits(out.last_hidden_state[:, -1])

    def select(self, index: Tensor) -> None:
        """Keep (and repeat) rows `index` (N',) of the state after start(): cache, encoder output and mask."""
        if self.cache is not None:
            self.cache.reorder(index)
        self.input_ids, self.memory = self.input_ids[index], self.memory[index]
        self.enc_mask = None if self.enc_mask is None else self.enc_mask[index]

    def output(self, new_tokens: Tensor) -> Tensor:
        """The decoder sequence (B, 1 + n), starting with the decoder start token."""
        return torch.cat([self.start_ids, new_tokens], dim=1)


def decoding_steps(
    model: TransformerCore, input_ids: Tensor, attention_mask: Tensor | None = None
) -> DecoderSteps | Seq2SeqSteps:
    """The decoding state for `model.config.arch`; raises LMForgeError for models that cannot generate."""
    cfg = model.config
    if cfg.is_encoder or not cfg.lm_head:
        raise LMForgeError(f"model '{cfg.name}' ({cfg.arch}) cannot generate: it needs a decoder with an LM head")
    if input_ids.dim() != 2:
        raise LMForgeError(f"input_ids must be (batch, length), got shape {tuple(input_ids.shape)}")
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise LMForgeError(
            f"attention_mask shape {tuple(attention_mask.shape)} differs from input_ids {tuple(input_ids.shape)}"
        )
    cls = Seq2SeqSteps if cfg.is_encoder_decoder else DecoderSteps
    return cls(model, input_ids, attention_mask)


@torch.no_grad()
def sample(
    steps: DecoderSteps | Seq2SeqSteps | StaticSteps,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_id: int | None = None,
    generator: torch.Generator | None = None,
    stop: Callable[[Tensor], Tensor] | None = None,
    check_every: int | None = None,
) -> Tensor:
    """Greedy (temperature 0) or sampled continuation tokens (B, n), n ≤ max_new_tokens.

    Rows that emit EOS are padded with EOS afterwards; decoding stops when every row has finished. `stop`, given the
    new tokens so far (B, i), returns the rows (B,) bool that have finished too (e.g. on a stop string).

    check_every: steps between checks that every row is done (default: 8 on GPU with EOS alone, else 1). A check
    waits for the device; checking less often lets the host queue steps ahead, and the steps past the one where
    the last row finished (all EOS) are cut off, so the tokens are the same."""
    n = steps.max_steps(max_new_tokens)
    device = steps.device
    tokens: list[Tensor] = []
    done = torch.zeros(steps.batch_size, dtype=torch.bool, device=device)
    every = 0 if eos_id is None and stop is None else 1  # no EOS, no stop: nothing to check
    if every and stop is None:
        every = check_every or (8 if device.type == "cuda" else 1)
    logits = finite_logits(steps.start()) if n > 0 else None
    for i in range(n):
        tok = next_token(logits, temperature, top_k, top_p, generator)  # (B,)
        if eos_id is not None:
            tok = tok.masked_fill(done, eos_id)
            done |= tok == eos_id
        tokens.append(tok)
        if stop is not None:
            done |= stop(torch.stack(tokens, dim=1))
        if i + 1 == n or (every and (i + 1) % every == 0 and bool(done.all())):
            break
        logits = steps.step(tok)
    if not tokens:
        return torch.zeros(steps.batch_size, 0, dtype=torch.long, device=device)
    out = torch.stack(tokens, dim=1)  # (B, m)
    if every > 1:  # keep up to the step where the last row finished, as a check after every step would
        is_eos = out == eos_id
        first = torch.where(is_eos.any(1), is_eos.int().argmax(1), out.shape[1])  # (B,)
        out = out[:, : int(first.max()) + 1]
    return out


def _check_args(
    max_new_tokens: int, top_k: int | None, top_p: float | None, num_beams: int, temperature: float
) -> None:
    if not temperature >= 0 or temperature == float("inf"):  # NaN fails every comparison
        raise LMForgeError(f"temperature must be a finite number >= 0, got {temperature}")
    if max_new_tokens < 0:
        raise LMForgeError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if top_k is not None and top_k < 0:
        raise LMForgeError(f"top_k must be >= 0, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise LMForgeError(f"top_p must be in (0, 1], got {top_p}")
    if num_beams < 1:
        raise LMForgeError(f"num_beams must be >= 1, got {num_beams}")
    if num_beams > 1 and (top_k or (top_p is not None and top_p < 1)):
        raise LMForgeError("top_k / top_p sampling does not apply to beam search (num_beams > 1)")


@torch.no_grad()
def generate(
    model: TransformerCore,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    *,
    max_new_tokens: int = 50,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_id: int | None = None,
    num_beams: int = 1,
    length_penalty: float = 1.0,
    generator: torch.Generator | None = None,
    stop: Callable[[Tensor], Tensor] | None = None,
    compile: bool = False,
) -> Tensor:
    """Generate with a decoder or encoder-decoder model (dispatch on `model.config.arch`).

    Decoder: `input_ids` are left-padded prompts (B, T); returns prompt + continuation (B, T + n).
    Encoder-decoder: `input_ids` is the (right-padded) source (B, S); returns the decoder sequence (B, 1 + n),
    starting with `config.decoder_start_id`. n ≤ max_new_tokens (learned positions also cap it at max_seq_len).
    num_beams > 1 runs beam search (deterministic: temperature is ignored) with HF's length penalty.
    Positions after a row's EOS hold eos_id. `stop` (sampling only): see `sample`.

    compile: decode over a static KV cache with a `torch.compile`d step (CUDA graphs on GPU; models/static_decode.py),
    same outputs; models it does not support (Transformer-XL/XLNet, sparse attention, prompt-tuned decoders) say so
    and decode eagerly."""
    _check_args(max_new_tokens, top_k, top_p, num_beams, temperature)
    steps = decoding_steps(model, input_ids, attention_mask)
    if compile and can_compile(model):
        steps = StaticSteps(steps, max_new_tokens, compile_mode(steps.device))
    training = model.training
    model.eval()
    try:
        if num_beams > 1:
            new = beam_search(
                steps, num_beams=num_beams, max_new_tokens=max_new_tokens, eos_id=eos_id, length_penalty=length_penalty
            )
        else:
            new = sample(
                steps,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                eos_id=eos_id,
                generator=generator,
                stop=stop,
            )
    finally:
        model.train(training)
    return steps.output(new)


def generate_text(
    model: TransformerCore, tokenizer, prompts: list[str], *, overlong: Overlong = "error", **kw
) -> list[str]:
    """Encode prompts, generate, and decode only the generated tokens (keywords as for `generate`).

    Decoder prompts are left-padded. Encoder-decoder sources are right-padded and framed as HF's T5/BART
    tokenizers do: BOS (when the tokenizer has one) + text + EOS. A prompt longer than the model's max_seq_len
    raises (overlong="error") or is cut with a warning on stderr (overlong="truncate"; see `fit_prompt`)."""
    device = next(model.parameters()).device
    seq2seq = model.config.is_encoder_decoder
    pad = tokenizer.pad_id if tokenizer.pad_id is not None else (tokenizer.eos_id or 0)
    ids = _prompt_ids(model.config, tokenizer, prompts, overlong, kw.get("max_new_tokens", 50), pad)
    T = max(len(x) for x in ids)
    if seq2seq:  # right padding
        input_ids = torch.tensor([x + [pad] * (T - len(x)) for x in ids], device=device)
        mask = torch.tensor([[1] * len(x) + [0] * (T - len(x)) for x in ids], device=device)
        skip = 1  # the decoder start token
    else:
        input_ids = torch.tensor([[pad] * (T - len(x)) + x for x in ids], device=device)
        mask = torch.tensor([[0] * (T - len(x)) + [1] * len(x) for x in ids], device=device)
        skip = T
    out = generate(model, input_ids, mask, eos_id=tokenizer.eos_id, **kw)
    return [tokenizer.decode(row[skip:].tolist()) for row in out]


def _prompt_ids(cfg, tokenizer, prompts: list[str], overlong: Overlong, max_new_tokens: int, pad: int) -> list:
    """Token ids of each prompt, framed (encoder-decoder sources) and fitted to max_seq_len."""
    out = []
    for i, p in enumerate(prompts, start=1):
        ids, i = tokenizer.encode(p), (i if len(prompts) > 1 else None)
        if cfg.is_encoder_decoder:
            bos = [tokenizer.bos_id] if tokenizer.bos_id is not None else []
            eos = [tokenizer.eos_id] if tokenizer.eos_id is not None else []
            text = fit_prompt(ids, cfg.max_seq_len, i, overlong, keep="first", reserve=len(bos) + len(eos))
            out.append(bos + text + eos or [pad])
        else:
            room = max(1, cfg.max_seq_len - max_new_tokens)  # a truncated prompt leaves room for the new tokens
            text = fit_prompt(ids, cfg.max_seq_len, i, overlong, keep="last", room=room)
            out.append(text or [pad if tokenizer.eos_id is None else tokenizer.eos_id])
    return out


def fit_prompt(
    ids: list[int],
    max_seq_len: int,
    number: int | None,
    overlong: Overlong,
    keep: Literal["first", "last"],
    *,
    reserve: int = 0,
    room: int | None = None,
) -> list[int]:
    """A prompt's ids (prompt `number` of several, or the only one) unchanged when they fit max_seq_len with the
    `reserve` framing tokens; otherwise an LMForgeError (overlong="error") or, with a warning on stderr, its first /
    last tokens that fit `room` (default max_seq_len) with the framing. Decoders keep the end of a prompt (the
    part the continuation follows) and leave room for the new tokens; encoder-decoders keep the start of a source."""
    total = len(ids) + reserve
    if total <= max_seq_len:
        return ids
    name = "prompt" if number is None else f"prompt {number}"
    if overlong == "error":
        raise LMForgeError(
            f"{name} has {total} tokens, more than the model's max_seq_len {max_seq_len} "
            "(shorten it, or truncate it: --overlong truncate)"
        )
    n = max(1, (room if room is not None else max_seq_len) - reserve)
    print(
        f"warning: {name} has {total} tokens, more than max_seq_len {max_seq_len}: kept its {keep} {n}",
        file=sys.stderr,
    )
    return ids[:n] if keep == "first" else ids[-n:]
