"""Token ids in, safe-to-show text out, and the stop matcher: one ``TextStream`` per sequence, linear in its length.

Incremental detokenization (as vLLM and HF's TextStreamer do it): only the newest tokens are decoded, with the
previous chunk before them as context (a SentencePiece "▁word" decodes differently at the start of a string than
after other text), and the difference is the new text. Decoding the whole text per token made a long answer
quadratic. Text is held back while it could still be wrong:

- a UTF-8 character split across tokens: the decoder shows U+FFFD until it is complete. A character spans at most
  four byte tokens, so a longer run that still ends in U+FFFD is bytes that are no text (or tokens that decode to
  nothing): it is released at a boundary where decoding the two parts apart gives the same text as decoding them
  together, which keeps the window, and so each token's work, bounded;
- any tail that could be the start of a stop string (so ``"\\nUser:"`` never leaks its ``"\\n"`` before the stop
  is seen). A stop string never begins inside text already sent, because such a tail is always held back, so
  only the unsent tail is searched: each token's work is bounded by the stops' length, not the answer's.

Stop tokens end the sequence at once (their own text is kept); a stop string ends it with the text cut before it.
The scheduler pushes every token it appends, so the stop decision and the text come from the same decoding, and
``generate``, the engine's events and the server all show exactly this text.
"""
from __future__ import annotations

from attnlab.errors import AttnlabError

REPLACEMENT = "\ufffd"
HOLD_TOKENS = 8  # a held run longer than this is released at a clean boundary (a character spans <= 4 tokens)


class TextStream:
    def __init__(self, tokenizer=None, stop_strings=(), stop_tokens=()):
        self.stops = [s for s in stop_strings if s]
        if self.stops and tokenizer is None:
            raise AttnlabError("stop strings need a tokenizer to decode the generated text")
        self.tokenizer = tokenizer
        self.stop_tokens = frozenset(stop_tokens)
        self.ids: list[int] = []
        self._prefix = self._read = 0  # ids[_prefix:_read] is the context whose text is already decoded
        self.pending = ""  # decoded but not yet sent: held back while it could begin a stop string
        self.parts: list[str] = []  # every piece sent, in order
        self.stopped = False  # a stop token or stop string was seen
        self.cut = False  # a stop string was seen: nothing from it on is sent
        self.finished = False

    @property
    def text(self) -> str | None:
        """Everything sent so far (None without a tokenizer)."""
        return "".join(self.parts) if self.tokenizer is not None else None

    def push(self, token: int) -> str:
        """Take one generated token; returns the text it makes safe to send. Sets ``stopped`` on a stop."""
        if self.stopped or self.finished:
            return ""
        self.ids.append(token)
        if token in self.stop_tokens:
            self.stopped = True
            return self.finish()  # the stop token's own text is part of the answer
        if self.tokenizer is None:
            return ""
        return self._send(self._decode_new(final=False), final=False)

    def finish(self) -> str:
        """The end of the sequence: release what was held back (an incomplete character shows as U+FFFD)."""
        if self.finished:
            return ""
        self.finished = True
        if self.tokenizer is None or self.cut:
            return ""
        return self._send(self._decode_new(final=True), final=True)

    # -- decoding ------------------------------------------------------------------------------------------
    def _decode_new(self, final: bool) -> str:
        ids, decode = self.ids, self.tokenizer.decode_text
        before = decode(ids[self._prefix:self._read])
        after = decode(ids[self._prefix:])
        if len(after) > len(before) and (final or not after.endswith(REPLACEMENT)):
            self._prefix, self._read = self._read, len(ids)
            return after[len(before):]
        if final:
            self._prefix = self._read = len(ids)
        elif len(ids) - self._read > HOLD_TOKENS:
            return self._release(before, after)
        return ""

    def _release(self, before: str, after: str) -> str:
        """A long held run: send it up to the newest boundary q (leaving at least the last 3 tokens, which may
        begin a character) where decoding ids[prefix:q] and ids[q:] apart equals decoding them together."""
        ids, decode = self.ids, self.tokenizer.decode_text
        for q in range(len(ids) - 3, self._read, -1):
            head = decode(ids[self._prefix:q])
            if after.startswith(head) and head.startswith(before) and decode(ids[q:]) == after[len(head):]:
                self._prefix, self._read = self._read, q
                return head[len(before):]
        return ""  # no clean boundary (a tokenizer whose text depends on its context): hold on

    # -- stops ---------------------------------------------------------------------------------------------
    def _send(self, new: str, final: bool) -> str:
        text = self.pending + new
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            delta, self.pending, self.stopped, self.cut = text[:cut], "", True, True
        elif final:
            delta, self.pending = text, ""
        else:
            keep = self._stop_prefix(text)
            delta, self.pending = text[:len(text) - keep], text[len(text) - keep:]
        if delta:
            self.parts.append(delta)
        return delta

    def _stop_prefix(self, text: str) -> int:
        """Length of the longest tail of text that is the beginning of a stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best
