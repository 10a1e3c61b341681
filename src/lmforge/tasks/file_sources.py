"""Two `data.source`s read from the user's own files, registered in `tasks.data.SOURCES`:

- story-cloze: the Story Cloze Test's official CSV files (data/labelled/story_cloze.py), from `data.dir` (`data.name`
  2016 or 2018 picks the year where the directory holds both) or `data.dev` / `data.test`; no training split;
- parallel: tab-separated sentence pairs (data/labelled/parallel_text.py) from `data.train` / `data.dev` /
  `data.test`, or `train.tsv`, `dev.tsv`, `test.tsv` in `data.dir`. `data.text_field` and `data.target_field` are the
  0-based columns of the source sentence and of its translation (defaults 0 and 1; an English-first file read French
  → English: `--data.text_field=1 --data.target_field=0`)."""

from __future__ import annotations

from pathlib import Path

from lmforge.data.labelled.examples import Dataset
from lmforge.errors import LMForgeError
from lmforge.tasks.config import FtDataConfig
from lmforge.tasks.data import SOURCES

SPLITS = ("train", "dev", "test")


def story_cloze_splits(cfg: FtDataConfig) -> dict[str, Dataset]:
    """dev and/or test of the Story Cloze Test (explicit files win over `data.dir`'s)."""
    from lmforge.data.labelled.story_cloze import read_story_cloze, story_cloze_files

    if cfg.train is not None:
        raise LMForgeError("data.source=story-cloze has no training split (the test ships dev and test files only)")
    files: dict[str, Path] = {}
    if cfg.dir is not None:
        year = cfg.name if cfg.name in ("2016", "2018") else None
        files = story_cloze_files(cfg.dir, year)
    elif cfg.dev is None and cfg.test is None:
        raise LMForgeError("data.source=story-cloze needs --data.dir (the directory of the Story Cloze CSV files) "
                           "or --data.dev / --data.test")  # fmt: skip
    for split in ("dev", "test"):
        given = getattr(cfg, split)
        if given is not None:
            files[split] = Path(given)
    return {split: read_story_cloze(path) for split, path in files.items()}


def _column(value: str | None, default: int, key: str) -> int:
    if value is None or value == "text":  # the schema defaults: the first two columns
        return default
    if not str(value).isdigit():
        raise LMForgeError(f"data.source=parallel: {key} is a 0-based column number of the tab-separated file, "
                           f"got {value!r}")  # fmt: skip
    return int(value)


def parallel_splits(cfg: FtDataConfig) -> dict[str, Dataset]:
    """The sentence pairs of each split given (at least one)."""
    from lmforge.data.labelled.parallel_text import read_parallel

    src = _column(cfg.text_field, 0, "data.text_field")
    tgt = _column(cfg.target_field, 1, "data.target_field")
    files = {}
    if cfg.dir is not None:
        root = Path(cfg.dir)
        if not root.is_dir():
            raise LMForgeError(f"data.dir {root}: not a directory (a single file of pairs goes in --data.test=FILE)")
        files = {s: root / f"{s}.tsv" for s in SPLITS if (root / f"{s}.tsv").is_file()}
    files |= {s: Path(getattr(cfg, s)) for s in SPLITS if getattr(cfg, s) is not None}
    if not files:
        where = f"no train.tsv, dev.tsv or test.tsv in {cfg.dir}" if cfg.dir else "no file given"
        raise LMForgeError(f"data.source=parallel: {where} (a tab-separated file of sentence pairs: --data.train=FILE, "
                           "--data.dev=FILE, --data.test=FILE, or --data.dir=DIR)")  # fmt: skip
    return {split: read_parallel(path, src, tgt) for split, path in files.items()}


SOURCES["story-cloze"] = story_cloze_splits
SOURCES["parallel"] = parallel_splits
