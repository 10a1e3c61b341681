"""objective.dupe_factor for the other objectives with static masks (ELECTRA, SpanBERT, MAE-LM), as for mlm
(tests/test_static_dupe.py; BERT's create_pretraining_data --dupe_factor=10, RoBERTa §4.1): through the training
data path a sequence meets exactly dupe_factor masks, epoch e the (e mod dupe_factor)-th."""

import pytest
import torch
from encoder_testing import objective, prepared, tokenizer

from lmforge.errors import LMForgeError
from lmforge.objectives import masking as M
from lmforge.pretraining.config import load_config
from lmforge.pretraining.run import ObjectiveBatches
from lmforge.train.distributed import rank_seed

SEQ, BATCH = 64, 8
OBJECTIVES = ["electra", "spanbert", "mae-lm"]


@pytest.fixture(scope="module")
def tok():
    return tokenizer("wordpiece", "bert")


@pytest.fixture(scope="module")
def data(tok, tmp_path_factory):
    return prepared(tmp_path_factory.mktemp("dupe"), tok, n_docs=2)


def static(name: str, tok, *extra: str):
    return objective(name, tok, "--objective.static=true", f"--train.seq_len={SEQ}", f"--train.batch_size={BATCH}",
                     "--run.seed=5", *extra)  # fmt: skip


def rows(batch: dict) -> list[tuple[tuple, bytes]]:
    """(the original window, its masking) of each row of a training batch. MAE-LM's encoder input holds the kept
    tokens at `position_ids`; the labels hold the removed ones."""
    labels = batch["labels"]
    if "position_ids" in batch:
        original = labels.clone()
        for r in range(len(labels)):
            keep = batch["attention_mask"][r].bool()
            original[r, batch["position_ids"][r, keep]] = batch["input_ids"][r, keep]
    else:
        original = torch.where(labels != M.IGNORE, labels, batch["input_ids"])
    return [
        (tuple(original[r].tolist()), batch["input_ids"][r].numpy().tobytes() + labels[r].numpy().tobytes())
        for r in range(len(labels))
    ]


def masks_by_epoch(name: str, tok, data, epochs: int, *extra: str) -> dict[tuple, dict[int, bytes]]:
    """original window → {epoch: its masking}, over `epochs` epochs of the training batches as a run makes them."""
    obj = static(name, tok, *extra)
    loader = obj.make_loader(data, "train", rank=0, world_size=1)
    src = ObjectiveBatches(loader, obj.transform, rank_seed(5, 0) + 0x0B1E)
    seen: dict[tuple, dict[int, bytes]] = {}
    for epoch in range(epochs):
        for _ in range(loader.batches_per_epoch):
            for key, mask in rows(next(src).data):
                by_epoch = seen.setdefault(key, {})
                assert epoch not in by_epoch  # each window once an epoch
                by_epoch[epoch] = mask
    return seen


def selects(mask: bytes) -> bool:
    """Whether a row's masking predicts any token (its labels, the second half of the bytes, are not all IGNORE)."""
    labels = torch.frombuffer(bytearray(mask), dtype=torch.int64)[-SEQ:]
    return bool((labels != M.IGNORE).any())


@pytest.mark.parametrize("name", OBJECTIVES)
def test_each_sequence_cycles_through_its_dupe_factor_masks(name, tok, data):
    d, epochs = 3, 8  # two whole cycles and two epochs of a third
    seen = masks_by_epoch(name, tok, data, epochs, f"--objective.dupe_factor={d}")
    assert len(seen) >= 20
    whole = 0  # windows met in every copy's epochs (an epoch leaves out the windows of its incomplete last batch)
    distinct = 0  # windows met in dupe_factor different masks (SpanBERT: some rows of 64 tokens keep no span)
    for by_epoch in seen.values():
        met = sorted(by_epoch)
        for e in met:  # epoch e meets copy e mod d: the same mask as epochs e ± d, and no other epoch's
            same, cycle = [f for f in met if by_epoch[f] == by_epoch[e]], [f for f in met if f % d == e % d]
            # SpanBERT's renewal process may keep no span in a short budget: two such copies are alike (no mask).
            assert same == cycle if selects(by_epoch[e]) else set(cycle) <= set(same), name
        copies = {e % d for e in met}
        masks = {m for m in by_epoch.values() if selects(m)}
        assert len(masks) == len({e % d for e in met if selects(by_epoch[e])}) <= d
        whole += len(copies) == d
        distinct += len(masks) == d
    assert whole >= 0.9 * len(seen)
    assert distinct >= 0.75 * len(seen), (distinct, len(seen))  # exactly dupe_factor different masks


@pytest.mark.parametrize("name", OBJECTIVES)
def test_dupe_factor_one_keeps_one_mask_and_bert_s_ten_is_the_default(name, tok, data):
    seen = masks_by_epoch(name, tok, data, 3, "--objective.dupe_factor=1")
    assert all(len(set(by_epoch.values())) == 1 for by_epoch in seen.values())
    assert static(name, tok).copies == 10 and objective(name, tok).copies == 0  # dynamic masks: no copies


@pytest.mark.parametrize("name", OBJECTIVES)
def test_bad_dupe_factors_are_one_line(name):
    with pytest.raises(LMForgeError, match=r"^objective.dupe_factor must be >= 1, got 0$"):
        load_config(None, [f"--objective.name={name}", "--objective.static=true", "--objective.dupe_factor=0"])
    with pytest.raises(LMForgeError, match="counts the copies of static masks: set objective.static=true with it"):
        load_config(None, [f"--objective.name={name}", "--objective.dupe_factor=3"])
