"""Inference over the model contract: prefill (one parallel pass) then decode (one token per step)."""
from attnlab.engine.generate import GenerateResult, generate

__all__ = ["GenerateResult", "generate"]
