"""The unigram plateau of a pretraining objective: the cross-entropy of the best predictor of its validation targets
that reads no context. A run that has not left it has learnt token frequencies and nothing else, so a comparison
or a parity check between two runs counts only below it. The training-parity harness (bench/train_parity.py)
records it beside every run, and the recipes' CPU test (tests/test_recipes_train_at_every_preset.py) checks the
tiny presets leave it."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

from lmforge.data.corpus.loader import token_counts

LEARNT = 0.05
"""Nats below its plateau a run's loss must end for the run to count as having learnt more than token frequencies
(the training-parity verdicts, the experiment report's claims)."""


def unigram_log_probs(data_dir: Path) -> torch.Tensor:
    """(V,) log-probabilities of the add-one-smoothed unigram model fit on the train split of a prepared dir: the
    model whose validation cross-entropy a pretraining run prints as its unigram baseline."""
    counts = token_counts(data_dir, "train") + 1.0
    return torch.from_numpy(np.log(counts) - np.log(counts.sum()))


def context_free_floor(rows: list[torch.Tensor], log_u: torch.Tensor, special: torch.Tensor) -> float:
    """Cross-entropy (nats/target) of the best predictor of these targets that reads no context: a text token
    costs its unigram surprisal, and a special token (T5's sentinels, an end-of-sequence) costs the surprisal of the
    structure, P(special | text tokens since the last one), taken from these targets themselves (so it is lower than
    any structure model learnt elsewhere). A masked LM's targets are all text, BART's almost all; T5's are a quarter
    structure, which a model predicts without reading its input."""
    states = []
    for row in rows:  # (L,) the scored targets of one row, in order
        i = torch.arange(len(row))
        last = torch.cummax(torch.where(torch.isin(row, special), i, -1), 0).values  # last special at or before i
        since = i - torch.cat([torch.tensor([-1]), last[:-1]]) - 1  # text tokens since the last special before i
        states.append(torch.where(i == 0, -1, since) + 1)  # 0: a row's first target
    state, target = torch.cat(states), torch.cat(rows)
    sp = torch.isin(target, special)
    h = torch.bincount(state, weights=sp.double()) / torch.bincount(state).double()  # P(special | state)
    p = torch.where(sp, h[state], (1 - h[state]) * log_u.exp()[target])
    return float(-torch.log(p).mean())


def special_ids(tokenizer) -> torch.Tensor:
    """The tokenizer's special tokens and sentinels, sorted."""
    ids = [tokenizer.token_to_id(t) for t in tokenizer.special_tokens.values()]
    ids += tokenizer.sentinel_ids(tokenizer.num_sentinels)
    return torch.tensor(sorted({i for i in ids if i is not None}), dtype=torch.long)


def target_rows(batches: Iterable[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
    """The scored targets (labels other than -100) of each row of each batch, on the CPU."""
    return [row[row != -100] for b in batches for row in b["labels"].detach().cpu()]


def plateau(batches: Iterable[dict[str, torch.Tensor]], tokenizer, data_dir: Path) -> float:
    """The context-free floor of these batches' language-model targets (an objective's `transform` output)."""
    return context_free_floor(target_rows(batches), unigram_log_probs(data_dir), special_ids(tokenizer))
