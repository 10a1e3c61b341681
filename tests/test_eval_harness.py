"""The lm-evaluation-harness model `lmforge`: lm_eval's own entry points on the task YAMLs lmforge ships
(lmforge/eval/harness_tasks) give the per-example log-likelihoods, perplexities and generations of lmforge's scorer
and of forwards by hand."""

import dataclasses
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import tasks_testing as T
import torch

from lmforge.checkpoint.write import save_checkpoint
from lmforge.errors import LMForgeError
from lmforge.eval.harness import TASKS_DIR
from lmforge.eval.lm import LM

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = TASKS_DIR  # shipped in the package (lmforge/eval/harness_tasks): found from any directory
needs_lm_eval = pytest.mark.skipif(
    importlib.util.find_spec("lm_eval") is None, reason="lm-eval is not installed (pip install -e '.[harness]')"
)
GEN_UNTIL, GEN_TOKENS = ["\n", ".", ","], 6  # lmforge_gen.yaml's generation_kwargs


def read_jsonl(name: str) -> list[dict]:
    return [json.loads(x) for x in (FIXTURES / name).read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Run dirs of a tiny random decoder and encoder-decoder: {family: (run dir, model, tokenizer)}."""
    out = {}
    for family, preset in [("gpt", "gpt-tiny"), ("bart", "bart-tiny")]:
        tok = T.tokenizer(family)
        model = T.model(preset, tok, seed=7).eval()
        run = tmp_path_factory.mktemp(family)
        save_checkpoint(run, 1, model, config={"model": dataclasses.asdict(model.config)}, tokenizer=tok)
        out[family] = (run, model, tok)
    return out


@pytest.fixture(autouse=True)
def lm_eval_logs_to_an_open_stderr():
    """lm_eval adds its log handler once per process, on the sys.stderr of that moment: in a test with capsys, a stream
    closed when that test ends, where a later log line would print a logging traceback. A later test points it at
    the stderr of its own start."""
    import logging

    for handler in logging.getLogger("lm_eval").handlers:
        if isinstance(handler, logging.StreamHandler) and getattr(handler.stream, "closed", False):
            handler.stream = sys.stderr  # not setStream: it flushes the old stream, closed


@pytest.fixture
def harness_env(monkeypatch, tmp_path):
    """Run from elsewhere than the repository (the shipped tasks find their data beside them), datasets cached in
    tmp, offline."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def evaluate(run: Path, tasks: list[str]) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    from lmforge.eval.harness import register

    register()
    manager = TaskManager(include_path=str(FIXTURES), include_defaults=False)
    return lm_eval.simple_evaluate(
        model="lmforge", model_args=f"pretrained={run}", tasks=tasks, task_manager=manager, log_samples=True,
        batch_size=3, device="cpu",
    )  # fmt: skip


@torch.no_grad()
def by_hand(model, tok, context: str, continuation: str) -> float:
    """log P(continuation | context) from one unpadded forward of the whole text (decoder)."""
    ctx = tok.encode(context)
    cont = tok.encode(context + continuation)[len(ctx) :]
    ids = torch.tensor([ctx + cont])
    logp = model(ids).logits[0, :-1].log_softmax(-1)[len(ctx) - 1 :]
    return float(logp.gather(-1, torch.tensor(cont)[:, None]).sum())


@needs_lm_eval
@pytest.mark.parametrize("family", ["gpt", "bart"])
def test_simple_evaluate_multiple_choice_gives_lmforges_loglikelihoods(runs, harness_env, family):
    run, model, tok = runs[family]
    res = evaluate(run, ["lmforge_mc"])
    docs = read_jsonl("mc.jsonl")
    samples = sorted(res["samples"]["lmforge_mc"], key=lambda s: s["doc_id"])
    assert len(samples) == len(docs)
    lm = LM(model, tok, batch_size=1)
    correct = 0
    for s, doc in zip(samples, docs):
        got = [r[0][0] for r in s["resps"]]  # one (loglikelihood, is_greedy) per choice
        want = [lp for lp, _ in lm.loglikelihood([(doc["question"], " " + c) for c in doc["choices"]])]
        assert got == pytest.approx(want, abs=1e-4)
        if family == "gpt":
            assert got == pytest.approx(
                [by_hand(model, tok, doc["question"], " " + c) for c in doc["choices"]], abs=1e-4
            )
        correct += int(max(range(len(want)), key=lambda i: want[i]) == doc["answer"])
    assert res["results"]["lmforge_mc"]["acc,none"] == pytest.approx(correct / len(docs))


@needs_lm_eval
def test_rolling_and_generation_tasks_give_lmforges_numbers(runs, harness_env):
    run, model, tok = runs["gpt"]
    res = evaluate(run, ["lmforge_ppl", "lmforge_gen"])
    lm = LM(model, tok)
    texts = [d["text"] for d in read_jsonl("text.jsonl")]
    ppl = sorted(res["samples"]["lmforge_ppl"], key=lambda s: s["doc_id"])
    want = lm.loglikelihood_rolling(texts)
    assert [s["resps"][0][0] for s in ppl] == pytest.approx(want, abs=1e-4)
    bpb = -sum(want) / math.log(2) / sum(len(t.encode()) for t in texts)
    assert res["results"]["lmforge_ppl"]["bits_per_byte,none"] == pytest.approx(bpb, rel=1e-5)

    gen = sorted(res["samples"]["lmforge_gen"], key=lambda s: s["doc_id"])
    docs = read_jsonl("mc.jsonl")
    want = lm.generate_until([(d["question"], GEN_UNTIL, GEN_TOKENS) for d in docs])
    assert [s["resps"][0][0] for s in gen] == want
    assert any(w for w in want) and all(len(tok.encode(w)) <= GEN_TOKENS for w in want)


@needs_lm_eval
def test_lmforge_eval_harness_runs_lm_evals_command_line_on_a_run_with_the_shipped_tasks(runs, harness_env, tmp_path,
                                                                                         capsys):  # fmt: skip
    """`lmforge eval RUN --harness ARGS` is lm_eval's command line with the model `lmforge` (pretrained=RUN) and the
    shipped tasks on its path; a model given twice is one line."""
    from lm_eval.api.registry import get_model

    from lmforge.cli import main
    from lmforge.eval.harness_model import LMForgeLM

    run, model, tok = runs["gpt"]
    out = tmp_path / "out"
    args = ["--tasks", "lmforge_mc", "--batch_size", "4", "--device", "cpu", "--output_path", str(out)]
    assert main(["eval", str(run), "--harness", *args]) == 0
    assert get_model("lmforge") is LMForgeLM
    [results] = list(out.rglob("results_*.json"))
    acc = json.loads(results.read_text())["results"]["lmforge_mc"]["acc,none"]
    lm, right, docs = LM(model, tok), 0, read_jsonl("mc.jsonl")
    for d in docs:
        lls = [lp for lp, _ in lm.loglikelihood([(d["question"], " " + c) for c in d["choices"]])]
        right += int(max(range(len(lls)), key=lls.__getitem__) == d["answer"])
    assert acc == pytest.approx(right / len(docs)) and "|lmforge_mc|" in capsys.readouterr().out
    # lm_eval's own way to name the model works too (docs/evaluation.md).
    ppl = ["--tasks", "lmforge_ppl", "--device", "cpu", "--output_path", str(tmp_path / "ppl")]
    assert main(["eval", "--harness", "--model", "lmforge", "--model_args", f"pretrained={run}", *ppl]) == 0
    bits = json.loads(next((tmp_path / "ppl").rglob("results_*.json")).read_text())["results"]["lmforge_ppl"]
    texts = [d["text"] for d in read_jsonl("text.jsonl")]
    want = -sum(lm.loglikelihood_rolling(texts)) / math.log(2) / sum(len(t.encode()) for t in texts)
    assert bits["bits_per_byte,none"] == pytest.approx(want, rel=1e-5)
    capsys.readouterr()
    assert main(["eval", str(run), "--harness", "--model_args", f"pretrained={run}", *args]) == 2
    assert capsys.readouterr().err == f"error: give the model once: {run} or --model/--model_args, not both\n"


def test_the_example_tasks_ship_inside_the_package():
    """The task YAMLs and their data are package files (pyproject's package-data), not test fixtures."""
    import tomllib

    names = sorted(p.name for p in TASKS_DIR.iterdir() if p.suffix in (".yaml", ".jsonl", ".py"))
    assert names == ["lmforge_gen.yaml", "lmforge_mc.yaml", "lmforge_ppl.yaml", "local_data.py", "mc.jsonl",
                     "text.jsonl"]  # fmt: skip
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["lmforge"]
    assert "eval/harness_tasks/*.yaml" in data and "eval/harness_tasks/*.jsonl" in data
    assert not (ROOT / "tests" / "fixtures" / "harness").exists()


@needs_lm_eval
def test_generation_options_follow_hf_generate(runs):
    from lmforge.eval.harness_model import LMForgeLM

    _, model, tok = runs["gpt"]
    m = LMForgeLM(model=model, tokenizer=tok, batch_size="auto", device="cpu", max_gen_toks=32)
    assert m.lm.batch_size == 16 and m._gen_options({"until": "\n\n"}) == (["\n\n"], 32, {})
    assert m._gen_options({"temperature": 0.7, "max_gen_toks": 5}) == ([], 5, {})  # no do_sample: greedy
    until, n, sampling = m._gen_options({"do_sample": True, "top_p": 0.9})
    assert sampling == {"temperature": 1.0, "top_k": None, "top_p": 0.9}
    with pytest.raises(LMForgeError, match="needs model_args pretrained="):
        LMForgeLM()
    with pytest.raises(LMForgeError, match="batch_size must be an integer or 'auto', got 'x'"):
        LMForgeLM(model=model, tokenizer=tok, batch_size="x")


def test_without_lm_eval_the_entry_point_says_how_to_install_it(monkeypatch, capsys):
    from lmforge.eval import harness

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "lm_eval" else real(name, *a))
    assert harness.main(["--model", "lmforge"]) == LMForgeError("").exit_code != 0
    assert capsys.readouterr().err == (
        "error: lmforge eval --harness needs lmforge's `harness` extra (lm-eval), which is not installed: "
        f"pip install -e '{Path(__file__).resolve().parents[1]}[harness]'\n"  # a source checkout's editable form
    )


@needs_lm_eval
@pytest.mark.slow
def test_command_line_mirrors_lm_eval(runs, tmp_path, capsys, monkeypatch):
    run = runs["gpt"][0]
    cmd = [sys.executable, "-m", "lmforge.eval.harness", "--model", "lmforge", "--model_args", f"pretrained={run}",
           "--tasks", "lmforge_mc", "--include_path", str(FIXTURES), "--batch_size", "4", "--device", "cpu",
           "--output_path", str(tmp_path / "out")]  # fmt: skip
    env = {**__import__("os").environ, "HF_DATASETS_CACHE": str(tmp_path / "hf"), "HF_DATASETS_OFFLINE": "1"}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    [results] = list((tmp_path / "out").rglob("results_*.json"))
    acc = json.loads(results.read_text())["results"]["lmforge_mc"]["acc,none"]
    lm, docs = LM(runs["gpt"][1], runs["gpt"][2]), read_jsonl("mc.jsonl")
    right = 0
    for d in docs:
        lls = [lp for lp, _ in lm.loglikelihood([(d["question"], " " + c) for c in d["choices"]])]
        right += int(max(range(len(lls)), key=lls.__getitem__) == d["answer"])
    assert acc == pytest.approx(right / len(docs)) and "|lmforge_mc|" in r.stdout
    # A model path that is not there: one line and a non-zero exit, as from every lmforge command. The module's
    # `__main__` exits with main's return value (checked above in a process): main is called here, same arguments.
    from lmforge.eval.harness import main

    cmd[cmd.index(f"pretrained={run}")] = f"pretrained={tmp_path / 'nope'}"
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("HF_DATASETS_CACHE", env["HF_DATASETS_CACHE"])
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    capsys.readouterr()
    assert main(cmd[3:]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == f"error: checkpoint path not found: {tmp_path / 'nope'}" and "Traceback" not in err
