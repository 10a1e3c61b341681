"""GPT-1 §5's zero-shot heuristics (and their few-shot form) on RACE and Winograd-style data read from the fixtures:
what they ask the LM, and that they pick the right answers with a toy scorer; `lmforge eval` with the bundled
recipes on a tiny pretrained model."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tasks_testing as T

from lmforge.data.labelled.examples import Dataset
from lmforge.errors import LMForgeError
from lmforge.eval.lm import Scored
from lmforge.eval.zeroshot import Choice, ChoiceOptions, Winograd, WinogradOptions, load_prompt_config
from lmforge.tasks.data import load_splits

FIX = Path(__file__).parent / "fixtures"
TESTS = Path(__file__).parent

# Which referent a word of the rest of the sentence goes with (the toy scorer's "knowledge").
FACTS = {("box", "wide"), ("shelf", "small"), ("clara", "thanked"), ("hens", "eggs"), ("peter", "weak"),
         ("student", "solved"), ("teacher", "impressed"), ("bill", "tall"), ("cat", "hungry"),
         ("mouse", "frightened"), ("emma", "practised"), ("stove", "hot"), ("kate", "good")}  # fmt: skip


def words(text: str) -> list[str]:
    return re.findall(r"\w+|[^\w\s]", text.lower())


class ToyLM:
    """A stand-in for `LM` over words: a continuation word costs 0 when it goes with one of the three words before
    it (FACTS), -0.5 when it occurs earlier in the text, -2 otherwise. Records every request."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []

    def _logprobs(self, context: str, continuation: str) -> list[float]:
        seen, out = words(context), []
        for w in words(continuation):
            window = seen[-3:]
            out.append(0.0 if any((r, w) in FACTS for r in window) else (-0.5 if w in seen else -2.0))
            seen.append(w)
        return out

    def score(self, requests):
        self.requests += list(requests)
        return [Scored(self._logprobs(c, x), False) for c, x in requests]

    def loglikelihood(self, requests):
        return [(s.total, False) for s in self.score(requests)]

    def loglikelihood_rolling(self, texts):
        return [s.total for s in self.score([("", t) for t in texts])]


def shifted(ds: Dataset) -> dict[str, Dataset]:
    """The same examples with every label moved to another choice."""
    exs = [type(e)(**{**e.__dict__, "label": (e.label + 1) % len(e.choices)}) for e in ds.examples]
    return {"test": Dataset(exs)}


def test_race_zero_shot_asks_for_each_answer_after_article_and_question():
    cfg = load_prompt_config("race-zeroshot", [f"--data.dir={FIX / 'race'}"])
    splits = load_splits(cfg.data)
    lm = ToyLM()
    method = Choice(cfg.eval.options)
    assert method.run(lm, splits, "test") == {"accuracy": 1.0}
    assert method.run(ToyLM(), shifted(splits["test"]), "test") == {"accuracy": 0.0}
    ex = splits["test"].examples[0]
    ctx, cont = lm.requests[0]
    assert ctx == ex.context + "\nWhat did the class make with the biggest pumpkin?\nAnswer:" and cont == " A lantern"
    # A cloze question is scored at its gap: the context ends there and the option follows without a prefix.
    cloze = [r for r in lm.requests if r[1] == "risen by a third"]
    assert cloze and cloze[0][0].endswith("a third since the move.\nSince the move, borrowing has ")
    assert len(lm.requests) == 4 * len(splits["test"].examples)


def test_choice_normalises_by_answer_length():
    """GPT-1 §5 compares average token log-probabilities: a long right answer beats a short wrong one whose total
    is higher."""
    cfg = load_prompt_config("race-zeroshot", [f"--data.dir={FIX / 'race'}"])
    ex = load_splits(cfg.data)["test"].examples[0]
    right = "Soup for the whole school class garden"  # 7 words the article has: total -3.5, mean -0.5
    wrong = "Pie"  # one unseen word: total -2, mean -2
    probe = Dataset([type(ex)(**{**ex.__dict__, "choices": [wrong, right], "label": 1})])
    assert Choice(ChoiceOptions(template="{text}")).run(ToyLM(), {"test": probe}, "test") == {"accuracy": 1.0}
    summed = ChoiceOptions(template="{text}", normalize="sum")
    assert Choice(summed).run(ToyLM(), {"test": probe}, "test") == {"accuracy": 0.0}


def test_race_few_shot_puts_solved_questions_first():
    cfg = load_prompt_config("race-fewshot", [f"--data.dir={FIX / 'race'}", "--eval.k=2"])
    splits = load_splits(cfg.data)
    lm = ToyLM()
    assert Choice(cfg.eval.options).run(lm, splits, "test") == {"accuracy": 1.0}
    ctx, _ = lm.requests[0]
    demos = ctx.split("\n\n")
    assert len(demos) == 3 and demos[-1].startswith("Anna's class planted")
    solved = {f"{e.text}\nAnswer: {e.choices[e.label]}" for e in splits["train"].examples if "_" not in e.text}
    solved |= {e.text.replace("_", e.choices[e.label]) for e in splits["train"].examples if "_" in e.text}
    assert set(demos[:2]) <= solved  # each demonstration is a training question with its right answer in place
    again = ToyLM()
    Choice(cfg.eval.options).run(again, splits, "test")
    assert again.requests == lm.requests  # the demonstrations are seeded


@pytest.mark.parametrize("scoring", ["partial", "full"])
def test_winograd_on_wsc273_dpr_and_superglue_wsc(scoring):
    sources = [("wsc273-zeroshot", "test", [f"--data.dir={FIX / 'winograd'}"]),
               ("dpr-zeroshot", "test", [f"--data.dir={FIX / 'winograd' / 'dpr'}"]),
               ("superglue-wsc-zeroshot", "dev", [f"--data.dir={FIX / 'superglue'}"])]  # fmt: skip
    for recipe, split, over in sources:
        cfg = load_prompt_config(recipe, [*over, f"--eval.scoring={scoring}"])
        assert cfg.split == split
        splits = load_splits(cfg.data, require_train=False)
        lm = ToyLM()
        assert Winograd(cfg.eval.options).run(lm, splits, split) == {"accuracy": 1.0}, recipe
        assert Winograd(cfg.eval.options).run(ToyLM(), shifted(splits[split]), "test") == {"accuracy": 0.0}
        ex = splits[split].examples[0]
        head, tail = ex.text.split("_")
        if scoring == "partial":  # Trinh & Le: the rest of the sentence given the start with the candidate in
            assert lm.requests[:2] == [(head + c, tail) for c in ex.choices]
        else:
            assert lm.requests[:2] == [("", head + c + tail) for c in ex.choices]


def test_winograd_few_shot_and_partial_scoring_differ_from_full():
    cfg = load_prompt_config("dpr-zeroshot", [f"--data.dir={FIX / 'winograd' / 'dpr'}", "--eval.k=2"])
    splits = load_splits(cfg.data)
    lm = ToyLM()
    assert Winograd(cfg.eval.options).run(lm, splits, "test") == {"accuracy": 1.0}
    ctx, tail = lm.requests[0]
    demos = ctx.split("\n\n")
    train = [e.text.replace("_", e.choices[e.label]) for e in splits["train"].examples + splits["dev"].examples]
    assert len(demos) == 3 and set(demos[:2]) <= set(train) and tail == " had solved the puzzle ."
    assert demos[2] == "The teacher praised the student because teacher"
    with pytest.raises(LMForgeError, match="few-shot k=2 needs at least 2 training examples, the train split has 0"):
        wsc = load_prompt_config("wsc273-zeroshot", [f"--data.dir={FIX / 'winograd'}", "--eval.k=2"])
        Winograd(wsc.eval.options).run(ToyLM(), load_splits(wsc.data, require_train=False), "test")


def test_bundled_recipes_load():
    for name in ("race-zeroshot", "race-fewshot", "wsc273-zeroshot", "dpr-zeroshot", "superglue-wsc-zeroshot"):
        cfg = load_prompt_config(name)
        assert cfg.eval.method in ("choice", "winograd") and cfg.name
    assert load_prompt_config("race-fewshot").eval.options.k == 3
    assert (
        WinogradOptions().scoring == "full" and load_prompt_config("wsc273-zeroshot").eval.options.scoring == "partial"
    )


# --- end to end ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    """A tiny GPT pretrained for 30 steps on public-domain text (tokenizer trained by the run)."""
    return T.pretrain_tiny(tmp_path_factory.mktemp("pretrained"), "gpt", "gpt-tiny", 30, "--train.lr=3e-3")


def test_lmforge_eval_runs_the_race_and_winograd_recipes(pretrained, tmp_path):
    from lmforge.api import load
    from lmforge.eval.zeroshot import run_prompt_eval

    out = tmp_path / "results.json"
    args = ["eval", str(pretrained), "--task", "race-zeroshot", f"--data.dir={FIX / 'race'}", "--out", str(out)]
    res = subprocess.run(
        [sys.executable, "-m", "lmforge.cli", *args], cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(TESTS.parent / "src")},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    results = json.loads(out.read_text())
    assert list(results) == ["RACE"] and "| RACE | accuracy |" in res.stdout
    acc = results["RACE"]["accuracy"]
    assert acc in (0.0, 0.25, 0.5, 0.75, 1.0)  # 4 test questions
    model, tok = load(pretrained)
    cfg = load_prompt_config("race-zeroshot", [f"--data.dir={FIX / 'race'}"])
    assert run_prompt_eval(cfg, model, tok) == pytest.approx(results["RACE"])  # the CLI runs the same evaluation
