"""Hugging Face datasets as fine-tuning data (`data.source=datasets`: a save_to_disk dir, `hf:NAME` offline) and
live `datasets` objects through the Python API, saved into the run (RUN/inputs/N) so its config stays YAML."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tasks_testing as T
import yaml

import lmforge
from lmforge.errors import LMForgeError
from lmforge.loading import load_finetuned
from lmforge.tasks.config import FtDataConfig
from lmforge.tasks.data import data_label, load_splits

datasets = pytest.importorskip("datasets")

NAMES = ["positive", "negative"]  # ClassLabel order, not the sorted order: the run must keep it


def _sentiment_dict(n: int = 60) -> datasets.DatasetDict:
    examples = T.sentiment(n, seed=1).examples
    features = datasets.Features({"sentence": datasets.Value("string"), "label": datasets.ClassLabel(names=NAMES)})
    rows = {"sentence": [e.text for e in examples], "label": [NAMES.index(str(e.label)) for e in examples]}
    full = datasets.Dataset.from_dict(rows, features=features)
    third = n // 3
    return datasets.DatasetDict(
        {"train": full.select(range(n - 2 * third)), "validation": full.select(range(n - 2 * third, n - third)),
         "test": full.select(range(n - third, n))}
    )  # fmt: skip


def test_a_save_to_disk_dict_gives_its_splits_and_class_label_names(tmp_path: Path) -> None:
    dd = _sentiment_dict()
    unlabelled = dd["test"].map(lambda r: {"label": -1})  # GLUE's test splits: -1, no gold label
    datasets.DatasetDict({"train": dd["train"], "validation": dd["validation"], "test": unlabelled}).save_to_disk(
        tmp_path / "saved"
    )
    cfg = FtDataConfig(source="datasets", dir=str(tmp_path / "saved"), text_field="sentence")
    splits = load_splits(cfg)
    assert {k: len(v.examples) for k, v in splits.items()} == {"train": 20, "dev": 20, "test": 20}
    assert splits["train"].labels == NAMES and splits["dev"].source == str(tmp_path / "saved" / "validation")
    first = dd["train"][0]
    assert (splits["train"].examples[0].text, splits["train"].examples[0].label) == (
        first["sentence"],
        NAMES[first["label"]],
    )
    assert {e.label for e in splits["test"].examples} == {None} and data_label(cfg) == "saved"
    assert data_label(FtDataConfig(source="datasets", dir="runs/x/inputs/0")) == "inputs/0"  # saved by the API
    with pytest.raises(LMForgeError, match=r"saved/train: no column 'text' \(columns: sentence, label\)$"):
        load_splits(FtDataConfig(source="datasets", dir=str(tmp_path / "saved")))
    with pytest.raises(LMForgeError, match=r"^.*saved: a save_to_disk dataset, not a labelled-set dir: use "):
        load_splits(FtDataConfig(source="dir", dir=str(tmp_path / "saved")))
    with pytest.raises(LMForgeError, match=r"^data.source=datasets needs --data.dir \(a save_to_disk dir or hf:"):
        load_splits(FtDataConfig(source="datasets"))


def test_one_dataset_plain_labels_floats_and_tags(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rows = {"t": [f"text {i}" for i in range(10)], "y": ["b", "a"] * 4 + ["c", "a"], "s": [i / 2 for i in range(10)]}
    datasets.Dataset.from_dict(rows).save_to_disk(tmp_path / "one")
    splits = load_splits(FtDataConfig(source="datasets", dir=str(tmp_path / "one"), text_field="t", label_field="y"))
    assert len(splits["train"].examples) == 9 and splits["dev"].source.endswith("one (held-out 10%)")
    assert splits["train"].labels is None and splits["train"].examples[0].label == "b"  # the run finds the set
    assert "warning: label 'c' occurs 1 time" in capsys.readouterr().err  # no ClassLabel: typos are warned about
    declared = FtDataConfig(source="datasets", dir=str(tmp_path / "one"), text_field="t", label_field="y")
    declared.labels = ["a", "b"]
    with pytest.raises(LMForgeError, match=r"one: example 9: label 'c' is not in data.labels \(a, b\)$"):
        load_splits(declared)
    scores = load_splits(FtDataConfig(source="datasets", dir=str(tmp_path / "one"), text_field="t", label_field="s"))
    assert scores["train"].task_type == "regression" and scores["train"].examples[3].label == 1.5
    tag = datasets.ClassLabel(names=["O", "B-PER"])
    tags = datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")), "ner": datasets.Sequence(tag)})
    datasets.Dataset.from_dict({"tokens": [["Ann", "ran"]] * 10, "ner": [[1, 0]] * 10}, features=tags).save_to_disk(
        tmp_path / "tags"
    )
    tagged = load_splits(
        FtDataConfig(source="datasets", dir=str(tmp_path / "tags"), text_field="tokens", label_field="ner")
    )
    ex = tagged["train"].examples[0]
    assert tagged["train"].labels == ["O", "B-PER"] and (ex.tokens, ex.tags) == (["Ann", "ran"], ["B-PER", "O"])
    short = {"tokens": [["Ann", "ran"], ["Bo", "sat"]], "ner": [[1, 0], [1]]}
    datasets.Dataset.from_dict(short, features=tags).save_to_disk(tmp_path / "short")
    with pytest.raises(LMForgeError, match=r"short: row 1: 2 tokens but 1 tags$"):
        load_splits(
            FtDataConfig(source="datasets", dir=str(tmp_path / "short"), text_field="tokens", label_field="ner")
        )
    datasets.Dataset.from_dict({"text": ["a", None], "label": ["x", "y"]}).save_to_disk(tmp_path / "null")
    with pytest.raises(LMForgeError, match=r"null: row 1: column 'text' is null$"):
        load_splits(FtDataConfig(source="datasets", dir=str(tmp_path / "null")))


def test_hf_name_is_read_offline_from_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    cfg = FtDataConfig(source="datasets", dir="hf:nobody/absent")
    assert data_label(cfg) == "nobody/absent"
    with pytest.raises(
        LMForgeError, match=r"^hf:nobody/absent: not in the local Hugging Face datasets cache .*offline"
    ):
        load_splits(cfg)
    local = tmp_path / "csvset"  # load_dataset reads a dir of data files offline as well: NAME may be one
    local.mkdir()
    (local / "train.csv").write_text("text,label\ngood film,pos\nbad film,neg\nfine,pos\nawful,neg\n")
    (local / "test.csv").write_text("text,label\ndull,neg\n")
    splits = load_splits(FtDataConfig(source="datasets", dir=f"hf:{local}"))
    assert splits["test"].source == f"hf:{local}::test" and [e.label for e in splits["test"].examples] == ["neg"]
    assert [(e.text, e.label) for e in splits["train"].examples] == [("good film", "pos"), ("bad film", "neg"),
                                                                      ("fine", "pos")]  # fmt: skip


def test_finetune_on_a_live_dataset_dict_saves_it_into_the_run(tmp_path: Path) -> None:
    """`lmforge.finetune(..., data={"dir": DatasetDict})`: the dict is written to RUN/inputs/0, the saved config
    names it as a `datasets` source, and the run trains and evaluates on its splits with the ClassLabel names."""
    run = tmp_path / "run"
    result = lmforge.finetune(
        "sst2-gpt", init="none", model={"preset": "gpt-tiny", "vocab_size": 300},
        train={"max_steps": 3, "lr": 3e-3, "batch_size": 8}, data={"dir": _sentiment_dict(), "text_field": "sentence"},
        run={"dir": str(run)},
    )  # fmt: skip
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["data"]["source"] == "datasets" and saved["data"]["dir"] == str(run / "inputs" / "0")
    assert (run / "inputs" / "0" / "dataset_dict.json").is_file()
    task, _, _, _ = load_finetuned(run)
    assert task.labels == NAMES
    metrics = json.loads((run / "eval.json").read_text())
    assert metrics == result.metrics and 0.0 <= metrics["accuracy"] <= 1.0
    assert (run / "eval_test.json").is_file()


def test_pretrain_on_a_live_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """`lmforge.pretrain(..., {"data.inputs": [ds]})`: the Dataset is saved to RUN/inputs/0 and read from there."""
    monkeypatch.setenv("LMFORGE_TOKENIZER_CACHE", str(tmp_path / "tok-cache"))
    ds = datasets.Dataset.from_dict({"content": [e.text for e in T.sentiment(60, seed=2).examples]})
    run = tmp_path / "run"
    over = {"data.inputs": [ds], "data.text_field": "content", "data.vocab_size": 300, "model.preset": "gpt-tiny",
            "train.max_steps": 1, "train.batch_size": 2, "train.seq_len": 16, "sample.prompts": []}  # fmt: skip
    lmforge.pretrain("gpt", over, run={"dir": str(run)})  # as docs/data.md shows it
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["data"]["inputs"] == [str(run / "inputs" / "0")]
    assert datasets.load_from_disk(str(run / "inputs" / "0"))["content"] == ds["content"]
    meta = json.loads((run / "data" / "meta.json").read_text())
    assert meta["sources"] == [str(run / "inputs" / "0")] and meta["train"]["n_docs"] + meta["val"]["n_docs"] == 60
    more = {**over, "data.inputs": [ds.select(range(10))], "train.max_steps": 2}
    capsys.readouterr()
    assert lmforge.pretrain("gpt", more, run={"dir": str(run)}, resume=True).metrics
    assert "at step 1" in capsys.readouterr().err and (run / "checkpoints" / "step_2").is_dir()  # resumed ...
    assert (
        datasets.load_from_disk(str(run / "inputs" / "0"))["content"] == ds["content"]
    )  # ... on the copy it began with
    with pytest.raises(LMForgeError, match=r"^data.inputs: a streamed IterableDataset cannot be saved with the run; "):
        lmforge.pretrain("gpt", {**over, "data.inputs": [ds.to_iterable_dataset()]}, run={"dir": str(tmp_path / "x")})
    assert not (tmp_path / "x").exists()


def test_documented_finetune_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """docs/data.md: `lmforge finetune sst2-gpt --data.source=datasets --data.dir=my_saved_dataset
    --data.text_field=sentence` (with a tiny model and a few steps)."""
    from lmforge.cli import main

    monkeypatch.chdir(tmp_path)
    _sentiment_dict().save_to_disk("my_saved_dataset")
    args = ["finetune", "sst2-gpt", "--data.source=datasets", "--data.dir=my_saved_dataset",
            "--data.text_field=sentence"]  # fmt: skip
    tiny = ["--model.preset=gpt-tiny", "--model.vocab_size=300", "--train.max_steps=2", "--run.dir=run"]
    assert main([*args, *tiny]) == 0
    out = capsys.readouterr().out
    assert "on classification (datasets my_saved_dataset): train 20, dev 20, test 20;" in out
    assert set(json.loads(Path("run/eval.json").read_text())) >= {"accuracy"}
