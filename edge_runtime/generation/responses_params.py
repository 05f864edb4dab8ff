"""OpenAI's Responses API request (``POST /v1/responses``) as the chat-completions request it means.

Agent frameworks that speak the Responses API (OpenAI's Agents SDK, Codex, ...) send a list of
input items instead of chat messages. ``chat_body`` turns one request into the equivalent
``/v1/chat/completions`` body, so the chat path's parsing, templates, images, tools, constraints,
reasoning and cloud forwarding serve it unchanged; ``server.responses_routes`` writes the answer
back as a Response object or its stream of events.

Mapped: ``input`` (a string, or items: messages with ``input_text`` / ``output_text`` /
``input_image`` parts, ``function_call`` and ``function_call_output``; ``reasoning`` items are
dropped, as chat templates drop past reasoning), ``instructions`` (a system message first),
function ``tools`` (flat in this API, nested in chat), ``tool_choice``, ``parallel_tool_calls``,
``text.format`` (``json_schema`` / ``json_object``), ``max_output_tokens``, ``temperature``, ``top_p``
and vLLM's sampling extras. Refused with a 400 naming the field: state this server does not keep
(``conversation``, ``background``), built-in tools (web or file search, ...), files and item
references. ``previous_response_id`` and ``store`` are the server's (``server.responses_store``: the
input arrives here already continued); ``reasoning``, ``include``, ``truncation`` and ``metadata`` are
accepted and change nothing here.
"""

from __future__ import annotations

from typing import Any, Mapping

from edge_runtime.errors import InvalidInputError

# Request fields passed to the chat body as they are: OpenAI's own and vLLM's sampling extras.
PASSED = ("model", "temperature", "top_p", "stream", "parallel_tool_calls", "seed", "stop", "top_k", "min_p",
          "repetition_penalty", "frequency_penalty", "presence_penalty", "logit_bias", "min_tokens", "ignore_eos",
          "structured_outputs", "chat_template_kwargs", "include_reasoning", "top_logprobs", "mm_processor_kwargs")
STATEFUL = {"previous_response_id": "the server resolves it before the chat body is made",
            "conversation": "this server keeps no conversations: send the whole conversation in 'input'",
            "background": "background responses are not supported: use stream, or wait for the answer"}


def chat_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat-completions body of a Responses request; InvalidInputError names a bad field."""
    for key, why in STATEFUL.items():
        if body.get(key) not in (None, False):
            raise InvalidInputError(f"'{key}' is not supported: {why}")
    chat: dict[str, Any] = {k: body[k] for k in PASSED if k in body}
    messages = _messages(body.get("input"))
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise InvalidInputError(f"'instructions' must be a string, got {type(instructions).__name__}")
        messages.insert(0, {"role": "system", "content": instructions})
    chat["messages"] = messages
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    if body.get("tools"):
        chat["tools"] = [_tool(i, tool) for i, tool in enumerate(_list(body, "tools"))]
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    response_format = _format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    return chat


def _list(body: Mapping[str, Any], key: str) -> list[Any]:
    value = body.get(key)
    if not isinstance(value, list):
        raise InvalidInputError(f"'{key}' must be a list, got {type(value).__name__}")
    return value


def _messages(given: Any) -> list[dict[str, Any]]:
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    if not isinstance(given, list) or not given:
        raise InvalidInputError("'input' must be a string or a non-empty list of input items")
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(given):
        where = f"input[{index}]"
        if not isinstance(item, Mapping):
            raise InvalidInputError(f"{where} must be an object (a message or a function call item)")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise InvalidInputError(f"{where}.role must be 'user', 'system', 'developer' or 'assistant', "
                                        f"got {role!r}")
            messages.append({"role": role, "content": _content(item.get("content"), where)})
        elif kind == "function_call":
            call = {"id": _text(item, "call_id", where), "type": "function",
                    "function": {"name": _text(item, "name", where), "arguments": _text(item, "arguments", where)}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)  # one assistant turn makes the calls of one step
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            content = output if isinstance(output, str) else _content(output, where + ".output")
            messages.append({"role": "tool", "tool_call_id": _text(item, "call_id", where), "content": content})
        elif kind == "reasoning":
            continue  # past reasoning: chat templates leave it out of the prompt
        else:
            raise InvalidInputError(f"{where}.type {kind!r} is not supported (messages, function_call, "
                                    f"function_call_output and reasoning items are)")
    if not messages:
        raise InvalidInputError("'input' has no message")
    return messages


def _text(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise InvalidInputError(f"{where}.{key} must be a string, got {value!r}"[:300])
    return value


def standard_parts(messages: list[Any]) -> list[Any]:
    """Chat ``messages`` with the Responses API's part types (``input_text``, ``output_text``,
    ``input_image``), which vLLM's chat API takes as well, rewritten as chat's ``text`` and
    ``image_url`` parts; every other part and message as it was (its checks are the chat path's)."""
    kinds = ("input_text", "output_text", "input_image")
    standard = []
    for index, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list) and any(isinstance(p, Mapping) and p.get("type") in kinds for p in content):
            content = [_part(part, f"messages[{index}].content[{at}]")
                       if isinstance(part, Mapping) and part.get("type") in kinds else part
                       for at, part in enumerate(content)]
            message = {**message, "content": content}
        standard.append(message)
    return standard


def _content(content: Any, where: str) -> Any:
    """A message's content in chat's form: a string stays; parts become text and image_url parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidInputError(f"{where}.content must be a string or a list of content parts")
    return [_part(part, f"{where}.content[{index}]") for index, part in enumerate(content)]


def _part(part: Any, at: str) -> dict[str, Any]:
    """One content part as chat's ``text`` or ``image_url`` part."""
    kind = part.get("type") if isinstance(part, Mapping) else None
    if kind in ("input_text", "output_text", "text"):
        return {"type": "text", "text": _text(part, "text", at)}
    if kind == "refusal":
        return {"type": "text", "text": _text(part, "refusal", at)}
    if kind == "input_image":
        url = part.get("image_url")
        if not isinstance(url, str) or not url:
            raise InvalidInputError(f"{at}.image_url must be a URL string (a data: URL, or one [vision] allows);"
                                    " file_id is not supported")
        image: dict[str, Any] = {"url": url}
        if part.get("detail") is not None:
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    raise InvalidInputError(f"{at}.type {kind!r} is not supported (input_text, output_text, input_image)")


def _tool(index: int, tool: Any) -> dict[str, Any]:
    where = f"tools[{index}]"
    if not isinstance(tool, Mapping) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, Mapping) else tool
        raise InvalidInputError(f"{where}.type {kind!r} is not supported: only function tools run here")
    function = {"name": _text(tool, "name", where)}
    for key in ("description", "parameters", "strict"):
        if tool.get(key) is not None:
            function[key] = tool[key]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, str):
        return choice
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": _text(choice, "name", "tool_choice")}}
    raise InvalidInputError(f"'tool_choice' must be 'auto', 'none', 'required' or {{'type': 'function', 'name': ...}}"
                            f", got {choice!r}"[:300])


def _format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    form = text.get("format") if isinstance(text, Mapping) else None
    if form is None:
        return None
    kind = form.get("type") if isinstance(form, Mapping) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = {k: form[k] for k in ("name", "schema", "strict", "description") if k in form}
        return {"type": "json_schema", "json_schema": schema}
    raise InvalidInputError(f"text.format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}")
