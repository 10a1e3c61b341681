"""Labelled splits from Hugging Face `datasets` (`data.source=datasets`): a directory written by `save_to_disk` or
`hf:NAME[:CONFIG[:SPLIT]]` (read offline from the local cache), loaded by `lmforge.data.hf_datasets`.

A DatasetDict gives its `train`, `validation` (or `dev`, `valid`) and `test` splits; a single Dataset is the train
split (the run holds out 10% of it as dev). Columns are mapped by the table options (`data.text_field`,
`data.text_pair_field`, `data.label_field`, `data.target_field`). A `ClassLabel` label column gives the label names
and their order, and -1 (an unlabelled test split, as GLUE's) no label; a float column gives regression targets; any
other label is its text. A text column of word lists with a list label column (`ClassLabel` tags, as CoNLL-2003's
`ner_tags`) reads as token tagging.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmforge.data.hf_datasets import HF_PREFIX, load
from lmforge.data.labelled.examples import Dataset, Example
from lmforge.errors import LMForgeError

SPLIT_NAMES = {"train": ("train",), "dev": ("validation", "dev", "valid"), "test": ("test",)}
_BATCH = 1024


def read_dataset_splits(
    spec: str,
    text_field: str,
    label_field: str | None,
    text_pair_field: str | None = None,
    target_field: str | None = None,
) -> dict[str, Dataset]:
    """train (and dev, test where the data has them) of a save_to_disk dir or `hf:NAME[:CONFIG[:SPLIT]]`."""
    ds = load(spec)
    if type(ds).__name__ not in ("DatasetDict", "IterableDatasetDict"):
        return {"train": _read(ds, _where(spec, None), text_field, label_field, text_pair_field, target_field)}
    out = {}
    for split, names in SPLIT_NAMES.items():
        name = next((n for n in names if n in ds), None)
        if name is not None:
            out[split] = _read(ds[name], _where(spec, name), text_field, label_field, text_pair_field, target_field)
    if "train" not in out:
        raise LMForgeError(f"{spec}: no 'train' split (splits: {', '.join(ds)})")
    return out


def _where(spec: str, split: str | None) -> str:
    """How errors and reports name a split: its own dir in a save_to_disk dir, `hf:NAME:CONFIG:SPLIT` in the cache."""
    if split is None:
        return spec
    if spec.startswith(HF_PREFIX):
        name, config = (spec[len(HF_PREFIX) :].split(":") + [""])[:2]
        return f"{HF_PREFIX}{name}:{config}:{split}"
    return str(Path(spec) / split)


def _read(
    ds: Any, where: str, text_field: str, label_field: str | None, pair_field: str | None, target_field: str | None
) -> Dataset:
    fields = [f for f in (text_field, pair_field, target_field, label_field) if f is not None]
    names = list(ds.column_names or [])
    for f in fields:
        if f not in names:
            raise LMForgeError(f"{where}: no column '{f}' (columns: {', '.join(names[:8]) or 'none'})")
    feature = (ds.features or {}).get(label_field) if label_field is not None else None
    tag_feature = getattr(feature, "feature", None)  # a Sequence / List of ClassLabel: the tags of tokens
    class_names = getattr(tag_feature if tag_feature is not None else feature, "names", None)
    examples = []
    for batch in ds.select_columns(fields).iter(batch_size=_BATCH):
        for row in zip(*(batch[f] for f in fields)):
            values = dict(zip(fields, row))
            examples.append(_example(values, len(examples), where, text_field, label_field, pair_field, target_field,
                                     class_names))  # fmt: skip
    first = examples[0] if examples else Example()
    if target_field is not None:
        return Dataset(examples, None, where, "text_to_text")
    if first.tokens is not None:
        return Dataset(examples, class_names or sorted({t for e in examples for t in e.tags or []}), where, "tagging")
    if isinstance(first.label, float):
        return Dataset(examples, None, where, "regression")
    return Dataset(examples, class_names, where, "classification")  # no ClassLabel: the run finds the label set


def _example(
    values: dict, i: int, where: str, text_field: str, label_field: str | None, pair_field: str | None,
    target_field: str | None, class_names: list[str] | None,
) -> Example:  # fmt: skip
    for f, v in values.items():
        if v is None and f != label_field:
            raise LMForgeError(f"{where}: row {i}: column '{f}' is null")
    text = values[text_field]
    ex = Example()
    if isinstance(text, list):
        ex.tokens = [str(t) for t in text]
    else:
        ex.text = str(text)
    if pair_field is not None:
        ex.text_pair = str(values[pair_field])
    if target_field is not None:
        ex.target = str(values[target_field])
    elif label_field is not None:
        raw = values[label_field]
        if ex.tokens is not None:
            ex.tags = [_class_name(t, class_names, where, i) for t in raw or []]
            if len(ex.tags) != len(ex.tokens):
                raise LMForgeError(f"{where}: row {i}: {len(ex.tokens)} tokens but {len(ex.tags)} tags")
        else:
            ex.label = _label(raw, class_names, where, i)
    return ex


def _label(raw: Any, class_names: list[str] | None, where: str, i: int) -> str | float | None:
    if raw is None or (class_names is not None and raw == -1):
        return None  # unlabelled (ClassLabel's -1: a test split without gold labels)
    if class_names is not None:
        return _class_name(raw, class_names, where, i)
    if isinstance(raw, float):
        return raw
    return str(raw) if not isinstance(raw, bool) else ("True" if raw else "False")


def _class_name(raw: Any, class_names: list[str] | None, where: str, i: int) -> str:
    if class_names is None:
        return str(raw)
    if not isinstance(raw, int) or not 0 <= raw < len(class_names):
        raise LMForgeError(f"{where}: row {i}: label {raw!r} is not a class index below {len(class_names)}")
    return class_names[raw]
