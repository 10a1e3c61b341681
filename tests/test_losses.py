"""The aligned LM-head loss equals plain cross-entropy over the unpadded vocabulary, in value and gradients."""

import torch
import torch.nn.functional as F

from lmforge.models import Transformer, get_preset
from lmforge.objectives.losses import aligned_head_logits, lm_head_loss


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
