"""Architecture and position facts of `ModelConfig`, and the rule that code outside models/ asks them instead of
comparing `position` or `arch` to a string."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import get_args

import pytest

from lmforge.errors import LMForgeError
from lmforge.models import get_preset
from lmforge.models.config import Position
from lmforge.models.position_schemes import POSITION_SCHEMES

SRC = Path(__file__).resolve().parents[1] / "src" / "lmforge"
# A comparison of a position kind: `cfg.position == "learned"`, `position != 'xl'`, `position in (...)`.
POSITION_CHECK = re.compile(r"\bposition\s*(==|!=|not\s+in\b|in\b)")
ARCH_CHECK = re.compile(r"\barch\s*(==|!=)")
MAX_ARCH_CHECKS = 5


def _outside_models() -> list[Path]:
    return [p for p in sorted(SRC.rglob("*.py")) if "models" not in p.relative_to(SRC).parts]


def _hits(pattern: re.Pattern) -> list[str]:
    return [
        f"{path.relative_to(SRC)}:{n}: {line.strip()}"
        for path in _outside_models()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if pattern.search(line)
    ]


def test_no_position_string_checks_outside_models():
    assert _outside_models(), "no source files found"
    assert _hits(POSITION_CHECK) == []


def test_few_arch_string_checks_outside_models():
    hits = _hits(ARCH_CHECK)
    assert len(hits) <= MAX_ARCH_CHECKS, "\n".join(hits)


def test_the_greps_can_fail():
    assert POSITION_CHECK.search('if cfg.position == "learned":')
    assert POSITION_CHECK.search("if m.position not in ABSOLUTE:")
    assert POSITION_CHECK.search('if cfg.position in ("alibi", "t5_bias"):')
    assert ARCH_CHECK.search('if model.config.arch != "decoder":')
    assert not POSITION_CHECK.search("cfg.position_scheme.learned_table")
    assert not ARCH_CHECK.search("cfg.is_decoder")


def test_every_position_kind_has_one_scheme():
    assert list(POSITION_SCHEMES) == list(get_args(Position))
    assert all(name == s.name for name, s in POSITION_SCHEMES.items())


def test_gpt2_decoder_with_learned_positions():
    cfg = get_preset("gpt2-124m")
    assert (cfg.is_decoder, cfg.is_encoder, cfg.is_encoder_decoder) == (True, False, False)
    assert (cfg.has_decoder, cfg.has_encoder, cfg.input_stack) == (True, False, "decoder")
    s = cfg.position_scheme
    assert s.learned_table and s.absolute_table and s.per_token
    assert not (s.rotary or s.per_head_bias or s.recurrent)
    assert cfg.max_positions == cfg.max_seq_len == 1024
    cfg.check_length(1024)
    with pytest.raises(LMForgeError, match="^sequence of length 1025 exceeds max_seq_len 1024$"):
        cfg.check_length(1025)
    with pytest.raises(LMForgeError, match="^n=1025, limit=1024$"):
        cfg.check_length(1025, "n={n}, limit={limit}")


def test_learned_limit_follows_max_seq_len_not_the_offset():
    cfg = dataclasses.replace(get_preset("gpt2-124m"), max_seq_len=64, position_offset=2)
    assert cfg.max_positions == 64


def test_t5_encoder_decoder_with_relative_bias_and_no_limit():
    cfg = get_preset("t5-small")
    assert (cfg.is_decoder, cfg.is_encoder, cfg.is_encoder_decoder) == (False, False, True)
    assert (cfg.has_decoder, cfg.has_encoder, cfg.input_stack) == (True, True, "encoder")
    s = cfg.position_scheme
    assert s.per_head_bias and not (s.learned_table or s.absolute_table or s.rotary or s.per_token)
    assert cfg.max_positions is None
    cfg.check_length(10**6)  # no limit: no error


def test_bert_encoder_with_learned_positions():
    cfg = get_preset("bert-base")
    assert (cfg.is_decoder, cfg.is_encoder, cfg.is_encoder_decoder) == (False, True, False)
    assert (cfg.has_decoder, cfg.has_encoder, cfg.input_stack) == (False, True, "encoder")
    assert cfg.max_positions == 512


def test_llama_rotary_without_limit():
    cfg = get_preset("llama-tiny")
    assert cfg.is_decoder
    s = cfg.position_scheme
    assert s.rotary and s.per_token and not (s.absolute_table or s.per_head_bias)
    assert cfg.max_positions is None


@pytest.mark.parametrize(
    ("position", "facts"),
    [
        ("sinusoidal", {"absolute_table", "per_token"}),
        ("alibi", {"per_head_bias"}),
        ("shaw", set()),
        ("xl", {"recurrent"}),
        ("none", {"per_token"}),
    ],
)
def test_other_schemes(position, facts):
    s = POSITION_SCHEMES[position]
    fields = {f.name for f in dataclasses.fields(s) if f.type == "bool"}
    assert {f for f in fields if getattr(s, f)} == facts
    assert s.max_positions(128) is None
