"""The paper-row experiments: t5-corruption (T5 Tables 5-6), mlm-mask-rate (Wettig et al. 2023), c4-cleaning (T5
Table 8) and t5-mixing (T5 Table 11), with their -tiny variants. Their claims carry the papers' own numbers; each arm
is the variant its paper defines, measured on the objective it builds (corruption rates and styles, masking rates,
mixing rates); and c4-cleaning-tiny runs end to end on CPU with each arm on its own prepared corpus."""

import json
import re
from pathlib import Path

import pytest
import torch
from encoder_testing import tokenizer
from training_testing import write_docs

from lmforge.cli import main
from lmforge.experiments.arms import resolve_config
from lmforge.experiments.data import data_key
from lmforge.experiments.plan import plan_experiment
from lmforge.experiments.spec import load_experiment
from lmforge.objectives import OBJECTIVES
from lmforge.objectives.seq2seq import ordinary_ids
from lmforge.tasks.config import load_finetune_config
from lmforge.tasks.mixing import mixing_rates

pytestmark = pytest.mark.usefixtures("torch_globals")

NEW = ["t5-corruption", "mlm-mask-rate", "c4-cleaning", "t5-mixing"]

# The papers' numbers. T5 (Raffel et al. 2020, arXiv v4), GLUE average: Table 5 (15% i.i.d. corruption), Table 6
# (replace corrupted spans at each rate), Table 8 (pretraining data), Table 11 (mixing; proportional at K = 2^19).
# Wettig et al. 2023: the released BERT-large-shaped models' dev scores (princeton-nlp/DinkyTrain README).
PAPER = {
    "t5-corruption": {"bert-style": 82.96, "mass-style": 82.32, "replace-spans": 83.28, "drop-tokens": 84.44,
                      "corrupt-10": 82.82, "corrupt-25": 83.00, "corrupt-50": 81.27},
    "c4-cleaning": {"cleaned": 83.28, "unfiltered": 81.46},
    "t5-mixing": {"equal": 76.13, "proportional": 81.42, "temperature-2": 81.90, "temperature-8": 77.21},
    "mlm-mask-rate": {"mask-15": {"MNLI": 84.2, "SST-2": 93.3}, "mask-40": {"MNLI": 84.5, "SST-2": 92.8},
                      "mask-80": {"MNLI": 80.8, "SST-2": 90.5}},
}  # fmt: skip


@pytest.mark.parametrize("name", NEW)
def test_claims_carry_the_papers_numbers(name):
    exp = load_experiment(name)
    arms = {a.name for a in exp.arms} | {a.name for a in exp.finetune_arms}
    tasks = {t.name for t in exp.tasks}
    assert exp.claims
    for claim in exp.claims:
        assert {claim.better, claim.worse} <= arms, claim.name
        task, split, metric = claim.column.split(" ")
        assert task in tasks and split == "test" and metric in ("accuracy", "average")
        better, worse = PAPER[name][claim.better], PAPER[name][claim.worse]
        if name == "mlm-mask-rate":  # "MNLI +0.3 (84.5 vs 84.2)" or "SST-2 +2.8 (93.3 vs 90.5)"
            bench, diff, a, b = re.match(r"(\S+) ([+-][\d.]+) \(([\d.]+) vs ([\d.]+)\)", claim.paper).groups()
            better, worse = better[bench], worse[bench]
        else:  # "+1.82 GLUE (83.28 vs 81.46) ..."
            diff, a, b = re.match(r"([+-][\d.]+) GLUE \(([\d.]+) vs ([\d.]+)", claim.paper).groups()
        assert (float(a), float(b)) == (better, worse), claim.name
        assert float(diff) == pytest.approx(better - worse, abs=0.006), claim.name


@pytest.mark.parametrize("name", NEW)
def test_tiny_variant_keeps_the_arms_claims_and_shrinks(name):
    gpu, tiny = load_experiment(name), load_experiment(f"{name}-tiny")
    assert [a.name for a in tiny.arms] == [a.name for a in gpu.arms]
    assert [c.name for c in tiny.claims] == [c.name for c in gpu.claims] and tiny.description == gpu.description
    assert tiny.budget.value < gpu.budget.value / 100 and tiny.finetune_seeds == [0]
    for spec in tiny.arms:
        assert resolve_config(str(spec.recipe or tiny.recipe), tiny.overrides | spec.overrides).model.d_model == 64


def pretrain_configs(name: str) -> dict:
    """Pretraining arm → its resolved config (seed 0), as the runner builds it."""
    plan = plan_experiment(load_experiment(name), make_data=False)
    return {a.info["arm"]: resolve_config(a.recipe, a.overrides) for a in plan.arms
            if a.kind == "pretrain" and a.info["seed"] == 0}  # fmt: skip


def corrupt_unique_rows(obj, tok, n_rows: int, length: int):
    """(x, src, tgt): n_rows of `length` distinct ordinary tokens each, and what the objective makes of them."""
    pool = ordinary_ids(tok, tok.vocab_size)
    x = torch.stack([pool[torch.randperm(len(pool))[:length]] for _ in range(n_rows)])
    src, src_len, tgt, tgt_len = obj.corrupt(x)
    rows = lambda t, n: [t[i, : n[i]].tolist() for i in range(n_rows)]  # noqa: E731
    return x, rows(src, src_len), rows(tgt, tgt_len)


def test_t5_corruption_arms_are_tables_5_and_6_variants():
    tok = tokenizer("bpe", "t5", 1024)
    sentinels = set(tok.sentinel_ids(tok.num_sentinels))
    rates = {}
    for arm, cfg in pretrain_configs("t5-corruption-tiny").items():
        cfg.model.vocab_size = tok.vocab_size
        obj = OBJECTIVES.get("t5")(cfg, tok)
        torch.manual_seed(0)
        x, src, tgt = corrupt_unique_rows(obj, tok, 256, cfg.train.seq_len)
        hit = masked = 0
        for row, s, t in zip(x.tolist(), src, tgt):
            if arm in ("bert-style", "mass-style"):  # the whole text in (corrupted in place) and out
                assert len(s) == len(row) and t == row
                hit += sum(a != b for a, b in zip(s, row))
                masked += sum(a == obj.mask_id for a in s)
            elif arm == "drop-tokens":  # corrupted tokens left out; the target: them, in order
                assert not sentinels & set(s) and not sentinels & set(t)
                assert sorted(s + t) == sorted(row) and [v for v in row if v not in t] == s
                assert t == [v for v in row if v in t]
                hit += len(t)
            else:  # replace corrupted spans: each run of corrupted tokens → one sentinel, the target its tokens
                kept = [v for v in s if v not in sentinels]
                noised = [v for v in row if v not in kept]
                assert [v for v in t if v not in sentinels] == noised
                runs = sum(1 for i, v in enumerate(row) if v in noised and (i == 0 or row[i - 1] not in noised))
                assert sum(v in sentinels for v in s) == runs == sum(v in sentinels for v in t)
                hit += len(noised)
        rates[arm] = hit / x.numel()
        if arm == "bert-style":  # T5's BERT-style: 90% of the corrupted tokens masked, 10% a random token
            assert masked / hit == pytest.approx(0.9, abs=0.03)
        if arm == "mass-style":
            assert masked == hit
    want = {"bert-style": 0.15, "mass-style": 0.15, "replace-spans": 0.15, "drop-tokens": 0.15, "corrupt-10": 0.10,
            "corrupt-25": 0.25, "corrupt-50": 0.50}  # fmt: skip
    assert rates.keys() == want.keys()
    for arm, rate in rates.items():  # 16,384 tokens a style: the binomial sd is at most 0.004
        assert rate == pytest.approx(want[arm], abs=0.015), arm


def test_mlm_mask_rate_arms_mask_every_selected_token_and_validate_at_15_percent():
    tok = tokenizer("bpe", "bart", 1024)
    pool = ordinary_ids(tok, tok.vocab_size)
    for arm, cfg in pretrain_configs("mlm-mask-rate-tiny").items():
        obj = OBJECTIVES.get(cfg.objective.name)(cfg, tok)
        torch.manual_seed(0)
        windows = pool[torch.randint(len(pool), (256, cfg.train.seq_len + 1))]
        candidates = obj.candidates(obj.inputs(windows)).sum()  # the window's tokens, framing tokens left out
        for batch, rate in ((obj.transform(windows), int(arm[-2:]) / 100), (obj.eval_transform(windows), 0.15)):
            selected = batch["labels"] != -100
            assert selected.sum() / candidates == pytest.approx(rate, abs=0.02), arm
            # Wettig et al.'s default: every selected token becomes <mask> (no 80/10/10)
            assert bool((batch["input_ids"][selected] == tok.mask_id).all()), arm


def test_t5_mixing_arms_are_table_11_strategies():
    exp = load_experiment("t5-mixing")
    plan = plan_experiment(exp, make_data=False)
    sizes = [10194, 2415, 793]  # mix-t5's tasks: sentiment, hedge, drug-reviews (training examples)
    mixes = {}
    for arm in (a for a in plan.arms if a.kind == "finetune" and a.info["seed"] == 0):
        cfg = load_finetune_config(arm.recipe, [f"--{k}={json.dumps(v)}" for k, v in arm.overrides.items()])
        mixes[arm.info["arm"]] = cfg.task.options.mix
        assert cfg.train.max_steps == 1260  # equal steps for every strategy, as T5
    assert {k: m.describe() for k, m in mixes.items()} == {
        "equal": "equal", "proportional": "examples-proportional, K=4096",
        "temperature-2": "temperature-scaled, T=2", "temperature-8": "temperature-scaled, T=8",
    }  # fmt: skip
    capped = [4096, 2415, 793]
    assert mixing_rates(sizes, mixes["proportional"]) == pytest.approx([c / sum(capped) for c in capped])
    root = [s**0.5 for s in sizes]
    assert mixing_rates(sizes, mixes["temperature-2"]) == pytest.approx([r / sum(root) for r in root])
    assert mixing_rates(sizes, mixes["equal"]) == pytest.approx([1 / 3] * 3)


def test_c4_cleaning_arms_get_their_own_corpus():
    cfgs = pretrain_configs("c4-cleaning")
    assert (cfgs["cleaned"].data.clean, cfgs["unfiltered"].data.clean) == (True, False)
    assert data_key(cfgs["cleaned"]) != data_key(cfgs["unfiltered"])  # OUT/shared/<key>: one prepared corpus each
    cfgs["unfiltered"].data.clean = True
    assert data_key(cfgs["cleaned"]) == data_key(cfgs["unfiltered"])  # nothing else differs


BOILERPLATE = "Home | About | Contact\nClick here\nShare this page\nvar x = 1; // javascript\n"


@pytest.fixture
def web_docs(tmp_path) -> Path:
    """Bundled chapters with web boilerplate lines (which C4's line rules remove), and two lorem-ipsum pages (which
    its page rules remove)."""
    chapters = [json.loads(x)["text"] for x in write_docs(tmp_path / "raw.jsonl", 10).read_text().splitlines()]
    docs = [BOILERPLATE + c + "\n" + BOILERPLATE for c in chapters]
    docs += ["Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 3 + "\n" + chapters[0]] * 2
    path = tmp_path / "web.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    return path


@pytest.mark.slow
def test_c4_cleaning_tiny_runs_each_arm_on_its_own_corpus(tmp_path, web_docs, capsys, monkeypatch):
    out = tmp_path / "exp"
    monkeypatch.chdir(tmp_path)
    rc = main(["experiment", "c4-cleaning-tiny", "--out", str(out), f"--data.inputs=[{web_docs}]",
               "--budget.tokens=5120", "--train.eval_every=5", "--train.save_every=10", "--finetune.data.max_train=64",
               "--finetune.data.max_eval=32", "--jobs", "2"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 0, err[-3000:]
    shared = {}
    for arm in ("cleaned", "unfiltered"):
        config = (out / "pretrain" / f"{arm}-s0" / "config.yaml").read_text()
        data = Path(re.search(r"prepared: (\S+)", config).group(1))
        assert data.parent.parent == out / "shared"
        shared[arm] = (data, json.loads((data / "meta.json").read_text()))
    (clean_dir, clean), (raw_dir, raw) = shared["cleaned"], shared["unfiltered"]
    assert clean_dir != raw_dir
    assert clean["train"]["n_tokens"] < raw["train"]["n_tokens"]
    tokenizers = [(d.parent / "tokenizer" / "tokenizer.json").read_bytes() for d in (clean_dir, raw_dir)]
    assert tokenizers[0] == tokenizers[1]  # one tokenizer, trained on the raw text: only the corpus differs
    report = json.loads((out / "c4-cleaning-tiny.json").read_text())
    assert [row["arm"] for row in report["rows"]][:2] == ["cleaned", "unfiltered"]
    (claim,) = report["claims"]
    assert claim["column"] == "sentiment test accuracy" and claim["seeds"] == [0]
    for arm in ("cleaned", "unfiltered"):
        assert (out / "finetune" / "sentiment" / f"{arm}-s0" / "eval_test.json").is_file()
