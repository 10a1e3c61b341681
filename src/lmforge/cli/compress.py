"""`lmforge compress ...`: the compression report of a fine-tuned teacher (distillation, int8 quantisation,
pruning) and the int8 quantisation of one checkpoint with its size and CPU latency."""

from __future__ import annotations

import argparse

from lmforge.cli.args import add_recipe_args, recipe_help, recipe_of, training_overrides


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
    from lmforge.run_kinds import config, run

    done = run("compress", config("compress", recipe, overrides, teacher=teacher), resume)
    print(done.table, end="")
    print(f"report written to {done.run_dir}/report.md")
    return done.metrics


def cmd_quantize(path: str, seq_len: int = 64, runs: int = 10, threads: int = 1) -> dict[str, float]:
    """Int8-quantise a model (run / checkpoint / Hugging Face dir) in memory and print its state-dict size, CPU
    latency at batch 1 and 8 (median of `runs`) and the relative error of its logits on bundled-corpus text,
    beside the float32 model's. Returns those numbers."""
    from lmforge.compress.benchmark import quantize_benchmark

    out = quantize_benchmark(path, seq_len, runs, threads)
    for k, v in out.items():
        print(f"{k}: {v:.4f}")
    return out
