"""PPO's pieces against hand computations: GAE, the clipped policy and value losses, where the KL penalty and the
score land, advantage whitening, the rollout layout and masks (EOS, padding), the adaptive KL coefficient, dropout
kept off, and the rollout source resuming mid-rollout."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from lmforge.align.dpo import frozen_copy
from lmforge.align.ppo import (
    ActorCritic,
    AdaptiveKL,
    PPOLoss,
    gae,
    kl_penalized_rewards,
    last_action,
    normalize_head,
    policy_loss,
    value_loss,
    value_network,
    whiten,
)
from lmforge.align.reward import RewardModel
from lmforge.align.rollout import RolloutOptions, RolloutSource, layout, left_pad
from lmforge.errors import LMForgeError
from lmforge.models import Transformer, get_preset


def tiny(vocab: int = 40, dropout: float = 0.0) -> Transformer:
    torch.manual_seed(0)
    cfg = dataclasses.replace(get_preset("gpt-tiny"), vocab_size=vocab, d_model=32, d_ff=64, max_seq_len=32)
    return Transformer(dataclasses.replace(cfg, dropout=dropout, attn_dropout=dropout))


def test_gae_matches_a_hand_computation():
    # One response of three tokens at label positions 1..3; position 0 is the prompt, 4 is padding.
    mask = torch.tensor([[0, 1, 1, 1, 0]], dtype=torch.bool)
    values = torch.tensor([[9.0, 1.0, 2.0, 0.5, 7.0]])  # 9 and 7 are off the mask: they must not count
    rewards = torch.tensor([[0.0, 0.1, -0.2, 1.0, 0.0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # δ3 = 1.0 − 0.5 = 0.5 (V = 0 after the last token); δ2 = −0.2 + 0.9·0.5 − 2 = −1.75; δ1 = 0.1 + 0.9·2 − 1 = 0.9
    # Â3 = 0.5; Â2 = −1.75 + 0.72·0.5 = −1.39; Â1 = 0.9 + 0.72·(−1.39) = −0.1008
    torch.testing.assert_close(adv, torch.tensor([[0.0, -0.1008, -1.39, 0.5, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[0.0, 0.8992, 0.61, 1.0, 0.0]]))


def test_gae_with_gamma_and_lambda_one_is_reward_to_go_minus_value():
    g = torch.Generator().manual_seed(0)
    rewards, values = torch.randn(3, 7, generator=g), torch.randn(3, 7, generator=g)
    mask = torch.zeros(3, 7, dtype=torch.bool)
    mask[0, 1:6], mask[1, 3:7], mask[2, 0:2] = True, True, True
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    r = rewards * mask
    to_go = r.flip(1).cumsum(1).flip(1)  # Σ_{k≥t} r_k
    torch.testing.assert_close(ret, to_go * mask)
    torch.testing.assert_close(adv, (to_go - values) * mask)


def test_gae_equals_the_backward_recursion():
    g = torch.Generator().manual_seed(1)
    N, T, gamma, lam = 4, 9, 0.97, 0.9
    rewards, values = torch.randn(N, T, generator=g), torch.randn(N, T, generator=g)
    lo, n = torch.tensor([0, 2, 5, 1]), torch.tensor([9, 4, 1, 6])
    t = torch.arange(T)
    mask = (t >= lo[:, None]) & (t < (lo + n)[:, None])
    adv, _ = gae(rewards, values, mask, gamma, lam)
    for i in range(N):
        running, want = 0.0, torch.zeros(T)
        for k in reversed(range(int(lo[i]), int(lo[i] + n[i]))):
            nxt = float(values[i, k + 1]) if k + 1 < lo[i] + n[i] else 0.0
            running = float(rewards[i, k]) + gamma * nxt - float(values[i, k]) + gamma * lam * running
            want[k] = running
        torch.testing.assert_close(adv[i], want, atol=1e-5, rtol=1e-5)


def test_kl_penalty_on_every_response_token_and_the_score_on_the_last():
    mask = torch.tensor([[0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]], dtype=torch.bool)
    logp = torch.full((2, 6), -1.0)
    ref = torch.full((2, 6), -1.5)  # log π − log π_ref = 0.5 everywhere
    rewards, kl = kl_penalized_rewards(torch.tensor([2.0, -3.0]), logp, ref, mask, kl_coef=0.1)
    assert last_action(mask).tolist() == [3, 5]
    torch.testing.assert_close(kl, 0.5 * mask.float())
    want = torch.tensor([[0, -0.05, -0.05, 2 - 0.05, 0, 0], [0, 0, -0.05, -0.05, -0.05, -3 - 0.05]])
    torch.testing.assert_close(rewards, want)


def test_whitening_is_over_the_masked_positions_only():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 8, generator=g) * 4 + 3
    mask = torch.rand(3, 8, generator=g) > 0.4
    w = whiten(x, mask)
    assert float(w[mask].mean()).__abs__() < 1e-6
    assert math.isclose(float(w[mask].var(unbiased=False)), 1.0, rel_tol=1e-4)
    assert bool((w[~mask] == 0).all())
    y = x.clone()
    y[~mask] = 1e6  # values off the mask change nothing
    torch.testing.assert_close(whiten(y, mask), w)


def test_clipped_policy_loss_is_pessimistic_and_clipped_terms_have_no_gradient():
    # ratio 1.5 and 0.5, advantage ±1, ε = 0.2
    old = torch.zeros(4)
    logp = torch.log(torch.tensor([1.5, 1.5, 0.5, 0.5])).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    out = policy_loss(logp, old, adv, clip=0.2)
    # per token: max(−Aρ, −A·clip(ρ)) = max(−1.5, −1.2), max(1.5, 1.2), max(−0.5, −0.8), max(0.5, 0.8)
    assert math.isclose(float(out["loss"].detach()), (-1.2 + 1.5 - 0.5 + 0.8) / 4, rel_tol=1e-6)
    assert math.isclose(float(out["clipfrac"]), 0.5)  # tokens 1 and 4 take the clipped term
    out["loss"].backward()
    # d/dlogp of −Aρ is −Aρ/4 where unclipped; 0 where the clipped (constant) term wins
    torch.testing.assert_close(logp.grad, torch.tensor([0.0, 1.5 / 4, -0.5 / 4, 0.0]))
    assert math.isclose(
        float(out["approx_kl"]), 0.5 * (2 * math.log(1.5) ** 2 + 2 * math.log(0.5) ** 2) / 4, rel_tol=1e-5
    )


def test_clipped_value_loss():
    old = torch.tensor([1.0, 1.0, 1.0])
    values = torch.tensor([1.5, 1.1, 0.0], requires_grad=True)
    returns = torch.tensor([2.0, 2.0, 2.0])
    out = value_loss(values, old, returns, clip=0.2)
    # clipped values 1.2, 1.1, 0.8: errors max((1.5−2)², (1.2−2)²)=0.64, max(0.81, 0.81)=0.81, max(4, 1.44)=4
    assert math.isclose(float(out["loss"].detach()), 0.5 * (0.64 + 0.81 + 4) / 3, rel_tol=1e-6)
    assert math.isclose(float(out["clipfrac"]), 1 / 3, rel_tol=1e-6)
    out["loss"].backward()
    torch.testing.assert_close(values.grad, torch.tensor([0.0, -0.9, -2.0]) / 3)  # clipped: no gradient
    plain = value_loss(values.detach(), old, returns, clip=None)
    assert math.isclose(float(plain["loss"]), 0.5 * (0.25 + 0.81 + 4) / 3, rel_tol=1e-6)


def test_rollout_layout_masks_eos_and_padding():
    pad, eos = 0, 9
    ids, mask = left_pad([[5, 6, 7], [8]], pad)  # prompts of 3 and 1 tokens
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    new = torch.tensor([[3, eos, eos, eos], [4, 4, 4, 4]])  # row 0 stops after 2 tokens; row 1 is cut (no EOS)
    r = layout(ids, mask, new, eos, pad)
    assert r.input_ids.tolist() == [[5, 6, 7, 3, eos], [8, 4, 4, 4, 4]]
    assert r.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 1]]
    # label position t scores token t + 1: row 0's actions are tokens 3 and 4 (3, EOS); row 1's tokens 1..4
    assert r.action_mask.int().tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    assert r.ended.tolist() == [True, False] and r.response_len.tolist() == [2, 4] and r.prompt_len.tolist() == [3, 1]
    first_eos = layout(ids, mask, torch.tensor([[eos, 1, eos, 2], [4, eos, eos, eos]]), eos, pad)
    # after the first EOS: padding, and columns no row uses are dropped
    assert first_eos.input_ids.tolist() == [[5, 6, 7, eos], [8, 4, eos, pad]]
    assert first_eos.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert first_eos.action_mask.int().tolist() == [[0, 0, 1], [1, 1, 0]]
    assert first_eos.response_len.tolist() == [1, 2] and first_eos.ended.tolist() == [True, True]


def test_adaptive_kl_coefficient():
    fixed = AdaptiveKL(0.1)
    fixed.update(100.0, 64)
    assert fixed.value == 0.1
    kl = AdaptiveKL(0.1, target=6.0, horizon=10000)
    kl.update(12.0, 500)  # error clipped to +0.2: β·(1 + 0.2·500/10000)
    assert math.isclose(kl.value, 0.1 * 1.01)
    kl.update(5.4, 1000)  # error −0.1
    assert math.isclose(kl.value, 0.1 * 1.01 * (1 - 0.1 * 0.1))


def test_value_network_from_the_reward_model_normalised():
    policy = tiny()
    rm = RewardModel(tiny())
    ids, mask = torch.randint(1, 40, (2, 6)), torch.ones(2, 6, dtype=torch.long)
    v = value_network("reward", policy, rm)
    assert v is not rm and all(p.requires_grad for p in v.head.parameters())
    torch.testing.assert_close(v.token_scores(ids, mask)[:, -1], rm(ids, mask))
    normalize_head(v, 2.0, 4.0)
    torch.testing.assert_close(v.token_scores(ids, mask)[:, -1], (rm(ids, mask) - 2) / 4)
    zero = value_network("policy", policy, rm)
    assert float(zero.token_scores(ids, mask).detach().abs().max()) == 0.0
    assert all(a is not b for a, b in zip(zero.backbone.parameters(), policy.parameters()))


def test_actor_critic_keeps_dropout_off():
    actor = ActorCritic(tiny(dropout=0.3), value_network("policy", tiny(dropout=0.3), None)).train()
    ids = torch.randint(1, 40, (2, 8))
    am, act = torch.ones(2, 8, dtype=torch.long), torch.ones(2, 7, dtype=torch.bool)
    a, b = actor(ids, am, act), actor(ids, am, act)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    assert actor.training and not actor.policy.training


def _source(actor, reference, prompts, seed=0):
    scorer = lambda r: ((r.input_ids[:, 1:] == 7) & r.action_mask).sum(1).float()  # noqa: E731
    return RolloutSource(
        actor, reference, scorer, prompts, RolloutOptions(max_new_tokens=5), rollout_batch=8, minibatch=4, epochs=2,
        kl=AdaptiveKL(0.1, target=1.0, horizon=100), seed=seed, eos_id=3, pad_id=0,
    )  # fmt: skip


def test_first_update_of_a_rollout_starts_at_ratio_one():
    policy = tiny()
    actor = ActorCritic(policy, value_network("policy", policy, None))
    prompts = [[1 + i % 30, 2 + i % 20, 5] for i in range(16)]
    src = _source(actor, frozen_copy(policy), prompts)
    batch = next(src).data
    out = PPOLoss()(actor, batch)
    assert float(out.metrics["approx_kl"]) < 1e-10 and float(out.metrics["clipfrac"]) == 0
    assert {"score", "kl", "kl_coef", "response_len", "eos_rate"} <= set(out.metrics)
    mask = batch["action_mask"]
    # whitened over the whole rollout, so one minibatch's mean is not 0, but the values are finite and masked
    assert bool(torch.isfinite(batch["advantages"]).all()) and bool((batch["advantages"][~mask] == 0).all())


def test_rollout_source_resumes_mid_rollout():
    policy = tiny()
    actor = ActorCritic(policy, value_network("policy", policy, None))
    reference = frozen_copy(policy)
    prompts = [[1 + i % 30, 2 + i % 20, 5] for i in range(24)]
    a = _source(actor, reference, prompts)
    for _ in range(3):  # one rollout = 2 epochs × 2 minibatches; stop inside it
        next(a)
    state = a.state_dict()
    b = _source(actor, reference, prompts)
    b.load_state_dict(state)
    for _ in range(6):  # the rest of this rollout, then two new ones sampled from the same seeds
        x, y = next(a).data, next(b).data
        assert x.keys() == y.keys()
        for k in x:
            torch.testing.assert_close(x[k], y[k], rtol=0, atol=0)
    assert a.count == b.count == 3 and a.kl.value == b.kl.value != 0.1  # β adapted after each rollout
    with pytest.raises(LMForgeError, match="must be a multiple of the minibatch"):
        RolloutSource(actor, reference, None, prompts, RolloutOptions(), rollout_batch=6, minibatch=4, epochs=1,
                      kl=AdaptiveKL(0.1), seed=0, eos_id=3, pad_id=0)  # fmt: skip
    with pytest.raises(LMForgeError, match="24 training prompts are fewer than one rollout"):
        RolloutSource(actor, reference, None, prompts, RolloutOptions(), rollout_batch=32, minibatch=4, epochs=1,
                      kl=AdaptiveKL(0.1), seed=0, eos_id=3, pad_id=0)  # fmt: skip


def test_prompts_of_instruction_and_preference_files(tmp_path):
    from lmforge.align.data import read_prompts

    path = tmp_path / "mixed.jsonl"
    path.write_text(
        '{"instruction": "Continue.", "input": "It was", "output": "a dark night"}\n'
        '{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}\n'
        '{"instruction": "Rate it.", "chosen": "good", "rejected": "bad"}\n',
        encoding="utf-8",
    )
    prompts = read_prompts(path)
    assert [p.messages[-1].role for p in prompts] == ["user"] * 3
    assert prompts[0].input == "It was" and prompts[1].messages[0].content == "Hi" and prompts[1].response is None
    path.write_text('{"messages": [{"role": "assistant", "content": "Hello"}]}\n', encoding="utf-8")
    with pytest.raises(LMForgeError, match=r"mixed.jsonl:1: field 'messages' must be a non-empty list"):
        read_prompts(path)
