"""Fine-tuned runs leave whole: `lmforge convert FT_RUN --to hf` writes the transformers task model (head, labels,
framing tokenizer) whose predictions equal `lmforge predict`'s; a LoRA run loads in peft with equal logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tasks_testing as T
import torch
from transformers import (
    AutoModelForQuestionAnswering,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
)

import lmforge
from lmforge.cli import main
from lmforge.data.labelled.examples import Dataset, Example
from lmforge.errors import LMForgeError
from lmforge.loading import load_finetuned
from lmforge.registry import TASKS
from lmforge.tasks.hf_export import save_hf_dir, task_to_hf
from lmforge.tasks.inputs import collate
from lmforge.tasks.tagging import first_subtokens

TEXTS = ["a truly wonderful and delightful film", "dull, tedious and awful", "it was fine"]
SMALL = {"max_train": 64, "max_eval": 16}


def _finetune(root, recipe: str, preset: str, name: str, **sections) -> str:
    """A short fine-tuning run from scratch in root/name (made once per module)."""
    run = root / name
    if (run / "eval.json").is_file():
        return str(run)
    model = {"preset": preset, "vocab_size": 300, **sections.pop("model", {})}
    train = {"max_steps": 4, "lr": 3e-3, **sections.pop("train", {})}
    lmforge.finetune(recipe, init="none", model=model, train=train, run={"dir": str(run)},
                     data=sections.pop("data", SMALL), **sections)  # fmt: skip
    return str(run)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tmp_path_factory.mktemp("ft")


def _convert(run: str, out, *flags: str) -> None:
    assert main(["convert", run, "--to", "hf", "--out", str(out), *flags]) == 0


def _predict(run: str, capsys, *args: str) -> list[dict]:
    capsys.readouterr()
    assert main(["predict", run, "--json", *args]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def _loaded(auto, path):
    model, info = auto.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info  # every tensor named as transformers does
    return model.eval()


def _text_args(texts=TEXTS) -> list[str]:
    return [a for t in texts for a in ("--text", t)]


@pytest.mark.parametrize("recipe,preset", [("sst2-gpt", "gpt-tiny"), ("sst2-bert", "bert-tiny")])
def test_classifier_predicts_the_same_in_transformers(runs, tmp_path, capsys, recipe, preset):
    run = _finetune(runs, recipe, preset, recipe)
    _convert(run, tmp_path / "hf")
    ours = _predict(run, capsys, *_text_args())
    hf, tok = (
        _loaded(AutoModelForSequenceClassification, tmp_path / "hf"),
        AutoTokenizer.from_pretrained(tmp_path / "hf"),
    )
    task, tuned, _, _ = load_finetuned(run)
    feats = task.features(Dataset([Example(text=t) for t in TEXTS]))
    enc = tok(TEXTS, return_tensors="pt", padding=True)  # a padded batch: GPT-2 pools the last non-pad token
    assert [row[row != tok.pad_token_id].tolist() for row in enc["input_ids"]][0] == feats[0]["input_ids"][0]
    with torch.no_grad():
        logits = hf(**enc).logits
        torch.testing.assert_close(logits, tuned(collate(feats, task.pad_id)).logits, rtol=1e-4, atol=1e-5)
    assert [hf.config.id2label[i] for i in logits.argmax(-1).tolist()] == [o["prediction"] for o in ours]
    assert sorted(hf.config.label2id) == ["negative", "positive"]
    probs = logits.softmax(-1)[:, hf.config.label2id["positive"]]
    torch.testing.assert_close(probs, torch.tensor([o["scores"]["positive"] for o in ours]), rtol=1e-4, atol=1e-5)


def test_loaded_run_predicts_and_still_generates(runs, capsys):
    run = _finetune(runs, "sst2-gpt", "gpt-tiny", "sst2-gpt")
    model, tok = lmforge.load(run)
    assert isinstance(model, lmforge.models.Transformer) and model.labels == ["negative", "positive"]
    assert [p["prediction"] for p in model.predict(TEXTS)] == [
        o["prediction"] for o in _predict(run, capsys, *_text_args())
    ]
    ids = torch.tensor([tok.encode("It was")])
    assert model(ids).logits.shape[-1] == model.config.vocab_size  # still the LM it was
    model.to(torch.float64)  # the head follows the backbone
    assert model.predict(TEXTS[0])[0]["prediction"] in ("negative", "positive")


def test_tagger_tags_the_same_words_in_transformers(runs, tmp_path, capsys):
    conll = str(Path(__file__).parent / "fixtures" / "allennlp" / "conll2003.txt")
    data = {"source": "conll2003", "train": conll, "dev": conll}
    run = _finetune(runs, "sst2-bert", "bert-tiny", "tagger", task={"type": "token_tagging"}, data=data,
                    model={"vocab_size": 45})  # fmt: skip
    _convert(run, tmp_path / "hf")
    sentence = "U.N. official Ekeus lives in Seattle"
    ours = _predict(run, capsys, "--text", sentence)[0]
    hf, tok = _loaded(AutoModelForTokenClassification, tmp_path / "hf"), AutoTokenizer.from_pretrained(tmp_path / "hf")
    enc = tok(sentence, return_offsets_mapping=True, return_tensors="pt")
    offsets = [tuple(o) for o in enc.pop("offset_mapping")[0].tolist()]
    with torch.no_grad():
        tags = hf(**enc).logits[0].argmax(-1).tolist()
    first = first_subtokens(sentence.split(), [(s, e) if e > s else (0, 0) for s, e in offsets])
    assert ours["tokens"] == sentence.split()
    assert [hf.config.id2label[tags[t]] for t in first] == ours["prediction"]
    assert set(hf.config.id2label.values()) >= {"O", "B-PER", "B-ORG"}


def test_t5_run_generates_the_same_text_in_transformers(runs, tmp_path, capsys):
    pairs = tmp_path / "pairs.jsonl"
    rows = [{"text": t, "target": t.split()[-1]} for t in T.TEXTS[:12]]
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    data = {"source": "table", "train": str(pairs), "dev": str(pairs), "target_field": "target"}
    task = {"type": "seq2seq", "template": "last word: {text}", "num_beams": 3, "max_new_tokens": 6}
    run = _finetune(runs, "translate-t5", "t5-tiny", "t5", data=data, task=task, train={"max_steps": 6})
    _convert(run, tmp_path / "hf")
    ours = [o["prediction"] for o in _predict(run, capsys, *_text_args(T.TEXTS[:2]))]
    hf, tok = _loaded(AutoModelForSeq2SeqLM, tmp_path / "hf"), AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert hf.config.prefix == "last word: " and hf.generation_config.num_beams == 3
    enc = tok([hf.config.prefix + t for t in T.TEXTS[:2]], return_tensors="pt", padding=True)
    with torch.no_grad():
        out = hf.generate(**enc)
    assert [t.strip() for t in tok.batch_decode(out, skip_special_tokens=True)] == ours


def _peft_logits(path, enc):
    from peft import PeftModel

    base = _loaded(AutoModelForSequenceClassification, path / "base")
    with torch.no_grad():
        plain = base(**enc).logits
        tuned = PeftModel.from_pretrained(base, path).eval()(**enc).logits
    return plain, tuned


@pytest.mark.parametrize("recipe,preset", [("sst2-gpt", "gpt-tiny"), ("sst2-bert", "bert-tiny")])
def test_lora_run_loads_in_peft_with_equal_logits(runs, tmp_path, recipe, preset):
    pytest.importorskip("peft")
    run = _finetune(runs, recipe, preset, f"{recipe}-lora", peft={"method": "lora", "rank": 4},
                    train={"lr": 3e-2})  # fmt: skip
    _convert(run, tmp_path / "adapter")
    _convert(run, tmp_path / "merged", "--merge")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["task_type"] == "SEQ_CLS"
    task, tuned, _, _ = load_finetuned(run)
    feats = task.features(Dataset([Example(text=t) for t in TEXTS]))
    with torch.no_grad():
        ours = tuned(collate(feats, task.pad_id)).logits
    enc = AutoTokenizer.from_pretrained(tmp_path / "adapter")(TEXTS, return_tensors="pt", padding=True)
    plain, adapted = _peft_logits(tmp_path / "adapter", enc)
    torch.testing.assert_close(adapted, ours, rtol=1e-4, atol=1e-5)
    assert (plain - ours).abs().max() > 1e-3  # the adapter is what makes the difference
    with torch.no_grad():
        merged = _loaded(AutoModelForSequenceClassification, tmp_path / "merged")(**enc).logits
    torch.testing.assert_close(merged, ours, rtol=1e-4, atol=1e-5)


def _task_model(name: str, family: str, preset: str, labels, **options):
    tok = T.tokenizer(family)
    cls = TASKS.get(name)
    task = cls(cls.Options(head_dropout=0.0, **options), tok, labels)
    return task, task.build(T.model(preset, tok, seed=1)).eval()


def test_span_qa_head_exports_as_question_answering(tmp_path):
    task, model = _task_model("span_qa", "bert", "bert-tiny", None, max_len=48)
    torch.nn.init.normal_(model.head.out.bias)
    save_hf_dir(task_to_hf(task, model), tmp_path)
    hf = _loaded(AutoModelForQuestionAnswering, tmp_path)
    ex = Example(text="who wrote it?", context="It was written by a single man in the winter.", answers=[])
    batch = collate(task.features(Dataset([ex])), task.pad_id)
    batch.pop("start_positions"), batch.pop("end_positions")
    with torch.no_grad():
        start, end = model(batch).logits
        out = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                 token_type_ids=batch["token_type_ids"])  # fmt: skip
    torch.testing.assert_close((out.start_logits, out.end_logits), (start, end), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "case,message",
    [
        (("classification", "t5", "t5-tiny", ["a", "b"]), "T5ForSequenceClassification reads the decoder's EOS"),
        (("pair_classification", "gpt", "gpt-tiny", ["a", "b"], {"symmetric": True}), "summed orderings"),
        (("classification", "bart", "bart-tiny", ["a", "b"]), "does not read the final EOS it pools"),
    ],
)
def test_heads_transformers_lacks_are_refused_in_one_line(case, message):
    name, family, preset, labels, *options = case
    task, model = _task_model(name, family, preset, labels, **(options[0] if options else {}))
    with pytest.raises(LMForgeError, match=message):
        task_to_hf(task, model)


def test_predict_refuses_bad_input_in_one_line(runs, tmp_path, capsys):
    run = _finetune(runs, "sst2-gpt", "gpt-tiny", "sst2-gpt")
    bad = tmp_path / "in.jsonl"
    bad.write_text('{"text": "fine"}\n[1, 2]\n', encoding="utf-8")
    cases = [
        (["predict", run, "--input", str(bad)], f"error: {bad}:2: expected an object or a string, got list"),
        (["predict", run], "error: nothing to predict: give --text TEXT (repeatable) or --input FILE"),
        (["predict", run, "--text", "a", "--text-pair", "b", "--text-pair", "c"],
         "error: 2 --text-pair for 1 --text: give one pair per text"),
        (["predict", str(tmp_path), "--text", "a"],
         f"error: {tmp_path} is not a fine-tuned run: lmforge predict needs one (lmforge generate continues text)"),
        (["convert", str(tmp_path), "--to", "hf", "--out", str(tmp_path / "o"), "--merge"],
         f"error: --merge applies to a fine-tuned LoRA run converted to hf, and {tmp_path} is none"),
    ]  # fmt: skip
    for argv, line in cases:
        capsys.readouterr()
        assert main(argv) != 0
        assert capsys.readouterr().err.strip() == line


def test_predict_reads_a_file_of_texts(runs, tmp_path, capsys):
    run = _finetune(runs, "sst2-gpt", "gpt-tiny", "sst2-gpt")
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["predict", run, "--input", str(tmp_path / "in.txt")]) == 0
    plain = capsys.readouterr().out.splitlines()
    assert plain == [o["prediction"] for o in _predict(run, capsys, *_text_args())]


DOC = Path(__file__).resolve().parent.parent / "docs" / "finetuned-export.md"


def test_the_documented_commands_run(tmp_path, monkeypatch, capsys):
    import re
    import shlex

    text = DOC.read_text(encoding="utf-8")
    commands = [shlex.split(line) for line in re.findall(r"```bash\n(.*?)```", text, re.S)[0].splitlines()]
    monkeypatch.chdir(tmp_path)
    for cmd in commands:
        assert cmd[0] == "lmforge"
        fewer = ["--train.max_steps=3", "--data.max_eval=16"] if cmd[1] == "finetune" else []
        capsys.readouterr()
        assert main([a for a in cmd[1:] if not a.startswith("--train.max_steps")] + fewer) == 0, cmd
        out = capsys.readouterr().out
        if cmd[1] == "predict" and "--json" not in cmd:
            assert set(out.split()) <= {"negative", "positive"} and len(out.split()) == 2
    assert (tmp_path / "hf/sst2-lora/adapter_config.json").is_file() and (tmp_path / "hf/sst2-lora/base").is_dir()
    code = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    exec(compile(code, str(DOC), "exec"), {})
    assert "'prediction': " in capsys.readouterr().out
