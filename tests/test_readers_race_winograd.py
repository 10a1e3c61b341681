"""RACE, WSC273 XML, DPR and SuperGLUE WSC readers on fixtures written in the published formats
(tests/fixtures/race, tests/fixtures/winograd, tests/fixtures/superglue/WSC), and their malformed inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmforge.data.labelled.glue import read_superglue
from lmforge.data.labelled.winograd import as_referent, read_dpr, read_wsc_xml
from lmforge.errors import LMForgeError
from lmforge.tasks.config import FtDataConfig
from lmforge.tasks.data import load_splits
from lmforge.tasks.race import read_race

FIX = Path(__file__).parent / "fixtures"
RACE, WINO = FIX / "race", FIX / "winograd"


def test_race_questions_of_each_level_and_split():
    dev = read_race(RACE, "dev")
    assert dev.task_type == "multiple_choice" and len(dev.examples) == 4
    first = dev.examples[0]  # middle/1.txt, question 1
    assert first.id == "middle2.txt-0" and first.label == 1 and len(first.choices) == 4
    assert first.context.startswith("Sam wanted to win the school kite contest.")
    assert first.text == first.context + "\nWhat did Sam use to build his kite?"
    assert first.choices[1] == "Newspaper and thin bamboo sticks" and first.meta["level"] == "middle"
    cloze = dev.examples[1]
    assert cloze.meta["question"] == "Sam's kite rose high because it was _ ." and cloze.label == 0
    assert [e.meta["level"] for e in dev.examples] == ["middle", "middle", "high", "high"]
    assert [e.id for e in read_race(RACE, "test", "high").examples] == ["high3.txt-0", "high3.txt-1"]
    assert len(read_race(RACE, "train", "middle").examples) == 2
    splits = load_splits(FtDataConfig(source="race", name="all", dir=str(RACE)))
    assert {k: len(v.examples) for k, v in splits.items()} == {"train": 4, "dev": 4, "test": 4}


def test_race_bad_inputs(tmp_path):
    bad = tmp_path / "RACE" / "dev" / "middle"
    bad.mkdir(parents=True)
    (tmp_path / "RACE" / "dev" / "high").mkdir()
    obj = {"answers": ["E"], "options": [["a", "b", "c", "d"]], "questions": ["q?"], "article": "x", "id": "m1.txt"}
    (bad / "1.txt").write_text(json.dumps(obj))
    with pytest.raises(LMForgeError, match=r"1.txt: question 1: answer 'E' is not one of A, B, C, D$"):
        read_race(tmp_path, "dev")
    obj["answers"] = ["A", "B"]
    (bad / "1.txt").write_text(json.dumps(obj))
    with pytest.raises(LMForgeError, match=r"1.txt: 1 questions, 1 option lists and 2 answers$"):
        read_race(tmp_path, "dev")
    (bad / "1.txt").write_text('{"article": "x"')
    with pytest.raises(LMForgeError, match=r"1.txt:1: invalid JSON"):
        read_race(tmp_path, "dev")
    with pytest.raises(LMForgeError, match=r"RACE train: no train/ directory in"):
        read_race(tmp_path, "train")
    with pytest.raises(LMForgeError, match="data.source=race: data.name must be all, middle or high, got 'hihg'"):
        load_splits(FtDataConfig(source="race", name="hihg", dir=str(RACE)))


def test_wsc_xml_schemas_as_winograd_examples():
    ds = read_wsc_xml(WINO / "WSCollection.xml")
    texts = [e.text for e in ds.examples]
    assert texts[0] == "The heavy box would not fit on the narrow shelf because _ was too wide."
    assert [e.label for e in ds.examples] == [0, 1, 1, 1, 0]  # "A", " B ", "B.", "B", "A"
    assert ds.examples[0].choices == ["the heavy box", "the narrow shelf"]  # "The" lower-cased mid-sentence
    # Line breaks and indentation inside the XML collapse to single spaces.
    assert texts[2] == "Maria lent Clara her umbrella, so Clara could walk home dry. Later _ thanked Maria for it."
    assert ds.examples[3].choices == ["the fox's", "the hens'"]  # "their": the candidates' possessives
    assert ds.examples[4].text == "Peter could not lift the piano with Tom. _ was too weak."
    assert ds.examples[4].choices == ["Peter", "The piano"]  # a sentence starts at the blank
    assert ds.examples[2].meta["quote"] == "Later _ thanked Maria" and ds.examples[0].meta["pronoun"] == "it"
    assert len(read_wsc_xml(WINO / "WSCollection.xml", "wsc285").examples) == 5
    splits = load_splits(FtDataConfig(source="wsc", name="wsc273", dir=str(WINO)), require_train=False)
    assert list(splits) == ["test"] and len(splits["test"].examples) == 5
    with pytest.raises(LMForgeError, match=r"no training examples"):
        load_splits(FtDataConfig(source="wsc", name="wsc273", dir=str(WINO)))


def test_wsc_xml_bad_inputs(tmp_path):
    xml = (WINO / "WSCollection.xml").read_text()
    (tmp_path / "a.xml").write_text(
        xml.replace("<correctAnswer>A</correctAnswer>", "<correctAnswer>C</correctAnswer>", 1)
    )
    with pytest.raises(LMForgeError, match=r"a.xml: schema 1: correctAnswer 'C' is not one of the answer letters"):
        read_wsc_xml(tmp_path / "a.xml")
    (tmp_path / "b.xml").write_text(xml.replace("</collection>", ""))
    with pytest.raises(LMForgeError, match=r"b.xml: not well-formed XML"):
        read_wsc_xml(tmp_path / "b.xml")
    with pytest.raises(LMForgeError, match=r"no such file \(WSCollection.xml"):
        read_wsc_xml(tmp_path / "missing.xml")
    # A document type declaration (as some copies carry) is accepted.
    (tmp_path / "c.xml").write_text(xml.replace("<collection>", '<!DOCTYPE collection SYSTEM "x.dtd">\n<collection>'))
    assert len(read_wsc_xml(tmp_path / "c.xml").examples) == 5


def test_dpr_blocks():
    ds = read_dpr(WINO / "dpr" / "test.c.txt")
    assert [e.text for e in ds.examples] == [
        "The teacher praised the student because _ had solved the puzzle .",
        "The teacher praised the student because _ was impressed .",
        "John could not see the stage over Bill because _ was so tall .",
    ]
    assert [e.label for e in ds.examples] == [1, 0, 1] and ds.examples[2].choices == ["John", "Bill"]
    splits = load_splits(FtDataConfig(source="dpr", name="dpr", dir=str(WINO / "dpr")))
    assert len(splits["test"].examples) == 3 and len(splits["train"].examples) + len(splits["dev"].examples) == 3


def test_dpr_bad_inputs(tmp_path):
    (tmp_path / "a.c.txt").write_text("He ran .\nhe\nTom,Bob\nTom\n\nShe sat .\nshe\nAnn\n")
    with pytest.raises(LMForgeError, match=r"a.c.txt:6: a DPR example has 4 lines .*, not 3$"):
        read_dpr(tmp_path / "a.c.txt")
    (tmp_path / "b.c.txt").write_text("He ran .\nhe\nTom,Bob\nJim\n")
    with pytest.raises(LMForgeError, match=r"b.c.txt:4: answer 'Jim' is not one of the candidates"):
        read_dpr(tmp_path / "b.c.txt")
    (tmp_path / "c.c.txt").write_text("Tom ran .\nhe\nTom,Bob\nTom\n")
    with pytest.raises(LMForgeError, match=r"c.c.txt:2: pronoun 'he' does not occur in the sentence"):
        read_dpr(tmp_path / "c.c.txt")


def test_dpr_resolves_the_first_occurrence_of_the_pronoun(tmp_path):
    (tmp_path / "a.c.txt").write_text("He said Tom saw Bob before he left .\nhe\nTom,Bob\nTom\n")
    [ex] = read_dpr(tmp_path / "a.c.txt").examples
    assert ex.text == "He said Tom saw Bob before _ left ."  # case-sensitive match first: "he", not "He"
    (tmp_path / "b.c.txt").write_text("It rained , so it was wet .\nit\nrain,road\nrain\n")
    assert read_dpr(tmp_path / "b.c.txt").examples[0].text == "It rained , so _ was wet ."


def test_superglue_wsc_pairs_and_grouped_choices():
    pairs = read_superglue("wsc", FIX / "superglue", "train")
    assert pairs.labels == ["False", "True"] and pairs.task_type == "classification"
    assert [e.label for e in pairs.examples] == ["False", "True", "True", "False", "True"]
    assert pairs.examples[1].text_pair == '"she" refers to "Beth"'
    grouped = read_superglue("wsc-choice", FIX / "superglue", "train")
    assert [(e.text, e.choices, e.label) for e in grouped.examples] == [
        ("Anna asked Beth for the key, but _ had already given it away.", ["Anna", "Beth"], 1),
        ("The dog ignored the ball because _ was tired.", ["the dog", "the ball"], 0),
    ]  # the single-candidate sentence cannot be decided by comparison
    test = read_superglue("wsc-choice", FIX / "superglue", "test")
    assert [(e.choices, e.label) for e in test.examples] == [(["the ice cube", "the stove"], None)]


def test_superglue_wsc_bad_spans(tmp_path):
    line = {"text": "Tom met Bob and he smiled.", "idx": 0, "label": True,
            "target": {"span1_index": 0, "span1_text": "Tom", "span2_index": 3, "span2_text": "he"}}  # fmt: skip
    (tmp_path / "WSC").mkdir()
    (tmp_path / "WSC" / "train.jsonl").write_text(json.dumps(line) + "\n")
    with pytest.raises(LMForgeError, match=r"train.jsonl:1: target.span2_text 'he' is not the text's words at 3"):
        read_superglue("wsc", tmp_path, "train")
    line["target"]["span2_index"] = 9
    (tmp_path / "WSC" / "train.jsonl").write_text(json.dumps(line) + "\n")
    with pytest.raises(LMForgeError, match=r"train.jsonl:1: target.span2_index 9 is outside the text's 6 words"):
        read_superglue("wsc", tmp_path, "train")


def test_referent_spelling():
    assert as_referent("The hens", "their", sentence_start=False) == "the hens'"
    assert as_referent("the  old man", "his", sentence_start=False) == "the old man's"
    assert as_referent("a dog", "it", sentence_start=True) == "A dog"
    assert as_referent("An owl", "it", sentence_start=False) == "an owl"
    assert as_referent("Susan", "her", sentence_start=False) == "Susan"  # "her" stays an object pronoun
