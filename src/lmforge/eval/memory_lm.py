"""Evaluation with memory (Transformer-XL §4): a token stream scored in consecutive segments of seq_len tokens, each
attending to the cached hidden states of the mem_len tokens before it.

The paper evaluates its WikiText-103 base model on segments of 64 tokens with 640 of memory and relative distances
clamped at 400 (model.clamp_len); mem_len = 0 gives the vanilla model's segment-by-segment evaluation, every
segment scored without context.

- `evaluate_with_memory`: a prepared split's stream, cut into `batch_size` rows (data/corpus/stream.py), each scored
  from its start;
- `score_documents_with_memory`: documents of any text (`lmforge eval RUN --text FILE` on a Transformer-XL run),
  each its own stream started after BOS/EOS with an empty memory, every token predicted once, as the plain
  windows of eval/text.py predict them. Documents run `batch_size` at a time, right-padded: a causal model's real
  tokens never see the padding after them, in the segment or in the memory."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from lmforge.data.corpus.stream import StreamLoader
from lmforge.errors import LMForgeError
from lmforge.eval.lm import LM
from lmforge.models.pretrained import find_pretrained
from lmforge.objectives.losses import lm_head_loss
from lmforge.progress import progress


@dataclass
class MemoryEval:
    loss: float
    """Mean negative log-likelihood (nats/token) of every scored token."""
    n_tokens: int

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.loss, 50.0))


@torch.no_grad()
def evaluate_with_memory(
    model: torch.nn.Module,
    data_dir: str | Path,
    *,
    seq_len: int,
    mem_len: int,
    split: str = "val",
    batch_size: int = 8,
    max_batches: int | None = None,
) -> MemoryEval:
    """Mean loss of a Transformer-XL decoder over consecutive segments of a prepared split, carrying memory."""
    cfg = model.config
    if not cfg.position_scheme.recurrent or not cfg.is_decoder:
        raise LMForgeError(f"model '{cfg.name}' is not a Transformer-XL decoder (model.position='xl', arch decoder)")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    loader = StreamLoader(Path(data_dir), split, seq_len=seq_len, batch_size=batch_size)  # type: ignore[arg-type]
    total, n, mems = 0.0, 0, None
    n_batches = (loader.row_len - 1) // seq_len
    n_batches = n_batches if max_batches is None else min(n_batches, max_batches)
    for tokens in progress(loader.eval_batches(max_batches), total=n_batches, desc="eval with memory", unit="seg"):
        tokens = tokens.to(device)
        out = model(tokens[:, :-1], mems=mems, use_mems=True, mem_len=mem_len, return_logits=False)
        mems = out.mems
        labels = tokens[:, 1:]
        total += float(lm_head_loss(model, out.last_hidden_state, labels)) * labels.numel()
        n += labels.numel()
    model.train(was_training)
    return MemoryEval(total / max(n, 1), n)


def check_memory_model(model: torch.nn.Module) -> None:
    """LMForgeError unless the model is a Transformer-XL decoder (segment recurrence with memory)."""
    cfg = model.config
    if not cfg.position_scheme.recurrent or not cfg.is_decoder:
        raise LMForgeError(
            f"--segment and --mem-len score a Transformer-XL decoder (model.position='xl', arch decoder) with memory; "
            f"model '{cfg.name}' is a{'n' if cfg.arch[0] == 'e' else ''} {cfg.arch} with position '{cfg.position}'"
        )


def _run_memory_defaults(model: torch.nn.Module, run_config: dict | None) -> tuple[int, int]:
    """(segment, mem_len) a Transformer-XL run validated with: objective.eval_seq_len or train.seq_len, and
    objective.eval_mem_len or model.mem_len; a model without a run config (a Hugging Face dir) uses max_seq_len
    and its mem_len."""
    cfg = model.config
    run_config = run_config or {}
    objective = run_config.get("objective") or {}
    train = run_config.get("train") or {}
    segment = objective.get("eval_seq_len") or train.get("seq_len") or cfg.max_seq_len
    mem_len = objective.get("eval_mem_len")
    return int(segment), int(cfg.mem_len if mem_len is None else mem_len)


MEMORY_FLAGS = ("--segment", "--mem-len")


def memory_flags(
    args: list[str], segment: int | None = None, mem_len: int | None = None
) -> tuple[int | None, int | None, list[str]]:
    """(segment, mem_len, the other arguments) from command-line arguments `--segment N` / `--mem-len N` (or
    `--flag=N`); LMForgeError for a missing or bad value."""
    values = {"--segment": segment, "--mem-len": mem_len}
    rest: list[str] = []
    i = 0
    while i < len(args):
        flag, eq, value = args[i].partition("=")
        if flag not in MEMORY_FLAGS:
            rest.append(args[i])
            i += 1
            continue
        if not eq:
            value = args[i + 1] if i + 1 < len(args) else ""
            i += 1
        i += 1
        least = 1 if flag == "--segment" else 0
        if not value.lstrip("-").isdigit() or int(value) < least:
            raise LMForgeError(f"{flag} must be an integer >= {least}, got '{value}'")
        values[flag] = int(value)
    return values["--segment"], values["--mem-len"], rest


def memory_setting(
    model: torch.nn.Module, path: str, stride: int | None, segment: int | None, mem_len: int | None
) -> tuple[int, int] | None:
    """(segment, mem_len) of the segment-recurrent evaluation of a run's model, or None for plain windows.

    A Transformer-XL decoder is scored with memory unless only --stride is given (plain windows); --segment and
    --mem-len default to the run's validation setting and need such a model."""
    cfg = model.config
    xl_decoder = cfg.position_scheme.recurrent and cfg.is_decoder
    if segment is None and mem_len is None and (stride is not None or not xl_decoder):
        return None
    check_memory_model(model)
    if stride is not None:
        raise LMForgeError("--stride sets plain windows; a Transformer-XL run scored with memory takes --segment")
    default_segment, default_mem = _run_memory_defaults(model, find_pretrained(Path(path))[1])
    return segment or default_segment, default_mem if mem_len is None else mem_len


@torch.no_grad()
def score_documents_with_memory(lm: LM, documents: list[str], *, segment: int, mem_len: int) -> tuple[float, int]:
    """(total negative log-likelihood in nats, tokens scored) of `documents` under the Transformer-XL decoder of
    `lm`, segment by segment with memory (see the module docstring)."""
    model = lm.model
    check_memory_model(model)
    if segment < 1 or mem_len < 0:
        raise LMForgeError(f"--segment must be >= 1 and --mem-len >= 0, got {segment} and {mem_len}")
    full = [[lm.prefix_id] + lm.tokenizer.encode(d) for d in documents]
    order = sorted(range(len(full)), key=lambda i: -len(full[i]))
    nll, n_tokens = 0.0, 0
    for b in progress(range(0, len(order), lm.batch_size), desc="scoring with memory", unit="batch"):
        rows = [full[i] for i in order[b : b + lm.batch_size]]
        T = max(len(r) for r in rows) - 1  # predictions of the longest row
        ids = torch.full((len(rows), T + 1), lm.pad_id, dtype=torch.long)
        targets = torch.full((len(rows), T), -100, dtype=torch.long)
        for r, row in enumerate(rows):
            ids[r, : len(row)] = torch.tensor(row)
            targets[r, : len(row) - 1] = torch.tensor(row[1:])
        inputs, targets = ids[:, :-1].to(lm.device), targets.to(lm.device)
        mems = None
        for start in range(0, T, segment):
            out = model(inputs[:, start : start + segment], mems=mems, use_mems=mem_len > 0, mem_len=mem_len,
                        return_logits=False)  # fmt: skip
            mems = out.mems
            logits = model.logits(out.last_hidden_state).float()
            tgt = targets[:, start : start + segment]
            nll += float(F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=-100, reduction="sum"))
            n_tokens += int((tgt != -100).sum())
    return nll, n_tokens
