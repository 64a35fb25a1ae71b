"""Flags declared once: the server's from ServeConfig's fields, --threads and the dtypes from cli_args."""
import ast
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from attnlab.cli import build_parser
from attnlab.cli_args import add_config_flags, config_flags
from attnlab.serve.config import ServeConfig

ROOT = Path(__file__).resolve().parents[1]


def test_serve_flags_and_their_defaults_come_from_serve_config():
    defaults = build_parser().parse_args(["serve", "runs/x"])
    for f in config_flags(ServeConfig):
        assert getattr(defaults, f.name) == getattr(ServeConfig(), f.name), f.name
    args = build_parser().parse_args(["serve", "runs/x", "--block-size", "32", "--request-timeout", "5", "--insecure",
                                      "--kv-blocks", "9"])
    assert (args.block_size, args.request_timeout_s, args.insecure, args.kv_blocks) == (32, 5.0, True, 9)


def test_a_field_whose_type_has_no_flag_is_refused():
    @dataclass
    class Odd:
        sizes: list = field(default_factory=list, metadata={"help": "sizes"})

    import argparse

    with pytest.raises(TypeError, match="Odd.sizes"):
        add_config_flags(argparse.ArgumentParser(), Odd)


def test_threads_and_dtype_flags_are_declared_in_one_place():
    """No command declares --threads itself; --dtype choices come from the named tuples, never a literal."""
    for path in (ROOT / "attnlab").glob("cli*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and node.args:
                flag = getattr(node.args[0], "value", None)
                if path.name != "cli_args.py":
                    assert flag != "--threads", f"{path.name} declares --threads: use cli_args.add_threads"
                if flag == "--dtype":
                    choices = [k.value for k in node.keywords if k.arg == "choices"]
                    assert not any(isinstance(c, ast.Tuple) for c in choices), f"{path.name}: a literal dtype list"
