"""Reward model, DPO and best-of-n on tiny models: hand-computed losses, and learning on held-out real pairs."""

from __future__ import annotations

import math

import pytest
import torch
from tasks_testing import model, tokenizer

from lmforge.align.datasets import continuation_preferences, sentiment_preferences
from lmforge.align.dpo import DPO, dpo_loss, dpo_metrics, frozen_copy, preference_margins
from lmforge.align.reward import RewardModel, best_of_n, pair_batch, pairwise_loss, reward_accuracy, reward_loss
from lmforge.align.templates import Conversation, add_role_tokens, get_template
from lmforge.align.train import AlignTrainConfig, ShuffledBatches
from lmforge.errors import LMForgeError
from lmforge.train.loop import fit

# The easy real-data construction: Austen passages, chosen = their true next words, rejected = words of a
# Shakespeare play (held-out pairs come from chapters never seen in training).
EASY = dict(prompt_words=32, response_words=12, negatives="other_author", prompts_from="austen")
MAX_LEN = 96


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: threads only add contention on a shared machine
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def corpus_tokenizer():
    from lmforge.data.corpus.bundled import load_default_corpus
    from lmforge.tokenizers import train_tokenizer

    return train_tokenizer(load_default_corpus()[::10], "bpe", 1000, family="gpt")


def _policy(tok, seed: int = 0):
    m = model("gpt-tiny", tok, seed=seed)
    add_role_tokens(m, tok)
    return m


def _hand_logprob(m, ids: list[int], labels: list[int]) -> float:
    """Σ log p(ids[t] | ids[:t]) over labelled positions, token by token from full-sequence logits."""
    with torch.no_grad():
        logp = torch.log_softmax(m(torch.tensor([ids])).logits[0].double(), -1)
    return sum(float(logp[t - 1, ids[t]]) for t in range(1, len(ids)) if labels[t] != -100)


def test_dpo_loss_matches_a_hand_computation():
    tok = tokenizer("gpt")
    policy, reference = _policy(tok, seed=0).eval(), _policy(tok, seed=1).eval()
    t = get_template("chat", tok)
    pairs = sentiment_preferences("dev", 3)
    batch = pair_batch(pairs, t, tok.pad_id, MAX_LEN)
    beta = 0.5
    expected = []
    for p in pairs:
        lp = {}
        for which in ("chosen", "rejected"):
            enc = t.encode(p.conversation(which), MAX_LEN)
            lp[which] = (
                _hand_logprob(policy, enc.input_ids, enc.labels),
                _hand_logprob(reference, enc.input_ids, enc.labels),
            )
        z = beta * ((lp["chosen"][0] - lp["chosen"][1]) - (lp["rejected"][0] - lp["rejected"][1]))
        expected.append(-math.log(1 / (1 + math.exp(-z))))
    with torch.no_grad():
        out = DPO(reference, beta=beta).loss(policy, batch)
    assert out.loss.item() == pytest.approx(sum(expected) / len(expected), rel=1e-5)
    assert out.n_tokens == 3


def test_dpo_loss_formula_and_limits():
    pw, pl = torch.tensor([-1.0, -2.0]), torch.tensor([-3.0, -1.0])
    rw, rl = torch.tensor([-1.5, -2.0]), torch.tensor([-2.0, -2.0])
    out = dpo_loss(pw, pl, rw, rl, beta=0.1)
    z = 0.1 * torch.tensor([(0.5) - (-1.0), (0.0) - (1.0)])
    assert out.loss.item() == pytest.approx(float(-torch.nn.functional.logsigmoid(z).mean()), rel=1e-6)
    assert out.chosen_rewards.tolist() == pytest.approx([0.05, 0.0])
    assert out.rejected_rewards.tolist() == pytest.approx([-0.1, 0.1])
    # Policy equal to the reference: every pair scores σ(0), loss log 2.
    assert dpo_loss(pw, pl, pw, pl).loss.item() == pytest.approx(math.log(2))
    with pytest.raises(LMForgeError, match="DPO needs beta > 0, got 0"):
        dpo_loss(pw, pl, rw, rl, beta=0)


def test_dpo_raises_the_margin_on_held_out_pairs(corpus_tokenizer, tmp_path):
    tok = corpus_tokenizer
    t = get_template("chat", tok)
    train = continuation_preferences("train", 800, **EASY)
    held = continuation_preferences("dev", 120, **EASY)
    torch.manual_seed(0)
    policy = _policy(tok)
    reference = frozen_copy(policy)
    before = preference_margins(policy, held, t, tok.pad_id, MAX_LEN)
    dpo = DPO(reference, beta=0.1)
    batches = ShuffledBatches(train, 16, 0, lambda c: pair_batch(c, t, tok.pad_id, MAX_LEN))
    fit(policy, dpo.loss, batches, AlignTrainConfig(max_steps=40, lr=1e-3, warmup_steps=2), tmp_path)
    after = preference_margins(policy, held, t, tok.pad_id, MAX_LEN)
    metrics = dpo_metrics(policy, reference, held, t, tok.pad_id, MAX_LEN, beta=0.1)
    assert float(after.mean()) > float(before.mean()) + 3.0  # nats of log π(y_w|x) − log π(y_l|x)
    assert metrics["reward_accuracy"] > 0.75 and metrics["reward_margin"] > 0.2
    assert all(not p.requires_grad for p in reference.parameters())


def test_reward_model_ranks_held_out_pairs(corpus_tokenizer, tmp_path):
    tok = corpus_tokenizer
    t = get_template("chat", tok)
    train = continuation_preferences("train", 1600, **EASY)
    held = continuation_preferences("dev", 120, **EASY)
    torch.manual_seed(0)
    rm = RewardModel(_policy(tok))
    start = reward_accuracy(rm, held, t, tok.pad_id, MAX_LEN)
    batches = ShuffledBatches(train, 16, 0, lambda c: pair_batch(c, t, tok.pad_id, MAX_LEN))
    fit(rm, reward_loss, batches, AlignTrainConfig(max_steps=100, lr=1e-3, warmup_steps=5), tmp_path)
    end = reward_accuracy(rm, held, t, tok.pad_id, MAX_LEN)
    assert abs(start["margin"]) < 0.1  # an untrained head barely separates the pairs
    assert end["accuracy"] > 0.75 and end["margin"] > 1.0


def test_pairwise_loss_and_last_token_reward():
    loss = pairwise_loss(torch.tensor([2.0, 0.0]), torch.tensor([0.0, 0.0]))
    assert loss.item() == pytest.approx((math.log(1 + math.exp(-2)) + math.log(2)) / 2)
    tok = tokenizer("gpt")
    rm = RewardModel(model("gpt-tiny", tok)).eval()
    ids = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    with torch.no_grad():
        r = rm(ids, mask)
        alone = rm(ids[1:, :3], mask[1:, :3])
    torch.testing.assert_close(r[1:], alone)  # the reward reads the last real token, padding changes nothing
    with pytest.raises(LMForgeError, match="a reward model needs a decoder backbone, got arch 'encoder'"):
        RewardModel(model("bert-tiny", tokenizer("bert")))


class TokenSumReward(torch.nn.Module):
    """A stand-in reward: the sum of the sequence's token ids (a known, text-dependent score)."""

    def __init__(self) -> None:
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, attention_mask):
        return (input_ids * attention_mask).sum(-1).float() + self.dummy


def test_best_of_n_returns_the_highest_reward_sample():
    tok = tokenizer("gpt")
    policy = _policy(tok).eval()
    t = get_template("chat", tok)
    prompt = Conversation.instruction("Is this review positive or negative?", None, "A sunny, delightful picture.")
    res = best_of_n(
        policy, TokenSumReward(), t, prompt, n=6, max_new_tokens=8, generator=torch.Generator().manual_seed(0)
    )
    assert len(res.candidates) == 6 and len(set(res.candidates)) > 1
    expected = []
    for text in res.candidates:
        conv = Conversation.instruction(prompt.messages[0].content, text, prompt.input)
        expected.append(float(sum(t.encode(conv).input_ids)))
    assert res.rewards == pytest.approx(expected)
    assert res.reward == max(expected) and res.best == res.candidates[expected.index(max(expected))]
    with pytest.raises(LMForgeError, match="best-of-n needs n >= 1, got 0"):
        best_of_n(policy, TokenSumReward(), t, prompt, n=0)
