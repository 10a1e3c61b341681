"""The compression report: one table of size on disk, CPU latency (median of several runs at batch 1 and 8) and
dev accuracy of a fine-tuned teacher beside its compressed variants (compress/variants.py) — int8 dynamic
quantisation, a distilled student (DistilBERT or TinyBERT; fp32 and int8), global magnitude pruning + fine-tuning,
attention-head removal + fine-tuning, and Q8BERT quantisation-aware fine-tuning exported to int8. The teacher, its
task and its dev split come from the fine-tuning code (`lmforge finetune` runs, `lmforge.tasks`); accuracy is the
task's own `evaluate`."""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from lmforge.compress.config import CompressConfig
from lmforge.compress.prune import block_linears, weight_sparsity
from lmforge.errors import LMForgeError


def state_dict_bytes(model: nn.Module) -> int:
    """Size on disk of the model's state dict saved with torch.save (the format int8 packed weights need)."""
    fd, path = tempfile.mkstemp(suffix=".pt")
    os.close(fd)
    try:
        torch.save(model.state_dict(), path)
        return os.path.getsize(path)
    finally:
        os.unlink(path)


@torch.no_grad()
def cpu_latency_ms(forward: Callable[[], object], runs: int = 10, warmup: int = 2) -> float:
    """Median wall time (ms) of `runs` calls of `forward()` (one forward pass) after `warmup` untimed ones."""
    for _ in range(warmup):
        forward()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        forward()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


@dataclass
class Row:
    name: str
    layers: int
    heads: int
    """Self-attention heads left in the whole model."""
    sparsity: float
    """Share of exactly-zero weights in the blocks' linear layers (fp32 models)."""
    size_mb: float
    latency_b1_ms: float
    latency_b8_ms: float
    accuracy: float


def _structure(model: nn.Module) -> tuple[int, int, float]:
    from lmforge.compress.prune import _self_attentions

    attns = _self_attentions(model)
    linears = [m for _, m in block_linears(model)]
    sparsity = weight_sparsity(linears) if linears else float("nan")
    return len(attns), sum(a.n_heads for a in attns.values()), sparsity


def measure(name: str, model: nn.Module, task, dev, bench_batches: dict[int, dict], cfg: CompressConfig) -> Row:
    """Size, latency at each benchmark batch size, and dev accuracy (the task's main metric) of one variant."""
    b = cfg.bench
    model.eval()
    lat = {bs: cpu_latency_ms(lambda x=x: model(x), b.runs, b.warmup) for bs, x in bench_batches.items()}
    metrics = task.evaluate(model, dev, b.eval_batch_size)
    layers, heads, sparsity = _structure(model)
    return Row(name, layers, heads, sparsity, state_dict_bytes(model) / 1e6, lat[1], lat[8], metrics[task.main_metric])


def format_table(rows: list[Row], metric: str = "accuracy") -> str:
    """A Markdown table; size and latency also as a ratio to the first row (the teacher)."""
    base = rows[0]
    lines = [
        f"| model | layers | heads | sparsity | size (MB) | latency b=1 (ms) | latency b=8 (ms) | dev {metric} |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        size = f"{r.size_mb:.2f} ({r.size_mb / base.size_mb:.2f}×)"
        b1 = f"{r.latency_b1_ms:.1f} ({r.latency_b1_ms / base.latency_b1_ms:.2f}×)"
        b8 = f"{r.latency_b8_ms:.1f} ({r.latency_b8_ms / base.latency_b8_ms:.2f}×)"
        sparsity = "–" if math.isnan(r.sparsity) else f"{r.sparsity:.0%}"  # int8 layers are not counted
        lines.append(f"| {r.name} | {r.layers} | {r.heads} | {sparsity} | {size} | {b1} | {b8} | {r.accuracy:.4f} |")
    return "\n".join(lines) + "\n"


def variants(teacher: nn.Module, task, train_features: list[dict], cfg: CompressConfig, resume: bool = False):
    """(name, model) of the teacher, then of every variant in cfg.variants, built in turn (compress/variants.py)."""
    from lmforge.compress.variants import VARIANTS

    yield "teacher (fp32)", teacher
    for name in cfg.variants:
        yield from VARIANTS[name](teacher, task, train_features, cfg, resume)


def _bench_batches(task, dev, sizes=(1, 8)) -> dict[int, dict]:
    from lmforge.tasks.inputs import collate

    feats = task.features(dev)
    if len(feats) < max(sizes):
        raise LMForgeError(f"the dev split has {len(feats)} examples; the latency batches need {max(sizes)}")
    return {bs: collate(feats[:bs], task.pad_id) for bs in sizes}


def compression_report(cfg: CompressConfig, resume: bool = False) -> tuple[list[Row], str]:
    """Build the teacher (a fine-tuned run, or fine-tune one now), every variant, and the table; writes
    OUT/report.md and OUT/report.json. Everything runs on the CPU with bench.threads threads."""
    from lmforge.compress.teacher import load_teacher

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.bench.threads)
    try:
        task, teacher, splits = load_teacher(cfg, resume)
        dev = splits["dev"]
        bench = _bench_batches(task, dev)
        train_features = task.features(splits["train"], train=True)
        rows = []
        for name, model in variants(teacher, task, train_features, cfg, resume):
            rows.append(measure(name, model, task, dev, bench, cfg))
            print(f"{name}: {task.main_metric} {rows[-1].accuracy:.4f}", flush=True)
    finally:
        torch.set_num_threads(threads)
    table = format_table(rows, task.main_metric)
    head = (
        f"Teacher: {cfg.teacher.run or cfg.teacher.recipe}; task {task.name}, dev split {len(dev.examples)} examples; "
        f"CPU latency = median of {cfg.bench.runs} runs with {cfg.bench.threads} thread(s).\n\n"
    )
    (out / "report.md").write_text(head + table, encoding="utf-8")
    (out / "report.json").write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n", encoding="utf-8")
    return rows, table
