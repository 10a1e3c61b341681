"""The lmforge tokenizer: a Hugging Face ``tokenizers.Tokenizer`` plus its family's special-token roles."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import tokenizers

from lmforge.errors import LMForgeError
from lmforge.files import loads_json
from lmforge.tokenizers.hf_call import HFTokenizerMixin
from lmforge.tokenizers.hf_fast import read_context
from lmforge.tokenizers.kinds import KINDS
from lmforge.tokenizers.specials import FAMILIES, ROLES, SPECS, infer_family, sentinel_token

TOKENIZER_FILE = "tokenizer.json"
META_FILE = "lmforge_tokenizer.json"
META_FORMAT = "lmforge-tokenizer"
META_VERSION = 1

_MODEL_KINDS = {"BPE": "bpe", "WordPiece": "wordpiece", "Unigram": "unigram"}


class Tokenizer(HFTokenizerMixin):
    """Text <-> token ids, with the special-token ids (bos, eos, pad, ...) of the model family it serves; callable
    as a `transformers` tokenizer (`tok(texts, padding=True, return_tensors="pt")`, tokenizers/hf_call.py)."""

    _FILES = (TOKENIZER_FILE, META_FILE)

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        special_tokens: dict[str, str],
        family: str | None = None,
    ) -> None:
        model_name = type(backend.model).__name__
        if model_name not in _MODEL_KINDS:
            msg = f"unsupported tokenizer model '{model_name}' (supported: BPE, WordPiece, Unigram)"
            raise LMForgeError(msg)
        self._backend = backend
        self._kind = _MODEL_KINDS[model_name]
        self._family = family
        self._special_tokens = dict(special_tokens)
        self.training: dict | None = None
        """How a tokenizer trained here was trained (its text sample, the trainer's options); saved with it."""
        self._ids: dict[str, int | None] = {role: None for role in ROLES}
        for role, text in self._special_tokens.items():
            if role not in ROLES:
                raise LMForgeError(f"unknown special-token role '{role}' (known: {', '.join(ROLES)})")
            tid = backend.token_to_id(text)
            if tid is None:
                raise LMForgeError(f"special token {text!r} ({role}) is not in the tokenizer's vocabulary")
            self._ids[role] = tid

    # ----------------------------------------------------------------- properties
    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The wrapped Hugging Face ``tokenizers.Tokenizer``."""
        return self._backend

    @property
    def kind(self) -> str:
        """Subword model: "bpe", "wordpiece" or "unigram"."""
        return self._kind

    @property
    def family(self) -> str | None:
        """Model family whose special-token convention this follows, or None when unknown."""
        return self._family

    @property
    def vocab_size(self) -> int:
        """Number of ids, special tokens included."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def special_tokens(self) -> dict[str, str]:
        """Role -> token text, e.g. ``{"eos": "</s>", "pad": "<pad>"}``."""
        return dict(self._special_tokens)

    @property
    def bos_id(self) -> int | None:
        return self._ids["bos"]

    @property
    def eos_id(self) -> int | None:
        return self._ids["eos"]

    @property
    def pad_id(self) -> int | None:
        return self._ids["pad"]

    @property
    def unk_id(self) -> int | None:
        return self._ids["unk"]

    @property
    def mask_id(self) -> int | None:
        return self._ids["mask"]

    @property
    def cls_id(self) -> int | None:
        return self._ids["cls"]

    @property
    def sep_id(self) -> int | None:
        return self._ids["sep"]

    @property
    def num_sentinels(self) -> int:
        """How many T5 sentinels ``<extra_id_0>``, ``<extra_id_1>``, ... the vocabulary holds."""
        n = 0
        while self._backend.token_to_id(sentinel_token(n)) is not None:
            n += 1
        return n

    def sentinel_ids(self, n: int) -> list[int]:
        """Ids of the first ``n`` T5 sentinels, ``<extra_id_0>`` first (T5 gives it the highest id)."""
        ids = [self._backend.token_to_id(sentinel_token(i)) for i in range(n)]
        if any(i is None for i in ids):
            raise LMForgeError(f"tokenizer has {self.num_sentinels} sentinel tokens (<extra_id_N>), {n} were asked for")
        return ids  # type: ignore[return-value]

    def set_special_token(self, role: str, token: str) -> None:
        """Give special-token role `role` (pad, eos, ...) to `token`, which must be in the vocabulary."""
        if role not in ROLES:
            raise LMForgeError(f"unknown special-token role '{role}' (known: {', '.join(ROLES)})")
        tid = self._backend.token_to_id(token) if isinstance(token, str) else None
        if tid is None:
            raise LMForgeError(f"special token {token!r} ({role}) is not in the tokenizer's vocabulary")
        self._special_tokens[role], self._ids[role] = token, tid

    # ----------------------------------------------------------------- encoding
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; no special tokens are added."""
        return self._backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of many texts, encoded in parallel by the Rust batch encoder."""
        texts = list(texts)
        # encode_batch_fast (tokenizers >= 0.20) skips offset tracking, which we never use.
        fast = getattr(self._backend, "encode_batch_fast", None)
        encs = (fast or self._backend.encode_batch)(texts, add_special_tokens=False)
        return [e.ids for e in encs]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids`` (ints, or numpy/torch integer scalars)."""
        return self._backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def decode_batch(self, batch: Iterable[Iterable[int]], skip_special_tokens: bool = True) -> list[str]:
        """Texts of several id sequences."""
        seqs = [[int(i) for i in ids] for ids in batch]
        return self._backend.decode_batch(seqs, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        """Id of a token's text, or None when it is not in the vocabulary."""
        return self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """Text of a token id, or None when out of range."""
        return self._backend.id_to_token(int(token_id))

    def __repr__(self) -> str:
        return f"Tokenizer(kind={self.kind!r}, family={self.family!r}, vocab_size={self.vocab_size})"

    # ----------------------------------------------------------------- files
    def save(self, directory: str | Path) -> Path:
        """Write ``tokenizer.json`` (Hugging Face format) and ``lmforge_tokenizer.json`` to ``directory``."""
        directory = Path(directory)
        if directory.exists() and not directory.is_dir():
            raise LMForgeError(f"cannot save tokenizer: {directory} is a file, expected a directory")
        directory.mkdir(parents=True, exist_ok=True)
        self._backend.save(str(directory / TOKENIZER_FILE))
        meta = {
            "format": META_FORMAT,
            "version": META_VERSION,
            "kind": self.kind,
            "family": self.family,
            "special_tokens": self._special_tokens,
        }
        if self.training is not None:
            meta["training"] = self.training
        (directory / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        return directory

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Load from a directory written by ``save`` or from a ``tokenizer.json`` file.

        Without ``lmforge_tokenizer.json`` next to it (e.g. a Hugging Face tokenizer), the family and
        special-token roles are inferred from the tokens in the vocabulary. A tokenizer_config.json or an lmforge
        config.yaml beside it gives model_max_length, the chat template and the padding side (`set_context`).
        """
        path = Path(path)
        file = path / TOKENIZER_FILE if path.is_dir() else path
        if not file.exists():
            where = f"no {TOKENIZER_FILE} in directory {path}" if path.is_dir() else f"{path} does not exist"
            raise LMForgeError(f"cannot load tokenizer: {where}")
        try:
            backend = tokenizers.Tokenizer.from_file(str(file))
        except Exception as e:  # tokenizers raises a bare Exception on malformed JSON
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            msg = f"cannot load tokenizer: {file} is not a valid tokenizer.json ({reason})"
            raise LMForgeError(msg) from e
        meta_file = file.parent / META_FILE
        training = None
        if meta_file.exists():
            kind, family, roles = _read_meta(meta_file)
            training = loads_json(meta_file.read_text(encoding="utf-8")).get("training")
            actual = _MODEL_KINDS.get(type(backend.model).__name__)
            if kind != actual:
                msg = f"cannot load tokenizer: {meta_file} says kind {kind!r} but {file} holds {actual!r}"
                raise LMForgeError(msg)
        else:
            family = infer_family(backend.token_to_id)
            roles = _roles_for(family, backend)
        tok = cls(backend, roles, family)
        tok.training = training if isinstance(training, dict) else None
        tok.set_context(read_context(file.parent))  # model_max_length, chat template: the model's beside it
        return tok


def _read_meta(meta_file: Path) -> tuple[str, str | None, dict[str, str]]:
    """Kind, family and role map from ``lmforge_tokenizer.json``, validated."""
    try:
        meta = loads_json(meta_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LMForgeError(f"cannot load tokenizer: {meta_file} is not valid JSON ({e})") from e
    if not isinstance(meta, dict) or meta.get("format") != META_FORMAT:
        raise LMForgeError(f"cannot load tokenizer: {meta_file} is not an lmforge tokenizer description")
    if meta.get("version") != META_VERSION:
        version = meta.get("version")
        raise LMForgeError(f"cannot load tokenizer: {meta_file} has unsupported version {version!r}")
    family, roles, kind = meta.get("family"), meta.get("special_tokens"), meta.get("kind")
    if family is not None and family not in FAMILIES:
        raise LMForgeError(f"cannot load tokenizer: {meta_file} names unknown family {family!r}")
    if kind not in KINDS:
        raise LMForgeError(f"cannot load tokenizer: {meta_file} names unknown kind {kind!r}")
    if not isinstance(roles, dict) or not all(isinstance(v, str) for v in roles.values()):
        raise LMForgeError(f"cannot load tokenizer: {meta_file} has a malformed 'special_tokens' map")
    return kind, family, roles


def _roles_for(family: str | None, backend: tokenizers.Tokenizer) -> dict[str, str]:
    """Role map of ``family`` restricted to tokens present in ``backend``'s vocabulary."""
    if family is None:
        return {}
    return {r: t for r, t in SPECS[family].roles.items() if backend.token_to_id(t) is not None}
