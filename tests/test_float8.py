"""train.float8 (`lmforge.train.float8`): which Linear layers convert, and the one-line refusals where float8 cannot
run (CPU, an older GPU, precision=fp32, no torchao). Its speed and loss on GPUs are measured in bench/README.md;
here only the conversion of a tiny model on the CPU, when torchao happens to be installed."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from training_testing import run_main

from lmforge.errors import LMForgeError
from lmforge.models import Transformer, get_preset
from lmforge.train import float8

CUDA = torch.device("cuda")


def cfg(**kw) -> SimpleNamespace:
    return SimpleNamespace(**{"precision": "auto", "parallel": "ddp", **kw})


def block_linears() -> list[str]:
    return [f"decoder.blocks.{i}.{n}" for i in range(2) for n in ("attn.qkv", "attn.o", "mlp.up", "mlp.down")]


@pytest.fixture
def gpu(monkeypatch):
    """Pretend the run's GPU has float8 tensor cores (compute capability 9.0)."""
    monkeypatch.setattr(float8, "_capability", lambda device: (9, 0))


def test_the_filter_takes_the_block_linears_and_never_the_head():
    model = Transformer(get_preset("gpt-tiny"))
    assert float8.float8_linears(model) == block_linears()
    assert isinstance(model.lm_head, nn.Linear) and "lm_head" not in float8.float8_linears(model)


def test_the_filter_skips_linears_whose_shape_is_not_a_multiple_of_16():
    model = Transformer(get_preset("gpt-tiny"))
    model.decoder.blocks[0].mlp.up = nn.Linear(64, 250)
    names = float8.float8_linears(model)
    assert "decoder.blocks.0.mlp.up" not in names and len(names) == 7


def test_a_model_without_a_qualifying_linear_is_refused(gpu):
    model = nn.Sequential(nn.Linear(64, 64))  # no transformer block
    with pytest.raises(LMForgeError, match=r"^train.float8: no Linear layer of the model's transformer blocks"):
        float8.to_float8(model, cfg(), CUDA)


def test_cpu_older_gpus_and_fp32_are_refused_in_one_line(monkeypatch):
    model = Transformer(get_preset("gpt-tiny"))
    with pytest.raises(LMForgeError) as e:
        float8.to_float8(model, cfg(), torch.device("cpu"))
    assert str(e.value) == (
        "train.float8 needs a CUDA GPU of compute capability 8.9 or higher (Hopper/Ada); this run is on cpu"
    )
    monkeypatch.setattr(float8, "_capability", lambda device: (8, 0))
    with pytest.raises(LMForgeError) as e:
        float8.to_float8(model, cfg(), CUDA)
    assert str(e.value) == (
        "train.float8 needs a CUDA GPU of compute capability 8.9 or higher (Hopper/Ada); "
        "this run's GPU has compute capability 8.0"
    )
    with pytest.raises(LMForgeError, match=r"^train.float8 trains under bf16 autocast: .* not fp32$"):
        float8.to_float8(model, cfg(precision="fp32"), CUDA)
    assert float8.float8_linears(model) == block_linears()  # nothing converted


def test_without_torchao_the_line_names_the_float8_extra(monkeypatch, gpu):
    monkeypatch.setitem(sys.modules, "torchao", None)  # an import of torchao now fails; find_spec answers None
    with pytest.raises(LMForgeError) as e:
        float8.to_float8(Transformer(get_preset("gpt-tiny")), cfg(), CUDA)
    assert str(e.value) == (
        "train.float8 needs torchao, which is not installed (lmforge's `float8` extra): pip install 'torchao>=0.10'"
    )


def test_pretrain_with_float8_on_cpu_is_one_error_line_and_exit_2(prepared_docs, tmp_path, capsys, torch_globals):
    tok, data = prepared_docs(24)
    capsys.readouterr()  # the fixture's tokenizer and preparation lines
    rc, _, err = run_main(
        capsys, "pretrain", "gpt", f"--run.dir={tmp_path / 'run'}", f"--data.tokenizer={tok}",
        f"--data.prepared={data}", "--model.preset=gpt-tiny", "--model.vocab_size=512", "--train.batch_size=4",
        "--train.seq_len=32", "--train.max_steps=2", "--train.device=cpu", "--train.float8", "--quiet",
    )  # fmt: skip
    assert rc == 2, err
    assert err == (
        "error: train.float8 needs a CUDA GPU of compute capability 8.9 or higher (Hopper/Ada); this run is on cpu\n"
    )


def test_conversion_swaps_exactly_the_block_linears(gpu):
    pytest.importorskip("torchao")
    from torchao.float8.float8_linear import Float8Linear

    model = Transformer(get_preset("gpt-tiny"))
    float8.to_float8(model, cfg(), CUDA)  # the conversion itself runs on the CPU; only the matmuls need the GPU
    converted = [n for n, m in model.named_modules() if isinstance(m, Float8Linear)]
    assert converted == block_linears()
    assert type(model.lm_head) is nn.Linear
    assert float8.float8_linears(model) == []  # converted layers are not converted again
    sharded = float8.float8_config(cfg(parallel="fsdp"))
    assert sharded.enable_fsdp_float8_all_gather and not float8.float8_config(cfg()).enable_fsdp_float8_all_gather


def test_the_torchao_version_is_read_from_its_leading_numbers():
    # force_recompute_fp8_weight_in_bwd is set only before torchao 0.12, where it became a no-op with a warning
    assert float8._version(SimpleNamespace(__version__="0.11.0+cu126")) == (0, 11)
    assert float8._version(SimpleNamespace(__version__="0.18.0")) == (0, 18)
    assert float8._version(SimpleNamespace()) == (0, 0)
