"""Input transformations: exact token sequences of every format, truncation, vocabulary growth, batching."""

import pytest
import tasks_testing as T
import torch

from lmforge.data.labelled.examples import Dataset, Example
from lmforge.errors import LMForgeError
from lmforge.registry import TASKS
from lmforge.tasks.inputs import (
    GPT_TOKENS,
    add_task_tokens,
    collate,
    eval_batches,
    feature_length,
    length_grouped,
    make_framer,
    resize_embeddings,
    truncate_pair,
)

PREMISE = "It is a truth universally acknowledged"
HYPOTHESIS = "a single man must be in want of a wife"


def task(name: str, family: str, preset: str, labels=None, **options):
    tok = T.tokenizer(family)
    cls = TASKS.get(name)
    opts = cls.Options(**options)
    t = cls(opts, tok, labels)
    t.build(T.model(preset, tok))
    return t, tok


def specials(tok) -> tuple[int, int, int]:
    return tuple(tok.token_to_id(x) for x in GPT_TOKENS)


def test_gpt_entailment_is_start_premise_delim_hypothesis_extract():
    t, tok = task("pair_classification", "gpt", "gpt-tiny", ["entailment", "not_entailment"])
    s, d, e = specials(tok)
    assert (s, d, e) == (400, 401, 402)  # appended after the 400-token vocabulary
    ex = Example(text=PREMISE, text_pair=HYPOTHESIS, label="entailment")
    [f] = t.features(Dataset([ex]))
    assert f["input_ids"] == [[s, *tok.encode(PREMISE), d, *tok.encode(HYPOTHESIS), e]]
    assert f["label"] == 0


def test_gpt_similarity_scores_both_orderings():
    t, tok = task("regression", "gpt", "gpt-tiny", symmetric=True)
    s, d, e = specials(tok)
    a, b = tok.encode(PREMISE), tok.encode(HYPOTHESIS)
    [f] = t.features(Dataset([Example(text=PREMISE, text_pair=HYPOTHESIS, label=3.5)]))
    assert f["input_ids"] == [[s, *a, d, *b, e], [s, *b, d, *a, e]]
    assert f["label"] == 3.5
    assert t._combine() == "sum"


def test_symmetric_does_not_apply_to_bert_format():
    t, tok = task("pair_classification", "bert", "bert-tiny", ["no", "yes"], symmetric=True)
    [f] = t.features(Dataset([Example(text=PREMISE, text_pair=HYPOTHESIS, label="yes")]))
    assert len(f["input_ids"]) == 1


def test_gpt_multiple_choice_is_one_sequence_per_answer():
    t, tok = task("multiple_choice", "gpt", "gpt-tiny")
    s, d, e = specials(tok)
    choices = ["a wife", "a fortune", "a neighbourhood"]
    [f] = t.features(Dataset([Example(text=PREMISE, choices=choices, label=1)]))
    assert f["input_ids"] == [[s, *tok.encode(PREMISE), d, *tok.encode(c), e] for c in choices]
    assert f["label"] == 1


def test_gpt_single_sentence_is_start_text_extract():
    t, tok = task("classification", "gpt", "gpt-tiny", ["negative", "positive"])
    s, _, e = specials(tok)
    [f] = t.features(Dataset([Example(text=PREMISE, label="positive")]))
    assert f["input_ids"] == [[s, *tok.encode(PREMISE), e]] and f["label"] == 1


def test_bert_pair_is_cls_a_sep_b_sep_with_segments():
    t, tok = task("pair_classification", "bert", "bert-tiny", ["no", "yes"])
    a, b = tok.encode(PREMISE), tok.encode(HYPOTHESIS)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    [f] = t.features(Dataset([Example(text=PREMISE, text_pair=HYPOTHESIS, label="yes")]))
    assert f["input_ids"] == [[cls, *a, sep, *b, sep]]
    assert f["token_type_ids"] == [[0] * (len(a) + 2) + [1] * (len(b) + 1)]
    assert tok.token_to_id("<|start|>") is None  # no GPT tokens in an encoder's vocabulary


def test_roberta_bart_pairs_use_a_double_separator_and_one_segment():
    t, tok = task("pair_classification", "bart", "roberta-tiny", ["no", "yes"])
    a, b = tok.encode(PREMISE), tok.encode(HYPOTHESIS)
    [f] = t.features(Dataset([Example(text=PREMISE, text_pair=HYPOTHESIS, label="no")]))
    assert f["input_ids"] == [[0, *a, 2, 2, *b, 2]]  # <s> A </s></s> B </s>
    assert set(f["token_type_ids"][0]) == {0}  # RoBERTa has one token type


def test_t5_encoder_framing_has_no_cls():
    tok = T.tokenizer("t5")
    fr = make_framer("encoder_mean", tok)
    a, b = tok.encode(PREMISE), tok.encode(HYPOTHESIS)
    assert fr.frame(a, b)[0] == [*a, 1, *b, 1]  # A </s> B </s>


def test_auto_format_follows_the_architecture():
    assert task("classification", "gpt", "gpt-tiny", ["a", "b"])[0].fmt == "gpt"
    assert task("classification", "bert", "bert-tiny", ["a", "b"])[0].fmt == "bert"
    assert task("classification", "bart", "bart-tiny", ["a", "b"])[0].fmt == "bart"
    assert task("classification", "t5", "t5-tiny", ["a", "b"])[0].fmt == "encoder_mean"
    with pytest.raises(LMForgeError, match="task.format 'gpt' needs a model of arch decoder, got 'encoder'"):
        task("classification", "bert", "bert-tiny", ["a", "b"], format="gpt")


def test_truncation_is_longest_first_and_respects_max_len():
    a, b = list(range(10)), list(range(100, 104))
    assert truncate_pair(a, b, 8) == ([0, 1, 2, 3], [100, 101, 102, 103])
    assert truncate_pair(a, b, 7) == ([0, 1, 2, 3], [100, 101, 102])
    assert truncate_pair(a, None, 3) == ([0, 1, 2], None)
    t, tok = task("pair_classification", "gpt", "gpt-tiny", ["x", "y"], max_len=12)
    [f] = t.features(Dataset([Example(text=PREMISE * 3, text_pair=HYPOTHESIS * 3, label="x")]))
    assert len(f["input_ids"][0]) == 12


def test_add_task_tokens_grows_the_model_and_keeps_old_rows():
    tok = T.tokenizer("gpt")
    m = T.model("gpt-tiny", tok)
    ids = torch.tensor([tok.encode(PREMISE)])
    before = m(ids).logits
    old = m.tok_emb.weight.detach().clone()
    new_ids = add_task_tokens(m, tok)
    assert new_ids == [400, 401, 402] and tok.vocab_size == 403 and m.config.vocab_size == 403
    assert m.tok_emb.weight.shape == (403, 64) and m.lm_head.weight is m.tok_emb.weight  # still tied
    torch.testing.assert_close(m.tok_emb.weight[:400], old)
    torch.testing.assert_close(m(ids).logits[..., :400], before)
    assert add_task_tokens(m, tok) == new_ids and m.config.vocab_size == 403  # idempotent


def test_resize_embeddings_initialises_new_rows_like_the_model():
    m = T.model("llama-tiny", T.tokenizer("gpt"))  # untied output matrix
    torch.manual_seed(0)
    resize_embeddings(m, 400 + 4000)
    new = m.tok_emb.weight[400:].detach()
    assert abs(float(new.std()) - m.config.init_std) < 0.001 and abs(float(new.mean())) < 0.001
    assert m.lm_head.weight.shape == (4400, 64) and m.lm_head.weight is not m.tok_emb.weight
    assert abs(float(m.lm_head.weight[400:].detach().std()) - m.config.init_std) < 0.001


def test_resize_grows_a_biased_tied_head_with_zero_bias():
    m = T.model("bart-tiny", T.tokenizer("bart"))
    with torch.no_grad():
        m.lm_head.bias.fill_(0.5)
    resize_embeddings(m, 410)
    assert m.lm_head.weight is m.tok_emb.weight
    assert torch.all(m.lm_head.bias[:400] == 0.5) and torch.all(m.lm_head.bias[400:] == 0)


def test_collate_pads_right_with_masks_and_minus_100_labels():
    feats = [
        {"input_ids": [5, 6, 7], "labels": [1, 2, 3], "label": 1, "_meta": "x"},
        {"input_ids": [8], "labels": [4], "label": 0, "_meta": "y"},
    ]
    b = collate(feats, pad_id=0)
    assert b["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert b["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert b["labels"].tolist() == [[1, 2, 3], [4, -100, -100]]
    assert b["label"].tolist() == [1, 0] and "_meta" not in b


def test_collate_pads_multi_sequence_examples_and_counts_them():
    feats = [{"input_ids": [[1, 2], [3]]}, {"input_ids": [[4, 5, 6], [7], [8]]}]
    b = collate(feats, pad_id=9)
    assert b["input_ids"].tolist() == [[[1, 2, 9], [3, 9, 9], [9, 9, 9]], [[4, 5, 6], [7, 9, 9], [8, 9, 9]]]
    assert b["attention_mask"][0].tolist() == [[1, 1, 0], [1, 0, 0], [1, 0, 0]]
    assert b["n_seqs"].tolist() == [2, 3]


def test_resize_embeddings_draws_new_rows_from_the_embeddings_own_std():
    # tensor2tensor's embedding is N(0, d_model^-0.5) while its dense layers take init_std as a Glorot gain (1.0):
    # new rows must follow the embedding, not init_std.
    m = T.model("transformer-tiny", T.tokenizer("bart"))
    torch.manual_seed(0)
    n = m.config.vocab_size
    resize_embeddings(m, n + 4000)
    assert abs(float(m.tok_emb.weight[n:].detach().std()) - m.config.d_model**-0.5) < 0.005


def _padded(chunks: list[list[int]], lengths: list[int]) -> int:
    return sum(len(c) * max(lengths[j] for j in c) for c in chunks)


def _cut(order: list[int], size: int) -> list[list[int]]:
    return [order[i : i + size] for i in range(0, len(order), size)]


def test_length_grouped_batches_keep_every_example_once_and_pad_less():
    lengths = torch.randint(1, 200, (1000,), generator=torch.Generator().manual_seed(0)).tolist()
    shuffle = torch.randperm(1000, generator=torch.Generator().manual_seed(1)).tolist()

    def grouped(seed: int) -> list[list[int]]:
        return _cut(length_grouped(shuffle, lengths, 8, torch.Generator().manual_seed(seed)), 8)

    plain, mine = _cut(shuffle, 8), grouped(1)
    assert sorted(j for c in mine for j in c) == list(range(1000))  # a permutation: each example once
    assert [len(c) for c in mine] == [8] * 125
    assert _padded(mine, lengths) < 0.6 * _padded(plain, lengths)  # lengths uniform in 1-199: about half the padding
    assert mine == grouped(1) and grouped(2) != mine  # the generator's seed shuffles the batches
    first = [max(lengths[j] for j in c) for c in mine[:20]]
    assert first != sorted(first, reverse=True)  # the batches are shuffled, not longest first


def test_length_grouped_batches_leave_the_short_batch_last():
    lengths = [i % 37 + 1 for i in range(8 * 60 + 3)]  # more than one pool of 50 batches
    order = length_grouped(list(range(len(lengths))), lengths, 8, torch.Generator().manual_seed(0))
    assert [len(c) for c in _cut(order, 8)] == [8] * 60 + [3]


def test_fine_tuning_batches_group_by_length_when_asked_and_resume_alike():
    from lmforge.finetuning.run import FeatureBatches
    from lmforge.train.distributed import DistInfo

    one = DistInfo(rank=0, world_size=1, local_rank=0)
    feats = [{"input_ids": [5] * (1 + (7 * i) % 97), "label": i % 2} for i in range(400)]
    padded = {}
    for by_length in (False, True):
        source = FeatureBatches(feats, 16, one, seed=3, pad_id=0, by_length=by_length)
        batches = [next(source).data for _ in range(source.per_epoch)]
        assert source.per_epoch == 25 and sum(len(b["label"]) for b in batches) == 400
        padded[by_length] = sum(b["input_ids"].numel() for b in batches)
        state = source.state_dict()
        again = FeatureBatches(feats, 16, one, seed=3, pad_id=0, by_length=by_length)
        again.load_state_dict(state)
        assert torch.equal(next(again).data["input_ids"], next(source).data["input_ids"])  # the next epoch alike
    assert padded[True] < 0.6 * padded[False]


def test_eval_batches_run_longest_first_and_give_every_position_once():
    feats = [{"input_ids": [1] * n} for n in (3, 9, 1, 9, 4)]
    out = list(eval_batches(feats, 2))
    assert [idx for idx, _ in out] == [[1, 3], [4, 0], [2]]
    assert all(c == [feats[i] for i in idx] for idx, c in out)
    assert [len(f["input_ids"]) for f in out[0][1]] == [9, 9]
    assert feature_length({"input_ids": [[1, 2], [3, 4, 5]], "decoder_input_ids": [6, 7]}) == 2 * 3 + 2


def test_evaluation_in_length_order_returns_each_example_its_own_prediction():
    tok = T.tokenizer("bert")
    cls = TASKS.get("classification")
    t = cls(cls.Options(), tok, ["negative", "positive"])
    model = t.build(T.model("bert-tiny", tok)).eval()  # the head's dropout off, as in predict_all
    base = T.sentiment(12).examples
    repeated = [Example(text=" ".join([e.text] * (1 + i % 4)), label=e.label, id=e.id) for i, e in enumerate(base)]
    ds = Dataset(repeated, ["negative", "positive"], "lengths")
    feats = t.features(ds)
    assert len({feature_length(f) for f in feats}) > 3  # lengths vary, so the batches' order is not the data's
    got = t.predict_all(model, ds, batch_size=4, fn=t.probabilities)
    with torch.no_grad():
        alone = [t.probabilities(model, collate([f], t.pad_id), [f])[0] for f in feats]
    torch.testing.assert_close(torch.tensor(got), torch.tensor(alone), atol=1e-5, rtol=1e-4)


def test_a_training_step_leaves_its_loss_parts_on_the_device():
    """Reading a loss part on the host (float) at every step would make the host wait for the device each time; the
    loop reads them on its log steps."""
    tok = T.tokenizer("gpt")
    cls = TASKS.get("classification")
    t = cls(cls.Options(format="gpt", lm_coef=0.5), tok, ["negative", "positive"])
    model = t.build(T.model("gpt-tiny", tok))
    feats = t.features(T.sentiment(4), train=True)
    out = t.loss(model, collate(feats, t.pad_id))
    assert set(out.metrics) == {"task_loss", "lm_loss"}
    assert all(isinstance(v, torch.Tensor) and not v.requires_grad for v in out.metrics.values())
    want = out.metrics["task_loss"] + 0.5 * out.metrics["lm_loss"]
    torch.testing.assert_close(out.loss.detach(), want)
