"""The engine's fast path, applied from outside the plain models: the inference wrapper that owns a model's
precision, cache dtype and compiled decode step (inference.py), and the compiled step itself (block_step.py)."""
from attnlab.engine.fast.inference import InferenceModel, inference

__all__ = ["InferenceModel", "inference"]
