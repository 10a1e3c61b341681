"""Trained tokenizers cached by content: the hash of the exact training text and every training setting.

A run that would train the same tokenizer again (same text, kind, family, size, options, `tokenizers` version)
loads it from ``$LMFORGE_CACHE/tokenizers/<key>/`` instead (default ``~/.cache/lmforge/tokenizers``).
``LMFORGE_TOKENIZER_CACHE`` moves this directory, or turns the cache off with ``off``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from lmforge.errors import LMForgeError

ENV_VAR = "LMFORGE_TOKENIZER_CACHE"
KEY_VERSION = 1  # bump when training changes in a way the settings do not show


def cache_dir() -> Path | None:
    """Where trained tokenizers are cached, or None when the cache is off."""
    env = os.environ.get(ENV_VAR, "")
    if env.lower() in ("off", "0", "none", "false"):
        return None
    if env:
        return Path(env).expanduser()
    from lmforge.files import cache_root

    return cache_root() / "tokenizers"


def cache_key(texts: Iterable[str], settings: dict) -> str:
    """SHA-256 (hex, 32 digits) of the settings and the texts, each text length-prefixed so that no two different
    lists of texts hash alike."""
    import tokenizers

    h = hashlib.sha256()
    head = {"key_version": KEY_VERSION, "tokenizers": tokenizers.__version__, **settings}
    h.update(json.dumps(head, sort_keys=True).encode())
    for text in texts:
        data = text.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()[:32]


def load_cached(key: str):
    """The cached tokenizer of `key`, or None (no cache, not cached, or unreadable: it is then trained again)."""
    from lmforge.tokenizers.core import Tokenizer

    root = cache_dir()
    if root is None or not (root / key / "tokenizer.json").is_file():
        return None
    try:
        return Tokenizer.load(root / key)
    except LMForgeError:
        return None


def store(key: str, tokenizer) -> Path | None:
    """Save `tokenizer` under `key` (atomically: a scratch dir renamed into place); None when the cache is off or
    cannot be written (caching is an optimisation: a read-only home does not stop a run)."""
    root = cache_dir()
    if root is None:
        return None
    final, tmp = root / key, root / f".{key}.tmp-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tokenizer.save(tmp)
        shutil.rmtree(final, ignore_errors=True)  # an unreadable earlier copy
        os.replace(tmp, final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        return None
    return final
