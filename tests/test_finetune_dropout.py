"""`model.dropout` at fine-tuning: an encoder pretrained without dropout (cramming; `classify-nodrop`) gets it back
for fine-tuning, in every residual, embedding and attention dropout, and keeps none when the key is left out."""

import dataclasses

import tasks_testing as T
import torch

from lmforge.checkpoint.write import write_checkpoint_dir
from lmforge.finetuning.run import FineTuner
from lmforge.models import Transformer, get_preset
from lmforge.tasks.config import load_finetune_config


def backbone_after(tmp_path, pre, data, run: str, *extra: str) -> torch.nn.Module:
    over = [f"--run.dir={tmp_path / run}", "--data.source=dir", f"--data.dir={data}", *extra]
    tuner = FineTuner(load_finetune_config("sst2-bert", over, init=str(pre)))
    tuner.session.close()
    return tuner.model.backbone


def two_passes(backbone: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    backbone.train()
    return backbone(ids).last_hidden_state, backbone(ids).last_hidden_state


def test_dropout_comes_back_at_fine_tuning_after_pretraining_without_it(tmp_path):
    tok = T.tokenizer("bart")
    torch.manual_seed(0)
    cfg = get_preset("encoder-fast-tiny", vocab_size=tok.vocab_size, pad_id=tok.pad_id, dropout=0.0, attn_dropout=0.0)
    model = Transformer(cfg)
    pre = write_checkpoint_dir(tmp_path / "pre", model, config={"model": dataclasses.asdict(cfg)}, tokenizer=tok)
    data = T.write_labelled_dir(tmp_path / "set", {"train": T.sentiment(16), "dev": T.sentiment(8, seed=1)})
    ids = torch.randint(4, tok.vocab_size, (2, 16))

    kept = backbone_after(tmp_path, pre, data, "kept")  # the pretrained model's own: none
    assert kept.config.dropout == kept.config.attn_dropout == 0.0
    first, second = two_passes(kept, ids)
    assert torch.equal(first, second)

    on = backbone_after(tmp_path, pre, data, "on", "--model.dropout=0.1")
    assert on.config.dropout == on.config.attn_dropout == 0.1
    rates = [m.p for m in on.modules() if isinstance(m, torch.nn.Dropout)]
    attn = [m.attn_dropout for m in on.modules() if isinstance(getattr(m, "attn_dropout", None), float)]
    assert rates and attn and set(rates) == set(attn) == {0.1}
    first, second = two_passes(on, ids)
    assert not torch.equal(first, second)  # dropout draws anew at each pass
    on.eval()
    assert torch.equal(on(ids).last_hidden_state, on(ids).last_hidden_state)
