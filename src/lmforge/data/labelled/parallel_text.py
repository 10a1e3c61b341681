"""Reader of parallel text: a tab-separated file of sentence pairs, one pair a line, without a header, as Tatoeba's
sentence-pair exports are laid out (`Go.<TAB>Va !<TAB>CC-BY 2.0 (France) Attribution: tatoeba.org ...`, English
first). Columns past the pair (an attribution) are ignored; blank lines are skipped; .gz/.xz/.bz2 are read too.

Which column is the source and which its translation is the caller's choice (0-based column numbers): the
GPT-2-style English → French prompts read column 0 → 1 of an English-first file, BART's French → English
translation column 1 → 0 of the same file.

Each pair becomes one `Example` with `text` the source sentence and `target` its translation, `meta` the file and
line. A line with too few columns or an empty sentence is one error line naming the file and line."""

from __future__ import annotations

from pathlib import Path

from lmforge.data.labelled.examples import Dataset, Example
from lmforge.data.labelled.readers import fail, read_lines
from lmforge.errors import LMForgeError


def read_parallel(path: Path | str, source_col: int = 0, target_col: int = 1) -> Dataset:
    """The sentence pairs of a tab-separated file (at least one): `text` from column `source_col`, `target` from
    column `target_col`."""
    path = Path(path)
    if source_col == target_col or min(source_col, target_col) < 0:
        raise LMForgeError(f"parallel text: the source and target columns must be two different columns >= 0, got "
                           f"{source_col} and {target_col}")  # fmt: skip
    need = max(source_col, target_col) + 1
    out = []
    for n, line in read_lines(path):
        if not line.strip():
            continue
        cells = line.split("\t")
        if len(cells) < need:
            raise fail(path, n, f"expected at least {need} tab-separated columns (a sentence and its translation), "
                                f"found {len(cells)}")  # fmt: skip
        src, tgt = cells[source_col].strip(), cells[target_col].strip()
        for col, text in ((source_col, src), (target_col, tgt)):
            if not text:
                raise fail(path, n, f"column {col} is empty")
        out.append(Example(text=src, target=tgt, id=str(len(out)), meta={"file": str(path), "line": n}))
    if not out:
        raise LMForgeError(f"{path}: no sentence pairs (an empty file)")
    return Dataset(out, source=str(path), task_type="text_to_text")
