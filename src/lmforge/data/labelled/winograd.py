"""Readers of Winograd-style pronoun resolution data → Winograd `Example`s: `text` with a blank ("_") where the
pronoun was, `choices` the candidate antecedents written as they read in its place, `label` the right one.

- WSC273 / WSC285 (Levesque et al. 2012) as distributed, `WSCollection.xml`: `<collection>` of `<schema>`s, each
  `<text><txt1/><pron/><txt2/></text>`, `<quote>` (the part the pronoun is in), `<answers><answer/>...</answers>`,
  `<correctAnswer>` (a letter, "A", " B ", "A." ...) and `<source>`; WSC273 is the first 273 schemas.
- DPR (Rahman & Ng 2012, "Resolving Complex Cases of Definite Pronouns"): `train.c.txt` / `test.c.txt`, four
  lines per example and a blank line: the sentence, the pronoun (its first occurrence is the one resolved), the
  candidate antecedents separated by commas, the right antecedent.
- SuperGLUE WSC jsonl (`train.jsonl`, `val.jsonl`, `test.jsonl`): one (candidate, pronoun) pair per line with a
  true/false label — a classification example (`wsc_pair`), or, grouped by sentence and pronoun, one Winograd
  example whose choices are the sentence's candidates (`group_wsc_pairs`).

A candidate is written as it reads in the pronoun's place (Trinh & Le 2018 substitute it for the pronoun): a
possessive pronoun ("his", "their", ...) takes the candidate's possessive ("the man's", "the hens'"); a leading
"The"/"A"/"An" is lower-cased inside a sentence and a candidate starting a sentence is capitalised. "her" stays an
object pronoun (it can be either; both candidates read the same way, so the comparison stays fair)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Literal

from lmforge.data.labelled.examples import Dataset, Example
from lmforge.data.labelled.readers import fail, read_lines
from lmforge.errors import LMForgeError

BLANK = "_"
POSSESSIVE = frozenset({"his", "its", "their", "my", "our", "your", "whose"})
ARTICLES = ("The ", "A ", "An ")
_SENTENCE_END = re.compile(r"(^|[.!?][\"')\]]*)\s*$")
_NO_SPACE_BEFORE = tuple(".,;:!?'’)")


def clean(text: str | None) -> str:
    """Whitespace runs (XML line breaks, indentation) collapsed to single spaces."""
    return " ".join((text or "").split())


def as_referent(candidate: str, pronoun: str, sentence_start: bool) -> str:
    """The candidate as it reads in the pronoun's place (see the module docstring)."""
    out = clean(candidate)
    if pronoun.lower() in POSSESSIVE:
        out += "'" if out.endswith("s") else "'s"  # "the hens'", "the man's"
    if sentence_start:
        return out[:1].upper() + out[1:]
    for article in ARTICLES:
        if out.startswith(article):
            return article.lower() + out[len(article) :]
    return out


def blanked(before: str, after: str) -> str:
    """`before _ after`, with no space before punctuation that starts `after`."""
    before, after = clean(before), clean(after)
    joined = f"{before} {BLANK}" if before else BLANK
    if after:
        joined += after if after.startswith(_NO_SPACE_BEFORE) else f" {after}"
    return joined


def winograd_example(
    before: str, pronoun: str, after: str, candidates: list[str], label: int | None, id: str, **meta
) -> Example:
    start = bool(_SENTENCE_END.search(clean(before)))
    choices = [as_referent(c, pronoun, start) for c in candidates]
    meta = {"pronoun": pronoun, "candidates": list(candidates), **meta}
    return Example(text=blanked(before, after), choices=choices, label=label, id=id, meta=meta)


# ---------------------------------------------------------------- WSC273 / WSC285 XML


def read_wsc_xml(path: Path | str, subset: Literal["wsc273", "wsc285"] = "wsc273") -> Dataset:
    """The schemas of `WSCollection.xml` (the first 273 for wsc273) as Winograd examples."""
    path = Path(path)
    if not path.is_file():
        raise LMForgeError(f"{path}: no such file (WSCollection.xml of the Winograd Schema Challenge)")
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        raise LMForgeError(f"{path}: not well-formed XML ({e})") from None
    if root.tag != "collection":
        raise LMForgeError(f"{path}: expected a <collection> of <schema>s, found <{root.tag}>")
    schemas = root.findall("schema")
    if subset == "wsc273":
        schemas = schemas[:273]
    return Dataset([_schema(path, i, s) for i, s in enumerate(schemas)], None, str(path), "multiple_choice")


def _schema(path: Path, i: int, schema: ET.Element) -> Example:
    where = f"{path}: schema {i + 1}"
    text = schema.find("text")
    if text is None or text.find("pron") is None:
        raise LMForgeError(f"{where}: no <text> with a <pron>")
    pronoun = clean(text.findtext("pron"))
    answers = [clean(a.text) for a in schema.findall("answers/answer")]
    if len(answers) < 2 or not all(answers):
        raise LMForgeError(f"{where}: needs at least two non-empty <answer>s")
    letter = clean(schema.findtext("correctAnswer")).rstrip(".").strip()
    if len(letter) != 1 or not "A" <= letter <= chr(ord("A") + len(answers) - 1):
        raise LMForgeError(f"{where}: correctAnswer {letter!r} is not one of the answer letters")
    quote = schema.find("quote")
    meta = {"source": clean(schema.findtext("source"))}
    if quote is not None:
        meta["quote"] = blanked(quote.findtext("quote1") or "", quote.findtext("quote2") or "")
    return winograd_example(
        text.findtext("txt1") or "", pronoun, text.findtext("txt2") or "", answers, ord(letter) - ord("A"),
        f"wsc{i}", **meta,
    )  # fmt: skip


# ---------------------------------------------------------------- DPR (Rahman & Ng 2012)


def read_dpr(path: Path | str) -> Dataset:
    """A DPR file (train.c.txt / test.c.txt): blocks of sentence, pronoun, candidates, answer."""
    path = Path(path)
    lines = list(read_lines(path))
    examples, block = [], []
    for n, line in [*lines, (len(lines) + 1, "")]:
        if line.strip():
            block.append((n, line.strip()))
            continue
        if block:
            examples.append(_dpr_block(path, block, len(examples)))
            block = []
    if not examples:
        raise LMForgeError(f"{path}: no DPR examples (four lines each, separated by blank lines)")
    return Dataset(examples, None, str(path), "multiple_choice")


def _dpr_block(path: Path, block: list[tuple[int, str]], index: int) -> Example:
    first = block[0][0]
    if len(block) != 4:
        raise fail(path, first, f"a DPR example has 4 lines (sentence, pronoun, candidates, answer), not {len(block)}")
    (_, sentence), (n_pron, pronoun), (n_cand, cands), (n_ans, answer) = block
    candidates = [c.strip() for c in cands.split(",") if c.strip()]
    if len(candidates) < 2:
        raise fail(path, n_cand, f"expected comma-separated candidate antecedents, found {cands!r}")
    if answer not in candidates:
        raise fail(path, n_ans, f"answer {answer!r} is not one of the candidates {candidates}")
    m = re.search(rf"\b{re.escape(pronoun)}\b", sentence) or re.search(
        rf"\b{re.escape(pronoun)}\b", sentence, re.IGNORECASE
    )
    if m is None:
        raise fail(path, n_pron, f"pronoun {pronoun!r} does not occur in the sentence")
    before, after = sentence[: m.start()], sentence[m.end() :]
    return winograd_example(before, m.group(0), after, candidates, candidates.index(answer), f"dpr{index}")


# ---------------------------------------------------------------- SuperGLUE WSC jsonl


def _span(path: Path, line: int, words: list[str], index: object, text: object, name: str) -> tuple[int, int]:
    """The character range of a target span given as a word index + its text."""
    if not isinstance(index, int) or isinstance(index, bool) or not isinstance(text, str) or not text.strip():
        raise fail(path, line, f"target.{name}_index / {name}_text missing or malformed")
    n = len(text.split())
    if not 0 <= index <= len(words) - n:
        raise fail(path, line, f"target.{name}_index {index} is outside the text's {len(words)} words")
    got = " ".join(words[index : index + n])
    if not got.lower().startswith(text.strip().lower().rstrip(".,;:!?")):
        raise fail(path, line, f"target.{name}_text {text!r} is not the text's words at {index} ({got!r})")
    start = sum(len(w) + 1 for w in words[:index])
    return start, start + len(text.strip())


def wsc_pair(path: Path, line: int, obj: dict) -> Example:
    """One SuperGLUE WSC line as a classification example: the text, and "<pronoun> refers to <candidate>"."""
    text, target = obj.get("text"), obj.get("target")
    if not isinstance(text, str) or not isinstance(target, dict):
        raise fail(path, line, "a WSC line needs 'text' and a 'target' object")
    words = text.split(" ")
    cand = _span(path, line, words, target.get("span1_index"), target.get("span1_text"), "span1")
    pron = _span(path, line, words, target.get("span2_index"), target.get("span2_text"), "span2")
    candidate, pronoun = text[cand[0] : cand[1]], text[pron[0] : pron[1]]
    meta = {"candidate": candidate, "pronoun": pronoun, "pronoun_at": pron}
    return Example(text=text, text_pair=f'"{pronoun}" refers to "{candidate}"', meta=meta)


def group_wsc_pairs(examples: list[Example]) -> list[Example]:
    """Winograd examples from SuperGLUE WSC pairs: the pairs of one sentence and pronoun become one example whose
    choices are their candidates; the labelled right one (label "True") is the answer. Groups without exactly one
    right candidate, or with a single candidate, cannot be decided by comparison and are left out (unlabelled
    pairs: every group with two or more candidates is kept, unlabelled)."""
    groups: dict[tuple[str, tuple[int, int]], list[Example]] = {}
    for e in examples:
        groups.setdefault((e.text, tuple(e.meta["pronoun_at"])), []).append(e)
    out = []
    for (text, (start, end)), pairs in groups.items():
        candidates = list(dict.fromkeys(p.meta["candidate"] for p in pairs))
        right = {p.meta["candidate"] for p in pairs if str(p.label) == "True"}
        labelled = all(p.label is not None for p in pairs)
        if len(candidates) < 2 or (labelled and len(right) != 1):
            continue
        label = candidates.index(right.pop()) if labelled else None
        ex = winograd_example(text[:start], text[start:end], text[end:], candidates, label, pairs[0].id or "")
        out.append(ex)
    return out
