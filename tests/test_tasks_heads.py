"""Heads, the TaskModel's pooling per format, and each task's loss against the same quantity computed by hand."""

import pytest
import tasks_testing as T
import torch
import torch.nn.functional as F

from lmforge.data.labelled.examples import Dataset, Example
from lmforge.registry import TASKS
from lmforge.tasks.heads import SequenceHead, SpanHead, TokenHead
from lmforge.tasks.inputs import collate
from lmforge.tasks.model import pool

PAIRS = [
    ("It is a truth universally acknowledged", "a single man must be in want of a wife"),
    ("Four score and seven years ago", "our fathers brought forth a new nation"),
    ("We are met on a great battle-field", "of that war"),
]


def build(name: str, family: str, preset: str, labels=None, **options):
    tok = T.tokenizer(family)
    cls = TASKS.get(name)
    t = cls(cls.Options(head_dropout=0.0, **options), tok, labels)
    m = t.build(T.model(preset, tok)).eval()
    return t, m, tok


def batch_of(t, examples):
    return collate(t.features(Dataset(examples)), t.pad_id)


def test_sequence_head_shapes_and_combines():
    torch.manual_seed(0)
    x = torch.randn(4, 3, 16)
    head = SequenceHead(16, 5, dropout=0.0).eval()
    assert head(x[:, :1]).shape == (4, 5)
    summed = SequenceHead(16, 5, dropout=0.0, combine="sum").eval()
    torch.testing.assert_close(summed(x[:, :2]), summed.out(x[:, 0] + x[:, 1]))
    choices = SequenceHead(16, 1, dropout=0.0, combine="choices").eval()
    scores = choices(x, n_seqs=torch.tensor([3, 2, 3, 1]))
    assert scores.shape == (4, 3)
    torch.testing.assert_close(scores[0], choices.out(x[0]).squeeze(-1))
    assert scores[1, 2] == torch.finfo(scores.dtype).min and scores[3, 1:].eq(torch.finfo(scores.dtype).min).all()
    assert SequenceHead(16, 2, transform=True).dense is not None


def test_token_and_span_heads_shapes():
    h = torch.randn(2, 7, 16)
    assert TokenHead(16, 9)(h).shape == (2, 7, 9)
    start, end = SpanHead(16)(h)
    assert start.shape == end.shape == (2, 7)


def test_pool_last_first_mean():
    h = torch.arange(2 * 4 * 3, dtype=torch.float).view(2, 4, 3)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    torch.testing.assert_close(pool(h, mask, "last"), torch.stack([h[0, 2], h[1, 3]]))
    torch.testing.assert_close(pool(h, mask, "first"), h[:, 0])
    torch.testing.assert_close(pool(h, mask, "mean"), torch.stack([h[0, :3].mean(0), h[1].mean(0)]))


def test_gpt_head_reads_the_extract_token():
    t, m, tok = build("pair_classification", "gpt", "gpt-tiny", ["a", "b", "c"])
    b = batch_of(t, [Example(text=x, text_pair=y, label="a") for x, y in PAIRS])
    out = m(b)
    h = m.backbone(b["input_ids"][:, 0], b["attention_mask"][:, 0]).last_hidden_state
    last = b["attention_mask"][:, 0].sum(-1) - 1
    assert b["input_ids"][0, 0, last[0]] == tok.token_to_id("<|extract|>")
    expected = m.head.out(h[torch.arange(3), last])
    torch.testing.assert_close(out.logits, expected)
    torch.testing.assert_close(t.loss(m, b).metrics["task_loss"], F.cross_entropy(expected, b["label"]).detach())


def test_bert_head_reads_the_pooler():
    t, m, _ = build("classification", "bert", "bert-tiny", ["neg", "pos"])
    b = batch_of(t, [Example(text=x, label="pos") for x, _ in PAIRS])
    o = m.backbone(b["input_ids"][:, 0], b["attention_mask"][:, 0], token_type_ids=b["token_type_ids"][:, 0])
    torch.testing.assert_close(m(b).logits, m.head.out(o.pooled))
    assert m.head.dense is None  # BERT's pooler is the dense + tanh


def test_bart_head_reads_the_decoders_final_eos():
    t, m, tok = build("classification", "bart", "bart-tiny", ["neg", "pos"])
    b = batch_of(t, [Example(text=x, label="neg") for x, _ in PAIRS])
    ids, mask = b["input_ids"][:, 0], b["attention_mask"][:, 0]
    dec = torch.cat([torch.full((3, 1), m.config.decoder_start_id), ids], 1)
    dmask = torch.cat([torch.ones(3, 1, dtype=mask.dtype), mask], 1)
    h = m.backbone(ids, mask, decoder_input_ids=dec, decoder_attention_mask=dmask).last_hidden_state
    last = dmask.sum(-1) - 1
    assert (dec[torch.arange(3), last] == tok.eos_id).all()
    expected = m.head.out(torch.tanh(m.head.dense(h[torch.arange(3), last])))
    torch.testing.assert_close(m(b).logits, expected)


def test_t5_encoder_mean_pool():
    t, m, _ = build("classification", "t5", "t5-tiny", ["neg", "pos"])
    b = batch_of(t, [Example(text=x, label="neg") for x, _ in PAIRS])
    ids, mask = b["input_ids"][:, 0], b["attention_mask"][:, 0]
    h = m.backbone.encode(ids, mask)
    mean = (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    torch.testing.assert_close(m(b).logits, m.head.out(torch.tanh(m.head.dense(mean))))


def test_regression_loss_is_mse():
    t, m, _ = build("regression", "bert", "bert-tiny")
    b = batch_of(t, [Example(text=x, text_pair=y, label=float(i)) for i, (x, y) in enumerate(PAIRS)])
    pred = m(b).logits.squeeze(-1)
    assert torch.allclose(t.loss(m, b).loss, F.mse_loss(pred, torch.tensor([0.0, 1.0, 2.0])))


def test_multiple_choice_loss_is_softmax_across_answers():
    t, m, _ = build("multiple_choice", "bert", "bert-tiny")
    exs = [Example(text=x, choices=[y, "a wife", "the war"], label=i) for i, (x, y) in enumerate(PAIRS)]
    b = batch_of(t, exs)
    assert b["input_ids"].shape[:2] == (3, 3)
    scores = m(b).logits
    assert scores.shape == (3, 3)
    torch.testing.assert_close(t.loss(m, b).loss, F.cross_entropy(scores, torch.tensor([0, 1, 2])))


def test_tagging_loss_ignores_non_first_subtokens():
    labels = ["O", "B-PER", "I-PER"]
    t, m, _ = build("token_tagging", "bert", "bert-tiny", labels)
    ex = Example(tokens=["Elizabeth", "Bennet", "walked"], tags=["B-PER", "I-PER", "O"])
    b = batch_of(t, [ex])
    logits = m(b).logits
    keep = b["labels"] != -100
    assert int(keep.sum()) == 3
    torch.testing.assert_close(t.loss(m, b).loss, F.cross_entropy(logits[keep], b["labels"][keep]))


def test_span_loss_is_mean_of_start_and_end_cross_entropy():
    t, m, _ = build("span_qa", "bert", "bert-tiny", max_len=64)
    ctx = "It is a truth universally acknowledged, that a single man must be in want of a wife."
    ex = Example(text="What is acknowledged?", context=ctx, answers=[(8, "truth")])
    b = batch_of(t, [ex])
    start, end = m(b).logits
    expected = (F.cross_entropy(start, b["start_positions"]) + F.cross_entropy(end, b["end_positions"])) / 2
    torch.testing.assert_close(t.loss(m, b).loss, expected)


@pytest.mark.parametrize("task_name", ["classification", "multiple_choice"])
def test_aux_lm_loss_adds_exactly_lambda_times_the_lm_loss(task_name):
    labels = ["a", "b"] if task_name == "classification" else None
    exs = [Example(text=x, label="a") for x, _ in PAIRS]
    if task_name == "multiple_choice":
        exs = [Example(text=x, choices=[y, "a wife"], label=0) for x, y in PAIRS]
    losses = {}
    for lam in (0.0, 0.5):
        t, m, _ = build(task_name, "gpt", "gpt-tiny", labels, lm_coef=lam)
        b = batch_of(t, exs)
        losses[lam] = t.loss(m, b)
    # L1 by hand: next-token NLL over the real tokens of every input sequence.
    ids, mask = b["input_ids"].flatten(0, 1), b["attention_mask"].flatten(0, 1)
    logits = m.backbone(ids, mask).logits[:, :-1]
    nll = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    keep = mask[:, 1:].bool()
    l1 = nll[keep].mean()
    assert "lm_loss" not in losses[0.0].metrics
    torch.testing.assert_close(losses[0.5].metrics["lm_loss"], l1.detach())
    torch.testing.assert_close(losses[0.5].loss - losses[0.0].loss, 0.5 * l1)
    torch.testing.assert_close(losses[0.0].loss.detach(), losses[0.5].metrics["task_loss"])


def test_aux_lm_loss_applies_to_the_gpt_format_only():
    t, m, _ = build("classification", "bert", "bert-tiny", ["a", "b"], lm_coef=0.5)
    out = t.loss(m, batch_of(t, [Example(text=PAIRS[0][0], label="a")]))
    assert set(out.metrics) == {"task_loss"}
