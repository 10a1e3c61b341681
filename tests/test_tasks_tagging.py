"""Token tagging: labels on first sub-tokens, BIO entity extraction, conlleval-style scores, word predictions."""

import pytest
import tasks_testing as T
import torch

from lmforge.data.labelled.examples import Dataset, Example
from lmforge.errors import LMForgeError
from lmforge.registry import TASKS
from lmforge.tasks.tagging import bio_entities, entity_scores, first_subtokens

LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
WORDS = ["Jane", "Bennet", "walked", "to", "Netherfield", "Park", "universally"]
TAGS = ["B-PER", "I-PER", "O", "O", "B-LOC", "I-LOC", "O"]


def build(family, preset, **options):
    tok = T.tokenizer(family)
    cls = TASKS.get("token_tagging")
    t = cls(cls.Options(head_dropout=0.0, **options), tok, LABELS)
    return t, t.build(T.model(preset, tok)).eval(), tok


def test_first_subtokens_with_offsets():
    words = ["ab", "cde", "f"]
    # text "ab cde f", tokens "a" "b" " c" "de" " f": byte-level tokens carry the space before a word
    assert first_subtokens(words, [(0, 1), (1, 2), (2, 4), (4, 6), (6, 8)]) == [0, 2, 4]
    # a space-only token ("Ġ") belongs to no word: the word starts at the next token
    assert first_subtokens(words, [(0, 2), (2, 3), (3, 6), (6, 8)]) == [0, 2, 3]
    assert first_subtokens(["a", "b"], [(0, 1)]) == [0, -1]  # a word without tokens (cut off)


@pytest.mark.parametrize("family,preset", [("bert", "bert-tiny"), ("gpt", "gpt-tiny"), ("t5", "t5-tiny")])
def test_labels_sit_on_the_first_subtoken_of_each_word(family, preset):
    t, _, tok = build(family, preset)
    [f] = t.features(Dataset([Example(tokens=WORDS, tags=TAGS)]))
    labelled = [i for i, x in enumerate(f["labels"]) if x != -100]
    assert [f["labels"][i] for i in labelled] == [LABELS.index(x) for x in TAGS]
    assert labelled == f["_first"]
    # The labelled token of each word is the word's beginning (SentencePiece may split off a bare "▁" word
    # marker, which then is that beginning); the words' other sub-tokens are ignored.
    for word, pos in zip(WORDS, labelled):
        raw = tok.id_to_token(f["input_ids"][pos])
        piece = raw.lstrip("Ġ▁").lower()
        assert raw == "▁" or (piece and word.lower().startswith(piece)), (word, raw)
    assert len(f["input_ids"]) > len(labelled) + len(t.framer.start) + len(t.framer.end)


def test_truncated_words_are_predicted_outside():
    t, m, _ = build("bert", "bert-tiny", max_len=6)
    [f] = t.features(Dataset([Example(tokens=WORDS, tags=TAGS)]))
    assert len(f["input_ids"]) == 6 and f["_first"][-1] == -1
    [pred] = t.predict_all(m, Dataset([Example(tokens=WORDS, tags=TAGS)]))
    assert len(pred) == len(WORDS) and pred[-1] == "O"


def test_tag_count_mismatch_is_an_error():
    t, _, _ = build("bert", "bert-tiny")
    with pytest.raises(LMForgeError, match="7 words but 2 tags"):
        t.features(Dataset([Example(tokens=WORDS, tags=["O", "O"], id="s1")], source="x.conll"))


def test_bio_entities():
    assert bio_entities(TAGS) == {("PER", 0, 1), ("LOC", 4, 5)}
    assert bio_entities(["I-PER", "I-PER", "B-PER", "I-LOC", "O"]) == {("PER", 0, 1), ("PER", 2, 2), ("LOC", 3, 3)}
    assert bio_entities(["O", "O"]) == set()


def test_entity_scores_by_hand():
    gold = [TAGS, ["B-LOC", "O"]]
    pred = [["B-PER", "I-PER", "O", "O", "B-LOC", "O", "O"], ["B-LOC", "O"]]  # one LOC boundary wrong
    s = entity_scores(pred, gold)
    # entities: gold 3, predicted 3, right 2 → P = R = F1 = 2/3; words right 8 of 9
    assert s["precision"] == pytest.approx(2 / 3) and s["recall"] == pytest.approx(2 / 3)
    assert s["entity_f1"] == pytest.approx(2 / 3) and s["accuracy"] == pytest.approx(8 / 9)


def test_predict_maps_first_subtoken_argmax_to_tags():
    t, m, _ = build("bert", "bert-tiny")
    ds = Dataset([Example(tokens=WORDS, tags=TAGS)])
    [f] = t.features(ds)
    with torch.no_grad():  # make the head emit the gold tag on each word's first sub-token, O elsewhere
        m.head.out.weight.zero_()
        m.head.out.bias.zero_()
    target = torch.zeros(len(f["input_ids"]), len(LABELS))
    for pos, tag in zip(f["_first"], TAGS):
        target[pos, LABELS.index(tag)] = 10.0
    m.head.forward = lambda h: target.expand(h.shape[0], -1, -1)
    assert t.predict_all(m, ds) == [TAGS]
    assert t.evaluate(m, ds) == {"entity_f1": 1.0, "precision": 1.0, "recall": 1.0, "accuracy": 1.0}
