"""Absolute-position probe (Wang & Chen 2020, "What Do Position Embeddings Learn?", §3.1).

A linear regression from each position's representation to its absolute index is fitted on a random split of the
positions; the held-out mean absolute error says how linearly decodable absolute position is.

Representations by `config.position`:
- "learned": rows of the learned table (from `position_offset` on, as the model indexes it);
- "sinusoidal": the fixed sinusoid table;
- relative schemes and none ("rope", "alibi", "t5_bias", "shaw", "none") have no absolute table: the output of the
  first block at each position, averaged over `n_samples` fixed random token sequences (seeded) so that token
  content averages out and what stays is what the first layer knows about position.
Encoder and encoder-decoder models are probed on the encoder stack, decoders on the decoder stack."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from lmforge.errors import LMForgeError, did_you_mean
from lmforge.models import Transformer
from lmforge.models.positions import sinusoidal_table
from lmforge.registry import EVALS, MODELS


class _FirstBlockDone(Exception):
    """Raised by the capture hook so the forward stops after the first block."""


@torch.no_grad()
def _first_block_states(model: Transformer, stack: torch.nn.Module, n: int, n_samples: int, seed: int) -> Tensor:
    """Mean first-block output (n, d_model) over n_samples random token sequences of length n."""
    cfg = model.config
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (n_samples, n), generator=g).to(device)
    captured: list[Tensor] = []

    def hook(module, args, output) -> None:
        captured.append(output)
        raise _FirstBlockDone

    handle = stack.blocks[0].register_forward_hook(hook)
    training = model.training
    model.eval()
    try:
        if cfg.is_decoder:
            prefix = torch.zeros(n_samples, dtype=torch.long, device=device) if cfg.mask == "prefix" else None
            model(ids, prefix_len=prefix, return_logits=False)
        else:
            model.encode(ids)
    except _FirstBlockDone:
        pass
    finally:
        handle.remove()
        model.train(training)
    return captured[0].float().mean(0)  # (n, d_model)


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
    states = _first_block_states(model, stack, n, n_samples, seed).cpu()
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


EVALS.register("position_probe")(position_probe)


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


def cmd_probe(checkpoint_or_preset: str, n_positions: int | None = None) -> dict:
    """`lmforge probe`: run the position probe on a run/checkpoint dir or a (randomly initialised) preset."""
    result = {"model": checkpoint_or_preset} | position_probe(_load(checkpoint_or_preset), n_positions)
    print(
        f"position probe on {result['model']}: {result['source']}, {result['n_positions']} positions, "
        f"dim {result['dim']}\n  held-out MAE {result['mae']:.2f} positions (predicting the mean: "
        f"{result['baseline_mae']:.2f}), R² {result['r2']:.3f}"
    )
    return result
