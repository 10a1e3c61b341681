"""Configuration: the core that builds and checks typed dataclasses from recipes and overrides (core.py), the
rules of resuming (resume.py), the sections several run kinds share (sections.py) and the range-checked field types
(types.py). Nothing here imports a run kind, a model or data: each kind's schema lives beside the kind."""

from lmforge.config.core import (
    RECIPES_DIR,
    all_keys,
    build_dataclass,
    check_sections,
    coerce,
    field_types,
    flat_keys,
    get_key,
    has_key,
    merge_dicts,
    parse_overrides,
    read_yaml,
    recipe_dict,
    resolve_recipe,
    type_name,
    write_yaml,
)
from lmforge.config.resume import (
    CHANGEABLE_ON_RESUME,
    FIXED_ON_RESUME,
    RESUME_FIXED,
    resolved_run_dir,
    resumed,
    saved_run_config,
)

__all__ = [
    "CHANGEABLE_ON_RESUME",
    "FIXED_ON_RESUME",
    "RECIPES_DIR",
    "RESUME_FIXED",
    "all_keys",
    "build_dataclass",
    "check_sections",
    "coerce",
    "field_types",
    "flat_keys",
    "get_key",
    "has_key",
    "merge_dicts",
    "parse_overrides",
    "read_yaml",
    "recipe_dict",
    "resolve_recipe",
    "resolved_run_dir",
    "resumed",
    "saved_run_config",
    "type_name",
    "write_yaml",
]
