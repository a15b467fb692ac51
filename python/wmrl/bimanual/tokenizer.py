"""Caption tokenizer built from a bundle's own captions and stored in ``resources/tokenizer/``.

Nothing is downloaded: the vocabulary is every lower-cased word of the bundle's captions
(sorted, so the same captions always give the same ids) plus four special tokens. Words
outside the vocabulary map to ``<unk>``, so a model trained on one bundle still reads
captions it has not seen.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from wmrl.fileio import read_json, write_json

SPECIALS = ("<pad>", "<unk>", "<bos>", "<eos>")
PAD, UNK, BOS, EOS = range(4)
_WORD = re.compile(r"[a-z0-9]+|[^\sa-z0-9]")
TOKENIZER_FILE = "tokenizer.json"


class TokenizerError(ValueError):
    pass


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


@dataclass
class CaptionTokenizer:
    vocab: list[str]
    max_length: int = 32

    def __post_init__(self) -> None:
        if tuple(self.vocab[: len(SPECIALS)]) != SPECIALS:
            raise TokenizerError(f"tokenizer vocabulary must start with {SPECIALS}")
        self._ids = {w: i for i, w in enumerate(self.vocab)}

    @classmethod
    def build(cls, captions: list[str], max_length: int = 32) -> "CaptionTokenizer":
        vocab = sorted({w for c in captions for w in words(c)})
        return cls(list(SPECIALS) + vocab, max_length)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> tuple[list[int], list[bool]]:
        """Fixed-length ids and mask: <bos> words <eos>, truncated, then padded."""
        ids = [BOS] + [self._ids.get(w, UNK) for w in words(text)][: self.max_length - 2] + [EOS]
        mask = [True] * len(ids) + [False] * (self.max_length - len(ids))
        return ids + [PAD] * (self.max_length - len(ids)), mask

    def decode(self, ids) -> str:
        return " ".join(self.vocab[i] for i in ids if i not in (PAD, BOS, EOS))

    def save(self, folder: str | os.PathLike) -> Path:
        path = Path(folder) / TOKENIZER_FILE
        write_json(path, {"type": "wmrl-word-tokenizer", "max_length": self.max_length, "vocab": self.vocab})
        return path

    @classmethod
    def load(cls, folder: str | os.PathLike) -> "CaptionTokenizer":
        d = read_json(Path(folder) / TOKENIZER_FILE, TokenizerError, "missing; the bundle's resources/tokenizer/ is incomplete (rebuild the bundle)")
        if d.get("type") != "wmrl-word-tokenizer":
            raise TokenizerError(f"{folder}: not a wmrl word tokenizer (type={d.get('type')!r})")
        return cls(list(d["vocab"]), int(d["max_length"]))
