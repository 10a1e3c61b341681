"""Grammatical minimal pairs (`lmforge eval RUN --task blimp --data.dir=DIR`): each family's sentence scorer against a
brute-force computation on a tiny float64 model (pseudo-log-likelihood: one forward per masked copy), an ELECTRA
run scored with its generator, the accuracies, the reader's errors, and the command on tiny runs of each family."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import tasks_testing as T
import torch
from sentence_scores_testing import electra_run, logp, pll_by_hand

from lmforge.checkpoint.write import save_checkpoint
from lmforge.cli import main
from lmforge.data.labelled.blimp import read_minimal_pairs
from lmforge.data.labelled.examples import Dataset, Example
from lmforge.errors import LMForgeError
from lmforge.eval.minimal_pairs import MinimalPairs, MinimalPairsOptions, accuracies
from lmforge.eval.sentence_scores import PseudoLogLikelihood, SentenceScore, sentence_scorer
from lmforge.loading import load

FIXTURE = Path(__file__).parent / "fixtures" / "blimp"
SENTENCES = ["The king admired himself.", "These windows is open.", T.TEXTS[1][:150], "A boy hurt herself."]


def tiny(preset: str, family: str, **kw):
    tok = T.tokenizer(family)
    return T.model(preset, tok, seed=1, **kw).double().eval(), tok


@torch.no_grad()
def causal_by_hand(model, tok, text: str) -> tuple[float, int]:
    """log P(token j | BOS and the tokens before it), one forward per token."""
    full = [tok.bos_id] + tok.encode(text)
    total = sum(logp(model(torch.tensor([full[:j]])).logits[0, -1], full[j]) for j in range(1, len(full)))
    return total, len(full) - 1


@torch.no_grad()
def seq2seq_by_hand(model, tok, text: str) -> tuple[float, int]:
    """The decoder's log P(text + EOS) given the empty text framed by BOS/EOS, one decoder forward per token."""
    src = torch.tensor([[i for i in (tok.bos_id, tok.eos_id) if i is not None]])
    tgt = tok.encode(text) + [tok.eos_id]
    total = 0.0
    for j in range(len(tgt)):
        dec = torch.tensor([[model.config.decoder_start_id] + tgt[:j]])
        total += logp(model(src, decoder_input_ids=dec).logits[0, -1], tgt[j])
    return total, len(tgt)


def test_pseudo_log_likelihood_equals_one_forward_per_masked_copy():
    model, tok = tiny("bert-tiny", "bert", max_seq_len=12)  # windows of 10 tokens: the long text is cut
    scorer = PseudoLogLikelihood(model, tok, batch_size=3)
    assert scorer.window == 10 and len(tok.encode(SENTENCES[2])) > 3 * scorer.window
    got = scorer.score(SENTENCES)
    for text, s in zip(SENTENCES, got):
        want, n = pll_by_hand(model, tok, text, scorer.window)
        assert s.tokens == n and s.logprob == pytest.approx(want, abs=1e-5)
    assert scorer.measure == "pseudo-log-likelihood" and sentence_scorer(model, tok).measure == scorer.measure


def test_masked_copies_mask_each_token_once_between_the_specials():
    _, tok = tiny("bert-tiny", "bert")
    scorer = PseudoLogLikelihood(T.model("bert-tiny", tok), tok)
    chunk = tok.encode("These windows are open.")
    rows, cols = scorer.masked_copies(chunk)
    assert rows.shape == (len(chunk), len(chunk) + 2) and cols.tolist() == list(range(1, len(chunk) + 1))
    assert (rows[:, 0] == tok.cls_id).all() and (rows[:, -1] == tok.sep_id).all()
    assert ((rows == tok.mask_id).sum(1) == 1).all()  # one mask per copy, at its own column
    assert rows[torch.arange(len(chunk)), cols].eq(tok.mask_id).all()


def test_causal_scorer_equals_per_token_forwards():
    model, tok = tiny("gpt-tiny", "gpt", max_seq_len=256)
    got = sentence_scorer(model, tok, batch_size=3).score(SENTENCES)
    for text, s in zip(SENTENCES, got):
        want, n = causal_by_hand(model, tok, text)
        assert s.tokens == n and s.logprob == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize("preset,family", [("t5-tiny", "t5"), ("bart-tiny", "bart")])
def test_seq2seq_scorer_equals_per_token_decoder_forwards(preset, family):
    model, tok = tiny(preset, family)
    scorer = sentence_scorer(model, tok, batch_size=3)
    assert scorer.source == ([tok.eos_id] if family == "t5" else [tok.bos_id, tok.eos_id])
    for text, s in zip(SENTENCES, scorer.score(SENTENCES)):
        want, n = seq2seq_by_hand(model, tok, text)
        assert s.tokens == n and s.logprob == pytest.approx(want, abs=1e-5)


def test_an_electra_run_is_scored_with_its_generator(tmp_path):
    run, pair = electra_run(tmp_path / "electra")
    disc, tok = load(run)
    assert disc.config.rtd_head and not disc.config.lm_head  # lmforge.load gives the discriminator
    got = sentence_scorer(disc, tok, 4, source=run).score(SENTENCES)
    want = PseudoLogLikelihood(pair.generator, tok, 4).score(SENTENCES)
    assert [s.logprob for s in got] == pytest.approx([s.logprob for s in want], abs=1e-4)
    assert pair.generator.config.d_model == disc.config.d_model // 2
    # Without the run, or from a run that trained no generator, the discriminator cannot score.
    plain = tmp_path / "plain"
    save_checkpoint(plain, 1, disc, config={"model": dataclasses.asdict(disc.config)}, tokenizer=tok)
    for source in (None, plain):
        with pytest.raises(LMForgeError, match="encoder without an MLM head .* cannot score sentences"):
            sentence_scorer(disc, tok, 4, source=source)


class Fixed:
    """A scorer with set log-likelihoods (0 for any other text)."""

    measure = "log-likelihood"

    def __init__(self, table: dict[str, float]) -> None:
        self.table = table

    def score(self, texts):
        return [SentenceScore(self.table.get(t, 0.0), 1) for t in texts]


def test_accuracy_is_the_mean_over_paradigms_and_a_tie_is_wrong():
    exs = read_minimal_pairs(FIXTURE).examples
    by = {p: [e for e in exs if e.meta["paradigm"] == p] for p in dict.fromkeys(e.meta["paradigm"] for e in exs)}
    assert [len(v) for v in by.values()] == [4, 3, 3, 2]
    table = {}
    for e in by["anaphor_gender_agreement"][:3] + by["determiner_noun_agreement_1"]:  # right
        table[e.text], table[e.text_pair] = -1.0, -2.0
    for e in by["regular_plural_subject_verb_agreement_1"][:1]:
        table[e.text], table[e.text_pair] = -3.0, -9.0
    for e in by["regular_plural_subject_verb_agreement_1"][1:] + by["wh_island"]:  # wrong
        table[e.text], table[e.text_pair] = -5.0, -4.0
    # anaphor_gender_agreement's 4th pair scores 0 and 0: a tie, wrong
    got = MinimalPairs(MinimalPairsOptions()).run(Fixed(table), {"test": read_minimal_pairs(FIXTURE)}, "test")
    assert got["accuracy"] == pytest.approx((3 / 4 + 1 + 1 / 3 + 0) / 4)  # 0.521: the headline
    assert got["accuracy_pairs"] == pytest.approx(7 / 12)  # 0.583
    assert got["field/morphology"] == pytest.approx(7 / 10) and got["field/syntax"] == 0.0
    assert got["phenomenon/anaphor_agreement"] == 0.75 and got["phenomenon/island_effects"] == 0.0
    assert got["paradigm/determiner_noun_agreement_1"] == 1.0
    assert list(got)[:2] == ["accuracy", "accuracy_pairs"] and len(got) == 2 + 2 + 4 + 4
    fields = MinimalPairs(MinimalPairsOptions(breakdown=["field"])).run(Fixed(table), {"t": Dataset(exs)}, "t")
    assert sorted(fields) == ["accuracy", "accuracy_pairs", "field/morphology", "field/syntax"]


def test_pairs_without_paradigm_or_field_count_as_one_paradigm():
    exs = [Example(text="a", text_pair="b"), Example(text="c", text_pair="d"), Example(text="e", text_pair="f")]
    got = accuracies(exs, [True, False, True], ["field", "paradigm"])
    assert got == {"accuracy": pytest.approx(2 / 3), "accuracy_pairs": pytest.approx(2 / 3), "paradigm/all": 2 / 3}
    with pytest.raises(LMForgeError, match="has no unacceptable sentence"):
        MinimalPairs(MinimalPairsOptions()).judge(Fixed({}), [Example(text="only one", id="x1")])


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_reader_reads_blimps_layout():
    exs = read_minimal_pairs(FIXTURE).examples
    assert len(exs) == 12 and (exs[5].text, exs[5].text_pair) == (
        "The doctor found that book.",
        "The doctor found those book.",
    )
    assert exs[5].id == "determiner_noun_agreement_1/1"  # the paradigm (file name) and BLiMP's pairID
    assert {k: exs[5].meta[k] for k in ("paradigm", "field", "phenomenon", "line")} == {
        "paradigm": "determiner_noun_agreement_1", "field": "morphology", "phenomenon": "determiner_noun_agreement",
        "line": 2,
    }  # fmt: skip


def test_reader_errors_name_the_file_and_line(tmp_path):
    with pytest.raises(LMForgeError, match=f"^minimal-pair directory not found: {tmp_path / 'nope'}$"):
        read_minimal_pairs(tmp_path / "nope")
    write(tmp_path / "empty" / "notes.txt", "no pairs here")
    with pytest.raises(LMForgeError, match=r"empty: no \.jsonl files \(expected one <paradigm>\.jsonl per paradigm"):
        read_minimal_pairs(tmp_path / "empty")
    good = json.dumps({"sentence_good": "A cat sleeps.", "sentence_bad": "A cat sleep."})
    bad = write(tmp_path / "d1" / "p.jsonl", good + "\n" + json.dumps({"sentence_good": "Dogs bark."}) + "\n")
    with pytest.raises(LMForgeError, match=f"^{bad}:2: missing 'sentence_bad' \\(each line needs sentence_good and"):
        read_minimal_pairs(bad.parent)
    bad = write(tmp_path / "d2" / "p.jsonl", '{"sentence_good": "A", \n')
    with pytest.raises(LMForgeError, match=f"^{bad}:1: invalid JSON"):
        read_minimal_pairs(bad.parent)
    bad = write(tmp_path / "d3" / "p.jsonl", json.dumps({"sentence_good": 3, "sentence_bad": "x"}) + "\n")
    with pytest.raises(LMForgeError, match=f"^{bad}:1: 'sentence_good' must be a string, got int$"):
        read_minimal_pairs(bad.parent)
    bad = write(tmp_path / "d4" / "p.jsonl", json.dumps({"sentence_good": "x", "sentence_bad": "  "}) + "\n")
    with pytest.raises(LMForgeError, match=f"^{bad}:1: empty sentence_bad$"):
        read_minimal_pairs(bad.parent)
    bad = write(tmp_path / "d5" / "p.jsonl", "\n")
    with pytest.raises(LMForgeError, match=r"p\.jsonl: no minimal pairs \(an empty file\)$"):
        read_minimal_pairs(bad.parent)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Tiny saved runs of the three families, and their in-memory models."""
    root, out = tmp_path_factory.mktemp("runs"), {}
    for preset, family in [("gpt-tiny", "gpt"), ("bert-tiny", "bert"), ("t5-tiny", "t5")]:
        tok = T.tokenizer(family)
        model = T.model(preset, tok, seed=4).eval()
        save_checkpoint(root / family, 7, model, config={"model": dataclasses.asdict(model.config)}, tokenizer=tok)
        out[family] = (root / family, model, tok)
    return out


def eval_cli(capsys, *args) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["eval", *map(str, args)])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("family", ["gpt", "bert", "t5"])
def test_cli_scores_each_family_and_writes_the_accuracies(runs, family, tmp_path, capsys):
    run, model, tok = runs[family]
    dest = tmp_path / "blimp.json"
    rc, out, err = eval_cli(capsys, run, "--task", "blimp", f"--data.dir={FIXTURE}", "--out", dest)
    assert rc == 0, err
    got = json.loads(dest.read_text())["BLiMP"]
    exs = read_minimal_pairs(FIXTURE).examples
    scores = sentence_scorer(model, tok).score([s for e in exs for s in (e.text, e.text_pair)])
    want = accuracies(exs, [g.logprob > b.logprob for g, b in zip(scores[::2], scores[1::2])], ["field"])
    assert got["accuracy"] == pytest.approx(want["accuracy"]) and got["field/syntax"] == want["field/syntax"]
    assert len(got) == 12 and got["accuracy_pairs"] == pytest.approx(want["accuracy_pairs"])
    assert f"| BLiMP | accuracy | {100 * got['accuracy']:.1f} |" in out
    assert f"| BLiMP | paradigm/wh_island | {100 * got['paradigm/wh_island']:.1f} |" in out


def test_cli_errors_are_one_line(runs, tmp_path, capsys):
    run = runs["gpt"][0]
    rc, _, err = eval_cli(capsys, run, "--task", "blimp", f"--data.dir={tmp_path / 'missing'}")
    assert rc != 0 and err.strip() == f"error: minimal-pair directory not found: {tmp_path / 'missing'}"
    rc, _, err = eval_cli(capsys, run, "--task", "blimp")
    assert rc != 0 and err.strip().startswith("error: data.source=blimp needs --data.dir")
    rc, _, err = eval_cli(capsys, run, "--task", "blimp", f"--data.dir={FIXTURE}", "--eval.breakdown=[words]")
    assert rc != 0 and "eval.breakdown: expected one of 'field', 'phenomenon', 'paradigm', got 'words'" in err


@pytest.mark.slow
def test_cli_refuses_a_run_it_cannot_score_in_a_subprocess(tmp_path):
    run, pair = electra_run(tmp_path / "electra")
    plain = tmp_path / "discriminator"
    tok = T.tokenizer("bert")
    config = {"model": dataclasses.asdict(pair.discriminator.config)}
    save_checkpoint(plain, 1, pair.discriminator, config=config, tokenizer=tok)
    cmd = [sys.executable, "-m", "lmforge.cli", "eval", str(plain), "--task", "blimp", f"--data.dir={FIXTURE}"]
    r = subprocess.run([*cmd, "--out", str(tmp_path / "x.json")], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert r.stderr.strip().startswith("error: model 'electra-tiny' is an encoder without an MLM head")
    cmd[4] = str(run)  # the ELECTRA run itself: its generator scores
    r = subprocess.run([*cmd, "--out", str(tmp_path / "e.json")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert 0.0 <= json.loads((tmp_path / "e.json").read_text())["BLiMP"]["accuracy"] <= 1.0
