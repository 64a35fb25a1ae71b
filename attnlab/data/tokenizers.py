"""Tokenizers: a lossless byte-level one (vocab 256) and BPE trained with Hugging Face ``tokenizers``.

Both expose ``encode(bytes | str) -> list[int]``, ``decode(ids) -> bytes``, ``decode_text(ids) -> str``
and ``vocab_size``. The byte tokenizer round-trips any byte string, invalid UTF-8 included.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from attnlab.errors import DataError


class ByteTokenizer:
    name = "byte"
    vocab_size = 256

    def encode(self, data: bytes | str, special: bool = True) -> list[int]:
        """``special`` is accepted for a common signature: bytes have no special tokens to add."""
        return list(data.encode("utf-8") if isinstance(data, str) else bytes(data))

    def decode(self, ids: Iterable[int]) -> bytes:
        ids = list(ids)
        bad = [i for i in ids if not 0 <= i < 256]
        if bad:
            raise DataError(f"byte tokenizer got ids outside 0..255: {bad[:5]}")
        return bytes(ids)

    def decode_text(self, ids: Iterable[int]) -> str:
        return self.decode(ids).decode("utf-8", errors="replace")

    def save(self, folder: str | Path) -> None:
        """Nothing to save: the byte tokenizer is fully described by its name in config.json."""


class BPETokenizer:
    """Byte-level BPE (GPT-2 style) backed by ``tokenizers``; saved and loaded as tokenizer.json."""

    name = "bpe"

    def __init__(self, tok):
        self._tok = tok

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> "BPETokenizer":
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    @classmethod
    def load(cls, path: str | Path) -> "BPETokenizer":
        from tokenizers import Tokenizer

        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.exists():
            raise DataError(f"{path} not found: a BPE model needs its tokenizer.json beside the weights")
        try:
            return cls(Tokenizer.from_file(str(path)))
        except Exception as e:  # tokenizers raises a plain Exception on malformed JSON
            raise DataError(f"{path}: not a valid tokenizer.json ({e})") from None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def encode(self, data: bytes | str, special: bool = True) -> list[int]:
        """``special=False``: no BOS/EOS from the tokenizer's post-processor (a rendered chat template holds its
        own special tokens already)."""
        if isinstance(data, bytes):
            try:
                data = data.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"BPE tokenizer needs valid UTF-8 text ({e}); use the byte tokenizer for "
                                "arbitrary bytes") from None
        return self._tok.encode(data, add_special_tokens=special).ids

    def decode(self, ids: Iterable[int]) -> bytes:
        return self.decode_text(ids).encode("utf-8")

    def decode_text(self, ids: Iterable[int]) -> str:
        return self._tok.decode(list(ids))

    def save(self, folder: str | Path) -> None:
        self._tok.save(str(Path(folder) / "tokenizer.json"))


def load_tokenizer(kind: str, folder: str | Path | None = None):
    if kind == "byte":
        return ByteTokenizer()
    if kind == "bpe":
        if folder is None:
            raise DataError("a BPE tokenizer is loaded from a folder holding tokenizer.json")
        return BPETokenizer.load(folder)
    raise DataError(f"unknown tokenizer {kind!r}; choose byte or bpe")
