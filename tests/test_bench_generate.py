"""bench/generate.py: the CPU configuration of the GPU generation benchmark, its agreement check and its errors."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--preset", "gpt-tiny", "--prompt-len", "8", "--new-tokens", "6", "--batch", "2", "--device", "cpu"]


def _load():
    spec = importlib.util.spec_from_file_location("bench_generate", ROOT / "bench" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _load()


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """The documented CPU command as the GPU machine runs it: a script with PYTHONPATH=src, results to $OUT."""
    out = tmp_path_factory.mktemp("bench")
    env = os.environ | {"PYTHONPATH": str(ROOT / "src"), "OUT": str(out)}
    argv = [sys.executable, "bench/generate.py", *TINY, "--repeats", "1", "--impls", "lmforge-compiled", "hf"]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return proc, sorted(out.glob("*-generate.json"))


def test_cpu_run_rows_agree_with_lmforge_eager(cpu_run):
    proc, files = cpu_run
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(files) == 1
    results = json.loads(files[0].read_text())
    rows = {r["impl"]: r for r in results["rows"]}
    assert sorted(rows) == ["hf", "lmforge-compiled"]  # lmforge eager ran as the reference only
    for r in rows.values():
        assert (r["batch"], r["prompt_len"], r["new_tokens"]) == (2, 8, 6) and r["tokens_per_s"] > 0
        assert r["tokens_per_s"] == pytest.approx(2 * 6 / r["call_s"])
        # fp32 on CPU, same weights and prompts: the same greedy tokens as lmforge's eager decoding.
        assert r["vs_lmforge_eager"] == {"equal": True, "rows_equal": 1.0, "first_diff": 6.0}
    assert rows["lmforge-compiled"]["graphs_compiled"] == 1  # the second call reused the first call's graph
    assert rows["hf"]["graphs_compiled"] == 0
    [ratio] = results["ratios"]
    assert ratio["impl"] == "lmforge-compiled"
    assert ratio["vs_hf"] == pytest.approx(rows["lmforge-compiled"]["tokens_per_s"] / rows["hf"]["tokens_per_s"])
    table = files[0].with_suffix(".md").read_text()
    assert table.strip() in proc.stdout
    assert "| gpt2 (gpt-tiny) | 2 | lmforge-compiled |" in table and "| yes |" in table


def test_agreement_reports_the_first_differing_token():
    ref = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    other = torch.tensor([[1, 2, 0, 4], [5, 6, 7, 8]])
    assert bench.agreement(ref, ref) == {"equal": True, "rows_equal": 1.0, "first_diff": 4.0}
    assert bench.agreement(other, ref) == {"equal": False, "rows_equal": 0.5, "first_diff": 3.0}


def test_too_long_generation_for_learned_positions_is_an_error_row(capsys):
    args = bench.parse_args(["--preset", "gpt-tiny", "--prompt-len", "100", "--new-tokens", "50", "--device", "cpu"])
    [row] = bench.bench_model("gpt2", args)
    assert row["error"] == "--prompt-len + --new-tokens (150) exceeds preset 'gpt-tiny' max_seq_len 128"


@pytest.mark.parametrize("argv", [["--batch", "0"], ["--new-tokens", "0"], ["--models", "bert"], ["--impls", "x"]])
def test_bad_arguments_exit_2(argv):
    with pytest.raises(SystemExit) as e:
        bench.parse_args([*argv, "--device", "cpu"])
    assert e.value.code == 2
