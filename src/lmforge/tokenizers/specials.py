"""Special-token conventions of each model family (which tokens, at which ids, in which role)."""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

Family = Literal["gpt", "bert", "t5", "bart", "llama"]

FAMILIES: tuple[str, ...] = typing.get_args(Family)
ROLES: tuple[str, ...] = ("bos", "eos", "pad", "unk", "mask", "cls", "sep")

# The family of a tokenizer trained for a model of each architecture, when the run names none.
FAMILY_BY_ARCH: dict[str, str] = {"decoder": "gpt", "encoder": "bert", "encoder-decoder": "t5"}

N_T5_SENTINELS = 100


def sentinel_token(i: int) -> str:
    """The text of T5 sentinel ``i`` (``<extra_id_i>``)."""
    return f"<extra_id_{i}>"


@dataclass(frozen=True)
class FamilySpec:
    """Special tokens of a family: those at the start of the vocab, those at its end, and their roles."""

    name: str
    leading: tuple[str, ...]
    """Tokens at ids 0..k-1, in this order."""
    trailing: tuple[str, ...] = ()
    """Tokens appended after the learned vocabulary, in increasing id order."""
    roles: dict[str, str] = field(default_factory=dict)
    """Role (one of ROLES) -> token text; families without a pad token pad with eos."""
    template: tuple[str, str] | None = None
    """(single, pair) TemplateProcessing strings used when a Hugging Face tokenizer adds specials."""
    lstrip: frozenset[str] = frozenset()
    """Tokens that swallow the space before them (RoBERTa/BART ``<mask>``)."""

    @property
    def tokens(self) -> tuple[str, ...]:
        return self.leading + self.trailing

    def with_unk(self) -> FamilySpec:
        """This spec with an ``<unk>`` token added when it has none (WordPiece and Unigram need one)."""
        if "unk" in self.roles:
            return self
        return FamilySpec(
            name=self.name,
            leading=(*self.leading, "<unk>"),
            trailing=self.trailing,
            roles={**self.roles, "unk": "<unk>"},
            template=self.template,
            lstrip=self.lstrip,
        )


SPECS: dict[str, FamilySpec] = {
    # GPT-2: one token serves as bos, eos and (by convention here) pad; byte-level BPE never needs unk.
    "gpt": FamilySpec(
        name="gpt",
        leading=("<|endoftext|>",),
        roles={"bos": "<|endoftext|>", "eos": "<|endoftext|>", "pad": "<|endoftext|>"},
    ),
    # BERT: [CLS] doubles as bos and [SEP] as eos (as <s> and </s> do in RoBERTa/BART), so packed
    # pretraining documents are separated by [SEP].
    "bert": FamilySpec(
        name="bert",
        leading=("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"),
        roles={
            "bos": "[CLS]",
            "eos": "[SEP]",
            "pad": "[PAD]",
            "unk": "[UNK]",
            "mask": "[MASK]",
            "cls": "[CLS]",
            "sep": "[SEP]",
        },
        template=("[CLS] $A [SEP]", "[CLS] $A [SEP] $B:1 [SEP]:1"),
    ),
    # T5 (Raffel et al. 2020): sentinels sit at the end of the vocab, <extra_id_0> at the highest id.
    "t5": FamilySpec(
        name="t5",
        leading=("<pad>", "</s>", "<unk>"),
        trailing=tuple(sentinel_token(i) for i in reversed(range(N_T5_SENTINELS))),
        roles={"pad": "<pad>", "eos": "</s>", "unk": "<unk>"},
        template=("$A </s>", "$A </s> $B </s>"),
    ),
    # BART/RoBERTa: <s> <pad> </s> <unk> at ids 0..3 and <mask> as the last id.
    "bart": FamilySpec(
        name="bart",
        leading=("<s>", "<pad>", "</s>", "<unk>"),
        trailing=("<mask>",),
        roles={
            "bos": "<s>",
            "eos": "</s>",
            "pad": "<pad>",
            "unk": "<unk>",
            "mask": "<mask>",
            "cls": "<s>",
            "sep": "</s>",
        },
        template=("<s> $A </s>", "<s> $A </s> </s> $B </s>"),
        lstrip=frozenset({"<mask>"}),
    ),
    # Llama's SentencePiece order: <unk>=0, <s>=1, </s>=2; it has no pad token, so eos pads.
    "llama": FamilySpec(
        name="llama",
        leading=("<unk>", "<s>", "</s>"),
        roles={"unk": "<unk>", "bos": "<s>", "eos": "</s>", "pad": "</s>"},
        template=("<s> $A", "<s> $A <s> $B"),
    ),
}


def infer_family(token_to_id: Callable[[str], int | None]) -> str | None:
    """The family whose special tokens are all in a vocabulary (the one with most of them wins)."""
    best, best_n = None, 0
    for name, spec in SPECS.items():
        # T5 is told apart from Llama (same three tokens) by its first sentinel.
        core = spec.leading + (spec.trailing[-1:] if name == "t5" else spec.trailing)
        if all(token_to_id(t) is not None for t in core) and len(core) > best_n:
            best, best_n = name, len(core)
    return best
