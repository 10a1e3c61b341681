"""GPT-3's model sizes (Brown et al. 2020 Table 2.1) as data, and the table `lmforge model info gpt3` prints.

Every size is GPT-2's pre-LN decoder (§2.1: "the same model and architecture as GPT-2") with a 2048-token context,
the 50,257-token byte-level BPE, d_ff = 4 · d_model, and attention layers alternating dense and locally banded
sparse. The paper does not publish the band width; the presets use 256 (GPT-Neo's choice, `--model.attn_band`
changes it)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

GPT3_CONTEXT = 2048
GPT3_BAND = 256


@dataclass(frozen=True)
class GPT3Size:
    """One row of Table 2.1: the published figures, and the preset's heads where the row is inconsistent."""

    preset: str
    model: str
    n_params: float
    n_layers: int
    d_model: int
    n_heads: int
    d_head: int
    batch_tokens: float
    lr: float
    heads: int | None = None
    """The preset's head count when n_heads · d_head != d_model in the table (its d_head is kept)."""
    width: int | None = None
    """The preset's d_model when the table's is not n_heads · d_head."""
    note: str = ""


GPT3_SIZES = (
    GPT3Size("gpt3-small", "GPT-3 Small", 125e6, 12, 768, 12, 64, 0.5e6, 6.0e-4),
    GPT3Size("gpt3-medium", "GPT-3 Medium", 350e6, 24, 1024, 16, 64, 0.5e6, 3.0e-4),
    GPT3Size("gpt3-large", "GPT-3 Large", 760e6, 24, 1536, 16, 96, 0.5e6, 2.5e-4),
    GPT3Size(
        "gpt3-xl",
        "GPT-3 XL",
        1.3e9,
        24,
        2048,
        24,
        128,
        1e6,
        2.0e-4,
        heads=16,
        note="24 heads x 128 != d_model 2048; the preset has 16 heads of 128 (1.3B needs attention width 2048)",
    ),  # fmt: skip
    GPT3Size("gpt3-2.7b", "GPT-3 2.7B", 2.7e9, 32, 2560, 32, 80, 1e6, 1.6e-4),
    GPT3Size("gpt3-6.7b", "GPT-3 6.7B", 6.7e9, 32, 4096, 32, 128, 2e6, 1.2e-4),
    GPT3Size(
        "gpt3-13b",
        "GPT-3 13B",
        13.0e9,
        40,
        5140,
        40,
        128,
        2e6,
        1.0e-4,
        width=5120,
        note="d_model 5140 is a typo for 40 heads x 128 = 5120, the preset's",
    ),
    GPT3Size("gpt3-175b", "GPT-3 175B", 175.0e9, 96, 12288, 96, 128, 3.2e6, 0.6e-4),
)


def preset_sizes(row: GPT3Size) -> dict:
    """ModelConfig size fields of a Table 2.1 row."""
    d = row.width or row.d_model
    return dict(
        vocab_size=50257, max_seq_len=GPT3_CONTEXT, d_model=d, n_layers=row.n_layers,
        n_heads=row.heads or row.n_heads, d_ff=4 * d, attn_pattern="banded", attn_band=GPT3_BAND,
        attn_sparse_every=2,
    )  # fmt: skip


def count_params(name: str) -> int:
    """Parameters of a preset's model, counted on the meta device (no memory, even for 175B)."""
    from lmforge.models.model import TransformerCore
    from lmforge.registry import MODELS  # the presets, registered by presets.py, which reads this module's table

    with torch.device("meta"):
        return TransformerCore(MODELS.get(name)).num_params()


def _human(n: float) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def gpt3_table() -> str:
    """Table 2.1 next to the presets: published sizes and hyperparameters, the preset's parameter count."""
    head = ["preset", "model", "n_params", "preset params", "n_layers", "d_model", "n_heads", "d_head", "batch", "lr"]
    rows = [head]
    for r in GPT3_SIZES:
        rows.append([
            r.preset, r.model, _human(r.n_params), f"{count_params(r.preset):,}", str(r.n_layers), str(r.d_model),
            str(r.n_heads), str(r.d_head), f"{r.batch_tokens / 1e6:g}M", f"{r.lr:.1e}",
        ])  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [f"{r.preset}: {r.note}" for r in GPT3_SIZES if r.note]
    return "\n".join([
        "GPT-3 (Brown et al. 2020, Table 2.1): context 2048 tokens, batch in tokens, d_ff = 4 d_model;",
        f"layers alternate dense and locally banded attention (band {GPT3_BAND}: unpublished, --model.attn_band).",
        *lines, *(f"note: {n}" for n in notes),
    ])  # fmt: skip


PUBLISHED_TABLES = {"gpt3": gpt3_table}
"""`lmforge model info NAME` for a family name: the family's published sizes next to its presets."""
