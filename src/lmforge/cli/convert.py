"""`lmforge convert`: lmforge checkpoints <-> Hugging Face model dirs (a fine-tuned run: its task model)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Literal

from lmforge.errors import LMForgeError


def add_parser(sub, name: str) -> None:
    cv = sub.add_parser(name, help="convert between Hugging Face model dirs and lmforge checkpoints")
    cv.add_argument("src", type=Path, help="HF model dir, lmforge run dir or checkpoint dir")
    cv.add_argument("--out", type=Path, required=True)
    cv.add_argument("--to", choices=["hf", "lmforge"], required=True)
    cv.add_argument("--merge", action="store_true", help="a LoRA fine-tuned run: fold the LoRA into one HF model dir "
                    "(default: a peft adapter dir + its base model in OUT/base)")  # fmt: skip
    cv.set_defaults(fn=run)


def run(args: argparse.Namespace) -> None:
    cmd_convert(args.src, args.out, args.to, merge=args.merge)


def _check_out(out: Path, src: Path, to: str) -> None:
    """Refuse to write over the source, or over a directory holding anything but an earlier conversion."""
    if out.exists() and not out.is_dir():
        raise LMForgeError(f"output {out} is a file, expected a directory")
    if out.resolve() == src.resolve():
        raise LMForgeError(f"output {out} is the source directory")
    markers = ("config.json", "adapter_config.json") if to == "hf" else ("manifest.json",)
    if out.is_dir() and any(out.iterdir()) and not any((out / m).is_file() for m in markers):
        raise LMForgeError(f"output directory {out} is not empty")


def cmd_convert(src: Path, out: Path, to: Literal["hf", "lmforge"], merge: bool = False) -> None:
    """Convert `src` (an lmforge run/checkpoint dir or a Hugging Face model dir) to `to` format at `out`.

    hf: config.json + model.safetensors (+ tokenizer files) that `transformers` Auto classes load; a fine-tuned run
    becomes its task model (`*ForSequenceClassification`, ...) with its labels, a LoRA run a peft adapter + its base
    (`merge`: the LoRA folded into one plain model dir instead).
    lmforge: a checkpoint dir (model.safetensors, config.yaml, tokenizer, manifest.json) for `lmforge.load`.
    """
    from lmforge.loading import load

    if to not in ("hf", "lmforge"):
        raise LMForgeError(f"unknown conversion target '{to}' (choose hf or lmforge)")
    src, out = Path(src), Path(out)
    _check_out(out, src, to)
    if to == "hf" and _finetuned(src):
        from lmforge.finetuning.export import export_finetuned

        print(export_finetuned(src, out, merge=merge))
        return
    if merge:
        raise LMForgeError(f"--merge applies to a fine-tuned LoRA run converted to hf, and {src} is none")
    model, tokenizer = load(src)
    if to == "hf":
        from lmforge.models.hf import export_hf
        from lmforge.models.hf.io import hf_state_and_config

        conv, _, _ = hf_state_and_config(model)
        export_hf(model, out, tokenizer)
        print(f"wrote Hugging Face {conv.model_type} model to {out} (transformers.{conv.auto_class(model.config)})")
    else:
        from lmforge.checkpoint.write import write_checkpoint_dir

        config = {"model": dataclasses.asdict(model.config)}
        write_checkpoint_dir(out, model, config=config, tokenizer=tokenizer)
        print(f"wrote lmforge checkpoint of '{model.config.name}' ({model.num_params():,} parameters) to {out}")


def _finetuned(src: Path) -> bool:
    """Whether `src` is a fine-tuned run or checkpoint (exported as its task model)."""
    from lmforge.eval.finetuned import is_finetuned_run

    return src.exists() and is_finetuned_run(src)
