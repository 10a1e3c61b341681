"""Command functions of `lmforge align ...` (argparse wiring lives in cli.py)."""

from __future__ import annotations

from pathlib import Path

from lmforge.errors import LMForgeError


def align_config(
    method: str, recipe: str, init: str | None, overrides: list[str] | dict, resume: bool = False,
    reward: str | None = None,
):  # fmt: skip
    """The AlignConfig `lmforge align METHOD` runs: with --resume, the run's saved config with the overrides on top;
    else the recipe with `--init` (and PPO's `--reward`) and the overrides."""
    from lmforge.align.config import align_to_dict, build_align_config, load_align_config
    from lmforge.config import RESUME_FIXED, merge_dicts, parse_overrides, resolved_run_dir, resumed

    user = overrides if isinstance(overrides, dict) else parse_overrides(list(overrides or []))
    cfg = None
    if resume:
        run_dir = resolved_run_dir(recipe, "align", user)
        given = merge_dicts(user, {"ppo": {"reward": reward}}) if reward else user  # must match the saved one
        cfg = resumed(
            run_dir, recipe, given, build_align_config, align_to_dict, fixed=RESUME_FIXED,
            unpack=lambda saved: saved.get("align") or {},  # a checkpoint holds the run's config under align
        )  # fmt: skip
    if cfg is None:
        cfg = load_align_config(recipe, user, init=init, reward=reward)
    if cfg.method != method:
        raise LMForgeError(f"recipe {recipe} is a '{cfg.method}' recipe, not '{method}'")
    return cfg


def _run(
    method: str, recipe: str, init: str | None, overrides: list[str], resume: bool = False, reward: str | None = None
) -> dict[str, float]:
    from lmforge.align.run import run_align

    cfg = align_config(method, recipe, init, overrides, resume, reward)
    print(f"{method}: {cfg.model.init} on {cfg.data.train or ', '.join(cfg.data.sources)}, {cfg.train.max_steps} steps")
    final = run_align(cfg, resume)
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
    from lmforge.train import checkpoint as ckpt

    raw = ckpt.read_config(ckpt.model_checkpoint(Path(run)))
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


def cmd_align_data(
    kind: str, out: str, sources: list[str] | None = None, max_train: int | None = 2000, max_eval: int | None = 200
) -> dict[str, int]:
    """Write an instruction set (kind "instructions": sources sentiment, debian) or a preference set ("preferences":
    source sentiment or continuation) as train/dev/test.jsonl under `out`; returns the record counts."""
    from lmforge.align.datasets import write_instruction_set, write_preference_set

    limits = {"train": max_train, "dev": max_eval, "test": max_eval}
    if kind == "instructions":
        counts = write_instruction_set(out, sources or ["sentiment"], limits)
    elif kind == "preferences":
        src = sources or ["continuation"]
        if len(src) != 1:
            raise LMForgeError("a preference set is built from one source")
        counts = write_preference_set(out, src[0], limits)
    else:
        raise LMForgeError(f"unknown data kind '{kind}' (instructions or preferences)")
    print(f"{kind} written to {out}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return counts
