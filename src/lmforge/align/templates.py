"""Instruction and chat templates: a conversation → token ids + labels with the loss on response tokens only.

- "alpaca" (Taori et al. 2023, Stanford Alpaca): the fixed preamble, `### Instruction:` / `### Input:` /
  `### Response:` sections; the response ends with the tokenizer's EOS.
- "chat": role markers `<|system|>`, `<|user|>`, `<|assistant|>` before each turn (Zephyr-style), every turn
  closed by the tokenizer's EOS. `add_role_tokens` adds the markers to the tokenizer as special tokens (one id
  each, never split or merged with text) and grows the model's embedding table to fit.

Both start with the family's BOS where it has one (Llama `<s>`, BART `<s>`, BERT `[CLS]`; GPT-2's
`<|endoftext|>` is its EOS, so GPT sequences start directly). Labels follow the Hugging Face convention:
`labels[t]` is `input_ids[t]` on assistant tokens (content + closing EOS) and -100 everywhere else; the loss
shifts them (position t predicts labels[t + 1])."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from torch import nn

from lmforge.errors import LMForgeError

Role = Literal["system", "user", "assistant"]
TemplateName = Literal["alpaca", "chat"]
IGNORE = -100
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")

ALPACA_PREAMBLE = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request."
)
ALPACA_PREAMBLE_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request."
)


@dataclass
class Message:
    role: Role
    content: str


@dataclass
class Conversation:
    """An optional system message, then user/assistant turns; training examples end with an assistant turn."""

    messages: list[Message]
    input: str | None = None
    """Alpaca's optional context of the first instruction (rendered under `### Input:`)."""
    id: str | None = None
    meta: dict = field(default_factory=dict)

    @classmethod
    def instruction(cls, instruction: str, output: str | None, input: str | None = None, **kw) -> Conversation:
        """One instruction (+ optional input) and, for training, its response."""
        msgs = [Message("user", instruction)] + ([Message("assistant", output)] if output is not None else [])
        return cls(msgs, input or None, **kw)

    def prompt(self) -> Conversation:
        """The conversation without its final assistant turn (what generation starts from)."""
        msgs = self.messages[:-1] if self.messages and self.messages[-1].role == "assistant" else self.messages
        return Conversation(list(msgs), self.input, self.id, dict(self.meta))

    @property
    def response(self) -> str | None:
        last = self.messages[-1] if self.messages else None
        return last.content if last is not None and last.role == "assistant" else None


def check_turns(messages: list[Message], where: str) -> None:
    """Raise LMForgeError unless messages are [system] user assistant user assistant ... (ending anywhere)."""
    if not messages:
        raise LMForgeError(f"{where}: a conversation needs at least one message")
    body = messages[1:] if messages[0].role == "system" else messages
    for i, m in enumerate(body):
        want = "user" if i % 2 == 0 else "assistant"
        if m.role != want:
            raise LMForgeError(
                f"{where}: message {i + len(messages) - len(body)} has role '{m.role}', expected '{want}'"
            )


@dataclass
class Encoded:
    """One tokenized training example."""

    input_ids: list[int]
    labels: list[int]
    """input_ids on response tokens, -100 elsewhere (same length)."""


@dataclass
class Piece:
    """A run of tokens of a rendered conversation."""

    ids: list[int]
    trained: bool = False
    """Response tokens: scored by the loss."""
    cut: bool = False
    """Prompt text that may be shortened when the example is too long (user content, Alpaca input)."""


def _shorten(pieces: list[Piece], excess: int) -> None:
    """Drop `excess` tokens from the ends of the longest cuttable pieces (longest first)."""
    for p in sorted((p for p in pieces if p.cut), key=lambda p: -len(p.ids)):
        if excess <= 0:
            return
        take = min(excess, len(p.ids))
        p.ids = p.ids[: len(p.ids) - take]
        excess -= take


class Template:
    """Renders conversations as token pieces; subclasses define the pieces."""

    name: str = ""

    def __init__(self, tokenizer) -> None:
        if tokenizer.eos_id is None:
            raise LMForgeError("instruction templates need a tokenizer with an EOS token")
        self.tokenizer = tokenizer
        self.eos = tokenizer.eos_id
        # GPT-2's single special token is both BOS and EOS; it only closes texts there.
        bos = tokenizer.bos_id
        self.bos = [bos] if bos is not None and bos != self.eos else []

    def pieces(self, conv: Conversation, generation_prompt: bool) -> list[Piece]:
        raise NotImplementedError

    def encode(self, conv: Conversation, max_len: int | None = None) -> Encoded:
        """Token ids and labels of a training conversation (it must end with an assistant turn). Longer than
        max_len tokens: prompt texts are shortened first (longest first), then the end is cut."""
        where = f"example {conv.id}" if conv.id else "example"
        check_turns(conv.messages, where)
        if conv.messages[-1].role != "assistant":
            raise LMForgeError(f"{where}: a training conversation must end with an assistant message")
        pieces = self.pieces(conv, generation_prompt=False)
        if max_len is not None:
            _shorten(pieces, sum(len(p.ids) for p in pieces) - max_len)
        ids = [t for p in pieces for t in p.ids]
        labels = [t if p.trained else IGNORE for p in pieces for t in p.ids]
        if max_len is not None:
            ids, labels = ids[:max_len], labels[:max_len]
        return Encoded(ids, labels)

    def prompt_ids(self, conv: Conversation, max_len: int | None = None) -> list[int]:
        """Token ids of a conversation's prompt up to the assistant's header: generation continues from here."""
        prompt = conv.prompt()
        check_turns(prompt.messages, f"example {conv.id}" if conv.id else "prompt")
        pieces = self.pieces(prompt, generation_prompt=True)
        if max_len is not None:
            _shorten(pieces, sum(len(p.ids) for p in pieces) - max_len)
        return [t for p in pieces for t in p.ids]

    def _text(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)


class AlpacaTemplate(Template):
    """Stanford Alpaca's prompt (with and without input); later turns repeat Instruction/Response sections."""

    name = "alpaca"

    def pieces(self, conv: Conversation, generation_prompt: bool) -> list[Piece]:
        msgs = conv.messages
        system = msgs[0].content if msgs and msgs[0].role == "system" else None
        turns = msgs[1:] if system is not None else msgs
        preamble = system or (ALPACA_PREAMBLE_INPUT if conv.input else ALPACA_PREAMBLE)
        out: list[Piece] = []
        for i, m in enumerate(turns):
            if m.role == "user":
                head = (f"{preamble}\n\n" if i == 0 else "") + "### Instruction:\n"
                out += [
                    Piece(self.bos if i == 0 else []),
                    Piece(self._text(head)),
                    Piece(self._text(m.content), cut=True),
                ]
                if i == 0 and conv.input:
                    out += [Piece(self._text("\n\n### Input:\n")), Piece(self._text(conv.input), cut=True)]
                out.append(Piece(self._text("\n\n### Response:\n")))
            else:  # later turns need no separator: the EOS closes the response
                out.append(Piece(self._text(m.content) + [self.eos], trained=True))
        return out


class ChatTemplate(Template):
    """`<|role|>` + newline + content + EOS per turn; the prompt for generation ends with `<|assistant|>\\n`."""

    name = "chat"

    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer)
        ids = {t: tokenizer.token_to_id(t) for t in ROLE_TOKENS}
        # Without the special tokens the markers are plain text (several tokens each), which still works.
        self.markers = {t: ([i] if i is not None else self._text(t)) for t, i in ids.items()}
        self.newline = self._text("\n")

    def _header(self, role: str) -> Piece:
        return Piece(self.markers[f"<|{role}|>"] + self.newline)

    def pieces(self, conv: Conversation, generation_prompt: bool) -> list[Piece]:
        out = [Piece(list(self.bos))]
        first_user = True
        for m in conv.messages:
            out.append(self._header(m.role))
            if m.role == "assistant":
                out.append(Piece(self._text(m.content) + [self.eos], trained=True))
                continue
            out.append(Piece(self._text(m.content), cut=True))
            if m.role == "user" and first_user and conv.input:
                out.append(Piece(self._text("\n\n")))
                out.append(Piece(self._text(conv.input), cut=True))
            first_user = first_user and m.role != "user"
            out.append(Piece([self.eos]))
        if generation_prompt:
            out.append(self._header("assistant"))
        return out


TEMPLATES: dict[str, type[Template]] = {"alpaca": AlpacaTemplate, "chat": ChatTemplate}


def get_template(name: str, tokenizer) -> Template:
    if name not in TEMPLATES:
        raise LMForgeError(f"unknown template '{name}' (known: {', '.join(TEMPLATES)})")
    return TEMPLATES[name](tokenizer)


def add_role_tokens(model: nn.Module, tokenizer) -> list[int]:
    """Add the chat role markers as special tokens (those the tokenizer lacks) and grow the model to fit."""
    from lmforge.tasks.inputs import add_task_tokens

    return add_task_tokens(model, tokenizer, ROLE_TOKENS)
