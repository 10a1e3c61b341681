"""The experiment runner's scheduling: a run on several processes (`--pretrain-procs N`) has the machine to itself,
and the single-process runs that are ready beside it wait for it (or it for them) instead of being lost."""

import json
import sys

import pytest

from lmforge.experiments import runner
from lmforge.experiments.arms import Arm, ArmResult
from lmforge.experiments.runner import run_arms

# a stand-in run: it sleeps, then writes when it started and ended
CHILD = (
    "import json, sys, time; t = time.time(); time.sleep(0.3); "
    "open(sys.argv[1], 'w').write(json.dumps([t, time.time()]))"
)


@pytest.mark.parametrize("multi_first", [True, False])
def test_a_run_on_several_processes_runs_alone_and_the_runs_ready_beside_it_all_run(tmp_path, monkeypatch, multi_first):
    monkeypatch.setattr(runner, "arm_command", lambda arm: [sys.executable, "-c", CHILD, str(arm.run_dir / "t.json")])
    monkeypatch.setattr(runner, "_finish", lambda arm, code, s: ArmResult(arm, "finished" if code == 0 else "failed"))
    first = Arm("pre", tmp_path / "pre", "encoder-fast", {}, 5)
    multi = Arm("tapt", tmp_path / "tapt", "encoder-fast", {}, 5, procs=2, after=["pre"])
    fine = [Arm(f"ft{i}", tmp_path / f"ft{i}", "sst2-bert", {}, kind="finetune", after=["pre"]) for i in range(3)]
    arms = [first, multi, *fine] if multi_first else [first, *fine, multi]
    results = run_arms(arms, jobs=2, poll_s=0.05)
    assert [r.arm.name for r in results] == [a.name for a in arms] and {r.state for r in results} == {"finished"}
    spans = {a.name: json.loads((a.run_dir / "t.json").read_text()) for a in arms}
    t0, t1 = spans.pop("tapt")
    assert all(end <= t0 or start >= t1 for start, end in spans.values())  # nothing else ran while it did
    if multi_first:  # ready first, it starts first: the others wait for it
        assert all(spans[f"ft{i}"][0] >= t1 for i in range(3))
