"""Multi-token prediction objective: each depth learns its own offset, loss reductions, next-token-only validation,
and the recipe through the CLI (with a reload that rebuilds the heads)."""

import pytest
import torch
from lm_objective_testing import TINY_DECODER, objective, overfit, run_cli, tokenizer, train_losses, write_corpus
from safetensors.torch import load_file

import lmforge
from lmforge.errors import LMForgeError
from lmforge.models import Transformer

N_CYCLE = 50


def mtp(heads: int = 2, sequential: bool = False, head: str = "block", **options):
    model = {**TINY_DECODER, "mtp_heads": heads, "mtp_sequential": sequential, "mtp_head": head}
    return objective("mtp", tokenizer("gpt"), model=model, seq_len=32, **options)


def counting(batch: int, seq_len: int) -> torch.Tensor:
    """Rows s, s+1, s+2, ... (mod N_CYCLE) from random starts: token t + k + 1 is a function of token t."""
    start = torch.randint(0, N_CYCLE, (batch, 1))
    return (start + torch.arange(seq_len + 1)) % N_CYCLE


@pytest.mark.parametrize(
    "heads, sequential, head", [(2, False, "block"), (2, False, "linear"), (2, True, "block")]
)  # fmt: skip
def test_each_depth_learns_its_own_offset(heads, sequential, head):
    torch.manual_seed(0)
    obj = mtp(heads, sequential, head)
    model = Transformer(obj.cfg.model)
    batch = obj.transform(counting(16, 32))
    overfit(obj, model, batch, steps=60, lr=1e-2)
    test = obj.transform(counting(16, 32))
    out = model(test["input_ids"], mtp=True)
    # Depth 0 is the next-token head; depth k predicts input + k + 1: a misaligned target could not be learned.
    for k, logits in enumerate([out.logits, *out.mtp_logits]):
        expected = (test["input_ids"][:, : logits.shape[1]] + k + 1) % N_CYCLE
        assert torch.equal(expected, test["labels"][:, k:])
        accuracy = (logits.argmax(-1) == expected).float().mean().item()
        assert accuracy > 0.95, (k, accuracy)


def test_loss_combines_the_depths_by_sum_or_mean_with_a_weight():
    torch.manual_seed(1)
    batch = mtp().transform(counting(4, 32))
    for reduction, weight in (("sum", 1.0), ("mean", 0.3)):
        obj = mtp(3, reduction=reduction, weight=weight)
        torch.manual_seed(2)
        model = Transformer(obj.cfg.model)
        main, *depth = obj.depth_losses(model, batch)
        assert len(depth) == 3 and all(d.item() > 3.0 for d in depth)  # untrained: near ln(V)
        combined = sum(depth) / (3 if reduction == "mean" else 1)
        out = obj.loss(model, batch)
        torch.testing.assert_close(out.loss, main + weight * combined)
        assert out.n_tokens == 4 * 32


def test_validation_scores_the_next_token_only():
    torch.manual_seed(3)
    obj = mtp()
    causal = objective("causal_lm", tokenizer("gpt"), model=TINY_DECODER, seq_len=32)
    model = Transformer(obj.cfg.model)
    batch = obj.transform(counting(4, 32))
    model.eval()
    torch.testing.assert_close(obj.loss(model, batch).loss, causal.loss(model, batch).loss)
    model.train()
    assert obj.loss(model, batch).loss.item() > causal.loss(model, batch).loss.item() + 3.0
    assert obj.language_model  # validation reports perplexity and bits per byte


def test_needs_a_model_with_heads():
    with pytest.raises(LMForgeError, match="set model.mtp_heads >= 1"):
        objective("mtp", tokenizer("gpt"), model=TINY_DECODER)


def test_recipe_trains_and_reloads_through_the_cli(tmp_path):
    corpus = write_corpus(tmp_path / "docs.jsonl")
    run = tmp_path / "run"
    res = run_cli(
        "pretrain", "gpt-mtp", f"--run.dir={run}", f"--data.inputs=[{corpus}]", "--data.vocab_size=400",
        "--model.preset=gpt-mtp-tiny", "--train.max_steps=30", "--train.batch_size=8", "--train.seq_len=64",
        "--train.warmup_steps=3", "--train.lr=3e-3", "--train.log_every=1", "--train.eval_every=30",
        "--train.eval_batches=2", "--sample.max_new_tokens=5", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "perplexity" in res.stdout
    train, val = train_losses(run)
    assert len(train) == 30 and len(val) == 1
    # The training loss sums three heads (~3 ln V at init); validation is the next-token loss alone.
    assert train[0] > 15.0 and val[0] < train[-1] / 2
    assert sum(train[-5:]) / 5 < train[0] - 3.0
    gen = run_cli("generate", str(run), "--prompt", "The", "--max-new-tokens", "8", "--greedy", cwd=tmp_path)
    assert gen.returncode == 0, gen.stderr
    assert gen.stdout.startswith("The")
    model, tok = lmforge.load(run)  # rebuilt from the saved config: the heads come back with their weights
    assert model.config.mtp_heads == 2 and len(model.mtp.blocks) == 2
    saved = load_file(str(run / "checkpoints" / "step_30" / "model.safetensors"))
    torch.testing.assert_close(model.mtp.blocks[1].mlp.up.weight, saved["mtp.blocks.1.mlp.up.weight"])
