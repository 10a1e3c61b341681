"""Evaluating a run by its path, as `lmforge eval` and `lmforge.evaluate` do: a fine-tuned run on its own task
(`eval_finetuned`), or a pretrained model zero- or few-shot on prompted-evaluation recipes (`eval_prompted`); the
results table, where the results file goes, and the majority-class baseline beside a classifier's scores."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from lmforge.errors import LMForgeError

RESULTS_FILE = "eval-results.json"


def is_finetuned_run(path: Path) -> bool:
    """Whether `path` is a fine-tuned run or checkpoint (not a pretrained one, nor a Hugging Face dir)."""
    from lmforge.checkpoint.read import is_finetuned, read_config
    from lmforge.checkpoint.verify import model_checkpoint
    from lmforge.models.pretrained import is_hf_only

    if is_hf_only(path):
        return False
    try:
        return is_finetuned(read_config(model_checkpoint(path)))
    except LMForgeError:
        return False


def majority_baseline(train, dev) -> float | None:
    """Dev accuracy of always predicting the most frequent training label (None when labels are not classes)."""
    labels = [str(e.label) for e in train.examples if e.label is not None and not isinstance(e.label, float)]
    if not labels or not dev.examples or train.examples[0].choices:
        return None
    top = Counter(labels).most_common(1)[0][0]
    return sum(str(e.label) == top for e in dev.examples) / len(dev.examples)


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
        from lmforge.data.labelled.glue import read_glue

        splits[split] = read_glue(cfg.data.name, Path(cfg.data.dir or "."), split)
        name = f"{name}_mm" if split.endswith("mismatched") else f"{name}-{split}"
    if split not in splits:
        have = ", ".join(splits)
        raise LMForgeError(f"split '{split}' not found for {cfg.data.source} {name} (have: {have})")
    return {name: task.evaluate(model, splits[split], cfg.train.eval_batch_size)}


def eval_prompted(path: Path, tasks: list[str], overrides: list[str], split: str | None) -> dict[str, dict[str, float]]:
    """{task name: metrics} of the model at `path` zero- or few-shot on the prompted-evaluation recipes `tasks`."""
    from lmforge.eval.zeroshot import load_prompt_config, run_prompt_eval
    from lmforge.loading import load, load_finetuned

    if is_finetuned_run(path):
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
        results[cfg.name] = run_prompt_eval(cfg, model.to(device), tokenizer, source=path)
    return results


def evaluate_path(
    path: str | Path, tasks: list[str] | None = None, overrides: list[str] | None = None, split: str | None = None
) -> dict[str, dict[str, float]]:
    """A fine-tuned run on its task, or a pretrained model (run / checkpoint / HF dir) zero- or few-shot on the
    prompted-evaluation recipes `tasks` (recipes/eval/ names or paths) → {task: {metric: value}}. `split`: dev
    for a fine-tuned run, the recipe's own otherwise, when None."""
    p, overrides = Path(path), list(overrides or [])
    if not p.exists():
        raise LMForgeError(f"model path not found: {path}")
    finetuned = is_finetuned_run(p)
    if finetuned and not tasks:
        return eval_finetuned(p, overrides, split or "dev")
    if not tasks:
        raise LMForgeError(f"{path} is not a fine-tuned run: name the zero/few-shot tasks to evaluate it on (--task)")
    return eval_prompted(p, tasks, overrides, split)


def results_path(path: str | Path, out: str | None = None) -> Path:
    """Where the results of evaluating `path` go: `out`, else RUN/eval-results.json for a fine-tuned run dir, else
    ./eval-results.json."""
    p = Path(path)
    if out:
        return Path(out)
    return p / RESULTS_FILE if p.is_dir() and is_finetuned_run(p) else Path(RESULTS_FILE)


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


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
