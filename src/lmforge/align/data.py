"""Instruction and preference data files (JSON lines, optionally .gz/.xz/.bz2 compressed).

Instruction records, one per line, in either form:

    {"instruction": "...", "input": "... (optional)", "output": "..."}
    {"messages": [{"role": "system" | "user" | "assistant", "content": "..."}, ...]}

An optional `"choices"` list names the candidate responses of a closed question (e.g. the label words of a
classification instruction); evaluation then also reports which candidate the model scores highest.

Preference records: a prompt in either form (without the response: `instruction` [+ `input`], or `messages`
ending with a user turn) plus `"chosen"` and `"rejected"` responses. An optional `"id"` names the record.
Every malformed line raises one `file:line: ...` error."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from lmforge.align.templates import Conversation, Message, check_turns
from lmforge.data.labelled.readers import fail, read_jsonl
from lmforge.errors import LMForgeError

ROLES = ("system", "user", "assistant")


@dataclass
class PreferencePair:
    """A prompt with a preferred (chosen) and a dispreferred (rejected) response."""

    prompt: Conversation
    chosen: str
    rejected: str
    id: str | None = None

    def conversation(self, which: str) -> Conversation:
        """The prompt followed by the chosen or rejected response."""
        response = self.chosen if which == "chosen" else self.rejected
        msgs = self.prompt.messages + [Message("assistant", response)]
        return Conversation(msgs, self.prompt.input, self.id)


def _string(path: Path, line: int, obj: dict, key: str, required: bool = True) -> str | None:
    value = obj.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        what = "is missing" if value is None else f"must be a string, got {type(value).__name__}"
        raise fail(path, line, f"field '{key}' {what}")
    return value


def _messages(path: Path, line: int, raw: object) -> list[Message]:
    if not isinstance(raw, list) or not raw:
        raise fail(path, line, "field 'messages' must be a non-empty list")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise fail(
                path, line, f"message {i} must be an object with a role ({', '.join(ROLES)}) and a content string"
            )
        out.append(Message(m["role"], m["content"]))
    try:
        check_turns(out, "messages")
    except LMForgeError as e:
        raise fail(path, line, str(e)) from None
    return out


def _prompt(path: Path, line: int, obj: dict, with_response: bool) -> Conversation:
    rid = obj.get("id")
    rid = str(rid) if rid is not None else f"{path.name}:{line}"
    if "messages" in obj:
        msgs = _messages(path, line, obj["messages"])
        last = msgs[-1].role
        if with_response and last != "assistant":
            raise fail(path, line, "the last message must be the assistant's response")
        if not with_response and last != "user":
            raise fail(path, line, "a preference prompt's messages must end with a user message")
        return Conversation(msgs, id=rid)
    if "instruction" not in obj:
        raise fail(path, line, "expected 'instruction' (+ 'input', 'output') or 'messages'")
    instruction = _string(path, line, obj, "instruction")
    output = _string(path, line, obj, "output") if with_response else None
    return Conversation.instruction(instruction, output, _string(path, line, obj, "input", required=False), id=rid)


def _choices(path: Path, line: int, obj: dict, conv: Conversation) -> Conversation:
    raw = obj.get("choices")
    if raw is None:
        return conv
    if not isinstance(raw, list) or len(raw) < 2 or not all(isinstance(c, str) for c in raw):
        raise fail(path, line, "field 'choices' must be a list of at least two strings")
    if conv.response not in raw:
        raise fail(path, line, "the response is not one of the 'choices'")
    conv.meta["choices"] = list(raw)
    return conv


def read_instructions(path: str | Path) -> list[Conversation]:
    """Training conversations from an instruction JSON-lines file."""
    path = Path(path)
    out = [_choices(path, n, obj, _prompt(path, n, obj, with_response=True)) for n, obj in read_jsonl(path)]
    if not out:
        raise LMForgeError(f"{path}: no instruction records")
    return out


def read_preferences(path: str | Path) -> list[PreferencePair]:
    """Preference pairs from a JSON-lines file."""
    path = Path(path)
    out = []
    for n, obj in read_jsonl(path):
        prompt = _prompt(path, n, obj, with_response=False)
        chosen, rejected = _string(path, n, obj, "chosen"), _string(path, n, obj, "rejected")
        if chosen == rejected:
            raise fail(path, n, "'chosen' and 'rejected' are the same response")
        out.append(PreferencePair(prompt, chosen, rejected, prompt.id))
    if not out:
        raise LMForgeError(f"{path}: no preference records")
    return out


def read_prompts(path: str | Path) -> list[Conversation]:
    """The prompts of an instruction or a preference file (responses, `chosen` and `rejected` are ignored; a
    `messages` list may end with the assistant's response, which is dropped)."""
    path = Path(path)
    out = []
    for n, obj in read_jsonl(path):
        msgs = obj.get("messages")
        if isinstance(msgs, list) and msgs and isinstance(msgs[-1], dict) and msgs[-1].get("role") == "assistant":
            obj = {**obj, "messages": msgs[:-1]}
        out.append(_prompt(path, n, obj, with_response=False))
    if not out:
        raise LMForgeError(f"{path}: no prompts")
    return out


def conversation_record(conv: Conversation) -> dict:
    """The JSON record of a conversation: instruction form when it is one instruction and its response."""
    m = conv.messages
    rec: dict = {"id": conv.id} if conv.id else {}
    extra = {"choices": conv.meta["choices"]} if "choices" in conv.meta else {}
    if len(m) == 2 and m[0].role == "user" and m[1].role == "assistant":
        rec |= {"instruction": m[0].content}
        if conv.input:
            rec["input"] = conv.input
        return rec | {"output": m[1].content} | extra
    if conv.input:
        raise LMForgeError("a multi-turn conversation cannot carry an Alpaca 'input' field")
    return rec | {"messages": [{"role": x.role, "content": x.content} for x in m]} | extra


def preference_record(pair: PreferencePair) -> dict:
    rec = conversation_record(pair.conversation("chosen"))
    rec.pop("output", None)
    rec.pop("choices", None)
    if "messages" in rec:
        rec["messages"] = rec["messages"][:-1]
    return rec | {"chosen": pair.chosen, "rejected": pair.rejected}


def write_jsonl(path: str | Path, records: list[dict]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return path
