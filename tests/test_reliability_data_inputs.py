"""The pretraining data path under hostile input (`lmforge data prepare`; `lmforge pretrain --data.inputs` reads the
same way): documents too long to tokenize in one call, a full disk, corrupt compressed and Parquet files, ragged CSV
rows, and the scratch dir of a killed prepare. Each case asserts the one error line and the exit code, or what the
reader yields, and what is left on disk."""

from __future__ import annotations

import errno
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lmforge.cli import main
from lmforge.data.corpus import readers
from lmforge.data.corpus.bundled import load_default_corpus
from lmforge.data.corpus.prepare import _SplitWriter
from lmforge.data.corpus.readers import read_documents
from lmforge.data.labelled.readers import read_table
from lmforge.errors import LMForgeError
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


# --- 4: a long document of any format is read in bounded pieces --------------------------------------------------


def long_text(n_paras: int) -> str:
    return "\n\n".join(f"Paragraph {i}. " + "The river ran under the old stone bridge. " * 12 for i in range(n_paras))


def write_as(path: Path, text: str) -> Path:
    """One document holding `text`, in the format the suffix names."""
    if path.suffix == ".parquet":
        pq.write_table(pa.table({"text": [text]}), path)
    elif path.suffix == ".csv":
        path.write_text('text,id\n"' + text.replace('"', '""') + '",1\n', encoding="utf-8")
    elif path.name.endswith(".jsonl.gz"):
        path.write_bytes(gzip.compress((json.dumps({"text": text}) + "\n").encode()))
    else:
        jsonl(path, [text])
    return path


@pytest.mark.parametrize("name", ["one.jsonl", "one.jsonl.gz", "one.csv", "one.parquet"])
def test_a_long_document_of_any_format_is_read_in_bounded_pieces(name, tmp_path, monkeypatch):
    monkeypatch.setattr(readers, "DOC_CHARS", 4096)
    text = long_text(150)  # ~80k characters, one document
    pieces = list(read_documents([write_as(tmp_path / name, text)]))
    assert len(pieces) > 15 and max(map(len, pieces)) <= 4096
    assert "\n\n".join(pieces) == text  # cut at paragraph ends, nothing lost


def test_a_single_line_jsonl_of_a_long_document_is_prepared(tmp_path, tok, monkeypatch, capsys):
    monkeypatch.setattr(readers, "DOC_CHARS", 4096)
    src = jsonl(tmp_path / "book.jsonl", [long_text(150)])
    rc, err = run_cli(capsys, "data", "prepare", str(src), "--out", str(tmp_path / "out"), "--tokenizer", str(tok))
    assert rc == 0, err
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["train"]["n_docs"] > 15 and meta["val"]["n_docs"] >= 1


def test_split_text_is_linear_in_the_number_of_lines():
    """A 3 MB paragraph of 2-letter lines (10k lines a piece): summing each piece's lines again for every line took
    minutes; counting as it goes takes a fraction of a second."""
    text = "ab\n" * 1_000_000
    start = time.perf_counter()
    pieces = readers.split_text(text)
    assert time.perf_counter() - start < 10  # a wide margin for a slow machine, far below the quadratic time
    assert len(pieces) == 92 and max(map(len, pieces)) <= readers.DOC_CHARS
    assert "\n".join(pieces) == text.rstrip("\n")


# --- 6: a full disk ----------------------------------------------------------------------------------------------


def test_disk_full_during_prepare_is_one_line_and_leaves_no_output(tmp_path, tok, capsys, monkeypatch):
    src = jsonl(tmp_path / "docs.jsonl", TEXTS)
    out = tmp_path / "out"
    assert run_cli(capsys, "data", "prepare", str(src), "--out", str(out), "--tokenizer", str(tok))[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def full(self, *args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(_SplitWriter, "write", full)
    for target in (out, tmp_path / "fresh"):
        rc, err = run_cli(capsys, "data", "prepare", str(src), "--out", str(target), "--tokenizer", str(tok))
        assert rc == 2
        assert err == [f"error: could not write {target}: No space left on device (the disk is full: free space there "
                       "or write elsewhere)"]  # fmt: skip
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the earlier prepared data is intact
    assert not (tmp_path / "fresh").exists() and scratch(tmp_path) == []


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


# --- 13: the scratch dir of a killed prepare ---------------------------------------------------------------------

_PAUSED_PREPARE = """
import sys, time
from lmforge.data.corpus.prepare import _SplitWriter
write = _SplitWriter.write
def paused(self, *args):
    write(self, *args)
    self.file.flush()
    print("writing", flush=True)
    time.sleep(600)
_SplitWriter.write = paused
from lmforge.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_scratch_of_a_killed_prepare_is_removed_by_the_next_but_a_live_one_is_kept(tmp_path, tok, capsys):
    src = jsonl(tmp_path / "docs.jsonl", TEXTS)
    parent = tmp_path / "data"
    args = ["data", "prepare", str(src), "--tokenizer", str(tok), "--out"]
    proc = subprocess.Popen([sys.executable, "-c", _PAUSED_PREPARE, *args, str(parent / "a")], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    try:
        assert proc.stdout.readline() == "writing\n"  # inside its first write: its scratch dir holds a .bin
        left = scratch(parent)  # its lock file and its scratch dir
        assert len(left) == 2 and left[0] == ".a.lock" and left[1].startswith(".a.tmp-")
        assert run_cli(capsys, *args, str(parent / "b"))[0] == 0
        assert scratch(parent) == left  # a live prepare's scratch is never touched
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert scratch(parent) == left  # a kill -9 leaves it...
    assert run_cli(capsys, *args, str(parent / "b"))[0] == 0
    assert scratch(parent) == []  # ...and the next prepare into the same parent removes it
    assert sorted(p.name for p in parent.iterdir()) == ["b"]
