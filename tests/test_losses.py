"""The chunked linear cross-entropy equals the plain one, in value and gradients."""

import torch
import torch.nn.functional as F

from lmforge.objectives.losses import linear_cross_entropy


def test_chunked_linear_cross_entropy_matches_reference():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(37, 16, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 16, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 50, (37,), generator=g)
    labels[[3, 10]] = -100  # ignored positions
    ref = F.cross_entropy(h @ w.t(), labels, ignore_index=-100)
    gh, gw = torch.autograd.grad(ref * 3.0, (h, w))
    out = linear_cross_entropy(h, w, labels, chunk=8)
    ch, cw = torch.autograd.grad(out * 3.0, (h, w))
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(ch, gh)
    torch.testing.assert_close(cw, gw)
    assert ch[3].abs().max() == 0  # an ignored row gets no gradient


def test_no_gradient_work_without_autograd():
    h, w = torch.randn(5, 4), torch.randn(7, 4)
    labels = torch.tensor([0, 1, 2, 3, 4])
    with torch.no_grad():
        out = linear_cross_entropy(h, w, labels, chunk=2)
    torch.testing.assert_close(out, F.cross_entropy(h @ w.t(), labels))
