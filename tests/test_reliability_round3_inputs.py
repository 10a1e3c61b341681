"""One clear line for more bad inputs: names in an experiment or sweep file that would lead a run out of its dir,
lone surrogates (JSON `\\ud800` escapes: a str no UTF-8 encoder takes) and JSON nested 200,000 levels deep in every
reader of user files, and prepared token shards whose ids or document index do not fit the run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_reliability_inputs import TINY, cli, labelled_set, one_error_line, pretrain

from lmforge.cli import main
from lmforge.data.corpus.bundled import load_default_corpus
from lmforge.data.corpus.prepare import prepare
from lmforge.errors import LMForgeError
from lmforge.experiments.spec import load_experiment
from lmforge.tokenizers import train_tokenizer

pytestmark = pytest.mark.usefixtures("torch_globals")

LONE = '"caf\\ud800 au lait"'
"""A JSON string whose escape decodes to a lone surrogate: json.loads gives 'caf\\ud800 au lait'."""
DEEP = "[" * 200_000 + "]" * 200_000
"""A JSON document nested 200,000 levels deep (json.loads: RecursionError)."""


def tree(root: Path) -> set[Path]:
    """Every path under root."""
    return set(root.rglob("*"))


# --- 2: names that become path components ------------------------------------------------------------------------


FT = {"model.preset": "gpt-tiny", "train.max_steps": 1, "train.batch_size": 2, "data.max_train": 4,
      "data.max_eval": 4}  # fmt: skip
PT = {"recipe": "gpt", "overrides": {"model.preset": "gpt-tiny", "train.batch_size": 2, "train.seq_len": 16,
                                     "train.warmup_steps": 0, "sample.prompts": []}}  # fmt: skip
UP = "../../../../outside"


RULE = "must be letters, digits, '.', '_', '+', '=' or '-'"


def experiment_file(case: str) -> tuple[dict, str]:
    """(experiment file contents, its error line) for a name that would lead a run out of the experiment dir."""
    if case == "task":
        ft = {"tasks": [{"name": UP, "recipe": "sst2-gpt"}], "arms": [{"name": "x", "init": "none"}], "overrides": FT}
        return {"finetune": ft}, f"error: finetune.tasks: task name '{UP}' {RULE}"
    ev = [{"name": UP, "task": "sentiment-zeroshot", "overrides": {"data.max_eval": 4}}]
    return {"pretrain": {**PT, "arms": ["a"]}, "budget": {"steps": 1}, "eval": ev}, f"error: eval: name '{UP}' {RULE}"


@pytest.mark.parametrize("case", ["task", "eval"])
def test_a_name_leading_out_of_the_experiment_dir_is_refused_before_any_work(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "a" / "b" / "c" / "exp"  # UP from OUT/finetune/<task> or OUT/eval/<name> lands in tmp_path/a
    data, expected = experiment_file(case)
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({"out": str(out), **data}, sort_keys=False), encoding="utf-8")
    before = tree(tmp_path)
    assert one_error_line(capsys, "experiment", str(path)) == expected
    assert tree(tmp_path) == before  # nothing written, in the experiment dir or out of it


def test_names_made_from_a_recipe_or_task_path_stay_in_the_experiment_dir(tmp_path):
    """An arm or evaluation without a name takes its recipe's or task's: of a path, its file name's stem."""
    data = {"out": str(tmp_path / "exp"), "pretrain": {**PT, "recipe": f"{UP}/my-gpt.yaml"}, "budget": {"steps": 1},
            "eval": [{"task": f"{UP}/zs.yaml"}]}  # fmt: skip
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    exp = load_experiment(path)
    assert [a.name for a in exp.arms] == ["my-gpt"] and [e.name for e in exp.evals] == ["zs"]
    assert exp.arms[0].recipe is None and exp.recipe == f"{UP}/my-gpt.yaml" and exp.evals[0].task == f"{UP}/zs.yaml"


def test_a_sweep_size_name_leading_out_of_the_sweep_dir_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sweep = {"recipe": "gpt", "out": str(tmp_path / "a" / "sweep"), "tokens": [512],
             "sizes": [{"name": UP, "preset": "gpt-tiny"}],
             "overrides": {"train.batch_size": 2, "train.seq_len": 16, "train.warmup_steps": 0}}  # fmt: skip
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep), encoding="utf-8")
    before = tree(tmp_path)
    assert one_error_line(capsys, "scaling", str(path)) == f"error: {path}: sizes: name '{UP}' {RULE}"
    assert tree(tmp_path) == before


# --- 13: lone surrogates -----------------------------------------------------------------------------------------


def corpus_with(path: Path, bad_line: str, n_docs: int = 6) -> Path:
    """A JSONL corpus of the first n_docs bundled documents with `bad_line` as its line 2."""
    lines = [json.dumps({"text": t}) for t in load_default_corpus()[:n_docs]]
    lines.insert(1, bad_line)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A cache of this test's own (tokenizers trained and shards prepared here are not kept for later tests)."""
    monkeypatch.setenv("LMFORGE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def prepared(prepared_docs) -> tuple[Path, Path]:
    """A 512-token GPT BPE tokenizer and shards of 24 bundled documents."""
    return prepared_docs(24)


@pytest.fixture(scope="module")
def lm_run(prepared, tmp_path_factory) -> Path:
    """A pretrained gpt-tiny run (one step) on `prepared`."""
    run = tmp_path_factory.mktemp("lm") / "run"
    assert main(pretrain(prepared, run, "--train.max_steps=1", "--quiet")) == 0
    return run


@pytest.fixture(scope="module")
def classifier_run(tmp_path_factory) -> Path:
    """A gpt-tiny text classifier fine-tuned for one step on a four-example labelled set."""
    root = tmp_path_factory.mktemp("ft")
    d = labelled_set(root / "set", [("a fine day", "pos"), ("a dull day", "neg")] * 2)
    run = root / "run"
    args = ["finetune", "--init", "gpt-tiny", "--data.source=dir", f"--data.dir={d}", "--model.vocab_size=262",
            f"--run.dir={run}", "--train.max_steps=1", "--train.batch_size=2", "--quiet"]  # fmt: skip
    assert main(args) == 0
    return run


LONE_TEXT = '{"text": "caf\\ud800 au lait, and then the bells rang out over the town."}'
LONE_REFUSED = r"not UTF-8 text (\ud800 is a lone surrogate: half of a UTF-16 pair, no character)"


def test_a_lone_surrogate_in_a_pretraining_corpus_is_replaced_and_counted(tmp_path, capsys, cache):
    docs = corpus_with(tmp_path / "docs.jsonl", LONE_TEXT)
    run = tmp_path / "run"
    rc, _, err = cli(capsys, "pretrain", "gpt", f"--run.dir={run}", *TINY, f"--data.inputs=[{docs}]",
                     "--data.vocab_size=400", "--train.max_steps=1")  # fmt: skip
    assert rc == 0, err
    assert "warning: 1 bytes of the input are not valid UTF-8 and were replaced with U+FFFD" in err.splitlines()
    rc, out, err = cli(capsys, "data", "prepare", str(docs), "--out", str(tmp_path / "prep"), "--tokenizer",
                       str(run / "tokenizer"))  # fmt: skip
    assert rc == 0, err
    assert "  replaced non-UTF-8 bytes: 1" in out.splitlines()


def test_a_lone_surrogate_in_tokenizer_training_text_is_replaced(tmp_path, capsys, cache):
    from lmforge.data.corpus.text_files import iter_texts

    docs = corpus_with(tmp_path / "docs.jsonl", LONE_TEXT)
    assert list(iter_texts(docs))[1].startswith("caf\ufffd au lait")
    rc, _, err = cli(capsys, "tokenizer", "train", str(docs), "--out", str(tmp_path / "tok"), "--vocab-size", "300")
    assert rc == 0, err
    assert (tmp_path / "tok" / "tokenizer.json").is_file()


def test_a_lone_surrogate_in_eval_text_is_replaced_and_counted(lm_run, tmp_path, capsys):
    docs = corpus_with(tmp_path / "docs.jsonl", LONE_TEXT, n_docs=2)
    rc, out, err = cli(capsys, "eval", str(lm_run), "--text", str(docs))
    assert rc == 0, err
    assert f"warning: {docs}: 1 bytes are not valid UTF-8 and were replaced with U+FFFD" in err.splitlines()
    assert f"{docs}: 3 document(s)" in out


def test_a_lone_surrogate_in_a_labelled_set_names_file_and_line(tmp_path, capsys):
    from lmforge.align.data import read_instructions
    from lmforge.data.labelled.readers import read_json

    d = labelled_set(tmp_path / "set", [("fine", "pos")])
    with open(d / "train.jsonl", "a", encoding="utf-8") as f:
        f.write('{"text": "caf\\ud800 au lait", "label": "neg"}\n')
    line = one_error_line(capsys, "finetune", "--init", "gpt-tiny", f"--run.dir={tmp_path / 'ft'}",
                          "--data.source=dir", f"--data.dir={d}", "--model.vocab_size=280")  # fmt: skip
    assert line == f"error: {d / 'train.jsonl'}:2: {LONE_REFUSED}"
    sft = tmp_path / "sft.jsonl"  # alignment data: the same reader
    sft.write_text('{"instruction": "Say hi", "output": "hi"}\n{"instruction": "\\udfff", "output": "x"}\n')
    with pytest.raises(LMForgeError) as e:
        read_instructions(sft)
    assert str(e.value) == f"{sft}:2: " + LONE_REFUSED.replace("ud800", "udfff")
    doc = tmp_path / "doc.json"  # a whole JSON document: the line of the escape; a pair is one character
    doc.write_text('{"a": "\\ud83d\\ude00",\n "b": "\\\\ud800",\n "c": ["x", "\\ud83d"]}\n')
    with pytest.raises(LMForgeError) as e:
        read_json(doc)
    assert str(e.value) == f"{doc}:3: " + LONE_REFUSED.replace("ud800", "ud83d")


def test_a_lone_surrogate_in_predict_inputs_names_file_and_line(classifier_run, tmp_path, capsys):
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('{"text": "a fine day"}\n"caf\\ud800 au lait"\n')
    line = one_error_line(capsys, "predict", str(classifier_run), "--input", str(inputs))
    assert line == f"error: {inputs}:2: {LONE_REFUSED}"
    # A --text whose bytes are not UTF-8 reaches Python as lone surrogates (surrogateescape) too.
    line = one_error_line(capsys, "predict", str(classifier_run), "--text", "fine", "--text", "caf\udce9")
    assert line == r"error: --text 2: not UTF-8 text (\udce9 is a lone surrogate: half of a UTF-16 pair, no character)"


# --- 14: JSON nested too deeply ---------------------------------------------------------------------------------


TOO_DEEP = "nested too deeply: 200000 levels"


def test_json_nested_too_deeply_in_a_corpus_names_file_and_line(tmp_path, capsys, cache, prepared):
    tok = prepared[0]
    docs = corpus_with(tmp_path / "docs.jsonl", DEEP)
    line = one_error_line(capsys, "data", "prepare", str(docs), "--out", str(tmp_path / "prep"), "--tokenizer",
                          str(tok))  # fmt: skip
    assert line == f"error: {docs}:2: malformed JSON ({TOO_DEEP}, column 200000)"
    assert not (tmp_path / "prep").exists()
    line = one_error_line(capsys, "tokenizer", "train", str(docs), "--out", str(tmp_path / "tok"))
    assert line == f"error: {docs}:2: invalid JSON ({TOO_DEEP})"
    deep_object = '{"text": "x", "meta": ' + '{"a": ' * 200_000 + "1" + "}" * 200_001
    docs = corpus_with(tmp_path / "docs2.jsonl", deep_object)
    line = one_error_line(capsys, "pretrain", "gpt", f"--run.dir={tmp_path / 'run'}", *TINY,
                          f"--data.inputs=[{docs}]", "--data.vocab_size=300")  # fmt: skip
    assert line == f"error: {docs}:2: malformed JSON (nested too deeply: 200001 levels, column 1200017)"


def test_json_nested_too_deeply_in_labelled_and_alignment_data_names_file_and_line(tmp_path, capsys):
    from lmforge.align.data import read_preferences

    d = labelled_set(tmp_path / "set", [("fine", "pos")])
    with open(d / "train.jsonl", "a", encoding="utf-8") as f:
        f.write(DEEP + "\n")
    args = ["finetune", "--init", "gpt-tiny", f"--run.dir={tmp_path / 'ft'}", "--data.source=dir", f"--data.dir={d}"]
    line = one_error_line(capsys, *args)
    assert line == f"error: {d / 'train.jsonl'}:2: invalid JSON ({TOO_DEEP} at column 200000)"
    (d / "meta.json").write_text('{"labels":\n' + DEEP + "}")  # a whole JSON document: its line
    line = one_error_line(capsys, *args)
    assert line == f"error: {d / 'meta.json'}:2: invalid JSON (nested too deeply: 200001 levels at column 200000)"
    prefs = tmp_path / "prefs.jsonl"
    prefs.write_text(DEEP + "\n")
    with pytest.raises(LMForgeError) as e:
        read_preferences(prefs)
    assert str(e.value) == f"{prefs}:1: invalid JSON ({TOO_DEEP} at column 200000)"


def test_json_nested_too_deeply_in_predict_inputs_names_file_and_line(classifier_run, tmp_path, capsys):
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('"a fine day"\n' + DEEP + "\n")
    line = one_error_line(capsys, "predict", str(classifier_run), "--input", str(inputs))
    assert line == f"error: {inputs}:2: not valid JSON ({TOO_DEEP})"


def test_json_nested_too_deeply_in_prepared_data_or_tokenizer_files_is_one_line(tmp_path, capsys, prepared):
    tok, data = prepared
    bad_data, bad_tok = tmp_path / "data", tmp_path / "tok"
    shutil.copytree(data, bad_data)
    shutil.copytree(tok, bad_tok)
    (bad_data / "meta.json").write_text(DEEP)
    line = one_error_line(capsys, *pretrain((tok, bad_data), tmp_path / "run"))
    assert line == f"error: {bad_data / 'meta.json'}: malformed JSON ({TOO_DEEP}, line 1)"
    (bad_tok / "lmforge_tokenizer.json").write_text(DEEP)
    line = one_error_line(capsys, *pretrain((bad_tok, data), tmp_path / "run"))
    assert line.startswith(f"error: cannot load tokenizer: {bad_tok / 'lmforge_tokenizer.json'} is not valid JSON "
                           f"({TOO_DEEP}: line 1 column 200000")  # fmt: skip


def test_json_nested_too_deeply_in_a_run_an_experiment_reads_is_not_a_result(tmp_path):
    from lmforge.experiments.arms import Arm, arm_final
    from lmforge.train.metrics import read_metrics

    run = tmp_path / "ft"
    run.mkdir()
    (run / "eval.json").write_text(DEEP)
    assert arm_final(Arm("finetune/s/x-s0", run, "sst2-gpt", {}, kind="finetune")) is None  # run again, not a crash
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n' + DEEP + '\n{"step": 2, "loss": 1.0}\n')
    with pytest.raises(LMForgeError) as e:
        read_metrics(run)
    assert str(e.value) == f"{run / 'metrics.jsonl'}:2: not valid JSON"


# --- 18: prepared shards that do not fit the run ---------------------------------------------------------------


def test_token_ids_beyond_the_model_vocabulary_are_refused_naming_the_file(tmp_path, capsys, prepared):
    tok, data = prepared
    bad = tmp_path / "data"
    shutil.copytree(data, bad)
    meta = json.loads((bad / "meta.json").read_text())
    tokens = np.memmap(bad / "train.bin", dtype=meta["dtype"], mode="r+")
    tokens[1234] = 600  # model.vocab_size is 512
    tokens.flush()
    del tokens
    line = one_error_line(capsys, *pretrain((tok, bad), tmp_path / "run"))
    assert line == (
        f"error: {bad / 'train.bin'}: token id 600 at position 1234 is not below model.vocab_size=512 (the shards "
        "were made with a larger vocabulary, or are damaged: prepare them again)"
    )
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.fixture(scope="module")
def bert_data(tmp_path_factory) -> tuple[Path, Path]:
    """A 512-token BERT WordPiece tokenizer and shards of 24 bundled documents."""
    d = tmp_path_factory.mktemp("bert")
    tok = train_tokenizer(load_default_corpus()[:24], "wordpiece", 512, family="bert")
    tok.save(d / "tok")
    docs = d / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in load_default_corpus()[:24]), encoding="utf-8")
    prepare([docs], d / "data", tok, val_fraction=0.1)
    return d / "tok", d / "data"


def save(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as f:  # np.save(name) would add .npy to it
        np.save(f, array)


def damage_index(path: Path, how: str) -> str:
    """Write a damaged document index at path; return what the error line says of it."""
    starts = np.load(path)
    if how == "not_npy":
        path.write_bytes(b"garbage, not an index")
        return "not a document index (cannot read it as a .npy array: it is not in .npy format)"
    if how == "float":
        save(path, starts.astype(np.float32))
        return "not a document index (dtype float32, expected integers)"
    if how == "count":
        save(path, starts[:-1])
        return f"holds {len(starts) - 1} document starts, meta.json says {len(starts)} documents"
    if how == "order":
        starts[[3, 4]] = starts[[4, 3]]
        save(path, starts)
        return f"document starts are not increasing (entry 4: {starts[4]} after {starts[3]})"
    assert how == "beyond"
    starts[-1] = 10**9
    save(path, starts)
    return f"document start {10**9} (entry {len(starts) - 1}) is beyond the split's "


@pytest.mark.parametrize("objective", ["albert", "bert"])
@pytest.mark.parametrize("how", ["not_npy", "float", "count", "order", "beyond"])
def test_a_damaged_document_index_is_refused_naming_the_file(objective, how, bert_data, tmp_path, capsys):
    tok, data = bert_data
    bad = tmp_path / "data"
    shutil.copytree(data, bad)
    what = damage_index(bad / "train.idx", how)
    args = ["pretrain", objective, f"--run.dir={tmp_path / 'run'}", f"--data.tokenizer={tok}",
            f"--data.prepared={bad}", f"--model.preset={objective}-tiny", "--model.vocab_size=512",
            "--train.batch_size=2", "--train.seq_len=32", "--train.warmup_steps=0", "--train.max_steps=1"]  # fmt: skip
    line = one_error_line(capsys, *args)
    assert line.startswith(f"error: {bad / 'train.idx'}: {what}"), line
    assert line.endswith("(prepare the data again)")
