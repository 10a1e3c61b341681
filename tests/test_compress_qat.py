"""Q8BERT quantisation-aware training (Zafrir et al. 2019): the fake quantisation, the straight-through gradient, the
EMA of the activations' range and the weight scale written out by hand; the int8 export against its formulas; and
`lmforge compress report sentiment-gpt-q8bert` fine-tuning a tiny teacher with QAT and scoring its int8 export."""

from __future__ import annotations

import json

import pytest
import torch
from compress_testing import fine_tuned_teacher
from model_testing import tiny
from training_testing import restore_torch_globals, run_main

from lmforge.compress.config import load_compress_config
from lmforge.compress.qat import (
    Int8Embedding,
    Int8Linear,
    QATEmbedding,
    QATLinear,
    apply_qat,
    export_int8,
    fake_quantize,
)
from lmforge.compress.report import state_dict_bytes
from lmforge.errors import LMForgeError

M = 127  # 2^(8-1) - 1


@pytest.fixture(autouse=True)
def _torch_globals():
    yield from restore_torch_globals()


def q8(values: list[float], scale: float) -> list[float]:
    """Q8BERT §2: Quantize(x | S, M) = Clamp(⌊x · S⌉, −M, M); fake quantisation returns Quantize(x) / S."""
    return [max(-M, min(M, round(v * scale))) / scale for v in values]


def test_fake_quantize_is_the_papers_formula():
    x = [0.0, 0.013, -0.49, 0.5, 1.0, -1.27, 2.5, -9.0]
    scale = M / 1.27  # S_x = M / max|x| for a range of 1.27: 2.5 and -9.0 fall outside and clamp to ±M / S
    got = fake_quantize(torch.tensor(x, dtype=torch.float64), torch.tensor(scale, dtype=torch.float64))
    assert got.tolist() == pytest.approx(q8(x, scale), abs=1e-12)
    assert got[6].item() == pytest.approx(1.27) and got[7].item() == pytest.approx(-1.27)
    levels = fake_quantize(torch.linspace(-1, 1, 1001), torch.tensor(float(M)))
    assert len(set(levels.tolist())) == 2 * M + 1  # 255 levels


def test_straight_through_gradient_is_the_identity():
    x = torch.tensor([0.3, -0.7, 0.05, 0.99], requires_grad=True)
    g = torch.tensor([1.0, -2.0, 0.5, 3.0])
    (fake_quantize(x, torch.tensor(M / 1.0)) * g).sum().backward()
    assert x.grad.tolist() == g.tolist()  # ∂x^q/∂x = 1 inside the range
    y = torch.tensor([5.0, -5.0], requires_grad=True)  # outside the range: nlp-architect passes it through too
    fake_quantize(y, torch.tensor(M / 1.0)).sum().backward()
    assert y.grad.tolist() == [1.0, 1.0]


def test_ema_of_the_input_range_and_the_layer_output():
    torch.manual_seed(0)
    lin = QATLinear.wrap(torch.nn.Linear(4, 3), bits=8, decay=0.9).train()
    xs = [torch.randn(2, 4) * s for s in (1.0, 3.0, 0.5)]
    ema = None
    for x in xs:
        out = lin(x)
        m = x.abs().max().item()
        ema = m if ema is None else 0.9 * ema + 0.1 * m  # EMA_t = decay · EMA_{t−1} + (1 − decay) · max|x_t|
        assert lin.input_max.item() == pytest.approx(ema, rel=1e-6)
        s_x, s_w = M / ema, M / lin.weight.abs().max().item()  # S_x = M / EMA(max|x|), S_W = M / max|W|
        xq = torch.tensor(q8(x.flatten().tolist(), s_x)).view_as(x)
        wq = torch.tensor(q8(lin.weight.flatten().tolist(), s_w)).view_as(lin.weight)
        torch.testing.assert_close(out, xq @ wq.T + lin.bias, rtol=1e-5, atol=1e-6)
    assert int(lin.updates) == 3
    lin.eval()
    lin(torch.randn(2, 4) * 100)  # evaluation reads the EMA, it does not move it
    assert lin.input_max.item() == pytest.approx(ema, rel=1e-6)
    assert QATLinear.wrap(torch.nn.Linear(2, 2), 8, 0.9999).decay == 0.9999  # nlp-architect's default


def test_apply_qat_replaces_every_linear_and_table_and_keeps_parameters():
    model = tiny("gpt-tiny")
    params = {id(p) for p in model.parameters()}
    linears = [n for n, m in model.named_modules() if type(m) is torch.nn.Linear]
    done = apply_qat(model)
    assert {id(p) for p in model.parameters()} == params  # the same tensors: an optimizer sees what it saw
    assert model.lm_head.weight is model.tok_emb.weight  # the tie survives
    assert set(linears) <= set(done) and {"tok_emb", "decoder.pos_emb.emb"} <= set(done)
    assert all(isinstance(model.get_submodule(n), (QATLinear, QATEmbedding)) for n in done)
    other = tiny("gpt-tiny")
    kept = apply_qat(other, skip=["lm_head", "tok_emb"])
    assert (
        "lm_head" not in kept and type(other.lm_head) is torch.nn.Linear and type(other.tok_emb) is torch.nn.Embedding
    )
    with pytest.raises(LMForgeError, match=r"^qat.bits must be in \[2, 8\], got 9$"):
        apply_qat(tiny("gpt-tiny"), bits=9)


def test_int8_export_stores_the_papers_integers_and_matches_the_fake_quantised_layer():
    torch.manual_seed(0)
    lin = QATLinear.wrap(torch.nn.Linear(8, 5), bits=8, decay=0.9).train()
    for _ in range(4):
        lin(torch.randn(6, 8))
    lin.eval()
    q = Int8Linear(lin)
    s_w, s_x = M / lin.weight.abs().max().item(), M / lin.input_max.item()
    assert q.weight_int8.dtype == torch.int8 and q.bias_int32.dtype == torch.int32
    assert q.weight_int8.flatten().tolist() == [max(-M, min(M, round(w * s_w))) for w in lin.weight.flatten().tolist()]
    assert q.bias_int32.tolist() == [round(b * s_w * s_x) for b in lin.bias.tolist()]  # int32, scale S_W · S_x
    x = torch.randn(6, 8)
    torch.testing.assert_close(q(x), lin(x), rtol=1e-4, atol=1e-4)
    emb = QATEmbedding.wrap(torch.nn.Embedding(10, 4), bits=8)
    qe = Int8Embedding(emb)
    ids = torch.tensor([[1, 5, 9]])
    torch.testing.assert_close(qe(ids), emb(ids))
    with pytest.raises(LMForgeError, match="no quantisation-aware layers to export"):
        export_int8(tiny("gpt-tiny"))


def test_exported_model_is_a_quarter_of_the_size_and_close_to_float():
    model = tiny("gpt-tiny")
    ids = torch.randint(4, 100, (2, 16))
    with torch.no_grad():
        ref = model(ids).logits
    apply_qat(model)
    model.train()
    with torch.no_grad():
        model(ids)  # one calibration pass of the EMAs
    int8 = export_int8(model)
    with torch.no_grad():
        got = int8(ids).logits
    assert ((got - ref).norm() / ref.norm()).item() < 0.05
    assert state_dict_bytes(int8) < 0.4 * state_dict_bytes(tiny("gpt-tiny"))
    assert not any(type(m) in (torch.nn.Linear, torch.nn.Embedding) for m in int8.modules())
    assert int8.lm_head.weight_int8 is int8.tok_emb.weight_int8  # the tied table is stored once


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory):
    return fine_tuned_teacher(tmp_path_factory.mktemp("teacher"))


def test_cli_q8bert_report_fine_tunes_with_qat_and_scores_the_int8_model(teacher_run, tmp_path, capsys):
    out = tmp_path / "report"
    rc, stdout, err = run_main(
        capsys, "compress", "report", "sentiment-gpt-q8bert", "--teacher", str(teacher_run), f"--out={out}",
        "--qat.max_steps=30", "--qat.lr=5e-4", "--qat.batch_size=16", "--bench.runs=2", "--bench.warmup=1",
        "--teacher.max_eval=80",
    )  # fmt: skip
    assert rc == 0, err
    rows = {r["name"]: r for r in json.loads((out / "report.json").read_text())}
    assert list(rows) == ["teacher (fp32)", "teacher int8 (dynamic)", "Q8BERT QAT, int8 export"]
    teacher, q8bert = rows["teacher (fp32)"], rows["Q8BERT QAT, int8 export"]
    assert teacher["accuracy"] > 0.7
    assert q8bert["accuracy"] >= teacher["accuracy"] - 0.1
    assert q8bert["size_mb"] < 0.4 * teacher["size_mb"]  # int8 weights and tables, one scale each
    logged = [json.loads(line) for line in (out / "q8bert" / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in logged if "loss" in r) == 30
    assert "Q8BERT QAT, int8 export" in stdout


def test_q8bert_config_errors(capsys):
    assert load_compress_config("sentiment-gpt-q8bert").variants == ["int8", "q8bert"]
    with pytest.raises(LMForgeError, match=r"^qat.bits must be in \[2, 8\], got 9$"):
        load_compress_config("sentiment-gpt-q8bert", ["--qat.bits=9"])
    with pytest.raises(LMForgeError, match=r"^qat.ema_decay must be in \(0, 1\), got 1.0$"):
        load_compress_config("sentiment-gpt-q8bert", ["--qat.ema_decay=1.0"])
    rc, _, err = run_main(capsys, "compress", "report", "sentiment-gpt-q8bert", "--variants=[q8bert,int4]")
    assert rc != 0
    assert err.strip().splitlines()[-1].startswith("error: variants: expected one of 'int8', 'distill'")


def test_fake_quant_gradient_reaches_the_float_weights():
    lin = QATLinear.wrap(torch.nn.Linear(3, 2), bits=8, decay=0.9999).train()
    x = torch.randn(5, 3)
    lin(x).sum().backward()
    # With the STE the weight's gradient is that of F.linear at the quantised input: Σ_rows x^q.
    xq = fake_quantize(x, torch.tensor(M) / x.abs().max())
    torch.testing.assert_close(lin.weight.grad, xq.sum(0).expand(2, 3))
