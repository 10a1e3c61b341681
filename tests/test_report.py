"""GLUE-style report table, GLUE score and results JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from lmforge.errors import LMForgeError
from lmforge.eval.report import glue_score, glue_table, read_results, write_results

# BERT-large's GLUE leaderboard row (Devlin et al. 2019): its published GLUE score is 80.5.
BERT_LARGE = {
    "CoLA": {"mcc": 0.605},
    "SST-2": {"accuracy": 0.949},
    "MRPC": {"f1": 0.893, "accuracy": 0.854},
    "STS-B": {"pearson": 0.876, "spearman": 0.865},
    "QQP": {"f1": 0.721, "accuracy": 0.893},
    "MNLI-m": {"accuracy": 0.867},
    "MNLI-mm": {"accuracy": 0.859},
    "QNLI": {"accuracy": 0.927},
    "RTE": {"accuracy": 0.701},
    "WNLI": {"accuracy": 0.651},
}


def test_full_glue_table_exact() -> None:
    assert glue_table(BERT_LARGE) == (
        "| Task | Metric | Score |\n"
        "|---|---|---:|\n"
        "| CoLA | MCC | 60.5 |\n"
        "| SST-2 | acc | 94.9 |\n"
        "| MRPC | F1/acc | 89.3/85.4 |\n"
        "| STS-B | Pearson/Spearman | 87.6/86.5 |\n"
        "| QQP | F1/acc | 72.1/89.3 |\n"
        "| MNLI-m | acc | 86.7 |\n"
        "| MNLI-mm | acc | 85.9 |\n"
        "| QNLI | acc | 92.7 |\n"
        "| RTE | acc | 70.1 |\n"
        "| WNLI | acc | 65.1 |\n"
        "| GLUE score | | 80.5 |\n"
    )
    # Nine task scores, two-metric tasks and MNLI m/mm averaged first: sum 7.247 / 9.
    assert glue_score(BERT_LARGE) == pytest.approx(7.247 / 9)


def test_partial_table_and_loose_names() -> None:
    results = {"wnli": {"acc": 0.5}, "sts_b": {"spearmanr": 0.7, "pearsonr": 0.9}, "mnli": {"accuracy": 0.6}}
    # STS-B 0.8, MNLI (matched only) 0.6, WNLI 0.5 → 0.6333
    assert glue_table(results) == (
        "| Task | Metric | Score |\n"
        "|---|---|---:|\n"
        "| STS-B | Pearson/Spearman | 90.0/70.0 |\n"
        "| MNLI-m | acc | 60.0 |\n"
        "| WNLI | acc | 50.0 |\n"
        "| Average (3/9 tasks) | | 63.3 |\n"
    )
    # Matched and mismatched make one task: (0.6 + 0.8) / 2 = 0.7 alone.
    assert glue_score({"mnli_m": {"accuracy": 0.6}, "mnli_mismatched": {"accuracy": 0.8}}) == pytest.approx(0.7)


def test_table_errors() -> None:
    with pytest.raises(LMForgeError, match=r"^'sentiment' is not a GLUE task \(known: CoLA, SST-2, MRPC"):
        glue_table({"sentiment": {"accuracy": 0.9}})
    with pytest.raises(LMForgeError, match=r"^results for mrpc: missing metric 'f1' \(have: accuracy\)$"):
        glue_table({"mrpc": {"accuracy": 0.9}})
    with pytest.raises(LMForgeError, match=r"^results name GLUE task 'MNLI-m' twice$"):
        glue_table({"mnli": {"accuracy": 0.9}, "MNLI-m": {"accuracy": 0.8}})
    with pytest.raises(LMForgeError, match=r"^no GLUE results to tabulate$"):
        glue_table({})


def test_write_and_read_results(tmp_path: Path) -> None:
    path = write_results(tmp_path / "run" / "eval.json", {"sst2": {"accuracy": 0.9}, "cola": {"mcc": 0.25}})
    assert json.loads(path.read_text()) == {"cola": {"mcc": 0.25}, "sst2": {"accuracy": 0.9}}
    assert path.read_text().startswith('{\n  "cola": {\n    "mcc": 0.25\n  },')
    assert read_results(path) == {"cola": {"mcc": 0.25}, "sst2": {"accuracy": 0.9}}
    assert not list(path.parent.glob("*.tmp"))
    with pytest.raises(LMForgeError, match=r"^results for stsb: pearson is nan \(not a finite number\)$"):
        write_results(tmp_path / "bad.json", {"stsb": {"pearson": math.nan}})
    assert not (tmp_path / "bad.json").exists()
    (tmp_path / "broken.json").write_text('{"sst2": \n')
    with pytest.raises(LMForgeError, match=rf"^{tmp_path / 'broken.json'}:2: invalid JSON"):
        read_results(tmp_path / "broken.json")
