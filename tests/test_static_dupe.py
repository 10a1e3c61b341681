"""Static masking with BERT's dupe factor (create_pretraining_data.py --dupe_factor=10; RoBERTa §4.1: "the training
data was duplicated 10 times so that each sequence is masked in 10 different ways over the 40 epochs"): through the
training data path a sequence meets exactly dupe_factor masks, epoch e the (e mod dupe_factor)-th, the same on one
process or two and after a resume; each copy follows BERT's 15% selection and 80/10/10 replacement."""

import pytest
import torch
from encoder_testing import objective, prepared, tokenizer
from lm_objective_testing import run_cli

from lmforge.errors import LMForgeError
from lmforge.experiments.arms import resolve_config
from lmforge.experiments.plan import plan_experiment
from lmforge.experiments.spec import load_experiment
from lmforge.objectives import masking as M
from lmforge.pretraining.config import load_config
from lmforge.pretraining.run import ObjectiveBatches
from lmforge.train.distributed import rank_seed

SEQ, BATCH = 64, 8


@pytest.fixture(scope="module")
def tok():
    return tokenizer("wordpiece", "bert")


@pytest.fixture(scope="module")
def data(tok, tmp_path_factory):
    return prepared(tmp_path_factory.mktemp("dupe"), tok, n_docs=2)


def static(tok, *extra: str, world_size: int = 1):
    return objective("mlm", tok, "--objective.static=true", f"--train.seq_len={SEQ}",
                     f"--train.batch_size={BATCH // world_size}", "--run.seed=5", *extra)  # fmt: skip


def sources(tok, data, *extra: str, world_size: int = 1) -> list[ObjectiveBatches]:
    """Each rank's training batches as a run makes them: the objective's loader, its transform, its rank seed."""
    out = []
    for rank in range(world_size):
        obj = static(tok, *extra, world_size=world_size)
        loader = obj.make_loader(data, "train", rank=rank, world_size=world_size)
        out.append(ObjectiveBatches(loader, obj.transform, rank_seed(5, rank) + 0x0B1E))
    return out


def masks_by_epoch(srcs: list[ObjectiveBatches], epochs: int, first: int = 0) -> dict[tuple, dict[int, bytes]]:
    """original window → {epoch: its corrupted inputs and labels}, over `epochs` epochs of every rank's batches."""
    seen: dict[tuple, dict[int, bytes]] = {}
    per_epoch = srcs[0].loader.batches_per_epoch
    for epoch in range(first, first + epochs):
        for _ in range(per_epoch):
            for src in srcs:
                batch = next(src).data
                ids, labels = batch["input_ids"], batch["labels"]
                original = torch.where(labels != M.IGNORE, labels, ids)
                for row in range(len(ids)):
                    mask = ids[row].numpy().tobytes() + labels[row].numpy().tobytes()
                    epochs_of = seen.setdefault(tuple(original[row].tolist()), {})
                    assert epoch not in epochs_of  # each window once an epoch
                    epochs_of[epoch] = mask
    return seen


def test_each_sequence_cycles_through_its_dupe_factor_masks(tok, data):
    d, epochs = 10, 23  # BERT's default; two whole cycles and three epochs of a third
    seen = masks_by_epoch(sources(tok, data), epochs)
    assert len(seen) >= 20
    whole = 0  # windows met in every copy's epochs (an epoch leaves out the windows of its incomplete last batch)
    for by_epoch in seen.values():
        met = sorted(by_epoch)
        for e in met:  # epoch e meets copy e mod 10: the same mask as epochs e ± 10, and no other epoch's
            assert [f for f in met if by_epoch[f] == by_epoch[e]] == [f for f in met if f % d == e % d]
        copies = {e % d for e in met}
        assert len(set(by_epoch.values())) == len(copies) <= d
        whole += len(copies) == d
    assert whole >= 0.9 * len(seen)  # those have exactly dupe_factor different masks


def test_masks_do_not_depend_on_processes_or_resume(tok, data):
    extra = "--objective.dupe_factor=3"
    one = masks_by_epoch(sources(tok, data, extra), 5)
    two = masks_by_epoch(sources(tok, data, extra, world_size=2), 5)
    assert one == two  # the same mask for every (sequence, epoch), on one process or two
    # Stopped mid-epoch 1 and resumed in a fresh process's objects: the position brings its epoch back.
    src = sources(tok, data, extra)[0]
    for _ in range(src.loader.batches_per_epoch + 1):
        next(src)
    resumed = sources(tok, data, extra)[0]
    resumed.load_state_dict(src.state_dict())
    batch, again = next(resumed).data, next(src).data
    assert torch.equal(batch["input_ids"], again["input_ids"]) and torch.equal(batch["labels"], again["labels"])
    ids, labels = batch["input_ids"], batch["labels"]
    original = torch.where(labels != M.IGNORE, labels, ids)
    for row in range(len(ids)):
        key = tuple(original[row].tolist())
        assert one[key][1] == ids[row].numpy().tobytes() + labels[row].numpy().tobytes()  # epoch 1's copy


def test_dupe_factor_one_keeps_one_mask_for_the_whole_run(tok, data):
    seen = masks_by_epoch(sources(tok, data, "--objective.dupe_factor=1"), 4)
    assert all(len(set(by_epoch.values())) == 1 for by_epoch in seen.values())


def test_every_copy_is_bert_15_percent_80_10_10(tok, data):
    """create_pretraining_data: 15% of the tokens predicted; of them 80% [MASK], 10% kept, 10% a random word."""
    obj = static(tok)
    seen = masks_by_epoch(sources(tok, data), 10)  # epochs 0..9: copies 0..9
    picked_by_copy: list[dict[tuple, torch.Tensor]] = []
    totals = torch.zeros(4)  # candidates, selected, [MASK], kept
    for copy in range(10):
        counts, picked_by_copy = torch.zeros(4), [*picked_by_copy, {}]
        for key, by_epoch in seen.items():
            if copy not in by_epoch:  # left out of that epoch with its incomplete last batch
                continue
            raw = torch.frombuffer(bytearray(by_epoch[copy]), dtype=torch.int64)
            ids, labels = raw[:SEQ], raw[SEQ:]
            picked = labels != M.IGNORE
            cand = ~obj.special[torch.where(picked, labels, ids)]
            counts += torch.tensor([cand.sum(), picked.sum(), (ids[picked] == obj.mask_id).sum(),
                                    (ids[picked] == labels[picked]).sum()], dtype=torch.float)  # fmt: skip
            picked_by_copy[copy][key] = picked
        cand, sel, masked, kept = counts.tolist()
        assert abs(sel / cand - 0.15) < 0.01, copy
        assert abs(masked / sel - 0.8) < 0.05 and abs(kept / sel - 0.1) < 0.04, copy
        totals += counts
    cand, sel, masked, kept = totals.tolist()
    assert abs(masked / sel - 0.8) < 0.015
    assert abs(kept / sel - 0.1) < 0.012  # a random word may equal the original: 1 / vocabulary more
    assert abs((sel - masked - kept) / sel - 0.1) < 0.012
    # The copies are independent draws: a token of one copy's selection is in another's about 15% of the time.
    for a, b in [(0, 1), (3, 7), (2, 9)]:
        both = picked_by_copy[a].keys() & picked_by_copy[b].keys()
        x = torch.stack([picked_by_copy[a][k] for k in both])
        y = torch.stack([picked_by_copy[b][k] for k in both])
        overlap = float((x & y).sum() / x.sum())
        assert 0.08 < overlap < 0.24, (a, b, overlap)


def test_defaults_and_bad_values():
    assert load_config("roberta", ["--objective.static=true"]).objective.options.dupe_factor is None  # = BERT's 10
    with pytest.raises(LMForgeError, match=r"^objective.dupe_factor must be >= 1, got 0$"):
        load_config("roberta", ["--objective.static=true", "--objective.dupe_factor=0"])
    with pytest.raises(LMForgeError, match="counts the copies of static masks: set objective.static=true with it"):
        load_config("roberta", ["--objective.dupe_factor=3"])


def test_bad_dupe_factor_is_one_line_and_a_non_zero_exit(tmp_path):
    res = run_cli("config", "show", "roberta", "--objective.static=true", "--objective.dupe_factor=-2", cwd=tmp_path)
    assert res.returncode != 0
    assert res.stderr.strip().splitlines() == ["error: objective.dupe_factor must be >= 1, got -2"]


def test_roberta_masking_static_arm_keeps_one_mask_seen_four_times():
    """The experiment's 4 passes give its one static mask 4 sightings, as each of BERT's 10 had over 40 epochs."""
    plan = plan_experiment(load_experiment("roberta-masking"), False)
    arms = {a.info["arm"]: a for a in plan.arms if a.kind == "pretrain"}
    static_arm = resolve_config(arms["static"].recipe, arms["static"].overrides).objective.options
    dynamic_arm = resolve_config(arms["dynamic"].recipe, arms["dynamic"].overrides).objective.options
    assert (static_arm.static, static_arm.dupe_factor) == (True, 1) and not dynamic_arm.static
