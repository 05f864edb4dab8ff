"""Tokenizer and chat template of a model folder, through ``tokenizers`` and jinja2.

Renders messages exactly as ``transformers``' ``apply_chat_template(messages,
add_generation_prompt=True)`` does: an immutable sandboxed jinja2 environment
with ``trim_blocks``/``lstrip_blocks`` and loop controls, ``raise_exception``,
``strftime_now`` and a ``tojson`` that keeps non-ASCII text; the special token
strings of ``tokenizer_config.json`` as variables; the rendered text encoded
without adding special tokens (the template already placed them). A plain
prompt is encoded with the tokenizer's own post-processor (Llama's adds BOS).

The template is read from ``chat_template.jinja`` (newer exports) or the
``chat_template`` key of ``tokenizer_config.json`` (older ones).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping, Sequence

from edge_runtime.errors import InvalidInputError, ModelLoadError

ROLES = ("system", "developer", "user", "assistant", "tool")
SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # older files: {"content": "<s>", "lstrip": false, ...}
        value = value.get("content")
    return value if isinstance(value, str) else None


def _raise(message: str) -> None:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def normalize_messages(messages: Any, multimodal: bool = False) -> list[dict[str, Any]]:
    """Validated OpenAI chat messages; text content parts are joined into one string.

    ``multimodal``: content lists may also hold ``{"type": "image"}`` parts (a VLM's template
    places the images; ``vision.messages.split_images`` made them) and are kept as lists.
    Raises InvalidInputError naming the message and what is wrong with it.
    """
    if not isinstance(messages, list) or not messages:
        raise InvalidInputError("'messages' must be a non-empty list of {role, content} objects")
    normalized = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InvalidInputError(f"messages[{index}] must be an object, got {type(message).__name__}")
        role = message.get("role")
        if role not in ROLES:
            raise InvalidInputError(f"messages[{index}].role must be one of {list(ROLES)}, got {role!r}")
        content = message.get("content")
        if isinstance(content, list) and multimodal:
            for part in content:
                if not (isinstance(part, Mapping) and (part.get("type") == "image" or (
                        part.get("type") == "text" and isinstance(part.get("text"), str)))):
                    raise InvalidInputError(f"messages[{index}].content parts must be text or image parts, "
                                            f"got {part!r}"[:300])
            normalized.append({**message, "role": role, "content": list(content)})
            continue
        if isinstance(content, list):
            texts = []
            for part in content:
                if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise InvalidInputError(f"messages[{index}].content parts must be {{'type': 'text', 'text': "
                                            f"str}}: this model reads text only, got {part!r}"[:300])
                texts.append(part["text"])
            content = "".join(texts)
        if content is None and role == "assistant" and message.get("tool_calls"):
            content = ""
        if not isinstance(content, str):
            raise InvalidInputError(f"messages[{index}].content must be a string or a list of text parts, "
                                    f"got {type(content).__name__}")
        normalized.append({**message, "role": role, "content": content})
        if role == "assistant" and isinstance(message.get("tool_calls"), list):
            normalized[-1]["tool_calls"] = [_template_call(call) for call in message["tool_calls"]]
    return normalized


def _template_call(call: Any) -> Any:
    """An assistant's earlier tool call as templates expect it: OpenAI sends ``function.arguments`` as
    JSON text, templates (Qwen2.5's ``arguments | tojson``) and transformers take an object."""
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:
        return call
    return {**call, "function": {**function, "arguments": arguments}} if isinstance(arguments, dict) else call


class ChatTokenizer:
    """Encode prompts and messages, decode ids; built from a folder's tokenizer files."""

    def __init__(self, folder: Path) -> None:
        from tokenizers import Tokenizer

        folder = Path(folder)
        try:
            self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as exc:  # tokenizers raises its own Exception type for a bad file
            raise ModelLoadError(f"{folder / 'tokenizer.json'}: cannot load ({exc})") from None
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
        self.special_tokens = {key: text for key in SPECIAL_KEYS if (text := _token_text(config.get(key)))}
        template_path = folder / "chat_template.jinja"
        source = template_path.read_text(encoding="utf-8") if template_path.is_file() else config.get("chat_template")
        if isinstance(source, list):  # named templates: [{"name": "default", "template": ...}, ...]
            source = next((t.get("template") for t in source if t.get("name") == "default"), None)
        self.template_source: str | None = source if isinstance(source, str) else None
        self._template = self._compile(self.template_source) if self.template_source else None

    @staticmethod
    def _compile(source: str) -> Any:
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        environment.filters["tojson"] = _tojson
        environment.globals["raise_exception"] = _raise
        environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            return environment.from_string(source)
        except Exception as exc:  # jinja2.TemplateSyntaxError
            raise ModelLoadError(f"chat template does not compile: {exc}") from None

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
               tools: Any = None, multimodal: bool = False, **kwargs: Any) -> str:
        """The prompt text for ``messages``; InvalidInputError for bad messages or a template's refusal.

        ``multimodal``: see ``normalize_messages``."""
        if self._template is None:
            raise InvalidInputError("this model has no chat template (chat_template.jinja or tokenizer_config.json "
                                    "'chat_template'): use the completions API with a plain prompt")
        from jinja2.exceptions import TemplateError

        try:
            return self._template.render(messages=normalize_messages(list(messages), multimodal), tools=tools,
                                         add_generation_prompt=add_generation_prompt,
                                         **self.special_tokens, **kwargs)
        except TemplateError as exc:
            raise InvalidInputError(f"the chat template rejected the messages: {exc}") from None

    def encode_messages(self, messages: Sequence[Mapping[str, Any]], **kwargs: Any) -> list[int]:
        return self.tokenizer.encode(self.render(messages, **kwargs), add_special_tokens=False).ids

    def encode_prompt(self, prompt: str) -> list[int]:
        if not isinstance(prompt, str):
            raise InvalidInputError(f"the prompt must be a string, got {type(prompt).__name__}")
        return self.tokenizer.encode(prompt, add_special_tokens=True).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        """One token's own text (for logprobs), special tokens included."""
        return self.tokenizer.decode([int(token_id)], skip_special_tokens=False)
