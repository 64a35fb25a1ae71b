"""Inference over the model contract: the ``Engine`` (add / step / abort / stats / check) and what drives it:
prefill (one parallel pass), decode (one token per step), sampling, incremental text and stops, prefix reuse,
speculative decoding and weight quantization."""
from attnlab.engine.engine import Engine, EngineConfig
from attnlab.engine.generate import decode_one_token, generate, prefill
from attnlab.engine.output import Completion, GenerationOutput, GenerationStats
from attnlab.engine.request import Event, Request, Result
from attnlab.engine.sampling import SamplingParams

__all__ = ["Completion", "Engine", "EngineConfig", "Event", "GenerationOutput", "GenerationStats", "Request",
           "Result", "SamplingParams", "decode_one_token", "generate", "prefill"]
