"""User-facing errors: the CLI prints these as one line and exits non-zero."""

from __future__ import annotations


class LMForgeError(Exception):
    """An error caused by the user's input (files, config, arguments), reported as one clear line."""

    exit_code = 2
