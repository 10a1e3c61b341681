"""lmforge.eval.plateau: the context-free floor of a set of targets, against its definition computed by hand."""

from __future__ import annotations

import math

import torch

from lmforge.eval.plateau import context_free_floor


def test_text_targets_cost_their_unigram_surprisal():
    log_u = torch.log(torch.tensor([0.5, 0.25, 0.125, 0.125], dtype=torch.float64))
    rows = [torch.tensor([0, 1, 2]), torch.tensor([3, 0])]
    want = -(math.log(0.5) + math.log(0.25) + math.log(0.125) + math.log(0.125) + math.log(0.5)) / 5
    assert math.isclose(context_free_floor(rows, log_u, torch.tensor([9])), want, rel_tol=1e-12)


def test_a_special_costs_the_surprisal_of_the_structure_given_the_text_since_the_last_one():
    """Rows `S a S b` and `a a`. A target's state is 1 + the text tokens since the last special before it (0 for a
    row's first target): S 0, a 1, S 2, b 1 / a 0, a 2. P(special | state) is read off these targets: state 0 holds
    S and a (1/2), state 1 a and b (0), state 2 S and a (1/2)."""
    s, a, b = 5, 0, 1
    log_u = torch.log(torch.tensor([0.6, 0.4, 0, 0, 0, 0], dtype=torch.float64).clamp_min(1e-300))
    rows = [torch.tensor([s, a, s, b]), torch.tensor([a, a])]
    h = {0: 1 / 2, 1: 0 / 2, 2: 1 / 2}
    p = [h[0], (1 - h[1]) * 0.6, h[2], (1 - h[1]) * 0.4, (1 - h[0]) * 0.6, (1 - h[2]) * 0.6]
    want = -sum(math.log(x) for x in p) / len(p)
    assert math.isclose(context_free_floor(rows, log_u, torch.tensor([s])), want, rel_tol=1e-12)
