"""`lmforge pretrain`: pretrain a model from a recipe, then report its validation scores and samples."""

from __future__ import annotations

import argparse
import math

from lmforge.cli.args import add_recipe_args, recipe_help, recipe_of, training_overrides


def add_parser(sub, name: str) -> None:
    pt = sub.add_parser(name, help="pretrain a model from a recipe (default: the demo)",
                        epilog_fn=recipe_help("pretrain"))  # fmt: skip
    add_recipe_args(pt, "pretrain", "recipe path or bundled name (e.g. gpt; default: demo)")
    pt.add_argument("--resume", action="store_true", help="continue the run in --run.dir from its latest checkpoint")
    pt.set_defaults(fn=run)


def overrides(args: argparse.Namespace, argv: list[str], extra: list[str]) -> list[str]:
    return training_overrides("pretrain", argv, extra)


def run(args: argparse.Namespace) -> None:
    from lmforge.run_kinds import config, run

    done = run("pretrain", config("pretrain", recipe_of(args), args.overrides, resume=args.resume), args.resume)
    if done.is_main:
        report(done.job, done.metrics)


def report(trainer, final: dict) -> None:
    """The validation scores beside the unigram baseline, the config's samples and where the run is saved."""
    from lmforge.data.corpus.loader import unigram_cross_entropy
    from lmforge.models.generate import generate_text

    cfg = trainer.cfg
    # the unigram plateau of the same validation targets where the objective logs one, else of the whole val split
    plateau = (final or {}).get("val_plateau")
    if final and "val_ppl" not in final:  # objectives that do not score every next token: loss only
        beside = f" (unigram baseline of its targets: loss {plateau:.3f})" if plateau is not None else ""
        print(f"validation: loss {final['val_loss']:.3f} nats/token{beside}")
    elif final:
        base = plateau if plateau is not None else unigram_cross_entropy(trainer.data_dir)
        print(
            f"validation: loss {final['val_loss']:.3f} nats/token, perplexity {final['val_ppl']:.1f}, "
            f"{final['val_bpb']:.3f} bits/byte (unigram baseline: loss {base:.3f}, "
            f"perplexity {math.exp(base):.1f})"
        )
    s = cfg.sample
    if s.prompts and not cfg.model.is_encoder:
        model = trainer.raw_model
        if cfg.train.parallel == "fsdp":  # its shards' process group is gone: sample from the saved weights
            from lmforge.loading import load

            model = load(trainer.run_dir, trainer.device)[0]
        outs = generate_text(
            model, trainer.tokenizer, s.prompts, max_new_tokens=s.max_new_tokens,
            temperature=s.temperature, top_k=s.top_k,
        )  # fmt: skip
        for p, o in zip(s.prompts, outs):
            print(f"--- sample\n{p}{o}")
    print(f"run saved in {trainer.run_dir}")
