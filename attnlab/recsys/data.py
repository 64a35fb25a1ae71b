"""Interaction files -> one time-ordered item sequence per user.

Formats, chosen by the file's name (each row is one interaction: user, item, timestamp):

    *.inter       RecBole atomic file: tab-separated, typed header ``user_id:token item_id:token ... timestamp:float``
    ratings.dat   MovieLens 1M/10M: ``user::item::rating::timestamp``
    u.data        MovieLens 100K: tab-separated ``user item rating timestamp``
    ratings.csv   MovieLens 20M/25M/latest: header ``userId,movieId,rating,timestamp``
    *.csv         generic: a header naming ``user``, ``item`` and ``timestamp`` (any order, other columns ignored)

Ids are kept as strings (RecBole tokens may be any string); MovieLens files and the generic CSV must hold integer ids.
Sequences are sorted stably by timestamp, so ties keep file order (split.py relies on it). Every bad input is a
``DataError`` naming the file, the line and the fix.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from attnlab.errors import DataError

MIN_INTERACTIONS = 3  # leave-one-out needs a training item, a validation item and a test item
RECBOLE_TYPES = ("token", "token_seq", "float", "float_seq")


@dataclass
class Interactions:
    """Users' histories: ``sequences[u]`` lists item ids (1..n_items; 0 is padding) in time order."""

    name: str
    sequences: list[list[int]]
    n_items: int
    user_ids: list[str]  # original id of each user, in order of first appearance
    item_ids: list[str]  # original id of item i at index i - 1
    dropped_users: int = 0

    @property
    def n_users(self) -> int:
        return len(self.sequences)

    @property
    def n_interactions(self) -> int:
        return sum(map(len, self.sequences))

    def describe(self) -> dict:
        lens = sorted(map(len, self.sequences))
        return {"name": self.name, "users": self.n_users, "items": self.n_items, "interactions": self.n_interactions,
                "median_history": lens[len(lens) // 2], "max_history": lens[-1], "dropped_users": self.dropped_users}


def _fail(path, line_no, problem: str, fix: str):
    where = f"{path}, line {line_no}" if line_no else str(path)
    raise DataError(f"{where}: {problem}; {fix}")


def _number(path, line_no, field: str, value: str, integer: bool, fix: str) -> float:
    try:
        return int(value) if integer else float(value)
    except ValueError:
        kind = "an integer" if integer else "a number"
        _fail(path, line_no, f"{field} {value!r} is not {kind}", fix)


def _lines(path: Path):
    if not path.exists():
        raise DataError(f"{path}: no such file; pass an existing interactions file, --data ml-100k or --data synthetic")
    if path.is_dir():
        raise DataError(f"{path} is a folder; pass the interactions file inside it (e.g. u.data, ratings.dat, *.inter)")
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if line.strip():
                yield n, line


def _columns(path, n, line, sep, count, example):
    parts = line.split(sep)
    if len(parts) < count:
        shown = "tab" if sep == "\t" else repr(sep)
        _fail(path, n, f"expected {count} {shown}-separated columns, found {len(parts)} in {line[:60]!r}",
              f"each line must look like {example}")
    return parts


def parse_inter(path: Path, text_lines=None):
    """RecBole atomic file -> rows (user, item, timestamp or None, line number)."""
    lines = iter(text_lines if text_lines is not None else _lines(path))
    try:
        n, header = next(lines)
    except StopIteration:
        raise DataError(f"{path}: the file is empty; a RecBole .inter file starts with a typed header") from None
    fields = header.split("\t")
    names = []
    for f in fields:
        name, _, typ = f.partition(":")
        if typ not in RECBOLE_TYPES:
            _fail(path, n, f"header field {f!r} is not a RecBole typed field (name:type, type one of "
                  f"{', '.join(RECBOLE_TYPES)}), separated by tabs",
                  "start the file with e.g. 'user_id:token<TAB>item_id:token<TAB>timestamp:float'")
        names.append(name)
    for need in ("user_id", "item_id"):
        if need not in names:
            _fail(path, n, f"the header has no {need} field", f"name the column '{need}:token'")
    iu, ii = names.index("user_id"), names.index("item_id")
    it = names.index("timestamp") if "timestamp" in names else None
    for n, line in lines:
        parts = _columns(path, n, line, "\t", len(fields), "the header's fields, tab-separated")
        ts = None if it is None else _number(path, n, "timestamp", parts[it], False, "timestamps must be numbers")
        yield parts[iu], parts[ii], ts, n


def _movielens(path: Path, sep: str, example: str, skip_header: bool):
    lines = _lines(path)
    if skip_header:
        for n, header in lines:
            if header.split(",")[:2] != ["userId", "movieId"]:
                _fail(path, n, f"header {header[:60]!r} is not MovieLens' 'userId,movieId,rating,timestamp'",
                      "use the MovieLens ratings.csv as released, or rename the file and give it a "
                      "'user,item,timestamp' header")
            break
    for n, line in lines:
        parts = _columns(path, n, line, sep, 4, example)
        fix = "MovieLens ids are integers and timestamps are seconds; check the delimiter and the column order"
        u = _number(path, n, "user id", parts[0], True, fix)
        i = _number(path, n, "item id", parts[1], True, fix)
        yield str(u), str(i), _number(path, n, "timestamp", parts[3], False, fix), n


def _generic_csv(path: Path):
    lines = _lines(path)
    try:
        n, header = next(lines)
    except StopIteration:
        raise DataError(f"{path}: the file is empty; give it a 'user,item,timestamp' header and one row per "
                        "interaction") from None
    names = [h.strip().lower() for h in header.split(",")]
    if names[:2] == ["userid", "movieid"]:
        yield from _movielens(path, ",", "'1,31,2.5,1260759144'", skip_header=True)
        return
    missing = [c for c in ("user", "item", "timestamp") if c not in names]
    if missing:
        _fail(path, n, f"the header {header[:60]!r} has no column {', '.join(missing)}",
              "start the file with a header line 'user,item,timestamp' (comma-separated)")
    iu, ii, it = names.index("user"), names.index("item"), names.index("timestamp")
    fix = "ids must be integers and timestamps numbers, comma-separated as the header says"
    for n, line in lines:
        parts = _columns(path, n, line, ",", len(names), "'7,42,1700000000'")
        u = _number(path, n, "user id", parts[iu].strip(), True, fix)
        i = _number(path, n, "item id", parts[ii].strip(), True, fix)
        yield str(u), str(i), _number(path, n, "timestamp", parts[it].strip(), False, fix), n


def read_rows(path: str | Path):
    """The rows of an interactions file, in file order, by the format its name implies."""
    path = Path(path)
    name = path.name.lower()
    if name.endswith(".inter"):
        return list(parse_inter(path))
    if name.endswith(".dat"):
        return list(_movielens(path, "::", "'1::1193::5::978300760'", skip_header=False))
    if name.endswith(".data") or name.endswith(".tsv"):
        return list(_movielens(path, "\t", "'196<TAB>242<TAB>3<TAB>881250949'", skip_header=False))
    if name.endswith(".csv"):
        return list(_generic_csv(path))
    raise DataError(f"{path}: unknown format (by its name); use a RecBole .inter file, MovieLens ratings.dat, u.data "
                    "or ratings.csv, or a .csv with a 'user,item,timestamp' header")


def build_interactions(rows, name: str, source=None) -> Interactions:
    """Rows (user, item, timestamp, line) -> per-user sequences, stably sorted by time; users with fewer than
    MIN_INTERACTIONS are dropped. A missing timestamp (a .inter file without one) keeps file order."""
    per_user: dict[str, list[tuple[float, str]]] = {}
    for user, item, ts, _ in rows:
        per_user.setdefault(user, []).append((0.0 if ts is None else ts, item))
    kept = {u: sorted(h, key=lambda p: p[0]) for u, h in per_user.items() if len(h) >= MIN_INTERACTIONS}  # stable sort
    if not kept:
        raise DataError(f"{source or name}: no user has {MIN_INTERACTIONS} or more interactions "
                        f"({len(per_user)} users, {sum(map(len, per_user.values()))} rows); leave-one-out needs a "
                        "training, a validation and a test item per user: supply more history per user")
    item_index: dict[str, int] = {}
    sequences = []
    for hist in kept.values():
        sequences.append([item_index.setdefault(item, len(item_index) + 1) for _, item in hist])
    return Interactions(name, sequences, len(item_index), list(kept), list(item_index),
                        dropped_users=len(per_user) - len(kept))


def load_file(path: str | Path) -> Interactions:
    path = Path(path)
    return build_interactions(read_rows(path), path.name, source=path)
