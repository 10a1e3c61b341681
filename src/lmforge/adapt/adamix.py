"""AdaMix (Wang et al. 2022, "AdaMix: Mixture-of-Adaptations for Parameter-efficient Model Tuning" §3): a
mixture of bottleneck adapters at every Houlsby site.

- §3.1 stochastic routing: each training forward goes through one random down-projection and one random
  up-projection of the site's experts, chosen independently (no router, no load balancing).
- §3.2 consistency regularisation: the task loss of one pass plus `consistency_weight` × the symmetric KL
  divergence between the outputs of two passes with different random routes (`symmetric_kl`; tasks run the second
  pass, tasks/base.py). The released code weights it 1 for GLUE and 100 for generation.
- §3.3 adaptation merging: inference uses one adapter whose weights are the experts' average. In eval mode a
  mixture averages on the fly; `merge_adamix` makes it permanent, turning the model into a Houlsby-adapted one
  with the averaged weights (one adapter per site: the inference cost and size of a single adapter).
- §3.4 adaptation module sharing: `share_up` / `share_down` keep one up- / down-projection shared by all experts
  (the released GLUE scripts share the up-projections)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.adapt.bottleneck import (
    AdapterLayer,
    BottleneckAdapter,
    BottleneckOptions,
    HoulsbyOptions,
    apply_bottleneck,
    init_projection,
)
from lmforge.adapt.inject import PeftState, check_positive
from lmforge.errors import LMForgeError
from lmforge.models.layers import activation_fn
from lmforge.objectives.base import LossOutput


@dataclass
class AdaMixOptions(BottleneckOptions):
    """AdaMix (`peft.method: adamix`): n_experts Houlsby adapters per site, one random down/up-projection pair per
    training forward, their averaged weights at inference."""

    n_experts: int = 4
    consistency_weight: float = 1.0
    """§3.2: weight of the symmetric KL between two differently routed passes, added to the task loss (each
    training step then runs the model twice); 0 = off."""
    share_up: bool = False
    """§3.4: one up-projection shared by every expert of a site."""
    share_down: bool = False
    """§3.4: one down-projection shared by every expert of a site."""


class MixtureAdapter(nn.Module):
    """AdaMix's adapter experts at one site: E_down down- and E_up up-projections (E = n_experts, or 1 when
    shared). Training routes each forward through a random down- and a random up-projection; eval mode uses the
    experts' averaged weights, so inference costs one adapter and is deterministic."""

    def __init__(self, d_model: int, options: AdaMixOptions, device=None, dtype=None) -> None:
        super().__init__()
        E, m = options.n_experts, options.bottleneck
        e_down, e_up = (1 if options.share_down else E), (1 if options.share_up else E)
        kw = dict(device=device, dtype=dtype)
        self.options = options
        self.down_weight = nn.Parameter(torch.empty(e_down, m, d_model, **kw))  # (E_down, m, d)
        self.down_bias = nn.Parameter(torch.zeros(e_down, m, **kw))
        self.up_weight = nn.Parameter(torch.empty(e_up, d_model, m, **kw))  # (E_up, d, m)
        self.up_bias = nn.Parameter(torch.zeros(e_up, d_model, **kw))
        self.act = activation_fn(options.activation)
        init_projection(self.down_weight, options.init_std)
        init_projection(self.up_weight, 0.0 if options.zero_init_up else options.init_std)

    @property
    def n_experts(self) -> int:
        return self.options.n_experts

    def route(self) -> tuple[int, int]:
        """(down, up) expert indices of one training forward, drawn independently and uniformly."""
        i = int(torch.randint(self.down_weight.shape[0], ()))
        j = int(torch.randint(self.up_weight.shape[0], ()))
        return i, j

    def expert_weights(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(down W, down b, up W, up b) of this forward: a random expert of each in training, else the mean."""
        if self.training:
            i, j = self.route()
            return self.down_weight[i], self.down_bias[i], self.up_weight[j], self.up_bias[j]
        return self.down_weight.mean(0), self.down_bias.mean(0), self.up_weight.mean(0), self.up_bias.mean(0)

    def forward(self, h: Tensor) -> Tensor:
        wd, bd, wu, bu = self.expert_weights()
        return F.linear(self.act(F.linear(h, wd, bd)), wu, bu)

    @torch.no_grad()
    def merged(self) -> BottleneckAdapter:
        """§3.3: one adapter holding the experts' averaged weights (what eval mode computes)."""
        w = self.down_weight
        out = BottleneckAdapter(w.shape[2], self.options, device=w.device, dtype=w.dtype)
        out.down.weight.copy_(self.down_weight.mean(0))
        out.down.bias.copy_(self.down_bias.mean(0))
        out.up.weight.copy_(self.up_weight.mean(0))
        out.up.bias.copy_(self.up_bias.mean(0))
        return out.train(self.training)

    def extra_repr(self) -> str:
        return (
            f"n_experts={self.n_experts}, bottleneck={self.down_weight.shape[1]}, "
            f"down={self.down_weight.shape[0]}, up={self.up_weight.shape[0]}"
        )


def apply_adamix(model: nn.Module, options: AdaMixOptions | None = None) -> nn.Module:
    """A mixture of n_experts adapters at every Houlsby site; the rest frozen (+ norms, head)."""
    o = options or AdaMixOptions()
    check_positive("adamix", n_experts=o.n_experts)
    if o.consistency_weight < 0:
        raise LMForgeError(f"adamix.consistency_weight must be >= 0, got {o.consistency_weight}")
    return apply_bottleneck(model, "adamix", o, lambda d, **kw: MixtureAdapter(d, o, **kw))


def merge_adamix(model: nn.Module) -> nn.Module:
    """§3.3 adaptation merging, in place: every mixture becomes one adapter with the experts' averaged weights,
    and the model a Houlsby-adapted one (`peft_config.method` "houlsby"; an adapter saved from it loads as such).
    The outputs are those of the mixture model in eval mode."""
    state = getattr(model, "peft_config", None)
    if state is None or state.method != "adamix":
        method = state.method if state is not None else "none"
        raise LMForgeError(f"merge_adamix needs a model adapted with adamix, this one has peft method '{method}'")
    for module in model.modules():
        if isinstance(module, AdapterLayer) and isinstance(module.adapter, MixtureAdapter):
            module.adapter = module.adapter.merged()
    keep = {f.name for f in dataclasses.fields(HoulsbyOptions)}
    options = HoulsbyOptions(**{k: v for k, v in dataclasses.asdict(state.options).items() if k in keep})
    model.peft_config = PeftState("houlsby", options, list(state.sites))
    return model


def consistency_weight(model: nn.Module) -> float:
    """The §3.2 regulariser's weight for a training step of `model` (0: not an AdaMix model, eval mode, or off)."""
    state = getattr(model, "peft_config", None)
    if state is None or state.method != "adamix" or not model.training:
        return 0.0
    return float(state.options.consistency_weight)


def with_consistency(task) -> Callable[[nn.Module, dict[str, Tensor]], LossOutput]:
    """`task`'s training loss with §3.2's consistency term for the training steps of an AdaMix model: the model runs
    a second time (other random routes through the adapter experts) and consistency_weight × `task.divergence` of
    the two passes' outputs is added to the first pass's loss, reported as `consistency_loss`. Other models, and
    evaluation, get the task's loss unchanged."""

    def loss(model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        first, outputs = task.scored(model, batch)
        weight = consistency_weight(model)
        if weight == 0:
            return first
        divergence = task.divergence(outputs, task.outputs(model, batch), batch)
        first.metrics["consistency_loss"] = divergence.detach()  # read on the loop's log steps, like the others
        return LossOutput(first.loss + weight * divergence, first.n_tokens, first.metrics)

    return loss


def symmetric_kl(a: Tensor, b: Tensor) -> Tensor:
    """½ (KL(softmax b ‖ softmax a) + KL(softmax a ‖ softmax b)) per row of logits (N, C), averaged over the rows,
    in float32. As in the released code each direction's target distribution is detached, so each pass is pulled
    towards the other and neither is pushed by its own target."""
    la, lb = F.log_softmax(a.float(), -1), F.log_softmax(b.float(), -1)
    if la.shape[0] == 0:
        return la.sum() * 0.0
    pa, pb = la.detach().exp(), lb.detach().exp()
    zero = la.new_zeros(())
    # Classes with probability 0 (masked-out choices) contribute nothing, whatever their logits.
    kl_ba = torch.where(pb > 0, pb * (lb.detach() - la), zero).sum(-1)  # KL(b ‖ a), gradient into a
    kl_ab = torch.where(pa > 0, pa * (la.detach() - lb), zero).sum(-1)  # KL(a ‖ b), gradient into b
    return 0.5 * (kl_ba + kl_ab).mean()
