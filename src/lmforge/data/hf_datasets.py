"""Hugging Face `datasets` as document inputs: a `datasets.Dataset` object (Python API), a directory written by
`Dataset.save_to_disk`, or `hf:NAME[:CONFIG[:SPLIT]]`, a dataset `datasets.load_dataset` downloaded before, read
offline from the local Hugging Face cache (`HF_DATASETS_CACHE`, default ~/.cache/huggingface/datasets).

`datasets` is optional: it is imported only when one of these inputs is used. A saved dataset is Arrow data and JSON
metadata (no pickles); a DatasetDict gives its `train` split unless a split is named (`hf:NAME::validation`, or the
split's own directory of a save_to_disk dir).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lmforge.errors import LMForgeError

HF_PREFIX = "hf:"
_BATCH = 1024  # rows read at a time: bounded memory on a dataset of any size
_MISSING = "reading Hugging Face datasets needs the `datasets` package: pip install datasets"


def is_dataset(obj: Any) -> bool:
    """Whether `obj` is a `datasets` Dataset, IterableDataset or DatasetDict (without importing `datasets`)."""
    cls = type(obj)
    return cls.__module__.split(".")[0] == "datasets" and cls.__name__ in _KINDS


_KINDS = ("Dataset", "IterableDataset", "DatasetDict", "IterableDatasetDict")


def is_saved_dataset(path: Path) -> bool:
    """Whether `path` is a directory written by `save_to_disk` (a Dataset or a DatasetDict)."""
    return path.is_dir() and (
        (path / "state.json").is_file()
        and (path / "dataset_info.json").is_file()
        or (path / "dataset_dict.json").is_file()
    )


def _datasets(offline: bool = False):
    """The `datasets` module, imported now; `offline` keeps it from the network (HF_DATASETS_OFFLINE semantics)."""
    if offline:
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # read when `datasets` is first imported ...
    try:
        import datasets
    except ImportError:
        raise LMForgeError(_MISSING) from None
    if offline:
        datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = True  # ... or imported already
    return datasets


class DatasetInput:
    """One dataset input; `texts(field)` yields the strings of a column, `_BATCH` rows at a time."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self._ds: Any = spec if is_dataset(spec) else None

    def __str__(self) -> str:
        if self._ds is not None and self.spec is self._ds:
            fp = getattr(self._ds, "_fingerprint", None)
            rows = getattr(self._ds, "num_rows", None)
            return f"datasets.{type(self._ds).__name__}(rows={rows}, fingerprint={fp})"
        return str(self.spec)

    def dataset(self) -> Any:
        """The Dataset (or IterableDataset) to read: loaded on first use, a DatasetDict's split picked."""
        if self._ds is None:
            self._ds = load(self.spec)
        self._ds = _pick_split(self._ds, "train", str(self))
        return self._ds

    def texts(self, field: str) -> Iterator[str | None]:
        ds = self.dataset()
        names = list(ds.column_names or [])
        if field not in names:
            raise LMForgeError(f"{self}: no column '{field}' (columns: {', '.join(names[:8]) or 'none'})")
        for batch in ds.select_columns([field]).iter(batch_size=_BATCH):
            for value in batch[field]:
                if value is not None and not isinstance(value, str):
                    raise LMForgeError(f"{self}: column '{field}' holds {type(value).__name__}, expected strings")
                yield value


def load(spec: str | Path) -> Any:
    """The Dataset or DatasetDict a save_to_disk dir or `hf:NAME[:CONFIG[:SPLIT]]` holds (all its splits when no
    split is named; one line of error when it cannot be read)."""
    if str(spec).startswith(HF_PREFIX):
        return _load_hf(str(spec))
    return _load_saved(Path(spec))


def _pick_split(ds: Any, split: str, label: str) -> Any:
    if type(ds).__name__ not in ("DatasetDict", "IterableDatasetDict"):
        return ds
    if split not in ds:
        raise LMForgeError(
            f"{label}: no '{split}' split (splits: {', '.join(ds)}); name one, e.g. ds['{next(iter(ds))}']"
        )
    return ds[split]


def _load_saved(path: Path) -> Any:
    datasets = _datasets()
    try:
        return datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError, OSError) as e:
        raise LMForgeError(f"{path}: not a readable save_to_disk dataset ({str(e).splitlines()[0]})") from None


def _load_hf(spec: str) -> Any:
    name, config, split = (spec[len(HF_PREFIX) :].split(":") + ["", ""])[:3]
    if not name:
        raise LMForgeError(f"{spec}: name a dataset, e.g. hf:wikitext:wikitext-2-raw-v1")
    datasets = _datasets(offline=True)
    try:
        ds = datasets.load_dataset(name, config or None, split=split or None)
    except Exception as e:  # `datasets` raises many kinds (ConnectionError, FileNotFoundError, ValueError, ...)
        cache = datasets.config.HF_DATASETS_CACHE
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise LMForgeError(
            f"{spec}: not in the local Hugging Face datasets cache ({cache}); lmforge reads it offline: download it "
            f"once with datasets.load_dataset({name!r}{', ' + repr(config) if config else ''}) ({reason})"
        ) from None
    return ds
