"""Position probes (Wang & Chen 2020, "What Do Position Embeddings Learn?", §3.1): is absolute position, and is
the relative order of two tokens, linearly decodable from a model's representations?

Absolute position: a linear regression from each position's representation to its index, fitted on a random split
of the positions; the held-out mean absolute error says how linearly decodable absolute position is.
Representations by `config.position`:
- "learned": rows of the learned table (from `position_offset` on, as the model indexes it);
- "sinusoidal": the fixed sinusoid table;
- relative schemes and none ("rope", "alibi", "t5_bias", "shaw", "xl", "none") have no absolute table: the output of
  the first block at each position, averaged over `n_samples` fixed random token sequences (seeded) so that token
  content averages out and what stays is what the first layer knows about position.

Relative order: a linear classifier on a pair of token representations, the first block's outputs h_i and h_j of
one random token sequence, concatenated [h_i; h_j] (or their difference h_i − h_j), predicting whether token i comes
before token j. Pairs i ≠ j are drawn uniformly in each of `n_sequences` seeded random sequences; the classifier is
fitted on the pairs of some sequences and scored on those of held-out sequences, so it cannot remember a sequence.
Chance is 1/2: a model without positions in a bidirectional stack (a bag of tokens) gives h_i and h_j that are
exchangeable, so it scores at chance whatever the probe.

Encoder and encoder-decoder models are probed on the encoder stack, decoders on the decoder stack. "First block
output" is the hidden state entering the second block (the model's final output for a one-layer model)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from torch import Tensor

from lmforge.errors import LMForgeError, did_you_mean
from lmforge.models import Transformer
from lmforge.models.positions import sinusoidal_table
from lmforge.registry import EVALS, MODELS


@torch.no_grad()
def first_block_states(model: Transformer, ids: Tensor, batch_size: int = 16) -> Tensor:
    """The first block's output (B, T, d_model) float32 on the CPU for token ids (B, T), in eval mode, in batches.

    Read from the hidden states the model returns (the input of every block, then the output), so every stack
    answers the same way, the Transformer-XL / XLNet one included (its block loop, models/recurrence.py, does not
    call the blocks' forward)."""
    cfg = model.config
    device = next(model.parameters()).device
    training = model.training
    model.eval()
    out = []
    try:
        for chunk in ids.split(batch_size):
            chunk = chunk.to(device)
            if cfg.is_decoder:
                prefix = torch.zeros(len(chunk), dtype=torch.long, device=device) if cfg.mask == "prefix" else None
                hidden = model(chunk, prefix_len=prefix, return_logits=False, output_hidden_states=True).hidden_states
            else:
                hidden = []
                model.encode(chunk, hidden_states=hidden)
            out.append(hidden[1].float().cpu())
    finally:
        model.train(training)
    return torch.cat(out)


def _random_ids(model: Transformer, n_sequences: int, n: int, seed: int) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (n_sequences, n), generator=g)


def position_representations(
    model: Transformer, n_positions: int | None = None, n_samples: int = 4, seed: int = 0
) -> tuple[Tensor, str]:
    """(n_positions, dim) float32 representations of positions 0..n-1 and a description of their source."""
    cfg = model.config
    stack_name = cfg.input_stack
    stack = getattr(model, stack_name)
    n = n_positions or cfg.max_seq_len
    if cfg.position_scheme.learned_table:
        cfg.check_length(n, "n_positions={n} exceeds the learned table's max_seq_len {limit}")
        rows = stack.pos_emb.emb.weight[cfg.position_offset : cfg.position_offset + n]  # (n, E)
        return rows.detach().float().cpu(), f"{stack_name} learned position table"
    if cfg.position_scheme.absolute_table:  # not learned: the fixed sinusoid table
        return sinusoidal_table(n, cfg.embedding_dim or cfg.d_model), "sinusoidal position table"
    states = first_block_states(model, _random_ids(model, n_samples, n, seed)).mean(0)  # (n, d_model)
    return states, f"{stack_name} first-block hidden states ({cfg.position} positions, {n_samples} random inputs)"


def linear_probe(features: Tensor, targets: Tensor, train_frac: float = 0.8, seed: int = 0) -> dict:
    """Least-squares fit features (n, d) → targets (n,) on a random train split; held-out MAE and R².

    Solved in float64 with an intercept (min-norm solution when underdetermined). `baseline_mae` is the MAE of
    predicting the training mean, the score of a probe that learned nothing."""
    n = features.shape[0]
    n_train = round(train_frac * n)
    if not 0 < train_frac < 1 or n_train < 2 or n - n_train < 2:
        raise LMForgeError(f"the probe needs >= 2 train and >= 2 held-out positions (n={n}, train_frac={train_frac})")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    train, test = perm[:n_train], perm[n_train:]
    X = torch.cat([features.double(), torch.ones(n, 1, dtype=torch.float64)], dim=1)  # (n, d + 1)
    y = targets.double()
    w = torch.linalg.lstsq(X[train], y[train, None], driver="gelsd").solution  # (d + 1, 1)
    pred = (X[test] @ w).squeeze(1)
    err = pred - y[test]
    ss_tot = ((y[test] - y[test].mean()) ** 2).sum()
    return {
        "n_train": n_train,
        "n_test": n - n_train,
        "mae": float(err.abs().mean()),
        "r2": float(1 - (err**2).sum() / ss_tot),
        "baseline_mae": float((y[test] - y[train].mean()).abs().mean()),
    }


def position_probe(model: Transformer, n_positions: int | None = None, train_frac: float = 0.8, seed: int = 0) -> dict:
    """Regress absolute position from the model's position representations (see module docstring).

    Returns source, position kind, n_positions, dim, n_train, n_test, mae (in positions), r2, baseline_mae."""
    reps, source = position_representations(model, n_positions, seed=seed)
    n = reps.shape[0]
    result = {"source": source, "position": model.config.position, "n_positions": n, "dim": reps.shape[1]}
    return result | linear_probe(reps, torch.arange(n), train_frac, seed)


def pair_classifier(features: Tensor, labels: Tensor, train: Tensor) -> dict:
    """A linear classifier features (N, d) → boolean labels (N,), fitted on the rows where `train` is true and scored
    on the others: least squares on ±1 targets with an intercept (float64, min-norm), predicting the sign.

    `chance` is the held-out accuracy of always answering the training majority, the score of a probe that learned
    nothing."""
    test = ~train
    if int(train.sum()) < 2 or int(test.sum()) < 2:
        raise LMForgeError(f"the pair probe needs >= 2 train and >= 2 held-out pairs (got {int(train.sum())} and "
                           f"{int(test.sum())})")  # fmt: skip
    X = torch.cat([features.double(), torch.ones(len(features), 1, dtype=torch.float64)], dim=1)  # (N, d + 1)
    y = labels.double() * 2 - 1
    w = torch.linalg.lstsq(X[train], y[train, None], driver="gelsd").solution  # (d + 1, 1)
    pred = (X[test] @ w).squeeze(1) > 0
    majority = bool(labels[train].double().mean() >= 0.5)
    return {
        "n_train": int(train.sum()),
        "n_test": int(test.sum()),
        "accuracy": float((pred == labels[test]).double().mean()),
        "chance": float((labels[test] == majority).double().mean()),
    }


def relative_order_probe(
    model: Transformer,
    n_positions: int | None = None,
    *,
    n_sequences: int = 64,
    pairs_per_sequence: int = 64,
    features: Literal["concat", "diff"] = "concat",
    train_frac: float = 0.75,
    seed: int = 0,
) -> dict:
    """Classify whether token i comes before token j from the first block's outputs at i and j (module docstring).

    Returns source, position kind, features, n_positions, n_sequences, n_train, n_test (pairs), accuracy on the
    held-out sequences' pairs and chance."""
    cfg = model.config
    if features not in ("concat", "diff"):
        raise LMForgeError(f"pair features must be 'concat' or 'diff', got '{features}'")
    n = n_positions or cfg.max_seq_len
    if n < 2:
        raise LMForgeError(f"the relative-order probe needs >= 2 positions, got {n}")
    cfg.check_length(n, "n_positions={n} exceeds the learned table's max_seq_len {limit}")
    n_train_seq = round(train_frac * n_sequences)
    if not 0 < train_frac < 1 or not 0 < n_train_seq < n_sequences:
        raise LMForgeError(f"the relative-order probe needs train and held-out sequences (n_sequences={n_sequences}, "
                           f"train_frac={train_frac})")  # fmt: skip
    states = first_block_states(model, _random_ids(model, n_sequences, n, seed + 1))  # (S, n, d)
    g = torch.Generator().manual_seed(seed + 2)
    S, K = n_sequences, pairs_per_sequence
    i = torch.randint(0, n, (S, K), generator=g)
    j = torch.randint(0, n - 1, (S, K), generator=g)
    j = j + (j >= i).long()  # uniform over j != i
    rows = torch.arange(S)[:, None].expand(S, K)
    h_i, h_j = states[rows, i], states[rows, j]  # (S, K, d)
    x = torch.cat([h_i, h_j], -1) if features == "concat" else h_i - h_j
    train = (rows < n_train_seq).reshape(-1)  # the first sequences train, the rest are held out
    result = pair_classifier(x.reshape(S * K, -1), (i < j).reshape(-1), train)
    source = f"{cfg.input_stack} first-block hidden states ({cfg.position} positions)"
    return {"source": source, "position": cfg.position, "features": features, "n_positions": n,
            "n_sequences": n_sequences} | result  # fmt: skip


EVALS.register("position_probe")(position_probe)
EVALS.register("relative_order_probe")(relative_order_probe)


def _load(checkpoint_or_preset: str) -> Transformer:
    if Path(checkpoint_or_preset).exists():
        from lmforge.loading import load

        return load(checkpoint_or_preset)[0]
    if checkpoint_or_preset not in MODELS:
        tip = did_you_mean(checkpoint_or_preset, MODELS.names())
        raise LMForgeError(f"'{checkpoint_or_preset}' is neither a checkpoint path nor a model preset{tip}")
    from lmforge.models import get_preset

    with torch.random.fork_rng(devices=[]):  # a randomly initialised preset, reproducibly, leaving global RNG alone
        torch.manual_seed(0)
        return Transformer(get_preset(checkpoint_or_preset)).eval()


def cmd_probe(checkpoint_or_preset: str, n_positions: int | None = None, features: str = "concat") -> dict:
    """`lmforge probe`: run both position probes on a run/checkpoint dir or a (randomly initialised) preset.

    Returns the absolute probe's result with the relative-order probe's under "relative_order"."""
    model = _load(checkpoint_or_preset)
    result = {"model": checkpoint_or_preset} | position_probe(model, n_positions)
    rel = relative_order_probe(model, n_positions, features=features)  # type: ignore[arg-type]
    result["relative_order"] = rel
    print(
        f"position probe on {result['model']}: {result['source']}, {result['n_positions']} positions, "
        f"dim {result['dim']}\n  held-out MAE {result['mae']:.2f} positions (predicting the mean: "
        f"{result['baseline_mae']:.2f}), R² {result['r2']:.3f}\n"
        f"relative-order probe (is token i before token j?): {rel['source']}, {rel['features']} of the pair, "
        f"{rel['n_train']:,} train / {rel['n_test']:,} held-out pairs from {rel['n_sequences']} random sequences\n"
        f"  held-out accuracy {rel['accuracy']:.3f} (chance {rel['chance']:.3f})"
    )
    return result
