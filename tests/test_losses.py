"""The aligned LM-head loss and lmforge's cross-entropy equal F.cross_entropy over the unpadded vocabulary, in value
and gradients."""

import pytest
import torch
import torch.nn.functional as F

from lmforge.models import Transformer, get_preset
from lmforge.models.lm_head import aligned_head_logits, cross_entropy
from lmforge.objectives.losses import lm_head_loss


def test_aligned_head_matches_plain_softmax():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(9, 16, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 16, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 50, (9,), generator=g)
    logits = aligned_head_logits(h, w)
    assert logits.shape == (9, 64) and torch.isinf(logits[:, 50:]).all()
    ref = F.cross_entropy(h @ w.t(), labels)
    out = F.cross_entropy(logits, labels)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(torch.autograd.grad(out, (h, w)), torch.autograd.grad(ref, (h, w)))


def test_lm_head_loss_equals_cross_entropy_of_model_logits():
    torch.manual_seed(0)
    model = Transformer(get_preset("gpt-tiny", vocab_size=301))
    x = torch.randint(0, 301, (2, 12))
    out = model(x[:, :-1])
    ref = F.cross_entropy(out.logits.flatten(0, 1), x[:, 1:].flatten())
    torch.testing.assert_close(lm_head_loss(model, out.last_hidden_state, x[:, 1:]), ref)


def _labels_with_ignored(n: int, v: int, g: torch.Generator) -> torch.Tensor:
    labels = torch.randint(0, v, (n,), generator=g)
    labels[::4] = -100
    return labels


def test_cross_entropy_equals_torch_in_value_and_gradient():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 37, generator=g, dtype=torch.float64, requires_grad=True)
    labels = _labels_with_ignored(15, 37, g).view(3, 5)
    ours = cross_entropy(logits, labels)
    ref = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(torch.autograd.grad(ours, logits), torch.autograd.grad(ref, logits))
    assert torch.autograd.gradcheck(lambda x: cross_entropy(x, labels), (logits,))


@pytest.mark.parametrize("compiled", [False, True])
def test_cross_entropy_bf16_logits_with_masked_padding(compiled):
    """bf16 logits whose padded columns are -inf (the aligned head): float32 statistics, a bf16 gradient that is 0 on
    the padding, and the same numbers under torch.compile."""
    g = torch.Generator().manual_seed(1)
    base = torch.randn(16, 64, generator=g)
    base[:, 50:] = float("-inf")
    labels = _labels_with_ignored(16, 50, g)
    logits = base.to(torch.bfloat16).requires_grad_()
    fn = torch.compile(cross_entropy) if compiled else cross_entropy
    loss = fn(logits, labels)
    (grad,) = torch.autograd.grad(loss, logits)
    exact = base.to(torch.bfloat16).float().requires_grad_()
    ref = F.cross_entropy(exact, labels)
    (ref_grad,) = torch.autograd.grad(ref, exact)
    assert loss.dtype == torch.float32 and grad.dtype == torch.bfloat16
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(grad.float(), ref_grad, atol=2e-3, rtol=1e-2)
    assert (grad[:, 50:] == 0).all()


def test_cross_entropy_without_labels_is_nan_like_torch():
    logits = torch.randn(4, 7, requires_grad=True)
    labels = torch.full((4,), -100)
    assert cross_entropy(logits, labels).isnan() and F.cross_entropy(logits, labels).isnan()
