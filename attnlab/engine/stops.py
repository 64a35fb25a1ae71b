"""When a sequence ends: a stop token at once, or a stop string anywhere in its decoded text."""
from __future__ import annotations

from attnlab.errors import AttnlabError


class StopChecker:
    """Stop tokens end a sequence at once; stop strings end it when its decoded text contains one."""

    def __init__(self, stop_tokens=(), stop_strings=(), tokenizer=None):
        self.stop_tokens = set(stop_tokens)
        self.stop_strings = [s for s in stop_strings if s]
        if self.stop_strings and tokenizer is None:
            raise AttnlabError("stop strings need a tokenizer to decode the generated text")
        self.tokenizer = tokenizer
        # A stop string that just completed lies within its own length in tokens (each token >= 1 byte).
        self.window = max((len(s.encode()) for s in self.stop_strings), default=0) + 4

    def done(self, tokens: list[int]) -> bool:
        if tokens and tokens[-1] in self.stop_tokens:
            return True
        if self.stop_strings:
            tail = self.tokenizer.decode_text(tokens[-self.window:])
            return any(s in tail for s in self.stop_strings)
        return False

    def trim_text(self, text: str) -> str:
        cut = min((text.find(s) for s in self.stop_strings if s in text), default=-1)
        return text[:cut] if cut >= 0 else text
