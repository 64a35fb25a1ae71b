"""Inference over the model contract: prefill (one parallel pass), decode (one token per step),
sampling, streaming, prefix reuse, speculative decoding and weight quantization."""
from attnlab.engine.generate import (Completion, GenerationOutput, GenerationStats, decode_one_token, generate,
                                     prefill)
from attnlab.engine.sampling import SamplingParams

__all__ = ["Completion", "GenerationOutput", "GenerationStats", "SamplingParams", "decode_one_token", "generate",
           "prefill"]
