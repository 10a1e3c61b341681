"""The data of lmforge's example lm-eval tasks: the JSONL files beside this module, found wherever lmforge is
installed (lm_eval imports this file for the tasks' `custom_dataset: !function local_data.mc`)."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def _load(name: str):
    import datasets

    return datasets.load_dataset("json", data_files={"test": str(HERE / name)})


def mc(**_):
    """Questions with four choices and the index of the right one (Austen, Lincoln, Shakespeare)."""
    return _load("mc.jsonl")


def text(**_):
    """Whole passages for perplexity."""
    return _load("text.jsonl")
