"""MovieLens-100K with no hand download: the RecBole 1.2.1 wheel on the package registry ships it.

``python -m pip download --no-deps recbole==1.2.1`` puts the wheel (2 MB) in the user cache, once; the file
``recbole/dataset_example/ml-100k/ml-100k.inter`` is read from the wheel with ``zipfile``. RecBole is never
installed or imported, nothing else is fetched, and the data is never written into the repository.
"""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from attnlab.errors import DataError
from attnlab.recsys.data import Interactions, build_interactions, parse_inter

WHEEL_NAME = "recbole-1.2.1-py3-none-any.whl"
WHEEL_SPEC = "recbole==1.2.1"
MEMBERS = {"ml-100k": "recbole/dataset_example/ml-100k/ml-100k.inter"}


def cache_dir() -> Path:
    """attnlab's cache (runtime.cache_dir) / recsys."""
    from attnlab.runtime import cache_dir as root

    return root() / "recsys"


def cached_wheel(cache: Path | None = None) -> Path | None:
    """The wheel's path if it is already in the cache (no network), else None."""
    path = (cache or cache_dir()) / WHEEL_NAME
    return path if path.exists() else None


def download_wheel(cache: Path | None = None) -> Path:
    """The wheel in the cache, downloaded with pip the first time; a clear error if the registry is unreachable."""
    cache = cache or cache_dir()
    if (found := cached_wheel(cache)) is not None:
        return found
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", WHEEL_SPEC, "-d", str(cache)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DataError(f"could not run pip to fetch MovieLens-100K ({e}); download {WHEEL_NAME} by hand into "
                        f"{cache}, or pass --data PATH to a local file") from None
    if proc.returncode != 0 or cached_wheel(cache) is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise DataError(f"pip could not download {WHEEL_SPEC} (the wheel that ships MovieLens-100K): {tail[0]}. "
                        f"Is the package registry reachable? Put {WHEEL_NAME} in {cache} by hand, or use "
                        "--data synthetic or --data PATH")
    return cache / WHEEL_NAME


def read_from_wheel(wheel: Path, name: str = "ml-100k") -> Interactions:
    """Parse a dataset's .inter file straight out of the wheel (a zip)."""
    member = MEMBERS[name]
    try:
        with zipfile.ZipFile(wheel) as z:
            raw = z.read(member).decode("utf-8")
    except (zipfile.BadZipFile, OSError) as e:
        raise DataError(f"{wheel}: not a readable wheel ({e}); delete it so that it is downloaded again") from None
    except KeyError:
        raise DataError(f"{wheel}: has no {member}; delete it so that {WHEEL_SPEC} is downloaded again") from None
    label = f"{wheel}!{member}"
    lines = ((n, line) for n, line in enumerate(raw.splitlines(), 1) if line.strip())
    return build_interactions(parse_inter(Path(label), lines), name, source=label)


def load_ml100k(wheel: Path | None = None, cache: Path | None = None) -> Interactions:
    """MovieLens-100K (943 users, 1682 items, 100,000 ratings); ``wheel`` injects a local file (tests)."""
    return read_from_wheel(wheel or download_wheel(cache))
