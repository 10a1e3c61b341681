"""`lmforge experiment` end to end on CPU: the bundled roberta-masking-tiny (2 arms × 2 seeds, pretrained a few
steps on a small corpus, each fine-tuned on sentiment) writes its table and plots, skips every finished run when
rerun, and resumes a killed pretraining run exactly; gpt1-pretraining-tiny adds a random-init arm on the shared
tokenizer and a zero-shot evaluation."""

import json
import math
import shutil
from collections import Counter
from pathlib import Path

import pytest
from training_testing import write_docs

from lmforge.cli import main
from lmforge.data.labelled.readers import load_bundled
from lmforge.eval.baselines import classification_baselines

PNG = b"\x89PNG\r\n\x1a\n"


def experiment(capsys, *args) -> tuple[int, str]:
    """`lmforge experiment ARGS` run in this process (the runner; its arms are subprocesses) → (exit code, stderr)."""
    capsys.readouterr()
    rc = main(["experiment", *args])
    return rc, capsys.readouterr().err


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def docs(tmp_path_factory) -> Path:
    return write_docs(tmp_path_factory.mktemp("corpus") / "docs.jsonl", 12)


SMALL = [  # 10 steps of 8 × 64 tokens, a checkpoint every 5 (both kept); 64 fine-tuning examples
    "--budget.tokens=5120", "--train.warmup_steps=2", "--train.eval_every=5", "--train.save_every=5",
    "--train.keep_last=2", "--finetune.data.max_train=64", "--finetune.data.max_eval=32",
]  # fmt: skip


@pytest.mark.slow
def test_bundled_tiny_experiment_table_plots_skip_and_resume(tmp_path, docs, capsys, monkeypatch):
    out = tmp_path / "exp"
    args = ["roberta-masking-tiny", "--out", str(out), f"--data.inputs=[{docs}]", *SMALL]
    monkeypatch.chdir(tmp_path)
    assert main(["experiment", *args, "--dry-run"]) == 0
    assert "| pretrain/dynamic-s1 | pretrain | – | 10 | 5.12k |" in capsys.readouterr().out and not out.exists()

    rc, err = experiment(capsys, *args, "--jobs", "2")
    assert rc == 0, err[-3000:]
    table = (out / "roberta-masking-tiny.md").read_text()
    heads = "| arm | seeds | params | steps | tokens | FLOPs | epochs | val loss | below plateau | sentiment dev"
    assert heads + " accuracy |" in table
    data = json.loads((out / "roberta-masking-tiny.json").read_text())
    assert [row["arm"] for row in data["rows"]] == ["static", "dynamic", "majority class", "tf-idf + LR"]
    runs = {x["name"]: x for x in data["runs"]}
    assert len(runs) == 8 and {x["state"] for x in runs.values()} == {"finished"}
    # The baselines, fitted on the 64 training and scored on the 32 dev snippets the fine-tunes used.
    split = {k: ([e.text for e in ds.examples[:n]], [e.label for e in ds.examples[:n]])
             for (k, ds), n in zip(load_bundled("sentiment").items(), (64, 32, 32))}  # fmt: skip
    top = Counter(split["train"][1]).most_common(1)[0][0]  # ties: the label met first
    majority, tfidf = data["rows"][2]["values"], data["rows"][3]["values"]
    assert majority["sentiment dev accuracy"]["values"] == [100 * split["dev"][1].count(top) / 32]
    want = classification_baselines(split)["tfidf_lr"]["dev"]
    assert tfidf["sentiment dev accuracy"]["values"] == [pytest.approx(100 * want)]
    assert "| majority class | 1 |" in table and "| tf-idf + LR | 1 |" in table
    (claim,) = data["claims"]  # RoBERTa's Table 1, decided over the two seeds
    assert "## Claims" in table and claim["seeds"] == [0, 1] and claim["column"] == "sentiment test accuracy"
    assert claim["verdict"] in {"reproduced", "contradicted", "unresolved", "failed arm"}
    for row in data["rows"][:2]:
        finals = [metrics(out / "pretrain" / f"{row['arm']}-s{s}")[-1] for s in (0, 1)]
        assert row["values"]["val loss"]["values"] == [f["val_loss"] for f in finals]  # the table's: the runs' own
        # the unigram plateau of the run's validation targets (its static masks), under log |V|
        assert all(0 < f["val_plateau"] < math.log(yaml_of(out / "pretrain" / "static-s0")["data"]["vocab_size"])
                   for f in finals)  # fmt: skip
        below = row["values"]["below plateau"]["values"]
        assert below == pytest.approx([f["val_plateau"] - f["val_loss"] for f in finals])
        assert row["values"]["val loss"]["n"] == 2 and row["values"]["sentiment dev accuracy"]["n"] == 2
        dev = [json.loads((out / "finetune" / "sentiment" / f"{row['arm']}-s{s}" / "eval.json").read_text())
               for s in (0, 1)]  # fmt: skip
        assert row["values"]["sentiment dev accuracy"]["values"] == [100 * d["accuracy"] for d in dev]
        assert f"| {row['arm']} | 2 |" in table
    static = yaml_of(out / "pretrain" / "static-s1")
    assert static["objective"]["static"] is True and static["run"]["seed"] == 1 and static["train"]["max_steps"] == 10
    assert yaml_of(out / "finetune" / "sentiment" / "static-s1")["model"]["init"] == str(out / "pretrain" / "static-s1")
    for plot in ("loss", "metrics"):
        assert (out / "plots" / f"roberta-masking-tiny-{plot}.png").read_bytes()[:8] == PNG

    # Rerun: every run is skipped, nothing is rewritten.
    logs = {name: Path(x["run_dir"]) / "metrics.jsonl" for name, x in runs.items()}
    mtimes = {k: v.stat().st_mtime_ns for k, v in logs.items()}
    assert main(["experiment", *args]) == 0
    assert "8 of 8 arms already finished: skipped" in capsys.readouterr().err
    assert {k: v.stat().st_mtime_ns for k, v in logs.items()} == mtimes

    # A pretraining run killed after its step-5 checkpoint (before its fine-tuning ran) resumes from it.
    killed = out / "pretrain" / "dynamic-s1"
    before = metrics(killed)[-1]["val_loss"]
    logs["pretrain/dynamic-s1"].write_text("".join(json.dumps(m) + "\n" for m in metrics(killed) if m["step"] <= 5))
    shutil.rmtree(killed / "checkpoints" / "step_10")
    shutil.rmtree(out / "finetune" / "sentiment" / "dynamic-s1")
    rc, err = experiment(capsys, *args)
    assert rc == 0, err[-3000:]
    assert "6 of 8 arms already finished: skipped" in err and "resuming pretrain/dynamic-s1" in err
    assert "resumed from" in (killed / "arm.log").read_text()
    assert metrics(killed)[-1]["val_loss"] == pytest.approx(before, rel=1e-4)  # exact resume
    assert (out / "finetune" / "sentiment" / "dynamic-s1" / "eval.json").is_file()


def yaml_of(run_dir: Path) -> dict:
    import yaml

    return yaml.safe_load((run_dir / "config.yaml").read_text())


@pytest.mark.slow
def test_random_init_arm_and_zero_shot_evaluation(tmp_path, docs, capsys, monkeypatch):
    out = tmp_path / "exp"
    monkeypatch.chdir(tmp_path)
    rc, err = experiment(capsys, "gpt1-pretraining-tiny", "--out", str(out), f"--data.inputs=[{docs}]", "--seeds=0",
                         *SMALL, "--eval.data.max_eval=32", "--jobs", "2")  # fmt: skip
    assert rc == 0, err[-3000:]
    data = json.loads((out / "gpt1-pretraining-tiny.json").read_text())
    rows = {row["arm"]: row for row in data["rows"]}
    assert list(rows) == ["pretrained", "pretrained-no-aux-lm", "random-init", "majority class", "tf-idf + LR"]
    assert rows["majority class"]["values"]["sentiment dev accuracy"]["n"] == 1
    assert rows["pretrained"]["init"] == "gpt" and rows["random-init"]["init"] == "none"
    zero_shot = json.loads((out / "eval" / "zero-shot" / "gpt-s0" / "results.json").read_text())
    assert rows["pretrained"]["values"]["zero-shot accuracy"]["values"] == [100 * zero_shot["sentiment"]["accuracy"]]
    assert "zero-shot accuracy" not in rows["random-init"]["values"] and "val loss" not in rows["random-init"]["values"]
    shared = next((out / "shared").iterdir()) / "tokenizer"
    scratch = yaml_of(out / "finetune" / "sentiment" / "random-init-s0")["model"]
    assert scratch["init"] == "none" and scratch["tokenizer"] == str(shared)  # the pretrained arm's vocabulary
    assert yaml_of(out / "finetune" / "sentiment" / "pretrained-no-aux-lm-s0")["task"]["lm_coef"] == 0
