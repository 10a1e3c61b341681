"""T5 multi-task mixing (Raffel et al. 2020 §3.5.2): the rates of examples-proportional (r_m = min(e_m, K) /
Σ min(e_n, K)), temperature-scaled (r_m ∝ r_m^(1/T), renormalised) and equal mixing against the paper's formulas;
the sampler's empirical rates over many seeded draws; and a multi_task fine-tune of a text-to-text model on CPU that
scores each task, with the bundled mix-t5 recipe run end to end on stand-ins for its fetched sets."""

import json
import math
from collections import Counter
from pathlib import Path

import pytest
import torch
from training_testing import run_main

from lmforge.data.fetch.labelled_sets import LabelledSet, write_labelled
from lmforge.data.labelled.examples import Example
from lmforge.errors import LMForgeError
from lmforge.tasks.config import load_finetune_config
from lmforge.tasks.mixing import MixOptions, MixtureSampler, mixing_rates, mixture_sampler
from lmforge.train.distributed import DistInfo

pytestmark = pytest.mark.usefixtures("torch_globals")

SIZES = [100_000, 20_000, 3_000, 500]


def paper_proportional(sizes, k):
    """T5 §3.5.2, written out: r_m = min(e_m, K) / Σ_n min(e_n, K)."""
    capped = [min(e, k) for e in sizes]
    return [c / sum(capped) for c in capped]


def paper_temperature(sizes, k, t):
    """T5 §3.5.2: each proportional rate raised to 1/T, renormalised so the rates sum to 1."""
    scaled = [r ** (1 / t) for r in paper_proportional(sizes, k)]
    return [s / sum(scaled) for s in scaled]


@pytest.mark.parametrize("k", [2**10, 2**12, 2**14, 2**17])
def test_examples_proportional_rates_are_the_papers(k):
    rates = mixing_rates(SIZES, MixOptions("proportional", limit=k))
    assert rates == pytest.approx(paper_proportional(SIZES, k), rel=1e-12)
    assert sum(rates) == pytest.approx(1.0)


def test_limit_k_caps_the_large_tasks():
    no_limit = mixing_rates(SIZES, MixOptions("proportional"))
    assert no_limit == pytest.approx([e / sum(SIZES) for e in SIZES])  # concatenating the data sets
    # K above every size changes nothing; K below every size is equal mixing; in between it caps the large tasks.
    assert mixing_rates(SIZES, MixOptions("proportional", limit=10**6)) == pytest.approx(no_limit)
    assert mixing_rates(SIZES, MixOptions("proportional", limit=100)) == pytest.approx([0.25] * 4)
    capped = mixing_rates(SIZES, MixOptions("proportional", limit=3_000))
    assert capped == pytest.approx([3 / 9.5, 3 / 9.5, 3 / 9.5, 0.5 / 9.5])
    assert capped[0] < no_limit[0] and capped[3] > no_limit[3]


@pytest.mark.parametrize("t", [2.0, 4.0, 8.0])
def test_temperature_rates_are_the_papers(t):
    k = 2**14
    rates = mixing_rates(SIZES, MixOptions("temperature", limit=k, temperature=t))
    assert rates == pytest.approx(paper_temperature(SIZES, k, t), rel=1e-9)


def test_temperature_one_is_proportional_and_a_huge_one_is_equal():
    for k in (None, 2**12):
        prop = mixing_rates(SIZES, MixOptions("proportional", limit=k))
        assert mixing_rates(SIZES, MixOptions("temperature", limit=k, temperature=1.0)) == pytest.approx(prop)
    equal = mixing_rates(SIZES, MixOptions("equal"))
    assert equal == [0.25] * 4
    spreads = [max(mixing_rates(SIZES, MixOptions("temperature", temperature=t))) - 0.25 for t in (1, 2, 4, 8, 1e6)]
    assert spreads == sorted(spreads, reverse=True)  # rates approach equal mixing as T grows
    assert mixing_rates(SIZES, MixOptions("temperature", temperature=1e6)) == pytest.approx(equal, abs=1e-5)


@pytest.mark.parametrize(
    "mix", [MixOptions("proportional", limit=2_000), MixOptions("temperature", temperature=2.0), MixOptions("equal")]
)
def test_sampler_draws_each_task_at_its_rate(mix):
    sizes = [4_000, 1_000, 250]
    task_of = [m for m, n in enumerate(sizes) for _ in range(n)]
    sampler = mixture_sampler(task_of, 3, mix)
    rates = mixing_rates(sizes, mix)
    gen = torch.Generator().manual_seed(0)
    drawn = [i for _ in range(20) for i in sampler.indices(gen)]
    counts = Counter(task_of[i] for i in drawn)
    n = len(drawn)
    for m, r in enumerate(rates):
        sigma = math.sqrt(n * r * (1 - r))
        assert abs(counts[m] - n * r) < 5 * sigma, (m, counts[m] / n, r)
    assert sampler.epoch_size == sum(min(e, mix.limit or e) for e in sizes)


def test_sampler_shuffles_a_task_before_repeating_it():
    # Task 0 has 5 examples and takes ~90% of 100 draws: every example comes once per round of 5 draws of it.
    sampler = MixtureSampler([0] * 5 + [1] * 95, [0.9, 0.1], epoch_size=100)
    order = sampler.indices(torch.Generator().manual_seed(3))
    zeros = [i for i in order if i < 5]
    rounds = [zeros[j : j + 5] for j in range(0, len(zeros) - len(zeros) % 5, 5)]
    assert rounds and all(sorted(r) == list(range(5)) for r in rounds)
    ones = [i for i in order if i >= 5]
    assert len(set(ones)) == len(ones)  # fewer draws of task 1 than its examples: no repeats
    again = sampler.indices(torch.Generator().manual_seed(3))
    assert again == order  # a function of the generator's seed alone (what resuming relies on)


def test_feature_batches_follow_the_sampler_and_resume():
    from lmforge.finetuning.run import FeatureBatches

    feats = [{"input_ids": [i + 1], "_task": 0 if i < 30 else 1} for i in range(40)]
    sampler = mixture_sampler([f["_task"] for f in feats], 2, MixOptions("equal"))
    one = DistInfo(rank=0, world_size=1, local_rank=0)
    a = FeatureBatches(feats, 8, one, seed=1, pad_id=0, sampler=sampler)
    assert a.per_epoch == 5  # the mixture's epoch: Σ e_m = 40 draws
    first = [next(a).data["input_ids"].flatten().tolist() for _ in range(7)]
    seen = Counter(x - 1 >= 30 for batch in first for x in batch)
    assert seen[True] > 10  # equal mixing: task 1 (10 of 40 examples) is drawn about half the time
    state = a.state_dict()
    b = FeatureBatches(feats, 8, one, seed=1, pad_id=0, sampler=sampler)
    b.load_state_dict(state)
    assert [next(b).data["input_ids"].tolist() for _ in range(4)] == [next(a).data["input_ids"].tolist()
                                                                        for _ in range(4)]  # fmt: skip


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["--task.mix.rate=temperature"], "task.mix.rate=temperature needs task.mix.temperature (T5 tries 2, 4 and 8)"),
        (
            ["--task.mix.temperature=2"],
            "task.mix.temperature applies to task.mix.rate=temperature, not proportional (set one or the other)",
        ),
        (
            ["--task.mix.rate=equal"],
            "task.mix.limit caps the data-set sizes of proportional and temperature mixing; "
            "equal mixing does not use them",
        ),
        (["--task.mix.limit=0"], "task.mix.limit must be > 0, got 0"),
        (
            ["--task.mix.rate=uniform"],
            "task.mix.rate: expected one of 'proportional', 'temperature', 'equal', got 'uniform'",
        ),
    ],
)
def test_bad_mix_keys_fail_with_one_line(overrides, message):
    with pytest.raises(LMForgeError) as e:
        load_finetune_config("mix-t5", overrides)
    assert str(e.value) == message


# --- a multi-task fine-tune on CPU ---------------------------------------------------------------------------------


def stand_in(cache: Path, name: str, labels: list[str], n: int, rule) -> None:
    """A labelled set in `lmforge data fetch`'s layout under `cache`: n short texts, the label `rule(words)`."""
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    gen = torch.Generator().manual_seed(len(name))
    examples, keys = [], []
    for i in range(n):
        k = int(torch.randint(1, 7, (1,), generator=gen))
        text = [words[int(j)] for j in torch.randint(0, len(words), (k,), generator=gen)]
        examples.append(Example(text=" ".join(text), label=labels[rule(text)], id=f"{name}-{i}"))
        keys.append(str(i))
    lset = LabelledSet(examples, keys, "classification", labels, "stand-in", {"text": "words"})
    write_labelled(cache / "data" / name, name, "test", "stand-in", lset)


@pytest.fixture
def fetched(tmp_path, monkeypatch) -> Path:
    """mix-t5's fetched sets (hedge, drug-reviews) as small stand-ins in a cache of their own."""
    cache = tmp_path / "cache"
    stand_in(cache, "hedge", ["certain", "uncertain"], 120, lambda w: int(len(w) % 2 == 1))
    stand_in(cache, "drug-reviews", ["negative", "neutral", "positive"], 90, lambda w: len(w) % 3)
    monkeypatch.setenv("LMFORGE_CACHE", str(cache))
    return cache


def test_mix_t5_fine_tunes_three_tasks_and_scores_each(capsys, tmp_path, fetched):
    run = tmp_path / "mix"
    rc, out, err = run_main(
        capsys, "finetune", "mix-t5", f"--run.dir={run}", "--model.preset=t5-tiny", "--model.tokenizer_kind=bpe",
        "--model.vocab_size=512", "--data.max_train=64", "--data.max_eval=24", "--train.epochs=2",
        "--train.batch_size=16", "--train.lr=1e-3", "--task.mix.limit=40",
    )  # fmt: skip
    assert rc == 0, err
    counts = {
        n: json.loads((fetched / "data" / n / "meta.json").read_text())["counts"] for n in ("hedge", "drug-reviews")
    }
    n = {s: 24 + sum(min(24, c[s]) for c in counts.values()) for s in ("dev", "test")}
    assert min(c["train"] for c in counts.values()) >= 64
    # 64 training examples of each task; K = 40 caps each: 120 draws an epoch, 8 batches of 16.
    assert (
        f"fine-tuning none on multi_task (sst2-t5, hedge-t5, drugs-t5): train 192, dev {n['dev']}, test "
        f"{n['test']}; 16 steps" in out
    )
    dev = json.loads((run / "eval.json").read_text())
    assert set(dev) == {"average", "sst2-t5/accuracy", "hedge-t5/accuracy", "drugs-t5/accuracy"}
    mains = [dev["sst2-t5/accuracy"], dev["hedge-t5/accuracy"], dev["drugs-t5/accuracy"]]
    assert dev["average"] == pytest.approx(sum(mains) / 3)
    assert all(0.0 <= v <= 1.0 for v in mains)
    test = json.loads((run / "eval_test.json").read_text())
    assert set(test) == set(dev)
    logged = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if "dev_average" in r] == [8, 16]
    assert all("dev_hedge-t5/accuracy" in r for r in logged if "dev_average" in r)
    assert "majority-class baseline: sst2-t5/accuracy" in out  # each task's own majority class, not a pooled one

    # The saved run rebuilds every task from its TASK:LABEL label set and scores dev as the run did.
    from lmforge.loading import load_finetuned
    from lmforge.tasks.multi_task import load_task_splits

    task, model, _, cfg = load_finetuned(run)
    assert task.subtasks["drugs-t5"].labels == ["negative", "neutral", "positive"]
    again = task.evaluate(model, load_task_splits(cfg)["dev"])
    assert again == pytest.approx(dev)


def test_multi_task_runs_refuse_what_they_cannot_mix(capsys, tmp_path, fetched):
    cases = [
        (["--task.tasks=[sst2-t5]"], "error: task.tasks: a multi_task run mixes two or more tasks' recipes, got "
                                     "['sst2-t5']"),
        (["--task.tasks=[sst2-t5,sst2-bert]"], "error: task.tasks: sst2-bert is a classification task; a multi_task "
         "run mixes text-to-text task types (text_to_text, text_to_text_regression, seq2seq), whose targets are text"),
        (["--task.tasks=[sst2-t5,sst2-t5]"], "error: task.tasks: two tasks are named 'sst2-t5' (a task is named by "
                                             "its recipe's file stem)"),
        (["--data.name=hedge"], "error: data.name: a multi_task run reads each task's data from its recipe "
                                "(task.tasks); of the run's data section only data.max_train, data.max_eval apply"),
    ]  # fmt: skip
    for i, (over, message) in enumerate(cases):
        rc, _, err = run_main(capsys, "finetune", "mix-t5", f"--run.dir={tmp_path / str(i)}", *over)
        assert rc != 0 and err.strip().splitlines()[-1] == message


@pytest.mark.parametrize(
    "args, mix",
    [
        ([], {"rate": "proportional", "limit": 4096, "temperature": None}),
        (
            ["--task.mix.rate=temperature", "--task.mix.temperature=2"],
            {"rate": "temperature", "limit": 4096, "temperature": 2.0},
        ),
        (["--task.mix.rate=equal", "--task.mix.limit=null"], {"rate": "equal", "limit": None, "temperature": None}),
    ],
)
def test_mix_t5_documented_commands_resolve(capsys, args, mix):
    rc, out, err = run_main(capsys, "finetune", "mix-t5", *args, "--print-config")
    assert rc == 0, err
    import yaml

    cfg = yaml.safe_load(out)
    assert cfg["task"]["type"] == "multi_task" and cfg["task"]["tasks"] == ["sst2-t5", "hedge-t5", "drugs-t5"]
    assert cfg["task"]["mix"] == mix


def test_help_lists_the_mixing_keys(capsys):
    rc, out, err = run_main(capsys, "finetune", "mix-t5", "--help")
    assert rc == 0, err
    assert "task.type=multi_task (this recipe's)" in out
    assert "task.tasks: list of string = ['sst2-t5', 'hedge-t5', 'drugs-t5'] (default [])" in out
    assert "task.mix.rate: one of 'proportional', 'temperature', 'equal' = 'proportional'" in out
    assert "task.mix.limit: integer > 0 or null = 4096 (default null)" in out
