"""The labelled splits of a fine-tuning run (`data.*` keys), read with the readers of `lmforge.data.labelled.readers`.

Sources (`data.source`):
- bundled: a labelled set shipped with lmforge (`data.name`, e.g. sentiment);
- glue / superglue: a task dir as distributed (`data.dir`), task `data.name`;
- squad: SQuAD v1.1/2.0 JSON files; conll2003: CoNLL-2003 files; table: jsonl/csv/tsv with a field mapping
  (`data.text_field`, `data.text_pair_field`, `data.label_field`, or `data.target_field` for source → target
  pairs) — files from `data.train/dev/test`;
- fetched: a set built by `lmforge data fetch NAME` (`data.name`); dir: a labelled-set dir in the same layout
  (`meta.json` + `train/dev/test.jsonl`, objects with `Example`'s fields);
- datasets: Hugging Face datasets (`data.dir`): a `save_to_disk` dir or `hf:NAME[:CONFIG[:SPLIT]]` read offline
  from the local cache, columns mapped by the table options (see tasks/hf_splits.py);
- race: the RACE directory (`data.dir`; `data.name` all, middle or high); wsc: the Winograd Schema Challenge's
  `WSCollection.xml` (`data.dir` holding it, or `data.test`; `data.name` wsc273 or wsc285), a test split only;
  dpr: Rahman & Ng's `train.c.txt` / `test.c.txt` (`data.dir`, or `data.train` / `data.test`); blimp: grammatical
  minimal pairs in BLiMP's layout, one `<paradigm>.jsonl` per paradigm in `data.dir` (data/labelled/blimp.py), a test
  split.
A run without a dev split holds out the last 10% of train (deterministic) as dev.

Labels of table, dir and datasets data: `data.labels` declares the label set (a label outside it is an error
naming the file, line and value). Without it, a table label seen fewer than `data.min_label_count` times or in only
one labelled split gets a warning, since a typo would otherwise become a class of its own (a dir's meta.json and a
dataset's `ClassLabel` column state their label set already)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from lmforge.data.labelled.examples import Dataset, Example
from lmforge.errors import LMForgeError
from lmforge.tasks.config import FtDataConfig

SPLITS = ("train", "dev", "test")


def _bundled(cfg: FtDataConfig) -> dict[str, Dataset]:
    from lmforge.data.labelled.readers import load_bundled

    return dict(load_bundled(cfg.name))


def _glue(cfg: FtDataConfig) -> dict[str, Dataset]:
    from lmforge.data.labelled.glue import read_glue

    return _per_split(cfg, lambda split: read_glue(cfg.name, _need_dir(cfg), split))


def _superglue(cfg: FtDataConfig) -> dict[str, Dataset]:
    from lmforge.data.labelled.glue import read_superglue

    return _per_split(cfg, lambda split: read_superglue(cfg.name, _need_dir(cfg), split))


def _files(cfg: FtDataConfig, reader: Callable[[Path], Dataset]) -> dict[str, Dataset]:
    out = {}
    for split in SPLITS:
        path = getattr(cfg, split)
        if path is not None:
            out[split] = reader(Path(path))
    return out


def _squad(cfg: FtDataConfig) -> dict[str, Dataset]:
    from lmforge.data.labelled.readers import read_squad

    return _files(cfg, read_squad)


def _conll(cfg: FtDataConfig) -> dict[str, Dataset]:
    from lmforge.data.labelled.readers import read_conll2003

    return _files(cfg, read_conll2003)


def _table(cfg: FtDataConfig) -> dict[str, Dataset]:
    from lmforge.data.labelled.readers import read_table

    label_field = None if cfg.target_field is not None else cfg.label_field  # a pair has a target, not a label
    return _files(
        cfg,
        lambda p: read_table(p, cfg.text_field, label_field, cfg.text_pair_field, target_field=cfg.target_field),
    )


def _dir(cfg: FtDataConfig) -> dict[str, Dataset]:
    from lmforge.data.hf_datasets import is_saved_dataset
    from lmforge.data.labelled.readers import load_labelled_dir

    if is_saved_dataset(_need_dir(cfg)):
        raise LMForgeError(f"{cfg.dir}: a save_to_disk dataset, not a labelled-set dir: use --data.source=datasets")
    return load_labelled_dir(_need_dir(cfg))


def _datasets(cfg: FtDataConfig) -> dict[str, Dataset]:
    from lmforge.tasks.hf_splits import read_dataset_splits

    if cfg.dir is None:
        raise LMForgeError("data.source=datasets needs --data.dir (a save_to_disk dir or hf:NAME[:CONFIG[:SPLIT]])")
    label_field = None if cfg.target_field is not None else cfg.label_field  # a pair has a target, not a label
    return read_dataset_splits(cfg.dir, cfg.text_field, label_field, cfg.text_pair_field, cfg.target_field)


def _fetched(cfg: FtDataConfig) -> dict[str, Dataset]:
    from lmforge.data.labelled.readers import load_fetched

    return load_fetched(cfg.name)


def _race(cfg: FtDataConfig) -> dict[str, Dataset]:
    from lmforge.tasks.race import read_race

    if cfg.name not in ("all", "middle", "high"):
        raise LMForgeError(f"data.source=race: data.name must be all, middle or high, got '{cfg.name}'")
    return _per_split(cfg, lambda split: read_race(_need_dir(cfg), split, cfg.name))  # type: ignore[arg-type]


def _wsc(cfg: FtDataConfig) -> dict[str, Dataset]:
    from lmforge.data.labelled.winograd import read_wsc_xml

    path = Path(cfg.test) if cfg.test is not None else _need_dir(cfg) / "WSCollection.xml"
    if cfg.name not in ("wsc273", "wsc285"):
        raise LMForgeError(f"data.source=wsc: data.name must be wsc273 or wsc285, got '{cfg.name}'")
    return {"test": read_wsc_xml(path, cfg.name)}  # type: ignore[arg-type]


def _dpr(cfg: FtDataConfig) -> dict[str, Dataset]:
    from lmforge.data.labelled.winograd import read_dpr

    out = {}
    for split in ("train", "test"):
        given = getattr(cfg, split)
        path = Path(given) if given is not None else (_need_dir(cfg) / f"{split}.c.txt")
        if given is not None or path.is_file():
            out[split] = read_dpr(path)
    if not out:
        raise LMForgeError(f"data.source=dpr: no train.c.txt or test.c.txt in {cfg.dir}")
    return out


def _blimp(cfg: FtDataConfig) -> dict[str, Dataset]:
    from lmforge.data.labelled.blimp import read_minimal_pairs

    if cfg.dir is None:
        raise LMForgeError("data.source=blimp needs --data.dir (the directory of BLiMP's <paradigm>.jsonl files)")
    return {"test": read_minimal_pairs(cfg.dir)}


LABELLED_BY_USER = ("table", "dir", "datasets")  # sources whose label set data.labels may declare
NAMED_SOURCES = ("bundled", "glue", "superglue", "fetched", "race", "wsc")  # data.name picks the set


def data_label(cfg: FtDataConfig) -> str:
    """What reports call the data: the named set (data.name), else the file or dir it was read from
    (a recipe's data.name no longer applies once a table of one's own replaces its set)."""
    if cfg.source in NAMED_SOURCES:
        return cfg.name
    given = cfg.train or cfg.dir or cfg.dev or cfg.test
    if given and cfg.source == "datasets":  # hf:NAME by its name; a dataset the API saved in RUN/inputs/N as inputs/N
        name = Path(given).name
        return given[3:].split(":")[0] if given.startswith("hf:") else f"inputs/{name}" if name.isdigit() else name
    return Path(given).stem if given else cfg.source


SOURCES: dict[str, Callable[[FtDataConfig], dict[str, Dataset]]] = {
    "bundled": _bundled,
    "glue": _glue,
    "superglue": _superglue,
    "squad": _squad,
    "conll2003": _conll,
    "table": _table,
    "dir": _dir,
    "fetched": _fetched,
    "race": _race,
    "wsc": _wsc,
    "dpr": _dpr,
    "blimp": _blimp,
    "datasets": _datasets,
}


def _need_dir(cfg: FtDataConfig) -> Path:
    if cfg.dir is None:
        raise LMForgeError(f"data.source={cfg.source} needs --data.dir (the data directory)")
    return Path(cfg.dir)


def _per_split(cfg: FtDataConfig, read: Callable[[str], Dataset]) -> dict[str, Dataset]:
    out = {"train": read("train")}
    for split in ("dev", "test"):
        try:
            out[split] = read(split)
        except LMForgeError:
            if split == "dev":
                raise
    return out


def load_splits(cfg: FtDataConfig, require_train: bool = True) -> dict[str, Dataset]:
    """train, dev (and test when present) of the configured source, capped by data.max_train / max_eval.
    `require_train=False` (zero-shot evaluation) accepts sources without a training split (WSC273)."""
    if cfg.source not in SOURCES:
        raise LMForgeError(f"data.source: unknown source '{cfg.source}' (known: {', '.join(SOURCES)})")
    if cfg.labels is not None and cfg.source not in LABELLED_BY_USER:
        raise LMForgeError(
            f"data.labels applies to the table, dir and datasets sources, not {cfg.source} (its label set is known)"
        )
    splits = SOURCES[cfg.source](cfg)
    has_train = "train" in splits and bool(splits["train"].examples)
    if require_train and not has_train:
        raise LMForgeError(f"data ({cfg.source} {cfg.name}): no training examples")
    if cfg.source in LABELLED_BY_USER:  # a dir's meta.json or a ClassLabel column states its label set: no warnings
        stated = cfg.source == "dir" or cfg.source == "datasets" and any(d.labels for d in splits.values())
        splits = check_labels(splits, cfg.labels, 0 if stated else cfg.min_label_count)
    if "dev" not in splits and has_train:
        train = splits["train"]
        cut = len(train.examples) - max(1, len(train.examples) // 10)
        splits["dev"] = Dataset(train.examples[cut:], train.labels, train.source + " (held-out 10%)", train.task_type)
        splits["train"] = Dataset(train.examples[:cut], train.labels, train.source, train.task_type)
    caps = {"train": cfg.max_train, "dev": cfg.max_eval, "test": cfg.max_eval}
    for split, ds in splits.items():
        if caps.get(split) is not None:
            splits[split] = Dataset(ds.examples[: caps[split]], ds.labels, ds.source, ds.task_type)
    return splits


def _where(ds: Dataset, ex: Example, i: int) -> str:
    """`file:line` of an example read from a table, else `file: example <id>`."""
    if "line" in ex.meta:
        return f"{ds.source}:{ex.meta['line']}"
    return f"{ds.source}: example {ex.id or i + 1}"


def _class_labels(ds: Dataset) -> list[tuple[int, Example]]:
    return [(i, e) for i, e in enumerate(ds.examples) if isinstance(e.label, str)]


def check_labels(splits: dict[str, Dataset], declared: list[str] | None, min_count: int) -> dict[str, Dataset]:
    """With a declared label set: every class label must be in it (else one error line naming file, line and
    value), and each split carries the declared set in its order. Without one: warn about labels seen fewer than
    `min_count` times, or in only one of several labelled splits (`min_count` 0: no warnings)."""
    if declared is not None:
        for ds in splits.values():
            for i, ex in _class_labels(ds):
                if ex.label not in declared:
                    allowed = ", ".join(declared)
                    raise LMForgeError(f"{_where(ds, ex, i)}: label {ex.label!r} is not in data.labels ({allowed})")
        return {k: Dataset(ds.examples, list(declared), ds.source, ds.task_type) for k, ds in splits.items()}
    if min_count <= 0:
        return splits
    seen: dict[str, dict[str, list[str]]] = {}  # label → split → places
    for split, ds in splits.items():
        for i, ex in _class_labels(ds):
            seen.setdefault(str(ex.label), {}).setdefault(split, []).append(_where(ds, ex, i))
    labelled = [s for s, ds in splits.items() if _class_labels(ds)]
    flagged: dict[str, str] = {}
    for label, where in sorted(seen.items()):
        n = sum(len(v) for v in where.values())
        lonely = len(labelled) > 1 and len(where) == 1
        if n < min_count or lonely:
            first = next(iter(where.values()))[0]
            flagged[label] = (
                f"{n} time{'s' * (n != 1)}{f', only in {next(iter(where))}' if lonely else ''} (first {first})"
            )
    others = ", ".join(label for label in sorted(seen) if label not in flagged)
    for label, why in flagged.items():
        print(
            f"warning: label {label!r} occurs {why}: a typo? To make any other label an error, declare the label "
            f"set: --data.labels='[{others}]'",
            file=sys.stderr,
        )
    return splits
