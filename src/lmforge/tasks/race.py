"""RACE (Lai et al. 2017, reading comprehension from English exams) as distributed → multiple-choice `Dataset`s.

Layout: `RACE/{train,dev,test}/{middle,high}/*.txt`; each file is one JSON object for one article:
`{"article": str, "questions": [str, ...], "options": [[4 str], ...], "answers": ["A".."D", ...], "id": str}`.
Each question becomes an `Example`: `text` = the article, a newline, the question (the context GPT-1 §3.3 /
§5 conditions the answers on), `choices` = its options, `label` = the answer's index; the article and the
question alone are kept in `context` and `meta["question"]`. Cloze-style questions hold a "_" where the answer
goes."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from lmforge.data.labelled.examples import Dataset, Example
from lmforge.data.labelled.readers import read_json
from lmforge.errors import LMForgeError

Level = Literal["all", "middle", "high"]
LEVELS = ("middle", "high")
LETTERS = "ABCDEFGH"


def race_split_dir(root: Path | str, split: str) -> Path:
    """The directory of a split (dev may be called "dev" or "val"); the root may be RACE/ or its parent."""
    root = Path(root)
    for base in (root, root / "RACE"):
        for name in (split, "val") if split == "dev" else (split,):
            if (base / name).is_dir():
                return base / name
    raise LMForgeError(
        f"RACE {split}: no {split}/ directory in {root} (expected RACE/{{train,dev,test}}/{{middle,high}})"
    )


def read_race(root: Path | str, split: str, level: Level = "all") -> Dataset:
    """Every question of split `split` (train, dev, test) at `level` (middle, high or all), files in name order."""
    if level not in ("all", *LEVELS):
        raise LMForgeError(f"RACE level must be all, middle or high, got {level!r}")
    split_dir = race_split_dir(root, split)
    levels = LEVELS if level == "all" else (level,)
    examples: list[Example] = []
    for lv in levels:
        d = split_dir / lv
        if not d.is_dir():
            raise LMForgeError(f"RACE {split}: no {lv}/ directory in {split_dir}")
        for path in sorted(d.glob("*.txt"), key=_file_order):
            examples += race_file(path, lv)
    if not examples:
        raise LMForgeError(f"RACE {split}: no questions under {split_dir} ({level})")
    return Dataset(examples, None, f"{split_dir} ({level})", "multiple_choice")


def _file_order(path: Path) -> tuple[int, str]:
    return (int(path.stem), "") if path.stem.isdigit() else (1 << 62, path.stem)


def race_file(path: Path, level: str = "") -> list[Example]:
    """The questions of one RACE article file."""
    obj = read_json(path)
    if not isinstance(obj, dict):
        raise LMForgeError(f"{path}: expected a JSON object with article, questions, options and answers")
    for key in ("article", "questions", "options", "answers"):
        if key not in obj:
            raise LMForgeError(f"{path}: missing field {key!r}")
    article, questions, options, answers = obj["article"], obj["questions"], obj["options"], obj["answers"]
    if not isinstance(article, str) or not all(isinstance(x, list) for x in (questions, options, answers)):
        raise LMForgeError(f"{path}: article must be a string and questions, options, answers lists")
    if not len(questions) == len(options) == len(answers):
        raise LMForgeError(
            f"{path}: {len(questions)} questions, {len(options)} option lists and {len(answers)} answers"
        )
    name = str(obj.get("id", f"{level}{path.name}"))
    out = []
    for i, (q, opts, ans) in enumerate(zip(questions, options, answers)):
        where = f"{path}: question {i + 1}"
        if not isinstance(q, str) or not isinstance(opts, list) or not all(isinstance(o, str) for o in opts):
            raise LMForgeError(f"{where}: the question must be a string and its options a list of strings")
        if not isinstance(ans, str) or ans not in LETTERS[: len(opts)]:
            raise LMForgeError(f"{where}: answer {ans!r} is not one of {', '.join(LETTERS[: len(opts)])}")
        out.append(
            Example(
                text=f"{article.strip()}\n{q.strip()}",
                choices=[o.strip() for o in opts],
                label=LETTERS.index(ans),
                context=article.strip(),
                id=f"{name}-{i}",
                meta={"question": q.strip(), "level": level},
            )  # fmt: skip
        )
    return out
