"""Reader of the Story Cloze Test (Mostafazadeh et al. 2016, https://cs.rochester.edu/nlp/rocstories/) in the CSV
layout of its official files: a header row, then one story a row with the columns `InputSentence1` ..
`InputSentence4` (the four-sentence story), `RandomFifthSentenceQuiz1`, `RandomFifthSentenceQuiz2` (the two
candidate endings) and `AnswerRightEnding` (1 or 2; absent from the 2018 test file, whose labels were withheld),
usually beside `InputStoryid`.

The data is not redistributable: the user asks for it at the address above and points `data.dir` at the directory
holding the CSV files as they came (`cloze_test_val__spring2016 - cloze_test_ALL_val.csv`,
`cloze_test_test__spring2016 - cloze_test_ALL_test.csv`, `cloze_test_val__winter2018-cloze_test_ALL_val - 1 - 1.csv`,
...), or names files with `data.dev` / `data.test`. A file's split is read from its name ("val" or "dev": dev,
"test": test); `data.name` 2016 or 2018 keeps the files whose name holds that year where the directory has both.
CSV files without the Story Cloze columns (the ROCStories training stories) are passed over.

Each story becomes one multiple-choice `Example`: `text` the four sentences joined by spaces (as
lm-evaluation-harness's `storycloze` task joins them), `choices` the two endings, `label` the right ending's index
(0 or 1; None when the file has no answers), `id` the story id, `meta` the file and line."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from lmforge.data.labelled.examples import Dataset, Example
from lmforge.data.labelled.readers import fail, open_binary
from lmforge.errors import LMForgeError

STORY = tuple(f"InputSentence{i}" for i in range(1, 5))
ENDINGS = ("RandomFifthSentenceQuiz1", "RandomFifthSentenceQuiz2")
ANSWER = "AnswerRightEnding"


def _header(path: Path) -> list[str]:
    with io.TextIOWrapper(open_binary(path), encoding="utf-8-sig", newline="") as f:
        try:
            return next(csv.reader(f), [])
        except (csv.Error, UnicodeDecodeError):
            return []


def is_story_cloze_csv(path: Path) -> bool:
    """Whether the file's header has the story and both endings."""
    header = set(_header(path))
    return all(c in header for c in (*STORY, *ENDINGS))


def read_story_cloze(path: Path | str) -> Dataset:
    """The stories of one Story Cloze CSV file (at least one); one error line naming file and line for a row with a
    missing or empty sentence, or an answer other than 1 or 2."""
    path = Path(path)
    if not is_story_cloze_csv(path):
        cols = ", ".join((*STORY, *ENDINGS))
        raise LMForgeError(f"{path}: not a Story Cloze CSV file (its header needs {cols})")
    out = []
    with io.TextIOWrapper(open_binary(path), encoding="utf-8-sig", newline="") as f:
        rows = csv.DictReader(f)
        try:
            for row in rows:
                n = rows.line_num
                if None in row or any(v is None for v in row.values()):
                    raise fail(path, n, f"expected {len(rows.fieldnames or [])} columns (as the header)")
                for col in (*STORY, *ENDINGS):
                    if not row[col].strip():
                        raise fail(path, n, f"empty {col}")
                label = None
                answer = (row.get(ANSWER) or "").strip()
                if answer:
                    if answer not in ("1", "2"):
                        raise fail(path, n, f"{ANSWER} must be 1 or 2, got {answer!r}")
                    label = int(answer) - 1
                out.append(Example(
                    text=" ".join(row[c].strip() for c in STORY),
                    choices=[row[c].strip() for c in ENDINGS],
                    label=label,
                    id=(row.get("InputStoryid") or "").strip() or str(len(out)),
                    meta={"file": str(path), "line": n},
                ))  # fmt: skip
        except csv.Error as e:
            raise fail(path, rows.line_num, f"malformed CSV ({e})") from None
        except UnicodeDecodeError as e:
            raise LMForgeError(f"{path}: not UTF-8 text (byte {e.start})") from None
    if not out:
        raise LMForgeError(f"{path}: no stories (only a header)")
    return Dataset(out, source=str(path), task_type="multiple_choice")


def _split_of(path: Path) -> str | None:
    name = path.name.lower()
    if "test" in name.replace("cloze_test", ""):
        return "test"
    if "val" in name or "dev" in name:
        return "dev"
    return None


def story_cloze_files(root: Path | str, year: str | None = None) -> dict[str, Path]:
    """{split: file} of the Story Cloze CSV files in `root` (dev from "val"/"dev" names, test from "test" names);
    `year` ("2016", "2018") keeps the files that name it when some do."""
    root = Path(root)
    if not root.is_dir():
        raise LMForgeError(f"Story Cloze directory not found: {root}")
    found = [p for p in sorted(root.iterdir()) if p.suffix.lower() == ".csv" and is_story_cloze_csv(p)]
    if year and any(year in p.name for p in found):
        found = [p for p in found if year in p.name]
    if not found:
        raise LMForgeError(
            f"{root}: no Story Cloze CSV files (expected the official files, with InputSentence1..4, "
            "RandomFifthSentenceQuiz1/2 and AnswerRightEnding columns)"
        )
    out: dict[str, Path] = {}
    for p in found:
        split = _split_of(p)
        if split is None:
            raise LMForgeError(f"{p}: cannot tell its split from the name (name it with 'val' or 'test', or pass "
                               "--data.dev / --data.test)")  # fmt: skip
        if split in out:
            raise LMForgeError(f"{root}: two {split} files, {out[split].name} and {p.name} (pick one with "
                               f"--data.name=2016 or 2018, or --data.{split}=FILE)")  # fmt: skip
        out[split] = p
    return out
