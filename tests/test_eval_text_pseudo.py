"""Bits per byte beyond decoders (`lmforge eval RUN --text FILE`): an encoder's pseudo-bits per byte (pseudo-log-
likelihood, labelled as such) and an encoder-decoder's bits per byte, against hand computations."""

import dataclasses
import json
import math

import pytest
import tasks_testing as T
import torch
from sentence_scores_testing import electra_run, pll_by_hand

from lmforge.checkpoint.write import save_checkpoint
from lmforge.cli import main
from lmforge.eval.lm import LM
from lmforge.eval.sentence_scores import PseudoLogLikelihood, SentenceScore
from lmforge.eval.text import TextScore, score_text, score_text_pseudo

DOCS = ["Il était une fois.", T.TEXTS[0][:200]]


class Fixed:
    """A pseudo-log-likelihood scorer with set scores: -4 nats over 3 tokens for every text."""

    window = 8

    def score(self, texts):
        return [SentenceScore(-4.0, 3) for _ in texts]


def test_bits_per_byte_by_hand():
    # "Il était une fois." is 18 characters and 19 UTF-8 bytes ("é" takes two); "naïve" 5 and 6.
    got = score_text_pseudo(Fixed(), ["Il était une fois.", "", "naïve"])
    assert (got.documents, got.tokens, got.bytes, got.nll) == (2, 6, 25, 8.0)
    assert got.bits_per_byte == pytest.approx(8.0 / (math.log(2) * 25))  # 0.46166 pseudo-bits per byte
    assert got.loss == pytest.approx(8 / 6) and got.perplexity == pytest.approx(math.exp(8 / 6))
    d = got.as_dict()
    assert d["scoring"] == "pseudo-log-likelihood" and d["pseudo_bits_per_byte"] == pytest.approx(0.4616624130844683)
    assert "bits_per_byte" not in d and "perplexity" not in d and d["pseudo_nll"] == 8.0
    plain = TextScore(1, 3, 10, 6.0, 8, 8).as_dict()
    assert plain["scoring"] == "log-likelihood" and plain["bits_per_byte"] == pytest.approx(6 / math.log(2) / 10)


def test_encoder_pseudo_bits_per_byte_equal_masking_each_token_by_hand():
    tok = T.tokenizer("bert")
    model = T.model("bert-tiny", tok, seed=3, max_seq_len=16).double().eval()
    got = score_text_pseudo(PseudoLogLikelihood(model, tok, batch_size=2), DOCS)
    want = [pll_by_hand(model, tok, d, 14) for d in DOCS]
    nll, tokens = -sum(lp for lp, _ in want), sum(n for _, n in want)
    n_bytes = sum(len(d.encode("utf-8")) for d in DOCS)
    assert (got.tokens, got.bytes, got.context, got.pseudo) == (tokens, n_bytes, 14, True) and tokens > 3 * 14
    assert got.nll == pytest.approx(nll, abs=1e-5)
    assert got.bits_per_byte == pytest.approx(nll / (math.log(2) * n_bytes), rel=1e-9)


@torch.no_grad()
def test_encoder_decoder_bits_per_byte_equal_decoder_forwards_by_hand():
    tok = T.tokenizer("t5")
    model = T.model("t5-tiny", tok, seed=3).double().eval()
    doc = DOCS[0]
    ids = tok.encode(doc)
    assert len(ids) < model.config.max_seq_len  # one window: after the empty text, every token as decoder output
    src = torch.tensor([[tok.eos_id, tok.eos_id]])  # the window's context (EOS standing for BOS), framed with EOS
    nll = 0.0
    for j, t in enumerate(ids):
        dec = torch.tensor([[model.config.decoder_start_id] + ids[:j]])
        nll -= float(model(src, decoder_input_ids=dec).logits[0, -1].log_softmax(-1)[t])
    got = score_text(LM(model, tok), [doc])
    assert got.tokens == len(ids) and got.nll == pytest.approx(nll, abs=1e-6)
    assert got.bits_per_byte == pytest.approx(nll / math.log(2) / 19) and not got.pseudo


def test_cli_labels_an_encoders_scores_pseudo(tmp_path, capsys):
    tok = T.tokenizer("bert")
    model = T.model("bert-tiny", tok, seed=5).eval()
    run = tmp_path / "bert"
    save_checkpoint(run, 3, model, config={"model": dataclasses.asdict(model.config)}, tokenizer=tok)
    text = tmp_path / "doc.txt"
    text.write_text(DOCS[1], encoding="utf-8")
    capsys.readouterr()
    assert main(["eval", str(run), "--text", str(text), "--out", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out
    got = json.loads((tmp_path / "p.json").read_text())
    want = score_text_pseudo(PseudoLogLikelihood(model, tok), [DOCS[1]])
    assert got["scoring"] == "pseudo-log-likelihood" and got["tokens"] == want.tokens
    assert got["pseudo_bits_per_byte"] == pytest.approx(want.bits_per_byte, rel=1e-5)
    assert f"{want.bits_per_byte:.4f} pseudo-bits/byte" in out and "each token masked in turn" in out
    capsys.readouterr()
    assert main(["eval", str(run), "--text", str(text), "--stride", "4"]) != 0
    assert capsys.readouterr().err.strip().startswith("error: --stride: an encoder's pseudo-log-likelihood scores")
    assert main(["eval", str(run), "--text", str(text), "--segment", "8"]) != 0
    assert capsys.readouterr().err.strip().startswith("error: --segment and --mem-len score a Transformer-XL decoder")
    electra, pair = electra_run(tmp_path / "electra")  # a discriminator: its run's generator scores
    assert main(["eval", str(electra), "--text", str(text), "--out", str(tmp_path / "e.json")]) == 0
    want = score_text_pseudo(PseudoLogLikelihood(pair.generator, tok), [DOCS[1]])
    assert json.loads((tmp_path / "e.json").read_text())["pseudo_nll"] == pytest.approx(want.nll, rel=1e-5)
