"""The house's import rules (docs/architecture.md), read from the module graph with ``ast``: every import in every
module of the package, at the top or inside a function, counts."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "attnlab"

# (module prefix, prefixes it must never import, why)
RULES = [
    ("attnlab.models", ("attnlab.engine", "attnlab.train", "attnlab.fit", "attnlab.checkpoint", "attnlab.serve",
                        "attnlab.report", "attnlab.cli", "attnlab.experiments", "attnlab.measure", "attnlab.resolve"),
     "models/ is the plain reference: it knows nothing of who runs it"),
    ("attnlab.cost", ("attnlab.engine", "attnlab.measure", "attnlab.models", "attnlab.kernels", "attnlab.timing",
                      "attnlab.serve", "attnlab.report", "attnlab.cli", "attnlab.experiments"),
     "cost/ is a pure library: calibration data in, seconds out; measuring is measure/'s"),
    ("attnlab.config", ("attnlab.models", "attnlab.engine"), "config holds names and defaults, not model code"),
    ("attnlab.fit", ("attnlab.train", "attnlab.engine", "attnlab.serve", "attnlab.experiments", "attnlab.recsys"),
     "the one training loop takes a built model and a loss; its callers bring the rest"),
    ("attnlab.engine", ("attnlab.serve", "attnlab.report", "attnlab.cli", "attnlab.experiments"),
     "the engine serves every client; none of them is part of it"),
    ("attnlab.timing", ("attnlab.engine", "attnlab.models", "attnlab.measure", "attnlab.experiments"),
     "the clock is below everything that is timed"),
]


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module imported, names taken from it, line) for every import in the file, relative ones resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            out.append((base, [a.name for a in node.names], node.lineno))
    return out


def _files():
    return sorted(PACKAGE.rglob("*.py"))


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".") or (prefix.endswith("cli") and name.startswith(prefix + "_"))


def test_the_parts_import_only_what_the_house_allows():
    broken = []
    for path in _files():
        me = module_name(path)
        for owner, banned, why in RULES:
            if not _within(me, owner):
                continue
            for target, names, line in imports(path):
                # "from attnlab import engine" names the module in ``names``
                targets = [target] + [f"{target}.{n}" for n in names]
                hit = [b for b in banned for t in targets if _within(t, b)]
                if hit:
                    broken.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {target} ({why})")
    assert not broken, "\n".join(broken)


def test_no_module_imports_another_modules_private_names():
    """A leading underscore means "this file's business": another file that needs it needs a public name."""
    broken = []
    for path in _files():
        for target, names, line in imports(path):
            if not target.startswith("attnlab"):
                continue
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private:
                broken.append(f"{path.relative_to(PACKAGE.parent)}:{line} takes {', '.join(private)} from {target}")
    assert not broken, "\n".join(broken)


def test_the_rules_read_real_imports():
    """The reader itself: it finds a known import at the top and one inside a function, relative ones too."""
    found = {t for t, _, _ in imports(PACKAGE / "measure" / "local.py")}
    assert "attnlab.cost.hardware" in found and "attnlab.measure" in found and "attnlab.runtime" in found
    assert _within("attnlab.cli_measure", "attnlab.cli") and not _within("attnlab.client", "attnlab.cli")


def test_the_names_config_checks_are_the_registries_names():
    """config.py spells the kernel, encoding and family names so that it needs no model code; the registries must
    agree."""
    from attnlab.config import FAMILIES, KERNEL_NAMES, POSITIONAL_NAMES
    from attnlab.models import MODEL_CLASSES  # importing models fills KERNELS with flash.py's and sparse.py's
    from attnlab.models.attention import KERNELS
    from attnlab.models.positional import POSITIONAL

    assert set(KERNELS) == set(KERNEL_NAMES)
    assert set(MODEL_CLASSES) == set(FAMILIES)
    assert set(POSITIONAL) == set(POSITIONAL_NAMES)
