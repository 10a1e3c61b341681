"""`lmforge eval`: a fine-tuned run on its task, a pretrained model zero/few-shot on recipes/eval, perplexity of a
text file (--text), or lm-evaluation-harness (--harness); the results table, and the results as JSON."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from lmforge.errors import LMForgeError


def add_parser(sub, name: str) -> None:
    ev = sub.add_parser(
        name, help="evaluate a fine-tuned run, or zero/few-shot a pretrained model", formatter_class=_HelpFormatter
    )
    ev.add_argument("path", type=Path, help="fine-tuned run dir, or a pretrained run/checkpoint for --task recipes")
    ev.add_argument("--task", action="append", help="recipes/eval name or path (repeatable), e.g. blimp "
                    "--data.dir=DIR: grammatical minimal pairs, for every family")  # fmt: skip
    ev.add_argument("--out", help="write the results JSON here")
    ev.add_argument("--split", help="dataset split to evaluate (default: dev, or each recipe's)")
    ev.add_argument("--text", help="perplexity and bits per byte of a pretrained model on this text file (an "
                    "encoder: pseudo-perplexity and pseudo-bits per byte, from its pseudo-log-likelihood)")  # fmt: skip
    ev.add_argument("--stride", type=int, help="--text: new tokens per sliding window (default: the context)")
    # A missing value (nargs "?") reaches memory_flags as '' and is refused there, in its own words.
    ev.add_argument("--segment", metavar="N", nargs="?", const="", type=_memory_value("--segment"),
                    help="--text on a Transformer-XL run: tokens per segment of the segment-recurrent evaluation "
                    "(Dai et al. 2019 §3.2; default: the run's objective.eval_seq_len or train.seq_len)")  # fmt: skip
    ev.add_argument("--mem-len", metavar="N", nargs="?", const="", type=_memory_value("--mem-len"),
                    help="--text on a Transformer-XL run: tokens of memory carried from segment to segment "
                    "(default: the run's objective.eval_mem_len or model.mem_len)")  # fmt: skip
    ev.add_argument("--batch-size", type=int, default=16, help="--text: windows per forward pass (an encoder's "
                    "window brings one masked copy per token)")  # fmt: skip
    ev.add_argument("--harness", action="store_true", help="lm-evaluation-harness: the arguments after it are "
                    "lm_eval's; PATH is the model `lmforge`, lmforge's example tasks are on the task path")  # fmt: skip
    ev.set_defaults(fn=run)


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Shows --segment N and --mem-len N as taking their value: it is required (`_memory_value` refuses none), but
    taken as optional by the parser so that a missing one is refused in memory_flags' words."""

    def _format_args(self, action: argparse.Action, default_metavar: str) -> str:
        if action.nargs == "?" and action.const == "":
            return self._metavar_formatter(action, default_metavar)(1)[0]
        return super()._format_args(action, default_metavar)


def _memory_value(flag: str) -> Callable[[str], int]:
    """The value of --segment / --mem-len, checked by `memory_flags`, the one rule for both (a bad value: its one
    line, as from the Python API)."""

    def value(text: str) -> int:
        from lmforge.eval.memory_lm import memory_flags

        segment, mem_len, _ = memory_flags([f"{flag}={text}"])
        return segment if flag == "--segment" else mem_len

    return value


def overrides(args: argparse.Namespace, argv: list[str], extra: list[str]) -> list[str]:
    return extra  # the data.* or recipe keys, as they are


def run(args: argparse.Namespace) -> None:
    if args.text:
        from lmforge.eval.text import cmd_text

        extra = args.overrides + [f"--task={t}" for t in args.task or []]
        cmd_text(str(args.path), args.text, stride=args.stride, batch_size=args.batch_size, out=args.out, extra=extra,
                 segment=args.segment, mem_len=args.mem_len)  # fmt: skip
        return
    if args.segment is not None or args.mem_len is not None:
        flag = "--segment" if args.segment is not None else "--mem-len"
        raise LMForgeError(
            f"{flag} sets the segment-recurrent scoring of --text FILE by a Transformer-XL run; give --text"
        )
    cmd_eval(str(args.path), args.task, args.overrides, args.out, args.split)


def harness(args: list[str]) -> int:
    """`lmforge eval [MODEL] --harness ARGS`: lm_eval's command line with the `lmforge` model and tasks."""
    from lmforge.eval.harness import main as harness_main

    i = args.index("--harness")
    before, after = args[:i], args[i + 1 :]
    if len(before) > 1 or (before and before[0].startswith("-")):
        raise LMForgeError("eval --harness: give lm_eval's arguments after --harness (before it only the model dir)")
    return harness_main(after, model=before[0] if before else None)


def cmd_eval(
    path: str, tasks: list[str] | None = None, overrides: list[str] | None = None, out: str | None = None,
    split: str | None = None,
) -> dict[str, dict[str, float]]:  # fmt: skip
    """Evaluate a fine-tuned run on its task, or a pretrained model (run / checkpoint / HF dir) zero- or few-shot
    on the prompted-evaluation recipes `tasks` (recipes/eval/ names or paths). Prints the GLUE-style table and
    writes the results as JSON to `out` (default: RUN/eval-results.json for a fine-tuned run, else
    ./eval-results.json). `split`: dev for a fine-tuned run, the recipe's own otherwise, when None.
    Returns {task: {metric: value}}."""
    from lmforge.eval.finetuned import evaluate_path, results_path, results_table
    from lmforge.eval.report import write_results

    results = evaluate_path(path, tasks, overrides, split)
    print(results_table(results))
    dest = results_path(path, out)
    write_results(dest, results)
    print(f"results written to {dest}")
    return results
