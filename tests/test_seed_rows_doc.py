"""docs/seed-rows.md: every module path and every test its tables name exist (a test as `tests/FILE.py::NAME`, a
function of that file), every row names at least one of each, the seed rows the project implements are all there,
and README.md links the page."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "seed-rows.md"
COLUMNS = ["Seed row", "Paper", "Where it lives", "Pinned by", "Remaining difference"]
REQUIRED = [
    "GPT-1", "GPT-2", "GPT-3", "Llama", "Transformer-XL", "XLNet", "BERT", "RoBERTa", "ALBERT", "ELECTRA", "SpanBERT",
    "MAE-LM", "BART denoising", "T5 v1.0", "T5 v1.1", "UniLM", "prefix LM", "Multi-token prediction", "LoRA",
    "Houlsby", "Pfeiffer", "Prefix-tuning", "Prompt tuning", "AdaMix", "distillation", "Pruning", "quantisation",
    "TinyBERT", "Q8BERT", "Gradual magnitude pruning", "SFT", "DPO", "PPO", "C4 cleaning", "BLiMP", "Position probes",
]  # fmt: skip
_CODE = re.compile(r"`([^`]+)`")


def table_rows(text: str) -> list[list[str]]:
    """The cells of every body row of every markdown table in `text` (header and separator rows left out)."""
    rows, header = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
            assert header == COLUMNS, f"a table's columns are {header}, expected {COLUMNS}"
        elif not set(line) <= set("|-: "):
            assert len(cells) == len(COLUMNS), f"row with {len(cells)} cells: {line[:80]}"
            rows.append(cells)
    return rows


@cache
def _functions(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return frozenset(n.name for n in tree.body if isinstance(n, ast.FunctionDef))


def problems(rows: list[list[str]], root: Path = ROOT) -> list[str]:
    """What is wrong with the rows: a module path or test that does not exist, a row naming no module or no test."""
    found = []
    for row in rows:
        name, code = row[0], [c for cell in row for c in _CODE.findall(cell)]
        modules = [c for c in _CODE.findall(row[2]) if c.startswith("src/")]
        tests = [c for c in _CODE.findall(row[3]) if c.startswith("tests/")]
        if not modules:
            found.append(f"{name}: names no module")
        if not tests:
            found.append(f"{name}: names no test")
        for ref in code:
            if ref.startswith("src/") and not (root / ref).exists():
                found.append(f"{name}: {ref} does not exist")
            elif ref.startswith("tests/"):
                file, sep, test = ref.partition("::")
                if not sep or not test.startswith("test_"):
                    found.append(f"{name}: {ref} is not tests/FILE.py::test_NAME")
                elif not (root / file).is_file():
                    found.append(f"{name}: {file} does not exist")
                elif test not in _functions(root / file):
                    found.append(f"{name}: {file} has no test {test}")
    return found


def test_every_module_and_test_named_exists():
    rows = table_rows(DOC.read_text(encoding="utf-8"))
    assert len(rows) >= 40
    assert problems(rows) == []
    assert len({r[0] for r in rows}) == len(rows)  # one row per seed


def test_every_seed_row_is_in_the_table():
    names = " / ".join(r[0] for r in table_rows(DOC.read_text(encoding="utf-8")))
    assert [n for n in REQUIRED if n.lower() not in names.lower()] == []


def test_the_check_finds_a_missing_module_a_missing_test_and_a_row_without_either():
    rows = table_rows(
        "| Seed row | Paper | Where it lives | Pinned by | Remaining difference |\n|---|---|---|---|---|\n"
        "| A | p | `src/lmforge/no_such.py` | `tests/test_seed_rows_doc.py::test_no_such_test` | none |\n"
        "| B | p | nowhere | `tests/no_such_file.py::test_x`, `tests/test_seed_rows_doc.py` | none |\n"
        "| C | p | `src/lmforge/registry.py` | `tests/test_seed_rows_doc.py::test_every_seed_row_is_in_the_table` | |\n"
    )
    assert problems(rows) == [
        "A: src/lmforge/no_such.py does not exist",
        "A: tests/test_seed_rows_doc.py has no test test_no_such_test",
        "B: names no module",
        "B: tests/no_such_file.py does not exist",
        "B: tests/test_seed_rows_doc.py is not tests/FILE.py::test_NAME",
    ]


def test_readme_links_the_page():
    assert "docs/seed-rows.md" in (ROOT / "README.md").read_text(encoding="utf-8")
