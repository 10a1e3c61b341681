"""Beam search: equals a naive reference beam search (full forward per hypothesis), K=1 is greedy, rows are
independent of their batch."""

from __future__ import annotations

import pytest
import torch
from test_generate import decoder, left_padded, right_padded, seq2seq

from lmforge.models.beam import beam_search
from lmforge.models.generate import decoding_steps, generate


def reference_beam_search(logprobs, K: int, n: int, eos: int, length_penalty: float) -> list[int]:
    """Textbook beam search over Python lists, `transformers` rules with early_stopping=True.

    logprobs(tokens) -> next-token log-probabilities (V,) after the generated `tokens`, from a full forward."""
    running: list[tuple[float, list[int]]] = [(0.0, [])]
    finished: list[tuple[float, list[int]]] = []
    for t in range(n):
        cands = []
        for score, seq in running:
            lp = logprobs(seq).tolist()
            cands += [(score + lp[v], seq + [v]) for v in range(len(lp))]
        cands = sorted(cands, key=lambda c: -c[0])[: 2 * K]
        last, full = t + 1 == n, len(finished) == K
        running = []
        for rank, (score, seq) in enumerate(cands):
            if seq[-1] == eos or last:
                if rank < K and not full:  # only the top K candidates may finish; a full row takes no more
                    finished.append((score / (t + 1) ** length_penalty, seq))
            elif len(running) < K:
                running.append((score, seq))
        finished = sorted(finished, key=lambda f: -f[0])[:K]
        if last or len(finished) == K:
            break
    return finished[0][1]


def row_logprobs(model, x, mask, i: int):
    """Full-forward next-token log-probs for row i alone (its padding removed), memoised per prefix."""
    src = x[i][mask[i].bool()][None]
    memo: dict[tuple[int, ...], torch.Tensor] = {}

    @torch.no_grad()
    def fn(seq: list[int]) -> torch.Tensor:
        if tuple(seq) not in memo:
            memo[tuple(seq)] = forward(seq)
        return memo[tuple(seq)]

    def forward(seq: list[int]) -> torch.Tensor:
        gen = torch.tensor([seq], dtype=torch.long)
        if model.config.arch == "encoder-decoder":
            start = torch.tensor([[model.config.decoder_start_id]])
            logits = model(src, decoder_input_ids=torch.cat([start, gen], 1)).logits
        else:
            logits = model(torch.cat([src, gen], 1)).logits
        return logits[0, -1].float().log_softmax(-1)

    return fn


CASES = {
    "gpt": lambda: (decoder(), *left_padded()),
    "t5": lambda: (seq2seq("t5"), *right_padded()),
    "bart": lambda: (seq2seq("bart"), *right_padded()),
}


@pytest.mark.parametrize("case", list(CASES))
def test_beam_search_equals_reference_beam_search(case: str) -> None:
    model, x, mask = CASES[case]()
    n, K = 6, 3
    rows = [row_logprobs(model, x, mask, i) for i in range(x.shape[0])]
    lengths = set()
    for eos in (5, 16, 26, 32):
        for length_penalty in (0.0, 1.0, 2.0):
            out = beam_search(
                decoding_steps(model, x, mask), num_beams=K, max_new_tokens=n, eos_id=eos, length_penalty=length_penalty
            )
            refs = [reference_beam_search(fn, K, n, eos, length_penalty) for fn in rows]
            assert out.shape[1] == max(len(r) for r in refs)
            for i, ref in enumerate(refs):
                assert out[i, : len(ref)].tolist() == ref, (eos, length_penalty, i)
                assert (out[i, len(ref) :] == eos).all()  # padded with EOS after the hypothesis ends
                lengths.add(len(ref))
    assert min(lengths) < n == max(lengths)  # both EOS-finished and budget-finished hypotheses were compared


@pytest.mark.parametrize("case", list(CASES))
def test_one_beam_is_greedy(case: str) -> None:
    model, x, mask = CASES[case]()
    greedy = generate(model, x, mask, max_new_tokens=10, temperature=0)[:, -10:]
    eos = int(greedy[1, 2])
    greedy_eos = generate(model, x, mask, max_new_tokens=10, temperature=0, eos_id=eos)
    keep = greedy_eos.shape[1] - (x.shape[1] if model.config.arch == "decoder" else 1)
    beams = beam_search(decoding_steps(model, x, mask), num_beams=1, max_new_tokens=10, eos_id=eos)
    assert torch.equal(beams, greedy_eos[:, -keep:] if keep else greedy_eos[:, :0])
    assert (beams == eos).any()


@pytest.mark.parametrize("case", list(CASES))
def test_beam_rows_are_independent_of_the_batch(case: str) -> None:
    model, x, mask = CASES[case]()
    seq2seq = model.config.arch == "encoder-decoder"
    batch = generate(model, x, mask, max_new_tokens=8, num_beams=4, eos_id=26)
    batch = batch[:, 1:] if seq2seq else batch[:, x.shape[1] :]
    for i in range(3):
        real = x[i][mask[i].bool()][None]
        alone = generate(model, real, max_new_tokens=8, num_beams=4, eos_id=26)
        alone = alone[0, 1:] if seq2seq else alone[0, real.shape[1] :]
        assert torch.equal(batch[i, : len(alone)], alone)
        assert (batch[i, len(alone) :] == 26).all()
