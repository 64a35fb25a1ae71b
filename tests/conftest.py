"""Shared test settings: tiny configs, two threads, no denormals (MEASURING.md)."""
import os

import pytest
import torch

torch.set_num_threads(2)
torch.set_flush_denormal(True)
os.environ.setdefault("HYPOTHESIS_PROFILE", "default")

from attnlab.config import ModelConfig  # noqa: E402

FAMILIES = ["transformer", "rnn", "lstm", "gru", "linear", "ssm"]
KERNELS = ["naive", "sdpa", "flash", "sliding", "block_sparse"]
POSITIONS = ["none", "sinusoidal", "learned", "rope", "alibi"]


def tiny(**kw) -> ModelConfig:
    base = dict(vocab_size=37, dim=32, n_layers=2, n_heads=4, max_seq_len=64, window=6, block_size=4, chunk_size=4)
    if kw.get("family") in ("linear", "ssm"):
        base["pos"] = "none"  # no attention scores for rope/alibi to act on
    base.update(kw)
    return ModelConfig(**base)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def int8_many_path(monkeypatch):
    """``int8_many_path("widen" | "w8a8")``: every Int8Linear built after it takes that many-row path (its
    measurement skipped), so a test checks the path it names whatever this machine would have chosen."""
    from attnlab.engine.quantize import Int8Linear

    class Forced(dict):
        def __init__(self, path):
            super().__init__()
            self.path = path

        def __contains__(self, key):
            return True

        def __getitem__(self, key):
            return self.path

    return lambda path: monkeypatch.setattr(Int8Linear, "_many_chosen", Forced(path))
