"""Readers for labelled data → `Dataset`: tables with a field mapping (jsonl/csv/tsv), SQuAD v1.1/v2.0 JSON,
CoNLL-2003, Stanford Sentiment Treebank trees, SNLI/MultiNLI jsonl (GLUE/SuperGLUE task files:
`data/labelled/glue.py`), and the labelled-set directories that `lmforge data fetch` writes and the package bundles
(`load_bundled("sentiment")`).

Every malformed input raises one `LMForgeError` line that
names the place: `file:line: ...` for line-based files, `file: <where>: ...` for JSON documents.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Literal

from lmforge.data.labelled.examples import Dataset, Example
from lmforge.data.surrogates import check_surrogates, lone_surrogate, surrogate_error
from lmforge.data.tables import csv_records
from lmforge.errors import LMForgeError
from lmforge.files import loads_json

TaskType = Literal["classification", "regression", "multiple_choice", "span", "tagging", "text_to_text"]
Field = str | int  # a column name, or a 0-based column index for files without a header

BUNDLED_DIR = Path(__file__).resolve().parents[2] / "assets" / "labelled"
SPLITS = ("train", "dev", "test")
CONLL_NER_LABELS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
NLI_LABELS = ["entailment", "neutral", "contradiction"]
SST_LABELS_5 = ["very negative", "negative", "neutral", "positive", "very positive"]
SST_LABELS_2 = ["negative", "positive"]


def fail(path: Path | str, line: int, message: str) -> LMForgeError:
    """The error for a malformed line: `file:line: message`."""
    return LMForgeError(f"{path}:{line}: {message}")


def open_binary(path: Path) -> io.BufferedIOBase:
    """Open a file for reading, transparently decompressing .gz/.xz/.bz2."""
    path = Path(path)
    if not path.is_file():
        raise LMForgeError(f"{path}: no such file")
    opener = {".gz": gzip.open, ".xz": lzma.open, ".bz2": bz2.open}.get(path.suffix, open)
    return opener(path, "rb")


def read_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its newline) for each line of a UTF-8 text file (BOM dropped)."""
    with open_binary(path) as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise fail(path, n, f"not UTF-8 text (byte {e.start} of the line)") from None
            if n == 1:
                line = line.removeprefix("\ufeff")
            yield n, line.rstrip("\r\n")


def read_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line of a JSON-lines file; each line must be a JSON object."""
    for n, line in read_lines(path):
        if not line.strip():
            continue
        try:
            obj = loads_json(line)
        except json.JSONDecodeError as e:
            raise fail(path, n, f"invalid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(obj, dict):
            raise fail(path, n, f"expected a JSON object, found {type(obj).__name__}")
        if "\\u" in line:  # an unpaired \ud800 escape: a str no tokenizer takes
            check_surrogates(line, f"{path}:{n}", json_text=True)
        yield n, obj


def read_json(path: Path) -> object:
    """A whole JSON document; a syntax error names its line."""
    with open_binary(path) as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8-sig")
        doc = loads_json(text)
    except UnicodeDecodeError as e:
        raise LMForgeError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise fail(path, e.lineno, f"invalid JSON ({e.msg} at column {e.colno})") from None
    if (hit := lone_surrogate(text, json_text=True)) is not None:  # an unpaired \ud800 escape, on its line
        raise surrogate_error(f"{path}:{text.count(chr(10), 0, hit[0]) + 1}", hit[1])
    return doc


def check_label(path: Path, line: int, label: str, labels: Sequence[str]) -> str:
    """`label` if it is in the label set, else the `file:line` error."""
    if label not in labels:
        raise fail(path, line, f"label {label!r} is not one of {', '.join(map(repr, labels))}")
    return label


def parse_score(path: Path, line: int, raw: object, bounds: tuple[float, float] | None = None) -> float:
    """A regression target: a finite number (within `bounds`, inclusive, when given)."""
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise fail(path, line, f"score {raw!r} is not a number") from None
    if not math.isfinite(value):
        raise fail(path, line, f"score {raw!r} is not a finite number")
    if bounds is not None and not bounds[0] <= value <= bounds[1]:
        raise fail(path, line, f"score {value:g} is outside [{bounds[0]:g}, {bounds[1]:g}]")
    return value


# ---------------------------------------------------------------- tables with a field mapping


def _table_rows(path: Path, fmt: str, header: bool) -> Iterator[tuple[int, dict[Field, object]]]:
    """(line, row) where row maps column name (header) or index (no header) → value."""
    if fmt == "jsonl":
        yield from read_jsonl(path)
        return
    if fmt == "tsv":  # GLUE-style: split on tabs, no quoting (texts contain bare quotes)
        rows: Iterable[tuple[int, list[str]]] = ((n, ln.split("\t")) for n, ln in read_lines(path) if ln != "")
    else:
        rows = _csv_rows(path, header)
    names: list[str] | None = None
    for n, cells in rows:
        if header and names is None:
            names = cells
            continue
        if names is not None and len(cells) != len(names):
            raise fail(path, n, f"expected {len(names)} {fmt.upper()} columns (as the header), found {len(cells)}")
        yield n, dict(zip(names, cells)) if names is not None else dict(enumerate(cells))


def _csv_rows(path: Path, header: bool) -> Iterator[tuple[int, list[str]]]:
    """(line where the record starts, cells) of a CSV file, by the pretraining corpora's reader: quoted fields may
    span lines, a ragged row is refused."""
    with io.TextIOWrapper(open_binary(path), encoding="utf-8-sig", newline="") as text:
        yield from csv_records(text, path, header=header)


def _field(path: Path, line: int, row: dict, name: Field) -> object:
    what = f"column {name}" if isinstance(name, int) else f"field {name!r}"
    if name not in row:
        raise fail(path, line, f"missing {what}")
    if row[name] is None:  # JSON null
        raise fail(path, line, f"{what} is null")
    return row[name]


def _label_text(value: object) -> str:
    return str(value) if not isinstance(value, bool) else ("True" if value else "False")


def read_table(
    path: Path | str,
    text_field: Field,
    label_field: Field | None,
    text_pair_field: Field | None = None,
    *,
    labels: Sequence[str] | None = None,
    task_type: Literal["classification", "regression"] = "classification",
    header: bool = True,
    id_field: Field | None = None,
    fmt: Literal["jsonl", "csv", "tsv"] | None = None,
    target_field: Field | None = None,
) -> Dataset:
    """Read a jsonl/csv/tsv file (also .gz/.xz/.bz2) with a field mapping.

    Fields are column names, or 0-based column indices when `header=False` (csv/tsv without a header row).
    `label_field=None` reads unlabelled text. Classification labels are kept as strings and checked against
    `labels` when given (else the label set is the sorted distinct labels); regression labels must be numbers.
    `target_field` reads the target text of a text-to-text / seq2seq example (a translation, a summary).
    Each example's `meta["line"]` is the line it was read from. TSV is split on tabs without quoting (as GLUE
    files are); CSV follows RFC 4180 quoting.
    """
    path = Path(path)
    fmt = fmt or _table_format(path)
    examples: list[Example] = []
    for n, row in _table_rows(path, fmt, header):
        text = _field(path, n, row, text_field)
        pair = _field(path, n, row, text_pair_field) if text_pair_field is not None else None
        ex = Example(text=str(text), text_pair=None if pair is None else str(pair), meta={"line": n})
        if target_field is not None:
            ex.target = str(_field(path, n, row, target_field))
        if id_field is not None:
            ex.id = str(_field(path, n, row, id_field))
        if label_field is not None:
            raw = _field(path, n, row, label_field)
            if task_type == "regression":
                ex.label = parse_score(path, n, raw)
            else:
                ex.label = _label_text(raw)
                if labels is not None:
                    check_label(path, n, ex.label, labels)
        examples.append(ex)
    if target_field is not None and label_field is None:
        return Dataset(examples, None, str(path), "text_to_text")
    if task_type == "regression" or label_field is None:
        label_set = None
    else:
        label_set = list(labels) if labels is not None else sorted({str(e.label) for e in examples})
    return Dataset(examples, label_set, str(path), task_type)


def _table_format(path: Path) -> Literal["jsonl", "csv", "tsv"]:
    suffixes = [s for s in path.suffixes if s not in (".gz", ".xz", ".bz2")]
    kind = suffixes[-1].lstrip(".").lower() if suffixes else ""
    kind = {"json": "jsonl", "ndjson": "jsonl", "tab": "tsv"}.get(kind, kind)
    if kind not in ("jsonl", "csv", "tsv"):
        raise LMForgeError(f"{path}: cannot tell the table format from the name (use .jsonl, .csv or .tsv)")
    return kind  # type: ignore[return-value]


# ---------------------------------------------------------------- SQuAD, SNLI, SST, CoNLL-2003


def read_squad(path: Path | str) -> Dataset:
    """SQuAD v1.1 / v2.0 JSON: one example per question (`text` = question, `context`, `answers` as
    (char_start, text) pairs; v2.0 questions with `is_impossible` have no answers). Answer offsets are checked."""
    path = Path(path)
    doc = read_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise LMForgeError(f"{path}: not a SQuAD file (expected an object with a 'data' list)")
    examples = []
    for a, article in enumerate(doc["data"]):
        for p, para in enumerate(_items(path, article, "paragraphs", f"data[{a}]")):
            where = f"data[{a}].paragraphs[{p}]"
            context = _string(path, para, "context", where)
            for q, qa in enumerate(_items(path, para, "qas", where)):
                qid = str(qa.get("id", f"{where}.qas[{q}]")) if isinstance(qa, dict) else f"{where}.qas[{q}]"
                question = _string(path, qa, "question", f"question {qid}")
                impossible = bool(qa.get("is_impossible", False))
                answers = [] if impossible else _squad_answers(path, qa, qid, context)
                title = article.get("title", "") if isinstance(article, dict) else ""
                meta = {"title": title, "is_impossible": impossible}
                examples.append(Example(text=question, context=context, answers=answers, id=qid, meta=meta))
    return Dataset(examples, None, str(path), "span")


def _items(path: Path, obj: object, key: str, where: str) -> list:
    if not isinstance(obj, dict) or not isinstance(obj.get(key), list):
        raise LMForgeError(f"{path}: {where}: missing the '{key}' list")
    return obj[key]


def _string(path: Path, obj: object, key: str, where: str) -> str:
    if not isinstance(obj, dict) or not isinstance(obj.get(key), str):
        raise LMForgeError(f"{path}: {where}: missing the '{key}' string")
    return obj[key]


def _squad_answers(path: Path, qa: dict, qid: str, context: str) -> list[tuple[int, str]]:
    answers = []
    for ans in _items(path, qa, "answers", f"question {qid}"):
        text = _string(path, ans, "text", f"question {qid}: answer")
        start = ans.get("answer_start")
        if not isinstance(start, int) or context[start : start + len(text)] != text:
            raise LMForgeError(f"{path}: question {qid}: answer {text!r} is not at character {start} of its context")
        answers.append((start, text))
    return answers


def read_snli(path: Path | str) -> Dataset:
    """SNLI / MultiNLI jsonl (`sentence1`, `sentence2`, `gold_label`): premise/hypothesis pairs with their gold
    label. Pairs whose annotators reached no consensus (`gold_label` "-") are skipped, as in the SNLI paper."""
    path = Path(path)
    examples = []
    for n, obj in read_jsonl(path):
        label = str(_field(path, n, obj, "gold_label"))
        if label == "-":
            continue
        check_label(path, n, label, NLI_LABELS)
        premise, hypothesis = (str(_field(path, n, obj, k)) for k in ("sentence1", "sentence2"))
        meta = {"genre": obj["genre"]} if "genre" in obj else {}
        examples.append(Example(premise, hypothesis, label, id=str(obj.get("pairID", n)), meta=meta))
    return Dataset(examples, list(NLI_LABELS), str(path), "classification")


_SST_LEAF = re.compile(r"\(([0-4]) ([^()\s]+)\)")
_PTB_ESCAPES = {"-LRB-": "(", "-RRB-": ")", "-LSB-": "[", "-RSB-": "]", "-LCB-": "{", "-RCB-": "}"}


def read_sst_trees(path: Path | str, fine_grained: bool = False) -> Dataset:
    """Stanford Sentiment Treebank PTB trees (one per line, root label 0-4): sentence-level examples.

    `fine_grained=False` is SST-2: neutral roots (2) are dropped, 0-1 → negative, 3-4 → positive.
    `fine_grained=True` is SST-5 with labels very negative … very positive.
    """
    path = Path(path)
    examples = []
    for n, line in read_lines(path):
        tree = line.strip()
        if not tree:
            continue
        if not re.match(r"^\([0-4] ", tree) or tree.count("(") != tree.count(")"):
            raise fail(path, n, "not a sentiment tree (expected '(<0-4> ...)' with balanced parentheses)")
        words = [_PTB_ESCAPES.get(w, w) for _, w in _SST_LEAF.findall(tree)]
        if not words:
            raise fail(path, n, "sentiment tree has no words")
        root = int(tree[1])
        if fine_grained:
            label = SST_LABELS_5[root]
        elif root == 2:
            continue
        else:
            label = SST_LABELS_2[root > 2]
        examples.append(Example(text=" ".join(words), label=label, id=str(n)))
    labels = SST_LABELS_5 if fine_grained else SST_LABELS_2
    return Dataset(examples, list(labels), str(path), "classification")


def iob1_to_iob2(tags: Sequence[str]) -> list[str]:
    """IOB1 (CoNLL-2003 as distributed: I- opens a chunk unless it follows one of the same type) → IOB2 (every
    chunk opens with B-). Idempotent on IOB2 input."""
    out: list[str] = []
    for i, tag in enumerate(tags):
        if tag.startswith("I-"):
            prev = out[i - 1] if i else "O"
            if prev == "O" or prev[2:] != tag[2:]:
                tag = "B-" + tag[2:]
        out.append(tag)
    return out


def read_conll2003(
    path: Path | str,
    column: Literal["ner", "pos", "chunk"] = "ner",
    scheme: Literal["iob1", "iob2"] = "iob2",
) -> Dataset:
    """CoNLL-2003 (`token POS chunk NER` per line, blank line between sentences, `-DOCSTART-` lines between
    documents): one example per sentence with `tokens` and the `tags` of `column`; the other columns go to
    `meta`. NER and chunk tags are converted to IOB2 unless `scheme="iob1"`; NER tags are checked."""
    path = Path(path)
    names = ("pos", "chunk", "ner")
    examples: list[Example] = []
    rows: list[list[str]] = []

    def flush() -> None:
        if rows:
            cols = {k: [r[i + 1] for r in rows] for i, k in enumerate(names)}
            if scheme == "iob2":
                cols["ner"], cols["chunk"] = iob1_to_iob2(cols["ner"]), iob1_to_iob2(cols["chunk"])
            meta = {k: v for k, v in cols.items() if k != column}
            examples.append(Example(tokens=[r[0] for r in rows], tags=cols[column], id=str(len(examples)), meta=meta))
            rows.clear()

    for n, line in read_lines(path):
        parts = line.split()
        if not parts:
            flush()
            continue
        if parts[0] == "-DOCSTART-":
            flush()
            continue
        if len(parts) != 4:
            raise fail(path, n, f"expected 4 columns (token POS chunk NER), found {len(parts)}")
        if parts[3] not in CONLL_NER_LABELS:
            raise fail(path, n, f"unknown NER tag {parts[3]!r} (expected O or B-/I- with PER, ORG, LOC, MISC)")
        rows.append(parts)
    flush()
    labels = CONLL_NER_LABELS if column == "ner" else sorted({t for e in examples for t in e.tags or []})
    return Dataset(examples, list(labels), str(path), "tagging")


# ---------------------------------------------------------------- labelled-set directories (fetched / bundled)

_EXAMPLE_FIELDS = ("id", "text", "text_pair", "label", "choices", "context", "answers", "tokens", "tags", "target")


def example_to_dict(ex: Example) -> dict:
    """JSON-ready dict of the fields that are set (answers as [start, text] pairs)."""
    out = {}
    for key in _EXAMPLE_FIELDS:
        value = getattr(ex, key)
        if value is not None and not (key == "text" and value == "" and ex.tokens is not None):
            out[key] = [list(a) for a in value] if key == "answers" else value
    if ex.meta:
        out["meta"] = ex.meta
    return out


def example_from_dict(path: Path, line: int, obj: dict) -> Example:
    """Inverse of `example_to_dict`; unknown keys are an error."""
    unknown = sorted(set(obj) - set(_EXAMPLE_FIELDS) - {"meta"})
    if unknown:
        raise fail(path, line, f"unknown example field {unknown[0]!r}")
    ex = Example(**{k: v for k, v in obj.items() if k != "answers"})
    if "answers" in obj:
        ex.answers = [(int(s), str(t)) for s, t in obj["answers"]]
    return ex


def write_examples(path: Path, examples: Iterable[Example]) -> int:
    """Write examples as JSON lines (.xz-compressed when the name ends in .xz); return how many."""
    lines = [json.dumps(example_to_dict(e), ensure_ascii=False) + "\n" for e in examples]
    data = "".join(lines).encode("utf-8")
    if Path(path).suffix == ".xz":
        data = lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)
    Path(path).write_bytes(data)
    return len(lines)


def read_examples(path: Path | str, labels: Sequence[str] | None = None, task_type: str | None = None) -> Dataset:
    """A split written by `write_examples` (labels checked against `labels` when given)."""
    path = Path(path)
    examples = []
    for n, obj in read_jsonl(path):
        ex = example_from_dict(path, n, obj)
        if labels is not None and task_type == "classification" and ex.label is not None:
            check_label(path, n, str(ex.label), labels)
        examples.append(ex)
    return Dataset(examples, list(labels) if labels is not None else None, str(path), task_type)


def load_labelled_dir(root: Path | str) -> dict[str, Dataset]:
    """The splits of a labelled-set directory: `meta.json` (labels, task_type) + `<split>.jsonl[.xz]`."""
    root = Path(root)
    meta_file = root / "meta.json"
    if not meta_file.is_file():
        raise LMForgeError(f"{root}: not a labelled set (no meta.json)")
    meta = read_json(meta_file)
    if not isinstance(meta, dict):
        raise LMForgeError(f"{meta_file}: expected a JSON object")
    out = {}
    for split in meta.get("splits", SPLITS):
        files = [root / f"{split}.jsonl", root / f"{split}.jsonl.xz"]
        found = [f for f in files if f.is_file()]
        if not found:
            raise LMForgeError(f"{root}: split '{split}' is missing ({split}.jsonl or {split}.jsonl.xz)")
        out[split] = read_examples(found[0], meta.get("labels"), meta.get("task_type"))
    return out


def bundled_names() -> list[str]:
    """Names of the labelled sets shipped with the package."""
    return sorted(p.name for p in BUNDLED_DIR.iterdir() if (p / "meta.json").is_file()) if BUNDLED_DIR.is_dir() else []


def load_bundled(name: str = "sentiment") -> dict[str, Dataset]:
    """A labelled set shipped with the package (no network): split name → Dataset (train, dev, test)."""
    if name not in bundled_names():
        known = ", ".join(bundled_names()) or "none"
        raise LMForgeError(f"unknown bundled labelled set '{name}' (known: {known})")
    return load_labelled_dir(BUNDLED_DIR / name)


def load_fetched(name: str, cache_dir: Path | None = None) -> dict[str, Dataset]:
    """A labelled set built by `lmforge data fetch NAME`: split name → Dataset."""
    from lmforge.files import cache_root

    root = Path(cache_dir or cache_root()) / "data" / name
    if not (root / "meta.json").is_file():
        raise LMForgeError(f"labelled set '{name}' is not in {root.parent} (run: lmforge data fetch {name})")
    return load_labelled_dir(root)
