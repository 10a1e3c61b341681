"""The run-kind table: every kind's schema, default recipe and resolved config come from one entry, and
`run(kind, cfg, resume)` runs a loaded config of any kind."""

from __future__ import annotations

import dataclasses
import json

import pytest
import tasks_testing as T
from training_testing import restore_torch_globals

from lmforge.cli.args import schema_of
from lmforge.cli.config_show import KINDS, default_recipe, resolved_tree
from lmforge.cli.help import kind_help
from lmforge.errors import LMForgeError
from lmforge.run_kinds import RUN_KINDS, run, run_kind


@pytest.fixture(autouse=True)
def _torch_globals():
    yield from restore_torch_globals()


def test_the_table_holds_the_four_kinds_and_config_show_iterates_it():
    assert KINDS == tuple(RUN_KINDS) == ("pretrain", "finetune", "align", "compress")
    assert [default_recipe(k) for k in KINDS] == ["demo", "sst2-gpt", "sft-sentiment", "sentiment-gpt"]
    assert default_recipe("align", "dpo") == "dpo-continuation"
    for kind in KINDS:
        schema = schema_of(kind)
        assert schema is run_kind(kind).schema()
        tree = resolved_tree(None, kind, [])
        fields = {f.name for f in dataclasses.fields(schema)}
        assert tree and set(tree) <= fields | {"method"}, kind
    assert schema_of("scaling") is schema_of("pretrain")  # the commands that pretrain take its keys


def test_each_kinds_help_lists_its_schemas_keys():
    for kind, key in (("pretrain", "train.lr"), ("finetune", "task.type"), ("align", "dpo.beta"),
                      ("compress", "distill.device")):  # fmt: skip
        text = kind_help(kind, None, [])
        assert f"recipes (recipes/{kind})" in text and f"  {key}" in text, kind


def test_an_unknown_kind_is_one_line():
    with pytest.raises(
        LMForgeError, match=r"^unknown run kind 'distill' \(known: pretrain, finetune, align, compress\)$"
    ):
        run_kind("distill")


def test_run_runs_a_loaded_config_of_its_kind(tmp_path):
    from lmforge.tasks.config import load_finetune_config

    data = T.write_labelled_dir(tmp_path / "d", {"train": T.sentiment(24), "dev": T.sentiment(8, seed=3)})
    over = [f"--run.dir={tmp_path / 'run'}", "--data.source=dir", f"--data.dir={data}", "--train.max_steps=2",
            "--train.batch_size=8", "--model.vocab_size=200", "--train.device=cpu"]  # fmt: skip
    started = []
    done = run("finetune", load_finetune_config("sst2-bert", over), on_start=started.append)
    assert done.metrics == json.loads((tmp_path / "run" / "eval.json").read_text())
    assert set(done.metrics) >= {"accuracy"}
    assert done.run_dir == tmp_path / "run" and done.is_main
    assert started == [done.job] and done.job.total_steps == 2  # told once the run is built, before it trains


def test_no_code_branches_on_a_kind_name():
    """What differs between kinds (run kinds, arm kinds, tokenizer kinds, attention kinds, head kinds, budget units,
    ...) comes from each kind's table entry, never from comparing the kind with a name."""
    import re
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src" / "lmforge"
    branch = re.compile(r"""kind *==|(kind|stage) *!= *["']""")
    found = [
        f"{p.relative_to(src)}:{n}"
        for p in src.rglob("*.py")
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if branch.search(line)
    ]
    assert found == []


def test_the_run_kind_packages_leave_the_python_apis_names_alone():
    """`lmforge.pretrain(...)` and `lmforge.finetune(...)` stay the API's functions once the run kinds' packages
    are imported (a package named like them would replace the attribute)."""
    import lmforge
    import lmforge.finetuning.run  # noqa: F401
    import lmforge.pretraining.run  # noqa: F401

    assert callable(lmforge.pretrain) and callable(lmforge.finetune)


def test_a_bundled_recipe_name_is_not_shadowed_by_a_directory_of_that_name(tmp_path, monkeypatch):
    from lmforge.config import RECIPES_DIR, resolve_recipe

    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpt").mkdir()  # e.g. an experiment's --out ./gpt
    assert resolve_recipe("gpt", "pretrain") == RECIPES_DIR / "pretrain" / "gpt.yaml"
    (tmp_path / "mine").mkdir()
    with pytest.raises(LMForgeError, match=r"^recipe file not found: mine$"):
        resolve_recipe("mine", "pretrain")
