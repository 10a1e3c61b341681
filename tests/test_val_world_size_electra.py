"""ELECTRA's validation does not depend on the number of processes: its generator's samples are drawn per
example (a hash of the example and the position), not from each rank's global generator, so one process with
batch 8 and two gloo processes (CPU) with batch 4 each get the same replacements and the same val_loss. And the
sampler, fed half a batch as a rank is, draws what it draws for those rows in the whole batch, from the
generator's softmax.

Run as a script (by the test, under torchrun or alone), it builds the run and prints rank 0's validation metrics."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from process_testing import launch_script


def evaluate_run(out: Path, overrides: list[str]) -> None:
    """Build the run on this rank and evaluate its initial weights as the training loop does."""
    from lmforge.pretraining.config import load_config
    from lmforge.pretraining.run import Pretraining
    from lmforge.train.distributed import cleanup

    torch.set_num_threads(1)
    p = Pretraining(load_config("electra", [f"--run.dir={out}", *overrides]))
    p.loop._evaluate()
    metrics = p.loop.last_eval
    p.lock.release()
    cleanup(p.dist)
    if p.dist.is_main:
        print(json.dumps(metrics), flush=True)


def launch(n: int, out: Path, *overrides: str) -> dict:
    return launch_script(__file__, n, out, *overrides)


def split_batch():
    """An ELECTRA objective, its model (eval mode) and a validation batch of 8 windows."""
    from encoder_testing import objective, tokenizer, windows

    from lmforge.models import get_preset

    tok = tokenizer("wordpiece", "bert")
    obj = objective("electra", tok)
    torch.manual_seed(0)
    model = obj.build_model(get_preset("electra-tiny", vocab_size=tok.vocab_size)).eval()
    return obj, model, obj.eval_transform(windows(tok, 32, 4000)[:8])


def test_half_batches_get_the_whole_batch_samples_and_loss():
    """What two ranks do with a global batch of 8: each scores 4 of its rows (take_rows drops the flat index)."""
    from lmforge.data.corpus.loader import take_rows

    obj, model, batch = split_batch()
    inputs = []
    handle = model.discriminator.register_forward_hook(lambda m, args, out: inputs.append(args[0].clone()))
    with torch.no_grad():
        whole = obj.loss(model, batch)
        halves = [obj.loss(model, take_rows(batch, rows)) for rows in (slice(0, 4), slice(4, 8))]
        again = obj.loss(model, batch)
    handle.remove()
    assert torch.equal(inputs[0], torch.cat(inputs[1:3])) and torch.equal(inputs[0], inputs[3])
    assert (inputs[0] != batch["input_ids"]).any()  # some [MASK]s were replaced by samples
    total = sum(float(h.loss) * int(h.n_tokens) for h in halves) / sum(int(h.n_tokens) for h in halves)
    assert total == pytest.approx(float(whole.loss), rel=1e-6, abs=0)
    assert float(whole.loss) == float(again.loss)
    # One process's loss is the released code's, computed here from the generator and discriminator by hand: the
    # generator's mean cross-entropy over the masked tokens + 50 x the discriminator's mean over every token of
    # whether it differs from the original.
    labelled = batch["labels"] != -100
    original = torch.where(labelled, batch["labels"], batch["input_ids"])
    with torch.no_grad():
        h = model.generator(batch["input_ids"], return_logits=False).last_hidden_state
        mlm = F.cross_entropy(model.generator.logits(h[labelled]), batch["labels"][labelled])
        rtd = model.discriminator(inputs[0]).rtd_logits
        disc = F.binary_cross_entropy_with_logits(rtd, (inputs[0] != original).float())
    assert float(whole.loss) == pytest.approx(float(mlm + 50 * disc), rel=1e-5)


def test_validation_uniforms_depend_on_the_example_alone():
    from lmforge.objectives.electra import sample_uniforms

    _, _, batch = split_batch()
    ids = batch["input_ids"]
    u = sample_uniforms(ids, 7)
    assert u.shape == ids.shape and u.dtype == torch.float64 and 0 <= float(u.min()) and float(u.max()) < 1
    torch.testing.assert_close(sample_uniforms(ids.flip(0), 7), u.flip(0), rtol=0, atol=0)  # any batch order
    torch.testing.assert_close(sample_uniforms(ids[5:6], 7), u[5:6], rtol=0, atol=0)  # any batch size
    assert not torch.equal(sample_uniforms(ids, 8), u)  # the seed matters
    assert abs(float(u.mean()) - 0.5) < 0.05 and len(u.flatten().unique()) == u.numel()


def test_inverse_cdf_draws_follow_the_softmax():
    """Clark et al. sample the generator's softmax (the released code: Gumbel-max); drawn through its CDF the
    frequencies are the softmax's, and a token of probability 0 is never drawn."""
    from lmforge.objectives.electra import sample_by_cdf

    probs = torch.tensor([0.5, 0.0, 0.2, 0.3, 0.0])
    n = 200_000
    u = torch.rand(n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    drawn = sample_by_cdf(probs.expand(n, -1), u)
    freq = torch.bincount(drawn, minlength=5).double() / n
    torch.testing.assert_close(freq, probs.double(), atol=4e-3, rtol=0)  # 4 standard errors at most
    assert freq[1] == freq[4] == 0
    edge = sample_by_cdf(probs.expand(3, -1), torch.tensor([0.0, 0.5, 1 - 2**-53], dtype=torch.float64))
    assert edge.tolist() == [0, 2, 3]  # u at 0.5 is past the first half: the next token with mass


@pytest.fixture(scope="module")
def wordpiece_data(tmp_path_factory) -> tuple[Path, Path]:
    """A 512-token BERT WordPiece tokenizer (ELECTRA masks with its [MASK]) and prepared shards of 30 documents."""
    from training_testing import write_docs

    from lmforge.data.corpus.bundled import load_default_corpus
    from lmforge.data.corpus.prepare import prepare
    from lmforge.tokenizers import train_tokenizer

    d = tmp_path_factory.mktemp("electra-data")
    tok = train_tokenizer(load_default_corpus()[:30], "wordpiece", 512, family="bert")
    tok.save(d / "tok")
    prepare([write_docs(d / "docs.jsonl", 30)], d / "data", tok, val_fraction=0.1)
    return d / "tok", d / "data"


def test_electra_val_loss_is_the_same_for_one_process_and_two(tmp_path, wordpiece_data):
    tok, data = wordpiece_data
    common = [f"--data.tokenizer={tok}", f"--data.prepared={data}", "--model.preset=electra-tiny",
              "--model.vocab_size=512", "--train.seq_len=32", "--train.eval_batches=2",
              "--sample.prompts=[]"]  # fmt: skip
    one = launch(1, tmp_path / "one", *common, "--train.batch_size=8")
    two = launch(2, tmp_path / "two", *common, "--train.batch_size=4", "--train.parallel=ddp")
    assert one["val_loss"] == pytest.approx(two["val_loss"], rel=1e-6, abs=0)  # ~41 nats: float32 rounding
    # (before: 41.07694 and 41.07673, the ranks' own samples and their own masked-token means)
    # The check can fail: another seed draws other weights, masks and samples, and another loss.
    other = launch(1, tmp_path / "other", *common, "--train.batch_size=8", "--run.seed=1")
    assert abs(one["val_loss"] - other["val_loss"]) > 1e-4


if __name__ == "__main__":
    evaluate_run(Path(sys.argv[1]), sys.argv[2:])
