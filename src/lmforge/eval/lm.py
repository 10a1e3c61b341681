"""The language-model interface of zero/few-shot evaluation, as lm-eval-harness defines it: three batched methods
over (context, continuation) requests.

- `loglikelihood([(context, continuation), ...])` → [(log P(continuation | context), is_greedy), ...];
- `loglikelihood_rolling([text, ...])` → [log P(text), ...] (the first token conditioned on BOS/EOS; a text longer
  than the context window is scored in windows that predict each token once, each window filled with as much
  preceding text as fits: the harness's rolling windows, and with a `stride` the sliding windows of Hugging Face's
  perplexity guide);
- `generate_until([(context, until, max_tokens), ...])` → continuations cut at the first `until` string.

Tokenization follows the harness: the context's trailing whitespace moves to the continuation; a decoder's
continuation tokens are those of `context + continuation` after the context's (so both tokenize as the text
would), an encoder-decoder's are encoded on their own. Decoders score the continuation after the context;
encoder-decoders encode the context and score the continuation as decoder output. Requests are sorted by length
and run in right-padded batches; the log-probabilities of all continuation tokens of a batch come from one
gather."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from lmforge.errors import LMForgeError
from lmforge.progress import progress


@dataclass
class Scored:
    logprobs: list[float]
    """log P of each continuation token."""
    is_greedy: bool
    """Whether greedy decoding would produce exactly the continuation tokens."""

    @property
    def total(self) -> float:
        return sum(self.logprobs)

    @property
    def mean(self) -> float:
        return self.total / max(len(self.logprobs), 1)


def split_trailing_space(context: str, continuation: str) -> tuple[str, str]:
    """Move the context's trailing whitespace to the continuation (so " positive" tokenizes as one BPE word)."""
    stripped = context.rstrip()
    return stripped, context[len(stripped) :] + continuation


def rolling_windows(n_tokens: int, max_len: int, stride: int | None = None) -> list[tuple[int, int, int]]:
    """Windows (start, first, end) over the ids `full` = [BOS/EOS] + the n_tokens tokens of a text: each feeds
    full[start:end] (at most max_len tokens) and scores the predictions of full[first + 1 : end + 1], so every token
    is predicted once. The first window predicts min(max_len, n_tokens) tokens, each later one `stride` (default
    max_len) more, after the max_len - stride tokens before them (the last window: after as many as fit)."""
    stride = max_len if stride is None else stride
    if not 1 <= stride <= max_len:
        raise LMForgeError(f"stride must be between 1 and the context length {max_len}, got {stride}")
    out, first, end = [], 0, min(max_len, n_tokens)
    while first < n_tokens:
        out.append((max(0, end - max_len), first, end))
        first, end = end, min(end + stride, n_tokens)
    return out


class LM:
    """Zero/few-shot scoring and generation with an lmforge model (decoder or encoder-decoder with an LM head),
    which it puts in eval mode."""

    def __init__(self, model, tokenizer, batch_size: int = 16, device: str | torch.device | None = None) -> None:
        cfg = model.config
        if cfg.is_encoder or not cfg.lm_head:
            raise LMForgeError(f"model '{cfg.name}' ({cfg.arch}) cannot score text: it needs an LM head on a decoder")
        self.model, self.tokenizer, self.batch_size = model.eval(), tokenizer, batch_size
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.seq2seq = cfg.is_encoder_decoder
        self.max_len = cfg.max_seq_len
        tok = tokenizer
        self.prefix_id = next((i for i in (tok.bos_id, tok.eos_id, tok.pad_id) if i is not None), 0)
        self.pad_id = next((i for i in (tok.pad_id, tok.eos_id) if i is not None), 0)

    # --- the three harness methods ----------------------------------------------------------------------------

    def loglikelihood(self, requests: Sequence[tuple[str, str]]) -> list[tuple[float, bool]]:
        return [(s.total, s.is_greedy) for s in self.score(requests)]

    def loglikelihood_rolling(self, texts: Sequence[str]) -> list[float]:
        return [sum(s.total for s in parts) for parts in self.score_rolling(texts)]

    def generate_until(
        self,
        requests: Sequence[tuple[str, list[str], int]],
        *,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
    ) -> list[str]:
        """Continuations of at most max_tokens tokens, cut before the first `until` string (temperature 0: greedy).

        Requests run longest prompt first in batches; a batch stops once every row has met a stop string, EOS or
        its own max_tokens."""
        from lmforge.models.generate import generate

        prompts = [self._prompt_ids(ctx, n) for ctx, _, n in requests]
        order = sorted(range(len(requests)), key=lambda i: -len(prompts[i]))
        out: list[str] = [""] * len(requests)
        for b in range(0, len(order), self.batch_size):
            idx = order[b : b + self.batch_size]
            limits = [requests[i][2] for i in idx]
            untils = [[u for u in requests[i][1] if u] for i in idx]
            room = self.max_len if self.seq2seq else max(1, self.max_len - max(limits))  # the batch's new tokens fit
            ids, mask = self._pad([prompts[i][-room:] for i in idx], left=not self.seq2seq)
            gen = generate(
                self.model, ids, mask, max_new_tokens=max(limits), temperature=temperature, top_k=top_k,
                top_p=top_p, eos_id=self.tokenizer.eos_id, generator=generator, stop=self._stopper(untils, limits),
            )  # fmt: skip
            new = gen[:, 1:] if self.seq2seq else gen[:, ids.shape[1] :]
            for i, until, n, row in zip(idx, untils, limits, new.tolist()):
                out[i] = self._cut(row[:n], until)
        return out

    def _cut(self, row: list[int], until: list[str]) -> str:
        if self.tokenizer.eos_id in row:
            row = row[: row.index(self.tokenizer.eos_id)]
        text = self.tokenizer.decode(row)
        return text[: min([text.index(u) for u in until if u in text], default=len(text))]

    def _stopper(self, untils: list[list[str]], limits: list[int]) -> Callable[[Tensor], Tensor]:
        """Rows done: a stop string in their text, or their own token limit reached (new tokens (B, i))."""

        def stop(tokens: Tensor) -> Tensor:
            done = [tokens.shape[1] >= n for n in limits]
            if any(untils):
                texts = self.tokenizer.decode_batch(tokens.tolist())
                done = [d or any(u in t for u in us) for d, t, us in zip(done, texts, untils)]
            return torch.tensor(done, device=tokens.device)

        return stop

    # --- scoring with per-token detail --------------------------------------------------------------------------

    def score(self, requests: Sequence[tuple[str, str]]) -> list[Scored]:
        """Per-token log-probs of each continuation given its context (empty context: BOS/EOS)."""
        return self._score_rows([self.encode_pair(context, continuation) for context, continuation in requests])

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Context and continuation token ids, tokenized as the harness does (see the module docstring)."""
        context, continuation = split_trailing_space(context, continuation)
        tok = self.tokenizer
        ctx = tok.encode(context) if context else []
        cont = None
        if ctx and not self.seq2seq:
            whole = tok.encode(context + continuation)
            if whole[: len(ctx)] == ctx:  # else the context's tokens merge across the boundary: encode apart
                cont = whole[len(ctx) :]
        cont = tok.encode(continuation) if cont is None else cont
        if not cont:
            raise LMForgeError(f"empty continuation after context {context[-40:]!r}")
        return ctx, cont

    def score_rolling(self, texts: Sequence[str], stride: int | None = None) -> list[list[Scored]]:
        """Each text's windows (`rolling_windows`: the first token after BOS/EOS, every token scored once)."""
        rows, owner = [], []
        for i, text in enumerate(texts):
            ids = self.tokenizer.encode(text)
            full = [self.prefix_id] + ids
            for start, first, end in rolling_windows(len(ids), self.max_len, stride):
                rows.append((full[start : first + 1], full[first + 1 : end + 1]))
                owner.append(i)
        out: list[list[Scored]] = [[] for _ in texts]
        for i, scored in zip(owner, self._score_rows(rows)):
            out[i].append(scored)
        return out

    def _score_rows(self, rows: list[tuple[list[int], list[int]]]) -> list[Scored]:
        order = sorted(range(len(rows)), key=lambda i: -(len(rows[i][0]) + len(rows[i][1])))
        out: list[Scored | None] = [None] * len(rows)
        for b in progress(range(0, len(order), self.batch_size), desc="scoring", unit="batch"):
            idx = order[b : b + self.batch_size]
            batch = [rows[i] for i in idx]
            scored = self._score_seq2seq(batch) if self.seq2seq else self._score_decoder(batch)
            for i, s in zip(idx, scored):
                out[i] = s
        return out  # type: ignore[return-value]

    @torch.no_grad()
    def _score_decoder(self, batch: list[tuple[list[int], list[int]]]) -> list[Scored]:
        inputs, n_cont = [], []
        for ctx, cont in batch:
            ctx = ctx or [self.prefix_id]  # the first token is predicted after BOS/EOS
            whole = (ctx + cont)[-(self.max_len + 1) :]  # keep the end: truncate the context from the left
            n = min(len(cont), len(whole) - 1)
            inputs.append(whole[:-1])
            n_cont.append((whole[-n:], n))
        ids, mask = self._pad(inputs, left=False)
        targets = torch.full_like(ids, -100)
        for r, (inp, (tgt, n)) in enumerate(zip(inputs, n_cont)):
            targets[r, len(inp) - n : len(inp)] = torch.tensor(tgt)
        prefix = None
        if self.model.config.mask == "prefix":  # a prefix LM sees its context bidirectionally
            prefix = torch.tensor([len(inp) - n for inp, (_, n) in zip(inputs, n_cont)], device=self.device)
        hidden = self.model(ids, mask, prefix_len=prefix, return_logits=False).last_hidden_state
        return self._gather(self.model.logits(hidden).float(), targets)

    @torch.no_grad()
    def _score_seq2seq(self, batch: list[tuple[list[int], list[int]]]) -> list[Scored]:
        tok = self.tokenizer
        bos = [tok.bos_id] if tok.bos_id is not None else []
        eos = [tok.eos_id] if tok.eos_id is not None else []
        sources = [(bos + ctx + eos)[-self.max_len :] or [self.pad_id] for ctx, _ in batch]
        conts = [cont[: self.max_len] for _, cont in batch]
        start = self.model.config.decoder_start_id
        ids, mask = self._pad(sources, left=False)
        dec, dec_mask = self._pad([[start] + c[:-1] for c in conts], left=False)
        targets = torch.full_like(dec, -100)
        for r, c in enumerate(conts):
            targets[r, : len(c)] = torch.tensor(c)
        out = self.model(ids, mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask, return_logits=False)
        return self._gather(self.model.logits(out.last_hidden_state).float(), targets)

    def _gather(self, logits: Tensor, targets: Tensor) -> list[Scored]:
        """Per-row log-probs of the target tokens (targets -100 elsewhere). logits: (B, T, V), targets: (B, T)."""
        logp = logits.log_softmax(-1)
        mask = targets != -100
        picked = logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # (B, T)
        greedy = (logits.argmax(-1) == targets) | ~mask
        out = []
        for r in range(targets.shape[0]):
            out.append(Scored(picked[r][mask[r]].tolist(), bool(greedy[r].all())))
        return out

    # --- helpers -------------------------------------------------------------------------------------------------

    def _prompt_ids(self, context: str, max_new: int) -> list[int]:
        ids = self.tokenizer.encode(context) or [self.prefix_id]
        if self.seq2seq:
            tok = self.tokenizer
            bos = [tok.bos_id] if tok.bos_id is not None else []
            eos = [tok.eos_id] if tok.eos_id is not None else []
            return (bos + ids + eos)[-self.max_len :]
        return ids[-max(1, self.max_len - max_new) :]  # keep the end, leave room for the new tokens

    def _pad(self, seqs: list[list[int]], left: bool) -> tuple[Tensor, Tensor]:
        T = max(len(s) for s in seqs)
        pad = [[self.pad_id] * (T - len(s)) for s in seqs]
        ids = [p + s if left else s + p for s, p in zip(seqs, pad)]
        mask = [[0] * len(p) + [1] * len(s) if left else [1] * len(s) + [0] * len(p) for s, p in zip(seqs, pad)]
        return torch.tensor(ids, device=self.device), torch.tensor(mask, device=self.device)
