"""`lmforge eval RUN --text FILE` on a Transformer-XL run: segment recurrence with memory (Dai et al. 2019 §3.2),
checked against segments run by hand carrying the memory, against one full causal forward when the memory holds
the whole document (recurrence then loses nothing), and against plain windows, which score differently."""

import dataclasses
import json

import pytest
import tasks_testing as T
import torch

from lmforge.checkpoint.write import save_checkpoint
from lmforge.cli import main
from lmforge.errors import LMForgeError
from lmforge.eval.lm import LM
from lmforge.eval.memory_lm import memory_flags, score_documents_with_memory
from lmforge.eval.text import score_text

DOCS = [T.TEXTS[2], T.TEXTS[0][:300], T.TEXTS[1]]


@pytest.fixture(scope="module")
def xl():
    tok = T.tokenizer("gpt")
    model = T.model("transformer-xl-tiny", tok, seed=3, max_seq_len=16, mem_len=8, init_std=0.3).eval()
    return model, tok


@torch.no_grad()
def by_hand(model, tok, docs: list[str], segment: int, mem_len: int) -> tuple[float, int]:
    """Each document alone: [BOS/EOS] + its tokens, cut into segments of `segment` inputs; each segment's forward
    gets the memory the previous one returned (the paper's SG(·) of the last mem_len states per layer), and each
    target's log-probability is read off its own row of logits."""
    lm = LM(model, tok)
    nll, n = 0.0, 0
    for doc in docs:
        full = [lm.prefix_id] + tok.encode(doc)
        mems = None
        for s in range(0, len(full) - 1, segment):
            x = torch.tensor([full[:-1][s : s + segment]])  # the inputs: every token but the last
            out = model(x, mems=mems, use_mems=mem_len > 0, mem_len=mem_len)
            mems = out.mems
            logp = out.logits[0].log_softmax(-1)
            for k in range(x.shape[1]):
                nll -= float(logp[k, full[s + k + 1]])
                n += 1
    return nll, n


@pytest.mark.parametrize("segment,mem_len", [(8, 8), (5, 12), (16, 0)])
def test_memory_scoring_equals_segments_carried_by_hand(xl, segment, mem_len):
    model, tok = xl
    lm = LM(model, tok, batch_size=2)  # batches of two documents of different lengths, right-padded
    nll, n = score_documents_with_memory(lm, DOCS, segment=segment, mem_len=mem_len)
    want_nll, want_n = by_hand(model, tok, DOCS, segment, mem_len)
    assert n == want_n == sum(len(tok.encode(d)) for d in DOCS)
    assert nll == pytest.approx(want_nll, rel=1e-5)


@torch.no_grad()
def test_a_memory_that_holds_the_whole_document_equals_one_full_forward(xl):
    """A causal token's states depend only on the tokens before it: with every earlier state in memory, scoring in
    segments is exactly one forward over the whole document."""
    model, tok = xl
    full = [LM(model, tok).prefix_id] + tok.encode(DOCS[0])
    assert len(full) > 40
    logp = model(torch.tensor([full[:-1]])).logits[0].log_softmax(-1)
    want = -float(logp[torch.arange(len(full) - 1), torch.tensor(full[1:])].sum())
    nll, _ = score_documents_with_memory(LM(model, tok), DOCS[:1], segment=7, mem_len=len(full))
    assert nll == pytest.approx(want, rel=1e-5)
    short, _ = score_documents_with_memory(LM(model, tok), DOCS[:1], segment=7, mem_len=3)
    assert abs(short - want) > 1e-2 * abs(want)  # a short memory loses context


def save_run(model, tok, path, **run):
    save_checkpoint(path, 10, model, config={"model": dataclasses.asdict(model.config), **run}, tokenizer=tok)


def test_cli_scores_a_transformer_xl_run_with_memory_and_says_so(xl, tmp_path, capsys):
    model, tok = xl
    save_run(model, tok, tmp_path / "run", train={"seq_len": 6}, objective={"eval_mem_len": 10})
    text = tmp_path / "docs.jsonl"
    text.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS), encoding="utf-8")
    n_bytes = sum(len(d.encode()) for d in DOCS)

    def cli(*args) -> dict:
        out = tmp_path / "out.json"
        assert main(["eval", str(tmp_path / "run"), "--text", str(text), "--out", str(out), *args]) == 0
        return json.loads(out.read_text())

    got = cli()  # the run's validation setting: segments of train.seq_len, objective.eval_mem_len of memory
    nll, n = by_hand(model, tok, DOCS, 6, 10)
    assert (got["context"], got["stride"], got["mem_len"], got["tokens"]) == (6, 6, 10, n)
    assert got["nll"] == pytest.approx(nll, rel=1e-5)
    assert got["bits_per_byte"] == pytest.approx(nll / torch.log(torch.tensor(2.0)).item() / n_bytes, rel=1e-5)
    assert "(Transformer-XL segment recurrence: segments of 6, memory 10)" in capsys.readouterr().out

    got = cli("--segment", "4", "--mem-len=12")
    assert got["mem_len"] == 12 and got["nll"] == pytest.approx(by_hand(model, tok, DOCS, 4, 12)[0], rel=1e-5)

    plain = cli("--stride", "16")  # plain windows of max_seq_len 16, as for every other decoder
    want = score_text(LM(model, tok), DOCS, stride=16)
    assert plain["mem_len"] is None and plain["nll"] == pytest.approx(want.nll, rel=1e-5)
    assert "(windows: context 16, stride 16)" in capsys.readouterr().out
    assert plain["tokens"] == n and abs(plain["nll"] - nll) > 1e-3 * nll  # the same tokens, scored differently


@pytest.mark.parametrize(
    "args,error",
    [
        (["--segment", "0"], "--segment must be an integer >= 1, got '0'"),
        (["--mem-len=-2"], "--mem-len must be an integer >= 0, got '-2'"),
        (["--mem-len"], "--mem-len must be an integer >= 0, got ''"),
        (["--segment", "8", "--stride", "4"],
         "--stride sets plain windows; a Transformer-XL run scored with memory takes --segment"),
    ],
)  # fmt: skip
def test_bad_memory_flags_give_one_error_line(xl, tmp_path, capsys, args, error):
    model, tok = xl
    save_run(model, tok, tmp_path / "run")
    text = tmp_path / "t.txt"
    text.write_text(DOCS[0], encoding="utf-8")
    assert main(["eval", str(tmp_path / "run"), "--text", str(text), *args]) != 0
    assert capsys.readouterr().err.strip() == f"error: {error}"


def test_memory_flags_on_a_model_without_recurrence_are_refused(tmp_path, capsys):
    tok = T.tokenizer("gpt")
    save_run(T.model("gpt-tiny", tok, max_seq_len=16), tok, tmp_path / "run")
    text = tmp_path / "t.txt"
    text.write_text(DOCS[0], encoding="utf-8")
    assert main(["eval", str(tmp_path / "run"), "--text", str(text), "--mem-len", "8"]) != 0
    assert capsys.readouterr().err.strip() == (
        "error: --segment and --mem-len score a Transformer-XL decoder (model.position='xl', arch decoder) with "
        "memory; model 'gpt-tiny' is a decoder with position 'learned'"
    )


def test_memory_flags_parse_both_spellings_and_leave_the_rest():
    assert memory_flags(["--segment", "64", "--task=x", "--mem-len=640"]) == (64, 640, ["--task=x"])
    assert memory_flags([], 3, None) == (3, None, [])
    with pytest.raises(LMForgeError, match="--segment must be an integer >= 1, got 'abc'"):
        memory_flags(["--segment=abc"])
