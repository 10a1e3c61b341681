"""GLUE (Wang et al. 2018) and SuperGLUE (Wang et al. 2019) task files as distributed → `Dataset`.

GLUE: one directory per task (CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, WNLI) holding `train.tsv`,
`dev.tsv`, `test.tsv` (MNLI: `dev_matched.tsv`, `dev_mismatched.tsv`, `test_matched.tsv`, ...). Files are
tab-separated without quoting; all have a header row except CoLA's train/dev (4 columns: source, label,
original annotation, sentence). Test files carry no labels. Integer labels in the files become class names
(SST-2 0/1 → negative/positive) whose index is the file's integer. SuperGLUE: `train.jsonl`, `val.jsonl`,
`test.jsonl` per task (BoolQ, CB, COPA, RTE, WSC).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lmforge import metrics as M
from lmforge.data.labelled.examples import Dataset, Example
from lmforge.data.labelled.readers import check_label, fail, parse_score, read_jsonl, read_lines
from lmforge.data.labelled.winograd import group_wsc_pairs, wsc_pair
from lmforge.errors import LMForgeError

COLA_COLUMNS = ("source", "label", "original_label", "sentence")


@dataclass(frozen=True)
class GlueTask:
    """One GLUE task: file layout, label set, official metrics (main first)."""

    name: str
    """Display name and directory name of the GLUE download (e.g. "SST-2")."""
    task_type: Literal["classification", "regression"]
    text: str
    text_pair: str | None
    label: str
    labels: tuple[str, ...] | None
    """Class names; a file's integer label i is labels[i] (None: regression)."""
    metrics: tuple[str, ...]
    integer_labels: bool = True
    """Whether the files store labels as 0/1/... (else as the class names themselves)."""
    pos_label: str | None = None
    """The positive class of binary F1."""
    splits: tuple[str, ...] = ("train", "dev", "test")


_NLI2 = ("entailment", "not_entailment")
GLUE_TASKS: dict[str, GlueTask] = {
    "cola": GlueTask("CoLA", "classification", "sentence", None, "label", ("unacceptable", "acceptable"), ("mcc",)),
    "sst2": GlueTask("SST-2", "classification", "sentence", None, "label", ("negative", "positive"), ("accuracy",)),
    "mrpc": GlueTask(
        "MRPC",
        "classification",
        "#1 String",
        "#2 String",
        "Quality",
        ("not_equivalent", "equivalent"),
        ("f1", "accuracy"),
        pos_label="equivalent",
    ),
    "stsb": GlueTask("STS-B", "regression", "sentence1", "sentence2", "score", None, ("pearson", "spearman")),
    "qqp": GlueTask(
        "QQP",
        "classification",
        "question1",
        "question2",
        "is_duplicate",
        ("not_duplicate", "duplicate"),
        ("f1", "accuracy"),
        pos_label="duplicate",
    ),
    "mnli": GlueTask(
        "MNLI",
        "classification",
        "sentence1",
        "sentence2",
        "gold_label",
        ("entailment", "neutral", "contradiction"),
        ("accuracy",),
        integer_labels=False,
        splits=("train", "dev_matched", "dev_mismatched", "test_matched", "test_mismatched"),
    ),
    "qnli": GlueTask("QNLI", "classification", "question", "sentence", "label", _NLI2, ("accuracy",), False),
    "rte": GlueTask("RTE", "classification", "sentence1", "sentence2", "label", _NLI2, ("accuracy",), False),
    "wnli": GlueTask(
        "WNLI", "classification", "sentence1", "sentence2", "label", ("not_entailment", "entailment"), ("accuracy",)
    ),
}
"""GLUE task key → spec. Keys are lowercase without punctuation ("SST-2", "sst_2" → "sst2")."""

_SPLIT_ALIASES = {"validation": "dev", "val": "dev"}
_MNLI_ALIASES = {"dev": "dev_matched", "test": "test_matched"}
_MRPC_ORIGINAL = {"train": "msr_paraphrase_train.txt", "test": "msr_paraphrase_test.txt"}


def task_key(name: str) -> str:
    """Canonical key of a task name: lowercase letters and digits only ("STS-B" → "stsb")."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def glue_task(name: str) -> GlueTask:
    """The spec of GLUE task `name` (any spelling: "SST-2", "sst2")."""
    key = task_key(name)
    if key not in GLUE_TASKS:
        raise LMForgeError(f"unknown GLUE task '{name}' (known: {', '.join(GLUE_TASKS)})")
    return GLUE_TASKS[key]


def _glue_file(spec: GlueTask, data_dir: Path, split: str) -> tuple[Path, str]:
    split = _SPLIT_ALIASES.get(split, split)
    if spec.name == "MNLI":
        split = _MNLI_ALIASES.get(split, split)
    if split not in spec.splits:
        raise LMForgeError(f"{spec.name} has no split '{split}' (splits: {', '.join(spec.splits)})")
    candidates = [data_dir / f"{split}.tsv", data_dir / spec.name / f"{split}.tsv"]
    if spec.name == "MRPC" and split in _MRPC_ORIGINAL:  # the MSR release's own file names
        candidates += [data_dir / _MRPC_ORIGINAL[split], data_dir / spec.name / _MRPC_ORIGINAL[split]]
    for path in candidates:
        if path.is_file():
            return path, split
    raise LMForgeError(f"{spec.name} {split}: no {split}.tsv in {data_dir} or {data_dir / spec.name}")


def _tsv_rows(path: Path, header: tuple[str, ...] | None) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """(column names, [(line, cells)]) of a GLUE TSV; `header` names the columns of a file without a header row."""
    rows = [(n, line.split("\t")) for n, line in read_lines(path) if line != ""]
    if header is None:
        if not rows:
            raise LMForgeError(f"{path}: empty file (expected a header row)")
        columns = rows.pop(0)[1]
    else:
        columns = list(header)
    for n, cells in rows:
        if len(cells) != len(columns):
            raise fail(path, n, f"expected {len(columns)} tab-separated columns, found {len(cells)}")
    return columns, rows


def read_glue(task: str, data_dir: Path | str, split: str) -> Dataset:
    """Read split `split` (train, dev, test; MNLI: dev_matched, dev_mismatched, test_matched, test_mismatched —
    dev/test mean matched) of GLUE task `task` from `data_dir` (the task's directory or the GLUE root)."""
    spec = glue_task(task)
    path, split = _glue_file(spec, Path(data_dir), split)
    headerless = spec.name == "CoLA" and not split.startswith("test")
    columns, rows = _tsv_rows(path, COLA_COLUMNS if headerless else None)
    col = {name: i for i, name in enumerate(columns)}
    text_col = spec.text
    needed = [text_col] + ([spec.text_pair] if spec.text_pair else [])
    missing = [c for c in needed if c not in col]
    if missing:
        raise fail(path, 1, f"{spec.name} header has no column {missing[0]!r} (found: {', '.join(columns)})")
    labelled = spec.label in col
    if not labelled and not split.startswith("test"):
        raise fail(path, 1, f"{spec.name} {split} header has no label column {spec.label!r}")
    id_col = next((c for c in ("index", "id", "idx") if c in col), None)
    extra = [c for c in ("genre", "source") if c in col]
    examples = []
    for n, cells in rows:
        ex = Example(text=cells[col[text_col]], text_pair=cells[col[spec.text_pair]] if spec.text_pair else None)
        ex.id = cells[col[id_col]] if id_col else f"{split}-{len(examples)}"
        ex.meta = {c: cells[col[c]] for c in extra}
        if labelled:
            ex.label = _glue_label(spec, path, n, cells[col[spec.label]])
        examples.append(ex)
    return Dataset(examples, list(spec.labels) if spec.labels else None, str(path), spec.task_type)


def _glue_label(spec: GlueTask, path: Path, line: int, raw: str) -> str | float:
    if spec.task_type == "regression":
        return parse_score(path, line, raw, (0.0, 5.0))  # STS-B similarity is annotated on 0-5
    assert spec.labels is not None
    if spec.integer_labels:
        allowed = [str(i) for i in range(len(spec.labels))]
        return spec.labels[int(check_label(path, line, raw, allowed))]
    return check_label(path, line, raw, spec.labels)


def glue_metrics(task: str, preds: Sequence, refs: Sequence) -> dict[str, float]:
    """The official metrics of a GLUE/SuperGLUE task (e.g. MRPC → {"f1", "accuracy"}). Classification
    predictions and references are class names (or the label indices of the task's label order)."""
    key = task_key(task)
    spec = GLUE_TASKS.get(key) or SUPERGLUE_TASKS.get(key)
    if spec is None:
        raise LMForgeError(f"unknown GLUE/SuperGLUE task '{task}'")
    out = {}
    for name in spec.metrics:
        if name == "f1":
            pos: object = spec.pos_label
            if pos is not None and refs and not isinstance(refs[0], str):
                pos = list(spec.labels or ()).index(spec.pos_label)  # references given as label indices
            out[name] = M.f1(preds, refs, pos_label=pos)
        else:
            out[name] = M.METRICS[name](preds, refs)
    return out


# ---------------------------------------------------------------- SuperGLUE


@dataclass(frozen=True)
class SuperGlueTask:
    """One SuperGLUE task: label set, official metrics, and how a jsonl object becomes an Example."""

    name: str
    task_type: Literal["classification", "multiple_choice"]
    labels: tuple[str, ...] | None
    metrics: tuple[str, ...]
    convert: Callable[[Path, int, dict], Example]
    pos_label: str | None = None
    regroup: Callable[[list[Example]], list[Example]] | None = None
    """Turns the examples read (labelled with `labels`) into the task's own (WSC pairs → Winograd examples)."""


def _get(path: Path, line: int, obj: dict, key: str) -> str:
    if key not in obj:
        raise fail(path, line, f"missing field {key!r}")
    return str(obj[key])


def _pair(a: str, b: str) -> Callable[[Path, int, dict], Example]:
    def convert(path: Path, line: int, obj: dict) -> Example:
        return Example(text=_get(path, line, obj, a), text_pair=_get(path, line, obj, b))

    return convert


# COPA asks for the cause or the effect of the premise; the question goes into the text so that a choice
# scorer sees it (the raw premise and question stay in meta).
_COPA_QUESTION = {"cause": "What was the cause?", "effect": "What happened as a result?"}


def _copa(path: Path, line: int, obj: dict) -> Example:
    premise, question = _get(path, line, obj, "premise"), _get(path, line, obj, "question")
    if question not in _COPA_QUESTION:
        raise fail(path, line, f"COPA question {question!r} is not 'cause' or 'effect'")
    choices = [_get(path, line, obj, "choice1"), _get(path, line, obj, "choice2")]
    meta = {"premise": premise, "question": question}
    return Example(text=f"{premise} {_COPA_QUESTION[question]}", choices=choices, meta=meta)


SUPERGLUE_TASKS: dict[str, SuperGlueTask] = {
    "boolq": SuperGlueTask("BoolQ", "classification", ("False", "True"), ("accuracy",), _pair("question", "passage")),
    "cb": SuperGlueTask(
        "CB",
        "classification",
        ("entailment", "contradiction", "neutral"),
        ("accuracy", "macro_f1"),
        _pair("premise", "hypothesis"),
    ),
    "copa": SuperGlueTask("COPA", "multiple_choice", None, ("accuracy",), _copa),
    "rte": SuperGlueTask("RTE", "classification", _NLI2, ("accuracy",), _pair("premise", "hypothesis")),
    # WSC: each line pairs the pronoun with one candidate (true/false); "wsc-choice" groups a sentence's pairs into
    # one Winograd example whose choices are its candidates (data/labelled/winograd.py).
    "wsc": SuperGlueTask("WSC", "classification", ("False", "True"), ("accuracy",), wsc_pair, pos_label="True"),
    "wscchoice": SuperGlueTask(
        "WSC", "multiple_choice", ("False", "True"), ("accuracy",), wsc_pair, regroup=group_wsc_pairs
    ),
}
_SUPERGLUE_FILES = {"train": "train.jsonl", "dev": "val.jsonl", "test": "test.jsonl"}


def read_superglue(task: str, data_dir: Path | str, split: str) -> Dataset:
    """Read split `split` (train, dev = val.jsonl, test) of SuperGLUE task `task` (BoolQ, CB, COPA, RTE, WSC,
    wsc-choice) from `data_dir` (the task's directory or the SuperGLUE root). Test files carry no labels."""
    key = task_key(task)
    if key not in SUPERGLUE_TASKS:
        raise LMForgeError(f"unknown SuperGLUE task '{task}' (known: {', '.join(SUPERGLUE_TASKS)})")
    spec = SUPERGLUE_TASKS[key]
    split = _SPLIT_ALIASES.get(split, split)
    if split not in _SUPERGLUE_FILES:
        raise LMForgeError(f"{spec.name} has no split '{split}' (splits: train, dev, test)")
    name, data_dir = _SUPERGLUE_FILES[split], Path(data_dir)
    path = next((p for p in (data_dir / name, data_dir / spec.name / name) if p.is_file()), None)
    if path is None:
        raise LMForgeError(f"{spec.name} {split}: no {name} in {data_dir} or {data_dir / spec.name}")
    examples = []
    for n, obj in read_jsonl(path):
        ex = spec.convert(path, n, obj)
        ex.id = str(obj.get("idx", n))
        if "label" in obj:
            ex.label = _superglue_label(spec, path, n, obj["label"])
        elif split != "test":
            raise fail(path, n, f"missing field 'label' ({spec.name} {split} examples are labelled)")
        examples.append(ex)
    if spec.regroup is not None:
        return Dataset(spec.regroup(examples), None, str(path), spec.task_type)
    return Dataset(examples, list(spec.labels) if spec.labels else None, str(path), spec.task_type)


def _superglue_label(spec: SuperGlueTask, path: Path, line: int, raw: object) -> str | int:
    if spec.task_type == "multiple_choice" and spec.labels is None:
        if raw not in (0, 1) or isinstance(raw, bool):
            raise fail(path, line, f"{spec.name} label {raw!r} is not 0 or 1")
        return int(raw)  # type: ignore[arg-type]
    assert spec.labels is not None
    value = ("True" if raw else "False") if isinstance(raw, bool) else str(raw)
    return check_label(path, line, value, spec.labels)
