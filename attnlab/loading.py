"""Open whatever a user points at: an attnlab checkpoint folder or a Hugging Face model folder."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from attnlab.errors import CheckpointError


@dataclass
class Loaded:
    model: object
    tokenizer: object | None
    stop_tokens: list[int]
    kind: str  # "attnlab" or "hf"
    path: str


def load_any(path: str | Path, device: str = "cpu") -> Loaded:
    from attnlab.data.tokenizers import BPETokenizer, load_tokenizer
    from attnlab.models.hf import hf_stop_tokens, is_hf_folder, load_hf

    folder = Path(path)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: no such checkpoint folder; give an attnlab checkpoint folder "
                              "(from `attnlab train --out`) or a Hugging Face model folder")
    if is_hf_folder(folder):
        model, _, hf_cfg, gen = load_hf(folder, device=device)
        tok = BPETokenizer.load(folder) if (folder / "tokenizer.json").exists() else None
        return Loaded(model, tok, hf_stop_tokens(hf_cfg, gen), "hf", str(folder))
    from attnlab.checkpoint import load_checkpoint

    model, run_cfg = load_checkpoint(folder, device=device)
    return Loaded(model, load_tokenizer(run_cfg.tokenizer, folder), [], "attnlab", str(folder))
