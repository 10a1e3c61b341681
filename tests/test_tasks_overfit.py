"""Every task type, in each input format, learns: one small batch is overfit in a few dozen steps."""

import pytest
import tasks_testing as T
import torch

from lmforge.data.labelled.examples import Dataset, Example
from lmforge.registry import TASKS
from lmforge.tasks.inputs import collate

SENTENCES = T.sentiment(8, seed=3).examples
LABELS = ["negative", "positive"]


def word(e: Example) -> str:
    return next(w for w in e.text.split() if w in T.POSITIVE + T.NEGATIVE)


CASES = {
    "classification-gpt": ("classification", "gpt", "gpt-tiny", SENTENCES, LABELS, {}),
    "classification-bert": ("classification", "bert", "bert-tiny", SENTENCES, LABELS, {}),
    "classification-bart": ("classification", "bart", "bart-tiny", SENTENCES, LABELS, {}),
    "classification-t5-encoder": ("classification", "t5", "t5-tiny", SENTENCES, LABELS, {}),
    "pair-gpt-symmetric": (
        "pair_classification", "gpt", "gpt-tiny",
        [Example(text=e.text, text_pair="so it was", label=e.label) for e in SENTENCES], LABELS, {"symmetric": True},
    ),
    "regression-bert": (
        "regression", "bert", "bert-tiny",
        [Example(text=e.text, text_pair="it was", label=4.0 * (e.label == "positive")) for e in SENTENCES], None, {},
    ),
    "multiple-choice-gpt": (
        "multiple_choice", "gpt", "gpt-tiny",
        [Example(text=e.text, choices=["it was good", "it was bad"], label=int(e.label == "negative"))
         for e in SENTENCES], None, {},
    ),
    "span-qa-bert": (
        "span_qa", "bert", "bert-tiny",
        [Example(text="which word?", context=e.text, answers=[(e.text.index(word(e)), word(e))]) for e in SENTENCES],
        None, {"max_len": 24, "doc_stride": 8},
    ),
    "tagging-bert": (
        "token_tagging", "bert", "bert-tiny",
        [Example(tokens=e.text.split(), tags=["B-S" if w == word(e) else "O" for w in e.text.split()])
         for e in SENTENCES], ["O", "B-S"], {},
    ),
    "text-to-text-t5": ("text_to_text", "t5", "t5-v1_1-tiny", SENTENCES, LABELS, {"template": "sst2 sentence: {text}"}),
    "seq2seq-bart": ("seq2seq", "bart", "bart-tiny", [Example(text=e.text, target=word(e)) for e in SENTENCES],
                     None, {}),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_one_batch_is_overfit(case):
    name, family, preset, examples, labels, options = CASES[case]
    tok = T.tokenizer(family)
    cls = TASKS.get(name)
    task = cls(cls.Options(head_dropout=0.0, **options), tok, labels)
    model = task.build(T.model(preset, tok, seed=1))
    batch = collate(task.features(Dataset(examples), train=True), task.pad_id)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    model.train()
    losses = []
    for _ in range(60):  # the tiny tokenizers train differently per process: at 30 steps one in ~25 stayed above
        out = task.loss(model, batch)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(out.metrics["task_loss"])  # without GPT-1's auxiliary LM term
    assert losses[-1] < 0.25 * losses[0], losses
