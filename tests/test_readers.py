"""Labelled-data readers: tables, SQuAD, SNLI, SST trees, CoNLL-2003, labelled-set directories, the bundled set.

Real-format fixtures come from allennlp 0.9.0's test fixtures (tests/fixtures/allennlp, see SOURCES.md).
"""

from __future__ import annotations

import gzip
import json
import lzma
from pathlib import Path

import pytest

from lmforge.data.labelled.examples import Example
from lmforge.data.labelled.readers import (
    CONLL_NER_LABELS,
    bundled_names,
    example_from_dict,
    example_to_dict,
    iob1_to_iob2,
    load_bundled,
    load_fetched,
    load_labelled_dir,
    read_conll2003,
    read_snli,
    read_squad,
    read_sst_trees,
    read_table,
    write_examples,
)
from lmforge.errors import LMForgeError

FIX = Path(__file__).parent / "fixtures"
ALLEN = FIX / "allennlp"


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- tables


def test_table_headerless_tsv_quora_fixture() -> None:
    ds = read_table(ALLEN / "quora_paraphrase.tsv", 1, 0, 2, header=False, id_field=3)
    assert [(e.label, e.id) for e in ds.examples] == [("1", "50018"), ("0", "126924"), ("1", "391187")]
    assert ds.examples[0].text == "What should I do to avoid sleeping in class ?"
    assert ds.examples[0].text_pair == "How do I not sleep in a boring class ?"
    assert ds.labels == ["0", "1"] and ds.task_type == "classification"


def test_table_jsonl_csv_and_compressed(tmp_path: Path) -> None:
    rows = [{"review": "great", "stars": 5, "ok": True}, {"review": "awful", "stars": 1, "ok": False}]
    jl = tmp_path / "r.jsonl.gz"
    jl.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    ds = read_table(jl, "review", "ok")
    assert [(e.text, e.label) for e in ds.examples] == [("great", "True"), ("awful", "False")]
    assert ds.labels == ["False", "True"]
    reg = read_table(jl, "review", "stars", task_type="regression")
    assert [e.label for e in reg.examples] == [5.0, 1.0] and reg.labels is None
    # RFC 4180 CSV: a quoted field with a comma, a doubled quote and a newline.
    csv_file = _write(tmp_path / "r.csv", 'text,label\n"a, ""quoted""\nline",pos\nplain,neg\n')
    ds = read_table(csv_file, "text", "label", labels=["neg", "pos"])
    assert [(e.text, e.label) for e in ds.examples] == [('a, "quoted"\nline', "pos"), ("plain", "neg")]
    assert ds.labels == ["neg", "pos"]
    unlabelled = read_table(csv_file, "text", None)
    assert unlabelled.labels is None and unlabelled.examples[1].label is None


def test_table_errors(tmp_path: Path) -> None:
    tsv = _write(tmp_path / "t.tsv", "text\tlabel\nfine\tpos\nbroken row\n")
    with pytest.raises(LMForgeError, match=rf"^{tsv}:3: expected 2 TSV columns \(as the header\), found 1$"):
        read_table(tsv, "text", "label")
    good = _write(tmp_path / "g.tsv", "text\tlabel\nfine\tpos\nbad\tmaybe\n")
    with pytest.raises(LMForgeError, match=rf"^{good}:3: label 'maybe' is not one of 'neg', 'pos'$"):
        read_table(good, "text", "label", labels=["neg", "pos"])
    with pytest.raises(LMForgeError, match=rf"^{good}:2: missing field 'sentence'$"):
        read_table(good, "sentence", "label")
    with pytest.raises(LMForgeError, match=rf"^{good}:2: score 'pos' is not a number$"):
        read_table(good, "text", "label", task_type="regression")
    nulls = _write(tmp_path / "n.jsonl", '{"text": null, "label": "x"}\n')
    with pytest.raises(LMForgeError, match=rf"^{nulls}:1: field 'text' is null$"):
        read_table(nulls, "text", "label")
    inf = _write(tmp_path / "inf.jsonl", '{"text": "a", "score": "inf"}\n')
    with pytest.raises(LMForgeError, match=rf"^{inf}:1: score 'inf' is not a finite number$"):
        read_table(inf, "text", "score", task_type="regression")
    jl = _write(tmp_path / "j.jsonl", '{"text": "a", "label": "x"}\n{"text": "b", "label": \n')
    with pytest.raises(LMForgeError, match=rf"^{jl}:2: invalid JSON \(Expecting value at column 24\)$"):
        read_table(jl, "text", "label")
    arr = _write(tmp_path / "a.jsonl", '["not", "an", "object"]\n')
    with pytest.raises(LMForgeError, match=rf"^{arr}:1: expected a JSON object, found list$"):
        read_table(arr, "text", "label")
    bad_csv = _write(tmp_path / "b.csv", 'text,label\n"unterminated,pos\n')
    with pytest.raises(LMForgeError, match=rf"^{bad_csv}:2: malformed CSV \(unexpected end of data\)$"):
        read_table(bad_csv, "text", "label")
    latin = tmp_path / "l.tsv"
    latin.write_bytes(b"text\tlabel\ncaf\xe9\tpos\n")
    with pytest.raises(LMForgeError, match=rf"^{latin}:2: not UTF-8 text \(byte 3 of the line\)$"):
        read_table(latin, "text", "label")
    with pytest.raises(LMForgeError, match=r"cannot tell the table format from the name"):
        read_table(_write(tmp_path / "x.txt", "a"), "text", "label")
    with pytest.raises(LMForgeError, match=rf"^{tmp_path / 'none.tsv'}: no such file$"):
        read_table(tmp_path / "none.tsv", "text", "label")


# ---------------------------------------------------------------- SQuAD


def test_squad_v11_fixture() -> None:
    ds = read_squad(ALLEN / "squad.json")
    assert ds.task_type == "span" and len(ds.examples) == 5
    first = ds.examples[0]
    assert first.id == "5733be284776f41900661182"
    assert first.text == "To whom did the Virgin Mary allegedly appear in 1858 in Lourdes France?"
    assert first.answers == [(515, "Saint Bernadette Soubirous")]
    assert first.context is not None and first.context[515:541] == "Saint Bernadette Soubirous"
    assert first.meta == {"title": "University_of_Notre_Dame", "is_impossible": False}
    assert [len(e.answers or []) for e in ds.examples] == [1, 3, 1, 1, 1]


def test_squad_v20_impossible() -> None:
    ds = read_squad(FIX / "squad_v2.json")
    assert [e.answers for e in ds.examples] == [[(159, "France")], []]
    assert [e.meta["is_impossible"] for e in ds.examples] == [False, True]


def test_squad_errors(tmp_path: Path) -> None:
    ctx = "Paris is in France."
    doc = {"data": [{"title": "t", "paragraphs": [{"context": ctx, "qas": [{"id": "q1", "question": "Where?"}]}]}]}
    f = _write(tmp_path / "s.json", json.dumps(doc))
    with pytest.raises(LMForgeError, match=rf"^{f}: question q1: missing the 'answers' list$"):
        read_squad(f)
    doc["data"][0]["paragraphs"][0]["qas"][0]["answers"] = [{"text": "France", "answer_start": 3}]
    _write(f, json.dumps(doc))
    with pytest.raises(
        LMForgeError, match=rf"^{f}: question q1: answer 'France' is not at character 3 of its context$"
    ):
        read_squad(f)
    _write(f, '{"data": [\n  {"title": }\n]}')
    with pytest.raises(LMForgeError, match=rf"^{f}:2: invalid JSON \(Expecting value at column 13\)$"):
        read_squad(f)
    _write(f, '{"version": "1.1"}')
    with pytest.raises(LMForgeError, match=rf"^{f}: not a SQuAD file \(expected an object with a 'data' list\)$"):
        read_squad(f)


# ---------------------------------------------------------------- SNLI, SST, CoNLL


def test_snli_fixture_and_no_consensus(tmp_path: Path) -> None:
    ds = read_snli(ALLEN / "snli.jsonl")
    assert [e.label for e in ds.examples] == ["neutral", "contradiction", "entailment"]
    assert ds.examples[2].text_pair == "A person is outdoors, on a horse."
    assert ds.examples[0].id == "3416050480.jpg#4r1n" and ds.labels == ["entailment", "neutral", "contradiction"]
    lines = (ALLEN / "snli.jsonl").read_text().splitlines()
    obj = json.loads(lines[0])
    f = tmp_path / "s.jsonl"
    _write(f, lines[0] + "\n" + json.dumps({**obj, "gold_label": "-"}) + "\n")
    assert len(read_snli(f).examples) == 1  # no-consensus pair skipped
    _write(f, lines[0] + "\n" + json.dumps({**obj, "gold_label": "maybe"}) + "\n")
    with pytest.raises(LMForgeError, match=rf"^{f}:2: label 'maybe' is not one of 'entailment', 'neutral'"):
        read_snli(f)


def test_sst_trees_fixture(tmp_path: Path) -> None:
    binary = read_sst_trees(ALLEN / "sst.txt")
    assert [(e.text, e.label) for e in binary.examples] == [
        ("The actors are fantastic .", "positive"),
        ("It was terrible .", "negative"),
    ]  # the neutral root (2) is dropped
    fine = read_sst_trees(ALLEN / "sst.txt", fine_grained=True)
    assert [e.label for e in fine.examples] == ["very positive", "very negative", "neutral"]
    assert fine.examples[2].text == "Chomp chomp !"
    f = _write(tmp_path / "t.txt", "(3 (2 -LRB-) (3 good) (2 -RRB-))\n(3 (2 unbalanced)\n")
    with pytest.raises(LMForgeError, match=rf"^{f}:2: not a sentiment tree"):
        read_sst_trees(f)
    _write(f, "(3 (2 -LRB-) (3 good) (2 -RRB-))\n")
    assert read_sst_trees(f).examples[0].text == "( good )"


def test_iob1_to_iob2() -> None:
    assert iob1_to_iob2(["I-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-ORG"]) == [
        "B-PER",
        "I-PER",
        "O",
        "B-LOC",
        "B-LOC",
        "B-ORG",
    ]
    iob2 = ["B-PER", "I-PER", "O", "B-LOC"]
    assert iob1_to_iob2(iob2) == iob2


def test_conll2003_fixture(tmp_path: Path) -> None:
    ds = read_conll2003(ALLEN / "conll2003.txt")
    assert ds.task_type == "tagging" and ds.labels == CONLL_NER_LABELS and len(ds.examples) == 2
    first = ds.examples[0]
    assert first.tokens == ["U.N.", "official", "Ekeus", "heads", "for", "Baghdad", "."]
    assert first.tags == ["B-ORG", "O", "B-PER", "O", "O", "B-LOC", "O"]  # IOB1 I-ORG → IOB2 B-ORG
    assert first.meta["pos"][:3] == ["NNP", "NN", "NNP"]
    assert first.meta["chunk"][:4] == ["B-NP", "I-NP", "I-NP", "B-VP"]
    raw = read_conll2003(ALLEN / "conll2003.txt", scheme="iob1")
    assert raw.examples[0].tags[:3] == ["I-ORG", "O", "I-PER"]
    pos = read_conll2003(ALLEN / "conll2003.txt", column="pos")
    assert pos.examples[1].tags == ["NNP", "NN", "NNP", "VBZ", "IN", "NNP", "."]
    assert pos.labels == [".", "IN", "NN", "NNP", "VBZ"]
    f = _write(tmp_path / "c.txt", "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP\n")
    with pytest.raises(LMForgeError, match=rf"^{f}:4: expected 4 columns \(token POS chunk NER\), found 3$"):
        read_conll2003(f)
    _write(f, "EU NNP B-NP B-ORGANISATION\n")
    with pytest.raises(LMForgeError, match=rf"^{f}:1: unknown NER tag 'B-ORGANISATION'"):
        read_conll2003(f)


# ---------------------------------------------------------------- labelled-set directories


def test_example_dict_round_trip(tmp_path: Path) -> None:
    exs = [
        Example(text="q?", context="c", answers=[(0, "c")], id="1"),
        Example(tokens=["EU", "rejects"], tags=["B-ORG", "O"]),
        Example(text="premise", choices=["a", "b"], label=1, meta={"question": "cause"}),
    ]
    assert example_to_dict(exs[1]) == {"tokens": ["EU", "rejects"], "tags": ["B-ORG", "O"]}
    for ex in exs:
        assert example_from_dict(tmp_path, 1, json.loads(json.dumps(example_to_dict(ex)))) == ex
    with pytest.raises(LMForgeError, match=rf"^{tmp_path}:7: unknown example field 'sentence'$"):
        example_from_dict(tmp_path, 7, {"sentence": "x"})


def test_load_labelled_dir(tmp_path: Path) -> None:
    meta = {"task_type": "classification", "labels": ["neg", "pos"], "splits": ["train", "dev"]}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    write_examples(tmp_path / "train.jsonl.xz", [Example("good", label="pos"), Example("bad", label="neg")])
    assert lzma.decompress((tmp_path / "train.jsonl.xz").read_bytes()).startswith(b'{"text": "good"')
    _write(tmp_path / "dev.jsonl", '{"text": "meh", "label": "pos"}\n')
    splits = load_labelled_dir(tmp_path)
    assert list(splits) == ["train", "dev"]
    assert [(e.text, e.label) for e in splits["train"].examples] == [("good", "pos"), ("bad", "neg")]
    assert splits["dev"].labels == ["neg", "pos"] and splits["dev"].task_type == "classification"
    _write(tmp_path / "dev.jsonl", '{"text": "meh", "label": "pos"}\n{"text": "?", "label": "neutral"}\n')
    with pytest.raises(LMForgeError, match=rf"^{tmp_path / 'dev.jsonl'}:2: label 'neutral' is not one of"):
        load_labelled_dir(tmp_path)
    (tmp_path / "dev.jsonl").unlink()
    with pytest.raises(LMForgeError, match=r"split 'dev' is missing \(dev.jsonl or dev.jsonl.xz\)$"):
        load_labelled_dir(tmp_path)
    with pytest.raises(LMForgeError, match=r"^labelled set 'hedge' is not in .* \(run: lmforge data fetch hedge\)$"):
        load_fetched("hedge", cache_dir=tmp_path)


def test_bundled_sentiment_set() -> None:
    assert "sentiment" in bundled_names()
    splits = load_bundled("sentiment")
    assert {k: len(v.examples) for k, v in splits.items()} == {"train": 10194, "dev": 1504, "test": 1110}
    for ds in splits.values():
        assert ds.labels == ["negative", "positive"] and ds.task_type == "classification"
    train = splits["train"].examples
    assert sum(e.label == "positive" for e in train) == 6021
    assert all(e.text and e.label in ("negative", "positive") for e in train)
    assert train[0].text == "It lets you brush up against the humanity of a psycho, without making him any less psycho."
    with pytest.raises(LMForgeError, match=r"^unknown bundled labelled set 'sentimen' \(known: sentiment\)$"):
        load_bundled("sentimen")
