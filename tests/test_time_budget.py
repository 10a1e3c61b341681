"""train.time_budget: the run plans its steps from its measured step time so that it ends on the budget, with the
schedule's decay complete at the planned end; a resumed run continues the budget it had left. The clock is a fake
advanced by every step (a fixed cost per step, more for the first ones, as compilation costs), so the test asserts
the plan, not a timing."""

from __future__ import annotations

import pytest
import torch
from lm_objective_testing import TINY_DECODER

from lmforge.models import ModelConfig, Transformer
from lmforge.objectives.base import LossOutput
from lmforge.pretraining.config import TrainConfig
from lmforge.train.budget import TimeBudget
from lmforge.train.distributed import DistInfo
from lmforge.train.loop import Loop
from lmforge.train.loop_spec import LoopSpec, Saved
from lmforge.train.metrics import MetricsLogger, read_metrics
from lmforge.train.prefetch import Batch


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Batches:
    """Random token batches; each one drawn moves the fake clock on by `cost(i)` seconds."""

    def __init__(self, clock: _Clock, cost) -> None:
        self.clock, self.cost, self.i = clock, cost, 0
        self.gen = torch.Generator().manual_seed(0)

    def __next__(self) -> Batch:
        self.i += 1
        self.clock.now += self.cost(self.i)
        return Batch({"ids": torch.randint(0, 100, (2, 9), generator=self.gen)})

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, s):
        self.i = s["i"]


def _loss(model, batch) -> LossOutput:
    logits = model(batch["ids"][:, :-1]).logits
    return LossOutput(torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["ids"][:, 1:].flatten()), 16)


def _run(tmp_path, clock, cost, budget, resume_state=None, evaluate=None, **train):
    train = {"max_steps": 10_000, **train}
    cfg = TrainConfig(time_budget=budget, warmup_steps=5, lr=1e-2, log_every=5, prefetch=0,
                      schedule="wsd", decay_ratio=0.2, min_lr_ratio=0.0, save_every=10_000, **train)  # fmt: skip
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=100, **TINY_DECODER))
    with MetricsLogger(tmp_path) as log:
        spec = LoopSpec(saved=lambda: Saved(model, {}), evaluate=evaluate)
        loop = Loop(model, _loss, _Batches(clock, cost), cfg, tmp_path, spec, dist=DistInfo(),
                    device=torch.device("cpu"), log=log)  # fmt: skip
        loop.budget.clock = clock
        if resume_state is not None:
            loop.budget.load_state_dict(resume_state["budget"])
            loop._set_total(resume_state["budget"]["total"])
            loop.step = loop.schedule.last_step = resume_state["step"]
        loop.run()
    return loop


def test_the_run_ends_on_its_budget_with_the_decay_complete(tmp_path):
    clock = _Clock()
    # 0.1 s a step, the first five 2 s each (compilation): 40 s of budget hold 5 + (40 - 10) / 0.1 = 305 steps.
    loop = _run(tmp_path, clock, lambda i: 2.0 if i <= 5 else 0.1, budget=40.0)
    assert loop.step == loop.total == pytest.approx(305, abs=2)
    assert 39.5 <= loop.budget.elapsed() <= 40.5
    lrs = {r["step"]: r["lr"] for r in read_metrics(tmp_path) if "lr" in r}
    assert lrs[loop.step] == 0.0  # (a logged lr is the next step's) the linear decay has reached its end
    assert lrs[loop.step - 5] == pytest.approx(1e-2 * 5 / 61, rel=0.05)  # 61 steps of decay: 0.2 of 305
    decay_start = loop.step - round(0.2 * loop.step)
    assert lrs[max(s for s in lrs if s < decay_start)] == pytest.approx(1e-2)  # constant until the decay
    assert loop.budget.frozen


def test_max_steps_caps_the_plan_and_a_slow_host_gets_fewer_steps(tmp_path):
    assert _run(tmp_path / "cap", _Clock(), lambda i: 0.1, budget=40.0, max_steps=120).step == 120
    slow = _run(tmp_path / "slow", _Clock(), lambda i: 0.4, budget=40.0)
    assert slow.step == pytest.approx(100, abs=2)


def test_a_resumed_run_spends_what_was_left(tmp_path):
    clock = _Clock()
    first = _run(tmp_path / "a", clock, lambda i: 0.1, budget=10.0, max_steps=40)  # stops at 40 of ~100 steps
    state = {"budget": {**first.budget.state_dict(), "total": 100}, "step": first.step}
    assert state["budget"]["spent"] == pytest.approx(4.0, abs=0.2)
    resumed = _run(tmp_path / "b", clock, lambda i: 0.1, budget=10.0, resume_state=state)
    assert resumed.step == pytest.approx(100, abs=2)


def test_plan_is_fixed_once_the_decay_has_begun():
    clock = _Clock()
    b = TimeBudget(seconds=10.0, cap=1000, decay_ratio=0.5, clock=clock)
    b.start(0)
    clock.now += 1.0
    assert b.plan(10, 1000) == 100  # 0.1 s a step
    clock.now += 5.0  # the next ten steps took 0.5 s each: the plan shrinks, and the decay has begun at step 20
    assert b.plan(20, 100) == 20 + 8 and b.frozen
    clock.now += 0.1
    assert b.plan(21, 28) == 28


def test_a_long_compilation_in_the_first_window_does_not_end_the_run(tmp_path):
    # The first step takes 20 s (compilation), every other 0.1 s: the first window's plan (~6 steps, decay begun)
    # must not be fixed; 27 s hold 1 + (27 - 20) / 0.1 = 71 steps.
    loop = _run(tmp_path, _Clock(), lambda i: 20.0 if i == 1 else 0.1, budget=27.0)
    assert loop.step == loop.total == pytest.approx(71, abs=2)
    lrs = {r["step"]: r["lr"] for r in read_metrics(tmp_path) if "lr" in r}
    assert lrs[loop.step] == 0.0
    # Nor does it start a decay before the next plan (at step 10) has measured the steps without compilation.
    assert lrs[10] == lrs[15] == pytest.approx(1e-2)


def test_evaluations_during_the_run_do_not_end_it_early(tmp_path):
    # 0.1 s a step (the first five 2 s), and an evaluation every 20 steps that takes 1 s: 0.15 s a step with the
    # evaluations, so 40 s hold about 5 + 30 / 0.15 = 205 steps. A plan made from a window that held an evaluation
    # alone (0.3 s a step) would fix the decay early and end the run seconds before its budget.
    clock = _Clock()

    def evaluate(step):
        clock.now += 1.0
        return {"val_loss": 1.0}

    loop = _run(tmp_path, clock, lambda i: 2.0 if i <= 5 else 0.1, budget=40.0, evaluate=evaluate, eval_every=20)
    assert loop.step == loop.total == pytest.approx(205, abs=6)
    assert 39.0 <= loop.budget.elapsed() - 1.0 <= 40.5  # less the final evaluation, which the budget leaves out
