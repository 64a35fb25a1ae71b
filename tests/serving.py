"""Test support for the server: a tiny real model folder, a real `attnlab serve` subprocess, and Chromium's path."""
from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import httpx
import pytest
import torch

from attnlab.serve.launch import LaunchedServer


def make_tiny_folder(folder: Path, chat_template: str | None = None, context: int = 256, n_files: int = 0) -> Path:
    """A GPT-2-layout HF folder: random weights (seed 0), a 300-token BPE trained on the stdlib's json package
    (its first ``n_files`` files; 0: all)."""
    from attnlab.config import ModelConfig
    from attnlab.data.tokenizers import BPETokenizer
    from attnlab.models import build_model
    from attnlab.models.hf import save_hf

    sources = sorted(Path(json.__file__).parent.glob("*.py"))
    tok = BPETokenizer.train([f.read_text() for f in sources[:n_files or None]], 300)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.vocab_size, dim=64, n_layers=2, n_heads=4, max_seq_len=context, pos="learned",
                      mlp="gelu", norm="layernorm", bias=True, tie_embeddings=True)
    folder.mkdir(parents=True, exist_ok=True)
    save_hf(build_model(cfg), folder, tokenizer=tok, eos_token_id=0)
    if chat_template is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(
            {"chat_template": chat_template, "bos_token": "", "eos_token": "<eos>"}))
    return folder


class Server(LaunchedServer):
    """`attnlab serve FOLDER --threads 1 *args`, started at once; SIGTERM on exit (or `kill()`)."""

    def __init__(self, folder: Path, *args: str):
        super().__init__(str(folder), ["--threads", "1", *args], startup_s=180.0)
        super().__enter__()

    def __enter__(self) -> "Server":  # already started: `with Server(...) as s` must not start a second one
        return self

    def metric(self, name: str) -> float:
        for line in httpx.get(self.url + "/metrics").text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)

    def wait(self, timeout_s: float) -> int:
        """The exit status of a server stopped from outside (no second signal: the first one drains)."""
        self.returncode = self.proc.wait(timeout_s)
        return self.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


def chromium() -> str | None:
    """Chromium's path; None (skip) when absent, but under CI (.ci/run installs Debian's chromium) a failure."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("CI"):
        pytest.fail("chromium is not installed; .ci/run installs Debian's chromium")
    return None
