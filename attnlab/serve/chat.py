"""Chat messages -> one prompt: the model folder's own chat template, or a plain documented one.

A Hugging Face folder carries its template in tokenizer_config.json (``chat_template``: a Jinja string, or a
list of named templates) or in chat_template.jinja. It is rendered with jinja2's *sandboxed* environment
because a downloaded folder is untrusted input (a template is code). Without one, the plain template is:

    System: {system text}\\n\\n          (if any)
    User: {text}\\n
    Assistant: {text}\\n
    ...
    Assistant:

and ``"\\nUser:"`` is added as a stop string, so a model that keeps going does not write the user's turn.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from attnlab.serve.protocol import ApiError

PLAIN_ROLES = {"system": "System", "developer": "System", "user": "User", "assistant": "Assistant"}


@dataclass
class ChatTemplate:
    source: str  # Jinja text, or "" for the plain template
    special: dict = field(default_factory=dict)  # bos_token, eos_token ... as the template expects them
    origin: str = "plain"

    @property
    def stop_strings(self) -> list[str]:
        return [] if self.source else ["\nUser:"]

    def render(self, messages: list[tuple[str, str]]) -> str:
        if not self.source:
            return _plain(messages)
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise ApiError(400, f"the model's chat template refused the messages: {message}", "messages",
                           "template_error")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        try:
            template = env.from_string(self.source)
            return template.render(messages=[{"role": r, "content": c} for r, c in messages],
                                   add_generation_prompt=True, **self.special)
        except TemplateError as e:
            raise ApiError(400, f"the model's chat template ({self.origin}) failed: {e}", "messages",
                           "template_error") from None


def _plain(messages: list[tuple[str, str]]) -> str:
    parts = []
    for role, content in messages:
        sep = "\n\n" if role in ("system", "developer") else "\n"
        # The model wrote its reply straight after "Assistant:" (usually starting with a space): render it back
        # the same way, so the next turn's prompt extends the previous turn's tokens and the prefix cache
        # reuses the reply's blocks too, not only the previous prompt's.
        gap = "" if role == "assistant" and content[:1].isspace() else " "
        parts.append(f"{PLAIN_ROLES[role]}:{gap}{content}{sep}")
    return "".join(parts) + "Assistant:"


def _token_text(value) -> str:
    """tokenizer_config.json writes special tokens as a string or as {"content": "..."}."""
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return "" if value is None else str(value)


def load_template(folder: str | Path) -> ChatTemplate:
    folder = Path(folder)
    cfg_path = folder / "tokenizer_config.json"
    cfg = {}
    if cfg_path.exists():
        try:
            cfg = json.loads(cfg_path.read_text())
        except json.JSONDecodeError as e:
            from attnlab.errors import CheckpointError

            raise CheckpointError(f"{cfg_path}: not valid JSON ({e}); fix or remove the file") from None
    special = {k: _token_text(cfg.get(k)) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
    jinja = folder / "chat_template.jinja"
    if jinja.exists():
        return ChatTemplate(jinja.read_text(), special, str(jinja))
    template = cfg.get("chat_template")
    if isinstance(template, list):  # named templates: the "default" one serves chat
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if isinstance(template, str) and template.strip():
        return ChatTemplate(template, special, str(cfg_path))
    return ChatTemplate("")
