"""`lmforge compress ...`: the compression report of a fine-tuned teacher (distillation, int8 quantisation,
pruning) and the int8 quantisation of one checkpoint with its size and CPU latency."""

from __future__ import annotations

import argparse

from lmforge.cli.args import add_recipe_args, recipe_help, recipe_of, training_overrides
from lmforge.errors import LMForgeError


def add_parser(sub, name: str) -> None:
    co = sub.add_parser(name, help="distillation, int8 quantisation, pruning").add_subparsers(dest="sub", required=True)
    cr = co.add_parser(
        "report", help="distil/quantise/prune a fine-tuned teacher and tabulate size, latency, accuracy",
        epilog_fn=recipe_help("compress"),
    )  # fmt: skip
    add_recipe_args(cr, "compress", "recipe path or bundled name in recipes/compress (default sentiment-gpt)")
    cr.add_argument("--teacher", help="fine-tuned run dir (default: the recipe's)")
    cr.add_argument("--resume", action="store_true", help="continue an interrupted report (finished parts are kept)")
    cr.set_defaults(fn=run)
    cq = co.add_parser("quantize", help="int8 dynamic quantisation of a checkpoint: size and CPU latency")
    cq.add_argument("path")
    cq.add_argument("--threads", type=int, default=1)
    cq.set_defaults(fn=run)


def overrides(args: argparse.Namespace, argv: list[str], extra: list[str]) -> list[str] | None:
    """The report's overrides; None for `quantize`, which takes no extra arguments."""
    return training_overrides("compress", argv, extra) if hasattr(args, "kind") else None


def run(args: argparse.Namespace) -> None:
    if args.sub == "report":
        cmd_compress_report(recipe_of(args), args.teacher, args.overrides, resume=args.resume)
    else:
        cmd_quantize(args.path, threads=args.threads)


def cmd_compress_report(
    recipe: str | None, teacher: str | None = None, overrides: list[str] | None = None, resume: bool = False
) -> list:
    """Compress a fine-tuned classifier (`teacher`: a `lmforge finetune` run; default: fine-tune the recipe's
    teacher first) and print the size / CPU latency / dev accuracy table (also OUT/report.md, OUT/report.json).
    Returns the table rows."""
    from lmforge.compress.config import load_compress_config
    from lmforge.compress.report import compression_report

    cfg = load_compress_config(recipe or "sentiment-gpt", list(overrides or []), teacher=teacher)
    rows, table = compression_report(cfg, resume)
    print(table, end="")
    print(f"report written to {cfg.out}/report.md")
    return rows


def cmd_quantize(path: str, seq_len: int = 64, runs: int = 10, threads: int = 1) -> dict[str, float]:
    """Int8-quantise a model (run / checkpoint / Hugging Face dir) in memory and print its state-dict size, CPU
    latency at batch 1 and 8 (median of `runs`) and the relative error of its logits on bundled-corpus text,
    beside the float32 model's. Returns those numbers."""
    import torch

    from lmforge.compress.quantize import quantize_int8
    from lmforge.compress.report import state_dict_bytes
    from lmforge.data.corpus import load_default_corpus
    from lmforge.loading import load

    model, tok = load(path)
    if tok is None:
        raise LMForgeError(f"{path} has no tokenizer to encode the benchmark text with")
    if not model.config.lm_head:
        raise LMForgeError(f"{path}: the model has no LM head to compare logits of")
    ids = tok.encode(load_default_corpus()[0])[:seq_len]
    if len(ids) < seq_len:
        raise LMForgeError(f"the benchmark text has only {len(ids)} tokens")
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        q = quantize_int8(model)
        out = {"fp32_mb": state_dict_bytes(model) / 1e6, "int8_mb": state_dict_bytes(q) / 1e6}
        for bs in (1, 8):
            x = torch.tensor([ids] * bs)
            out[f"fp32_b{bs}_ms"] = _latency(model, x, runs)
            out[f"int8_b{bs}_ms"] = _latency(q, x, runs)
        x = torch.tensor([ids])
        with torch.no_grad():
            a, b = _logits(model, x), _logits(q, x)
        out["relative_error"] = float((a - b).norm() / a.norm())
    finally:
        torch.set_num_threads(old)
    for k, v in out.items():
        print(f"{k}: {v:.4f}")
    return out


def _logits(model, x):
    kw = {"decoder_input_ids": x} if model.config.is_encoder_decoder else {}
    return model(x, **kw).logits


def _latency(model, x, runs: int) -> float:
    from lmforge.compress.report import cpu_latency_ms

    model.eval()
    return cpu_latency_ms(lambda: _logits(model, x), runs)
