"""Sentence-pair data (NSP, SOP), DOC-SENTENCES chunks, and the bert / roberta objectives."""

import numpy as np
import pytest
import torch
from encoder_testing import objective, one_thread, overfit, prepared, tiny_encoder, tokenizer  # noqa: F401

from lmforge.data.corpus.loader import open_tokens, read_meta
from lmforge.errors import LMForgeError
from lmforge.models import Transformer
from lmforge.objectives import OBJECTIVES
from lmforge.objectives import masking as M
from lmforge.objectives.sentence_data import DocChunkLoader, SentencePairLoader, sentence_end_ids
from lmforge.pretraining.config import load_config

T = 64


@pytest.fixture(scope="module")
def tok():
    return tokenizer("wordpiece", "bert")


@pytest.fixture(scope="module")
def data(tok, tmp_path_factory):
    return prepared(tmp_path_factory.mktemp("nsp"), tok, n_docs=12, val_fraction=0.2)


class Stream:
    """The train split's tokens and documents, to find where a segment comes from."""

    def __init__(self, data):
        self.tokens = np.asarray(open_tokens(data, "train", read_meta(data))).astype(np.int64)
        self.starts = np.load(data / "train.idx")
        self.raw = self.tokens.tobytes()

    def find(self, seq) -> int:
        """Position of the first occurrence of seq in the stream, or -1."""
        needle = np.asarray(seq, dtype=np.int64).tobytes()
        at = self.raw.find(needle)
        while at != -1 and at % 8:
            at = self.raw.find(needle, at + 1)
        return -1 if at == -1 else at // 8

    def doc(self, pos: int) -> int:
        return int(np.searchsorted(self.starts, pos, side="right") - 1)


def pair_loader(data, tok, **kw) -> SentencePairLoader:
    args = dict(rank=0, world_size=1, seed=0, end_ids=sentence_end_ids(tok), cls_id=tok.cls_id,
                sep_id=tok.sep_id, pad_id=tok.pad_id)  # fmt: skip
    args.update(kw)
    bs, split = args.pop("batch_size", 16), args.pop("split", "train")
    return SentencePairLoader(data, split, args.pop("seq_len", T), bs, **args)


def segments(tok, ids: torch.Tensor) -> tuple[list[int], list[int]]:
    row = ids.tolist()
    first = row.index(tok.sep_id)
    second = row.index(tok.sep_id, first + 1)
    return row[1:first], row[first + 1 : second]


def test_sentence_end_tokens():
    wp = tokenizer("wordpiece", "bert")
    assert sorted(wp.id_to_token(i) for i in sentence_end_ids(wp)) == ["!", ".", "?"]
    bpe = tokenizer("bpe", "bart")
    ends = {bpe.id_to_token(i) for i in sentence_end_ids(bpe)}
    assert {".", "?", "!"} <= ends and all(not any(c.isalpha() for c in t) for t in ends)
    assert bpe.token_to_id(",") not in sentence_end_ids(bpe)


def test_pairs_layout_labels_and_sources(data, tok):
    loader = pair_loader(data, tok)
    stream = Stream(data)
    labels, n_next, n_random = [], 0, 0
    for _ in range(loader.batches_per_epoch):
        b = next(loader)
        ids, types, att = b["input_ids"], b["token_type_ids"], b["attention_mask"]
        assert ids.shape == (16, T) and (ids[:, 0] == tok.cls_id).all()
        for r in range(len(ids)):
            a, bb = segments(tok, ids[r])
            n = len(a) + len(bb) + 3
            assert len(a) >= 1 and len(bb) >= 1 and n <= T
            assert types[r].tolist() == [0] * (len(a) + 2) + [1] * (len(bb) + 1) + [0] * (T - n)
            assert att[r].tolist() == [1] * n + [0] * (T - n)
            assert (ids[r, n:] == tok.pad_id).all()
            at = stream.find(a + bb)
            if b["sentence_label"][r] == 0:  # IsNext: B continues A in the same document
                assert at >= 0 and stream.doc(at) == stream.doc(at + len(a) + len(bb) - 1)
                n_next += 1
            elif min(len(a), len(bb)) >= 8:  # NotNext: B comes from another document (checked where unambiguous)
                assert at == -1 and stream.doc(stream.find(bb)) != stream.doc(stream.find(a))
                n_random += 1
        labels += b["sentence_label"].tolist()
    assert len(labels) > 500
    assert abs(np.mean(labels) - 0.5) < 0.05
    assert n_next > 200 and n_random > 100


def test_sentence_order_pairs(data, tok):
    loader = pair_loader(data, tok, task="sop")
    stream = Stream(data)
    labels = []
    for _ in range(10):
        b = next(loader)
        for r in range(16):
            a, bb = segments(tok, b["input_ids"][r])
            if b["sentence_label"][r] == 0:  # in order: A then B, contiguous
                assert stream.find(a + bb) >= 0
            else:  # swapped: B is the text right before A
                assert stream.find(bb + a) >= 0 and stream.find(a + bb) == -1
        labels += b["sentence_label"].tolist()
    assert 0.3 < np.mean(labels) < 0.7


def test_world_size_invariance_resume_and_eval(data, tok):
    one = pair_loader(data, tok, batch_size=8)
    r0 = pair_loader(data, tok, batch_size=4, rank=0, world_size=2)
    r1 = pair_loader(data, tok, batch_size=4, rank=1, world_size=2)
    for _ in range(3):
        full, a, b = next(one), next(r0), next(r1)
        for k in full:
            assert torch.equal(full[k], torch.cat([a[k], b[k]]))
    # Exact resume, also across an epoch boundary, without replaying anything.
    loader = pair_loader(data, tok, batch_size=8)
    for _ in range(loader.batches_per_epoch - 2):
        next(loader)
    state = loader.state_dict()
    expected = [next(loader) for _ in range(4)]
    fresh = pair_loader(data, tok, batch_size=8)
    fresh.load_state_dict(state)
    for want in expected:
        got = next(fresh)
        assert all(torch.equal(got[k], want[k]) for k in want)
    assert fresh.epoch == 1 and not torch.equal(expected[0]["input_ids"], expected[2]["input_ids"])
    with pytest.raises(LMForgeError, match="cannot resume data loader: global_batch was 8, now 16"):
        pair_loader(data, tok, batch_size=16).load_state_dict(state)
    # Evaluation: the same examples every call, in stream order, split over ranks.
    ev = pair_loader(data, tok, batch_size=8)
    a, b = list(ev.eval_batches(3)), list(ev.eval_batches(3))
    assert len(a) == 3 and all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(a, b))
    halves = [next(pair_loader(data, tok, batch_size=4, rank=r, world_size=2).eval_batches(1)) for r in (0, 1)]
    assert torch.equal(torch.cat([h["input_ids"] for h in halves]), a[0]["input_ids"])
    # A validation split smaller than one global batch is scored whole, in one smaller batch; it cannot train.
    n = pair_loader(data, tok, split="val").n_examples
    val = pair_loader(data, tok, split="val", batch_size=n + 1)
    assert [len(b["input_ids"]) for b in val.eval_batches()] == [n]
    with pytest.raises(LMForgeError, match=rf"val split has {n} sentence chunks of at most \d+ tokens, need at least"):
        next(val)
    with pytest.raises(LMForgeError, match=r"train split has \d+ sentence chunks .* need at least batch_size"):
        pair_loader(data, tok, batch_size=10**6)


def test_doc_sentences_never_cross_documents(data, tok):
    loader = DocChunkLoader(data, "train", T, 16, rank=0, world_size=1, seed=0, end_ids=sentence_end_ids(tok),
                            pad_id=tok.pad_id)  # fmt: skip
    stream = Stream(data)
    ends = set(sentence_end_ids(tok).tolist())
    sentence_final = 0
    for _ in range(20):
        rows = next(loader)
        assert rows.shape == (16, T + 1)
        for row in rows.tolist():
            text = [t for t in row if t != tok.pad_id]
            assert 1 <= len(text) <= T - 2 and tok.eos_id not in text
            at = stream.find(text)
            assert at >= 0 and stream.doc(at) == stream.doc(at + len(text) - 1)
            nxt = stream.tokens[at + len(text)]
            sentence_final += text[-1] in ends or nxt == tok.eos_id
    # Chunks end at sentence ends, except where a sentence longer than a chunk was cut into pieces (many, with
    # 3-token words and 62-token chunks); windows cut at random would end a sentence about 1 time in 20.
    assert sentence_final >= 0.6 * 320
    obj = objective("roberta", tok, "--objective.inputs=doc_sentences", f"--train.seq_len={T}")
    assert isinstance(obj.make_loader(data, "train"), DocChunkLoader)
    batch = obj.transform(rows)
    n = (rows[:, : T - 2] != tok.pad_id).sum(1)
    assert torch.equal(batch["attention_mask"].sum(1), n + 2)
    ids = torch.where(batch["labels"] != M.IGNORE, batch["labels"], batch["input_ids"])
    assert torch.equal(ids[torch.arange(16), n + 1], torch.full((16,), tok.sep_id))


def test_nsp_head_config_and_output():
    with pytest.raises(LMForgeError, match=r"^model.nsp_head classifies the pooled first token: it needs model.pooler"):
        Transformer(tiny_encoder(100, nsp_head=True))
    model = Transformer(tiny_encoder(100, pooler=True, nsp_head=True))
    out = model(torch.randint(5, 100, (3, 10)))
    assert out.nsp_logits.shape == (3, 2)
    assert torch.allclose(out.nsp_logits, model.nsp_head(out.pooled))
    assert Transformer(tiny_encoder(100, pooler=True))(torch.randint(5, 100, (3, 10))).nsp_logits is None


def test_bert_objective_masks_pairs_and_overfits(data, tok, one_thread):  # noqa: F811
    cfg = load_config(None, ["--objective.name=bert", f"--train.seq_len={T}", "--train.batch_size=8"])
    obj = OBJECTIVES.get("bert")(cfg, tok)
    with pytest.raises(LMForgeError, match="the model needs model.pooler=true and model.nsp_head=true"):
        obj.build_model(tiny_encoder(tok.vocab_size))
    model = obj.build_model(tiny_encoder(tok.vocab_size, pooler=True, nsp_head=True, max_seq_len=T))
    raw = next(obj.make_loader(data, "train"))
    torch.manual_seed(0)
    batch = obj.transform(raw)
    sel = batch["labels"] != M.IGNORE
    specials = torch.isin(raw["input_ids"], torch.tensor([tok.cls_id, tok.sep_id, tok.pad_id]))
    assert not (sel & specials).any() and sel.any()
    assert torch.equal(torch.where(sel, batch["labels"], batch["input_ids"]), raw["input_ids"])
    assert torch.equal(batch["token_type_ids"], raw["token_type_ids"])
    out = obj.loss(model, batch)
    assert set(out.metrics) == {"mlm_loss", "mlm_acc", "nsp_loss", "nsp_acc"}
    assert abs(out.metrics["nsp_loss"] - np.log(2)) < 0.2
    assert abs(float(out.loss.detach()) - out.metrics["mlm_loss"] - out.metrics["nsp_loss"]) < 1e-4
    losses = overfit(model, obj, batch, steps=40)
    assert losses[-1] < 0.5 * losses[0]
    assert obj.loss(model, batch).metrics["nsp_acc"] == 1.0


def test_albert_objective_logs_sentence_order_under_its_own_names(data, tok, one_thread):  # noqa: F811
    cfg = load_config(None, ["--objective.name=albert", f"--train.seq_len={T}", "--train.batch_size=8"])
    obj = OBJECTIVES.get("albert")(cfg, tok)
    assert obj.options.sentence_task == "sop"
    with pytest.raises(LMForgeError, match="trains a sentence-order classifier: the model needs model.pooler=true"):
        obj.build_model(tiny_encoder(tok.vocab_size))
    loader = obj.make_loader(data, "train")
    assert loader.task == "sop"
    stream = Stream(data)
    raw = next(loader)
    for r in range(8):  # SOP pairs: both segments come from one chunk, swapped for the negatives
        a, b = segments(tok, raw["input_ids"][r])
        assert stream.find(b + a if raw["sentence_label"][r] else a + b) >= 0
    model = obj.build_model(tiny_encoder(tok.vocab_size, pooler=True, nsp_head=True, max_seq_len=T))
    torch.manual_seed(0)
    out = obj.loss(model, obj.transform(raw))
    assert set(out.metrics) == {"mlm_loss", "mlm_acc", "sop_loss", "sop_acc"}
    assert abs(float(out.loss.detach()) - out.metrics["mlm_loss"] - out.metrics["sop_loss"]) < 1e-4
    # BERT with sentence_task=sop is the same objective; its numbers carry the SOP names too.
    bert_sop = load_config(None, ["--objective.name=bert", "--objective.sentence_task=sop", f"--train.seq_len={T}"])
    assert OBJECTIVES.get("bert")(bert_sop, tok).make_loader(data, "train").task == "sop"
    with pytest.raises(LMForgeError, match="objective.sentence_task"):
        load_config(None, ["--objective.name=bert", "--objective.sentence_task=order"])


def test_nsp_needs_two_documents(tok, tmp_path):
    one_doc = prepared(tmp_path / "a", tok, n_docs=2, val_fraction=0.5)
    with pytest.raises(
        LMForgeError, match="split has fewer than 2 documents, and NSP draws NotNext segments from other documents"
    ):
        pair_loader(one_doc, tok, batch_size=1)
    assert pair_loader(one_doc, tok, batch_size=1, task="sop").n_examples > 10  # SOP needs no other document


@pytest.mark.parametrize(
    "family, hf_class, hf_config, logits",
    [("bert", "BertForPreTraining", dict(), "seq_relationship_logits"),
     ("albert", "AlbertForPreTraining", dict(embedding_size=16), "sop_logits")],
)  # fmt: skip
def test_sentence_heads_match_transformers_both_ways(family, hf_class, hf_config, logits, tmp_path):
    import transformers
    from model_testing import V, padded_batch, save_hf, tiny

    from lmforge.models.hf import import_hf, to_hf_model

    ids, mask = padded_batch(0)
    ours = tiny(f"{family}-tiny")
    assert ours.config.nsp_head
    hf = to_hf_model(ours)
    assert type(hf).__name__ == hf_class
    with torch.no_grad():
        want = getattr(hf(input_ids=ids, attention_mask=mask), logits)
        torch.testing.assert_close(ours(ids, mask).nsp_logits, want, atol=1e-5, rtol=0)
    torch.manual_seed(0)
    config_cls = getattr(transformers, hf_class.replace("ForPreTraining", "Config"))
    theirs = getattr(transformers, hf_class)(config_cls(
        vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        classifier_dropout_prob=0.0, **hf_config,
    ))  # fmt: skip
    save_hf(theirs, tmp_path)
    imported = import_hf(tmp_path)
    assert imported.config.nsp_head
    with torch.no_grad():
        want = getattr(theirs(input_ids=ids, attention_mask=mask), logits)
        torch.testing.assert_close(imported(ids, mask).nsp_logits, want, atol=1e-5, rtol=0)
    assert want.std() > 1e-3
