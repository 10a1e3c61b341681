"""The classify pipeline end to end at CPU size (`lmforge experiment classify-tiny --pretrain-procs 2`): a tiny encoder
pretrained on two processes, then fine-tuned on the four fetched labelled sets as pretrained and with its top blocks
drawn afresh, beside their bag-of-words baselines; and `classify-decoder-tiny`, a decoder beside it. Stand-in sets
(a few examples each, in the fetched-set layout) replace the registry downloads."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from training_testing import write_docs

SETS = {"rotten-tomatoes": ("negative", "positive"), "hedge": ("certain", "uncertain"),
        "drug-reviews": ("negative", "neutral", "positive"), "spam": ("ham", "spam")}  # fmt: skip
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def fake_set(root: Path, name: str, labels: tuple[str, ...]) -> None:
    """A fetched labelled set: meta.json and train/dev/test JSONL, each label marked by its own word."""
    d = root / "data" / name
    d.mkdir(parents=True)
    counts = {"train": 24, "dev": 12, "test": 12}
    for split, n in counts.items():
        rows = [{"id": f"{split}-{i}", "label": labels[i % len(labels)],
                 "text": f"{labels[i % len(labels)]} {' '.join(WORDS[(i + k) % len(WORDS)] for k in range(6))}"}
                for i in range(n)]  # fmt: skip
        (d / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    meta = {"name": name, "task_type": "classification", "labels": list(labels), "splits": list(counts),
            "counts": counts, "fields": {"text": "text", "label": "label"}}  # fmt: skip
    (d / "meta.json").write_text(json.dumps(meta))


def run_experiment(tmp_path: Path, name: str, *args: str) -> dict:
    """`lmforge experiment NAME --out tmp_path/exp --jobs 2 ARGS` on the stand-in sets and 12 bundled documents; its
    report's JSON."""
    cache = tmp_path / "cache"
    for task, labels in SETS.items():
        fake_set(cache, task, labels)
    docs = write_docs(tmp_path / "docs.jsonl", 12)
    out = tmp_path / "exp"
    env = {"LMFORGE_CACHE": str(cache), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "lmforge.cli", "experiment", name, "--out", str(out), f"--data.inputs=[{docs}]",
           "--jobs", "2", *args]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((out / f"{name}.json").read_text())


@pytest.mark.slow
def test_classify_tiny_fine_tunes_the_four_sets_beside_their_baselines(tmp_path):
    out = tmp_path / "exp"
    data = run_experiment(tmp_path, "classify-tiny", "--pretrain-procs", "2")
    grid = ["pre-0.0002", "reinit2-0.0002", "reinit4-0.0002"]  # as pretrained; its top 1 or 2 blocks redrawn
    assert [row["arm"] for row in data["rows"]] == grid + ["majority class", "tf-idf + LR"]
    runs = {x["name"]: x["state"] for x in data["runs"]}
    assert len(runs) == 13 and set(runs.values()) == {"finished"}  # 1 pretraining run, 4 sets x 3 arms
    pre = out / "pretrain" / "pre-s0"
    picks = {p["task"]: p for p in data["chosen"]}  # each set's arm chosen on dev, hedge on the other sets'
    assert list(picks) == list(SETS) and [p["held_out"] for p in picks.values()] == [False, True, False, False]
    assert picks["rotten-tomatoes"]["arm"] == "pre-0.0002" and all(p["arm"] in grid for p in picks.values())
    assert picks["hedge"]["chosen_on"] == ["rotten-tomatoes", "drug-reviews", "spam"]
    assert "## Chosen on dev" in (out / "classify-tiny.md").read_text()
    # Pretrained on two processes (torch.distributed.run), each with half of the global batch of 8.
    assert yaml.safe_load((pre / "config.yaml").read_text())["train"]["batch_size"] == 4
    for name in SETS:
        for row in data["rows"][:3]:  # the table's numbers are the runs' own
            run = out / "finetune" / name / f"{row['arm']}-s0"
            assert (run / "best").is_dir() and not (run / "checkpoints").exists()  # finished: resumables dropped
            test = json.loads((run / "eval_test.json").read_text())
            assert row["values"][f"{name} test accuracy"]["values"] == [pytest.approx(100 * test["accuracy"])]
            config = yaml.safe_load((run / "best" / "config.yaml").read_text())  # each arm's own keys reached it
            assert config["train"]["lr"] == 2e-4
            assert config["model"]["init"] == str(pre)
            assert config["model"]["reinit_top"] == grid.index(row["arm"])
            assert config["labels"] == list(SETS[name])  # a head of the set's own labels
        # The word that names the label makes the stand-in sets separable: the bag of words gets every dev example.
        assert data["rows"][4]["values"][f"{name} dev accuracy"]["values"] == [100.0]


@pytest.mark.slow
def test_classify_decoder_tiny_fine_tunes_a_decoder_and_an_encoder_each_in_its_own_format(tmp_path):
    """classify-decoder at CPU size: encoder-fast-tiny and gpt-fast-tiny pretrained on the same text, the encoder
    fine-tuned with mean pooling, the decoder GPT-1-style, and dev choosing between them."""
    out = tmp_path / "exp"
    data = run_experiment(tmp_path, "classify-decoder-tiny")
    grid = ["pre-0.0002", "gpt-6.25e-05", "gpt-0.0002"]
    assert [row["arm"] for row in data["rows"]] == grid + ["majority class", "tf-idf + LR"]
    runs = {x["name"]: x["state"] for x in data["runs"]}
    assert len(runs) == 14 and set(runs.values()) == {"finished"}  # 2 pretraining runs, 4 sets x 3 arms
    encoder, decoder = (
        yaml.safe_load((out / "pretrain" / f"{a}-s0" / "config.yaml").read_text()) for a in ("pre", "gpt")
    )
    assert (encoder["objective"]["name"], decoder["objective"]["name"]) == ("roberta", "causal_lm")
    assert decoder["train"]["optimizer"] == "muon" and decoder["train"]["compile_scope"] == "step"
    assert encoder["train"]["batch_size"] == decoder["train"]["batch_size"] == 8  # the same batch and text
    assert encoder["data"]["tokenizer"] == decoder["data"]["tokenizer"]
    picks = {p["task"]: p for p in data["chosen"]}
    assert all(p["arm"] in grid for p in picks.values()) and picks["hedge"]["held_out"]
    want = {"pre-0.0002": ("pre", "encoder_mean", 2e-4), "gpt-6.25e-05": ("gpt", "gpt", 6.25e-5),
            "gpt-0.0002": ("gpt", "gpt", 2e-4)}  # fmt: skip
    for name in SETS:
        for arm, (init, fmt, lr) in want.items():
            config = yaml.safe_load((out / "finetune" / name / f"{arm}-s0" / "best" / "config.yaml").read_text())
            assert config["model"]["init"] == str(out / "pretrain" / f"{init}-s0")
            assert (config["task"]["format"], config["train"]["lr"]) == (fmt, lr)
            if init == "gpt":
                assert config["task"]["lm_coef"] == 0.5  # GPT-1's auxiliary LM loss


@pytest.mark.slow
def test_classify_1gpu_tiny_builds_its_own_data_and_stacks_each_fine_tune_on_tfidf(tmp_path, monkeypatch):
    """classify-1gpu at CPU size: one command from fetched text to the report — the tokenizer and the decontaminated
    corpus built by the run, one fine-tune per set and its stack on tf-idf + LR, hedge chosen on the other sets."""
    from lmforge.experiments.tfidf import tfidf_predictions

    out = tmp_path / "exp"
    data = run_experiment(tmp_path, "classify-1gpu-tiny")
    monkeypatch.setenv("LMFORGE_CACHE", str(tmp_path / "cache"))  # the stand-in sets, for tf-idf here
    arms = ["pre-0.0002", "pre-0.0002-tfidf"]
    assert [row["arm"] for row in data["rows"]] == arms + ["majority class", "tf-idf + LR"]
    runs = {x["name"]: x["state"] for x in data["runs"]}
    assert len(runs) == 9 and set(runs.values()) == {"finished"}  # 1 pretraining run, 4 fine-tunes, 4 stacks
    # the invocation's wall time, from its start to its report, holds the pretraining run and the fine-tunes after it
    seconds = {x["name"]: x["seconds"] for x in data["runs"]}
    assert data["wall_s"] > seconds["pretrain/pre-s0"] + max(v for k, v in seconds.items() if k.startswith("finetune"))
    shown = re.search(r"Wall time: (\d+) s", (out / "classify-1gpu-tiny.md").read_text())
    assert shown and abs(int(shown[1]) - data["wall_s"]) <= 0.51  # whole seconds there, tenths in the JSON
    config = yaml.safe_load((out / "pretrain" / "pre-s0" / "config.yaml").read_text())
    assert config["data"]["decontaminate"] == list(SETS) and "shared" in config["data"]["tokenizer"]
    picks = {p["task"]: p for p in data["chosen"]}
    assert picks["hedge"]["held_out"] and picks["hedge"]["chosen_on"] == ["rotten-tomatoes", "drug-reviews", "spam"]
    assert all(p["arm"] in arms for p in picks.values())
    for name in SETS:
        run = out / "finetune" / name / "pre-0.0002-s0"
        own, tfidf = json.loads((run / "predictions.json").read_text()), tfidf_predictions(run)
        stack = json.loads((out / "ensemble" / name / "pre-0.0002-tfidf-s0" / "predictions.json").read_text())
        cols = [tfidf["labels"].index(label) for label in own["labels"]]
        for split in ("dev", "test"):  # each example's probabilities: the mean of the fine-tune's and tf-idf's
            want = [[(p[i] + q[c]) / 2 for i, c in enumerate(cols)]
                    for p, q in zip(own[split]["probs"], tfidf[split]["probs"])]  # fmt: skip
            assert stack[split]["probs"] == [pytest.approx(w) for w in want]
        test = json.loads((out / "ensemble" / name / "pre-0.0002-tfidf-s0" / "eval_test.json").read_text())
        assert data["rows"][1]["values"][f"{name} test accuracy"]["values"] == [pytest.approx(100 * test["accuracy"])]
