"""Document readers: formats, compression, non-UTF-8 counting and one-line errors for bad input."""

from __future__ import annotations

import gzip
import json
import lzma
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lmforge.data.corpus.readers import decode_counting, read_documents
from lmforge.errors import LMForgeError


def _jsonl(docs: list[str]) -> bytes:
    return "".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs)).encode()


def test_txt_one_document_per_file(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("First document.\nSecond line.\n")
    (tmp_path / "b.md").write_text("Another one.")
    assert list(read_documents([tmp_path / "a.txt", tmp_path / "b.md"])) == [
        "First document.\nSecond line.\n",
        "Another one.",
    ]


def test_jsonl_field_and_blank_lines(tmp_path: Path) -> None:
    p = tmp_path / "d.jsonl"
    p.write_bytes(b'{"body": "one"}\n\n{"body": "two", "x": 1}\n')
    assert list(read_documents([p], text_field="body")) == ["one", "two"]


def test_csv_and_tsv_column_with_multiline_cells(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text('id,text\n1,"hello, world"\n2,"line one\nline two"\n')
    (tmp_path / "d.tsv").write_text("text\tid\ntab separated\t3\n")
    assert list(read_documents([tmp_path / "d.csv", tmp_path / "d.tsv"])) == [
        "hello, world",
        "line one\nline two",
        "tab separated",
    ]


def test_parquet_column(tmp_path: Path) -> None:
    p = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": ["alpha", None, "beta", ""], "n": [1, 2, 3, 4]}), p)
    assert list(read_documents([p])) == ["alpha", "beta"]


def test_gz_and_xz_compressed(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(_jsonl(["g1", "g2"])))
    (tmp_path / "b.txt.xz").write_bytes(lzma.compress(b"xz text"))
    (tmp_path / "c.csv.gz").write_bytes(gzip.compress(b"text\ncsv gz\n"))
    docs = list(read_documents([tmp_path]))  # a directory: its readable files in sorted order
    assert docs == ["g1", "g2", "xz text", "csv gz"]


def test_directory_skips_hidden_and_unknown_files(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x.txt").write_text("nested")
    (tmp_path / ".hidden.txt").write_text("hidden")
    (tmp_path / "image.png").write_bytes(b"\x89PNG\x00\x00")
    (tmp_path / "LICENSE").write_text("no suffix")
    assert list(read_documents([tmp_path])) == ["nested"]


def test_a_fetched_corpus_by_name(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LMFORGE_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "cache" / "data" / "all-english"
    corpus.mkdir(parents=True)
    (corpus / "docs.jsonl.xz").write_bytes(lzma.compress(_jsonl(["one", "two"])))
    assert list(read_documents(["fetched:all-english"])) == ["one", "two"]
    with pytest.raises(LMForgeError) as e:
        list(read_documents(["fetched:brown"]))
    where = tmp_path / "cache" / "data" / "brown"
    assert str(e.value) == f"fetched:brown: not fetched yet (run: lmforge data fetch brown; looked in {where})"


def test_one_file_of_a_fetched_set(tmp_path: Path, monkeypatch) -> None:
    """`fetched:NAME/FILE` reads one split of a labelled set (its training texts, for task-adaptive pretraining)."""
    monkeypatch.setenv("LMFORGE_CACHE", str(tmp_path / "cache"))
    labelled = tmp_path / "cache" / "data" / "hedge"
    labelled.mkdir(parents=True)
    (labelled / "train.jsonl").write_bytes(_jsonl(["seen in training"]))
    (labelled / "test.jsonl").write_bytes(_jsonl(["held out"]))
    assert list(read_documents(["fetched:hedge/train.jsonl"])) == ["seen in training"]
    with pytest.raises(LMForgeError) as e:
        list(read_documents(["fetched:hedge/dev.jsonl"]))
    assert str(e.value) == f"fetched:hedge/dev.jsonl: no such file in the fetched hedge ({labelled / 'dev.jsonl'})"
    with pytest.raises(
        LMForgeError, match=r"^fetched:spam/train.jsonl: not fetched yet \(run: lmforge data fetch spam;"
    ):
        list(read_documents(["fetched:spam/train.jsonl"]))


def test_non_utf8_bytes_are_replaced_and_counted(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"caf\xe9 and na\xefve \xff\xfe ok")
    (tmp_path / "b.jsonl").write_bytes(b'{"text": "bad \x80 byte"}\n')
    stream = read_documents([tmp_path / "a.txt", tmp_path / "b.jsonl"])
    docs = list(stream)
    assert docs == ["caf\ufffd and na\ufffdve \ufffd\ufffd ok", "bad \ufffd byte"]
    assert stream.replaced_bytes == 5
    assert stream.n_docs == 2


def test_decode_counting_keeps_valid_multibyte_and_real_replacement_chars() -> None:
    text = "é ”\ufffd"  # a genuine U+FFFD in valid UTF-8 is not counted
    assert decode_counting(text.encode()) == (text, 0)
    assert decode_counting("é".encode() + b"\xc3") == ("é\ufffd", 1)  # truncated sequence


def _error(paths: list[Path], **kw) -> str:
    with pytest.raises(LMForgeError) as e:
        list(read_documents(paths, **kw))
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_errors_for_bad_inputs(tmp_path: Path) -> None:
    missing = tmp_path / "nope.txt"
    assert _error([missing]) == f"{missing}: no such file or directory"

    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    (empty_dir / "notes.pdf").write_bytes(b"%PDF")
    assert _error([empty_dir]).startswith(f"{empty_dir}: directory has no readable files (")

    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    assert _error([empty]) == f"{empty}: empty file (no documents)"

    nul = tmp_path / "nul.txt"
    nul.write_bytes(b"text\x00more")
    assert _error([nul]) == f"{nul}: binary file (contains NUL bytes; text must be UTF-8)"

    noise = tmp_path / "noise.txt"
    noise.write_bytes(bytes([0x01, 0x02, 0xFF, 0x80, 0x41]) * 100)
    assert _error([noise]) == f"{noise}: binary file (80% of its first bytes are not text)"

    pdf = tmp_path / "doc.pdf"
    pdf.write_bytes(b"%PDF")
    assert _error([pdf]).startswith(f"{pdf}: unsupported file type (")


def test_jsonl_errors_name_file_and_line(tmp_path: Path) -> None:
    p = tmp_path / "d.jsonl"
    p.write_text('{"text": "ok"}\n{"text": "unterminated\n')
    assert _error([p]) == f"{p}:2: malformed JSON (Unterminated string starting at, column 10)"
    p.write_text('{"text": "ok"}\n\n{"body": "x"}\n')
    assert _error([p]) == f"{p}:3: no field 'text' (fields: body)"
    p.write_text('["a list"]\n')
    assert _error([p]) == f"{p}:1: expected a JSON object, got list"
    p.write_text('{"text": 3}\n')
    assert _error([p]) == f"{p}:1: field 'text' is int, expected a string"


def test_table_errors(tmp_path: Path) -> None:
    c = tmp_path / "d.csv"
    c.write_text("id,body\n1,x\n")
    assert _error([c]) == f"{c}: no column 'text' (columns: id, body)"
    q = tmp_path / "d.parquet"
    pq.write_table(pa.table({"n": [1]}), q)
    assert _error([q]) == f"{q}: no column 'text' (columns: n)"
    pq.write_table(pa.table({"text": [1]}), q)
    assert _error([q]) == f"{q}: column 'text' has type int64, expected string"
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet at all")
    assert _error([bad]).startswith(f"{bad}: not a valid Parquet file (")
    gz = tmp_path / "bad.txt.gz"
    gz.write_bytes(b"not gzip")
    assert _error([gz]).startswith(f"{gz}: cannot read (")


def test_errors_beyond_the_sniffed_head(tmp_path: Path) -> None:
    p = tmp_path / "long.jsonl.gz"
    lines = [json.dumps({"text": f"document number {i:05d} " + "x" * 40}) for i in range(3000)]
    lines[2499] = '{"text": oops}'
    p.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    assert _error([p]) == f"{p}:2500: malformed JSON (Expecting value, column 10)"
    nul = tmp_path / "late_nul.txt"
    nul.write_bytes(b"plain text. " * 10_000 + b"\x00")
    assert _error([nul]) == f"{nul}: binary file (contains NUL bytes; text must be UTF-8)"


def test_a_large_text_file_is_a_corpus_of_paragraph_documents(tmp_path):
    from lmforge.data.corpus.readers import DOC_CHARS, split_text

    para = "It was a dark and stormy night; the rain fell in torrents. " * 40  # ~2.4k characters
    text = "\n\n".join(f"{i}. {para}" for i in range(60))  # ~150k characters, 60 paragraphs
    (tmp_path / "novel.txt").write_text(text, encoding="utf-8")
    docs = list(read_documents([tmp_path / "novel.txt"]))
    assert len(docs) > 4 and all(len(d) <= DOC_CHARS for d in docs)
    assert "\n\n".join(docs) == text  # whole paragraphs, in order, nothing lost
    assert all(d.split(". ", 1)[0].isdigit() for d in docs)  # each document starts at a paragraph
    # A paragraph longer than the limit is cut at line ends, a line longer than the limit at the limit.
    assert [len(d) for d in split_text("a" * 25, limit=10)] == [10, 10, 5]
    assert split_text("ab\ncd\nef", limit=5) == ["ab\ncd", "ef"]
    assert split_text("short text", limit=100) == ["short text"]
