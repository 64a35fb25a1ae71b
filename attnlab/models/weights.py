"""Tensors into a built model, checked: every weight a model needs is there, nothing else is, each of the shape the
config makes. Shared by attnlab's checkpoints (checkpoint.py) and Hugging Face folders (hf.py)."""
from __future__ import annotations

import torch

from attnlab.errors import CheckpointError


def load_weights(model: torch.nn.Module, tensors: dict[str, torch.Tensor], source: str) -> None:
    """Put ``tensors`` (name -> tensor) into ``model`` in place of its parameters, after checking that they are
    exactly the ones it needs, each of its shape; a CheckpointError names ``source`` and what does not fit."""
    expected = unique_state_dict_names(model)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(model.state_dict()))
    if missing or unexpected:
        raise CheckpointError(f"{source}: weights do not fit the config: missing {missing[:5]}, "
                              f"unexpected {unexpected[:5]}; was config.json edited?")
    for name, t in tensors.items():
        want = model.state_dict()[name].shape
        if t.shape != want:
            raise CheckpointError(f"{source}: tensor {name} has shape {tuple(t.shape)}, the config needs "
                                  f"{tuple(want)}; was config.json edited?")
    model.load_state_dict(tensors, strict=False, assign=True)
    model.tie_weights()  # assign=True replaced the shared Parameter


def unique_state_dict_names(model: torch.nn.Module) -> list[str]:
    """The names a weights file must hold: every state_dict entry but the tied head (an alias)."""
    tied = getattr(model.cfg, "tie_embeddings", False)
    return [n for n in model.state_dict() if not (tied and n == "head.weight")]
