"""One claim per file, found by name: ``eNN_slug.py`` defines CLAIM, PREDICTION, THRESHOLD, TITLE, CHANGES,
EST_S (estimated seconds per scale, for the report's progress bar), REGIME (where the claim applies, stated before
measuring), ``measure``, ``decide`` and ``run(scale, device) -> Outcome``; a claim that trains models also defines
``training(scale, device)`` (its tasks for the report's training stage, training.py) and TRAIN_EST_S (its share of
that stage). Adding a claim is adding one file."""
from __future__ import annotations

import importlib
import pkgutil
import re

from attnlab.experiments.base import Experiment


def registry() -> dict[int, Experiment]:
    out = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        m = re.fullmatch(r"e(\d+)_(\w+)", info.name)
        if not m:
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        exp = Experiment(id=int(m.group(1)), slug=m.group(2), title=mod.TITLE, claim=mod.CLAIM,
                         prediction=mod.PREDICTION, threshold=mod.THRESHOLD, run=mod.run,
                         decide=getattr(mod, "decide", None), changes=list(getattr(mod, "CHANGES", [])),
                         source=f"attnlab/experiments/{info.name}.py", regime=getattr(mod, "REGIME", ""),
                         est_s=dict(getattr(mod, "EST_S", {})), training=getattr(mod, "training", None),
                         train_est_s=dict(getattr(mod, "TRAIN_EST_S", {})))
        out[exp.id] = exp
    return out
