"""The server's pieces that need no server: strict request bodies, chat templates (its text: test_detok.py)."""
import json

import pytest

from attnlab.serve.chat import ChatTemplate
from attnlab.serve.protocol import ApiError, ChatRequest, CompletionRequest, parse_body


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
