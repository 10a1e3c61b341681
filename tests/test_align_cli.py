"""Alignment runs through the command functions: SFT → reward model and DPO → best-of-n, files and numbers they
write, the bundled recipes, and bad input as one clear error."""

from __future__ import annotations

import json
import math

import pytest
import torch

from lmforge.align.config import load_align_config
from lmforge.align.run import load_reward_model
from lmforge.api import load
from lmforge.cli.align import cmd_align_data, cmd_best_of_n, cmd_dpo, cmd_reward, cmd_sft
from lmforge.config import RECIPES_DIR
from lmforge.errors import LMForgeError


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("align-data")
    cmd_align_data("instructions", str(d / "sft"), ["sentiment"], max_train=400, max_eval=60)
    cmd_align_data("preferences", str(d / "pref"), ["continuation"], max_train=400, max_eval=60)
    return d


@pytest.fixture(scope="module")
def sft_run(data, tmp_path_factory):
    run = tmp_path_factory.mktemp("sft") / "run"
    over = [f"--run.dir={run}", f"--data.train={data / 'sft/train.jsonl'}", f"--data.dev={data / 'sft/dev.jsonl'}",
            "--model.vocab_size=600", "--train.max_steps=40", "--train.eval_every=20", "--train.lr=2e-3",
            "--sft.pack=true", "--sft.pack_len=256", "--model.max_len=128"]  # fmt: skip
    final = cmd_sft(None, "gpt-tiny", over)
    return run, final


def test_sft_run_writes_a_loadable_policy(sft_run, data):
    run, final = sft_run
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    dev = [x["dev_response_loss"] for x in lines if "dev_response_loss" in x]
    assert len(dev) == 2 and dev[1] < dev[0]  # evaluations at steps 20 and 40, loss falling
    assert json.loads((run / "eval.json").read_text()) == final
    assert set(final) == {"response_loss", "choice_accuracy"} and 0 <= final["choice_accuracy"] <= 1
    model, tok = load(run)
    assert tok.token_to_id("<|assistant|>") is not None and model.config.vocab_size == tok.vocab_size
    cfg = load_align_config(run / "config.yaml")  # the saved config is itself a recipe
    assert cfg.method == "sft" and cfg.sft.pack and cfg.train.max_steps == 40


def test_reward_dpo_and_best_of_n_from_the_sft_run(sft_run, data, tmp_path, capsys):
    run, _ = sft_run
    pref = [f"--data.train={data / 'pref' / 'train.jsonl'}", f"--data.dev={data / 'pref' / 'dev.jsonl'}",
            "--train.eval_every=10", "--model.max_len=96"]  # fmt: skip
    rm = cmd_reward(None, str(run), [f"--run.dir={tmp_path / 'rm'}", "--train.max_steps=20", *pref])
    assert set(rm) == {"accuracy", "margin"}
    dpo = cmd_dpo(None, str(run), [f"--run.dir={tmp_path / 'dpo'}", "--train.max_steps=10", *pref])
    assert set(dpo) == {"reward_margin", "reward_accuracy", "logp_margin", "logp_accuracy"}
    assert all(math.isfinite(v) for v in dpo.values()) and 0 <= dpo["reward_accuracy"] <= 1
    reward_model, _ = load_reward_model(tmp_path / "rm")
    policy, _ = load(tmp_path / "dpo")
    assert policy.config.vocab_size == reward_model.config.vocab_size
    capsys.readouterr()
    results = cmd_best_of_n(
        str(tmp_path / "dpo"), str(tmp_path / "rm"), ["Continue the passage."], n=3, max_new_tokens=6
    )
    out = capsys.readouterr().out
    assert len(results) == 1 and len(results[0].candidates) == 3
    assert results[0].reward == max(results[0].rewards)
    assert out.count("\n* ") + out.startswith("* ") == 1  # exactly one candidate is starred as the pick
    with pytest.raises(LMForgeError, match="is not a reward-model checkpoint"):
        load_reward_model(tmp_path / "dpo")


def test_every_bundled_recipe_loads():
    names = sorted(p.stem for p in (RECIPES_DIR / "align").glob("*.yaml"))
    assert names == ["dpo-continuation", "dpo-sentiment", "ppo-continuation", "reward-continuation",
                     "sft-continuation", "sft-instructions", "sft-sentiment"]  # fmt: skip
    methods = {n: load_align_config(n).method for n in names}
    assert methods["sft-instructions"] == "sft" and methods["reward-continuation"] == "reward"
    assert methods["dpo-sentiment"] == "dpo" and methods["ppo-continuation"] == "ppo"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("--train.lrr=1e-3", "unknown config key 'train.lrr' — did you mean 'train.lr'?"),
        ("--dpo.beta=0", "dpo.beta must be positive, got 0.0"),
        ("--model.template=vicuna", "model.template: expected one of 'alpaca', 'chat', got 'vicuna'"),
        ("--sft.pack=true", "sft.pack_len (512) must be >= model.max_len (1024)"),
    ],
)
def test_bad_config_is_one_clear_error(override, message):
    over = [override] + (["--model.max_len=1024"] if override.startswith("--sft") else [])
    with pytest.raises(LMForgeError) as e:
        load_align_config("sft-sentiment", over)
    assert str(e.value) == message


def test_bad_runs_are_clear_errors(tmp_path, sft_run):
    with pytest.raises(LMForgeError, match="recipe dpo-continuation is a 'dpo' recipe, not 'sft'"):
        cmd_sft("dpo-continuation", "gpt-tiny", [f"--run.dir={tmp_path / 'x'}"])
    with pytest.raises(LMForgeError, match="model.init: 'no-such-model' is neither"):
        cmd_sft(None, "no-such-model", [f"--run.dir={tmp_path / 'y'}"])
    with pytest.raises(LMForgeError, match="already has checkpoints"):
        cmd_sft(None, "gpt-tiny", [f"--run.dir={sft_run[0]}"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instruction": "q"}\n')
    with pytest.raises(LMForgeError) as e:
        cmd_sft(None, "gpt-tiny", [f"--run.dir={tmp_path / 'z'}", f"--data.train={bad}"])
    assert str(e.value) == f"{bad}:1: field 'output' is missing"
    with pytest.raises(LMForgeError, match="alignment needs a decoder model, 'bert-tiny' is arch 'encoder'"):
        cmd_sft(None, "bert-tiny", [f"--run.dir={tmp_path / 'w'}", "--data.max_train=20", "--data.max_eval=5"])


def test_instruction_tuning_changes_the_answers_to_follow_the_template(sft_run, data):
    """Before SFT the model's greedy answer to a review question is not a label word; after 40 steps of SFT on
    the sentiment instructions it answers with "positive" or "negative" (the template's response format)."""
    from lmforge.align.data import read_instructions
    from lmforge.align.templates import get_template
    from lmforge.models.generate import generate

    run, _ = sft_run
    tuned, tok = load(run)
    torch.manual_seed(0)
    base = type(tuned)(tuned.config).eval()  # the same architecture before instruction tuning (random init)
    template = get_template(load_align_config(run / "config.yaml").model.template, tok)
    convs = read_instructions(data / "sft/dev.jsonl")[:12]

    def label_answers(model) -> int:
        hits = 0
        for conv in convs:
            ids = torch.tensor([template.prompt_ids(conv, max_len=100)])
            out = generate(model, ids, max_new_tokens=3, temperature=0.0, eos_id=tok.eos_id)
            answer = tok.decode(out[0, ids.shape[1] :].tolist()).strip().lower()
            hits += answer.startswith(("positive", "negative"))
        return hits

    assert label_answers(base) == 0
    assert label_answers(tuned) >= 10
