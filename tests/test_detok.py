"""The one incremental detokenizer and stop matcher (engine/detok.py): its text equals decoding everything at once,
it never shows a broken character or any part of a stop string, and its work grows linearly with the answer."""
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.data.tokenizers import BPETokenizer, ByteTokenizer
from attnlab.engine.detok import TextStream

TEXT = "naïve café — 数据 🙂 def f(x):\n    return x\nUser: hi\nAssistant: ok\n" * 3
BPE_VOCAB = 290


@pytest.fixture(scope="module")
def bpe():
    return BPETokenizer.train([TEXT, "plain ascii words and more words"], BPE_VOCAB)


def run(stream: TextStream, ids: list[int]) -> list[str]:
    """Every delta, the end's included; stops at a stop as the engine does."""
    deltas = []
    for t in ids:
        deltas.append(stream.push(t))
        if stream.stopped:
            break
    return deltas + [stream.finish()]


class Counting:
    """A tokenizer that counts the tokens it is asked to decode."""

    def __init__(self, tok):
        self.tok, self.decoded = tok, 0
        self.name = tok.name

    def decode_text(self, ids):
        self.decoded += len(ids)
        return self.tok.decode_text(ids)


class Silent(Counting):
    """Token 0 decodes to nothing, as a special token does when decoding skips it."""

    def decode_text(self, ids):
        self.decoded += len(ids)
        return self.tok.decode_text([i for i in ids if i != 0])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 255), max_size=120))
def test_byte_text_equals_decoding_everything(ids):
    tok = ByteTokenizer()
    assert "".join(run(TextStream(tok), ids)) == tok.decode_text(ids)


@settings(max_examples=100, deadline=None)
@given(ids=st.lists(st.integers(0, BPE_VOCAB - 1), max_size=80))
def test_bpe_text_equals_decoding_everything(bpe, ids):
    assert "".join(run(TextStream(bpe), ids)) == bpe.decode_text(ids)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0xE2, 0x82, 0xAC, 0xF0, 0x9F, 0x99, 0x82, 0xC3, 0xA9, 0xFF, 0x41]), max_size=200))
def test_runs_of_partial_and_invalid_bytes_equal_decoding_everything(ids):
    """Bytes that often begin, continue or break a character, in long runs that are no text at all."""
    tok = ByteTokenizer()
    assert "".join(run(TextStream(tok), ids)) == tok.decode_text(ids)


@pytest.mark.parametrize("kind", ["bpe", "byte"])
def test_a_character_split_across_tokens_is_shown_whole(bpe, kind):
    tok = bpe if kind == "bpe" else ByteTokenizer()
    ids = tok.encode(TEXT)
    stream = TextStream(tok)
    deltas = run(stream, ids)
    assert "".join(deltas) == TEXT
    assert all("\ufffd" not in d for d in deltas)  # never half a character, later replaced
    if kind == "byte":  # "🙂" is four byte tokens: its text appears whole with the fourth
        at = [i for i, d in enumerate(deltas) if "🙂" in d][0]
        assert deltas[at - 3:at] == ["", "", ""]


def test_a_stop_string_spanning_tokens_is_held_back_and_never_shown(bpe):
    ids = bpe.encode("print(1)\nUser: more")
    stream = TextStream(bpe, ["\nUser:"])
    shown = ""
    for t in ids:
        shown += stream.push(t)
        assert "\n" not in shown  # never the first character of a stop before the stop is ruled out
        if stream.stopped:
            break
    assert shown + stream.finish() == "print(1)" and stream.stopped and stream.text == "print(1)"
    byte = TextStream(ByteTokenizer(), ["lo w"])  # one token per byte: the stop spans four tokens
    assert "".join(run(byte, list(b"hello world"))) == "hel" and byte.stopped


def test_a_held_tail_that_is_no_stop_is_released():
    tok = ByteTokenizer()
    stream = TextStream(tok, ["abc"])
    assert [stream.push(t) for t in b"xab"] == ["x", "", ""]  # "ab" could begin "abc"
    assert stream.push(ord("d")) == "abd"
    assert stream.push(ord("a")) == "" and stream.finish() == "a"  # the end releases what is held
    assert not stream.stopped and stream.text == "xabda"


def test_stop_tokens_end_the_text_with_their_own():
    tok = ByteTokenizer()
    stream = TextStream(tok, (), stop_tokens=[ord("!")])
    assert "".join(run(stream, list(b"hi! more"))) == "hi!" and stream.stopped
    silent = TextStream(None, (), stop_tokens=[7])  # no tokenizer: stops still work, there is no text
    assert [silent.push(t) for t in (1, 7)] == ["", ""] and silent.stopped and silent.text is None


@pytest.mark.parametrize("kind", ["text", "invalid", "empty"])
def test_work_per_token_is_bounded_whatever_the_length(bpe, kind):
    """Tokens decoded grow linearly with the answer: the same per token for 4x the tokens. 'invalid': a run of
    bytes that never make a character; 'empty': tokens that decode to nothing (a BPE's special tokens)."""
    per_token = []
    for n in (500, 2000):
        if kind == "text":
            tok, ids = Counting(bpe), (bpe.encode(TEXT) * n)[:n]
        elif kind == "invalid":
            tok, ids = Counting(ByteTokenizer()), [0xFF] * n
        else:
            tok, ids = Silent(ByteTokenizer()), [0] * n
        stream = TextStream(tok, ["\nSystem:", "never appears here"])
        text = "".join(run(stream, ids))
        if kind == "text":
            assert text == bpe.decode_text(ids)
        per_token.append(tok.decoded / n)
    assert per_token[1] <= 1.1 * per_token[0] and per_token[1] < 40, per_token


def test_stop_matching_reads_only_the_unsent_tail(bpe):
    """What is held back never grows past the longest stop plus one token's text, however long the answer."""
    ids = bpe.encode(TEXT) * 20
    stops = ["\nSystem:", "never appears here"]
    stream = TextStream(bpe, stops)
    shown, held = "", 0
    for t in ids:
        shown += stream.push(t)
        held = max(held, len(stream.pending))
    shown += stream.finish()
    assert shown == bpe.decode_text(ids) and held <= max(map(len, stops)) + 16


def test_random_token_soup_in_both_tokenizers(bpe):
    for kind, tok, vocab in (("bpe", bpe, BPE_VOCAB), ("byte", ByteTokenizer(), 256)):
        rng = random.Random(0)
        for _ in range(50):
            ids = [rng.randrange(vocab) for _ in range(60)]
            assert "".join(run(TextStream(tok), ids)) == tok.decode_text(ids), kind
