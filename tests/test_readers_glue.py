"""GLUE and SuperGLUE readers on hand-written files in the distributed layouts (tests/fixtures/glue, superglue)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lmforge.data.labelled.glue import GLUE_TASKS, glue_metrics, glue_task, read_glue, read_superglue
from lmforge.errors import LMForgeError

FIX = Path(__file__).parent / "fixtures"
GLUE = FIX / "glue"
SUPER = FIX / "superglue"


def _labels(task: str, split: str) -> list:
    return [e.label for e in read_glue(task, GLUE, split).examples]


def test_every_task_reads_train_and_dev_with_its_label_set() -> None:
    expected = {
        "cola": (["acceptable", "acceptable", "unacceptable"], ["acceptable", "unacceptable"]),
        "sst2": (["negative", "negative", "positive"], ["positive", "negative"]),
        "mrpc": (["equivalent", "not_equivalent"], ["equivalent"]),
        "stsb": ([5.0, 3.8], [5.0, 4.75]),
        "qqp": (["not_duplicate", "duplicate"], ["not_duplicate"]),
        "mnli": (["neutral", "entailment"], ["neutral"]),
        "qnli": (["not_entailment", "not_entailment"], ["entailment"]),
        "rte": (["not_entailment", "entailment"], ["not_entailment"]),
        "wnli": (["entailment"] * 3, ["not_entailment"]),
    }
    for task, (train, dev) in expected.items():
        assert _labels(task, "train") == train, task
        assert _labels(task, "dev") == dev, task
        ds = read_glue(task, GLUE, "train")
        spec = GLUE_TASKS[task]
        assert ds.task_type == spec.task_type
        assert ds.labels == (list(spec.labels) if spec.labels else None)
        assert all(ds.labels is None or e.label in ds.labels for e in ds.examples)


def test_texts_ids_and_meta() -> None:
    cola = read_glue("CoLA", GLUE / "CoLA", "train").examples  # the task dir itself works too
    assert cola[2].text == "They drank the pub." and cola[2].meta == {"source": "gj04"} and cola[2].id == "train-2"
    mrpc = read_glue("mrpc", GLUE, "train").examples[0]  # train.tsv starts with a UTF-8 BOM
    assert mrpc.text.startswith('Amrozi accused his brother , whom he called " the witness "')
    assert mrpc.text_pair.startswith("Referring to him as only")
    stsb = read_glue("STS-B", GLUE, "train").examples[1]
    assert (stsb.text, stsb.text_pair, stsb.id, stsb.meta) == (
        "A man is playing a large flute.",
        "A man is playing a flute.",
        "1",
        {"genre": "main-captions"},
    )
    qqp = read_glue("qqp", GLUE, "train").examples[1]
    assert (qqp.id, qqp.text, qqp.text_pair) == ("402555", "How do I control my horny emotions?", qqp.text_pair)
    qnli = read_glue("qnli", GLUE, "train").examples[0]
    assert qnli.text == "When did the third Digimon series begin?" and qnli.text_pair.startswith("Unlike the two")
    sst = read_glue("sst-2", GLUE, "train").examples[0]
    assert sst.text == "hide new secretions from the parental units " and sst.text_pair is None


def test_mnli_splits_and_aliases() -> None:
    assert _labels("mnli", "dev_mismatched") == ["contradiction"]
    assert read_glue("mnli", GLUE, "dev").source.endswith("dev_matched.tsv")
    test = read_glue("MNLI", GLUE, "test").examples
    assert [e.label for e in test] == [None] and test[0].text_pair == "Hierbas is a name worth looking out for."
    assert read_glue("mnli", GLUE, "train").examples[0].meta == {"genre": "government"}
    with pytest.raises(LMForgeError, match=r"^MNLI has no split 'val_matched' \(splits: train, dev_matched, "):
        read_glue("mnli", GLUE, "val_matched")


def test_test_splits_are_unlabelled() -> None:
    for task in ("cola", "sst2", "mrpc", "stsb", "qqp", "rte"):
        ds = read_glue(task, GLUE, "test")
        assert ds.examples and all(e.label is None for e in ds.examples), task
    cola = read_glue("cola", GLUE, "test").examples
    assert [(e.id, e.text) for e in cola] == [("0", "Bill whistled past the house."), ("1", cola[1].text)]


def test_msr_paraphrase_original_file_names(tmp_path: Path) -> None:
    shutil.copy(GLUE / "MRPC" / "train.tsv", tmp_path / "msr_paraphrase_train.txt")
    assert [e.label for e in read_glue("mrpc", tmp_path, "train").examples] == ["equivalent", "not_equivalent"]


def test_glue_errors(tmp_path: Path) -> None:
    d = tmp_path / "SST-2"
    d.mkdir()
    f = d / "train.tsv"
    f.write_text("sentence\tlabel\ngood movie\t1\nbad movie\t2\n")
    with pytest.raises(LMForgeError, match=rf"^{f}:3: label '2' is not one of '0', '1'$"):
        read_glue("sst2", tmp_path, "train")
    f.write_text("sentence\tlabel\ngood movie\t1\nbad movie\t0\textra\n")
    with pytest.raises(LMForgeError, match=rf"^{f}:3: expected 2 tab-separated columns, found 3$"):
        read_glue("sst2", tmp_path, "train")
    f.write_text("text\tlabel\ngood movie\t1\n")
    with pytest.raises(LMForgeError, match=rf"^{f}:1: SST-2 header has no column 'sentence' \(found: text, label\)$"):
        read_glue("sst2", tmp_path, "train")
    f.write_text("index\tsentence\n0\tgood movie\n")
    with pytest.raises(LMForgeError, match=rf"^{f}:1: SST-2 train header has no label column 'label'$"):
        read_glue("sst2", tmp_path, "train")
    cola = tmp_path / "CoLA"
    cola.mkdir()
    (cola / "dev.tsv").write_text("gj04\t1\t\tFine.\ngj04\t1\tOnly three columns.\n")
    with pytest.raises(LMForgeError, match=rf"^{cola / 'dev.tsv'}:2: expected 4 tab-separated columns, found 3$"):
        read_glue("cola", tmp_path, "dev")
    stsb = tmp_path / "STS-B"
    stsb.mkdir()
    header = (GLUE / "STS-B" / "train.tsv").read_text().splitlines()[0]
    (stsb / "dev.tsv").write_text(header + "\n0\tg\tf\ty\t1\tn\tn\ta\tb\t5.5\n1\tg\tf\ty\t1\tn\tn\ta\tb\thigh\n")
    with pytest.raises(LMForgeError, match=rf"^{stsb / 'dev.tsv'}:2: score 5.5 is outside \[0, 5\]$"):
        read_glue("stsb", tmp_path, "dev")
    with pytest.raises(LMForgeError, match=r"^QNLI test: no test.tsv in "):
        read_glue("qnli", GLUE, "test")
    with pytest.raises(LMForgeError, match=r"^unknown GLUE task 'sst3' \(known: cola, sst2, mrpc, stsb, qqp"):
        glue_task("sst3")
    with pytest.raises(LMForgeError, match=r"^SST-2 has no split 'dev_matched' \(splits: train, dev, test\)$"):
        read_glue("sst2", GLUE, "dev_matched")


def test_superglue() -> None:
    boolq = read_superglue("BoolQ", SUPER, "train")
    assert [e.label for e in boolq.examples] == ["True", "True", "False"] and boolq.labels == ["False", "True"]
    assert boolq.examples[0].text == "do iran and afghanistan speak the same language"
    assert boolq.examples[0].text_pair.startswith("Persian language -- Persian")
    assert [e.label for e in read_superglue("boolq", SUPER, "dev").examples] == ["False"]
    assert [e.label for e in read_superglue("boolq", SUPER, "test").examples] == [None]
    cb = read_superglue("cb", SUPER, "train")
    assert [e.label for e in cb.examples] == ["entailment", "contradiction", "neutral"]
    assert cb.examples[2].text_pair == "they would make the connection"
    copa = read_superglue("copa", SUPER, "train")
    assert copa.task_type == "multiple_choice" and [e.label for e in copa.examples] == [0, 0, 1, 0]
    first = copa.examples[0]
    assert first.text == "My body cast a shadow over the grass. What was the cause?"
    assert first.choices == ["The sun was rising.", "The grass was cut."] and first.id == "0"
    dev = read_superglue("copa", SUPER, "val").examples[0]
    assert dev.text.endswith("What happened as a result?") and dev.meta["question"] == "effect"
    rte = read_superglue("rte", SUPER, "train")
    assert [e.label for e in rte.examples] == ["not_entailment", "entailment"]


def test_superglue_errors(tmp_path: Path) -> None:
    d = tmp_path / "CB"
    d.mkdir()
    f = d / "train.jsonl"
    f.write_text('{"premise": "p", "hypothesis": "h", "label": "entailment", "idx": 0}\n{"premise": "p", "idx": 1}\n')
    with pytest.raises(LMForgeError, match=rf"^{f}:2: missing field 'hypothesis'$"):
        read_superglue("cb", tmp_path, "train")
    f.write_text('{"premise": "p", "hypothesis": "h", "label": "unknown", "idx": 0}\n')
    with pytest.raises(LMForgeError, match=rf"^{f}:1: label 'unknown' is not one of 'entailment', 'contradiction'"):
        read_superglue("cb", tmp_path, "train")
    f.write_text('{"premise": "p", "hypothesis": "h", "idx": 0}\n')
    with pytest.raises(LMForgeError, match=rf"^{f}:1: missing field 'label' \(CB train examples are labelled\)$"):
        read_superglue("cb", tmp_path, "train")
    copa = tmp_path / "COPA"
    copa.mkdir()
    (copa / "train.jsonl").write_text(
        '{"premise": "p", "choice1": "a", "choice2": "b", "question": "reason", "label": 0, "idx": 0}\n'
    )
    with pytest.raises(LMForgeError, match=r":1: COPA question 'reason' is not 'cause' or 'effect'$"):
        read_superglue("copa", tmp_path, "train")
    with pytest.raises(
        LMForgeError, match=r"^unknown SuperGLUE task 'wic' \(known: boolq, cb, copa, rte, wsc, wscchoice\)$"
    ):
        read_superglue("wic", tmp_path, "train")


def test_glue_metrics_per_task() -> None:
    refs = ["equivalent", "equivalent", "not_equivalent", "not_equivalent"]
    preds = ["equivalent", "not_equivalent", "equivalent", "not_equivalent"]
    # MRPC: F1 of "equivalent": tp 1, fp 1, fn 1 → 0.5; accuracy 2/4.
    assert glue_metrics("MRPC", preds, refs) == {"f1": 0.5, "accuracy": 0.5}
    assert glue_metrics("mrpc", [1, 0, 1, 0], [1, 1, 0, 0]) == {"f1": 0.5, "accuracy": 0.5}  # label indices
    assert glue_metrics("cola", [1, 1, 0, 0], [1, 1, 0, 0]) == {"mcc": 1.0}
    stsb = glue_metrics("sts-b", [1.0, 2.0, 3.0], [2.0, 4.0, 6.0])
    assert stsb == pytest.approx({"pearson": 1.0, "spearman": 1.0})
    assert glue_metrics("cb", ["a", "b", "c"], ["a", "b", "b"]) == pytest.approx(
        {"accuracy": 2 / 3, "macro_f1": (1 + 2 / 3 + 0) / 3}
    )
