"""PPO end to end: on a toy reward (count a token) the held-out reward rises while the KL to the reference stays
within what the KL-regularised objective allows; on the bundled continuation data an SFT run → reward-model run →
PPO run raises the reward model's held-out score over the SFT policy (compared with DPO and best-of-n by
`lmforge align compare`); a PPO run killed mid-rollout resumes bit for bit."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from test_loop_resume import finished, killed_at, losses
from training_testing import restore_torch_globals

from lmforge.align.config import load_align_config
from lmforge.align.dpo import frozen_copy
from lmforge.align.ppo import ActorCritic, AdaptiveKL, PPOLoss, value_network
from lmforge.align.rollout import RolloutOptions, RolloutSource, sample_metrics, score_samples
from lmforge.align.run import load_reward_model
from lmforge.align.train import AlignTrainConfig
from lmforge.api import load
from lmforge.cli.align import cmd_compare, cmd_dpo, cmd_ppo, cmd_reward, cmd_sft
from lmforge.errors import LMForgeError
from lmforge.models import Transformer, get_preset
from lmforge.train.loop import fit


@pytest.fixture(autouse=True)
def _torch_globals():
    yield from restore_torch_globals()


def test_toy_reward_rises_with_the_kl_bounded(tmp_path):
    """Reward = how often token 7 appears in an 8-token response of a random-init policy (≈ 8/64 at first). PPO
    with β = 0.1 must raise it on held-out prompts, and since it maximises E[r] − β·KL, the KL it pays can be at
    most the reward it gains over β."""
    V, target, beta = 64, 7, 0.1
    torch.manual_seed(0)
    cfg = dataclasses.replace(get_preset("gpt-tiny"), vocab_size=V, d_model=32, d_ff=64, max_seq_len=32)
    policy = Transformer(cfg)
    reference = frozen_copy(policy)
    actor = ActorCritic(policy, value_network("policy", policy, None))
    g = torch.Generator().manual_seed(1)

    def prompts(n: int) -> list[list[int]]:
        return [torch.randint(8, V, (int(torch.randint(3, 7, (1,), generator=g)),), generator=g).tolist()
                for _ in range(n)]  # fmt: skip

    train, held_out = prompts(256), prompts(128)
    scorer = lambda r: ((r.input_ids[:, 1:] == target) & r.action_mask).sum(1).float()  # noqa: E731
    src = RolloutSource(actor, reference, scorer, train, RolloutOptions(max_new_tokens=8), rollout_batch=32,
                        minibatch=8, epochs=2, kl=AdaptiveKL(beta), seed=0, eos_id=None, pad_id=0)  # fmt: skip

    def evaluate(step: int = 0) -> dict[str, float]:
        return sample_metrics(score_samples(policy, reference, scorer, held_out, max_new_tokens=8, eos_id=None,
                                            pad_id=0, seed=1))  # fmt: skip

    before = evaluate()
    train_cfg = AlignTrainConfig(max_steps=80, lr=3e-3, warmup_steps=0, schedule="constant", prefetch=0,
                                 spike_factor=0, eval_every=80, log_every=10)  # fmt: skip
    after = fit(actor, PPOLoss(), src, train_cfg, tmp_path, evaluate)
    assert before["kl"] == 0 and before["reward"] < 0.3
    gain = after["reward"] - before["reward"]
    assert gain > 1.0  # from ≈ 0.1 target tokens per response to more than 1
    assert 0.5 < after["kl"] < gain / beta  # the policy moved, and E[r] − β·KL went up
    logged = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert {"policy_loss", "value_loss", "clipfrac", "approx_kl", "score", "kl", "kl_coef"} <= set(logged[-2])


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """SFT → reward model → PPO and DPO on the bundled continuation prompts (Austen passages), tiny and short."""
    d = tmp_path_factory.mktemp("ppo-runs")
    torch.set_num_threads(1)
    common = ["--data.max_train=800", "--model.max_len=80"]
    cmd_sft("sft-continuation", None, [f"--run.dir={d / 'sft'}", "--train.max_steps=80", "--train.eval_every=80",
                                       "--model.vocab_size=600", "--data.max_eval=40", *common])  # fmt: skip
    cmd_reward(None, str(d / "sft"), [f"--run.dir={d / 'rm'}", "--train.max_steps=40", "--train.eval_every=40",
                                      "--data.max_eval=60", *common])  # fmt: skip
    cmd_ppo(None, str(d / "sft"), [f"--run.dir={d / 'ppo'}", "--train.max_steps=96", "--train.eval_every=48",
                                   "--train.lr=3e-4", "--data.max_eval=128", "--ppo.rollout_batch=32",
                                   "--ppo.max_new_tokens=12", *common], reward=str(d / "rm"))  # fmt: skip
    cmd_dpo(None, str(d / "sft"), [f"--run.dir={d / 'dpo'}", "--train.max_steps=20", "--train.eval_every=20",
                                   "--data.max_eval=20", *common])  # fmt: skip
    return d


def test_ppo_raises_the_reward_models_held_out_score(runs, capsys):
    lines = [json.loads(x) for x in (runs / "ppo" / "metrics.jsonl").read_text().splitlines()]
    dev = {r["step"]: r for r in lines if "dev_reward" in r}
    assert sorted(dev) == [0, 48, 96] and dev[0]["dev_kl"] == 0  # step 0: the SFT policy itself
    assert dev[96]["dev_reward"] > dev[0]["dev_reward"] and 0 < dev[96]["dev_kl"] < 20
    assert json.loads((runs / "ppo" / "eval.json").read_text())["reward"] == pytest.approx(dev[96]["dev_reward"])
    policy, tok = load(runs / "ppo")  # the checkpoint holds policy and value network; load gives the policy
    sft, _ = load(runs / "sft")
    assert policy.config == sft.config and tok.vocab_size == policy.config.vocab_size
    assert any(not torch.equal(a, b) for a, b in zip(policy.parameters(), sft.parameters()))
    with pytest.raises(LMForgeError, match="is not a reward-model checkpoint"):
        load_reward_model(runs / "ppo")

    capsys.readouterr()
    rows = cmd_compare(str(runs / "sft"), str(runs / "rm"), [str(runs / "ppo"), f"dpo={runs / 'dpo'}"], [4],
                       max_prompts=160, out=str(runs / "compare"))  # fmt: skip
    by = {r.method: r for r in rows}
    assert list(by) == ["sft (reference)", "ppo", "dpo", "best-of-4"]
    sft_row, ppo_row = by["sft (reference)"], by["ppo"]
    # on unseen test prompts: a gain of more than three (paired) standard errors, at a KL the run reported
    assert ppo_row.gain == pytest.approx(ppo_row.reward - sft_row.reward) and ppo_row.gain > 3 * ppo_row.gain_se
    assert sft_row.kl == 0 and 0 < ppo_row.kl < 20 and ppo_row.kl_se > 0
    bon = by["best-of-4"]  # its first draw is the reference's own sample: no prompt scores lower
    assert bon.kl == pytest.approx(math.log(4) - 3 / 4) and bon.gain > 0 and bon.reward >= sft_row.reward
    table = (runs / "compare.md").read_text()
    assert table in capsys.readouterr().out
    assert "| ppo |" in table and "- **best-of-4**:" in table and "≤ 0.636 (bound)" in table
    saved = json.loads((runs / "compare.json").read_text())
    assert len(saved["prompts"]) == len(saved["rows"][0]["samples"]) > 100


def test_ppo_config_errors(runs, tmp_path):
    with pytest.raises(LMForgeError, match="ppo needs a reward model: pass --reward RUN"):
        cmd_ppo(None, str(runs / "sft"), [f"--run.dir={tmp_path / 'a'}"])
    with pytest.raises(LMForgeError, match="ppo starts from an SFT run"):
        cmd_ppo(None, "gpt-tiny", [f"--run.dir={tmp_path / 'b'}"], reward=str(runs / "rm"))
    with pytest.raises(LMForgeError) as e:
        load_align_config("ppo-continuation", ["--ppo.rollout_batch=20"])
    assert str(e.value) == "ppo.rollout_batch (20) must be a multiple of train.batch_size × train.grad_accum (8)"
    with pytest.raises(LMForgeError) as e:
        load_align_config("ppo-continuation", ["--ppo.clip_range=0"])
    assert str(e.value) == "ppo.clip_range must be in (0, 1], got 0.0"
    with pytest.raises(LMForgeError, match=r"compare: name the held-out prompts with --prompts-from RUN"):
        cmd_compare(str(runs / "sft"), str(runs / "rm"))
    with pytest.raises(LMForgeError, match="--best-of-n needs n >= 2, got 1"):
        cmd_compare(str(runs / "sft"), str(runs / "rm"), best_of_n=[1], prompts_from=str(runs / "ppo"), max_prompts=4)
    other = tmp_path / "other-rm"  # a reward model with a tokenizer of its own
    cmd_reward(None, "gpt-tiny", [f"--run.dir={other}", "--train.max_steps=1", "--model.vocab_size=300",
                                  "--data.max_train=40", "--data.max_eval=4", "--model.max_len=48"])  # fmt: skip
    with pytest.raises(LMForgeError, match="use different tokenizers"):
        cmd_ppo(None, str(runs / "sft"), [f"--run.dir={tmp_path / 'c'}"], reward=str(other))


@pytest.mark.slow
def test_ppo_resumes_bit_identically(runs, tmp_path):
    """Killed inside its second rollout (4 updates per rollout; the last checkpoint is 2 updates into it), the run
    continues with the saved rollout and samples the third from the same policy and seed: every step's loss, and
    the final held-out evaluation, are the uninterrupted run's."""

    def args(run: Path) -> list[str]:
        return ["align", "ppo", "--init", str(runs / "sft"), "--reward", str(runs / "rm"), f"--run.dir={run}",
                "--data.max_train=200", "--data.max_eval=16", "--model.max_len=80", "--ppo.rollout_batch=16",
                "--ppo.epochs=2", "--ppo.max_new_tokens=8", "--ppo.reward_norm_samples=32",
                "--train.max_steps=10", "--train.log_every=1", "--train.save_every=2", "--train.eval_every=10",
                "--train.deterministic"]  # fmt: skip

    ref, run = tmp_path / "ref", tmp_path / "run"
    finished(args(ref), tmp_path)
    killed_at(args(run), tmp_path, 7)  # the last checkpoint is step 6: two updates into the second rollout
    finished(["align", "ppo", f"--run.dir={run}", "--resume"], tmp_path)
    assert [s for s, _ in losses(ref)] == list(range(1, 11))
    assert losses(run) == losses(ref)
    assert json.loads((run / "eval.json").read_text()) == json.loads((ref / "eval.json").read_text())
