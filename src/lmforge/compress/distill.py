"""Knowledge distillation: Hinton et al. 2015 soft targets (temperature T, T² scaling) + the hard-label loss,
plus DistilBERT's hidden-state alignment (Sanh et al. 2019 §3: cosine embedding loss) and its student
initialisation from every other teacher layer."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.errors import LMForgeError


def soft_target_loss(student_logits: Tensor, teacher_logits: Tensor, temperature: float = 2.0) -> Tensor:
    """T² · KL(softmax(z_t / T) ‖ softmax(z_s / T)), mean over rows (..., C) → scalar.

    Hinton §2: gradients of the soft cross-entropy scale as 1/T², so multiplying by T² keeps the soft and hard
    terms' relative weight when T changes. KL differs from the soft cross-entropy by the teacher's entropy, a
    constant for the student: same gradients, and 0 when the student matches the teacher."""
    if temperature <= 0:
        raise LMForgeError(f"distillation temperature must be positive, got {temperature}")
    s = F.log_softmax(student_logits.float() / temperature, dim=-1).flatten(0, -2)
    t = F.log_softmax(teacher_logits.float() / temperature, dim=-1).flatten(0, -2)
    kl = F.kl_div(s, t, log_target=True, reduction="batchmean")  # Σ p_t (log p_t − log p_s) / rows
    return kl * temperature**2


HIDDEN_LOSSES: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "cosine": lambda s, t: 1 - F.cosine_similarity(s, t, dim=-1),
    "mse": lambda s, t: (s - t).pow(2).mean(-1),
}
"""Hidden-state loss kind → its loss at each position, (N, d) student and teacher states → (N,)."""


def hidden_state_loss(
    student_h: Tensor, teacher_h: Tensor, kind: Literal["cosine", "mse"] = "cosine", mask: Tensor | None = None
) -> Tensor:
    """Align hidden states (..., d) of equal width: DistilBERT's cosine loss 1 − cos(h_s, h_t), or the MSE; mean
    over positions where mask (...) is 1 (all when None)."""
    if student_h.shape != teacher_h.shape:
        raise LMForgeError(f"hidden states differ in shape: {tuple(student_h.shape)} vs {tuple(teacher_h.shape)}")
    s, t = student_h.float().flatten(0, -2), teacher_h.float().flatten(0, -2)  # (N, d)
    per = HIDDEN_LOSSES[kind](s, t)  # (N,)
    if mask is None:
        return per.mean()
    m = mask.flatten().to(per.dtype)
    return (per * m).sum() / m.sum().clamp(min=1)


@dataclass
class DistillWeights:
    """Weights of the three terms. Hinton's blend is soft = α, hard = 1 − α; Hugging Face's DistilBERT
    distillation example trains with 5 · soft + 2 · MLM + 1 · cosine at T = 2."""

    soft: float = 0.5
    hard: float = 0.5
    hidden: float = 0.0
    temperature: float = 2.0
    hidden_kind: Literal["cosine", "mse"] = "cosine"


def distillation_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    labels: Tensor | None = None,
    weights: DistillWeights | None = None,
    student_hidden: Tensor | None = None,
    teacher_hidden: Tensor | None = None,
    hidden_mask: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """soft · T²·KL + hard · CE(labels; -100 ignored) + hidden · hidden-state loss → (loss, parts, detached)."""
    w = weights or DistillWeights()
    soft = soft_target_loss(student_logits, teacher_logits.detach(), w.temperature)
    loss = w.soft * soft
    parts = {"soft_loss": soft.detach()}  # on the device: the training loop reads them when it logs
    if w.hard and labels is not None:
        hard = F.cross_entropy(student_logits.float().flatten(0, -2), labels.flatten(), ignore_index=-100)
        loss = loss + w.hard * hard
        parts["hard_loss"] = hard.detach()
    if w.hidden and student_hidden is not None and teacher_hidden is not None:
        hid = hidden_state_loss(student_hidden, teacher_hidden.detach(), w.hidden_kind, hidden_mask)
        loss = loss + w.hidden * hid
        parts["hidden_loss"] = hid.detach()
    return loss, parts


# --- student initialisation ---------------------------------------------------------------------------------


def _transformer(model: nn.Module) -> nn.Module:
    from lmforge.models import Transformer

    if isinstance(model, Transformer):
        return model
    inner = getattr(model, "backbone", None)
    if isinstance(inner, Transformer):
        return inner
    raise LMForgeError(f"expected a Transformer or a model with a Transformer backbone, got {type(model).__name__}")


def _stack_layers(cfg, stack: str, layers: list[int] | None) -> list[int]:
    n = cfg.n_layers if stack == "encoder" or not cfg.is_encoder_decoder else cfg.decoder_layers
    chosen = list(range(0, n, 2)) if layers is None else list(layers)
    if not chosen or any(not 0 <= i < n for i in chosen) or sorted(set(chosen)) != chosen:
        raise LMForgeError(f"student layers {chosen} must be increasing, distinct indices of the {n} {stack} layers")
    return chosen


@torch.no_grad()
def init_student_from_teacher(teacher: nn.Module, layers: list[int] | None = None) -> nn.Module:
    """A student with the teacher's width and every other layer (DistilBERT §3: "taking one layer out of two"),
    initialised by copying those layers, the embeddings, final norms and every head; `layers` picks other
    teacher layers (e.g. [0, 2, 4, 7, 9, 11]). Works for decoders and encoders (each stack of an
    encoder-decoder keeps the same indices) and for task models with a `backbone` (the head is copied)."""
    from lmforge.models import Transformer

    core = _transformer(teacher)
    cfg = core.config
    if cfg.share_layers:
        raise LMForgeError("ALBERT-style shared layers have one set of weights: there is no layer to drop")
    stacks = [s for s in ("encoder", "decoder") if hasattr(core, s)]
    picks = {s: _stack_layers(cfg, s, layers) for s in stacks}
    n_enc = len(picks.get("encoder", picks.get("decoder")))
    over = {"n_layers": n_enc}
    if cfg.is_encoder_decoder:
        over["n_decoder_layers"] = len(picks["decoder"])
    student = Transformer(dataclasses.replace(cfg, **over))
    source = core.state_dict()
    state = {}
    for key in student.state_dict():
        parts = key.split(".")
        if len(parts) > 2 and parts[0] in picks and parts[1] == "blocks":  # <stack>.blocks.<i>.…
            parts[2] = str(picks[parts[0]][int(parts[2])])
        state[key] = source[".".join(parts)]
    student.load_state_dict(state)
    student.train(core.training)
    if core is teacher:
        return student
    out = copy.deepcopy(teacher)  # a task model: same head, smaller backbone
    out.backbone = student
    return out
