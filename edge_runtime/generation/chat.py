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

``ChatOptions`` carries what vLLM's chat API adds to a render: ``chat_template_kwargs``
(variables for the template, e.g. Qwen3's ``enable_thinking``), ``add_generation_prompt`` and
``continue_final_message`` (the last message left open so the model continues it, cut as
transformers cuts it).
"""

from __future__ import annotations

import json
from datetime import datetime
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from edge_runtime.errors import InvalidInputError, ModelLoadError

ROLES = ("system", "developer", "user", "assistant", "tool")
SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


# what the render itself passes: chat_template_kwargs may not set these
RESERVED_TEMPLATE_KEYS = frozenset({"messages", "tools", "add_generation_prompt", "continue_final_message",
                                    *SPECIAL_KEYS})


@dataclass(frozen=True)
class ChatOptions:
    """How messages are rendered beyond the template itself (vLLM's chat extensions).

    ``add_generation_prompt``: the assistant turn's opening after the messages (default on).
    ``continue_final_message``: the final message left open (no end of turn) for the model to go on
    with it; like vLLM, it needs ``add_generation_prompt`` off. ``template_kwargs``: extra template
    variables. ``processor_kwargs``: vLLM's ``mm_processor_kwargs``, the image processor arguments of
    a vision-language model's request (its image budget; the processor checks the keys).
    InvalidInputError (a 400) for what cannot be honoured."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    processor_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key in ("add_generation_prompt", "continue_final_message"):
            if not isinstance(getattr(self, key), bool):
                raise InvalidInputError(f"'{key}' must be true or false, got {getattr(self, key)!r}")
        if self.add_generation_prompt and self.continue_final_message:
            raise InvalidInputError("Cannot set both 'continue_final_message' and 'add_generation_prompt' to true: "
                                    "a message left open takes no new assistant turn after it")
        if not isinstance(self.template_kwargs, Mapping) or not all(isinstance(k, str) for k in self.template_kwargs):
            raise InvalidInputError(f"'chat_template_kwargs' must be an object of template variables, got "
                                    f"{self.template_kwargs!r}"[:300])
        reserved = sorted(RESERVED_TEMPLATE_KEYS & set(self.template_kwargs))
        if reserved:
            raise InvalidInputError(f"'chat_template_kwargs' may not set {reserved}: the request's own fields do")
        if not isinstance(self.processor_kwargs, Mapping):
            raise InvalidInputError(f"'mm_processor_kwargs' must be an object of image processor arguments, got "
                                    f"{self.processor_kwargs!r}"[:300])

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> "ChatOptions":
        """The options of a chat completions body (absent or null fields keep their defaults)."""
        values = {key: body[key] for key in ("add_generation_prompt", "continue_final_message")
                  if body.get(key) is not None}
        kwargs, processor = body.get("chat_template_kwargs"), body.get("mm_processor_kwargs")
        return cls(**values, template_kwargs=kwargs if kwargs is not None else {},
                   processor_kwargs=processor if processor is not None else {})


DEFAULT_CHAT = ChatOptions()


def _open_final_message(rendered: str, messages: Sequence[Mapping[str, Any]]) -> str:
    """``rendered`` cut right after the final message's text, as transformers' ``continue_final_message``
    does: at its last occurrence, keeping the message's own trailing spaces only where the template
    kept them."""
    content = messages[-1].get("content")
    if isinstance(content, list):  # the last text part of a multimodal message
        texts = [part["text"] for part in content if isinstance(part, Mapping) and isinstance(part.get("text"), str)]
        content = texts[-1] if texts else None
    if not isinstance(content, str) or not content.strip():
        raise InvalidInputError("'continue_final_message' is set but the final message has no text to continue")
    if content.strip() not in rendered:
        raise InvalidInputError("'continue_final_message' is set but the chat template does not write the final "
                                "message's text into the prompt")
    start = rendered.rindex(content.strip())
    kept = content.lstrip()
    end = start + len(kept) if rendered[start:start + len(kept)] == kept else start + len(content.strip())
    return rendered[:end]


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

    def render(self, messages: Sequence[Mapping[str, Any]], *, options: ChatOptions = DEFAULT_CHAT,
               tools: Any = None, multimodal: bool = False) -> str:
        """The prompt text for ``messages``; InvalidInputError for bad messages or a template's refusal.

        ``options``: ``ChatOptions``; ``multimodal``: see ``normalize_messages``."""
        if self._template is None:
            raise InvalidInputError("this model has no chat template (chat_template.jinja or tokenizer_config.json "
                                    "'chat_template'): use the completions API with a plain prompt")
        from jinja2.exceptions import TemplateError

        normalized = normalize_messages(list(messages), multimodal)
        try:
            rendered = self._template.render(**self.special_tokens, **options.template_kwargs, messages=normalized,
                                             tools=tools, add_generation_prompt=options.add_generation_prompt)
        except TemplateError as exc:
            raise InvalidInputError(f"the chat template rejected the messages: {exc}") from None
        return _open_final_message(rendered, normalized) if options.continue_final_message else rendered

    def encode_messages(self, messages: Sequence[Mapping[str, Any]], **kwargs: Any) -> list[int]:
        return self.tokenizer.encode(self.render(messages, **kwargs), add_special_tokens=False).ids

    def encode_prompt(self, prompt: str) -> list[int]:
        if not isinstance(prompt, str):
            raise InvalidInputError(f"the prompt must be a string, got {type(prompt).__name__}")
        return self.tokenizer.encode(prompt, add_special_tokens=True).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """One token's own text (for logprobs), special tokens included."""
        return self.tokenizer.decode([int(token_id)], skip_special_tokens=False)
