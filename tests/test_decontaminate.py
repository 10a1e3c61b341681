"""prepare(decontaminate=...): paragraphs sharing a word 8-gram with a labelled set's dev or test split are dropped,
in both passes alike; the meta counts; one-line errors for a set that is unknown or not fetched."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_data_prepare import DOCS, HFStandIn, needs_clean_extra

from lmforge.data.corpus.decontaminate import Decontaminator
from lmforge.data.corpus.prepare import prepare
from lmforge.data.ngrams import word_ngrams
from lmforge.errors import LMForgeError

DEV_TEXT = "One two three four five six seven eight nine."
DEV_PAIR = "Red orange yellow green blue indigo violet black white."
TEST_TEXT = "The cat sat on the warm mat all day long."
TRAIN_TEXT = "Alpha bravo charlie delta echo foxtrot golf hotel india."

CORPUS = [
    "A paragraph about nothing in particular.\n\nWe saw ONE two three, four five six seven eight today.\n\n"
    "Another clean paragraph stays.",  # the middle paragraph goes (an 8-gram of dev, other case and punctuation)
    "The first line is fine.\nand the cat sat on the warm mat all evening.\nThe last line is fine.",  # line 2 goes
    "red orange yellow green blue indigo violet black",  # the dev pair's text: the whole document goes
    "Counting one two three four five six seven and then more words.",  # 7 shared words: kept
    "Alpha bravo charlie delta echo foxtrot golf hotel india, said the train split.",  # train text: kept
    *DOCS[:10],
]


def _labelled_dir(root: Path) -> Path:
    root.mkdir()
    meta = {"name": "tiny", "task_type": "classification", "labels": ["a", "b"], "splits": ["train", "dev", "test"]}
    (root / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    splits = {
        "train": {"id": "t1", "text": TRAIN_TEXT, "label": "a"},
        "dev": {"id": "d1", "text": DEV_TEXT, "text_pair": DEV_PAIR, "label": "b"},
        "test": {"id": "s1", "text": TEST_TEXT, "label": "a"},
    }
    for split, ex in splits.items():
        (root / f"{split}.jsonl").write_text(json.dumps(ex) + "\n", encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def tok() -> HFStandIn:
    return HFStandIn(DOCS + CORPUS)


def _texts(out: Path, tok: HFStandIn) -> str:
    """Every prepared document decoded, train and val."""
    meta = json.loads((out / "meta.json").read_text())
    parts = []
    for split in ("train", "val"):
        ids = np.fromfile(out / f"{split}.bin", dtype=meta["dtype"]).astype(np.int64)
        parts.append(tok.decode([int(i) for i in ids if i != meta["eos_id"]]))
    return "\n".join(parts)


def _prepare(tmp_path: Path, tok: HFStandIn, docs: list[str], **kw) -> tuple[dict, str]:
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    meta = prepare([src], tmp_path / "out", tok, val_fraction=0.2, **kw)
    return meta, _texts(tmp_path / "out", tok)


def test_dev_and_test_paragraphs_are_dropped_train_and_seven_words_are_not(tmp_path: Path, tok: HFStandIn) -> None:
    sset = _labelled_dir(tmp_path / "tiny")
    meta, text = _prepare(tmp_path, tok, CORPUS, decontaminate=[str(sset)])
    assert "We saw" not in text and "warm mat" not in text and "indigo" not in text
    for kept in ("A paragraph about nothing", "Another clean paragraph stays.", "The first line is fine.",
                 "The last line is fine.", "seven and then more", "Alpha bravo charlie", DOCS[3]):  # fmt: skip
        assert kept in text
    held = word_ngrams(DEV_TEXT, 8) | word_ngrams(DEV_PAIR, 8) | word_ngrams(TEST_TEXT, 8)
    assert meta["decontamination"] == {"sets": [str(sset.resolve())], "n": 8, "held_out_ngrams": len(held),
                                       "paragraphs_dropped": 3, "docs_dropped": 1}  # fmt: skip
    assert meta["train"]["n_docs"] + meta["val"]["n_docs"] == len(CORPUS) - 1
    # both passes agree: the bytes counted are those of the documents tokenized
    assert meta["train"]["n_bytes"] + meta["val"]["n_bytes"] == sum(
        len(d.encode()) for d in [Decontaminator([str(sset)]).apply(d)[0] for d in CORPUS] if d is not None
    )


def test_n_is_settable_and_a_plain_prepare_records_none(tmp_path: Path, tok: HFStandIn) -> None:
    sset = _labelled_dir(tmp_path / "tiny")
    meta, text = _prepare(tmp_path, tok, CORPUS, decontaminate=[str(sset)], decontaminate_n=7)
    assert "seven and then more" not in text and meta["decontamination"]["paragraphs_dropped"] == 4
    meta, _ = _prepare(tmp_path, tok, CORPUS)
    assert "decontamination" not in meta


@needs_clean_extra
def test_composes_with_cleaning(tmp_path: Path, tok: HFStandIn) -> None:
    sset = _labelled_dir(tmp_path / "tiny")
    good = "\n".join(f"Line {i} tells of {w} and of nothing else at all." for i, w in enumerate("abcdef"))
    docs = [f"{good}\n\nThey said the cat sat on the warm mat all day.", good.replace("Line", "Row"), DOCS[0] * 6]
    docs.append("\n".join(f"Verse {i} sings of {w} and of little more." for i, w in enumerate("ghijkl")))
    meta, text = _prepare(tmp_path, tok, docs, clean=True, decontaminate=[str(sset)])
    assert "warm mat" not in text and "Line 5 tells of f" in text and "Verse 0" in text
    assert meta["decontamination"]["paragraphs_dropped"] == 1 and meta["cleaning"]["docs_in"] == 4


def test_unknown_and_unfetched_sets_are_one_line(tmp_path: Path, tok: HFStandIn, monkeypatch) -> None:
    monkeypatch.setenv("LMFORGE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(LMForgeError, match="unknown labelled set 'no-such-set'") as e:
        _prepare(tmp_path, tok, DOCS, decontaminate=["no-such-set"])
    assert "\n" not in str(e.value)
    with pytest.raises(LMForgeError, match="lmforge data fetch hedge") as e:
        _prepare(tmp_path, tok, DOCS, decontaminate=["hedge"])
    assert "\n" not in str(e.value)


def test_cli(tmp_path: Path, monkeypatch, capsys) -> None:
    from lmforge.cli import main
    from lmforge.tokenizers import train_tokenizer

    monkeypatch.setenv("LMFORGE_TOKENIZER_CACHE", str(tmp_path / "tok-cache"))
    monkeypatch.chdir(tmp_path)
    train_tokenizer(DOCS, "bpe", 300).save("TOK")
    _labelled_dir(tmp_path / "tiny")
    Path("c.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in CORPUS), encoding="utf-8")
    args = ["data", "prepare", "c.jsonl", "--out", "out", "--tokenizer", "TOK", "--decontaminate"]
    assert main([*args, "tiny,sentiment"]) == 0
    assert "dropped 3 paragraphs, 1 docs" in capsys.readouterr().out
    meta = json.loads(Path("out/meta.json").read_text())
    assert meta["decontamination"]["sets"] == [str((tmp_path / "tiny").resolve()), "sentiment"]
    assert main([*args, "nosuch"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --decontaminate: unknown labelled set 'nosuch'") and err.count("\n") == 1


def test_an_experiments_data_key_tells_a_decontaminated_corpus_and_keeps_the_plain_one() -> None:
    from types import SimpleNamespace

    from lmforge.experiments.data import data_key
    from lmforge.pretraining.config import DataConfig

    def key(**kw) -> str:
        cfg = SimpleNamespace(data=DataConfig(**kw), run=SimpleNamespace(seed=0), model=SimpleNamespace(arch="decoder"))
        return data_key(cfg)

    assert key() == "bpe-gpt-4096-" + key().rsplit("-", 1)[1] and key(decontaminate=["hedge"]) != key()
    assert key(decontaminate=["hedge"], decontaminate_n=13) != key(decontaminate=["hedge"])
