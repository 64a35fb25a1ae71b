"""Text corpora: the embedded default (Python's own standard library sources) or a user file/folder.

The embedded corpus needs no download: every machine that runs attnlab has CPython's ``.py`` files.
Files are read in sorted order of their relative path, and each file goes to validation when the
first byte of sha256(relative path) is < 26 (about 10%), so the split is deterministic and does not
shift when a file is added elsewhere. (Different Python versions ship different files, so the corpus
is fixed per Python version; its fingerprint is recorded.)
"""
from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from attnlab.errors import DataError

TEXT_SUFFIXES = {".py", ".txt", ".md", ".rst", ".json", ".html", ".c", ".h", ".csv", ".tex", ""}


@dataclass
class Corpus:
    train: bytes
    val: bytes
    source: str
    n_files: int

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.train + b"\0" + self.val).hexdigest()[:16]


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _is_val(rel: str) -> bool:
    return hashlib.sha256(rel.encode()).digest()[0] < 26


def _walk(root: Path, suffixes: set[str] | None):
    """Files under root, depth first, each folder's entries in sorted order; hidden folders,
    __pycache__ and site-packages skipped. A generator, so reading can stop at max_bytes early."""
    for p in sorted(root.iterdir()):
        if p.name.startswith(".") or p.name in ("site-packages", "__pycache__"):
            continue
        if p.is_dir():
            yield from _walk(p, suffixes)
        elif p.is_file() and (suffixes is None or p.suffix in suffixes):
            yield p


def load_corpus(path: str | None = None, max_bytes: int = 8_000_000) -> Corpus:
    """Read a corpus. ``path=None``: the standard library's .py files (excluding tests and site-packages)."""
    if path is None:
        root = stdlib_root()
        files = (p for p in _walk(root, {".py"}) if "test" not in p.relative_to(root).parts[0])
        source = f"python-stdlib:{root}"
    else:
        root = Path(path)
        if not root.exists():
            raise DataError(f"--data {path}: no such file or folder")
        files = [root] if root.is_file() else _walk(root, TEXT_SUFFIXES)
        source = str(root)
    train, val, used, total = [], [], 0, 0
    for f in files:
        if total >= max_bytes:
            break
        data = f.read_bytes()[: max_bytes - total]
        total += len(data)
        used += 1
        rel = f.name if root.is_file() else str(f.relative_to(root))
        (val if _is_val(rel) and not root.is_file() else train).append(data)
    train_b, val_b = b"".join(train), b"".join(val)
    if root.is_file() or not val_b:  # one file, or too few files for a file-level split: hold out the tail
        whole = train_b + val_b
        cut = int(len(whole) * 0.9)
        train_b, val_b = whole[:cut], whole[cut:]
    if len(train_b) < 2 or len(val_b) < 2:
        raise DataError(f"corpus {source!r} is empty or too small ({len(train_b) + len(val_b)} bytes); "
                        "point --data at a text file or folder with at least a few KB of text")
    return Corpus(train=train_b, val=val_b, source=source, n_files=used)
