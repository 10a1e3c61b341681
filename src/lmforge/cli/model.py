"""`lmforge model info`: what a preset, a published size table or a run's model amounts to (parameters, shape,
training FLOPs per token; with --batch, the memory per GPU)."""

from __future__ import annotations

import argparse
from pathlib import Path

from lmforge.cli.args import positive


def add_parser(sub, name: str) -> None:
    m = sub.add_parser(name, help="inspect architectures").add_subparsers(dest="sub", required=True)
    mi = m.add_parser("info", help="parameter count of a preset, a run or checkpoint ('all': every preset)")
    mi.add_argument("preset", help="preset name, 'all', a family's published table (gpt3), or a run/checkpoint dir")
    mi.add_argument("--batch", type=positive, help="also print the memory per GPU (ddp, fsdp; 1-8 GPUs) at this batch")
    mi.add_argument("--seq", type=positive, help="tokens per sequence of the FLOPs and --batch (default: max_seq_len)")
    mi.set_defaults(fn=_info)


def _info(args: argparse.Namespace) -> None:
    cmd_model_info(args.preset, args.batch, args.seq)


def cmd_model_info(preset: str, batch: int | None = None, seq: int | None = None) -> None:
    """Print parameters (total and non-embedding), shape and training FLOPs per token of `preset` (a preset name,
    'all', a published table such as gpt3, or a run / checkpoint dir, fine-tuned ones included); with `batch`, the
    memory per GPU to train it at `seq` tokens (default: max_seq_len)."""
    import torch

    from lmforge.models import Transformer, get_preset
    from lmforge.models.flops import model_flops_per_token
    from lmforge.models.gpt3 import PUBLISHED_TABLES
    from lmforge.registry import MODELS

    if preset in PUBLISHED_TABLES:
        print(PUBLISHED_TABLES[preset]())
        return
    if Path(preset).exists():  # what a run or checkpoint built
        from lmforge.checkpoint.read import is_finetuned, read_config
        from lmforge.checkpoint.verify import model_checkpoint
        from lmforge.models.presets import model_config_from_dict

        raw = read_config(model_checkpoint(Path(preset)))
        cfgs = {preset: model_config_from_dict(raw["backbone" if is_finetuned(raw) else "model"])}
    else:
        names = MODELS.names() if preset == "all" else [preset]
        cfgs = {name: get_preset(name) for name in names}
    for name, cfg in cfgs.items():
        with torch.device("meta"):  # counts without allocating (gpt3-175b included)
            model = Transformer(cfg)
        n, n_body, T = model.num_params(), model.num_params(non_embedding=True), seq or cfg.max_seq_len
        print(f"{name}: {n:,} parameters ({n / 1e6:.1f}M; {n_body / 1e6:.1f}M non-embedding), {cfg.arch}, "
              f"d_model={cfg.d_model}, n_layers={cfg.n_layers}, n_heads={cfg.n_heads}, vocab_size={cfg.vocab_size}, "
              f"max_seq_len={cfg.max_seq_len}; {model_flops_per_token(cfg, T):.3g} training FLOPs/token at "
              f"{T} tokens{' in and out' if cfg.is_encoder_decoder else ''}")  # fmt: skip
        if batch is not None:
            from lmforge.train.memory import memory_table

            print(memory_table(cfg, batch, T))
