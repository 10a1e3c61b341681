"""Training throughput, MFU and peak memory of lmforge models against their Hugging Face twins, in one run.

From the repository root:

    PYTHONPATH=src python bench/run.py                      # gpt2-124m, B=16, T=1024, eager and compiled
    PYTHONPATH=src python bench/run.py --preset gpt-tiny --batch 2 --seq 64 --steps 2 --device cpu

Each variant (implementation × compile) times full training steps — forward, cross-entropy, backward, fused
AdamW step — on the same batch from the same initial weights, then frees its memory before the next one starts.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor, nn

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))  # model_table, report (already there when run as a script)
sys.path.append(str(_HERE.parent / "src"))  # lmforge from the checkout when neither PYTHONPATH nor an install has it

from model_table import BENCH_MODELS, BenchModel, require_available  # noqa: E402
from report import free_memory, markdown_table, one_line, speed_ratios, write_results  # noqa: E402

from lmforge.errors import LMForgeError  # noqa: E402
from lmforge.models import Transformer  # noqa: E402
from lmforge.train.metrics import peak_flops  # noqa: E402
from lmforge.train.optim import param_groups  # noqa: E402

Impl = Literal["lmforge", "hf"]
GIB = 2**30


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["gpt2"], choices=sorted(BENCH_MODELS), help="default: gpt2")
    p.add_argument("--preset", help="lmforge preset to use instead of the model's default (one model only)")
    p.add_argument("--batch", type=int, help="sequences per step (default: per model, 16 for gpt2)")
    p.add_argument("--seq", type=int, help="tokens per sequence (default: per model, 1024 for gpt2)")
    p.add_argument("--steps", type=int, default=20, help="timed training steps per variant")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation happens here)")
    p.add_argument("--compile", choices=["both", "on", "off"], default="both", help="torch.compile variants")
    p.add_argument(
        "--compile-mode",
        choices=["default", "reduce-overhead", "max-autotune-no-cudagraphs"],
        default="default",
        help="torch.compile mode of the compiled variants, the same for both implementations (reduce-overhead: CUDA "
        "graphs, for steps bound by kernel launches)",
    )
    p.add_argument(
        "--impls", nargs="+", choices=["lmforge", "hf"], default=["lmforge", "hf"], help="implementations, in run order"
    )
    p.add_argument("--device", help="cuda (default when available) or cpu")
    p.add_argument("--profile", action="store_true", help="print each variant's 25 costliest ops over 3 more steps")
    p.add_argument("--dtype", choices=["bf16", "fp32"], help="bf16 autocast (default on cuda) or fp32 (cpu)")
    p.add_argument("--dropout", type=float, help="dropout and attention dropout for both sides (default: the preset's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial weights and the batch")
    p.add_argument("--out", type=Path, help="results JSON (default: bench/results/<time>-<device>.json, or $OUT/)")
    args = p.parse_args(argv)
    if args.preset and len(args.models) > 1:
        p.error("--preset applies to one model; pass a single --models name")
    for name in ("batch", "seq", "steps", "warmup"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    args.device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.device.type == "cuda" and not torch.cuda.is_available():
        p.error("CUDA is not available here; pass --device cpu")
    args.dtype = args.dtype or ("bf16" if args.device.type == "cuda" else "fp32")
    return args


class LossStep(nn.Module):
    """A model and its loss as one module, so torch.compile sees (and may fuse) the loss with the forward."""

    def __init__(self, model: nn.Module, loss_fn) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        return self.loss_fn(self.model, batch)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_steps(train_step, steps: int, device: torch.device) -> tuple[list[float], Tensor]:
    """Seconds of each step (CUDA events on GPU, so host overhead that the GPU hides is not counted) + last loss."""
    if device.type == "cuda":
        events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
        events[0].record()
        for i in range(steps):
            loss = train_step()
            events[i + 1].record()
        torch.cuda.synchronize(device)
        return [a.elapsed_time(b) / 1e3 for a, b in zip(events, events[1:])], loss
    marks = [time.perf_counter()]
    for _ in range(steps):
        loss = train_step()
        marks.append(time.perf_counter())
    return [b - a for a, b in zip(marks, marks[1:])], loss


def measure(spec: BenchModel, impl: Impl, compiled: bool, refs: dict[str, nn.Module], batch, args) -> dict:
    """Copy one variant's reference model to the device, run warmup + timed steps, return its measurements."""
    device = args.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    model = copy.deepcopy(refs[impl]).to(device).train()
    out: dict = {"hf_attn": getattr(model.config, "_attn_implementation", None)} if impl == "hf" else {}
    batch = {k: v.to(device) for k, v in batch.items()}
    opt = torch.optim.AdamW(param_groups(model, 0.1), lr=3e-4, fused=True)
    step = LossStep(model, spec.loss.lmforge if impl == "lmforge" else spec.loss.hf)
    run = torch.compile(step, mode=args.compile_mode) if compiled else step

    def train_step() -> Tensor:
        torch.compiler.cudagraph_mark_step_begin()  # a new step: CUDA-graph outputs of the last one may be reused
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
            loss = run(batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach().clone()  # a copy: a CUDA-graph replay overwrites its outputs

    out["loss_step0"] = train_step().item()  # before any update: equal weights and batch give equal losses
    for _ in range(args.warmup - 1):
        train_step()
    _sync(device)
    out["warmup_s"] = time.perf_counter() - t0
    times, last = _timed_steps(train_step, args.steps, device)
    step_s = sum(times) / len(times)
    tokens = spec.loss.tokens_per_step(batch)
    flops = spec.loss.flops_per_step(refs["lmforge"], batch)
    peak = peak_flops(device, torch.bfloat16 if args.dtype == "bf16" else torch.float32)
    out |= {
        "loss_last": last.item(),
        "tokens_per_s": tokens / step_s,
        "step_ms": 1e3 * step_s,
        "step_ms_median": 1e3 * sorted(times)[len(times) // 2],
        "flops_per_token": flops / tokens,
        "mfu": flops / step_s / peak if peak else None,
        "peak_mem_gib": torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None,
    }
    if args.profile:
        print_profile(train_step, device)
    return out


def print_profile(train_step, device: torch.device, steps: int = 3) -> None:
    """The ops that cost the most device time over `steps` more training steps (self time, so kernels count once)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            train_step()
        _sync(device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=90), flush=True)


def run_variant(name: str, spec: BenchModel, impl: Impl, compiled: bool, refs: dict, batch, args) -> dict:
    """One row of results; a failure (no HF twin, compile error, out of memory) becomes the row's `error`."""
    label = f"{name} {impl} {'compiled' if compiled else 'eager'}"
    row: dict = {"model": name, "preset": refs["lmforge"].config.name, "impl": impl, "compile": compiled}
    row |= {"batch": batch["input_ids"].shape[0], "seq_len": batch["input_ids"].shape[1]}
    if isinstance(refs[impl], str):
        row["error"] = refs[impl]
        print(f"{label}: error: {row['error']}", flush=True)
        return row
    print(f"{label}: running", flush=True)
    try:
        row |= measure(spec, impl, compiled, refs, batch, args)
        mem = f", {row['peak_mem_gib']:.2f} GiB" if row["peak_mem_gib"] is not None else ""
        print(f"{label}: {row['tokens_per_s']:,.0f} tok/s{mem}, loss@0 {row['loss_step0']:.4f}", flush=True)
    except Exception as e:  # noqa: BLE001 — one broken variant must not stop the others
        row["error"] = one_line(e)
        row["traceback"] = traceback.format_exc()
        print(f"{label}: error: {row['error']}", flush=True)
    finally:
        free_memory(args.device)
    return row


def reference_models(spec: BenchModel, cfg, seed: int) -> dict[str, nn.Module | str]:
    """The CPU fp32 models every variant copies: lmforge's, and its HF twin with identical weights (or the reason
    there is none, so the lmforge rows still run)."""
    torch.manual_seed(seed)
    ref = Transformer(cfg)
    try:
        twin: nn.Module | str = spec.build_hf(ref)
    except Exception as e:  # noqa: BLE001 — no converter yet, or a transformers version without the model
        twin = f"no Hugging Face twin for '{cfg.name}': {one_line(e)}"
    return {"lmforge": ref, "hf": twin}


def bench_model(name: str, args) -> list[dict]:
    """Every requested variant of one model, all starting from the same weights and batch."""
    spec = BENCH_MODELS[name]
    try:
        cfg = require_available(name, spec, args.preset)
        if args.dropout is not None:
            cfg = replace(cfg, dropout=args.dropout, attn_dropout=args.dropout)
        batch_size, seq = args.batch or spec.batch, args.seq or spec.seq_len
        if cfg.position == "learned" and seq > cfg.max_seq_len:
            raise LMForgeError(f"--seq {seq} exceeds preset '{cfg.name}' max_seq_len {cfg.max_seq_len}")
    except LMForgeError as e:
        print(f"{name}: error: {e}", flush=True)
        return [{"model": name, "preset": args.preset or spec.preset, "impl": None, "compile": None, "error": str(e)}]
    refs = reference_models(spec, cfg, args.seed)
    batch = spec.loss.make_batch(cfg, batch_size, seq, torch.Generator().manual_seed(args.seed))
    modes = {"both": [False, True], "on": [True], "off": [False]}[args.compile]
    return [run_variant(name, spec, impl, c, refs, batch, args) for c in modes for impl in args.impls]


def environment(args) -> dict:
    import platform

    import transformers

    device = args.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    return {
        "device": device.type,
        "device_name": name,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "dtype": args.dtype,
        "peak_flops": peak_flops(device, torch.bfloat16 if args.dtype == "bf16" else torch.float32),
        "steps": args.steps,
        "warmup": args.warmup,
        "seed": args.seed,
        "dropout": args.dropout,
        "compile_mode": args.compile_mode,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import transformers

    transformers.logging.set_verbosity_error()  # config warnings about tiny vocabularies are noise here
    rows = [row for name in args.models for row in bench_model(name, args)]
    results = {"env": environment(args), "rows": rows, "ratios": speed_ratios(rows)}
    table = markdown_table(results)
    print("\n" + table)
    path = write_results(results, table, args.out, os.environ.get("OUT"))
    print(f"\nwrote {path}")
    return 1 if any(r.get("error") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
