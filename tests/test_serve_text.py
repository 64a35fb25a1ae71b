"""The server's pieces that need no server: incremental text, strict request bodies, chat templates."""
import json
import random

import pytest

from attnlab.data.tokenizers import BPETokenizer, ByteTokenizer
from attnlab.serve.chat import ChatTemplate
from attnlab.serve.completion import TextStream
from attnlab.serve.protocol import ApiError, ChatRequest, CompletionRequest, parse_body

TEXT = "naïve café — 数据 🙂 def f(x):\n    return x\nUser: hi\nAssistant: ok\n" * 3


@pytest.fixture(scope="module")
def bpe():
    return BPETokenizer.train([TEXT, "plain ascii words and more words"], 290)


@pytest.mark.parametrize("kind", ["bpe", "byte"])
def test_incremental_text_equals_decoding_everything(bpe, kind):
    tok = bpe if kind == "bpe" else ByteTokenizer()
    ids = tok.encode(TEXT)
    rng = random.Random(0)
    for trial in range(20):  # the real text, and random token soup (split multi-byte characters)
        seq = ids if trial == 0 else [rng.randrange(0, 256 if kind == "byte" else 290) for _ in range(60)]
        stream = TextStream(tok, [])
        deltas = [stream.push(t, i == len(seq) - 1) for i, t in enumerate(seq)]
        assert "".join(deltas) == tok.decode_text(seq)
        assert all("\ufffd" not in d for d in deltas[:-1]) or trial > 0  # the real text never shows a broken char


def test_stop_strings_are_held_back_and_cut(bpe):
    ids = bpe.encode("print(1)\nUser: more")
    stream = TextStream(bpe, ["\nUser:"])
    shown = ""
    for t in ids:
        shown += stream.push(t, False)
        assert "\n" not in shown  # never the first character of a stop before the stop is ruled out
    assert shown == "print(1)" and stream.stopped
    assert stream.push(-1, True) == ""


def test_stop_matching_reads_only_the_unsent_tail(bpe):
    """Each token's work is bounded by the stop strings' length, not by the text so far: what is held back never
    grows past the longest stop plus one token's text, however long the answer."""
    ids = bpe.encode(TEXT) * 20
    stops = ["\nSystem:", "never appears here"]
    stream = TextStream(bpe, stops)
    shown, held = "", 0
    for t in ids:
        shown += stream.push(t, False)
        held = max(held, len(stream.pending))
    shown += stream.push(-1, True)
    assert shown == bpe.decode_text(ids) and held <= max(map(len, stops)) + 16


@pytest.mark.parametrize("body,param", [
    ({"prompt": "x", "max_tokens": 2.0}, "max_tokens"), ({"prompt": "x", "max_tokens": False}, "max_tokens"),
    ({"prompt": "x", "logprobs": 6}, "logprobs"), ({"prompt": "x", "echo": True}, "echo"),
    ({"prompt": "x", "presence_penalty": 0.5}, "presence_penalty"), ({"prompt": "x", "stop": ["a"] * 5}, None),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": "x", "seed": -1}, "seed"), ({"prompt": "x", "temperature": 2.5}, "temperature"),
])
def test_completion_bodies_are_strict(body, param):
    with pytest.raises(ApiError) as e:
        req = parse_body(json.dumps(body).encode(), CompletionRequest)
        req.stops  # the stop list is checked when read
    assert e.value.status == 400
    if param:
        assert e.value.param == param


def test_neutral_openai_fields_are_accepted():
    body = {"prompt": "x", "n": 1, "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}, "user": "u",
            "echo": False, "best_of": 1, "stream": True, "stream_options": {"include_usage": True}}
    req = parse_body(json.dumps(body).encode(), CompletionRequest)
    assert req.include_usage and req.stops == []
    chat = parse_body(json.dumps({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                              {"type": "text", "text": "b"}]}],
                                  "max_completion_tokens": 3}).encode(), ChatRequest)
    assert chat.messages[0].text == "ab" and chat.limit == 3


def test_plain_and_jinja_chat_templates():
    plain = ChatTemplate("")
    msgs = [("system", "Be brief."), ("user", "hi"), ("assistant", " hello"), ("user", "bye")]
    assert plain.render(msgs) == "System: Be brief.\n\nUser: hi\nAssistant: hello\nUser: bye\nAssistant:"
    assert plain.stop_strings == ["\nUser:"]
    jinja = ChatTemplate("{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
                         "{% if add_generation_prompt %}[assistant]{% endif %}", {"bos_token": "<s>"})
    assert jinja.render(msgs[1:2]) == "<s>[user]hi[assistant]"
    hostile = ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}")  # a template is untrusted code
    with pytest.raises(ApiError):
        hostile.render(msgs)
    refusing = ChatTemplate("{{ raise_exception('no system role') }}")
    with pytest.raises(ApiError, match="no system role"):
        refusing.render(msgs)
