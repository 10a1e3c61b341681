"""TinyBERT's Transformer distillation (Jiao et al. 2020 §3.1-3.3) for a task model: the layer-wise losses, the
uniform layer mapping, the hooks that read hidden states and attention scores, and the two-stage procedure.

With N teacher layers and M student layers, student layer m learns from teacher layer g(m) = m·N/M (g(0) = 0: the
embedding layer). The losses (eq. 7-11), each an MSE averaged over its entries:
  L_embd = MSE(E_S W_e, E_T)                          the embedding layer's output (the input of layer 1)
  L_hidn = MSE(H_S W_h, H_T)                          the output of student layer m and teacher layer g(m)
  L_attn = (1/h) Σ_{i=1..h} MSE(A_i^S, A_i^T)         the unnormalised attention scores A = QKᵀ/√d_k of each head
  L_pred = CE(z^T / t, z^S / t) = −softmax(z^T/t) · log_softmax(z^S/t)   the logits, temperature t
W_e, W_h (d_S × d_T) are learnable projections, needed when the student is narrower (identity at equal width).
The paper fits the scores before the softmax ("a faster convergence rate and better performances"); the authors'
task_distill.py sets the scores of masked (padding) keys, −10000 after the mask, to 0 in both models, and takes
teacher layers i·N/M − 1 (0-based) for the attention and i·N/M for the hidden states, index 0 being the
embeddings: what `layer_map` and `attention_scores` do here. Stage 1 (intermediate-layer distillation) trains on
L_embd + Σ_m (L_hidn + L_attn); stage 2 (prediction-layer distillation) on L_pred alone. task_distill.py averages
its soft cross-entropy over the classes as well (a constant 1/C); here it is summed over classes, as eq. 10 reads.
One W_h is shared by every layer, as eq. 8 has one W_h (the authors' code also uses that one fit_dense for E)."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.errors import LMForgeError


def layer_map(n_teacher: int, n_student: int) -> list[int]:
    """[g(0), ..., g(M)] with g(m) = m · N / M: the teacher layer each student layer learns from (0 = embeddings)."""
    if n_student < 1 or n_teacher % n_student:
        raise LMForgeError(
            f"TinyBERT's uniform mapping g(m) = m·N/M needs the teacher's {n_teacher} layers to be a multiple of the "
            f"student's {n_student}"
        )
    k = n_teacher // n_student
    return [m * k for m in range(n_student + 1)]


def _project(x: Tensor, proj: nn.Module | None) -> Tensor:
    return x if proj is None else proj(x)


def embedding_loss(e_s: Tensor, e_t: Tensor, w_e: nn.Module | None = None) -> Tensor:
    """L_embd = MSE(E_S W_e, E_T) over (B, T, d_T)."""
    return F.mse_loss(_project(e_s.float(), w_e), e_t.float())


def hidden_loss(h_s: Tensor, h_t: Tensor, w_h: nn.Module | None = None) -> Tensor:
    """L_hidn = MSE(H_S W_h, H_T) over (B, T, d_T)."""
    return F.mse_loss(_project(h_s.float(), w_h), h_t.float())


def attention_loss(a_s: Tensor, a_t: Tensor) -> Tensor:
    """L_attn = (1/h) Σ_i MSE(A_i^S, A_i^T) over scores (B, h, T, T): the mean over every entry."""
    if a_s.shape != a_t.shape:
        raise LMForgeError(
            f"attention scores differ in shape: student {tuple(a_s.shape)} vs teacher {tuple(a_t.shape)} (TinyBERT's "
            "attention loss pairs heads: the student needs the teacher's n_heads)"
        )
    return F.mse_loss(a_s.float(), a_t.float())


def prediction_loss(z_s: Tensor, z_t: Tensor, temperature: float = 1.0) -> Tensor:
    """L_pred = −Σ_c softmax(z^T/t)_c · log_softmax(z^S/t)_c, averaged over the rows of (..., C)."""
    p_t = F.softmax(z_t.float() / temperature, dim=-1)
    return -(p_t * F.log_softmax(z_s.float() / temperature, dim=-1)).sum(-1).mean()


# --- reading hidden states and attention scores with forward hooks ----------------------------------------------


def _stack(model: nn.Module) -> nn.Module:
    from lmforge.compress.distill import _transformer

    core = _transformer(model)
    if core.config.is_encoder_decoder:
        raise LMForgeError("TinyBERT distillation needs an encoder or a decoder, not an encoder-decoder")
    return core.encoder if hasattr(core, "encoder") else core.decoder


def attention_scores(attn: nn.Module, x: Tensor, inp) -> Tensor:
    """The self-attention scores A = QKᵀ·scale (+ the stack's additive position bias) of one layer (B, h, T, T),
    recomputed from its input x and inputs `inp`; masked keys (padding, the future of a causal mask) are 0, as
    TinyBERT's task_distill.py sets them."""
    if attn.shaw is not None or attn.sparse is not None or attn.kv_prefix is not None or inp.cache is not None:
        raise LMForgeError(
            "TinyBERT's attention loss reads plain dense self-attention (no Shaw, sparse, prefix, cache)"
        )
    B, T, _ = x.shape
    q_dim, kv_dim = attn.n_heads * attn.hd, attn.n_kv * attn.hd
    q, k, _ = attn.qkv(x).split([q_dim, kv_dim, kv_dim], dim=-1)
    q, k = attn._heads(q, attn.n_heads), attn._heads(k, attn.n_kv)
    q, k = attn.qk_transform(q, k, inp.positions)
    if attn.n_kv != attn.n_heads:
        k = k.repeat_interleave(attn.n_heads // attn.n_kv, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * attn.scale  # (B, h, T, T)
    if inp.mask is not None:
        mask = inp.mask.to(scores.dtype)
        masked = inp.mask <= torch.finfo(inp.mask.dtype).min / 2
        scores = (scores + mask).masked_fill(masked, 0.0)
    elif inp.is_causal:
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), 0.0)
    return scores


class Capture:
    """`with Capture(model) as c: model(batch)` → c.states [E, H_1, ..., H_L] (the input of the first block, then each
    block's output) and c.scores [A_1, ..., A_L] of the model's one stack (shared ALBERT layers: one per use)."""

    def __init__(self, model: nn.Module) -> None:
        self.stack = _stack(model)
        self.states: list[Tensor] = []
        self.scores: list[Tensor] = []
        self._hooks: list = []

    def __enter__(self) -> Capture:
        for block in {id(b): b for b in self.stack.blocks}.values():
            self._hooks.append(block.register_forward_hook(self._block))
            self._hooks.append(block.attn.register_forward_hook(self._attention))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    def _block(self, module: nn.Module, args: tuple, output: Tensor) -> None:
        if not self.states:
            self.states.append(args[0])
        self.states.append(output)

    def _attention(self, module: nn.Module, args: tuple, output: Tensor) -> None:
        self.scores.append(attention_scores(module, args[0], args[1]))


# --- the student and the two stages -------------------------------------------------------------------------------


class TinyBertStudent(nn.Module):
    """The student task model with TinyBERT's projections W_e, W_h to the teacher's width (None at equal width)."""

    def __init__(self, student: nn.Module, d_student: int, d_teacher: int) -> None:
        super().__init__()
        self.student = student
        narrower = d_student != d_teacher
        self.proj_e = nn.Linear(d_student, d_teacher, bias=False) if narrower else None
        self.proj_h = nn.Linear(d_student, d_teacher, bias=False) if narrower else None


def build_student(teacher: nn.Module, task, opts) -> TinyBertStudent:
    """A student task model of opts.n_layers (default N/2) layers of width opts.d_model (default the teacher's), with
    the teacher's n_heads, vocabulary and positions; its head is the task's own, at the student's width."""
    from lmforge.compress.distill import _transformer, init_student_from_teacher
    from lmforge.models import Transformer

    cfg = _transformer(teacher).config
    _stack(teacher)  # an encoder-decoder is refused here
    n = opts.n_layers or max(1, cfg.n_layers // 2)
    g = layer_map(cfg.n_layers, n)
    d = opts.d_model or cfg.d_model
    if d % cfg.n_heads:
        raise LMForgeError(f"distill.tinybert.d_model ({d}) must be a multiple of the teacher's {cfg.n_heads} heads")
    d_ff = opts.d_ff or max(1, round(cfg.d_ff * d / cfg.d_model))
    if opts.init == "teacher":
        if (d, d_ff) != (cfg.d_model, cfg.d_ff):
            raise LMForgeError("distill.tinybert.init=teacher needs the teacher's d_model and d_ff")
        student = init_student_from_teacher(teacher, [g[m] - 1 for m in range(1, n + 1)])
    else:
        head_dim = cfg.head_dim if d == cfg.d_model else None
        backbone = Transformer(dataclasses.replace(cfg, n_layers=n, d_model=d, d_ff=d_ff, head_dim=head_dim))
        student = task.build(backbone)
    return TinyBertStudent(student, d, cfg.d_model)


def intermediate_loss(teacher: nn.Module, opts):
    """Stage 1: λ_e L_embd + Σ_m (λ_h L_hidn(m, g(m)) + λ_a L_attn(m, g(m))), m = 1..M."""
    from lmforge.objectives.base import LossOutput

    teacher.eval()

    def loss_fn(model: TinyBertStudent, batch: dict[str, Tensor]) -> LossOutput:
        teacher.to(next(iter(batch.values())).device)
        with torch.no_grad(), Capture(teacher) as t:
            teacher(batch)
        with Capture(model.student) as s:
            model.student(batch)
        g = layer_map(len(t.scores), len(s.scores))
        embd = embedding_loss(s.states[0], t.states[0], model.proj_e)
        hidn = sum(hidden_loss(s.states[m], t.states[g[m]], model.proj_h) for m in range(1, len(g)))
        attn = sum(attention_loss(s.scores[m - 1], t.scores[g[m] - 1]) for m in range(1, len(g)))
        loss = opts.embedding * embd + opts.hidden * hidn + opts.attention * attn
        parts = {"embd_loss": embd.detach(), "hidn_loss": hidn.detach(), "attn_loss": attn.detach()}  # read when logged
        return LossOutput(loss, len(batch["input_ids"]), parts)

    return loss_fn


def prediction_stage_loss(teacher: nn.Module, task, d):
    """Stage 2: soft · L_pred(t = distill.temperature) + hard · cross-entropy with the gold labels."""
    from lmforge.objectives.base import LossOutput

    teacher.eval()

    def loss_fn(model: TinyBertStudent, batch: dict[str, Tensor]) -> LossOutput:
        teacher.to(next(iter(batch.values())).device)
        with torch.no_grad():
            t = teacher(batch)
        s = model.student(batch)
        label = batch.get("label")
        if not isinstance(s.logits, Tensor) or label is None or label.dtype != torch.long:
            raise LMForgeError(f"distillation needs a classification-style task, got '{task.name}'")
        pred = prediction_loss(s.logits, t.logits, d.temperature)
        loss, parts = d.soft * pred, {"pred_loss": pred.detach()}
        if d.hard:
            hard = F.cross_entropy(s.logits.float(), label, ignore_index=-100)
            loss, parts["hard_loss"] = loss + d.hard * hard, hard.detach()
        return LossOutput(loss, len(label), parts)

    return loss_fn


def distill_tinybert(teacher: nn.Module, task, features: list[dict], d, out, *, seed: int = 0, resume: bool = False):
    """TinyBERT's two stages as two runs (OUT/tinybert-intermediate, OUT/tinybert-prediction); returns the student
    task model on the CPU."""
    from lmforge.compress.train import train_variant

    wrapper = build_student(teacher, task, d.tinybert)
    kw = dict(seed=seed, resume=resume, section="distill")
    steps = d.tinybert.intermediate_steps
    if steps:
        stage1 = dataclasses.replace(d, max_steps=steps)
        train_variant("tinybert-intermediate", wrapper, intermediate_loss(teacher, d.tinybert), task, features, stage1,
                      out / "tinybert-intermediate", **kw)  # fmt: skip
    train_variant("tinybert-prediction", wrapper, prediction_stage_loss(teacher, task, d), task, features, d,
                  out / "tinybert-prediction", **kw)  # fmt: skip
    teacher.to("cpu")
    return wrapper.student.cpu().eval()
