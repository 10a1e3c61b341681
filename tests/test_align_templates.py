"""Instruction templates (response-only labels, role tokens, truncation) and the instruction/preference files."""

from __future__ import annotations

import json

import pytest
import torch
from tasks_testing import model, tokenizer

from lmforge.align.data import (
    conversation_record,
    preference_record,
    read_instructions,
    read_preferences,
    write_jsonl,
)
from lmforge.align.datasets import continuation_preferences, sentiment_instructions, sentiment_preferences
from lmforge.align.templates import (
    ALPACA_PREAMBLE_INPUT,
    ROLE_TOKENS,
    Conversation,
    Message,
    add_role_tokens,
    get_template,
)
from lmforge.errors import LMForgeError


def _chat_tok(family: str = "gpt"):
    tok = tokenizer(family)
    add_role_tokens(model("gpt-tiny", tok), tok)
    return tok


@pytest.mark.parametrize("name", ["alpaca", "chat"])
def test_labels_are_ignored_exactly_on_prompt_tokens(name):
    tok = _chat_tok()
    t = get_template(name, tok)
    conv = Conversation.instruction("Is this review positive or negative?", "positive", "A fine, sunny film.")
    enc = t.encode(conv)
    prompt = t.prompt_ids(conv)  # everything before the response, rendered on its own
    response = tok.encode("positive") + [tok.eos_id]
    assert enc.input_ids == prompt + response
    assert enc.labels == [-100] * len(prompt) + response


def test_only_assistant_turns_are_trained_in_a_multi_turn_chat():
    tok = _chat_tok()
    t = get_template("chat", tok)
    msgs = [
        Message("system", "Answer briefly."),
        Message("user", "Name a sister."),
        Message("assistant", "Elinor"),
        Message("user", "And another?"),
        Message("assistant", "Marianne"),
    ]
    enc = t.encode(Conversation(msgs))
    trained = [i for i, x in zip(enc.input_ids, enc.labels) if x != -100]
    assert trained == tok.encode("Elinor") + [tok.eos_id] + tok.encode("Marianne") + [tok.eos_id]
    assert all(x in (-100, i) for i, x in zip(enc.input_ids, enc.labels))
    # Each role marker is one special token; the three appear in order of the turns.
    marker_ids = [tok.token_to_id(m) for m in ROLE_TOKENS]
    seen = [i for i in enc.input_ids if i in marker_ids]
    sys_id, user_id, asst_id = marker_ids
    assert seen == [sys_id, user_id, asst_id, user_id, asst_id]


def test_alpaca_text_and_family_bos():
    tok = _chat_tok("bart")  # BART has a distinct BOS <s>
    t = get_template("alpaca", tok)
    conv = Conversation.instruction("Summarise.", "Short.", "Long text here.")
    enc = t.encode(conv)
    assert enc.input_ids[0] == tok.bos_id
    text = tok.decode(enc.input_ids, skip_special_tokens=False)
    sections = "### Instruction:\nSummarise.\n\n### Input:\nLong text here.\n\n### Response:\nShort."
    want = f"{ALPACA_PREAMBLE_INPUT}\n\n{sections}"
    assert text.replace("<s>", "").replace("</s>", "") == want
    assert enc.input_ids[-1] == tok.eos_id


def test_truncation_shortens_the_prompt_and_keeps_the_response():
    tok = _chat_tok()
    t = get_template("chat", tok)
    long_input = " ".join(["word"] * 300)
    conv = Conversation.instruction("Is this review positive or negative?", "negative", long_input)
    enc = t.encode(conv, max_len=40)
    assert len(enc.input_ids) == 40
    assert [x for x in enc.labels if x != -100] == tok.encode("negative") + [tok.eos_id]


def test_template_errors():
    tok = _chat_tok()
    t = get_template("chat", tok)
    with pytest.raises(LMForgeError, match="must end with an assistant message"):
        t.encode(Conversation([Message("user", "hi")], id="x"))
    with pytest.raises(LMForgeError, match="message 1 has role 'user', expected 'assistant'"):
        t.encode(Conversation([Message("user", "a"), Message("user", "b")]))
    with pytest.raises(LMForgeError, match="unknown template 'vicuna'"):
        get_template("vicuna", tok)


def test_instruction_file_round_trip(tmp_path):
    convs = sentiment_instructions("dev", 5)
    multi = Conversation([Message("user", "Hi"), Message("assistant", "Hello"), Message("user", "Bye")], id="m")
    multi.messages.append(Message("assistant", "Farewell"))
    path = write_jsonl(tmp_path / "i.jsonl", [conversation_record(c) for c in convs + [multi]])
    back = read_instructions(path)
    assert [c.messages for c in back] == [c.messages for c in convs + [multi]]
    assert [c.input for c in back[:5]] == [c.input for c in convs]
    assert back[0].meta["choices"] == ["negative", "positive"]
    pairs = sentiment_preferences("dev", 3)
    back_pairs = read_preferences(write_jsonl(tmp_path / "p.jsonl", [preference_record(p) for p in pairs]))
    assert [(p.chosen, p.rejected, p.prompt.input) for p in back_pairs] == [
        (p.chosen, p.rejected, p.prompt.input) for p in pairs
    ]


@pytest.mark.parametrize(
    ("record", "error"),
    [
        ({"instruction": "x"}, "field 'output' is missing"),
        ({"instruction": 3, "output": "y"}, "field 'instruction' must be a string, got int"),
        ({"text": "x"}, "expected 'instruction' (+ 'input', 'output') or 'messages'"),
        ({"messages": [{"role": "user", "content": "q"}]}, "the last message must be the assistant's response"),
        (
            {"messages": [{"role": "bot", "content": "q"}]},
            "message 0 must be an object with a role (system, user, assistant) and a content string",
        ),
        ({"instruction": "q", "output": "a", "choices": ["b", "c"]}, "the response is not one of the 'choices'"),
    ],
)
def test_malformed_instruction_lines(tmp_path, record, error):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"instruction": "ok", "output": "fine"}) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(LMForgeError) as e:
        read_instructions(path)
    assert str(e.value) == f"{path}:2: {error}"


def test_malformed_preference_lines(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"instruction": "q", "chosen": "a", "rejected": "a"}) + "\n")
    with pytest.raises(LMForgeError) as e:
        read_preferences(path)
    assert str(e.value) == f"{path}:1: 'chosen' and 'rejected' are the same response"
    path.write_text("{not json\n")
    with pytest.raises(LMForgeError, match=r"bad.jsonl:1: invalid JSON"):
        read_preferences(path)


def test_sentiment_sets_come_from_the_bundled_labels():
    from lmforge.data.labelled.readers import load_bundled

    ds = load_bundled("sentiment")["dev"]
    convs = sentiment_instructions("dev", 50)
    assert [c.input for c in convs] == [e.text for e in ds.examples[:50]]
    assert [c.response for c in convs] == [e.label for e in ds.examples[:50]]
    pairs = sentiment_preferences("dev", 50)
    assert all({p.chosen, p.rejected} == {"positive", "negative"} for p in pairs)
    assert [p.chosen for p in pairs] == [e.label for e in ds.examples[:50]]


def test_continuation_pairs_take_true_and_foreign_continuations():
    from lmforge.data.corpus.bundled import load_default_records

    texts = {r["source"]: " ".join(r["text"].split()) for r in load_default_records()}
    pairs = continuation_preferences("dev", 40, prompt_words=20, response_words=8)
    train_docs = {p.id.rsplit("@", 1)[0] for p in continuation_preferences("train", prompt_words=20, response_words=8)}
    for p in pairs:
        source = p.id.rsplit("@", 1)[0]
        assert source not in train_docs  # held-out pairs come from unseen documents
        assert f"{p.prompt.input} {p.chosen}" in texts[source]
        assert len(p.rejected.split()) == 8 and p.rejected not in texts[source]
    easy = continuation_preferences("dev", 40, negatives="other_author", prompts_from="austen")
    shakespeare = " ".join(t for s, t in texts.items() if s.startswith("shakespeare"))
    assert all(p.id.startswith("austen") and p.rejected in shakespeare for p in easy)


def test_role_tokens_grow_the_embedding_once():
    tok = tokenizer("gpt")
    m = model("gpt-tiny", tok)
    n = m.config.vocab_size
    ids = add_role_tokens(m, tok)
    assert ids == list(range(n, n + 3)) and m.tok_emb.weight.shape[0] == n + 3
    assert add_role_tokens(m, tok) == ids and m.tok_emb.weight.shape[0] == n + 3
    assert torch.equal(m.lm_head.weight, m.tok_emb.weight)


def test_debian_instructions_from_a_fetched_set(tmp_path):
    root = tmp_path / "data" / "debian-descriptions"
    root.mkdir(parents=True)
    meta = {"name": "debian-descriptions", "task_type": "text_to_text", "labels": None, "splits": ["train", "dev"]}
    (root / "meta.json").write_text(json.dumps(meta))
    long = " ".join(f"w{i}" for i in range(200))
    rows = [{"id": "aspell", "text": "Spell checker.\n\nChecks spelling.", "target": "GNU Aspell spell-checker"},
            {"id": "big", "text": long, "target": "A long one"}]  # fmt: skip
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "dev.jsonl").write_text(json.dumps(rows[0]) + "\n")
    from lmforge.align.datasets import SUMMARY_PROMPT, debian_instructions, instruction_set

    convs = debian_instructions("train", cache_dir=tmp_path, max_words=50)
    assert [c.messages[0].content for c in convs] == [SUMMARY_PROMPT] * 2
    assert [c.response for c in convs] == ["GNU Aspell spell-checker", "A long one"]
    assert convs[0].input == "Spell checker.\n\nChecks spelling."
    assert convs[1].input == " ".join(f"w{i}" for i in range(50)) + " ..."
    mixed = instruction_set(["sentiment", "debian"], "dev", limit=3, cache_dir=tmp_path)
    assert sorted(c.id.split("-")[0] for c in mixed) == ["debian", "sentiment", "sentiment", "sentiment"]
    with pytest.raises(LMForgeError, match="unknown instruction source 'wiki'"):
        instruction_set(["wiki"])
    with pytest.raises(LMForgeError, match=r"run: lmforge data fetch debian-descriptions"):
        debian_instructions("train", cache_dir=tmp_path / "empty")
