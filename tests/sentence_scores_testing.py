"""Helpers of the sentence-scoring tests: a brute-force pseudo-log-likelihood and a saved ELECTRA run."""

import dataclasses
from pathlib import Path

import tasks_testing as T
import torch

from lmforge.checkpoint.write import save_checkpoint
from lmforge.models import get_preset
from lmforge.objectives.electra import ElectraModel, generator_config


def logp(logits: torch.Tensor, token: int) -> float:
    return float(logits.double().log_softmax(-1)[token])


@torch.no_grad()
def pll_by_hand(model, tok, text: str, window: int) -> tuple[float, int]:
    """Salazar et al.'s PLL, one forward per masked copy: [CLS] window [SEP], token j masked, log P(token j)."""
    ids, total = tok.encode(text), 0.0
    for s in range(0, len(ids), window):
        framed = [tok.cls_id] + ids[s : s + window] + [tok.sep_id]
        for j in range(1, len(framed) - 1):
            x = list(framed)
            x[j] = tok.mask_id
            total += logp(model(torch.tensor([x])).logits[0, j], framed[j])
    return total, len(ids)


def electra_run(root: Path, scale: float = 0.5) -> tuple[Path, ElectraModel]:
    """An ELECTRA pretraining checkpoint (discriminator + generator with shared embeddings), as a run saves it."""
    tok = T.tokenizer("bert")
    disc = get_preset("electra-tiny", vocab_size=tok.vocab_size, dropout=0.0, attn_dropout=0.0)
    disc.pad_id = tok.pad_id
    torch.manual_seed(2)
    pair = ElectraModel(disc, generator_config(disc, scale, None)).eval()
    config = {"model": dataclasses.asdict(disc), "objective": {"name": "electra", "generator_scale": scale}}
    save_checkpoint(root, 4, pair, config=config, tokenizer=tok)
    return root, pair
