"""Prompt-based classification with a masked LM's own head (PET, Schick & Schütze 2021; LM-BFF, Gao et al. 2021).

Each text is put into a template with one mask token, e.g. `<s> {text} It was <mask>. </s>`, and each label has one
word (the verbalizer: negative → " terrible", positive → " great"). A label's logit is the LM head's logit of its word
at the mask, so the classifier starts from what pretraining learnt instead of a randomly drawn layer, and fine-tuning
trains the whole encoder with cross-entropy over the label words alone (`task.format: prompt`; encoders with an LM
head)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lmforge.errors import LMForgeError

TEXT, MASK = "{text}", "{mask}"
DEFAULT_TEMPLATE = "{text} It was {mask}."


@dataclass
class Prompt:
    """A template as token ids around the text, and each label's word id."""

    before: list[int]
    """Template tokens before the text (the mask among them when it comes first)."""
    after: list[int]
    """Template tokens after the text."""
    mask_at: int
    """The mask's index in before + after."""
    word_ids: list[int]
    """One token id per label, in label order."""
    text_prefix: str = ""
    """Put before each text as it is tokenised: the template's space before {text}."""

    def frame(self, text: list[int]) -> tuple[list[int], int]:
        """The template's ids around `text` (already cut to fit), and the mask's index in them."""
        at = self.mask_at if self.mask_at < len(self.before) else self.mask_at + len(text)
        return self.before + text + self.after, at

    @property
    def n_tokens(self) -> int:
        return len(self.before) + len(self.after)


def _pieces(template: str) -> list[str]:
    """The template cut at {text} and {mask}, each kept as a piece of its own; each must occur exactly once."""
    for slot in (TEXT, MASK):
        if template.count(slot) != 1:
            raise LMForgeError(f"task.template: must hold {slot} exactly once, got {template!r}")
    return re.split(r"(\{text\}|\{mask\})", template)


def _encode(pieces: list[str], tokenizer) -> tuple[list[int], int | None]:
    """Token ids of template pieces on one side of the text, and the mask's index among them (None: not there)."""
    ids: list[int] = []
    at = None
    for piece in pieces:
        if piece == MASK:
            at = len(ids)
            ids.append(tokenizer.mask_id)
        elif piece:
            ids += tokenizer.encode(piece)
    return ids, at


def label_words(labels: list[str], verbalizer: list[str] | None) -> list[str]:
    """Each label's word, in label order: `LABEL=WORD` items (comma-separated items are split), else the label names
    themselves."""
    if not verbalizer:
        return list(labels)
    words: dict[str, str] = {}
    for item in (part.strip() for entry in verbalizer for part in entry.split(",")):
        label, eq, word = item.partition("=")
        label, word = label.strip(), word.strip()
        if not eq or not label or not word:
            raise LMForgeError(f"task.verbalizer: expected LABEL=WORD items, got {item!r}")
        if label not in labels:
            raise LMForgeError(f"task.verbalizer: '{label}' is not a label of the data ({', '.join(labels)})")
        if label in words:
            raise LMForgeError(f"task.verbalizer: label '{label}' is given twice")
        words[label] = word
    missing = [x for x in labels if x not in words]
    if missing:
        raise LMForgeError(f"task.verbalizer: no word for label '{missing[0]}' (labels: {', '.join(labels)})")
    return [words[x] for x in labels]


def build_prompt(template: str, labels: list[str], verbalizer: list[str] | None, tokenizer) -> Prompt:
    """Tokenise a template and its label words. A space right before {mask} belongs to the word, and one right before
    {text} to the text, as words inside running text are tokenised (byte-level BPE: " great" is one token, "great"
    another); every label word must be one token and the words distinct."""
    if tokenizer.mask_id is None:
        raise LMForgeError("task.format=prompt needs a tokenizer with a mask token (a masked LM's)")
    pieces = _pieces(template)
    spaced = {}
    for slot in (MASK, TEXT):
        i = pieces.index(slot)
        spaced[slot] = i > 0 and pieces[i - 1].endswith(" ")
        if spaced[slot]:
            pieces[i - 1] = pieces[i - 1][:-1]
    t = pieces.index(TEXT)
    (before, in_before), (after, in_after) = _encode(pieces[:t], tokenizer), _encode(pieces[t + 1 :], tokenizer)
    mask_at = in_before if in_before is not None else len(before) + in_after
    words = label_words(labels, verbalizer)
    ids = []
    for label, word in zip(labels, words):
        tokens = tokenizer.encode((" " if spaced[MASK] else "") + word)
        if len(tokens) != 1:
            raise LMForgeError(
                f"task.verbalizer: label '{label}' has the word {word!r}, which is {len(tokens)} tokens for this "
                "tokenizer; each label word must be one token (`lmforge tokenizer encode RUN --text ' WORD'` shows "
                "the tokens: choose another word, or pretrain with a larger data.vocab_size)"
            )
        ids.append(tokens[0])
    if len(set(ids)) != len(ids):
        raise LMForgeError(f"task.verbalizer: two labels share a word ({', '.join(words)})")
    return Prompt(before, after, mask_at, ids, " " if spaced[TEXT] else "")


class VerbalizerHead(nn.Module):
    """Label logits from the backbone's LM head at each sequence's mask position: the logit of each label's word."""

    def __init__(self, word_ids: list[int]) -> None:
        super().__init__()
        self.register_buffer("word_ids", torch.tensor(word_ids, dtype=torch.long), persistent=False)

    def forward(self, hidden: Tensor, mask_pos: Tensor, backbone: nn.Module) -> Tensor:
        at = hidden[torch.arange(hidden.shape[0], device=hidden.device), mask_pos]  # (B, d)
        return backbone.logits(at).index_select(-1, self.word_ids)  # (B, n_labels)
