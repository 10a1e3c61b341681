"""Fixtures shared by the test modules: prepared training data (built once per test process for each size) and the
torch globals that CLI runs in this process change."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from training_testing import make_prepared, restore_torch_globals


@pytest.fixture(scope="session")
def prepared_docs(tmp_path_factory) -> Callable[[int], tuple[Path, Path]]:
    """`prepared_docs(n)` → (tokenizer dir, prepared data dir) of the first n bundled documents (see
    training_testing.make_prepared), built on first use and shared read-only by every test after it: tests that
    change a prepared dir copy it first."""
    built: dict[int, tuple[Path, Path]] = {}

    def get(n_docs: int) -> tuple[Path, Path]:
        if n_docs not in built:
            built[n_docs] = make_prepared(tmp_path_factory.mktemp(f"prepared-{n_docs}"), n_docs)
        return built[n_docs]

    return get


@pytest.fixture
def torch_globals():
    """One torch thread while the test runs; deterministic-algorithm mode and the thread count put back after."""
    yield from restore_torch_globals()
