"""Checkpoint folders: config.json + model.safetensors (+ trainer_state.safetensors) + manifest.json.

Writes are atomic as a group. Each file goes to a hidden temporary name and is fsynced; then a
journal (.commit.json) naming the files is renamed into place: that rename is the commit point.
The temporary files are then renamed over the old ones and the journal removed. A reader that finds a
journal rolls the commit forward first, so a process killed at any instant (SIGKILL included) leaves
either the old checkpoint or the new one, never a mix. The manifest holds every file's sha256, so a
truncated or corrupted file is named on load. Nothing is ever unpickled: tensors are safetensors.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from attnlab.config import RunConfig
from attnlab.errors import CheckpointError
from attnlab.models.weights import load_weights

MANIFEST, CONFIG, WEIGHTS, TRAINER = "manifest.json", "config.json", "model.safetensors", "trainer_state.safetensors"
JOURNAL = ".commit.json"
FORMAT = "attnlab-checkpoint-1"


def _tmp(folder: Path, name: str) -> Path:
    return folder / f".{name}.tmp"


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durable(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def recover(folder: str | Path) -> None:
    """Finish a commit that a killed process started, or discard temporaries it never committed."""
    folder = Path(folder)
    journal = folder / JOURNAL
    if journal.exists():
        for name in json.loads(journal.read_text())["files"]:
            if _tmp(folder, name).exists():
                os.replace(_tmp(folder, name), folder / name)
        _fsync_dir(folder)
        journal.unlink()
    for stray in folder.glob(".*.tmp"):
        stray.unlink()


def commit_files(folder: str | Path, files: dict[str, bytes | Path]) -> None:
    """Atomically replace every named file in ``folder``; values are bytes or an already-written temp path.

    The caller runs ``recover(folder)`` before writing any temp file (it discards uncommitted temps)."""
    folder = Path(folder)
    for name, data in files.items():
        if isinstance(data, Path):
            assert data == _tmp(folder, name), "pre-written files must use the folder's temp name"
        else:
            _write_durable(_tmp(folder, name), data)
    _write_durable(_tmp(folder, JOURNAL), json.dumps({"files": list(files)}).encode())
    os.replace(_tmp(folder, JOURNAL), folder / JOURNAL)  # the commit point
    _fsync_dir(folder)
    recover(folder)


def unique_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """state_dict without aliases: a tied head shares the embedding's storage and is stored once."""
    seen, out = set(), {}
    for name, t in model.state_dict().items():
        key = (t.data_ptr(), t.shape, t.stride()) if t.numel() else (name,)
        if key in seen:
            continue
        seen.add(key)
        out[name] = t.detach().contiguous().cpu()
    return out


def save_checkpoint(folder: str | Path, model: torch.nn.Module, run_cfg: RunConfig, step: int = 0,
                    trainer_tensors: dict[str, torch.Tensor] | None = None,
                    trainer_meta: dict | None = None, weights: dict[str, torch.Tensor] | None = None) -> None:
    """``weights``: the tensors to store instead of ``model``'s own (a sharded model's, gathered whole)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    recover(folder)
    files: dict[str, bytes | Path] = {}
    save_file(unique_state_dict(model) if weights is None else weights, str(_tmp(folder, WEIGHTS)),
              metadata={"format": FORMAT})
    files[WEIGHTS] = _tmp(folder, WEIGHTS)
    if trainer_tensors is not None:
        meta = {"step": str(step), "json": json.dumps(trainer_meta or {})}
        save_file({k: v.detach().contiguous().cpu() for k, v in trainer_tensors.items()},
                  str(_tmp(folder, TRAINER)), metadata=meta)
        files[TRAINER] = _tmp(folder, TRAINER)
    files[CONFIG] = (json.dumps(run_cfg.to_dict(), indent=2) + "\n").encode()
    for path in files.values():
        if isinstance(path, Path):
            with open(path, "rb+") as f:
                os.fsync(f.fileno())
    digests = {}
    for name, data in files.items():
        raw = data.read_bytes() if isinstance(data, Path) else data
        digests[name] = {"sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw)}
    manifest = {"format": FORMAT, "step": step, "files": digests}
    files[MANIFEST] = (json.dumps(manifest, indent=2) + "\n").encode()
    commit_files(folder, files)


def verify(folder: str | Path) -> dict:
    """Check every file the manifest lists; return the manifest. Raises CheckpointError naming the file."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: no such checkpoint folder; train one with `attnlab train --out {folder}`")
    recover(folder)
    mpath = folder / MANIFEST
    if not mpath.exists():
        raise CheckpointError(f"{folder}: {MANIFEST} is missing, so this is not a complete attnlab checkpoint "
                              f"(expected {CONFIG}, {WEIGHTS}, {MANIFEST}); re-save it or train again")
    try:
        manifest = json.loads(mpath.read_text())
        files = manifest["files"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise CheckpointError(f"{mpath}: corrupted manifest; the checkpoint cannot be trusted, re-save it") from None
    for name, info in files.items():
        path = folder / name
        if not path.exists():
            raise CheckpointError(f"{path} is missing (listed in {MANIFEST}); restore it or re-save the checkpoint")
        size = path.stat().st_size
        if size != info["bytes"]:
            raise CheckpointError(f"{path} is truncated or altered: {size} bytes, manifest says {info['bytes']}; "
                                  "restore it or re-save the checkpoint")
        digest = sha256_file(path)
        if digest != info["sha256"]:
            raise CheckpointError(f"{path} is corrupted: sha256 {digest[:12]}… does not match the manifest's "
                                  f"{info['sha256'][:12]}…; restore it or re-save the checkpoint")
    return manifest


def has_checkpoint(folder: str | Path) -> bool:
    folder = Path(folder)
    if folder.is_dir():
        recover(folder)
    return (folder / MANIFEST).exists()


def load_checkpoint(folder: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None):
    """Verify and load an attnlab checkpoint folder -> (model in eval mode, RunConfig)."""
    from attnlab.models import build_model

    folder = Path(folder)
    verify(folder)
    run_cfg = RunConfig.load(folder / CONFIG)
    with torch.device("meta"):
        model = build_model(run_cfg.model, device="meta")
    try:
        tensors = load_file(str(folder / WEIGHTS))
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{folder / WEIGHTS}: unreadable safetensors file ({e})") from None
    load_weights(model, model.upgrade_state_dict(tensors), str(folder / WEIGHTS))
    model.rebuild_buffers()
    model = model.to(device)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval(), run_cfg


def load_trainer_state(folder: str | Path):
    """-> (tensors, step, meta). safetensors only: optimizer moments and RNG states are plain tensors."""
    path = Path(folder) / TRAINER
    if not path.exists():
        raise CheckpointError(f"{path} is missing: this checkpoint has no trainer state to resume from")
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    tensors = load_file(str(path))
    return tensors, int(meta["step"]), json.loads(meta.get("json", "{}"))
