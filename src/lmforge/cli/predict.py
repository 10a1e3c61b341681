"""`lmforge predict RUN --text T / --input FILE`: a fine-tuned run's predictions on new inputs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from lmforge.errors import LMForgeError


def add_parser(sub, name: str) -> None:
    pd = sub.add_parser(name, help="a fine-tuned run's predictions (labels, tags, answers, text) on new inputs")
    pd.add_argument("run", type=Path, help="fine-tuned run or checkpoint dir")
    pd.add_argument("--text", action="append", help="input text (repeatable); span QA: the question")
    pd.add_argument("--text-pair", action="append", help="second text of a pair task, one per --text")
    pd.add_argument("--context", help="span QA: the passage the answers come from")
    pd.add_argument("--input", help="file of inputs: .jsonl (objects with text, text_pair, context, tokens, "
                    "choices) or one text per line; - reads stdin")  # fmt: skip
    pd.add_argument("--json", action="store_true", help="print a JSON object per input (with label probabilities)")
    pd.add_argument("--batch-size", type=int, default=32)
    pd.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    pd.set_defaults(fn=run)


def run(args: argparse.Namespace) -> None:
    cmd_predict(str(args.run), args.text, args.text_pair, args.context, args.input, args.json, args.batch_size,
                args.device)  # fmt: skip


def read_inputs(path: str) -> list[str | dict]:
    """Inputs of a file ("-": stdin): JSON Lines (one object of Example fields, or a string, per line) when the
    name ends in .jsonl, else one text per line; blank lines are skipped."""
    from lmforge.data.surrogates import check_surrogates
    from lmforge.files import loads_json

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LMForgeError(f"input file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise LMForgeError(f"could not read {path}: {e}") from None
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    jsonl = path.endswith(".jsonl")
    for n, line in lines:  # stdin's bytes that are not UTF-8, an unpaired \ud800 escape: no tokenizer takes them
        check_surrogates(line, f"{path}:{n}", json_text=jsonl)
    if not jsonl:
        return [line.strip() for _, line in lines]
    items: list[str | dict] = []
    for n, line in lines:
        try:
            item = loads_json(line)
        except json.JSONDecodeError as e:
            raise LMForgeError(f"{path}:{n}: not valid JSON ({e.msg})") from None
        if not isinstance(item, (str, dict)):
            raise LMForgeError(f"{path}:{n}: expected an object or a string, got {type(item).__name__}")
        items.append(item)
    return items


def _inputs(texts: list[str] | None, pairs: list[str] | None, context: str | None, file: str | None) -> list:
    if texts and file:
        raise LMForgeError("give inputs with --text or with --input, not both")
    if file:
        if pairs or context:
            raise LMForgeError("--text-pair and --context go with --text; in an --input .jsonl file they are fields")
        return read_inputs(file)
    if not texts:
        raise LMForgeError("nothing to predict: give --text TEXT (repeatable) or --input FILE")
    if pairs and len(pairs) != len(texts):
        raise LMForgeError(f"{len(pairs)} --text-pair for {len(texts)} --text: give one pair per text")
    from lmforge.data.surrogates import check_surrogates

    for flag, values in (("--text", texts), ("--text-pair", pairs or []), ("--context", [context] if context else [])):
        for i, value in enumerate(values, 1):  # a command line's bytes that are not UTF-8 come as lone surrogates
            check_surrogates(value, f"{flag} {i}" if flag != "--context" else flag)
    items: list = []
    for i, t in enumerate(texts):
        items.append(
            {"text": t, **({"text_pair": pairs[i]} if pairs else {}), **({"context": context} if context else {})}
        )
    return items


def render(result: dict[str, Any]) -> str:
    """One line of plain output: the prediction (tags as word/TAG pairs, a list as space-separated items)."""
    pred = result["prediction"]
    if "tokens" in result:
        return " ".join(f"{w}/{t}" for w, t in zip(result["tokens"], pred))
    if "answer" in result:
        return str(result["answer"])
    if isinstance(pred, float):
        return f"{pred:.6g}"
    return "" if pred is None else str(pred).replace("\n", " ")


def cmd_predict(
    path: str, texts: list[str] | None = None, pairs: list[str] | None = None, context: str | None = None,
    file: str | None = None, as_json: bool = False, batch_size: int = 32, device: str = "cpu",
) -> list[dict[str, Any]]:  # fmt: skip
    """Print the fine-tuned run's prediction for each input, one line each (`as_json`: a JSON object per line with
    the input, the prediction and, for classifiers, the label probabilities); returns the results."""
    from lmforge.eval.finetuned import is_finetuned_run
    from lmforge.loading import load_finetuned
    from lmforge.tasks.predictor import Predictor, as_example

    p = Path(path)
    if not p.exists():
        raise LMForgeError(f"run not found: {path}")
    if not is_finetuned_run(p):
        raise LMForgeError(
            f"{path} is not a fine-tuned run: lmforge predict needs one (lmforge generate continues text)"
        )
    items = _inputs(texts, pairs, context, file)
    if batch_size < 1:
        raise LMForgeError(f"--batch-size must be positive, got {batch_size}")
    task, model, _, _ = load_finetuned(p, device)
    results = Predictor(task, model).predict(items, batch_size)
    for item, result in zip(items, results):
        ex = as_example(item)
        if task.name == "token_tagging":
            result["tokens"] = ex.tokens if ex.tokens is not None else ex.text.split()
        fields = {k: v for k, v in vars(ex).items() if k in ("text", "text_pair", "context", "tokens", "choices") and v}
        print(json.dumps({**fields, **result}, ensure_ascii=False) if as_json else render(result))
    return results
