"""Quantisation-aware fine-tuning as Q8BERT (Zafrir et al. 2019), and the export of its int8 model.

Q8BERT §2 uses symmetric linear quantisation, Quantize(x | S_x, M) = Clamp(⌊x · S_x⌉, −M, M) with M = 2^(b−1) − 1
(127 at 8 bits): weights with S_W = M / max|W|, activations with S_x = M / EMA(max|x|), the exponential moving
average of the input's largest magnitude gathered while training. Training runs fake quantisation,
x^q = Quantize(x) / S_x, with the straight-through estimator ∂x^q/∂x = 1 (Bengio et al. 2013) in the backward pass;
every Embedding and fully connected layer is quantised this way while fine-tuning (softmax, LayerNorm and GELU stay
in float32), and biases become int32 with scale S_W · S_x at export. IntelLabs' nlp-architect (the authors' code,
`nn/torch/quantization.py`) sets the EMA's decay to 0.9999, starts it at the first batch's max|x|, and passes the
gradient straight through everywhere, also where the EMA range clips x.

What lmforge quantises: every nn.Linear of the model (attention's fused qkv and output projections, the MLPs, the
pooler and the task head; `skip` leaves some in float) and the token, segment and absolute-position tables (not
relative-position biases). Q8BERT also re-quantises the query and key outputs for the QKᵀ product; lmforge's fused
attention (SDPA) multiplies them in float, so that product is not simulated."""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.errors import LMForgeError

EMBEDDING_NAMES = ("tok_emb", "type_emb", "emb")
"""The lookup tables quantised: token, segment and absolute-position embeddings (`emb` of a learned position table)."""


def max_quant(bits: int) -> int:
    """M = 2^(bits − 1) − 1: the largest magnitude of a symmetric `bits`-bit integer (127 at 8 bits)."""
    return 2 ** (bits - 1) - 1


def quantize(x: Tensor, scale: Tensor | float, bits: int = 8) -> Tensor:
    """Clamp(⌊x · S⌉, −M, M): the integers (held in x's float dtype) of symmetric linear quantisation."""
    m = max_quant(bits)
    return (x * scale).round().clamp(-m, m)


class _FakeQuantize(torch.autograd.Function):
    """Forward Quantize(x) / S; backward the straight-through estimator ∂x^q/∂x = 1."""

    @staticmethod
    def forward(ctx, x: Tensor, scale: Tensor, bits: int) -> Tensor:
        return quantize(x, scale, bits) / scale

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, None, None


def fake_quantize(x: Tensor, scale: Tensor, bits: int = 8) -> Tensor:
    """x^q = Clamp(⌊x · S⌉, −M, M) / S, with an identity gradient (STE)."""
    return _FakeQuantize.apply(x, scale, bits)


def weight_scale(w: Tensor, bits: int = 8) -> Tensor:
    """S_W = M / max|W| (per tensor; an all-zero tensor gets scale 1)."""
    top = w.detach().abs().max()
    return max_quant(bits) / torch.where(top > 0, top, torch.ones_like(top))


def ema_max(ema: Tensor, x_max: Tensor, decay: float, first: Tensor) -> Tensor:
    """EMA_t = decay · EMA_{t−1} + (1 − decay) · max|x_t|, started at max|x_1| on the first batch (`first`)."""
    return torch.where(first, x_max, decay * ema + (1 - decay) * x_max)


class QATLinear(nn.Linear):
    """An nn.Linear (the same weight and bias parameters) whose input and weight are fake-quantised: input scale from
    the EMA of max|x| (updated on every training forward), weight scale from max|W| at each forward."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, bits: int = 8, decay: float = 0.9999):
        super().__init__(in_features, out_features, bias=bias, device="meta")
        self.bits, self.decay = bits, decay
        self.register_buffer("input_max", torch.zeros(()))
        self.register_buffer("updates", torch.zeros((), dtype=torch.long))

    @classmethod
    def wrap(cls, linear: nn.Linear, bits: int, decay: float) -> QATLinear:
        q = cls(linear.in_features, linear.out_features, linear.bias is not None, bits, decay)
        q.weight, q.bias = linear.weight, linear.bias  # shared: a tied matrix stays tied
        q.input_max, q.updates = q.input_max.to(linear.weight.device), q.updates.to(linear.weight.device)
        q.train(linear.training)
        return q

    def input_scale(self, x: Tensor | None = None) -> Tensor:
        """S_x = M / EMA(max|x|); a layer never trained uses this batch's max|x| (no EMA yet)."""
        top = self.input_max
        if x is not None:
            top = torch.where(self.updates > 0, top, x.detach().abs().max().float())
        return max_quant(self.bits) / torch.where(top > 0, top, torch.ones_like(top))

    def forward(self, x: Tensor) -> Tensor:
        if self.training:
            with torch.no_grad():
                self.input_max.copy_(
                    ema_max(self.input_max, x.detach().abs().max().float(), self.decay, self.updates == 0)
                )
                self.updates += 1
        s_x = self.input_scale(x).to(x.dtype)
        w = fake_quantize(self.weight, weight_scale(self.weight, self.bits).to(self.weight.dtype), self.bits)
        return F.linear(fake_quantize(x, s_x, self.bits), w, self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, bits={self.bits}, ema_decay={self.decay}"


class QATEmbedding(nn.Embedding):
    """An nn.Embedding (the same table) looked up in its fake-quantised form, S_W = M / max|W|."""

    @classmethod
    def wrap(cls, emb: nn.Embedding, bits: int) -> QATEmbedding:
        q = cls(emb.num_embeddings, emb.embedding_dim, emb.padding_idx, device="meta")
        q.weight, q.bits = emb.weight, bits
        q.train(emb.training)
        return q

    def forward(self, ids: Tensor) -> Tensor:
        w = fake_quantize(self.weight, weight_scale(self.weight, self.bits).to(self.weight.dtype), self.bits)
        return F.embedding(ids, w, self.padding_idx)


def _matches(name: str, skip: tuple[str, ...]) -> bool:
    return any(name == s or name.endswith("." + s) for s in skip)


def apply_qat(
    model: nn.Module, bits: int = 8, ema_decay: float = 0.9999, skip: Iterable[str] = (), embeddings: bool = True
) -> list[str]:
    """Replace, in place, every nn.Linear (and with `embeddings` the token, segment and absolute-position tables) by
    its fake-quantised twin sharing the same parameters; `skip`: qualified names or their last parts left in float.
    Returns the names replaced."""
    if not 2 <= bits <= 8:
        raise LMForgeError(f"qat.bits must be in [2, 8], got {bits}")
    if not 0 < ema_decay < 1:
        raise LMForgeError(f"qat.ema_decay must be in (0, 1), got {ema_decay}")
    skip = tuple(skip)
    done = []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if _matches(full, skip):
                continue
            if type(child) is nn.Linear:
                setattr(module, child_name, QATLinear.wrap(child, bits, ema_decay))
            elif type(child) is nn.Embedding and embeddings and child_name in EMBEDDING_NAMES:
                setattr(module, child_name, QATEmbedding.wrap(child, bits))
            else:
                continue
            done.append(full)
    if not done:
        raise LMForgeError("the model has no linear or embedding layers to quantise")
    return done


# --- the int8 model -------------------------------------------------------------------------------------------


class Int8Linear(nn.Module):
    """Q8BERT's integer layer: int8 weight W_q = Quantize(W | S_W), int32 bias b_q = Quantize(b | S_W·S_x, 32 bits)
    and the input scale S_x learned in training; y = (x_q W_qᵀ + b_q) / (S_W · S_x) with x_q = Quantize(x | S_x).
    The integer products are summed in float32, as nlp-architect's inference path does (exact while a sum stays
    below 2^24); an int8 GEMM kernel would give the same sums."""

    def __init__(self, q: QATLinear) -> None:
        super().__init__()
        self.in_features, self.out_features, self.bits = q.in_features, q.out_features, q.bits
        w = q.weight.detach().float()
        s_w, s_x = weight_scale(w, q.bits), q.input_scale().float()
        self.register_buffer("weight_int8", quantize(w, s_w, q.bits).to(torch.int8))
        self.register_buffer("weight_scale", s_w)
        self.register_buffer("input_scale", s_x)
        bias = None if q.bias is None else quantize(q.bias.detach().float().double(), (s_w * s_x).double(), 32)
        self.register_buffer("bias_int32", None if bias is None else bias.to(torch.int32))

    @property
    def weight(self) -> Tensor:
        """The dequantised weight W_q / S_W (for code that reads a layer's matrix)."""
        return self.weight_int8.float() / self.weight_scale

    def forward(self, x: Tensor) -> Tensor:
        xq = quantize(x.float(), self.input_scale, self.bits)
        acc = F.linear(xq, self.weight_int8.float())
        if self.bias_int32 is not None:
            acc = acc + self.bias_int32.float()
        return (acc / (self.weight_scale * self.input_scale)).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int{self.bits}"


class Int8Embedding(nn.Module):
    """An int8 table W_q = Quantize(W | S_W); a lookup returns W_q[ids] / S_W."""

    def __init__(self, q: QATEmbedding) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim, self.bits = q.num_embeddings, q.embedding_dim, q.bits
        w = q.weight.detach().float()
        s_w = weight_scale(w, q.bits)
        self.register_buffer("weight_int8", quantize(w, s_w, q.bits).to(torch.int8))
        self.register_buffer("weight_scale", s_w)

    @property
    def weight(self) -> Tensor:
        return self.weight_int8.float() / self.weight_scale

    def forward(self, ids: Tensor) -> Tensor:
        return self.weight_int8[ids].float() / self.weight_scale


@torch.no_grad()
def export_int8(model: nn.Module) -> nn.Module:
    """A copy of a QAT-trained model (on the CPU, in eval mode) with every QATLinear / QATEmbedding replaced by its
    int8 layer: weights stored as int8 with one float scale each, biases as int32."""
    out = copy.deepcopy(model).cpu().eval()
    shared: dict[int, Tensor] = {}  # id(float weight) → its int8 tensor: a tied LM head stores the table once
    n = 0
    for _, module in list(out.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, (QATLinear, QATEmbedding)):
                q = Int8Linear(child) if isinstance(child, QATLinear) else Int8Embedding(child)
                q.weight_int8 = shared.setdefault(id(child.weight), q.weight_int8)  # same W, same S_W, same ints
                setattr(module, child_name, q)
                n += 1
    if n == 0:
        raise LMForgeError("the model has no quantisation-aware layers to export (apply_qat first)")
    return out
