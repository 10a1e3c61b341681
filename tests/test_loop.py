"""The one training loop's parts: the prefetching batch source equals the synchronous one (batches and resume
state), a training step reads nothing back from the device, and a non-finite step is skipped by the optimizer
itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from lm_objective_testing import TINY_DECODER, objective
from training_testing import no_device_reads

from lmforge.data.corpus.loader import TokenLoader
from lmforge.errors import LMForgeError
from lmforge.models import ModelConfig, Transformer
from lmforge.objectives.base import LossOutput
from lmforge.objectives.losses import lm_head_loss
from lmforge.pretraining.config import TrainConfig
from lmforge.pretraining.run import ObjectiveBatches
from lmforge.tokenizers import Tokenizer
from lmforge.train.distributed import DistInfo
from lmforge.train.loop import Loop
from lmforge.train.loop_spec import LoopSpec, Saved
from lmforge.train.metrics import MetricsLogger, read_metrics
from lmforge.train.prefetch import Batch, Prefetcher


@pytest.fixture(scope="module")
def prepared(prepared_docs):
    return prepared_docs(12)


def _source(prepared, seed: int = 3) -> ObjectiveBatches:
    """Prefix-LM batches: every window gets a random split point drawn from the source's generator."""
    tok_dir, data = prepared
    obj = objective("prefix_lm", Tokenizer.load(tok_dir), model={**TINY_DECODER, "mask": "prefix"}, seq_len=32)
    loader = TokenLoader(data, "train", seq_len=32, batch_size=4, seed=1)
    return ObjectiveBatches(loader, obj.transform, seed)


def _same(a: Batch, b: Batch) -> bool:
    return a.data.keys() == b.data.keys() and all(torch.equal(a.data[k], b.data[k]) for k in a.data)


@pytest.mark.parametrize("process", [False, True], ids=["thread", "worker-process"])
def test_prefetched_batches_and_states_equal_the_synchronous_ones(prepared, process):
    sync, ahead = Prefetcher(_source(prepared), depth=0), Prefetcher(_source(prepared), depth=3, process=process)
    states = []
    for _ in range(25):  # past an epoch end of the loader
        assert _same(next(sync), next(ahead))
        assert sync.state_dict()["loader"] == ahead.state_dict()["loader"]
        assert torch.equal(sync.state_dict()["generator"], ahead.state_dict()["generator"])
        states.append(ahead.state_dict())
    proc = ahead._process.proc if process else None
    ahead.close()
    assert proc is None or not proc.is_alive()
    # Resuming from a state taken while the prefetcher was ahead gives exactly the batches that followed it.
    resumed = Prefetcher(_source(prepared), depth=2, process=process)
    resumed.load_state_dict(states[9])
    replay = Prefetcher(_source(prepared), depth=0)
    for _ in range(10):
        next(replay)
    for _ in range(8):
        assert _same(next(resumed), next(replay))
    resumed.close()


class _Broken:
    def __next__(self):
        raise ValueError("bad row")

    def state_dict(self):
        return {}


@pytest.mark.parametrize("process", [False, True], ids=["thread", "worker-process"])
def test_an_error_in_the_source_reaches_the_training_step(process):
    with pytest.raises(ValueError, match="bad row"):
        next(Prefetcher(_Broken(), depth=2, process=process))


class _Dies:
    def __next__(self):
        os._exit(3)

    def state_dict(self):
        return {}


def test_a_worker_process_that_dies_is_one_error_line():
    with pytest.raises(LMForgeError, match=r"the batch worker process died \(exit code 3\)"):
        next(Prefetcher(_Dies(), depth=2, process=True))


_ORPHAN = """
import os, signal, sys, torch
from lmforge.train.prefetch import Batch, Prefetcher

class Endless:
    def __next__(self):
        return Batch({"x": torch.zeros(4)})

    def state_dict(self):
        return {}

p = Prefetcher(Endless(), depth=1, process=True)
next(p)
print(p._process.proc.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_worker_process_ends_when_the_training_process_is_killed():
    res = subprocess.run([sys.executable, "-c", _ORPHAN], capture_output=True, text=True, timeout=60)
    assert res.returncode == -signal.SIGKILL, res.stderr
    pid = int(res.stdout.split()[0])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.2)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat")  # a zombie (exited, not yet reaped by init) counts as ended
    return not (state.exists() and state.read_text().split(") ")[-1].startswith("Z"))


class _Poisoned:
    """Batches whose loss is NaN at chosen steps (a scale of NaN), else a real LM loss."""

    def __init__(self, bad: set[int]) -> None:
        self.bad, self.i = bad, 0
        self.gen = torch.Generator().manual_seed(0)

    def __next__(self) -> Batch:
        self.i += 1
        ids = torch.randint(0, 100, (2, 9), generator=self.gen)
        scale = torch.tensor(float("nan") if self.i in self.bad else 1.0)
        return Batch({"ids": ids, "scale": scale})

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, s):
        self.i = s["i"]


def _loss(model, batch) -> LossOutput:
    logits = model(batch["ids"][:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["ids"][:, 1:].flatten())
    return LossOutput(loss * batch["scale"], batch["ids"][:, 1:].numel())


def test_a_step_reads_nothing_back_and_skips_nonfinite_updates_on_the_device(tmp_path):
    cfg = TrainConfig(max_steps=8, warmup_steps=0, lr=1e-2, log_every=8, prefetch=0, grad_clip=1.0)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=100, **TINY_DECODER))
    with MetricsLogger(tmp_path) as log:
        loop = Loop(model, _loss, _Poisoned({2, 3}), cfg, tmp_path, LoopSpec(saved=lambda: Saved(model, {})),
                    dist=DistInfo(), device=torch.device("cpu"), log=log)  # fmt: skip
        weights = [{k: v.clone() for k, v in model.state_dict().items()}]
        with no_device_reads():
            for _ in range(4):
                loop.train_step()
                weights.append({k: v.clone() for k, v in model.state_dict().items()})
        kept, _ = loop._read()  # the one read: the values of all four steps at once

    def same(a, b):
        return all(torch.equal(a[k], b[k]) for k in a)

    assert not same(weights[0], weights[1]) and not same(weights[3], weights[4])  # steps 1 and 4 updated
    assert same(weights[1], weights[2]) and same(weights[2], weights[3])  # the NaN steps 2 and 3 did not
    assert len(kept) == 2 and loop.health.streak == 0
    skipped = [r for r in read_metrics(tmp_path) if r.get("skipped")]
    assert [r["step"] for r in skipped] == [2, 3]


def _lm_loss(model, batch) -> LossOutput:
    h = model(batch["ids"][:, :-1], return_logits=False).last_hidden_state
    return LossOutput(lm_head_loss(model, h, batch["ids"][:, 1:]) * batch["scale"], batch["ids"][:, 1:].numel())


def _train_losses(tmp_path, model_kw: dict | None = None, **train) -> tuple[list[float], Loop]:
    cfg = TrainConfig(max_steps=4, warmup_steps=0, lr=1e-2, log_every=1, prefetch=0, **train)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=100, **{**TINY_DECODER, "n_layers": 3, **(model_kw or {})}))
    with MetricsLogger(tmp_path) as log:
        loop = Loop(model, _lm_loss, _Poisoned(set()), cfg, tmp_path, LoopSpec(saved=lambda: Saved(model, {})),
                    dist=DistInfo(), device=torch.device("cpu"), log=log)  # fmt: skip
        for _ in range(4):
            loop.train_step()
        losses, _ = loop._read()
    return [float(x) for x in losses], loop


def _compiled_like_eager(tmp_path, scope: str, model_kw: dict | None = None, **train):
    """Four steps eager and four with train.compile_scope=`scope` (and `train`) from the same start: the same
    losses → (the compiled run's loop, Dynamo's counters counting from its start)."""
    from torch._dynamo.utils import counters

    eager, _ = _train_losses(tmp_path / "eager", model_kw)
    torch._dynamo.reset()
    counters.clear()
    compiled, loop = _train_losses(tmp_path / scope, model_kw, compile=True, compile_scope=scope, **train)
    assert compiled == pytest.approx(eager, rel=1e-4)
    return loop, counters


def test_compiling_blocks_compiles_one_graph_for_all_blocks_and_one_for_the_lm_loss(tmp_path):
    loop, counters = _compiled_like_eager(tmp_path, "blocks")
    model = loop.raw
    blocks = [m for m in model.modules() if type(m).__name__ == "Block"]
    assert len(blocks) == 3 and all(hasattr(b.forward, "__wrapped__") for b in blocks)
    assert hasattr(model.lm_loss, "__wrapped__")
    assert not isinstance(loop.step_fn, torch._dynamo.eval_frame.OptimizedModule)  # no whole-step graph
    assert counters["stats"]["unique_graphs"] == 2  # three blocks share one graph; the LM loss is the other
    with torch.no_grad():  # evaluation runs the regions eager: no second set of graphs
        ids = torch.randint(0, 100, (2, 9))
        lm_head_loss(model, model(ids, return_logits=False).last_hidden_state[:, :-1], ids[:, 1:])
    assert counters["stats"]["unique_graphs"] == 2
    assert not any("_orig_mod" in k for k in model.state_dict())  # checkpoints keep their plain keys


def test_compiling_pointwise_chains_compiles_one_graph_each_for_all_blocks(tmp_path):
    from lmforge.models.families import GPT_FAST

    loop, counters = _compiled_like_eager(tmp_path, "pointwise", {**GPT_FAST, "tie_embeddings": True})
    model = loop.raw
    blocks = [m for m in model.modules() if type(m).__name__ == "Block"]
    assert len(blocks) == 3 and not any(hasattr(b.forward, "__wrapped__") for b in blocks)
    regions = [r for b in blocks for r in (b.norm1.forward, b.norm2.forward, b.mlp.forward, b.attn.qk_transform)]
    assert all(hasattr(r, "__wrapped__") for r in regions) and hasattr(model.lm_loss, "__wrapped__")
    assert not isinstance(loop.step_fn, torch._dynamo.eval_frame.OptimizedModule)
    # Three blocks share each graph: the norms (one shape for both), QK-norm with rotary, the MLP; and the LM loss.
    assert counters["stats"]["unique_graphs"] == 4


def test_compiling_the_head_compiles_only_the_lm_loss(tmp_path):
    loop, counters = _compiled_like_eager(tmp_path, "head")
    model = loop.raw
    assert hasattr(model.lm_loss, "__wrapped__")
    assert not any(hasattr(m.forward, "__wrapped__") for m in model.modules() if type(m).__name__ == "Block")
    assert not isinstance(loop.step_fn, torch._dynamo.eval_frame.OptimizedModule)
    assert counters["stats"]["unique_graphs"] == 1


def test_fsdp_with_one_unit_compiles_the_whole_forward_and_the_lm_loss(tmp_path):
    loop, counters = _compiled_like_eager(tmp_path, "step", parallel="fsdp", fsdp_unit_blocks=0)
    model = loop.raw
    assert hasattr(model.forward, "__wrapped__") and hasattr(model.lm_loss, "__wrapped__")
    assert not any(hasattr(m.forward, "__wrapped__") for m in model.modules() if type(m).__name__ == "Block")
    assert counters["stats"]["unique_graphs"] == 2  # the forward, the LM loss: FSDP's one unit around them


def test_a_first_step_that_gives_no_parameter_a_gradient_stops_the_run(tmp_path):
    def detached(model, batch) -> LossOutput:
        out = _loss(model, batch)
        return LossOutput(out.loss.detach().requires_grad_(), out.n_tokens)

    cfg = TrainConfig(max_steps=2, warmup_steps=0, log_every=1, prefetch=0)
    model = Transformer(ModelConfig(vocab_size=100, **TINY_DECODER))
    with MetricsLogger(tmp_path) as log:
        loop = Loop(model, detached, _Poisoned(set()), cfg, tmp_path, LoopSpec(saved=lambda: Saved(model, {})),
                    dist=DistInfo(), device=torch.device("cpu"), log=log)  # fmt: skip
        with pytest.raises(LMForgeError, match="gave no trainable parameter a gradient"):
            loop.train_step()
