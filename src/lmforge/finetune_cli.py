"""Command functions of `lmforge finetune` and `lmforge eval` (argparse wiring lives in cli.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from lmforge.errors import LMForgeError

RESULTS_FILE = "eval-results.json"


def finetune_config(recipe: str | None, init: str | None, overrides: list[str] | dict, resume: bool = False):
    """The FinetuneConfig `lmforge finetune` runs: with --resume, the run's saved config with the overrides on top;
    else the recipe (default sst2-gpt) with `--init` and the overrides."""
    from lmforge.config import RESUME_FIXED, parse_overrides, resolved_run_dir, resumed
    from lmforge.tasks.backbone import SECTIONS
    from lmforge.tasks.config import build_finetune_config, finetune_to_dict, load_finetune_config

    user = overrides if isinstance(overrides, dict) else parse_overrides(overrides)
    if resume:
        run_dir = resolved_run_dir(recipe or "sst2-gpt", "finetune", user)
        cfg = resumed(
            run_dir, recipe, user, build_finetune_config, finetune_to_dict, fixed=RESUME_FIXED,
            unpack=lambda saved: {k: v for k, v in saved.items() if k in SECTIONS},  # not the backbone and labels
        )  # fmt: skip
        if cfg is not None:
            if init is not None and init != cfg.model.init:
                raise LMForgeError(f"cannot resume {run_dir} with --init {init}: the run fine-tunes {cfg.model.init}")
            return cfg
    return load_finetune_config(recipe or "sst2-gpt", user, init=init)


def cmd_finetune(recipe: str | None, init: str | None, overrides: list[str], resume: bool = False) -> dict[str, float]:
    """Fine-tune `init` (a run/checkpoint/HF dir, a preset, or none) on the recipe's task; print and return the
    best checkpoint's dev metrics (also in RUN/eval.json)."""
    from lmforge.tasks.data import data_label
    from lmforge.train.finetune import FineTuner

    cfg = finetune_config(recipe, init, overrides, resume)
    tuner = FineTuner(cfg, resume=resume)
    main = tuner.dist.is_main
    n = {k: len(v.examples) for k, v in tuner.splits.items()}
    if main:
        print(f"fine-tuning {cfg.model.init} on {cfg.task.type} ({cfg.data.source} {data_label(cfg.data)}): "
              + ", ".join(f"{k} {v}" for k, v in n.items()) + f"; {tuner.total_steps} steps")  # fmt: skip
    final = tuner.fit()
    if not main:  # rank 0 reports
        return final
    print(f"dev (best checkpoint): {_scores_line(tuner, 'dev', final)}")
    if tuner.tested is not None:  # a labelled test split
        print(f"test (best checkpoint): {_scores_line(tuner, 'test', tuner.tested)}")
    print(f"run saved in {tuner.run_dir}")
    return final


def _scores_line(tuner, split: str, scores: dict[str, float]) -> str:
    """`scores` of `split`, with the baselines of that split beside them."""
    line = ", ".join(f"{k} {v:.4f}" for k, v in scores.items())
    baseline = majority_baseline(tuner.splits["train"], tuner.splits[split])
    if baseline is not None:
        line += f" (majority-class baseline: accuracy {baseline:.4f})"
    for name, base in tuner.task.baselines(tuner.splits[split]).items():
        line += f" ({name} baseline: " + ", ".join(f"{k} {v:.4f}" for k, v in base.items()) + ")"
    return line


def majority_baseline(train, dev) -> float | None:
    """Dev accuracy of always predicting the most frequent training label (None when labels are not classes)."""
    labels = [str(e.label) for e in train.examples if e.label is not None and not isinstance(e.label, float)]
    if not labels or not dev.examples or train.examples[0].choices:
        return None
    top = Counter(labels).most_common(1)[0][0]
    return sum(str(e.label) == top for e in dev.examples) / len(dev.examples)


def _finetuned_run(path: Path) -> bool:
    from lmforge.loading import _is_hf_only, is_finetuned
    from lmforge.train import checkpoint as ckpt

    if _is_hf_only(path):
        return False
    try:
        return is_finetuned(ckpt.read_config(ckpt.model_checkpoint(path)))
    except LMForgeError:
        return False


def eval_finetuned(path: Path, overrides: list[str], split: str) -> dict[str, dict[str, float]]:
    """{task name: metrics} of a fine-tuned run on `split` of its data (data.* overridable)."""
    from lmforge.config import merge_dicts, parse_overrides
    from lmforge.loading import load_finetuned
    from lmforge.tasks.config import build_finetune_config, finetune_to_dict
    from lmforge.tasks.data import data_label, load_splits

    task, model, _, cfg = load_finetuned(path)
    if overrides:
        cfg = build_finetune_config(merge_dicts(finetune_to_dict(cfg), parse_overrides(overrides)))
    splits = load_splits(cfg.data)
    name = data_label(cfg.data)
    if split not in splits and cfg.data.source == "glue":  # e.g. MNLI's dev_mismatched
        from lmforge.data.glue import read_glue

        splits[split] = read_glue(cfg.data.name, Path(cfg.data.dir or "."), split)
        name = f"{name}_mm" if split.endswith("mismatched") else f"{name}-{split}"
    if split not in splits:
        have = ", ".join(splits)
        raise LMForgeError(f"split '{split}' not found for {cfg.data.source} {name} (have: {have})")
    return {name: task.evaluate(model, splits[split], cfg.train.eval_batch_size)}


def cmd_eval(
    path: str, tasks: list[str] | None = None, overrides: list[str] | None = None, out: str | None = None,
    split: str | None = None,
) -> dict[str, dict[str, float]]:  # fmt: skip
    """Evaluate a fine-tuned run on its task, or a pretrained model (run / checkpoint / HF dir) zero- or few-shot
    on the prompted-evaluation recipes `tasks` (recipes/eval/ names or paths). Prints the GLUE-style table and
    writes the results as JSON to `out` (default: RUN/eval-results.json for a fine-tuned run, else
    ./eval-results.json). `split`: dev for a fine-tuned run, the recipe's own otherwise, when None.
    Returns {task: {metric: value}}."""
    from lmforge.eval.report import write_results

    p, overrides = Path(path), list(overrides or [])
    if not p.exists():
        raise LMForgeError(f"model path not found: {path}")
    finetuned = _finetuned_run(p)
    if finetuned and not tasks:
        results = eval_finetuned(p, overrides, split or "dev")
    elif not tasks:
        raise LMForgeError(f"{path} is not a fine-tuned run: name the zero/few-shot tasks to evaluate it on (--task)")
    else:
        results = eval_prompted(p, tasks, overrides, split)
    print(results_table(results))
    dest = Path(out) if out else (p / RESULTS_FILE if finetuned and p.is_dir() else Path(RESULTS_FILE))
    write_results(dest, results)
    print(f"results written to {dest}")
    return results


def results_table(results: dict[str, dict[str, float]]) -> str:
    """The GLUE-style table (eval/report.py) when every task is a GLUE task, else one row per task and metric."""
    from lmforge.eval.report import glue_table

    try:
        return glue_table(results)
    except LMForgeError:
        pass  # some task is no GLUE task, or lacks its official metrics
    lines = ["| Task | Metric | Score |", "|---|---|---:|"]
    for task, metrics in results.items():
        for name, value in metrics.items():
            lines.append(f"| {task} | {name} | {100 * value:.1f} |")
    return "\n".join(lines) + "\n"


def eval_prompted(path: Path, tasks: list[str], overrides: list[str], split: str | None) -> dict[str, dict[str, float]]:
    from lmforge.eval.zeroshot import load_prompt_config, run_prompt_eval
    from lmforge.loading import load, load_finetuned

    if _finetuned_run(path):
        _, task_model, tokenizer, _ = load_finetuned(path)
        model = task_model.backbone  # its LM head is the pretrained one, fine-tuned alongside the task
    else:
        model, tokenizer = load(path)
    if tokenizer is None:
        raise LMForgeError(f"{path} has no tokenizer to encode prompts with")
    results = {}
    for name in tasks:
        cfg = load_prompt_config(name, ([f"--split={split}"] if split else []) + overrides)
        device = "cuda" if cfg.device == "auto" and _cuda() else ("cpu" if cfg.device == "auto" else cfg.device)
        results[cfg.name] = run_prompt_eval(cfg, model.to(device), tokenizer)
    return results


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
