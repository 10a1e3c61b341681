"""The Transformer-XL objective: memory carried from training step to step, validation with memory that starts afresh
every pass (and equals `evaluate_with_memory`), bad setups; the recipe trains through the CLI, and the trained model
scores the validation stream better with memory than without."""

from __future__ import annotations

import pytest
import torch
from lm_objective_testing import objective, run_cli, tokenizer, train_losses, windows, write_corpus

from lmforge.api import load
from lmforge.errors import LMForgeError
from lmforge.eval.memory_lm import evaluate_with_memory
from lmforge.models import Transformer
from lmforge.objectives.losses import lm_head_loss
from lmforge.tokenizers import Tokenizer

XL = {"preset": "transformer-xl-tiny", "dropout": 0.0, "mem_len": 16}


def xl_objective(**options):
    return objective("transformer_xl", tokenizer("gpt"), model=XL, seq_len=16, **options)


def test_training_carries_memory_from_step_to_step():
    obj = xl_objective()
    torch.manual_seed(0)
    model = Transformer(obj.cfg.model).train()
    tokens = windows(tokenizer("gpt"), 2, 32)  # row b: 32 consecutive tokens, cut into two segments of 16
    first, second = tokens[:, :17], tokens[:, 16:]
    obj.loss(model, obj.transform(first))
    got = obj.loss(model, obj.transform(second)).loss
    with torch.no_grad():
        mems = model(first[:, :-1], use_mems=True).mems
        out = model(second[:, :-1], mems=mems)
        want = lm_head_loss(model, out.last_hidden_state, second[:, 1:])
        alone = lm_head_loss(model, model(second[:, :-1]).last_hidden_state, second[:, 1:])
    torch.testing.assert_close(got.detach(), want, atol=1e-5, rtol=0)
    assert abs(float(alone) - float(want)) > 1e-4  # the memory mattered


@pytest.fixture(scope="module")
def prepared(prepared_docs):
    """(tokenizer, data dir) of the first 12 bundled documents."""
    tok_dir, data = prepared_docs(12)
    return Tokenizer.load(tok_dir), data


def _validate(obj, model, data, n: int) -> float:
    """The trainer's validation pass: eval mode, no grad, eval_transform over val_loader.eval_batches(n)."""
    model.eval()
    total = count = 0
    with torch.no_grad():
        for tokens in obj.make_loader(data, "val").eval_batches(n):
            out = obj.loss(model, obj.transform(tokens))
            total, count = total + float(out.loss) * out.n_tokens, count + out.n_tokens
    model.train()
    return total / count


def test_validation_starts_each_pass_afresh_carries_memory_and_leaves_training_memory_alone(prepared):
    tok, prepared = prepared
    obj = objective("transformer_xl", tok, model={**XL, "init_std": 0.3}, seq_len=16)  # far from uniform outputs
    obj.cfg.train.batch_size = 4
    torch.manual_seed(0)
    model = Transformer(obj.cfg.model).train()
    train_loader = obj.make_loader(prepared, "train")
    obj.loss(model, obj.transform(next(train_loader)))
    train_mems = obj.memory(model, 4)
    first, second = _validate(obj, model, prepared, 6), _validate(obj, model, prepared, 6)
    assert first == second  # each pass starts without memory
    assert obj.memory(model, 4) is train_mems  # the training memory survived validation
    ref = evaluate_with_memory(model, prepared, seq_len=16, mem_len=16, batch_size=4, max_batches=6)
    assert first == pytest.approx(ref.loss, abs=1e-5)  # validation is evaluation with memory
    without = evaluate_with_memory(model, prepared, seq_len=16, mem_len=0, batch_size=4, max_batches=6)
    assert abs(without.loss - first) > 1e-2
    assert ref.n_tokens == 6 * 4 * 16


def test_bad_setups_give_one_clear_error():
    tok = tokenizer("gpt")
    obj = objective("transformer_xl", tok, model={"preset": "gpt-tiny"})
    with pytest.raises(LMForgeError) as e:
        obj.build_model(obj.cfg.model)
    assert str(e.value) == (
        "objective 'transformer_xl' needs a model with model.position='xl' (e.g. "
        "--model.preset=transformer-xl-tiny), got position 'learned'"
    )
    with pytest.raises(LMForgeError, match="objective.eval_mem_len must be >= 0 or null, got -1"):
        xl_objective(eval_mem_len=-1)


def test_recipe_trains_and_memory_lowers_validation_loss(tmp_path):
    """The recipe on a small slice of the bundled corpus: the loss clearly falls, and the trained model's
    validation loss with memory is below the same model's without it, where every segment starts blind. (At this
    size the model barely looks past the previous token, so the gap is small: 4.144 vs 4.161 nats when written.)"""
    corpus = write_corpus(tmp_path / "docs.jsonl", n_docs=12)
    run = tmp_path / "run"
    steps = 300
    res = run_cli(
        "pretrain", "transformer-xl", "--model.preset=transformer-xl-tiny", f"--run.dir={run}",
        f"--data.inputs=[{corpus}]", "--data.vocab_size=512", "--data.val_fraction=0.2", f"--train.max_steps={steps}",
        "--train.batch_size=16", "--train.seq_len=16", "--model.mem_len=16", "--train.lr=3e-3",
        "--train.warmup_steps=10", "--train.log_every=1", f"--train.eval_every={steps}", "--train.eval_batches=16",
        "--sample.max_new_tokens=4", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    train, val = train_losses(run)
    assert len(train) == steps and len(val) == 1
    assert sum(train[-10:]) / 10 < sum(train[:3]) / 3 - 1.5, train
    model, _ = load(run)
    kw = dict(seq_len=16, batch_size=16, max_batches=16)
    with_mem = evaluate_with_memory(model, run / "data", mem_len=16, **kw).loss
    without = evaluate_with_memory(model, run / "data", mem_len=0, **kw).loss
    assert with_mem == pytest.approx(val[0], abs=1e-3)  # what the trainer reported
    assert with_mem < without - 0.005, (with_mem, without)
