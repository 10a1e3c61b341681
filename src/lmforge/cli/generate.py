"""`lmforge generate`: continue prompts with a run's or checkpoint's model (sampling, greedy or beam search)."""

from __future__ import annotations

import argparse
from pathlib import Path

from lmforge.cli.args import check_numbers
from lmforge.errors import LMForgeError


def add_parser(sub, name: str) -> None:
    g = sub.add_parser(name, help="generate text from a run dir or checkpoint dir")
    g.add_argument("checkpoint", type=Path)
    g.add_argument("--prompt", action="append", required=True, help="prompt text (repeatable)")
    g.add_argument("--max-new-tokens", type=int, default=100)
    g.add_argument("--temperature", type=float, default=0.8)
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--top-p", type=float, default=None)
    g.add_argument("--greedy", action="store_true")
    g.add_argument("--num-beams", type=int, default=1, help="beam search when > 1 (deterministic)")
    g.add_argument("--length-penalty", type=float, default=1.0)
    g.add_argument("--overlong", choices=["error", "truncate"], default="error", help="prompts past max_seq_len")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    g.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32", help="the weights' dtype")
    g.add_argument(
        "--compile", action="store_true", help="static KV cache + torch.compile'd decoding step (CUDA graphs on GPU)"
    )
    g.set_defaults(fn=run)


def option_ranges() -> dict:
    """What each numeric option takes, as `generate()` reads it (temperature 0: greedy; top_k 0: no cut)."""
    from lmforge.config.types import SEED_MAX, Range

    return {"max_new_tokens": Range(0), "temperature": Range(0), "top_k": Range(0), "top_p": Range(0, 1, lo_open=True),
            "num_beams": Range(1), "length_penalty": Range(), "seed": Range(0, SEED_MAX)}  # fmt: skip


def run(args: argparse.Namespace) -> None:
    check_numbers(args, option_ranges())  # before the model loads
    import torch

    from lmforge.loading import load
    from lmforge.models.generate import generate_text

    try:
        device = torch.device(args.device)
    except RuntimeError:
        raise LMForgeError(f"--device: unknown device '{args.device}' (cpu, cuda, cuda:1, ...)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise LMForgeError(f"--device {args.device}: no CUDA GPU is available")
    model, tok = load(args.checkpoint, device)
    model.to({"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype])
    if tok is None:
        raise LMForgeError(f"{args.checkpoint} has no tokenizer to encode the prompt with")
    gen = torch.Generator(device).manual_seed(args.seed)
    temperature = 0.0 if args.greedy else args.temperature
    for prompt in args.prompt:
        out = generate_text(
            model, tok, [prompt], max_new_tokens=args.max_new_tokens, temperature=temperature,
            top_k=args.top_k, top_p=args.top_p, num_beams=args.num_beams, length_penalty=args.length_penalty,
            generator=gen, overlong=args.overlong, compile=args.compile,
        )[0]  # fmt: skip
        print(prompt + out)
