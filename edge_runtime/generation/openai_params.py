"""OpenAI request bodies (chat completions, completions) to a prompt and ``SamplingParams``.

Transport-free: the HTTP adapters and the cloud client both use it. Unknown
fields that OpenAI defines but we ignore (``user``, ``metadata``, ...) pass;
parameters whose meaning we cannot honour are a 400, not a silent change of
meaning. ``n`` choices are ``n`` sequences of one request (``OpenAIRequest.choice``).
Structured output and tools (``response_format``, ``tools``, ``tool_choice``, vLLM's
``structured_outputs``) are read by ``structured``; vLLM's chat rendering fields
(``chat_template_kwargs``, ``add_generation_prompt``, ``continue_final_message``) by
``chat.ChatOptions``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from edge_runtime.errors import InvalidInputError
from edge_runtime.generation.chat import DEFAULT_CHAT, ChatOptions
from edge_runtime.generation.responses_params import standard_parts
from edge_runtime.generation.sampling import SamplingParams, logit_bias_of
from edge_runtime.generation.structured import Structured, parse_structured

OPENAI_DEFAULT_TEMPERATURE = 1.0
MAX_CHOICES = 128  # OpenAI's bound on ``n``


@dataclass(frozen=True)
class OpenAIRequest:
    """One parsed request: ``messages`` (chat) or ``prompt`` (completions)."""

    model: str
    params: SamplingParams
    stream: bool
    include_usage: bool
    messages: list[dict[str, Any]] | None = None
    prompt: str | list[int] | None = None
    echo: bool = False
    wants_async: bool = False
    body: Mapping[str, Any] | None = None  # the request as received, for forwarding to a cloud peer
    images: tuple[str, ...] = ()  # where each image part is ("messages[1].content[0]"), in prompt order
    structured: Structured = Structured()  # output constraint and tools (free text by default)
    n: int = 1  # choices asked for
    chat: ChatOptions = DEFAULT_CHAT  # vLLM's chat_template_kwargs / add_generation_prompt / continue_final_message
    truncate: int | None = None  # vLLM's truncate_prompt_tokens: keep the prompt's last k tokens (-1: the context)
    include_reasoning: bool = True  # vLLM's: false drops a thinking model's reasoning from the answer

    def choice(self, index: int) -> "OpenAIRequest":
        """The request of choice ``index`` alone: one choice, and with a ``seed``, ``seed + index`` (so
        seeded choices differ, each reproducible by a request of its own; forwarded so to a peer)."""
        if self.n == 1 and index == 0:
            return self
        seed = self.params.seed
        body = {**(self.body or {}), "n": 1}
        params = self.params
        if seed is not None:
            body["seed"] = seed + index
            params = replace(params, seed=seed + index)
        return replace(self, params=params, body=body, n=1)

    def forward_body(self, remote_model: str) -> dict[str, Any]:
        """The body to send an OpenAI-compatible peer: its model name, streamed, with usage."""
        body = {k: v for k, v in (self.body or {}).items() if k not in ("async", "ignore_eos", "stream_options")}
        return {**body, "model": remote_model, "stream": True, "stream_options": {"include_usage": True}}


def _bool(body: Mapping[str, Any], key: str, default: bool = False) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidInputError(f"'{key}' must be true or false, got {value!r}")
    return value


def _number(body: Mapping[str, Any], key: str, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInputError(f"'{key}' must be a number, got {value!r}")
    return float(value)


def model_name(body: Mapping[str, Any]) -> str:
    """The request's ``model``; InvalidInputError when it names none."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidInputError("'model' must name a served model (see GET /v1/models)")
    return model


def _sampling(body: Mapping[str, Any], chat: bool) -> SamplingParams:
    max_tokens = body.get("max_completion_tokens") if chat else None
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = (stop,)
    elif isinstance(stop, list):
        stop = tuple(stop)
    elif stop is None:
        stop = ()
    if chat:
        logprobs = _bool(body, "logprobs")
        top = body.get("top_logprobs") or 0
    else:  # completions: logprobs is the number of top alternatives (0..5), null for none
        raw = body.get("logprobs")
        if raw is not None and (isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= 5):
            raise InvalidInputError(f"'logprobs' must be an integer in [0, 5] or null, got {raw!r}")
        logprobs, top = raw is not None, raw or 0
    scored = body.get("prompt_logprobs")  # vLLM's
    if scored is not None and body.get("stream") is True:  # vLLM's refusal, in its words
        raise InvalidInputError("'prompt_logprobs' are not available when stream is enabled")
    if scored is None and not chat and logprobs and body.get("echo") is True and body.get("stream") is not True:
        scored = top  # the legacy echo: the logprobs object covers the prompt's tokens too
    seed = body.get("seed")
    return SamplingParams(max_tokens=max_tokens, temperature=_number(body, "temperature", OPENAI_DEFAULT_TEMPERATURE),
                          top_p=_number(body, "top_p", 1.0), seed=seed, stop=stop,
                          presence_penalty=_number(body, "presence_penalty", 0.0),
                          frequency_penalty=_number(body, "frequency_penalty", 0.0), logprobs=logprobs,
                          top_logprobs=top, ignore_eos=_bool(body, "ignore_eos"),
                          # top_k .. stop_token_ids are vLLM's (the openai client sends them in extra_body)
                          logit_bias=logit_bias_of(body.get("logit_bias")),
                          top_k=0 if body.get("top_k") is None else body["top_k"], min_p=_number(body, "min_p", 0.0),
                          repetition_penalty=_number(body, "repetition_penalty", 1.0),
                          min_tokens=0 if body.get("min_tokens") is None else body["min_tokens"],
                          stop_token_ids=_token_ids(body, "stop_token_ids"),
                          include_stop_str_in_output=_bool(body, "include_stop_str_in_output"),
                          skip_special_tokens=_bool(body, "skip_special_tokens", True), prompt_logprobs=scored)


# vLLM's request fields that change the answer and that this engine does not do: refused, never ignored
# (field -> the value that means "off")
UNSUPPORTED_VLLM_FIELDS = {"use_beam_search": False, "length_penalty": 1.0}


# OpenAI fields whose meaning this server cannot honour: a 400 saying what to send instead, never ignored
UNHONOURED_OPENAI_FIELDS = {
    "functions": "OpenAI's deprecated function calling is not supported: send 'tools' (and 'tool_choice')",
    "function_call": "OpenAI's deprecated function calling is not supported: send 'tool_choice' with 'tools'",
    "audio": "audio output is not supported: this server answers text",
    "web_search_options": "web search is not available on this server",
}


def _refuse_unsupported(body: Mapping[str, Any], n: int) -> None:
    for key, off in UNSUPPORTED_VLLM_FIELDS.items():
        if body.get(key, off) not in (off, None):
            raise InvalidInputError(f"'{key}' is not supported by this server (got {body[key]!r})"[:300])
    for key, why in UNHONOURED_OPENAI_FIELDS.items():
        if body.get(key) is not None:
            raise InvalidInputError(f"'{key}': {why}")
    modalities = body.get("modalities")
    if modalities is not None and (not isinstance(modalities, list) or set(modalities) - {"text"}):
        raise InvalidInputError(f"'modalities' may only ask for text output here, got {modalities!r}"[:300])
    best_of = body.get("best_of")
    if best_of is not None and best_of != n:
        raise InvalidInputError(f"'best_of' is not supported: give 'n' choices instead (got best_of {best_of!r}, "
                                f"n {n})"[:300])


def _token_ids(body: Mapping[str, Any], key: str) -> tuple[Any, ...]:
    value = body.get(key)
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidInputError(f"'{key}' must be a list of token ids, got {value!r}"[:300])
    return tuple(value)


def _choices(body: Mapping[str, Any]) -> int:
    n = body.get("n")
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CHOICES:
        raise InvalidInputError(f"'n' must be an integer from 1 to {MAX_CHOICES} (choices), got {n!r}")
    return n


def _truncate(body: Mapping[str, Any]) -> int | None:
    value = body.get("truncate_prompt_tokens")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != -1)):
        raise InvalidInputError(f"'truncate_prompt_tokens' must be an integer >= 1, or -1 for the model's context, "
                                f"got {value!r}"[:300])
    return value


def _stream_options(body: Mapping[str, Any], stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, Mapping):
        raise InvalidInputError(f"'stream_options' must be an object, got {options!r}")
    if not stream:
        raise InvalidInputError("'stream_options' is only allowed with 'stream': true")
    if _bool(options, "continuous_usage_stats"):  # vLLM's usage in every chunk: not built, so not ignored
        raise InvalidInputError("'stream_options.continuous_usage_stats' is not supported: usage comes in the last "
                                "chunk ('include_usage')")
    return _bool(options, "include_usage")


def image_parts(messages: list[Any]) -> tuple[str, ...]:
    """Where each image content part of ``messages`` is (``messages[i].content[j]``), in order.

    Only the part's shape is checked here (``{"type": "image_url", "image_url": {"url": str}}``,
    ``detail`` accepted and ignored); decoding the image is the model's work, and a text-only
    model never decodes one. InvalidInputError names a malformed part.
    """
    found = []
    for index, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, list):
            continue
        for position, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "image_url":
                continue
            where = f"messages[{index}].content[{position}]"
            image_url = part.get("image_url")
            url = image_url.get("url") if isinstance(image_url, Mapping) else None
            if not isinstance(url, str) or not url:
                raise InvalidInputError(f"{where}.image_url must be an object {{'url': 'data:image/png;base64,...'}}"
                                        f", got {image_url!r}"[:300])
            found.append(where)
    return tuple(found)


def parse_chat(body: Mapping[str, Any]) -> OpenAIRequest:
    """A ``/v1/chat/completions`` body; InvalidInputError names the bad field."""
    model = model_name(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidInputError("'messages' must be a non-empty list of {role, content} objects")
    messages = standard_parts(messages)  # vLLM's chat takes the Responses API's part types too
    structured = parse_structured(body, chat=True)
    stream = _bool(body, "stream")
    _refuse_unsupported(body, _choices(body))
    return OpenAIRequest(model, _sampling(body, chat=True), stream, _stream_options(body, stream),
                         messages=messages, wants_async=_bool(body, "async"), body=body,
                         images=image_parts(messages), structured=structured, n=_choices(body),
                         chat=ChatOptions.from_body(body), truncate=_truncate(body),
                         include_reasoning=_bool(body, "include_reasoning", True))


def parse_completion(body: Mapping[str, Any]) -> OpenAIRequest:
    """A ``/v1/completions`` body: ``prompt`` is one string or one list of token ids."""
    model = model_name(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if not (isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt))):
        raise InvalidInputError("'prompt' must be a string or a list of token ids (one prompt per request)")
    if body.get("suffix") is not None:
        raise InvalidInputError("'suffix' is not supported by this model")
    structured = parse_structured(body, chat=False)
    stream = _bool(body, "stream")
    _refuse_unsupported(body, _choices(body))
    return OpenAIRequest(model, _sampling(body, chat=False), stream, _stream_options(body, stream), prompt=prompt,
                         echo=_bool(body, "echo"), wants_async=_bool(body, "async"), body=body,
                         structured=structured, n=_choices(body), truncate=_truncate(body))
