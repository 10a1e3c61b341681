"""tiktoken's GPT-2 encoding, built offline from the ``gpt2.tiktoken`` file shipped in openai-whisper's sdist.

``tiktoken.get_encoding("gpt2")`` downloads its files from the internet; here the same ranks come from PyPI
instead (``pip download``), and are cached under lmforge's cache root.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import tiktoken
import tiktoken.load

WHISPER_SDIST = "openai-whisper==20250625"
GPT2_TIKTOKEN_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
try:  # GPT-2's pre-tokenization pattern, as tiktoken's own gpt2 encoding uses it
    from tiktoken_ext.openai_public import r50k_pat_str as GPT2_PAT_STR
except ImportError:  # older tiktoken kept it inline; this is GPT-2's original pattern
    GPT2_PAT_STR = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
ENDOFTEXT = "<|endoftext|>"


def cache_root() -> Path:
    env = os.environ.get("LMFORGE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "lmforge"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fetch_gpt2_tiktoken() -> Path:
    """Path of a verified ``gpt2.tiktoken``, downloaded with pip on first use."""
    path = cache_root() / "tiktoken" / "gpt2.tiktoken"
    if path.is_file() and _sha256(path.read_bytes()) == GPT2_TIKTOKEN_SHA256:
        return path
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", WHISPER_SDIST]
        proc = subprocess.run([*cmd, "-d", tmp], capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"pip download {WHISPER_SDIST} failed: {proc.stderr.strip()[-500:]}")
        sdist = next(Path(tmp).glob("*.tar.gz"))
        with tarfile.open(sdist, "r:gz") as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith("/whisper/assets/gpt2.tiktoken"))
            fh = tar.extractfile(member)
            data = fh.read() if fh is not None else b""
    if _sha256(data) != GPT2_TIKTOKEN_SHA256:
        raise RuntimeError(f"gpt2.tiktoken from {WHISPER_SDIST} has an unexpected checksum")
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_suffix(".part")
    part.write_bytes(data)
    os.replace(part, path)
    return path


def gpt2_encoding() -> tiktoken.Encoding:
    """tiktoken's ``gpt2`` encoding (same name, pattern, ranks and special token as get_encoding)."""
    ranks = tiktoken.load.load_tiktoken_bpe(str(fetch_gpt2_tiktoken()), expected_hash=GPT2_TIKTOKEN_SHA256)
    return tiktoken.Encoding(
        name="gpt2", pat_str=GPT2_PAT_STR, mergeable_ranks=ranks, special_tokens={ENDOFTEXT: 50256}
    )
