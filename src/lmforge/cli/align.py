"""`lmforge align ...`: instruction tuning, a reward model, DPO and PPO from recipes/align, best-of-n sampling,
the comparison of aligned policies, and the instruction / preference sets they train on."""

from __future__ import annotations

import argparse
from pathlib import Path

from lmforge.cli.args import add_recipe_args, check_numbers, recipe_help, recipe_of, training_overrides
from lmforge.errors import LMForgeError

_METHODS = [("sft", "instruction tuning"), ("reward", "pairwise reward model"), ("dpo", "DPO"),
            ("ppo", "RLHF with PPO against a reward model")]  # fmt: skip


def add_parser(sub, name: str) -> None:
    al = sub.add_parser(name, help="instruction tuning, reward model, DPO, PPO, best-of-n").add_subparsers(
        dest="sub", required=True
    )
    for method, what in _METHODS:
        ap = al.add_parser(method, help=f"{what} from a recipe in recipes/align",
                           epilog_fn=recipe_help("align", method))  # fmt: skip
        add_recipe_args(ap, "align", "recipe path or bundled name in recipes/align", method=method)
        ap.add_argument("--init", help="pretrained (or SFT) run/checkpoint dir")
        ap.add_argument(
            "--resume", action="store_true", help="continue the run in --run.dir from its latest checkpoint"
        )
        if method == "ppo":
            ap.add_argument("--reward", help="the reward-model run (lmforge align reward) to optimise against")
        ap.set_defaults(fn=run)
    bo = al.add_parser("best-of-n", help="sample n answers and keep the reward model's favourite")
    bo.add_argument("policy")
    bo.add_argument("reward_model")
    bo.add_argument("--prompt", action="append", required=True)
    bo.add_argument("--n", type=int, default=4)
    bo.add_argument("--max-new-tokens", type=int, default=32)
    bo.add_argument("--temperature", type=float, default=1.0)
    bo.set_defaults(fn=run)
    _add_compare(al)
    ad = al.add_parser("data", help="write an instruction or preference set built from project data")
    ad.add_argument("kind", choices=list(DATA_KINDS))
    ad.add_argument("--out", required=True)
    ad.add_argument("--source", action="append", help="sentiment, debian (instructions); sentiment, continuation")
    ad.set_defaults(fn=run)


def _add_compare(al) -> None:
    cp = al.add_parser("compare", help="PPO, DPO, best-of-n and the SFT policy on the same held-out prompts")
    cp.add_argument("--reference", required=True, help="the SFT run the others started from")
    cp.add_argument("--reward", required=True, help="the reward-model run that scores every response")
    cp.add_argument("--policy", action="append", help="NAME=RUN or RUN (repeatable): aligned policy runs")
    cp.add_argument("--best-of-n", type=int, action="append", help="n of best-of-n from the reference (repeatable)")
    cp.add_argument("--prompts-from", help="the run whose data gives the held-out prompts (default: first --policy)")
    cp.add_argument("--split", default="test", choices=["dev", "test"], help="held-out split of that data")
    cp.add_argument("--max-prompts", type=int, default=128)
    cp.add_argument("--max-new-tokens", type=int, help="default: the PPO run's ppo.max_new_tokens, else 32")
    cp.add_argument("--samples", type=int, default=3, help="prompts whose responses the table shows")
    cp.add_argument("--out", help="write OUT.md (table and samples) and OUT.json (all rows and samples)")
    cp.add_argument("--seed", type=int, default=0)
    cp.set_defaults(fn=run)


def overrides(args: argparse.Namespace, argv: list[str], extra: list[str]) -> list[str] | None:
    """A method's overrides (the subcommands with a recipe, and `data`, whose KIND stands where a kind would);
    None for the others, which take no extra arguments."""
    return training_overrides("align", argv, extra) if hasattr(args, "kind") else None


def option_ranges(sub: str) -> dict:
    """What each numeric option of `align best-of-n` and `align compare` takes."""
    from lmforge.config.types import SEED_MAX, Range

    if sub == "best-of-n":
        return {"n": Range(1), "max_new_tokens": Range(0), "temperature": Range(0)}
    if sub == "compare":
        return {"best_of_n": Range(1), "max_prompts": Range(1), "max_new_tokens": Range(1), "samples": Range(0),
                "seed": Range(0, SEED_MAX)}  # fmt: skip
    return {}


def run(args: argparse.Namespace) -> None:
    check_numbers(args, option_ranges(args.sub))  # before anything loads
    if args.sub == "best-of-n":
        cmd_best_of_n(args.policy, args.reward_model, args.prompt, args.n, args.max_new_tokens, args.temperature)
    elif args.sub == "data":
        cmd_align_data(args.kind, args.out, args.source)
    elif args.sub == "compare":
        cmd_compare(
            args.reference, args.reward, args.policy, args.best_of_n, args.prompts_from, args.split, args.max_prompts,
            args.max_new_tokens, args.samples, args.out, args.seed,
        )  # fmt: skip
    elif args.sub == "ppo":
        cmd_ppo(recipe_of(args), args.init, args.overrides, resume=args.resume, reward=args.reward)
    else:
        method = {"sft": cmd_sft, "reward": cmd_reward, "dpo": cmd_dpo}[args.sub]
        method(recipe_of(args), args.init, args.overrides, resume=args.resume)


def _run(
    method: str, recipe: str, init: str | None, overrides: list[str], resume: bool = False, reward: str | None = None
) -> dict[str, float]:
    from lmforge.run_kinds import config, run

    def announce(cfg) -> None:
        print(f"{method}: {cfg.model.init} on {cfg.data.train or ', '.join(cfg.data.sources)}, "
              f"{cfg.train.max_steps} steps")  # fmt: skip

    cfg = config("align", recipe, overrides, init=init, resume=resume, method=method, reward=reward)
    final = run("align", cfg, resume, announce).metrics
    print("dev: " + ", ".join(f"{k} {v:.4f}" for k, v in final.items()))
    print(f"run saved in {cfg.run.dir}")
    return final


def cmd_sft(
    recipe: str | None, init: str | None = None, overrides: list[str] | None = None, resume: bool = False
) -> dict[str, float]:
    """Instruction-tune `init` (default recipe: sft-sentiment); prints and returns the dev metrics."""
    return _run("sft", recipe or "sft-sentiment", init, overrides or [], resume)


def cmd_reward(
    recipe: str | None, init: str | None = None, overrides: list[str] | None = None, resume: bool = False
) -> dict[str, float]:
    """Train a reward model on preference pairs (default recipe: reward-continuation)."""
    return _run("reward", recipe or "reward-continuation", init, overrides or [], resume)


def cmd_dpo(
    recipe: str | None, init: str | None = None, overrides: list[str] | None = None, resume: bool = False
) -> dict[str, float]:
    """DPO-tune `init` (usually an SFT run) on preference pairs (default recipe: dpo-continuation)."""
    return _run("dpo", recipe or "dpo-continuation", init, overrides or [], resume)


def cmd_ppo(
    recipe: str | None, init: str | None = None, overrides: list[str] | None = None, resume: bool = False,
    reward: str | None = None,
) -> dict[str, float]:  # fmt: skip
    """RLHF with PPO: optimise `init` (an SFT run) against the reward model run `reward` (default recipe:
    ppo-continuation); returns the held-out reward and KL to the reference."""
    return _run("ppo", recipe or "ppo-continuation", init, overrides or [], resume, reward)


def _template_of(run: str) -> str:
    from lmforge.checkpoint.read import read_config
    from lmforge.checkpoint.verify import model_checkpoint

    raw = read_config(model_checkpoint(Path(run)))
    return ((raw.get("align") or {}).get("model") or {}).get("template", "chat")


def cmd_best_of_n(
    policy: str, reward_model: str, prompts: list[str], n: int = 4, max_new_tokens: int = 32,
    temperature: float = 1.0, seed: int = 0,
) -> list:  # fmt: skip
    """Sample n responses per prompt (an instruction) from the policy run, print the one the reward model run
    scores highest with every candidate's reward; returns the BestOfN results."""
    import torch

    from lmforge.align.reward import best_of_n
    from lmforge.align.run import load_reward_model
    from lmforge.align.templates import Conversation, get_template
    from lmforge.loading import load

    model, tok = load(policy)
    if tok is None:
        raise LMForgeError(f"{policy} has no tokenizer")
    rm, rm_tok = load_reward_model(reward_model)
    if rm_tok.vocab_size != tok.vocab_size:
        raise LMForgeError("the policy and the reward model use different tokenizers")
    template = get_template(_template_of(policy), tok)
    gen = torch.Generator().manual_seed(seed)
    results = []
    for p in prompts:
        res = best_of_n(
            model, rm, template, Conversation.instruction(p, None), n, max_new_tokens=max_new_tokens,
            temperature=temperature, generator=gen,
        )  # fmt: skip
        print(f"--- prompt: {p}")
        for text, r in sorted(zip(res.candidates, res.rewards), key=lambda x: -x[1]):
            print(f"{'*' if text == res.best else ' '} {r:+.3f}  {text}")
        results.append(res)
    return results


def cmd_compare(
    reference: str, reward: str, policies: list[str] | None = None, best_of_n: list[int] | None = None,
    prompts_from: str | None = None, split: str = "test", max_prompts: int = 128, max_new_tokens: int | None = None,
    samples: int = 3, out: str | None = None, seed: int = 0,
) -> list:  # fmt: skip
    """Score the reference (SFT) policy, each policy run (`NAME=RUN` or `RUN`) and best-of-n from the reference on
    the same held-out prompts (the `split` of `prompts_from`'s data; default: the first policy run's): the reward
    model's mean score, the KL to the reference, a few samples. Prints the Markdown table; with `out`, writes
    OUT.md and OUT.json. Returns the rows."""
    from lmforge.align.compare import compare, markdown, parse_policies, write_results

    named = parse_policies(policies or [])
    source = prompts_from or (named[0][1] if named else None)
    if source is None:
        raise LMForgeError("compare: name the held-out prompts with --prompts-from RUN (or give a --policy)")
    rows, prompts = compare(
        reference, reward, named, best_of_n or [], source, split=split, max_prompts=max_prompts,
        max_new_tokens=max_new_tokens, seed=seed,
    )  # fmt: skip
    title = f"{len(prompts)} held-out prompts ({split} split of {source}'s data), reward model {reward}"
    print(markdown(rows, prompts, samples, title))
    if out:
        write_results(rows, prompts, out, samples, title)
        print(f"written to {Path(out).with_suffix('.md')} and {Path(out).with_suffix('.json')}")
    return rows


def _instruction_set(out: str, sources: list[str] | None, limits: dict[str, int | None]) -> dict[str, int]:
    from lmforge.align.datasets import write_instruction_set

    return write_instruction_set(out, sources or ["sentiment"], limits)


def _preference_set(out: str, sources: list[str] | None, limits: dict[str, int | None]) -> dict[str, int]:
    from lmforge.align.datasets import write_preference_set

    src = sources or ["continuation"]
    if len(src) != 1:
        raise LMForgeError("a preference set is built from one source")
    return write_preference_set(out, src[0], limits)


DATA_KINDS = {"instructions": _instruction_set, "preferences": _preference_set}
"""`lmforge align data` KIND → its writer (out, sources, per-split limits) → the record counts."""


def cmd_align_data(
    kind: str, out: str, sources: list[str] | None = None, max_train: int | None = 2000, max_eval: int | None = 200
) -> dict[str, int]:
    """Write an instruction set (kind "instructions": sources sentiment, debian) or a preference set ("preferences":
    source sentiment or continuation) as train/dev/test.jsonl under `out`; returns the record counts."""
    if kind not in DATA_KINDS:
        raise LMForgeError(f"unknown data kind '{kind}' ({' or '.join(DATA_KINDS)})")
    limits = {"train": max_train, "dev": max_eval, "test": max_eval}
    counts = DATA_KINDS[kind](out, sources, limits)
    print(f"{kind} written to {out}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return counts
