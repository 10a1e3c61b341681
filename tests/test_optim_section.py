"""One optimiser section: every run kind's `train` section is OptimConfig's keys with the kind's own defaults, each
key declared once (type, range, docstring) in config/sections.py."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from lmforge.config.core import field_types
from lmforge.config.sections import OptimConfig, optim_defaults
from lmforge.run_kinds import RUN_KINDS


def _train_sections():
    for kind, entry in RUN_KINDS.items():
        schema = entry.schema()
        train = next(f for f in dataclasses.fields(schema) if f.name in ("train", "distill"))
        yield kind, field_types(schema)[train.name]


def test_every_kinds_train_section_takes_the_shared_keys_with_their_one_type():
    shared = field_types(OptimConfig)
    for kind, section in _train_sections():
        assert issubclass(section, OptimConfig), kind
        types = field_types(section)
        assert {k: types[k] for k in shared} == shared, kind


def test_a_kinds_defaults_differ_only_in_value():
    from lmforge.tasks.config import FtTrainConfig

    assert FtTrainConfig().lr == 6.25e-5 and OptimConfig().lr == 6e-4
    assert field_types(FtTrainConfig)["warmup_ratio"] == field_types(OptimConfig)["warmup_ratio"]


def test_optim_defaults_refuses_a_key_that_is_not_the_sections():
    with pytest.raises(TypeError, match=r"\['lrr'\]"):

        @dataclass
        @optim_defaults(lrr=1e-3)
        class Bad(OptimConfig):
            pass
