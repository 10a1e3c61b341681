"""GPT-2-style zero-shot rows: Story Cloze (the ending the LM finds more likely given the four-sentence story, as
lm-evaluation-harness's storycloze task scores it) and translation prompts (GPT-2 §3.7: "english sentence = french
sentence" pairs, then "english sentence =", greedy decoding to the end of the line, BLEU), on the hand-made fixtures
in the official layouts; the readers' bad-input lines; `lmforge eval --task story-cloze / translate-en-fr` end to end
on a tiny pretrained GPT."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tasks_testing as T
import torch

from lmforge.data.labelled.examples import Dataset, Example
from lmforge.errors import LMForgeError
from lmforge.eval.lm import LM
from lmforge.eval.translate_prompt import Translate
from lmforge.eval.zeroshot import Choice, load_prompt_config, run_prompt_eval
from lmforge.tasks.data import load_splits

FIX = Path(__file__).parent / "fixtures"
STORIES, PAIRS = FIX / "story_cloze", FIX / "parallel" / "en-fr.tsv"
TESTS = Path(__file__).parent
HEADER = ("InputStoryid,InputSentence1,InputSentence2,InputSentence3,InputSentence4,RandomFifthSentenceQuiz1,"
          "RandomFifthSentenceQuiz2,AnswerRightEnding\n")  # fmt: skip


def story_splits(*over: str) -> dict[str, Dataset]:
    cfg = load_prompt_config("story-cloze", [f"--data.dir={STORIES}", *over])
    return load_splits(cfg.data, require_train=False)


# --- Story Cloze --------------------------------------------------------------------------------------------------


def test_story_cloze_reader_reads_the_official_layout_and_passes_over_rocstories():
    splits = story_splits()
    assert sorted(splits) == ["dev", "test"] and [len(s.examples) for s in splits.values()] == [8, 8]
    ex = splits["test"].examples[1]
    assert ex.text == ("Kelly wanted a new dress for the party. She went to the mall with her sister. They tried on "
                       "dresses in many stores. Kelly finally found a blue one she loved.")  # fmt: skip
    assert ex.choices == ["Kelly went to the party in her pajamas.", "Kelly wore the blue dress to the party."]
    assert ex.label == 1 and ex.id == "b2e1d3c5-0002"  # AnswerRightEnding 2 -> index 1
    # A quoted field with a comma stays one sentence.
    assert "On race day, she felt nervous but ready." in splits["dev"].examples[3].text


def lm_eval_loglikelihood(model, tok, context: str, continuation: str) -> float:
    """log P(continuation | context) computed from one forward pass over context + continuation, the continuation's
    tokens being those of the whole text after the context's (lm-evaluation-harness's HF model)."""
    ctx = tok.encode(context)
    whole = tok.encode(context + continuation)
    assert whole[: len(ctx)] == ctx
    ids = torch.tensor([whole])
    with torch.no_grad():
        logp = model(ids).logits[0].float().log_softmax(-1)  # (T, V)
    return sum(float(logp[t - 1, whole[t]]) for t in range(len(ctx), len(whole)))


def test_story_cloze_picks_the_ending_with_the_higher_loglikelihood_given_the_story():
    """The storycloze definition written out: doc_to_text the sentences joined by ' ', the choice after ' ', acc by
    the summed log-likelihood; a flipped answer key gives the complementary accuracy."""
    tok = T.tokenizer("gpt")
    model = T.model("gpt-tiny", tok, seed=3).eval()
    splits = story_splits()
    cfg = load_prompt_config("story-cloze", [f"--data.dir={STORIES}"])
    exs = splits["test"].examples
    scores = [[lm_eval_loglikelihood(model, tok, e.text, " " + c) for c in e.choices] for e in exs]
    preds = [max(range(2), key=s.__getitem__) for s in scores]
    assert all(abs(a - b) > 1e-4 for a, b in scores)  # no near-ties: the argmax is decided
    want = sum(p == e.label for p, e in zip(preds, exs)) / len(exs)
    got = Choice(cfg.eval.options).run(LM(model, tok, batch_size=3), splits, "test")
    assert got == {"accuracy": pytest.approx(want)}
    flipped = {"test": Dataset([Example(text=e.text, choices=e.choices, label=1 - e.label) for e in exs])}
    assert Choice(cfg.eval.options).run(LM(model, tok), flipped, "test") == {"accuracy": pytest.approx(1 - want)}
    # --eval.normalize=mean: the mean token log-probability of each ending decides instead (GPT-1 §5).
    mean = load_prompt_config("story-cloze", [f"--data.dir={STORIES}", "--eval.normalize=mean"]).eval.options
    n_tokens = [[len(LM(model, tok).encode_pair(e.text, " " + c)[1]) for c in e.choices] for e in exs]
    means = [[s / n for s, n in zip(ss, ns)] for ss, ns in zip(scores, n_tokens)]
    want_mean = sum(max(range(2), key=m.__getitem__) == e.label for m, e in zip(means, exs)) / len(exs)
    assert Choice(mean).run(LM(model, tok), splits, "test") == {"accuracy": pytest.approx(want_mean)}


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "files, over, message",
    [
        ({}, [], "{d}: no Story Cloze CSV files (expected the official files, with InputSentence1..4, "
                 "RandomFifthSentenceQuiz1/2 and AnswerRightEnding columns)"),
        ({"x_val.csv": HEADER + "1,a.,b.,c.,d.,e.,f.,3\n"}, [],
         "{d}/x_val.csv:2: AnswerRightEnding must be 1 or 2, got '3'"),
        ({"x_val.csv": HEADER + "1,a.,b.,,d.,e.,f.,1\n"}, [], "{d}/x_val.csv:2: empty InputSentence3"),
        ({"x_val.csv": HEADER + "1,a.,b.,c.,d.,e.,f.\n"}, [], "{d}/x_val.csv:2: expected 8 columns (as the header)"),
        ({"stories.csv": HEADER + "1,a.,b.,c.,d.,e.,f.,1\n"}, [],
         "{d}/stories.csv: cannot tell its split from the name (name it with 'val' or 'test', or pass "
         "--data.dev / --data.test)"),
        ({"a_val.csv": HEADER + "1,a.,b.,c.,d.,e.,f.,1\n", "b_val.csv": HEADER + "1,a.,b.,c.,d.,e.,f.,1\n"}, [],
         "{d}: two dev files, a_val.csv and b_val.csv (pick one with --data.name=2016 or 2018, or --data.dev=FILE)"),
        ({"x_val.csv": HEADER + "1,a.,b.,c.,d.,e.,f.,1\n"}, ["--data.train=t.csv"],
         "data.source=story-cloze has no training split (the test ships dev and test files only)"),
    ],
)  # fmt: skip
def test_story_cloze_bad_input_is_one_line(tmp_path, files, over, message):
    d = tmp_path / "sc"
    d.mkdir()
    for name, text in files.items():
        write(d / name, text)
    cfg = load_prompt_config("story-cloze", [f"--data.dir={d}", *over])
    with pytest.raises(LMForgeError) as err:
        load_splits(cfg.data, require_train=False)
    assert str(err.value) == message.format(d=d)


def test_story_cloze_year_picks_the_files_where_the_directory_holds_both(tmp_path):
    d = tmp_path / "sc"
    write(d / "cloze_test_val__spring2016.csv", HEADER + "1,a.,b.,c.,d.,e.,f.,1\n")
    write(d / "cloze_test_val__winter2018.csv", HEADER + "1,a.,b.,c.,d.,e.,f.,2\n2,a.,b.,c.,d.,e.,f.,1\n")
    for year, n in (("2016", 1), ("2018", 2)):
        cfg = load_prompt_config("story-cloze", [f"--data.dir={d}", f"--data.name={year}", "--split=dev"])
        assert len(load_splits(cfg.data, require_train=False)["dev"].examples) == n


# --- translation prompts --------------------------------------------------------------------------------------------


def translate_cfg(*over: str):
    return load_prompt_config("translate-en-fr", [f"--data.test={PAIRS}", *over])


def test_translation_prompt_is_gpt2s_pairs_then_the_source_and_equals():
    cfg = translate_cfg("--eval.k=2")
    splits = load_splits(cfg.data, require_train=False)
    prompts = Translate(cfg.eval.options).prompts(splits, "test")
    exs = splits["test"].examples
    assert len(prompts) == 40
    for ex, prompt in zip(exs, prompts):
        *demos, query = prompt.split("\n")
        assert query == f"{ex.text} =" and len(demos) == 2
        for line in demos:  # "english sentence = french sentence", a real pair, never the query's own
            en, fr = line.split(" = ")
            assert (en, fr) in {(e.text, e.target) for e in exs} and en != ex.text


def test_translation_pairs_come_from_the_train_split_when_given(tmp_path):
    lines = "The moon.\tLa lune.\nA star.\tUne étoile.\nThe sky.\tLe ciel.\nThe sea.\tLa mer.\n"
    train = write(tmp_path / "train.tsv", lines)  # its last pair is held out as dev (no dev file given)
    cfg = translate_cfg(f"--data.train={train}", "--eval.k=3")
    splits = load_splits(cfg.data, require_train=False)
    prompt = Translate(cfg.eval.options).prompts(splits, "test")[0]
    assert sorted(prompt.split("\n")[:3]) == ["A star. = Une étoile.", "The moon. = La lune.", "The sky. = Le ciel."]


class LookupLM:
    """Answers a translation prompt from a dictionary of the pairs (the query is the prompt's last line)."""

    def __init__(self, table: dict[str, str]) -> None:
        self.table, self.requests = table, []

    def generate_until(self, requests):
        self.requests += list(requests)
        return [" " + self.table[ctx.split("\n")[-1][: -len(" =")]] for ctx, until, n in requests]


def test_translation_bleu_is_sacrebleus_corpus_bleu_of_the_greedy_lines():
    import sacrebleu

    cfg = translate_cfg("--data.max_eval=12")
    splits = load_splits(cfg.data, require_train=False)
    exs = splits["test"].examples
    right = {e.text: e.target for e in exs}
    lm = LookupLM(right)
    assert Translate(cfg.eval.options).run(lm, splits, "test") == {"bleu": pytest.approx(1.0)}
    assert {(tuple(u), n) for _, u, n in lm.requests} == {(("\n",), 64)}  # one line, greedy, 64 tokens at most
    wrong = {e.text: exs[(i + 1) % len(exs)].target for i, e in enumerate(exs)}  # every answer another's
    want = sacrebleu.corpus_bleu([wrong[e.text] for e in exs], [[e.target for e in exs]]).score / 100
    got = Translate(cfg.eval.options).run(LookupLM(wrong), splits, "test")["bleu"]
    assert got == pytest.approx(want) and got < 0.2


def test_translation_without_sacrebleu_is_one_line_naming_the_extra(monkeypatch):
    from lmforge import extras

    real = extras.available
    monkeypatch.setattr(extras, "available", lambda m: False if m.startswith("sacrebleu") else real(m))
    cfg = translate_cfg()
    splits = load_splits(cfg.data, require_train=False)
    lm = LookupLM({})
    with pytest.raises(LMForgeError) as err:
        Translate(cfg.eval.options).run(lm, splits, "test")
    assert str(err.value) == ("metric 'bleu' needs sacrebleu, which is not installed (lmforge's `eval` extra): "
                              "pip install 'sacrebleu>=2.3'")  # fmt: skip
    assert lm.requests == []  # refused before decoding anything


@pytest.mark.parametrize(
    "text, over, message",
    [
        ("Hello.\n", [], "{f}:1: expected at least 2 tab-separated columns (a sentence and its translation), found 1"),
        ("Hello.\tBonjour.\n\t Salut.\n", [], "{f}:2: column 0 is empty"),
        ("", [], "{f}: no sentence pairs (an empty file)"),
        ("Hello.\tBonjour.\n", ["--data.text_field=en"],
         "data.source=parallel: data.text_field is a 0-based column number of the tab-separated file, got 'en'"),
        ("Hello.\tBonjour.\nBye.\tSalut.\n", ["--eval.k=2"],
         "translate: eval.k=2 example pairs per query, but the test split (no train split given) has 1 pairs to "
         "draw them from"),
    ],
)  # fmt: skip
def test_parallel_bad_input_is_one_line(tmp_path, text, over, message):
    f = write(tmp_path / "pairs.tsv", text)
    cfg = load_prompt_config("translate-en-fr", [f"--data.test={f}", *over])
    with pytest.raises(LMForgeError) as err:
        splits = load_splits(cfg.data, require_train=False)
        Translate(cfg.eval.options).run(LookupLM({}), splits, "test")
    assert str(err.value) == message.format(f=f)


def test_parallel_columns_choose_the_direction():
    cfg = translate_cfg("--data.text_field=1", "--data.target_field=0")
    ex = load_splits(cfg.data, require_train=False)["test"].examples[2]
    assert (ex.text, ex.target) == ("Où est la gare ?", "Where is the station?")


# --- the command line -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    """A tiny GPT pretrained for 20 steps on public-domain text (tokenizer trained by the run)."""
    return T.pretrain_tiny(tmp_path_factory.mktemp("pretrained"), "gpt", "gpt-tiny", 20, "--train.lr=3e-3")


@pytest.mark.parametrize(
    "task, data, name, metric",
    [("story-cloze", f"--data.dir={STORIES}", "StoryCloze", "accuracy"),
     ("translate-en-fr", f"--data.test={PAIRS}", "translate-en-fr", "bleu")],
)  # fmt: skip
def test_lmforge_eval_runs_the_documented_commands(pretrained, tmp_path, task, data, name, metric):
    from lmforge.api import load

    out = tmp_path / "results.json"
    args = ["eval", str(pretrained), "--task", task, data, "--data.max_eval=6", "--out", str(out)]
    res = subprocess.run(
        [sys.executable, "-m", "lmforge.cli", *args], cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(TESTS.parent / "src")},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    results = json.loads(out.read_text())
    assert list(results) == [name] and list(results[name]) == [metric] and f"| {name} | {metric} |" in res.stdout
    model, tok = load(pretrained)
    cfg = load_prompt_config(task, [data, "--data.max_eval=6"])
    assert run_prompt_eval(cfg, model, tok) == pytest.approx(results[name])  # the CLI runs the same evaluation
    value = results[name][metric]
    assert value in {i / 6 for i in range(7)} if metric == "accuracy" else 0.0 <= value <= 1.0  # 6 stories / pairs


def test_translation_prompts_on_the_fetched_english_spanish_pairs(tmp_path, monkeypatch):
    """The registries' one aligned pair, `lmforge data fetch bible-en-es` (a stand-in written in its layout here):
    example pairs from its train split, queries from its test split."""
    root = tmp_path / "data" / "bible-en-es"
    root.mkdir(parents=True)
    (root / "meta.json").write_text(json.dumps({"labels": None, "task_type": "text_to_text"}), encoding="utf-8")
    pairs = {"train": [("In the beginning.", "En el principio."), ("And there was light.", "Y fue la luz."),
                       ("The earth was empty.", "La tierra estaba vacía."), ("God saw the light.", "Dios vio la luz.")],
             "dev": [("It was good.", "Era bueno.")], "test": [("Let there be light.", "Sea la luz.")]}  # fmt: skip
    for split, rows in pairs.items():
        lines = [json.dumps({"text": en, "target": es}) + "\n" for en, es in rows]
        (root / f"{split}.jsonl").write_text("".join(lines), encoding="utf-8")
    monkeypatch.setenv("LMFORGE_CACHE", str(tmp_path))
    over = ["--data.source=fetched", "--data.name=bible-en-es", "--name=translate-en-es", "--eval.k=4"]
    cfg = load_prompt_config("translate-en-fr", over)
    splits = load_splits(cfg.data, require_train=False)
    prompt = Translate(cfg.eval.options).prompts(splits, "test")[0]
    assert cfg.name == "translate-en-es" and prompt.split("\n")[-1] == "Let there be light. ="
    assert sorted(prompt.split("\n")[:4]) == sorted(f"{en} = {es}" for en, es in pairs["train"])
    lm = LookupLM({"Let there be light.": "Sea la luz."})
    assert Translate(cfg.eval.options).run(lm, splits, "test") == {"bleu": pytest.approx(1.0)}
