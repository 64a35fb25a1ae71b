"""A name or a path -> what a command needs of it: the model's configuration, its architecture for the cost model,
or the model itself. The one lookup behind ``info``, ``trace``, ``cost``, ``generate``, ``serve`` and ``explain``.

What a user may name: a path that exists wins, then the names.

- a checkpoint folder: attnlab's (``attnlab train --out``) or a Hugging Face model folder;
- a config.json file: attnlab's RunConfig or a Hugging Face one (it has ``model_type``);
- an attnlab preset (``config.PRESETS``: ``tiny``, ``default``, ``small-10m``, ...);
- a published architecture (``cost.arch.PUBLISHED``: Hugging Face config.json values of GPT-2, Llama, Mistral and
  Qwen2 models, shapes only, no weights). ``gpt2`` is both; the cost model reads it as published.

Configurations and architectures come from any of these; a model with weights (``load_model``) only from a folder.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from attnlab.config import PRESETS, ModelConfig, RunConfig, preset
from attnlab.cost.arch import PUBLISHED, Arch, from_hf_config, from_model_config
from attnlab.errors import CheckpointError, ConfigError


@dataclass
class Loaded:
    """A model with weights, as a folder held it: the model (eval mode), its tokenizer (None for a Hugging Face
    folder without tokenizer.json), the ids that end a generation, which kind of folder, and its path."""
    model: object
    tokenizer: object | None
    stop_tokens: list[int]
    kind: str  # "attnlab" or "hf"
    path: str


def names() -> list[str]:
    """Every name a user may give instead of a path: attnlab's presets, then the published architectures."""
    return list(PRESETS) + [n for n in PUBLISHED if n not in PRESETS]


def _unknown(target: str) -> ConfigError:
    return ConfigError(f"unknown model {target!r}: give a preset ({', '.join(names())}), a checkpoint folder "
                       "(attnlab or Hugging Face), or a config.json path")


def _config_file(target: str) -> tuple[dict, Path] | None:
    """(the config.json's data, its path) for a folder or a .json path, None where ``target`` is neither."""
    path = Path(target)
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise ConfigError(f"{target}: a folder without config.json; give an attnlab checkpoint folder (from "
                              "`attnlab train --out`) or a Hugging Face model folder")
    elif not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e}); fix the file or give another model") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config.json holds an object of fields; fix the file or give another model")
    return data, path


def model_config(target: str) -> ModelConfig:
    """attnlab's ModelConfig for ``target`` (a Hugging Face architecture as attnlab builds it)."""
    from attnlab.checkpoint import has_checkpoint, verify
    from attnlab.models.hf import config_from_hf

    found = _config_file(target)
    if found is None:
        if target in PRESETS:
            return preset(target)
        if target in PUBLISHED:
            return config_from_hf(PUBLISHED[target], target)
        raise _unknown(target)
    data, path = found
    if "model_type" in data:
        return config_from_hf(data, str(path))
    if Path(target).is_dir() and has_checkpoint(target):
        verify(target)  # a checkpoint's config is only as good as its files
    return RunConfig.from_dict(data, str(path)).model


def architecture(target: str) -> Arch:
    """The cost model's Arch for ``target``: a published or Hugging Face one read as its config.json says (the cost
    model knows architectures attnlab does not build, such as Llama 3.1's rope scaling), an attnlab one from its
    ModelConfig."""
    found = _config_file(target)
    if found is None:
        if target in PUBLISHED:  # "gpt2" is both: the published config.json is the cost model's reading of it
            return from_hf_config(PUBLISHED[target], target)
        if target in PRESETS:
            return from_model_config(preset(target), f"attnlab:{target}")
        raise _unknown(target)
    data, path = found
    if "model_type" in data:
        return from_hf_config(data, str(path))
    return from_model_config(RunConfig.from_dict(data, str(path)).model, str(path))


def load_model(path: str | Path, device: str = "cpu") -> Loaded:
    """The model in an attnlab checkpoint folder or a Hugging Face model folder, with its tokenizer."""
    from attnlab.data.tokenizers import BPETokenizer, load_tokenizer
    from attnlab.models.hf import hf_stop_tokens, is_hf_folder, load_hf

    folder = Path(path)
    if not folder.is_dir():
        hint = (f"; {str(path)!r} names a configuration without weights (`attnlab cost` and `attnlab info` take it)"
                if str(path) in names() else "")
        raise CheckpointError(f"{folder}: no such checkpoint folder; give an attnlab checkpoint folder "
                              f"(from `attnlab train --out`) or a Hugging Face model folder{hint}")
    if is_hf_folder(folder):
        model, _, hf_cfg, gen = load_hf(folder, device=device)
        tok = BPETokenizer.load(folder) if (folder / "tokenizer.json").exists() else None
        return Loaded(model, tok, hf_stop_tokens(hf_cfg, gen), "hf", str(folder))
    from attnlab.checkpoint import load_checkpoint

    model, run_cfg = load_checkpoint(folder, device=device)
    return Loaded(model, load_tokenizer(run_cfg.tokenizer, folder), [], "attnlab", str(folder))
