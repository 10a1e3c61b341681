"""Fine-tuning task types: reader → input transformation → head → loss → metric, one file each, registered in
`TASKS` (classification, pair_classification, regression, multiple_choice, span_qa, token_tagging, text_to_text,
text_to_text_regression, seq2seq, multi_task, bart_mt)."""

from lmforge.data.labelled.examples import Dataset, Example
from lmforge.registry import TASKS
from lmforge.tasks import (  # noqa: F401  (registers the task types)
    bart_mt,
    classification,
    multi_task,
    multiple_choice,
    pair_classification,
    regression,
    seq2seq,
    span_qa,
    tagging,
    text_to_text,
    text_to_text_regression,
)
from lmforge.tasks.base import Task, TaskOptions
from lmforge.tasks.model import TaskModel, TaskOutput

__all__ = ["TASKS", "Dataset", "Example", "Task", "TaskModel", "TaskOptions", "TaskOutput"]
