"""The pretraining data path under hostile input (`lmforge data prepare`; `lmforge pretrain --data.inputs` reads the
same way): documents too long to tokenize in one call, a full disk, corrupt compressed and Parquet files, ragged CSV
rows, and the scratch dir of a killed prepare. Each case asserts the one error line and the exit code, or what the
reader yields, and what is left on disk."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
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


# --- 7: corrupt compressed and Parquet input ---------------------------------------------------------------------


def test_corrupt_deflate_data_in_jsonl_gz_names_the_file(tmp_path, tok, capsys):
    raw = bytearray(gzip.compress("".join(json.dumps({"text": t}) + "\n" for t in TEXTS).encode(), mtime=0))
    raw[10] |= 0b110  # the first deflate block's type bits: 11 is no block type (RFC 1951 §3.2.3)
    bad = tmp_path / "docs.jsonl.gz"
    bad.write_bytes(bytes(raw))
    rc, err = run_cli(capsys, "data", "prepare", str(bad), "--out", str(tmp_path / "out"), "--tokenizer", str(tok))
    assert rc == 2
    assert err == [f"error: {bad}: cannot read (Error -3 while decompressing data: invalid block type)"]
    assert scratch(tmp_path) == [] and not (tmp_path / "out").exists()


def test_corrupt_parquet_pages_name_the_file(tmp_path, tok, capsys):
    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"text": [t * 20 for t in TEXTS]}), path, compression="snappy")
    page = pq.ParquetFile(path).metadata.row_group(0).column(0).data_page_offset
    raw = bytearray(path.read_bytes())
    raw[page : page + 32] = bytes(b ^ 0xFF for b in raw[page : page + 32])  # the data page's header
    path.write_bytes(bytes(raw))
    rc, err = run_cli(capsys, "data", "prepare", str(path), "--out", str(tmp_path / "out"), "--tokenizer", str(tok))
    assert rc == 2
    assert len(err) == 1 and err[0].startswith(f"error: {path}: corrupt Parquet data (")


def test_invalid_utf8_in_a_parquet_string_column_is_replaced_and_counted(tmp_path):
    path = tmp_path / "docs.parquet"
    values = pa.array([b"caf\xe9 au lait", b"plain text"], pa.binary()).view(pa.string())  # unchecked bytes
    pq.write_table(pa.table({"text": values}), path)
    stream = read_documents([path])
    assert list(stream) == ["caf\ufffd au lait", "plain text"] and stream.replaced_bytes == 1


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
