"""User-facing errors: the CLI prints these as one line and exits non-zero."""

from __future__ import annotations

from difflib import get_close_matches


class LMForgeError(Exception):
    """An error caused by the user's input (files, config, arguments), reported as one clear line."""

    exit_code = 2


def did_you_mean(name: str, choices, otherwise: str = "", prefix: str = "") -> str:
    """The tail of an "unknown name" error: " — did you mean 'X'?" for the closest of `choices` (difflib's ratio
    ≥ 0.6, shown with `prefix`), else " (otherwise)" when `otherwise` is given, else ""."""
    hint = get_close_matches(name, list(choices), n=1)
    if hint:
        return f" — did you mean '{prefix}{hint[0]}'?"
    return f" ({otherwise})" if otherwise else ""
