"""Multiple choice (RACE, Story Cloze, COPA, SWAG): each answer is scored together with its context, softmax across
the answers (GPT-1 §3.3: `<|start|> context <|delim|> answer_k <|extract|>` per answer; BERT/SWAG: `[CLS] context
[SEP] answer_k [SEP]`). `Example.text` is the context (+ question), `choices` the answers, `label` the right index."""

from __future__ import annotations

from lmforge.data.labelled.examples import Example
from lmforge.errors import LMForgeError
from lmforge.registry import TASKS
from lmforge.tasks.heads import Combine
from lmforge.tasks.sequence import SequenceTask


@TASKS.register("multiple_choice")
class MultipleChoice(SequenceTask):
    name = "multiple_choice"
    default_metrics = ("accuracy",)

    def n_out(self) -> int:
        return 1

    def _combine(self) -> Combine:
        return "choices"

    def sequences(self, ex: Example) -> list[tuple[str, str | None]]:
        if not ex.choices:
            raise LMForgeError(f"multiple-choice example {ex.id or ex.text[:30]!r} has no choices")
        return [(ex.text, c) for c in ex.choices]

    def target(self, ex: Example, where: str) -> int:
        n, label = len(ex.choices or []), ex.label
        if isinstance(label, str) and label.isdigit():
            label = int(label)
        if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < n:
            raise LMForgeError(f"{where}: label {ex.label!r} is not the index of one of its {n} choices")
        return label
