"""A model made ready for inference: the wrapper that owns what the plain model does not know about.

    fast = set_precision(model, "bf16")      # engine/quantize.py: weights laid out, returns an InferenceModel
    logits, state = fast(tokens, fast.new_state(B, max_len))   # the model contract, unchanged

The plain model (models/) stays the reference: it never reads an engine field. The wrapper holds the weights'
precision and the row count their layouts were chosen for, the KV cache's dtype (which ``new_state`` and
``new_pool`` apply), and the compiled decode step (fast/block_step.BlockRunner), which it hands to a transformer's
forward as ``run_blocks``. The engine wraps any model it is given (``inference``), so a model straight from
``build_model`` or a checkpoint decodes on the same path as one from ``set_precision``.
"""
from __future__ import annotations

import torch
from torch import nn

from attnlab.engine.fast.block_step import BlockRunner
from attnlab.models.block_pool import KV_BLOCK_SIZE

PRECISIONS = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


class InferenceModel(nn.Module):
    """``model`` for inference (the contract's forward, new_state and new_pool), with:

    ``precision``: fp32 | bf16 | fp16 | int8 (the weights as set_precision stored them); ``rows``: the rows per call
    their layouts were chosen for (1: plain decoding; k+1: a speculative target; a server's batch); ``cache_dtype``:
    the KV cache's dtype (None: the weights'); ``compiled``: decode steps of a softmax-attention transformer go
    through the compiled block step where it applies (False: every block runs its forward, as the reference)."""

    def __init__(self, model: nn.Module, precision: str | None = None, rows: int = 1,
                 cache_dtype: torch.dtype | None = None, compiled: bool = True):
        super().__init__()
        if isinstance(model, InferenceModel):
            raise TypeError("model is already an InferenceModel; wrap its .model, or use inference(model)")
        self.model = model
        dtype = next(model.parameters()).dtype
        self.precision = precision or PRECISIONS.get(dtype, str(dtype).removeprefix("torch."))
        self.rows, self.cache_dtype = rows, cache_dtype
        cfg = getattr(model, "cfg", None)
        transformer = getattr(cfg, "family", None) == "transformer" and hasattr(model, "backbone")
        self.runner = BlockRunner() if compiled and transformer else None

    @property
    def cfg(self):
        return self.model.cfg

    def forward(self, tokens: torch.Tensor, state=None, last_only: bool = False,
                lengths: torch.Tensor | None = None):
        if self.runner is None:
            return self.model(tokens, state, last_only=last_only, lengths=lengths)
        return self.model(tokens, state, last_only=last_only, lengths=lengths, run_blocks=self.runner)

    def new_state(self, batch_size: int, max_len: int | None = None, dtype=None, device=None, paged: bool = False,
                  pool=None, block_size: int = KV_BLOCK_SIZE):
        """The model's state, its KV cache in ``cache_dtype`` unless ``dtype`` says otherwise."""
        return self.model.new_state(batch_size, max_len, dtype=dtype or self.cache_dtype, device=device, paged=paged,
                                    pool=pool, block_size=block_size)

    def new_pool(self, n_blocks: int, block_size: int = KV_BLOCK_SIZE, dtype=None, device=None):
        """The model's block pool for paged caches, in ``cache_dtype`` unless ``dtype`` says otherwise."""
        return self.model.new_pool(n_blocks, block_size, dtype or self.cache_dtype, device)

    def forget_plans(self) -> None:
        """Drop the compiled step's kept arguments (after swapping the model's modules: they hold the old tensors)."""
        if self.runner is not None:
            self.runner.forget()


def inference(model: nn.Module) -> InferenceModel:
    """``model`` as an InferenceModel: itself if it is one, else wrapped as it stands (its weights' dtype, the
    cache in that dtype, the compiled decode step where it applies)."""
    return model if isinstance(model, InferenceModel) else InferenceModel(model)
