"""The log-likelihood of whole sentences under a model of any of the three families, for zero-shot comparisons of
sentences (grammatical minimal pairs: eval/minimal_pairs.py) and the pseudo-bits per byte of text under an encoder
(eval/text.py). Each scorer gives every text its total log-probability in nats and the number of tokens scored.

- Decoders (`CausalScorer`): the sum of log P(token | the tokens before it), the first token predicted after BOS
  (EOS where the tokenizer has no BOS, as GPT-2's <|endoftext|>), no EOS scored at the end: lm-evaluation-harness's
  `loglikelihood_rolling`, and its BLiMP task (an empty context, which lm_eval 0.4 replaces with BOS or EOS, the
  sentence as the continuation). A text longer than the context is scored in the harness's rolling windows.
- Encoder-decoders (`Seq2SeqScorer`): the decoder's log-likelihood of the sentence followed by EOS, the decoder
  starting from `decoder_start_id`, given an empty input (the empty text as the tokenizer frames a text: T5 `</s>`,
  BART `<s></s>`). BabyLM's 2023 pipeline scored T5 so: the empty context became the EOS text, the sentence, with the
  EOS the T5 tokenizer appends, the decoder's labels.
- Encoders (`PseudoLogLikelihood`): the pseudo-log-likelihood of Salazar et al. 2020, the sum over the tokens of
  log P(token | every other token), each token masked in turn in `[CLS] sentence [SEP]` (the specials unmasked and
  unscored), as minicons' MLM scorer and BabyLM's pipelines do. All masked copies of a sentence go through one
  forward pass and only the masked positions reach the LM head. A text longer than max_seq_len - 2 tokens is cut
  into windows scored on their own. An ELECTRA discriminator has no MLM head: the generator its pretraining run
  trained beside it scores instead (`electra_generator`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch import Tensor

from lmforge.errors import LMForgeError
from lmforge.eval.lm import LM
from lmforge.progress import progress


@dataclass
class SentenceScore:
    logprob: float
    """Total log-probability of the text's tokens (pseudo-log-likelihood for an encoder), nats."""
    tokens: int
    """Tokens scored (with the EOS an encoder-decoder scores)."""


class SentenceScorer(Protocol):
    measure: str
    """"log-likelihood" or "pseudo-log-likelihood"."""

    def score(self, texts: Sequence[str]) -> list[SentenceScore]: ...


def _float(logits: Tensor) -> Tensor:
    """At least fp32 for the softmax (a float64 model stays float64)."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def _device(model) -> torch.device:
    return next(model.parameters()).device


class CausalScorer:
    """A decoder's log-likelihood of each text (see the module docstring)."""

    measure = "log-likelihood"

    def __init__(self, model, tokenizer, batch_size: int = 16) -> None:
        self.lm = LM(model, tokenizer, batch_size=batch_size)

    def score(self, texts: Sequence[str]) -> list[SentenceScore]:
        out = []
        for parts in self.lm.score_rolling(list(texts)):
            out.append(SentenceScore(sum(p.total for p in parts), sum(len(p.logprobs) for p in parts)))
        return out


class Seq2SeqScorer:
    """An encoder-decoder's log-likelihood of each text + EOS as decoder output, given an empty input."""

    measure = "log-likelihood"

    def __init__(self, model, tokenizer, batch_size: int = 16) -> None:
        cfg = model.config
        if not cfg.is_encoder_decoder or not cfg.lm_head:
            raise LMForgeError(f"model '{cfg.name}' ({cfg.arch}) is not an encoder-decoder with an LM head")
        self.model, self.tokenizer, self.batch_size = model.eval(), tokenizer, batch_size
        self.source = [i for i in (tokenizer.bos_id, tokenizer.eos_id) if i is not None] or [cfg.pad_id]
        self.eos = [tokenizer.eos_id] if tokenizer.eos_id is not None else []
        self.limit = cfg.max_positions  # None: relative positions (T5) bound no length

    def targets(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text) + self.eos
        if self.limit is not None and len(ids) > self.limit:
            raise LMForgeError(f"{text[:40]!r}…: {len(ids)} tokens, more than the decoder's {self.limit} positions")
        return ids

    @torch.no_grad()
    def score(self, texts: Sequence[str]) -> list[SentenceScore]:
        rows = [self.targets(t) for t in texts]
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
        out: list[SentenceScore | None] = [None] * len(rows)
        cfg, dev = self.model.config, _device(self.model)
        for b in progress(range(0, len(order), self.batch_size), desc="scoring", unit="batch"):
            idx = order[b : b + self.batch_size]
            T = max(len(rows[i]) for i in idx)
            dec = torch.full((len(idx), T), cfg.pad_id, dtype=torch.long)
            tgt = torch.full((len(idx), T), -100, dtype=torch.long)
            for r, i in enumerate(idx):  # teacher forcing: the decoder reads [start] + target[:-1]
                dec[r, : len(rows[i])] = torch.tensor([cfg.decoder_start_id] + rows[i][:-1])
                tgt[r, : len(rows[i])] = torch.tensor(rows[i])
            src = torch.tensor([self.source] * len(idx), device=dev)
            dec, tgt = dec.to(dev), tgt.to(dev)
            dec_mask = (tgt != -100).long()
            out_h = self.model(src, torch.ones_like(src), decoder_input_ids=dec, decoder_attention_mask=dec_mask,
                               return_logits=False)  # fmt: skip
            h = out_h.last_hidden_state  # (B, T, d)
            logp = _float(self.model.logits(h)).log_softmax(-1)  # (B, T, V)
            picked = logp.gather(-1, tgt.clamp(min=0).unsqueeze(-1)).squeeze(-1) * (tgt != -100)
            for r, i in enumerate(idx):
                out[i] = SentenceScore(float(picked[r].sum()), len(rows[i]))
        return out  # type: ignore[return-value]


class PseudoLogLikelihood:
    """An encoder's pseudo-log-likelihood of each text (Salazar et al. 2020; see the module docstring)."""

    measure = "pseudo-log-likelihood"

    def __init__(self, model, tokenizer, batch_size: int = 16) -> None:
        cfg = model.config
        if not cfg.is_encoder or not cfg.lm_head:
            raise LMForgeError(f"model '{cfg.name}' ({cfg.arch}) is not an encoder with an MLM head")
        if tokenizer.mask_id is None:
            raise LMForgeError(f"the tokenizer (family {tokenizer.family}) has no mask token to score an encoder with")
        self.model, self.tokenizer, self.batch_size = model.eval(), tokenizer, batch_size
        cls = tokenizer.cls_id if tokenizer.cls_id is not None else tokenizer.bos_id
        sep = tokenizer.sep_id if tokenizer.sep_id is not None else tokenizer.eos_id
        self.cls, self.sep = [cls] if cls is not None else [], [sep] if sep is not None else []
        self.pad = tokenizer.pad_id if tokenizer.pad_id is not None else cfg.pad_id
        self.window = cfg.max_seq_len - len(self.cls) - len(self.sep)
        """Tokens of text per forward row: a longer text is cut into windows of this many."""

    def windows(self, ids: list[int]) -> list[list[int]]:
        return [ids[i : i + self.window] for i in range(0, len(ids), self.window)]

    def masked_copies(self, chunk: list[int]) -> tuple[Tensor, Tensor]:
        """(rows (n, L), masked column of each row (n,)) for a window of n tokens framed by CLS/SEP: row i is the
        window with its i-th token replaced by the mask token."""
        framed = torch.tensor(self.cls + chunk + self.sep)
        n = len(chunk)
        cols = torch.arange(n) + len(self.cls)
        rows = framed.repeat(n, 1)
        rows[torch.arange(n), cols] = self.tokenizer.mask_id
        return rows, cols

    @torch.no_grad()
    def score(self, texts: Sequence[str]) -> list[SentenceScore]:
        chunks = [(i, c) for i, ids in enumerate(self.tokenizer.encode_batch(list(texts))) for c in self.windows(ids)]
        chunks.sort(key=lambda x: -len(x[1]))
        logprob, tokens = [0.0] * len(texts), [0] * len(texts)
        for b in progress(range(0, len(chunks), self.batch_size), desc="scoring", unit="batch"):
            batch = chunks[b : b + self.batch_size]
            sums = self._batch([c for _, c in batch])
            for (i, c), s in zip(batch, sums.tolist()):
                logprob[i] += s
                tokens[i] += len(c)
        return [SentenceScore(lp, n) for lp, n in zip(logprob, tokens)]

    def _batch(self, chunks: list[list[int]]) -> Tensor:
        """The pseudo-log-likelihood of each window: all its masked copies in this one forward pass."""
        copies = [self.masked_copies(c) for c in chunks]
        L = max(r.shape[1] for r, _ in copies)
        ids = torch.cat([torch.nn.functional.pad(r, (0, L - r.shape[1]), value=self.pad) for r, _ in copies])
        mask = torch.cat([torch.nn.functional.pad(torch.ones_like(r), (0, L - r.shape[1])) for r, _ in copies])
        cols = torch.cat([c for _, c in copies])
        target = torch.cat([torch.tensor(c) for c in chunks])
        owner = torch.cat([torch.full((len(c),), k) for k, c in enumerate(chunks)])
        dev = _device(self.model)
        ids, mask, cols, target, owner = (t.to(dev) for t in (ids, mask, cols, target, owner))
        h = self.model(ids, mask, return_logits=False).last_hidden_state  # (R, L, d)
        h = h[torch.arange(len(cols), device=dev), cols]  # (R, d): the masked positions only
        logp = _float(self.model.logits(h)).log_softmax(-1).gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (R,)
        return torch.zeros(len(chunks), dtype=logp.dtype, device=dev).index_add_(0, owner, logp).cpu()


def electra_generator(source: str | Path, device: torch.device | str = "cpu"):
    """The MLM generator an ELECTRA pretraining run (or one of its checkpoints) trained beside its discriminator,
    which is the model `lmforge.load` gives; None when `source` is no ELECTRA pretraining run (a Hugging Face dir, a
    fine-tuned run, another objective's run)."""
    from lmforge.checkpoint.read import load_weights
    from lmforge.models.presets import model_config_from_dict
    from lmforge.models.pretrained import find_pretrained
    from lmforge.objectives.electra import ElectraModel, ElectraOptions, generator_config

    try:
        c, cfg = find_pretrained(Path(source))
    except LMForgeError:
        return None
    objective = (cfg or {}).get("objective") or {}
    if objective.get("name") != "electra" or "model" not in cfg:
        return None
    names = {f.name for f in dataclasses.fields(ElectraOptions)}
    options = ElectraOptions(**{k: v for k, v in objective.items() if k in names})
    disc = model_config_from_dict(cfg["model"])
    pair = ElectraModel(disc, generator_config(disc, options.generator_scale, options.generator_preset))
    load_weights(c, pair)
    return pair.generator.to(device).eval()


def sentence_scorer(model, tokenizer, batch_size: int = 16, source: str | Path | None = None) -> SentenceScorer:
    """The scorer of `model`'s family: causal log-likelihood (decoders), the decoder's log-likelihood
    (encoder-decoders), pseudo-log-likelihood (encoders with an MLM head; an ELECTRA discriminator with the generator
    of its pretraining run `source`). One error line for a model none of them can score."""
    cfg = model.config
    if tokenizer is None:
        raise LMForgeError("the model has no tokenizer to encode sentences with")
    if cfg.is_encoder and not cfg.lm_head:
        generator = electra_generator(source, _device(model)) if source is not None else None
        if generator is None:
            where = f"{source} holds none" if source is not None else "none was given"
            raise LMForgeError(
                f"model '{cfg.name}' is an encoder without an MLM head (an ELECTRA discriminator, or a run exported "
                f"without its head): it cannot score sentences; an ELECTRA pretraining run is scored with the "
                f"generator it trained, and {where}"
            )
        return PseudoLogLikelihood(generator, tokenizer, batch_size)
    if cfg.is_encoder:
        return PseudoLogLikelihood(model, tokenizer, batch_size)
    if not cfg.lm_head:
        raise LMForgeError(f"model '{cfg.name}' ({cfg.arch}) has no LM head to score sentences with")
    kind = Seq2SeqScorer if cfg.is_encoder_decoder else CausalScorer
    return kind(model, tokenizer, batch_size)
