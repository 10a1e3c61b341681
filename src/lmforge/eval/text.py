"""Perplexity and bits per byte of a language model on any text (`lmforge eval RUN --text FILE`).

Each document (a .txt file, a JSONL line, a CSV row: `lmforge.data.read_documents`) is scored on its own, its first
token after BOS/EOS. A document longer than the model's context is scored in sliding windows (`eval.lm.
rolling_windows`): every token is predicted exactly once, after up to max_seq_len - stride tokens of context
(the stride defaults to the whole context, as lm-eval-harness's rolling log-likelihood; a smaller stride gives each
prediction more context at more compute, as in Hugging Face's perplexity guide). Perplexity is exp of the mean
negative log-likelihood per token; bits per byte is the total negative log-likelihood in bits over the UTF-8
bytes of the text, which compares across tokenizers.

Encoder-decoders score each window as decoder output after the text before it as encoder input (`eval.lm`).
Encoders have no left-to-right likelihood: they get the pseudo-log-likelihood of Salazar et al. 2020 (each token
masked in turn, `eval.sentence_scores`; an ELECTRA run's generator), in windows of max_seq_len - 2 tokens scored on
their own, and the same quantities labelled pseudo- (pseudo-perplexity, pseudo-bits per byte). They rank encoders
among themselves but are no likelihood: they are not comparable with a decoder's bits per byte."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from lmforge.errors import LMForgeError
from lmforge.eval.lm import LM
from lmforge.eval.memory_lm import memory_flags, memory_setting, score_documents_with_memory
from lmforge.eval.sentence_scores import PseudoLogLikelihood, sentence_scorer


@dataclass
class TextScore:
    documents: int
    tokens: int
    bytes: int
    nll: float
    """Total negative log-likelihood, nats."""
    context: int
    stride: int
    mem_len: int | None = None
    """Transformer-XL segment recurrence: tokens of memory, `context` the segment length (= stride); None for plain
    windows."""
    pseudo: bool = False
    """Pseudo-log-likelihood (an encoder's), not a log-likelihood: every derived quantity is a pseudo- one."""

    @property
    def loss(self) -> float:
        """Mean negative log-likelihood, nats per token."""
        return self.nll / max(self.tokens, 1)

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.loss, 700.0))

    @property
    def bits_per_byte(self) -> float:
        return self.nll / math.log(2) / max(self.bytes, 1)

    def as_dict(self) -> dict:
        d = asdict(self)
        del d["pseudo"]
        d |= {"loss": self.loss, "perplexity": self.perplexity, "bits_per_byte": self.bits_per_byte}
        if self.pseudo:  # pseudo_nll, pseudo_loss, pseudo_perplexity, pseudo_bits_per_byte
            d = {f"pseudo_{k}" if k in ("nll", "loss", "perplexity", "bits_per_byte") else k: v for k, v in d.items()}
        return {"scoring": "pseudo-log-likelihood" if self.pseudo else "log-likelihood", **d}

    def summary(self) -> str:
        """The scores as one line."""
        if self.pseudo:
            return (
                f"pseudo-loss {self.loss:.4f} nats/token, pseudo-perplexity {self.perplexity:.2f}, "
                f"{self.bits_per_byte:.4f} pseudo-bits/byte"
            )
        return f"loss {self.loss:.4f} nats/token, perplexity {self.perplexity:.2f}, {self.bits_per_byte:.4f} bits/byte"


def score_text(
    lm: LM, documents: list[str], stride: int | None = None, memory: tuple[int, int] | None = None
) -> TextScore:
    """Negative log-likelihood of every token of `documents` under `lm`'s model (see the module docstring);
    memory = (segment, mem_len): a Transformer-XL decoder's segment recurrence (eval/memory_lm.py) instead."""
    docs = [d for d in documents if d]
    if not docs:
        raise LMForgeError("no text to score: the input holds no non-empty document")
    n_bytes = sum(len(d.encode("utf-8")) for d in docs)
    if memory is not None:
        nll, tokens = score_documents_with_memory(lm, docs, segment=memory[0], mem_len=memory[1])
        return TextScore(len(docs), tokens, n_bytes, nll, memory[0], memory[0], memory[1])
    stride = lm.max_len if stride is None else stride
    nll, tokens = 0.0, 0
    for parts in lm.score_rolling(docs, stride=stride):
        for p in parts:
            nll -= p.total
            tokens += len(p.logprobs)
    return TextScore(len(docs), tokens, n_bytes, nll, lm.max_len, stride)


def score_text_pseudo(scorer: PseudoLogLikelihood, documents: list[str]) -> TextScore:
    """Pseudo-log-likelihood of every token of `documents` under an encoder (see the module docstring)."""
    docs = [d for d in documents if d]
    if not docs:
        raise LMForgeError("no text to score: the input holds no non-empty document")
    scores = scorer.score(docs)
    n_bytes = sum(len(d.encode("utf-8")) for d in docs)
    nll, tokens = -sum(s.logprob for s in scores), sum(s.tokens for s in scores)
    return TextScore(len(docs), tokens, n_bytes, nll, scorer.window, scorer.window, pseudo=True)


def cmd_text(
    path: str,
    text: str,
    *,
    stride: int | None = None,
    batch_size: int = 16,
    out: str | None = None,
    extra: list[str] | None = None,
    segment: int | None = None,
    mem_len: int | None = None,
) -> TextScore:
    """`lmforge eval RUN --text FILE`: print (and with `out`, write as JSON) the text's perplexity and bits per
    byte under the model of a run, checkpoint or Hugging Face dir. A Transformer-XL run is scored segment by segment
    with memory (`segment`, `mem_len`: default the run's validation setting), unless `stride` asks for plain windows.
    `extra`: other arguments given: --segment N and --mem-len N, the rest refused."""
    from lmforge.data.corpus.readers import read_documents
    from lmforge.loading import load

    segment, mem_len, extra = memory_flags(extra or [], segment, mem_len)
    if extra:
        raise LMForgeError(f"--text scores the text alone; it takes no {extra[0]}")
    if batch_size < 1:
        raise LMForgeError(f"--batch-size must be >= 1, got {batch_size}")
    if stride is not None and stride < 1:  # its upper bound, the context, is known once the model is loaded
        raise LMForgeError(f"--stride must be >= 1, got {stride}")
    file = Path(text)
    if not file.exists():
        raise LMForgeError(f"text file not found: {text}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tok = load(path, device=device)
    if tok is None:
        raise LMForgeError(f"{path} has no tokenizer to encode the text with")
    stream = read_documents([file])
    docs = list(stream)
    if stream.replaced_bytes:  # as pretraining warns of its inputs: the scores are of the text with U+FFFD in it
        print(f"warning: {file}: {stream.replaced_bytes} bytes are not valid UTF-8 and were replaced with U+FFFD",
              file=sys.stderr)  # fmt: skip
    memory = memory_setting(model, path, stride, segment, mem_len)  # --segment / --mem-len: a Transformer-XL's only
    if model.config.is_encoder:
        if stride is not None:
            raise LMForgeError(
                "--stride: an encoder's pseudo-log-likelihood scores each window of max_seq_len - 2 tokens on its own; "
                "the sliding windows are a decoder's and an encoder-decoder's"
            )
        score = score_text_pseudo(sentence_scorer(model, tok, batch_size, source=path), docs)
    else:
        score = score_text(LM(model, tok, batch_size=batch_size), docs, stride, memory)
    if not math.isfinite(score.loss):
        raise LMForgeError(
            f"the model's loss on {file} is {score.loss}: its weights give non-finite values, as those of a run that "
            "diverged do; use an earlier checkpoint"
        )
    how = f"windows: context {score.context}, stride {score.stride}"
    if score.pseudo:
        how = f"pseudo-log-likelihood: windows of {score.context} tokens, each token masked in turn"
    elif score.mem_len is not None:
        how = f"Transformer-XL segment recurrence: segments of {score.context}, memory {score.mem_len}"
    print(
        f"{file}: {score.documents} document(s), {score.tokens:,} tokens, {score.bytes:,} bytes ({how})\n"
        f"{score.summary()}"
    )
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps({"file": str(file), **score.as_dict()}, indent=2) + "\n", encoding="utf-8")
        print(f"results written to {out}")
    return score
