"""Seq2seq and text-to-text: teacher-forcing layouts, label log-probs by hand, rank classification, generation."""

import pytest
import tasks_testing as T
import torch

from lmforge.data.labelled.examples import Dataset, Example
from lmforge.errors import LMForgeError
from lmforge.registry import TASKS
from lmforge.tasks.inputs import collate
from lmforge.tasks.seq2seq import fit, render, template_tail

SRC = "It is a truth universally acknowledged, that a single man in possession of a good fortune"
TGT = "a man wants a wife"


def build(name, family, preset, labels=None, **options):
    tok = T.tokenizer(family)
    cls = TASKS.get(name)
    t = cls(cls.Options(**options), tok, labels)
    return t, t.build(T.model(preset, tok)).eval(), tok


def test_template_render_tail_and_fit():
    ex = Example(text="A", text_pair="B")
    assert render("mnli hypothesis: {text_pair} premise: {text}", ex) == "mnli hypothesis: B premise: A"
    assert template_tail("{text}\nTL;DR:") == "\nTL;DR:" and template_tail("{text}") == ""
    assert fit(list(range(10)), 6, 2) == [0, 1, 2, 3, 8, 9]
    with pytest.raises(LMForgeError, match="task.template"):
        render("{nope}", ex)


def test_decoder_layout_trains_on_the_target_only():
    t, _, tok = build("seq2seq", "gpt", "gpt-tiny", template="{text}\nTL;DR:")
    [f] = t.features(Dataset([Example(text=SRC, target=TGT)]), train=True)
    src = tok.encode(SRC + "\nTL;DR:")
    tgt = tok.encode(" " + TGT) + [tok.eos_id]
    assert f["input_ids"] == src + tgt
    assert f["labels"] == [-100] * len(src) + tgt


def test_decoder_truncation_keeps_the_prompt():
    t, _, tok = build("seq2seq", "gpt", "gpt-tiny", template="{text}\nTL;DR:", max_len=20, max_target_len=6)
    [f] = t.features(Dataset([Example(text=SRC * 3, target=TGT)]), train=True)
    tail = tok.encode("\nTL;DR:")
    n_tgt = len([x for x in f["labels"] if x != -100])
    assert len(f["input_ids"]) == 20 and n_tgt == 6
    assert f["input_ids"][20 - n_tgt - len(tail) : 20 - n_tgt] == tail


def test_encoder_decoder_layout():
    t, m, tok = build("seq2seq", "bart", "bart-tiny")
    [f] = t.features(Dataset([Example(text=SRC, target=TGT)]), train=True)
    tgt = tok.encode(TGT)
    assert f["input_ids"] == [tok.bos_id, *tok.encode(SRC), tok.eos_id]
    assert f["decoder_input_ids"] == [m.config.decoder_start_id, *tgt]
    assert f["labels"] == [*tgt, tok.eos_id]


@pytest.mark.parametrize("family,preset", [("gpt", "gpt-tiny"), ("t5", "t5-tiny")])
def test_loss_is_the_mean_target_nll_by_hand(family, preset):
    t, m, tok = build("seq2seq", family, preset)
    exs = [Example(text=SRC, target=TGT), Example(text="Four score", target="and seven years ago")]
    b = collate(t.features(Dataset(exs), train=True), t.pad_id)
    total, n = 0.0, 0
    for f in t.features(Dataset(exs), train=True):  # one example at a time, no padding
        if family == "gpt":
            ids = torch.tensor([f["input_ids"]])
            logp = m.backbone(ids).logits.log_softmax(-1)[0, :-1]
            labels = torch.tensor(f["labels"][1:])
        else:
            out = m.backbone(torch.tensor([f["input_ids"]]), decoder_input_ids=torch.tensor([f["decoder_input_ids"]]))
            logp, labels = out.logits.log_softmax(-1)[0], torch.tensor(f["labels"])
        keep = labels != -100
        total += float(logp[keep].gather(-1, labels[keep, None]).sum().detach())
        n += int(keep.sum())
    out = t.loss(m, b)
    assert out.n_tokens == n
    torch.testing.assert_close(out.loss, torch.tensor(-total / n), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family,preset", [("t5", "t5-tiny"), ("gpt", "gpt-tiny")])
def test_text_to_text_ranks_label_words_by_likelihood(family, preset):
    labels = ["negative", "positive"]
    t, m, tok = build("text_to_text", family, preset, labels, template="sst2 sentence: {text}")
    exs = [Example(text=SRC, label="positive"), Example(text="Four score and seven", label="negative")]
    feats = t.features(Dataset(exs))
    ranks = t.rank(m, feats)
    for i, ex in enumerate(exs):
        for j, word in enumerate(labels):
            src = t.source_ids(ex, 10_000)
            if family == "gpt":
                tgt = tok.encode(" " + word) + [tok.eos_id]
                ids = torch.tensor([src + tgt])
                logp = m.backbone(ids).logits.log_softmax(-1)[0, len(src) - 1 : -1]
            else:
                tgt = tok.encode(word) + [tok.eos_id]
                out = m.backbone(torch.tensor([src]), decoder_input_ids=torch.tensor([[0, *tgt[:-1]]]))
                logp = out.logits.log_softmax(-1)[0]
            expected = float(logp.gather(-1, torch.tensor(tgt)[:, None]).sum().detach())
            assert ranks[i, j].item() == pytest.approx(expected, abs=1e-4)
    assert t.predict_all(m, Dataset(exs)) == ranks.argmax(-1).tolist()


def test_text_to_text_generation_scoring_maps_words_and_rejects_others():
    t, m, _ = build("text_to_text", "t5", "t5-tiny", ["0", "1"], label_words=["no", "yes"], scoring="generate")
    exs = [Example(text="a", label="1"), Example(text="b", label="0"), Example(text="c", label="0")]
    said = {str(f["input_ids"]): word for f, word in zip(t.features(Dataset(exs)), ["yes", " No ", "maybe"])}
    t.generate_batch = lambda model, feats, beams, n: [said[str(f["input_ids"])] for f in feats]  # each its own text
    assert t.predict_all(m, Dataset(exs)) == [1, 0, -1]
    assert t.evaluate(m, Dataset(exs)) == {"accuracy": pytest.approx(2 / 3)}


def test_a_text_to_text_training_loss_leaves_its_count_and_parts_on_the_device():
    """The loss over label tokens: their count and the logged loss stay tensors, so a training step does not wait
    for the device (the loop reads them when it logs)."""
    t, m, _ = build("text_to_text", "t5", "t5-tiny", ["0", "1"], label_words=["no", "yes"])
    exs = [Example(text=SRC, label="1"), Example(text="a short one", label="0")]
    batch = collate(t.features(Dataset(exs), train=True), t.pad_id)
    out = t.loss(m, batch)
    labels = batch["labels"]
    assert isinstance(out.n_tokens, torch.Tensor) and int(out.n_tokens) == int((labels != -100).sum())
    assert isinstance(out.metrics["task_loss"], torch.Tensor) and not out.metrics["task_loss"].requires_grad
    assert float(out.metrics["task_loss"]) == pytest.approx(float(out.loss.detach()))


def test_text_to_text_targets_are_label_words():
    t, _, tok = build("text_to_text", "t5", "t5-tiny", ["0", "1"], label_words=["no", "yes"])
    [f] = t.features(Dataset([Example(text=SRC, label="1")]), train=True)
    assert f["labels"] == tok.encode("yes") + [tok.eos_id]
    with pytest.raises(LMForgeError, match="label_words has 1 words for 2 labels"):
        t.options.label_words = ["no"]
        t.features(Dataset([Example(text=SRC, label="1")]), train=True)


def test_generation_is_greedy_decoding_of_the_prompt():
    t, m, tok = build("seq2seq", "gpt", "gpt-tiny", num_beams=1, max_new_tokens=5, template="{text} TL;DR:")
    ex = Example(text=SRC, target=TGT)
    feats = t.features(Dataset([ex]))
    ids = feats[0]["_prompt"]
    for _ in range(5):  # greedy by hand
        nxt = int(m.backbone(torch.tensor([ids])).logits[0, -1].argmax())
        if nxt == tok.eos_id:
            break
        ids = ids + [nxt]
    expected = tok.decode(ids[len(feats[0]["_prompt"]) :]).strip()
    assert t.predict_all(m, Dataset([ex])) == [expected]
    beams = t.generate_batch(m, feats, 3, 5)
    assert len(beams) == 1 and isinstance(beams[0], str)


def test_seq2seq_needs_a_generative_model():
    with pytest.raises(LMForgeError, match="needs a decoder or encoder-decoder model with an LM head"):
        build("seq2seq", "bert", "electra-tiny")


def test_seq2seq_evaluation_scores_generations_with_rouge():
    from lmforge.metrics import rouge

    t, m, _ = build("seq2seq", "bart", "bart-tiny")
    outs = ["a man wants a wife", "the nation endures"]
    t.generate_batch = lambda model, feats, beams, n: outs[: len(feats)]
    refs = [TGT, "a new nation"]
    ds = Dataset([Example(text=SRC, target=refs[0]), Example(text="Four score", target=refs[1])])
    scores = t.evaluate(m, ds)
    assert scores == pytest.approx(rouge(outs, refs)) and scores["rouge1"] > scores["rouge2"] > 0
