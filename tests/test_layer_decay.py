"""Layer-wise learning-rate decay: which depth each parameter has in every family, the learning rate of each
group through the warmup/decay schedule, and a fine-tuning run's optimizer built with it."""

import pytest
import tasks_testing as T
import torch

from lmforge.models import Transformer, get_preset
from lmforge.pretraining.config import TrainConfig
from lmforge.tasks.heads import SequenceHead
from lmforge.tasks.model import TaskModel
from lmforge.train.optim import Schedule, build_optimizer, layer_depths, param_groups


def _depth_of(depths: dict[str, int], fragment: str) -> set[int]:
    return {d for n, d in depths.items() if fragment in n}


@pytest.mark.parametrize("preset", ["bert-tiny", "gpt-tiny", "t5-tiny", "albert-tiny"])
def test_depths_follow_the_path_of_the_input(preset):
    model = Transformer(get_preset(preset))
    depths, n_layers = layer_depths(model)
    assert set(depths) == {n for n, _ in model.named_parameters()}
    assert _depth_of(depths, "tok_emb.") == {0}
    cfg = model.config
    if preset == "albert-tiny":  # one shared block: L = 1
        assert n_layers == 1 and _depth_of(depths, ".blocks.") == {1}
    elif preset == "t5-tiny":  # encoder blocks first, then the decoder's
        assert n_layers == cfg.n_layers + cfg.decoder_layers
        assert _depth_of(depths, "encoder.blocks.0.") == {1} and _depth_of(depths, "decoder.blocks.0.") == {
            cfg.n_layers + 1
        }
        assert _depth_of(depths, "encoder.rel_bias") == {0}
        assert _depth_of(depths, "encoder.final_norm") == {cfg.n_layers + 1}  # between the stacks
    else:
        stack = "encoder" if cfg.arch == "encoder" else "decoder"
        assert n_layers == cfg.n_layers
        for i in range(cfg.n_layers):
            assert _depth_of(depths, f"{stack}.blocks.{i}.") == {i + 1}
    above = {d for n, d in depths.items() if n.startswith(("decoder.final_norm", "lm_head", "pooler"))}
    above |= {d for n, d in depths.items() if n.startswith("encoder.final_norm") and cfg.arch == "encoder"}
    assert above == {n_layers + 1}
    if preset == "bert-tiny":  # learned positions, segments and the embedding norm sit with the tokens
        assert _depth_of(depths, "pos_emb") == _depth_of(depths, "type_emb") == _depth_of(depths, "emb_norm") == {0}


def test_group_learning_rates_and_their_schedule():
    tok = T.tokenizer("bert")
    backbone = T.model("bert-tiny", tok)
    model = TaskModel(backbone, SequenceHead(backbone.config.d_model, 2, dropout=0.0), "bert")
    L, lr, decay = backbone.config.n_layers, 1e-3, 0.5
    groups = param_groups(model, 0.01, lr, decay)
    by_param = {id(p): g for g in groups for p in g["params"]}
    named = dict(model.named_parameters())
    assert by_param[id(named["head.out.weight"])]["lr"] == lr
    assert by_param[id(named[f"backbone.encoder.blocks.{L - 1}.attn.qkv.weight"])]["lr"] == lr * decay
    assert by_param[id(named["backbone.encoder.blocks.0.attn.qkv.weight"])]["lr"] == lr * decay**L
    assert by_param[id(named["backbone.tok_emb.weight"])]["lr"] == lr * decay ** (L + 1)
    assert by_param[id(named["backbone.tok_emb.weight"])]["weight_decay"] == 0.0  # embeddings are not decayed
    assert by_param[id(named["backbone.encoder.blocks.0.attn.qkv.weight"])]["weight_decay"] == 0.01
    assert sum(len(g["params"]) for g in groups) == len(named)  # every parameter once

    cfg = TrainConfig(max_steps=10, lr=lr, warmup_steps=2, schedule="linear", min_lr_ratio=0.0, layer_decay=decay)
    opt = build_optimizer(model, cfg, torch.device("cpu"))
    sched = Schedule(opt, cfg, cfg.max_steps)
    for _ in range(3):  # warmup done: factor 1 - 1/8
        opt.step()
        sched.step()
    factor = 1 - 1 / 8
    assert sorted({round(g["lr"] / factor, 12) for g in opt.param_groups}) == sorted(
        {round(lr * decay**k, 12) for k in range(L + 2)}
    )
    plain = build_optimizer(model, TrainConfig(lr=lr), torch.device("cpu"))  # off: the two groups of before, one lr
    assert len(plain.param_groups) == 2 and {g["lr"] for g in plain.param_groups} == {lr}


def test_finetuning_builds_its_optimizer_with_layer_decay(tmp_path):
    from lmforge.finetuning.run import FineTuner
    from lmforge.tasks.config import load_finetune_config

    data = T.write_labelled_dir(tmp_path / "d", {"train": T.sentiment(40), "dev": T.sentiment(16, seed=3)})
    over = [f"--run.dir={tmp_path / 'run'}", "--data.source=dir", f"--data.dir={data}", "--train.lr=1e-3",
            "--train.layer_decay=0.5", "--train.batch_size=8", "--model.vocab_size=200"]  # fmt: skip
    tuner = FineTuner(load_finetune_config("sst2-bert", over))
    tuner.lock.release()
    lrs = sorted({g["base_lr"] for g in tuner.loop.optimizer.param_groups})
    L = tuner.model.config.n_layers
    assert lrs == pytest.approx(sorted(1e-3 * 0.5**k for k in range(L + 2)))
