"""Sparse attention speed and memory: GPT-3's banded layers computed blockwise (`banded_attention`) against the same
band as an explicit mask over dense attention, and against plain causal attention (flash), in one process.

    PYTHONPATH=src python bench/sparse_attention.py                      # kernel at T = 2048 and 8192, GPT-3 Small
    PYTHONPATH=src python bench/sparse_attention.py --device cpu --preset gpt3-tiny --seq 256 --batch 2 --steps 2

Kernel rows time one attention call, forward + backward, with GPT-3 Small's heads (12 x 64); model rows time
whole training steps (bf16 autocast forward, cross-entropy, backward, AdamW) of the preset with its banded layers
run blockwise (`banded`), as one masked dense attention (`band-mask`: an all-ones padding mask makes the stack
build explicit masks) and with every layer dense (`dense`). Prints a markdown table; `--out` writes JSON too."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch
import torch.nn.functional as F

from lmforge.models import Transformer, get_preset
from lmforge.models.sparse import band_allowed, banded_attention


def timed(fn, steps: int, warmup: int, device: str) -> tuple[float, float]:
    """(mean ms per call, peak GiB) of fn() after warmup calls."""
    for _ in range(warmup):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) / steps * 1e3
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
    return ms, peak


def _kernels(q, k, v, mask, band: int) -> dict:
    return {
        "causal (dense)": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "band-mask": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        "banded": lambda: banded_attention(q, k, v, band, 64**-0.5),
    }


def kernel_rows(args) -> list[dict]:
    rows = []
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    for T in args.seq:
        q, k, v = (
            torch.randn(args.batch, 12, T, 64, device=args.device, dtype=dtype, requires_grad=True) for _ in "qkv"
        )
        i = torch.arange(T, device=args.device)
        mask = torch.zeros(T, T, device=args.device, dtype=dtype)
        mask = mask.masked_fill(~band_allowed(i, i, args.band), torch.finfo(dtype).min)
        for name, fn in _kernels(q, k, v, mask, args.band).items():
            ms, peak = timed(lambda fn=fn: fn().sum().backward(), args.steps, args.warmup, args.device)
            rows.append({"what": "kernel", "variant": name, "T": T, "ms": ms, "peak_gib": peak})
            print(f"kernel T={T} {name}: {ms:.2f} ms, peak {peak:.2f} GiB", flush=True)
    return rows


def _train_step(model, fwd, opt, x, pad, device: str):
    def step() -> None:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            logits = fwd(x[:, :-1], pad).logits
        F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def model_rows(args) -> list[dict]:
    rows = []
    base = get_preset(args.preset, attn_band=args.band)
    T = args.model_seq
    x = torch.randint(0, base.vocab_size, (args.batch, T + 1), device=args.device)
    for name in ("dense", "band-mask", "banded"):
        cfg = dataclasses.replace(base, attn_pattern="dense") if name == "dense" else base
        torch.manual_seed(0)
        model = Transformer(cfg).to(args.device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=args.device == "cuda")
        pad = torch.ones_like(x[:, :-1]) if name == "band-mask" else None
        step = _train_step(model, torch.compile(model) if args.compile else model, opt, x, pad, args.device)
        ms, peak = timed(step, args.steps, args.warmup, args.device)
        tps = args.batch * T / ms * 1e3
        rows.append({"what": "model", "variant": name, "T": T, "ms": ms, "peak_gib": peak, "tokens_per_s": tps})
        print(
            f"model {args.preset} T={T} {name}: {ms:.1f} ms/step, {tps:,.0f} tokens/s, peak {peak:.1f} GiB", flush=True
        )
        del model, opt, step
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="gpt3-small")
    p.add_argument("--seq", type=int, nargs="+", default=[2048, 8192], help="kernel sequence lengths")
    p.add_argument("--model-seq", type=int, default=2048, help="sequence length of the model rows")
    p.add_argument("--band", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--compile", action="store_true", help="torch.compile the model rows")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", help="write the rows as JSON here")
    args = p.parse_args()
    rows = kernel_rows(args) + model_rows(args)
    print("\n| what | variant | T | ms | peak GiB | tokens/s |\n|---|---|---|---|---|---|")
    for r in rows:
        tps = f"{r['tokens_per_s']:,.0f}" if "tokens_per_s" in r else ""
        print(f"| {r['what']} | {r['variant']} | {r['T']} | {r['ms']:.2f} | {r['peak_gib']:.2f} | {tps} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "rows": rows}, f)


if __name__ == "__main__":
    main()
