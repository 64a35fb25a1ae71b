"""Flags more than one command takes, declared once: threads, weight dtypes, and flags generated from a config
dataclass's fields (each default then lives in the dataclass alone)."""
from __future__ import annotations

import argparse
import dataclasses

from attnlab.runtime import DTYPES

WEIGHT_DTYPES = ("fp32", "bf16", "int8")  # what a model's weights can be cast to (int8: bf16 activations in decode)
COMPUTE_DTYPES = ("fp32", "bf16")  # what a kernel benchmark computes in
assert set(WEIGHT_DTYPES) <= set(DTYPES) and set(COMPUTE_DTYPES) <= set(DTYPES)

_TYPES = {"int": int, "float": float, "str": str}


def add_threads(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, help="intra-op threads (default: one per core)")


def add_weight_dtype(p: argparse.ArgumentParser, help: str | None = None) -> None:
    p.add_argument("--dtype", default="fp32", choices=WEIGHT_DTYPES,
                   help=help or "weights: fp32, bf16, or int8 (decode: int8 weights, bf16 activations; a prefill "
                                "may quantize its activations to int8 too, where that measured faster: docs/engine.md)")


def config_flags(cls) -> list[dataclasses.Field]:
    """The fields of ``cls`` that are command-line flags: those whose metadata carries a ``help``."""
    return [f for f in dataclasses.fields(cls) if "help" in f.metadata]


def add_config_flags(p: argparse.ArgumentParser, cls) -> None:
    """One flag per field of ``cls`` with a ``help``: ``--field-name`` (or the metadata's ``flag``), the type from the
    annotation (``int | None`` -> int), the default from the field, a bool as a switch."""
    for f in config_flags(cls):
        flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
        base = str(f.type).replace(" | None", "")
        if base == "bool":
            p.add_argument(flag, dest=f.name, action="store_true", help=f.metadata["help"])
            continue
        if base not in _TYPES:
            raise TypeError(f"{cls.__name__}.{f.name}: no flag type for {f.type!r}")
        shown = "" if f.default is None else f" (default {f.default})"
        p.add_argument(flag, dest=f.name, type=_TYPES[base], default=f.default, help=f.metadata["help"] + shown)


def config_from_flags(cls, args: argparse.Namespace, **given):
    """``cls`` built from the parsed flags of ``add_config_flags`` and the fields ``given`` beside them."""
    return cls(**{f.name: getattr(args, f.name) for f in config_flags(cls)}, **given)
