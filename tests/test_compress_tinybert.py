"""TinyBERT's Transformer distillation (Jiao et al. 2020): each layer loss against its formula on hand-made tensors,
the uniform layer mapping g(m) = m·N/M, the hooks' hidden states and pre-softmax attention scores against the
model's own forward, the student, and `lmforge compress report sentiment-gpt-tinybert` distilling a tiny teacher
into a narrower student in two stages."""

from __future__ import annotations

import json
import math

import pytest
import torch
from compress_testing import fine_tuned_teacher
from model_testing import tiny
from training_testing import restore_torch_globals, run_main

from lmforge.compress.config import TinyBertOptions
from lmforge.compress.tinybert import (
    Capture,
    attention_loss,
    build_student,
    embedding_loss,
    hidden_loss,
    layer_map,
    prediction_loss,
)
from lmforge.errors import LMForgeError


@pytest.fixture(autouse=True)
def _torch_globals():
    yield from restore_torch_globals()


def mse(a: list, b: list) -> float:
    """Mean of squared differences over every entry of two equally nested lists."""
    flat_a, flat_b = torch.tensor(a).flatten().tolist(), torch.tensor(b).flatten().tolist()
    return sum((x - y) ** 2 for x, y in zip(flat_a, flat_b)) / len(flat_a)


def matmul(x: list[list[float]], w: list[list[float]]) -> list[list[float]]:
    return [[sum(r[k] * w[k][j] for k in range(len(w))) for j in range(len(w[0]))] for r in x]


def test_uniform_layer_mapping():
    assert layer_map(12, 4) == [0, 3, 6, 9, 12]  # TinyBERT_4 from BERT_base: g(m) = 3m
    assert layer_map(12, 6) == [0, 2, 4, 6, 8, 10, 12]
    assert layer_map(4, 4) == [0, 1, 2, 3, 4]
    with pytest.raises(LMForgeError, match="teacher's 6 layers to be a multiple of the student's 4"):
        layer_map(6, 4)


def test_embedding_and_hidden_losses_with_projections():
    e_s = [[[1.0, 2.0], [0.0, -1.0]]]  # (B=1, T=2, d_S=2)
    w = [[1.0, 0.0, 2.0], [0.5, -1.0, 0.0]]  # W_e (d_S=2, d_T=3)
    e_t = [[[2.0, -2.0, 1.0], [0.0, 1.0, 0.5]]]  # (B=1, T=2, d_T=3)
    proj = torch.nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        proj.weight.copy_(torch.tensor(w).T)  # nn.Linear stores Wᵀ: x @ W
    want = mse([matmul(e_s[0], w)], e_t)  # MSE(E_S W_e, E_T)
    assert embedding_loss(torch.tensor(e_s), torch.tensor(e_t), proj).item() == pytest.approx(want)
    assert hidden_loss(torch.tensor(e_s), torch.tensor(e_t), proj).item() == pytest.approx(want)
    h_s, h_t = [[[1.0, 3.0]], [[-1.0, 0.0]]], [[[0.0, 3.0]], [[1.0, 2.0]]]
    assert hidden_loss(torch.tensor(h_s), torch.tensor(h_t)).item() == pytest.approx((1 + 0 + 4 + 4) / 4)


def test_attention_loss_is_the_mean_over_heads_of_each_heads_mse():
    torch.manual_seed(0)
    a_s, a_t = torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4)  # (B, h, T, T)
    h = a_s.shape[1]
    per_head = [mse(a_s[:, i].tolist(), a_t[:, i].tolist()) for i in range(h)]
    assert attention_loss(a_s, a_t).item() == pytest.approx(sum(per_head) / h, rel=1e-6)  # (1/h) Σ_i MSE(A_i)
    with pytest.raises(LMForgeError, match="the student needs the teacher's n_heads"):
        attention_loss(a_s[:, :2], a_t)


def test_prediction_loss_is_the_soft_cross_entropy_at_temperature_t():
    z_s, z_t = [[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]], [[2.0, 0.0, 1.0], [1.0, 1.0, 1.0]]
    t = 2.0

    def softmax(z):
        e = [math.exp(v / t) for v in z]
        return [v / sum(e) for v in e]

    rows = [-sum(p * math.log(q) for p, q in zip(softmax(zt), softmax(zs))) for zs, zt in zip(z_s, z_t)]
    got = prediction_loss(torch.tensor(z_s), torch.tensor(z_t), t).item()
    assert got == pytest.approx(sum(rows) / 2)  # −Σ_c softmax(z^T/t)_c log softmax(z^S/t)_c, mean over rows
    same = prediction_loss(torch.tensor(z_t), torch.tensor(z_t), t).item()
    entropy = sum(-sum(p * math.log(p) for p in softmax(z)) for z in z_t) / 2
    assert same == pytest.approx(entropy)  # at its minimum the soft cross-entropy is the teacher's entropy


@pytest.mark.parametrize("preset", ["bert-tiny", "gpt-tiny"])
def test_capture_reads_the_forwards_hidden_states_and_pre_softmax_scores(preset):
    model = tiny(preset)
    ids = torch.randint(4, 100, (2, 7))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    stack = model.encoder if preset == "bert-tiny" else model.decoder
    outputs = []
    hooks = [b.attn.register_forward_hook(lambda m, a, o: outputs.append(o)) for b in stack.blocks]
    with torch.no_grad(), Capture(model) as cap:
        out = model(ids, mask, output_hidden_states=True)
    for h in hooks:
        h.remove()
    n = model.config.n_layers
    assert len(cap.states) == n + 1 and len(cap.scores) == n
    for i in range(n):  # E = hidden_states[0]; H_m = the output of block m (before a final norm)
        torch.testing.assert_close(cap.states[i], out.hidden_states[i])
    for i, (scores, block) in enumerate(zip(cap.scores, stack.blocks)):
        attn = block.attn
        x = block.norm1(cap.states[i]) if block.pre else cap.states[i]  # what the attention reads
        q, k, v = attn.qkv(x).split(attn.n_heads * attn.hd, dim=-1)
        q, k, v = (t.view(2, 7, attn.n_heads, attn.hd).transpose(1, 2) for t in (q, k, v))
        want = q @ k.transpose(-1, -2) / math.sqrt(attn.hd)  # A = QKᵀ/√d_k
        allowed = mask[:, None, None, :].bool().expand(2, attn.n_heads, 7, 7)
        if preset == "gpt-tiny":
            allowed = allowed & torch.ones(7, 7, dtype=torch.bool).tril()
        torch.testing.assert_close(scores, want.masked_fill(~allowed, 0.0), rtol=1e-5, atol=1e-5)
        # the scores are the ones the model's softmax saw: softmax over allowed keys, times V, is the head outputs
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num()
        y = attn.o((probs @ v).transpose(1, 2).reshape(2, 7, -1))
        torch.testing.assert_close(y[0], outputs[i][0], rtol=1e-4, atol=1e-5)


def test_student_is_narrower_with_the_teachers_heads_and_projections(tmp_path):
    teacher = tiny("gpt-tiny")
    task = _Task()
    s = build_student(teacher, task, TinyBertOptions(n_layers=1, d_model=32))
    cfg = s.student.config
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_ff) == (1, 32, 4, 128)  # d_ff scaled by 32/64
    assert tuple(s.proj_e.weight.shape) == tuple(s.proj_h.weight.shape) == (64, 32)  # W: d_S → d_T
    same = build_student(teacher, task, TinyBertOptions(n_layers=1, init="teacher"))
    assert same.proj_e is None and same.proj_h is None
    torch.testing.assert_close(same.student.decoder.blocks[0].mlp.up.weight, teacher.decoder.blocks[1].mlp.up.weight)
    with pytest.raises(LMForgeError, match=r"distill.tinybert.d_model \(30\) must be a multiple of the teacher's 4"):
        build_student(teacher, task, TinyBertOptions(d_model=30))
    with pytest.raises(LMForgeError, match="init=teacher needs the teacher's d_model and d_ff"):
        build_student(teacher, task, TinyBertOptions(d_model=32, init="teacher"))


class _Task:
    """The one method build_student asks of a task: a task model over a backbone (here the backbone itself)."""

    def build(self, backbone):
        return backbone


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory):
    return fine_tuned_teacher(tmp_path_factory.mktemp("teacher"))


def test_cli_tinybert_report_distils_a_narrower_student_in_two_stages(teacher_run, tmp_path, capsys):
    out = tmp_path / "report"
    rc, stdout, err = run_main(
        capsys, "compress", "report", "sentiment-gpt-tinybert", "--teacher", str(teacher_run), f"--out={out}",
        "--distill.tinybert.n_layers=1", "--distill.tinybert.d_model=32", "--distill.tinybert.intermediate_steps=60",
        "--distill.max_steps=60", "--distill.lr=3e-3", "--distill.batch_size=16", "--bench.runs=2",
        "--bench.warmup=1",
    )  # fmt: skip
    assert rc == 0, err
    rows = {r["name"]: r for r in json.loads((out / "report.json").read_text())}
    assert list(rows) == ["teacher (fp32)", "student (TinyBERT)", "student int8"]
    teacher, student = rows["teacher (fp32)"], rows["student (TinyBERT)"]
    assert (teacher["layers"], teacher["heads"], student["layers"], student["heads"]) == (2, 8, 1, 4)
    assert student["size_mb"] < 0.5 * teacher["size_mb"]
    assert student["accuracy"] > 0.6
    stage1 = [json.loads(x) for x in (out / "tinybert-intermediate" / "metrics.jsonl").read_text().splitlines()]
    stage1 = [r for r in stage1 if "attn_loss" in r]
    for key in ("embd_loss", "hidn_loss", "attn_loss"):
        assert stage1[-1][key] < 0.7 * stage1[0][key], key
    stage2 = [json.loads(x) for x in (out / "tinybert-prediction" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in stage2 if "pred_loss" in r][-1] == 60 and not any("hard_loss" in r for r in stage2)
    assert "student (TinyBERT)" in stdout


def test_tinybert_bad_student_is_refused_in_one_line(teacher_run, tmp_path, capsys):
    rc, _, err = run_main(
        capsys, "compress", "report", "sentiment-gpt-tinybert", "--teacher", str(teacher_run),
        f"--out={tmp_path / 'r'}", "--distill.tinybert.n_layers=3",
    )  # fmt: skip
    assert rc != 0
    assert err.strip().splitlines()[-1] == (
        "error: TinyBERT's uniform mapping g(m) = m·N/M needs the teacher's 2 layers to be a multiple of the "
        "student's 3"
    )
