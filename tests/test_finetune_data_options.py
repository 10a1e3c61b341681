"""Fine-tuning data options: `data.target_field` (pairs from any table), `data.labels` (a declared label set) and the
warning about rare or one-split labels, overriding a recipe's task type, and the copy-the-input baseline of
seq2seq tasks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmforge.data.labelled.examples import Dataset, Example
from lmforge.errors import LMForgeError
from lmforge.tasks.config import FtDataConfig, load_finetune_config
from lmforge.tasks.data import data_label, load_splits
from lmforge.tasks.seq2seq import copy_baseline

PAIRS = [
    ("In the beginning God created the heavens and the earth.", "En el principio creó Dios los cielos y la tierra."),
    ("The earth was formless and empty.", "Y la tierra estaba desordenada y vacía."),
    ("God said, Let there be light, and there was light.", "Y dijo Dios: Sea la luz: y fué la luz."),
    ("God saw the light, and saw that it was good.", "Y vió Dios que la luz era buena."),
] * 10


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def test_table_pairs_with_target_field(tmp_path: Path) -> None:
    train = _jsonl(tmp_path / "pairs.jsonl", [{"en": en, "es": es} for en, es in PAIRS])
    cfg = FtDataConfig(source="table", train=str(train), text_field="en", target_field="es")
    splits = load_splits(cfg)
    assert len(splits["train"].examples) == 36 and len(splits["dev"].examples) == 4  # 10% held out
    ex = splits["train"].examples[0]
    assert (ex.text, ex.target, ex.label) == (PAIRS[0][0], PAIRS[0][1], None)
    assert splits["train"].task_type == "text_to_text" and splits["train"].labels is None
    assert data_label(cfg) == "pairs"  # reports name the user's file, and a named set by its name
    assert data_label(FtDataConfig(source="fetched", name="bible-en-es")) == "bible-en-es"
    bad = _jsonl(tmp_path / "bad.jsonl", [{"en": "a", "es": "b"}, {"en": "c"}])
    with pytest.raises(LMForgeError, match=r"^.*bad.jsonl:2: missing field 'es'$"):
        load_splits(FtDataConfig(source="table", train=str(bad), text_field="en", target_field="es"))


def test_copy_the_input_baseline() -> None:
    same = Dataset([Example(text="the cat sat on the mat", target="the cat sat on the mat")])
    assert copy_baseline(same, ["rouge1", "rougeL", "bleu"]) == pytest.approx({"rouge1": 1, "rougeL": 1, "bleu": 1})
    part = Dataset([Example(text="the cat sat on the mat", target="the cat sat")])
    # ROUGE-1: precision 3/6, recall 3/3 → F1 2/3; ROUGE-2: 2 of 5 bigrams, 2 of 2 → F1 4/7.
    assert copy_baseline(part, ["rouge1", "rouge2"]) == pytest.approx({"rouge1": 2 / 3, "rouge2": 4 / 7})
    none = Dataset([Example(text="uno dos tres cuatro", target="one two three four")])
    assert copy_baseline(none, ["rouge1", "bleu"]) == {"rouge1": 0.0, "bleu": 0.0}


def test_task_type_override_names_the_dropped_keys(capsys: pytest.CaptureFixture) -> None:
    cfg = load_finetune_config("sst2-t5", ["--task.type=seq2seq", "--data.target_field=es"])
    assert cfg.task.type == "seq2seq" and cfg.task.options.template == "sst2 sentence: {text}"  # still applies
    assert capsys.readouterr().err == (
        "warning: --task.type=seq2seq replaces the recipe's text_to_text; dropped the recipe keys that seq2seq "
        "does not have: task.label_words, task.scoring\n"
    )
    load_finetune_config("sst2-t5", ["--task.type=text_to_text"])  # same type: nothing dropped or said
    assert capsys.readouterr().err == ""
    with pytest.raises(LMForgeError, match=r"^unknown config key 'task.label_words'"):  # given explicitly: checked
        load_finetune_config("sst2-t5", ["--task.type=seq2seq", "--task.label_words=[a, b]"])


def test_rare_and_one_split_labels_warn(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rows = [{"text": f"t{i}", "label": "positive" if i % 2 else "negative"} for i in range(8)]
    train = _jsonl(tmp_path / "train.jsonl", [*rows[:3], {"text": "oops", "label": "posative"}, *rows[3:]])
    dev = _jsonl(
        tmp_path / "dev.jsonl", [*rows[:4], {"text": "x", "label": "neutral"}, {"text": "y", "label": "neutral"}]
    )
    splits = load_splits(FtDataConfig(source="table", train=str(train), dev=str(dev)))
    assert splits["train"].labels == ["negative", "posative", "positive"]  # not declared: the sorted labels found
    assert capsys.readouterr().err == (
        f"warning: label 'neutral' occurs 2 times, only in dev (first {dev}:5): a typo? To make any other label an "
        "error, declare the label set: --data.labels='[negative, positive]'\n"
        f"warning: label 'posative' occurs 1 time, only in train (first {train}:4): a typo? To make any other label "
        "an error, declare the label set: --data.labels='[negative, positive]'\n"
    )
    load_splits(FtDataConfig(source="table", train=str(train), dev=str(dev), min_label_count=1))
    assert "'posative' occurs 1 time, only in train" in capsys.readouterr().err  # one split only still warns
    only_train = _jsonl(tmp_path / "t.jsonl", rows)
    load_splits(FtDataConfig(source="table", train=str(only_train)))
    assert capsys.readouterr().err == ""


def test_declared_labels(tmp_path: Path) -> None:
    rows = [{"text": f"t{i}", "label": "positive" if i % 2 else "negative"} for i in range(10)]
    train = _jsonl(tmp_path / "train.jsonl", rows)
    splits = load_splits(FtDataConfig(source="table", train=str(train), labels=["positive", "negative"]))
    assert splits["train"].labels == ["positive", "negative"] and splits["dev"].labels == ["positive", "negative"]
    bad = _jsonl(tmp_path / "bad.jsonl", [*rows[:2], {"text": "oops", "label": "posative"}, *rows[2:]])
    with pytest.raises(LMForgeError, match=r"bad.jsonl:3: label 'posative' is not in data.labels \(negative, posit"):
        load_splits(FtDataConfig(source="table", train=str(bad), labels=["negative", "positive"]))
    with pytest.raises(
        LMForgeError, match=r"^data.labels applies to the table, dir and datasets sources, not bundled \("
    ):
        load_splits(FtDataConfig(source="bundled", name="sentiment", labels=["negative", "positive"]))
    with pytest.raises(LMForgeError, match=r"^data.labels: each label once, got \['a', 'a'\]$"):
        load_finetune_config("sst2-gpt", ["--data.labels=[a, a]"])


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "LMFORGE_QUIET": "1"}
    return subprocess.run(
        [sys.executable, "-m", "lmforge.cli", *args], capture_output=True, text=True, cwd=cwd, env=env
    )


def test_cli_declared_label_error(tmp_path: Path) -> None:
    rows = [{"text": f"t{i}", "label": "positive" if i % 2 else "negative"} for i in range(10)]
    _jsonl(tmp_path / "train.jsonl", [*rows[:2], {"text": "oops", "label": "posative"}, *rows[2:]])
    args = ["finetune", "sst2-gpt", "--data.source=table", "--data.train=train.jsonl"]
    out = _cli([*args, "--data.labels=[negative, positive]"], tmp_path)
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-1] == (
        "error: train.jsonl:3: label 'posative' is not in data.labels (negative, positive)"
    )


def test_cli_seq2seq_from_a_table_of_pairs(tmp_path: Path) -> None:
    _jsonl(tmp_path / "pairs.jsonl", [{"en": en, "es": es} for en, es in PAIRS])
    _jsonl(tmp_path / "test.jsonl", [{"en": en, "es": es} for en, es in PAIRS[:3]])
    args = ["finetune", "sst2-t5", "--task.type=seq2seq", "--data.source=table", "--data.train=pairs.jsonl"]
    args += ["--data.test=test.jsonl"]
    args += ["--data.text_field=en", "--data.target_field=es", "--task.metrics=[bleu]", "--train.max_steps=2"]
    args += ["--model.vocab_size=150", "--task.num_beams=1", "--task.max_new_tokens=4", "--run.dir=run"]
    out = _cli(args, tmp_path)
    assert out.returncode == 0, out.stderr
    assert "on seq2seq (table pairs): train 36, test 3, dev 4;" in out.stdout  # the user's file, not the recipe's set
    assert "dropped the recipe keys that seq2seq does not have: task.label_words, task.scoring" in out.stderr
    dev = [line for line in out.stdout.splitlines() if line.startswith("dev (best checkpoint)")]
    assert len(dev) == 1 and "(copy-the-input baseline: bleu " in dev[0]
    test = [line for line in out.stdout.splitlines() if line.startswith("test (best checkpoint)")]
    assert len(test) == 1 and "(copy-the-input baseline: bleu " in test[0]  # the test split's own floor
    assert (tmp_path / "run" / "eval.json").is_file() and (tmp_path / "run" / "eval_test.json").is_file()
