"""Test support for the server: a tiny real model folder, and a real `attnlab serve` subprocess on a free port."""
from __future__ import annotations

import glob
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import torch


def make_tiny_folder(folder: Path, chat_template: str | None = None, context: int = 256) -> Path:
    """A GPT-2-layout HF folder: random weights (seed 0), a 300-token BPE trained on a few stdlib files."""
    from attnlab.config import ModelConfig
    from attnlab.data.tokenizers import BPETokenizer
    from attnlab.models import build_model
    from attnlab.models.hf import save_hf

    json_dir = Path(__import__("json").__file__).parent
    texts = [Path(f).read_text() for f in sorted(glob.glob(str(json_dir / "*.py")))]
    tok = BPETokenizer.train(texts, 300)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.vocab_size, dim=64, n_layers=2, n_heads=4, max_seq_len=context, pos="learned",
                      mlp="gelu", norm="layernorm", bias=True, tie_embeddings=True)
    save_hf(build_model(cfg), folder, tokenizer=tok, eos_token_id=0)
    if chat_template is not None:
        (folder / "tokenizer_config.json").write_text(__import__("json").dumps(
            {"chat_template": chat_template, "bos_token": "", "eos_token": "<eos>"}))
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`attnlab serve FOLDER --port P *args` as a real subprocess; stopped with SIGTERM on exit."""

    def __init__(self, folder: Path, *args: str, startup_s: float = 90.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "attnlab", "serve", str(folder), "--port", str(self.port),
                                      "--threads", "1", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env)
        deadline = time.time() + startup_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}: {self.proc.stdout.read()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("server did not come up")

    def metric(self, name: str) -> float:
        for line in httpx.get(self.url + "/metrics").text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)

    def stop(self, sig=signal.SIGTERM, timeout: float = 60) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return self.proc.returncode, out or ""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
