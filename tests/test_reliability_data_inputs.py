"""The pretraining data path under hostile input (`lmforge data prepare`; `lmforge pretrain --data.inputs` reads the
same way): documents too long to tokenize in one call, a full disk, corrupt compressed and Parquet files, ragged CSV
rows, and the scratch dir of a killed prepare. Each case asserts the one error line and the exit code, or what the
reader yields, and what is left on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmforge.cli import main
from lmforge.data import load_default_corpus
from lmforge.data.readers import read_documents
from lmforge.errors import LMForgeError
from lmforge.tasks.readers import read_table
from lmforge.tokenizers import train_tokenizer

TEXTS = [f"Document {i}: the {w} bells rang out over the town." for i, w in enumerate(["grey", "cold", "warm"] * 4)]


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tok")
    train_tokenizer(load_default_corpus()[:2], "bpe", 300).save(d)
    return d


def jsonl(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return path


def run_cli(capsys, *args: str) -> tuple[int, list[str]]:
    """(exit code, stderr lines) of `lmforge --quiet ARGS`; never a traceback."""
    rc = main(["--quiet", *args])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err.strip().splitlines()


def scratch(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


# --- 8: one CSV reader, refusing ragged rows ---------------------------------------------------------------------


@pytest.mark.parametrize("row, found", [("short", 1), ("too,long,row", 3)])
def test_a_ragged_csv_row_is_refused_with_file_and_line_by_both_readers(row, found, tmp_path, tok, capsys):
    path = tmp_path / "docs.csv"
    path.write_text(f'text,label\n"first, fine",pos\n"second",neg\n{row}\nlast,pos\n', encoding="utf-8")
    expected = f"{path}:4: expected 2 CSV columns (as the header), found {found}"
    rc, err = run_cli(capsys, "data", "prepare", str(path), "--out", str(tmp_path / "out"), "--tokenizer", str(tok))
    assert (rc, err) == (2, [f"error: {expected}"])
    with pytest.raises(LMForgeError) as refused:  # the fine-tuning reader: the same reader, the same line
        read_table(path, "text", "label")
    assert str(refused.value) == expected


def test_a_csv_record_is_numbered_by_the_line_it_starts_on_in_both_readers(tmp_path):
    path = tmp_path / "docs.csv"
    path.write_text('text,label\n"two\nlines",pos\n"unterminated,neg\nrest\n', encoding="utf-8")
    with pytest.raises(LMForgeError, match=rf"^{path}:4: malformed CSV \(unexpected end of data\)$"):
        list(read_documents([path]))
    with pytest.raises(LMForgeError, match=rf"^{path}:4: malformed CSV \(unexpected end of data\)$"):
        read_table(path, "text", "label")
