"""Is a committed reference still the code's? A reference report or benchmark result stands for the commit it
names; once the code a claim runs has changed since that commit, the claim's reference no longer reproduces
from HEAD and must be rerun.

The code a claim runs is read statically: the claim's module and every ``attnlab`` module it imports, at any
depth and from inside functions too (``ast``, nothing is imported), plus the non-Python files beside each of
those modules (the C++ kernels built on first use, templates). Over-inclusion is the safe side: a change that
might touch a claim marks it for a rerun.
"""
from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

PACKAGE = "attnlab"
ROOT = Path(__file__).resolve().parents[2]  # the checkout holding attnlab/


def module_file(name: str, root: Path = ROOT) -> Path | None:
    """``attnlab.a.b`` -> attnlab/a/b.py or attnlab/a/b/__init__.py under ``root``; None when neither exists."""
    base = root.joinpath(*name.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def _imported(path: Path, name: str) -> set[str]:
    """The attnlab modules that ``path`` (module ``name``) imports, including ``from pkg import submodule``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)  # a submodule imported by name
    return {m for m in out if m == PACKAGE or m.startswith(PACKAGE + ".")}


def import_closure(name: str, root: Path = ROOT) -> set[str]:
    """Every attnlab module ``name`` reaches through imports, itself and each parent package included."""
    seen, todo = set(), [name]
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        path = module_file(mod, root)
        if path is None:  # a name imported from a module, not a module
            continue
        seen.add(mod)
        parts = mod.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # importing a.b.c runs a and a.b
        todo.extend(_imported(path, mod) - seen)
    return seen


def claim_files(module: str, root: Path = ROOT) -> set[str]:
    """Paths (relative to ``root``) of the code a claim's module runs: its import closure and the package data
    beside each module in it."""
    files = set()
    for mod in import_closure(module, root):
        path = module_file(mod, root)
        files.add(path.relative_to(root).as_posix())
        files.update(p.relative_to(root).as_posix() for p in path.parent.iterdir()
                     if p.is_file() and p.suffix not in (".py", ".pyc"))
    return files


def changed_files(commit: str, head: str = "HEAD", root: Path = ROOT) -> set[str] | None:
    """Files under attnlab/ that differ between ``commit`` and ``head``; None when git cannot tell (no checkout,
    or a shallow clone without that commit)."""
    try:
        r = subprocess.run(["git", "-C", str(root), "diff", "--name-only", commit, head, "--", PACKAGE],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return set(r.stdout.split()) if r.returncode == 0 else None


def stale_claims(results: dict, head: str = "HEAD", root: Path = ROOT) -> dict[int, list[str]] | None:
    """For a report's results: {claim id: the files it runs that changed since the report's commit} for every
    claim whose code changed; {} when all still reproduce; None when the commit cannot be compared."""
    git = results.get("context", {}).get("git") or {}
    if not git.get("commit"):
        return None
    changed = changed_files(git["commit"], head, root)
    if changed is None:
        return None
    out = {}
    for c in results["claims"]:
        module = Path(c["source"]).with_suffix("").as_posix().replace("/", ".")
        hit = sorted(changed & claim_files(module, root))
        if hit:
            out[c["id"]] = hit
    return out


def find_git(obj) -> dict | None:
    """The ``{"commit", "dirty"}`` record a results or benchmark JSON carries, wherever it nests it."""
    if isinstance(obj, dict):
        if isinstance(obj.get("git"), dict) and "commit" in obj["git"]:
            return obj["git"]
        if "commit" in obj and "dirty" in obj:
            return {"commit": obj["commit"], "dirty": obj["dirty"]}
        for v in obj.values():
            found = find_git(v)
            if found:
                return found
    elif isinstance(obj, list):
        for v in obj:
            found = find_git(v)
            if found:
                return found
    return None


def unusable_results(paths) -> dict[str, str]:
    """{path: why} for every results JSON that cannot be a reference: written from a dirty tree, at no recorded
    commit, holding sections copied from an earlier run (another commit or machine), or not JSON."""
    out = {}
    for p in map(Path, paths):
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            out[str(p)] = f"not JSON ({e})"
            continue
        git = find_git(data)
        if isinstance(data, dict) and data.get("sections_from_earlier_run"):
            out[str(p)] = f"holds sections from an earlier run: {sorted(data['sections_from_earlier_run'])}"
        elif not git or not git.get("commit"):
            out[str(p)] = "no commit recorded"
        elif git.get("dirty") is not False:
            out[str(p)] = f"written from a tree with uncommitted changes at {git['commit'][:12]}"
    return out


def verdict_history(path: str = "reports/cpu-full/results.json", root: Path = ROOT) -> list[dict] | None:
    """One row per committed version of a reference report, oldest first: the commit the run measured, its date,
    scale, whether it ran from a clean tree, its length, and each claim's verdict (with its qualifier). None when
    git has no history for it here (a shallow clone)."""
    try:
        log = subprocess.run(["git", "-C", str(root), "log", "--format=%H", "--", path], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if log.returncode or not log.stdout.strip():
        return None
    rows = []
    for commit in reversed(log.stdout.split()):
        shown = subprocess.run(["git", "-C", str(root), "show", f"{commit}:{path}"], capture_output=True, text=True)
        if shown.returncode:  # the file was deleted in this commit
            continue
        data = json.loads(shown.stdout)
        git = data.get("context", {}).get("git") or {}
        rows.append({"run_commit": (git.get("commit") or "?")[:7], "dirty": git.get("dirty"),
                     "date": str(data.get("context", {}).get("date", ""))[:10], "scale": data.get("scale"),
                     "total_s": data.get("total_s"),
                     "verdicts": {c["id"]: c.get("label") or (c["verdict"] + (f" ({c['qualifier']})"
                                                                             if c.get("qualifier") else ""))
                                  for c in data["claims"]}})
    return rows


def history_markdown(rows: list[dict]) -> str:
    """The verdict history as a Markdown table: a row per claim, a column per reference run."""
    ids = sorted({i for r in rows for i in r["verdicts"]})
    head = ["claim"] + [f"{r['date']} `{r['run_commit']}`" + (" (dirty)" if r["dirty"] else "") for r in rows]
    short = {"supported": "S", "not supported": "N", "inconclusive": "I"}
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i in ids:
        cells = []
        for r in rows:
            v = r["verdicts"].get(i)
            cells.append("" if v is None else short.get(v, short.get(v.split(" (")[0], "?") + v[v.find(" ("):]))
        lines.append(f"| {i} | " + " | ".join(cells) + " |")
    lines.append("| minutes | " + " | ".join(f"{(r['total_s'] or 0) / 60:.0f}" for r in rows) + " |")
    return "\n".join(lines) + "\n"
