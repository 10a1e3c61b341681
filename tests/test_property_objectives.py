"""Property tests over every registered objective (`OBJECTIVES`, so new ones are covered without editing this file).

For any token stream written as a prepared data dir, the objective's own loader either refuses it with one line
or yields batches whose transform has valid shapes, ids inside the vocabulary, labels inside it or -100, binary
masks, and which the objective's model scores with a finite loss. Validation transforms are deterministic and do
not touch the training RNG; loaders resume exactly from their state. Known objectives also get their targets
checked against the original text (causal/prefix LM shift, MLM corruption, BART and T5 reconstruction).

Each objective gets the model and tokenizer of the bundled recipe that trains it, else the first tiny
family (encoder, decoder, T5, BART) its constructor accepts."""

from __future__ import annotations

import json
import tempfile
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from training_testing import no_device_reads

from lmforge.config import RECIPES_DIR, read_yaml
from lmforge.data.corpus.bundled import load_default_corpus
from lmforge.errors import LMForgeError
from lmforge.objectives import OBJECTIVES
from lmforge.objectives.seq2seq import ordinary_ids
from lmforge.pretraining.config import build_config
from lmforge.tokenizers import train_tokenizer
from lmforge.tokenizers.specials import FAMILY_BY_ARCH

IGNORE = -100
SEQ_LENS = (8, 13, 24)
FALLBACKS = [  # (model preset, tokenizer kind, tokenizer family)
    ("bert-tiny", "wordpiece", "bert"),
    ("gpt-tiny", "bpe", "gpt"),
    ("t5-tiny", "unigram", "t5"),
    ("bart-tiny", "bpe", "bart"),
]

SETTINGS = settings(
    max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread beats two contended ones
    yield
    torch.set_num_threads(threads)


@cache
def tokenizer(kind: str, family: str):
    return train_tokenizer(load_default_corpus()[:6], kind, 300, family=family)


def candidates(name: str) -> list[dict]:
    """Raw configs that train `name`: its bundled recipes first, then the tiny fallbacks."""
    out = []
    for path in sorted((RECIPES_DIR / "pretrain").glob("*.yaml")):
        raw = read_yaml(path)
        if (raw.get("objective") or {}).get("name", "causal_lm") == name:
            out.append(raw)
    for preset, kind, family in FALLBACKS:
        data = {"tokenizer_kind": kind, "tokenizer_family": family}
        out.append({"model": {"preset": preset}, "data": data, "objective": {"name": name}})
    return out


@cache
def setup(name: str, seq_len: int):
    """(objective, model, tokenizer) for `name` with train.seq_len = seq_len, or pytest.fail."""
    reasons = []
    for raw in candidates(name):
        raw = json.loads(json.dumps(raw))  # a copy
        arch = build_config({"model": raw["model"]}).model.arch
        data = raw.get("data") or {}
        tok = tokenizer(data.get("tokenizer_kind", "bpe"), data.get("tokenizer_family") or FAMILY_BY_ARCH[arch])
        raw["model"]["vocab_size"] = tok.vocab_size
        raw["model"]["dropout"] = 0.0
        raw["train"] = {"seq_len": seq_len, "batch_size": 2}
        try:
            cfg = build_config(raw)
            obj = OBJECTIVES.get(name)(cfg, tok)
            torch.manual_seed(0)
            model = obj.build_model(cfg.model)
        except LMForgeError as e:
            reasons.append(str(e))
            continue
        return obj, model, tok
    pytest.fail(f"objective '{name}' accepts none of the candidate configs: {reasons}")


def write_prepared(root: Path, docs: list[list[int]], vocab_size: int, eos_id: int) -> Path:
    """A prepared data dir (the format of `lmforge.data.corpus.prepare`) with `docs` in both splits."""
    lengths = [len(d) + 1 for d in docs]
    tokens = np.array([t for d in docs for t in [*d, eos_id]], dtype=np.uint16)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    split = {"n_tokens": len(tokens), "n_docs": len(docs), "n_bytes": len(tokens)}
    for s in ("train", "val"):
        tokens.tofile(root / f"{s}.bin")
        with open(root / f"{s}.idx", "wb") as f:
            np.save(f, starts, allow_pickle=False)
    meta = {"format": "lmforge-tokens", "version": 1, "dtype": "uint16", "vocab_size": vocab_size, "eos_id": eos_id,
            "train": split, "val": split, "replaced_bytes": 0}  # fmt: skip
    (root / "meta.json").write_text(json.dumps(meta))
    return root


@st.composite
def streams(draw, vocab_size: int, ordinary: tuple[int, ...]):
    """Documents of token ids: either any ids (special tokens included) or ordinary ones only (so targets can be
    checked against the text); a few ids recur often, so words and sentences repeat. Short streams (which loaders
    may refuse) and ones long enough for any batch are equally likely."""
    pool = st.integers(0, vocab_size - 1) if draw(st.booleans()) else st.sampled_from(ordinary)
    common = draw(st.lists(pool, min_size=1, max_size=8))
    n = draw(st.one_of(st.integers(0, 60), st.integers(150, 300)))  # short, or enough for 3 rows of 2 windows
    tokens = draw(st.lists(st.one_of(pool, st.sampled_from(common)), min_size=n, max_size=n))
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=6)))
    return [tokens[a:b] for a, b in zip([0, *cuts], [*cuts, n])]


def check_batch(batch: dict, batch_size: int, vocab_size: int, model_cfg) -> None:
    assert batch and all(isinstance(v, torch.Tensor) for v in batch.values())
    for key, v in batch.items():
        if key == "mlm_index":  # flat indices of the predicted positions, not a per-row tensor
            assert torch.equal(v, (batch["labels"] != IGNORE).flatten().nonzero().squeeze(1))
            continue
        assert v.shape[0] == batch_size, key
        assert not v.is_floating_point(), key
        if key.endswith("input_ids"):
            assert 0 <= int(v.min()) and int(v.max()) < vocab_size, key
        elif key == "labels":
            ok = (v == IGNORE) | ((v >= 0) & (v < vocab_size))
            assert bool(ok.all()), key
        elif key.endswith("attention_mask"):
            assert set(v.unique().tolist()) <= {0, 1}, key
        elif key == "token_type_ids":
            segments = 2 if model_cfg.rel_segments else max(1, model_cfg.type_vocab_size)  # XLNet: relative
            assert 0 <= int(v.min()) and int(v.max()) < segments, key
        elif key == "sentence_label":
            assert set(v.unique().tolist()) <= {0, 1}
    if "attention_mask" in batch and "input_ids" in batch:
        assert batch["attention_mask"].shape == batch["input_ids"].shape
        assert bool((batch["attention_mask"].sum(1) > 0).all())  # every row has a real token


# --- objective-specific targets --------------------------------------------------------------------------------


def check_targets(obj, tokens, batch: dict) -> None:
    """The targets are what the objective says they are, in terms of the original window."""
    check = TARGETS.get(obj.name)
    if check is None and hasattr(obj, "mask_id") and "labels" in batch and "decoder_input_ids" not in batch:
        check = masked_targets  # MaskedObjective subclasses (mlm, roberta, spanbert, electra, bert)
    if check is not None:
        check(obj, tokens, batch)
    if "decoder_input_ids" in batch:  # teacher forcing: the decoder reads the labels shifted right
        dec, labels = batch["decoder_input_ids"], batch["labels"]
        assert bool((dec[:, 0] == obj.cfg.model.decoder_start_id).all())
        real = labels[:, :-1] != IGNORE
        assert torch.equal(dec[:, 1:][real], labels[:, :-1][real])


def next_token_targets(obj, tokens, batch):
    assert torch.equal(batch["input_ids"], tokens[:, :-1])
    assert torch.equal(batch["labels"], tokens[:, 1:])


def prefix_targets(obj, tokens, batch):
    assert torch.equal(batch["input_ids"], tokens[:, :-1])
    labels, T = batch["labels"], tokens.shape[1] - 1
    prefix = batch["prefix_len"]
    assert bool(((prefix >= 1) & (prefix <= max(1, T - 1))).all())
    scored = torch.arange(T)[None, :] >= prefix[:, None] - 1  # (B, T) predictions of continuation tokens
    assert torch.equal(labels[scored], tokens[:, 1:][scored])
    assert bool((labels[~scored] == IGNORE).all())


def masked_targets(obj, tokens, batch):
    original = obj.inputs(tokens)["input_ids"]
    labels, ids = batch["labels"], batch["input_ids"]
    sel = labels != IGNORE
    assert torch.equal(labels[sel], original[sel])  # the targets are the original tokens
    assert torch.equal(ids[~sel], original[~sel])  # everything not selected is left as it was
    assert not bool(obj.special[original[sel]].any())  # special tokens are never selected


def mae_lm_targets(obj, tokens, batch):
    """MAE-LM: the encoder reads exactly the unselected tokens, in order, at their own positions; the labels are
    the selected originals."""
    original = obj.inputs(tokens)["input_ids"]
    labels, enc = batch["labels"], batch["attention_mask"].bool()
    sel = labels != IGNORE
    assert torch.equal(labels[sel], original[sel]) and not bool(obj.special[original[sel]].any())
    real = batch["decoder_attention_mask"].bool() if "decoder_attention_mask" in batch else torch.ones_like(sel)
    for row in range(original.shape[0]):
        kept = ~sel[row] & real[row]
        assert torch.equal(batch["input_ids"][row][enc[row]], original[row][kept])
        assert torch.equal(batch["position_ids"][row][enc[row]], kept.nonzero().squeeze(1))
        if not bool((original[row] == obj.mask_id).any()):  # a [MASK] the stream itself holds is kept as a token
            assert not bool((batch["input_ids"][row][enc[row]] == obj.mask_id).any())  # none reaches the encoder


def bart_targets(obj, tokens, batch):
    x, labels = tokens[:, :-1], batch["labels"]
    assert torch.equal(labels, x)  # the decoder rebuilds the whole original window


def t5_targets(obj, tokens, batch):
    """Span corruption: putting each target span back in place of its sentinel gives the original window."""
    sentinels = set(obj.sentinels.tolist())
    x = tokens[:, :-1]
    for row in range(x.shape[0]):
        original = x[row].tolist()
        if sentinels & set(original):
            continue  # a sentinel inside the text makes the reconstruction ambiguous
        mask = batch.get("attention_mask", torch.ones_like(batch["input_ids"]))  # none: no row is padded
        src = [t for t, m in zip(batch["input_ids"][row].tolist(), mask[row].tolist()) if m]
        tgt = [t for t in batch["labels"][row].tolist() if t != IGNORE]
        assert src[-1] == obj.eos_id and tgt[-1] == obj.eos_id
        spans, current = {}, None
        for t in tgt[:-1]:
            if t in sentinels:
                current = spans.setdefault(t, [])
            else:
                assert current is not None  # the target starts with a sentinel
                current.append(t)
        rebuilt = [t for s in src[:-1] for t in (spans[s] if s in sentinels else [s])]
        assert rebuilt == original


TARGETS = {"causal_lm": next_token_targets, "mtp": next_token_targets, "prefix_lm": prefix_targets,
           "bart": bart_targets, "t5": t5_targets, "mae-lm": mae_lm_targets}  # fmt: skip


# --- the property --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", OBJECTIVES.names())
def test_objective_transform_holds_for_any_token_stream(name):
    torch.manual_seed(0)  # the objectives' draws (XLNet's permutations) decide which streams are refused
    tok = setup(name, SEQ_LENS[0])[2]
    ordinary = tuple(ordinary_ids(tok).tolist())

    ran: list[int] = []
    # Streams long enough for any loader, tried first at each sequence length: the random streams' lengths follow
    # hypothesis' draws, which change with the constants of the modules already imported (so with test order).
    rng = np.random.default_rng(0)
    long = [[rng.choice(ordinary, 64).tolist() for _ in range(8)] for _ in SEQ_LENS]
    explicit = [example(stream=s, seq_len=t, batch_size=b) for s, t, b in zip(long, SEQ_LENS, (3, 2, 1))]

    @SETTINGS
    @given(stream=streams(tok.vocab_size, ordinary), seq_len=st.sampled_from(SEQ_LENS), batch_size=st.integers(1, 3))
    def prop(stream, seq_len, batch_size):
        obj, model, tok = setup(name, seq_len)
        obj.cfg.train.batch_size = batch_size
        with tempfile.TemporaryDirectory() as d:
            data = write_prepared(Path(d), stream, tok.vocab_size, tok.eos_id)
            try:
                loader = obj.make_loader(data, "train")
            except LMForgeError as e:  # too little data for a batch, say: a clear one-line refusal is fine
                assert str(e) and "\n" not in str(e)
                assert stream not in long, f"a stream of {sum(map(len, stream))} tokens was refused: {e}"
                event("loader refused the stream")
                return
            tokens = next(loader)
            state = loader.state_dict()
            again = obj.make_loader(data, "train")
            again.load_state_dict(state)
            after = (next(loader), next(again))
            val_tokens = next(iter(obj.make_loader(data, "val").eval_batches(1)))
        assert same(after[0], after[1])  # a loader resumed from its state continues identically
        torch.manual_seed(seq_len)
        batch = obj.transform(tokens)
        check_batch(batch, batch_size, model.config.vocab_size, model.config)
        check_targets(obj, tokens, batch)
        ran.append(1)
        model.train()
        out = obj.loss(model, batch)
        assert torch.isfinite(out.loss) and 0 <= out.n_tokens <= max(v.numel() for v in batch.values())
        if hasattr(obj, "eval_transform"):
            rng = torch.get_rng_state()
            first, second = obj.eval_transform(val_tokens), obj.eval_transform(val_tokens)
            assert torch.equal(rng, torch.get_rng_state())  # validation noise leaves the training RNG alone
            assert same(first, second)
            model.eval()
            assert torch.isfinite(obj.loss(model, first).loss)

    for add in explicit:
        prop = add(prop)
    prop()
    hardly = "most streams were refused: the property was hardly tested"
    assert len(ran) >= len(long) + SETTINGS.max_examples // 4, hardly


@pytest.mark.parametrize("name", OBJECTIVES.names())
def test_a_training_loss_never_waits_for_the_device(name, tmp_path):
    """A training batch's loss and backward read no value back and index with no boolean mask: on a GPU each would
    stall the step. The positions a loss gathers come with the batch, found on the CPU."""
    obj, model, tok = setup(name, SEQ_LENS[-1])
    rng = np.random.default_rng(0)
    ordinary = ordinary_ids(tok).numpy()
    docs = [rng.choice(ordinary, 120).tolist() for _ in range(12)]
    batch = obj.transform(next(obj.make_loader(write_prepared(tmp_path, docs, tok.vocab_size, tok.eos_id), "train")))
    model.train()
    try:
        with no_device_reads():
            obj.loss(model, batch).loss.backward()
    finally:
        model.zero_grad(set_to_none=True)


def same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    return torch.equal(a, b)
