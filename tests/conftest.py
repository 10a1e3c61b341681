"""Fixtures shared by the test modules: prepared training data (built once per test process for each size), the
working dir of the GPU experiment files, and the torch globals that CLI runs in this process change."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from lm_objective_testing import tokenizer
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


@pytest.fixture(scope="module")
def parity_corpus(tmp_path_factory) -> Path:
    """A few dozen short documents of the bundled corpus (enough for a 512-token tokenizer): the training-parity
    harness's tests."""
    from lmforge.data.corpus.bundled import load_default_corpus

    text = " ".join(load_default_corpus()[:2])[:60_000]
    path = tmp_path_factory.mktemp("corpus") / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": text[i : i + 3000]}) + "\n" for i in range(0, len(text), 3000)))
    return path


@pytest.fixture
def gpu_inputs(tmp_path, monkeypatch):
    """The working dir the GPU studies expect: .cache/gpu/tok and classify-tok (a small BPE stands in for theirs)."""
    for name in ("tok", "classify-tok"):
        tokenizer("bart").save(tmp_path / ".cache" / "gpu" / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(autouse=True)
def no_process_group_left_behind():
    """A test that shards a model in this process (fsdp makes a one-process group) ends that group, so a later test on
    the same worker can start a process group of its own."""
    import torch.distributed as dist

    had = dist.is_available() and dist.is_initialized()
    yield
    if not had and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def torch_globals():
    """One torch thread while the test runs; deterministic-algorithm mode and the thread count put back after."""
    yield from restore_torch_globals()


# Module fixtures that train a run (or import lm_eval) for several tests. pytest-xdist's default scheduling can send
# a module's tests to different workers, and each worker then builds the fixture again; with `--dist loadgroup`
# (pyproject addopts) the tests that use one of these go to one worker as a group, and groups are scheduled first
# (largest first), so these long modules start early instead of ending the run.
SHARED_RUNS = {
    "test_align_cli.py": "sft_run",
    "test_align_ppo_run.py": "runs",
    "test_bench.py": "cpu_run",
    "test_compress_report.py": "teacher_run",
    "test_eval_harness.py": "runs",
    "test_finetune.py": "pretrained",
    "test_fsdp.py": "runs",
    "test_objectives_mae_lm.py": "run",
    "test_reliability_inputs.py": "small_run",
    "test_zeroshot_race_winograd.py": "pretrained",
}


@pytest.hookimpl(tryfirst=True)  # before xdist's worker hook reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixture = SHARED_RUNS.get(item.path.name)
        if fixture is not None and fixture in getattr(item, "fixturenames", ()):
            group = f"{item.path.stem}:{fixture}"
            item.add_marker(pytest.mark.xdist_group(group))
            if getattr(config.option, "loadgroup", False) and hasattr(getattr(item, "_id", None), "parse"):
                # xdist's worker (3.8) groups a test by renaming it "NODEID@GROUP" through `item._nodeid`, which
                # pytest 9 no longer reads (an item's nodeid is `str(item._id)`): without this, the group's tests
                # are spread over the workers and each worker builds the module fixture again.
                item._id = type(item._id).parse(f"{item.nodeid}@{group}")
