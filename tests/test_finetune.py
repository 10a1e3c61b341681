"""Fine-tuning: config validation, the loop's files and determinism, reloading a fine-tuned run, and an end-to-end
fine-tune of a tiny pretrained model through the command function in a subprocess."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tasks_testing as T
import torch
import yaml

from lmforge.cli.eval import cmd_eval
from lmforge.data.labelled.examples import Dataset, Example
from lmforge.data.labelled.readers import load_labelled_dir
from lmforge.errors import LMForgeError
from lmforge.eval.finetuned import majority_baseline
from lmforge.finetuning.run import FineTuner
from lmforge.loading import load_finetuned
from lmforge.pretraining.config import load_config
from lmforge.tasks.config import RECIPES, load_finetune_config

TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def labelled(tmp_path_factory) -> Path:
    """A small labelled set of real sentences with one inserted sentiment word (train 240, dev 80)."""
    full = T.sentiment(320, seed=1)
    splits = {"train": Dataset(full.examples[:240], full.labels), "dev": Dataset(full.examples[240:], full.labels)}
    return T.write_labelled_dir(tmp_path_factory.mktemp("labelled") / "sentiment", splits)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    """A tiny GPT pretrained for 40 steps on public-domain text (tokenizer trained by the run)."""
    from lmforge.pretraining.run import Pretraining

    d = tmp_path_factory.mktemp("pretrained")
    docs = [json.dumps({"text": t}) + "\n" for t in T.TEXTS * 3]
    (d / "docs.jsonl").write_text("".join(docs), encoding="utf-8")
    over = [f"--run.dir={d / 'run'}", f"--data.inputs=[{d / 'docs.jsonl'}]", "--data.vocab_size=400",
            "--model.preset=gpt-tiny", "--train.batch_size=8", "--train.seq_len=32", "--train.max_steps=40",
            "--train.warmup_steps=4", "--train.lr=3e-3", "--train.eval_every=40", "--train.save_every=40",
            "--train.log_every=40", "--data.val_fraction=0.1"]  # fmt: skip
    Pretraining(load_config("gpt", over)).fit()
    return d / "run"


def small(run: Path, data: Path, *extra: str) -> list[str]:
    return [f"--run.dir={run}", "--data.source=dir", f"--data.dir={data}", "--train.batch_size=16",
            "--train.lr=2e-3", "--train.warmup_ratio=0.1", "--task.max_len=48", *extra]  # fmt: skip


# --- config -----------------------------------------------------------------------------------------------------


def test_every_bundled_recipe_loads():
    names = sorted(p.stem for p in RECIPES.glob("*.yaml"))
    assert {"sst2-gpt", "sst2-bert", "sst2-t5", "glue-mrpc", "glue-stsb", "glue-wnli"} <= set(names)
    assert len([n for n in names if n.startswith("glue-")]) == 9
    for name in names:
        cfg = load_finetune_config(name)
        assert cfg.task.options is not None
    mrpc = load_finetune_config("glue-mrpc", ["--data.dir=/glue"])
    assert mrpc.data.dir == "/glue" and mrpc.task.options.symmetric and mrpc.task.options.metrics == ["f1", "accuracy"]


@pytest.mark.parametrize(
    "override, message",
    [
        ("--train.lrr=1", "unknown config key 'train.lrr' — did you mean 'train.lr'?"),
        ("--task.doc_stride=64", "unknown config key 'task.doc_stride'"),
        ("--train.lr=fast", "train.lr: expected a number, got 'fast'"),
        ("--task.format=xlnet", "task.format: expected one of 'auto', 'gpt', 'bert', 'encoder_mean', 'bart', 'prompt'"),
        ("--task.type=clasification", "unknown task 'clasification' — did you mean 'classification'?"),
        ("--train.batch_size=0", "train.batch_size must be > 0, got 0"),
        ("--train.warmup_ratio=1.5", "train.warmup_ratio must be in [0, 1], got 1.5"),
        ("--train.layer_decay=0", "train.layer_decay must be in (0, 1], got 0.0"),
    ],
)
def test_bad_config_is_one_clear_error(override, message):
    with pytest.raises(LMForgeError) as e:
        load_finetune_config("sst2-gpt", [override])
    assert str(e.value).startswith(message)


def test_bad_init_and_data_are_clear_errors(tmp_path, labelled):
    with pytest.raises(LMForgeError, match="model.init: 'no-such-run' is neither a run/checkpoint/model dir nor a"):
        FineTuner(load_finetune_config("sst2-gpt", small(tmp_path / "r", labelled), init="no-such-run"))
    with pytest.raises(LMForgeError, match="data.source: unknown source 'hub'"):
        FineTuner(load_finetune_config("sst2-gpt", [*small(tmp_path / "r", labelled), "--data.source=hub"]))
    with pytest.raises(LMForgeError, match="data.source=glue needs --data.dir"):
        FineTuner(load_finetune_config("glue-sst2", [f"--run.dir={tmp_path / 'r'}"]))


# --- the loop -----------------------------------------------------------------------------------------------------


def test_finetune_from_scratch_is_deterministic_and_keeps_the_best_checkpoint(tmp_path, labelled):
    results = []
    for name in ("a", "b"):
        over = small(
            tmp_path / name,
            labelled,
            "--train.max_steps=6",
            "--train.eval_every=3",
            "--data.max_eval=32",
            "--model.vocab_size=300",
        )
        tuner = FineTuner(load_finetune_config("sst2-gpt", over, init="gpt-tiny"))
        results.append((tuner.fit(), tuner))
    (m1, t1), (m2, t2) = results
    assert m1 == m2
    for (n1, p1), (_, p2) in zip(t1.model.state_dict().items(), t2.model.state_dict().items()):
        assert torch.equal(p1, p2), n1
    run = tmp_path / "a"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    dev = [r for r in rows if "dev_accuracy" in r]
    assert [r["step"] for r in dev] == [3, 6]
    best = max(dev, key=lambda r: r["dev_accuracy"])  # the first of equals is kept
    assert [c.name for c in (run / "checkpoints").iterdir()] == ["step_6"]  # the resumable one (keep_last=1)
    assert yaml.safe_load((run / "best" / "config.yaml").read_text())["step"] == best["step"]
    assert json.loads((run / "eval.json").read_text()) == m1 and m1["accuracy"] == best["dev_accuracy"]
    # predictions.json: the best checkpoint's probability of each label per dev example; its argmax scores as eval.json
    # and as the best checkpoint's evaluation during training (the predict path, above)
    pred = json.loads((run / "predictions.json").read_text())
    dev_set = pred["dev"]
    assert pred["labels"] == t1.labels and pred["metrics"] == ["accuracy"] and len(dev_set["ids"]) == 32
    assert all(len(p) == len(t1.labels) and sum(p) == pytest.approx(1, abs=1e-4) for p in dev_set["probs"])
    right = [max(range(len(p)), key=p.__getitem__) == g for p, g in zip(dev_set["probs"], dev_set["gold"])]
    assert sum(right) / len(right) == pytest.approx(m1["accuracy"])
    # The tokenizer was trained on the task's texts (--init gpt-tiny = random init) and grew by the GPT tokens.
    assert t1.tokenizer.vocab_size == 303 and t1.model.config.vocab_size == 303
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["task"]["type"] == "classification" and saved["model"]["init"] == "gpt-tiny"
    assert load_finetune_config(run / "config.yaml").train.max_steps == 6  # the saved config is a recipe


def test_min_steps_adds_whole_epochs_to_a_small_set(tmp_path, labelled):
    # 240 training examples in batches of 16: 15 steps an epoch.
    def tuner(name: str, *extra: str) -> FineTuner:
        over = small(tmp_path / name, labelled, "--data.max_eval=16", "--model.vocab_size=300", *extra)
        return FineTuner(load_finetune_config("sst2-gpt", over, init="gpt-tiny"))

    assert tuner("plain", "--train.epochs=2").total_steps == 30
    assert tuner("reached", "--train.epochs=2", "--train.min_steps=25").total_steps == 30  # 2 epochs reach it
    assert tuner("capped", "--train.epochs=1", "--train.min_steps=20", "--train.max_steps=7").total_steps == 7
    raised = tuner("raised", "--train.epochs=1", "--train.min_steps=20")
    assert raised.total_steps == 30  # 20 steps need a second whole epoch
    raised.fit()
    rows = [json.loads(x) for x in (tmp_path / "raised" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows if "dev_accuracy" in r] == [1, 2]


def test_bf16_precision_runs_the_steps_under_autocast(tmp_path, labelled):
    losses = {}
    for precision in ("fp32", "bf16"):
        run = tmp_path / precision
        over = small(run, labelled, "--train.max_steps=2", "--train.log_every=1", "--data.max_eval=16",
                     "--model.vocab_size=300", f"--train.precision={precision}")  # fmt: skip
        FineTuner(load_finetune_config("sst2-gpt", over, init="gpt-tiny")).fit()
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        losses[precision] = [r["loss"] for r in rows if "loss" in r]
        assert (run / "eval.json").is_file()
    # Same weights and batches: bf16 matmuls change the losses a little, not a lot.
    assert losses["fp32"] != losses["bf16"]
    assert max(abs(a - b) for a, b in zip(losses["fp32"], losses["bf16"])) < 0.05


def test_two_process_finetuning_equals_one_process_with_double_batch(pretrained, labelled, tmp_path):
    common = ["--data.source=dir", f"--data.dir={labelled}", "--train.max_steps=4", "--train.log_every=1",
              "--train.lr=2e-3", "--task.max_len=48", "--data.max_eval=32", "--model.dropout=0",
              "--task.head_dropout=0", "--task.lm_coef=0"]  # fmt: skip
    # (lm_coef=0: the auxiliary LM loss is a mean over tokens, which a per-rank mean only approximates.)
    one = tmp_path / "one"
    FineTuner(load_finetune_config("sst2-gpt", [f"--run.dir={one}", "--train.batch_size=8", *common],
                                   init=str(pretrained))).fit()  # fmt: skip
    two = tmp_path / "two"
    ddp = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29541",
         "-m", "lmforge.cli", "finetune", "sst2-gpt", "--init", str(pretrained), f"--run.dir={two}",
         "--train.batch_size=4", *common],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert ddp.stdout.count("dev (best checkpoint)") == 1  # rank 0 reports

    def losses(run):
        return [json.loads(x)["loss"] for x in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]

    a, b = losses(one), losses(two)
    assert len(a) == len(b) == 4
    assert max(abs(x - y) for x, y in zip(a, b)) < 1e-4
    dev_a, dev_b = (json.loads((r / "eval.json").read_text()) for r in (one, two))
    assert dev_a.keys() == dev_b.keys() and abs(dev_a["accuracy"] - dev_b["accuracy"]) < 1e-9


def test_a_finetuned_run_reloads_and_evaluates_the_same(tmp_path, labelled):
    over = small(
        tmp_path / "run",
        labelled,
        "--train.max_steps=4",
        "--data.max_eval=24",
        "--model.vocab_size=300",
        "--model.tokenizer_kind=wordpiece",
    )
    tuner = FineTuner(load_finetune_config("sst2-bert", over, init="bert-tiny"))
    final = tuner.fit()
    task, model, tok, cfg = load_finetuned(tmp_path / "run")
    assert task.labels == ["negative", "positive"] and cfg.task.type == "classification"
    results = cmd_eval(str(tmp_path / "run"), overrides=["--data.max_eval=24"])
    assert results == {"sentiment": pytest.approx(final)}
    assert json.loads((tmp_path / "run" / "eval-results.json").read_text()) == {"sentiment": pytest.approx(final)}
    # A fine-tuned run can start another fine-tuning (its backbone, a fresh head).
    nxt = FineTuner(load_finetune_config("sst2-bert", small(tmp_path / "next", labelled), init=str(tmp_path / "run")))
    assert torch.equal(nxt.model.backbone.tok_emb.weight, model.backbone.tok_emb.weight)
    with pytest.raises(LMForgeError, match="already has checkpoints"):
        FineTuner(load_finetune_config("sst2-bert", over, init="bert-tiny"))


def test_init_from_a_hugging_face_dir(tmp_path, labelled):
    from lmforge.models.hf import export_hf

    tok = T.tokenizer("bert")
    bert = T.model("bert-tiny", tok, seed=5)
    export_hf(bert, tmp_path / "hf", tok)
    over = small(tmp_path / "run", labelled, "--train.max_steps=1")
    tuner = FineTuner(load_finetune_config("sst2-bert", over, init=str(tmp_path / "hf")))
    for name, p in bert.state_dict().items():
        torch.testing.assert_close(tuner.model.backbone.state_dict()[name], p, msg=name)
    assert tuner.tokenizer.vocab_size == tok.vocab_size and tuner.task.fmt == "bert"


GLUE_KEYS = ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"]


def test_every_glue_recipe_runs_on_glue_files_and_fills_the_glue_table(tmp_path):
    from lmforge.eval.finetuned import results_table

    T.tokenizer("bert").save(tmp_path / "tok")
    glue, tok = TESTS / "fixtures" / "glue", tmp_path / "tok"
    results = {}
    for key in GLUE_KEYS:
        run = tmp_path / key
        over = [f"--run.dir={run}", f"--data.dir={glue}", f"--model.tokenizer={tok}", "--train.max_steps=1",
                "--train.batch_size=2"]  # fmt: skip
        cfg = load_finetune_config(f"glue-{key}", over, init="bert-tiny")
        FineTuner(cfg).fit()
        metrics = json.loads((run / "eval.json").read_text())
        assert list(metrics) == (cfg.task.options.metrics or ["accuracy"])
        results |= cmd_eval(str(run))
    results |= cmd_eval(str(tmp_path / "mnli"), split="dev_mismatched")
    assert sorted(results) == sorted([*GLUE_KEYS, "mnli_mm"])
    table = results_table(results)
    rows = [line.split("|")[1].strip() for line in table.splitlines()[2:]]
    assert rows == ["CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI-m", "MNLI-mm", "QNLI", "RTE", "WNLI", "GLUE score"]
    assert "| MRPC | F1/acc |" in table and "| STS-B | Pearson/Spearman |" in table


def test_majority_baseline():
    train = Dataset([Example(text="x", label=lab) for lab in ["a", "a", "b"]])
    dev = Dataset([Example(text="y", label=lab) for lab in ["a", "b", "b", "b"]])
    assert majority_baseline(train, dev) == 0.25


# --- end to end ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_finetune_a_pretrained_model_end_to_end(pretrained, labelled, tmp_path):
    run = tmp_path / "ft"
    over = small(run, labelled, "--train.epochs=3")
    res = subprocess.run(
        [sys.executable, "-m", "lmforge.cli", "finetune", "sst2-gpt", "--init", str(pretrained), *over],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(TESTS.parent / "src")},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert "dev (best checkpoint): accuracy" in res.stdout and f"run saved in {run}" in res.stdout
    final = json.loads((run / "eval.json").read_text())
    splits = load_labelled_dir(labelled)
    base = majority_baseline(splits["train"], splits["dev"])
    assert final["accuracy"] > base + 0.1, (final, base)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows if "dev_accuracy" in r] == [1, 2, 3]
    losses = [r["task_loss"] for r in rows if "task_loss" in r]
    assert losses[-1] < losses[0] and all("lm_loss" in r for r in rows if "task_loss" in r)
    ckpt = next((run / "checkpoints").iterdir())
    saved = yaml.safe_load((ckpt / "config.yaml").read_text())
    assert saved["labels"] == ["negative", "positive"] and saved["backbone"]["vocab_size"] == 403
    assert saved["model"]["init"] == str(pretrained)
