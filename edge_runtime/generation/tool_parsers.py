"""Tool calls in a model's own format: the grammar that constrains a call, and the parser that reads it.

``[generation] tool_parser`` picks the format per model (default: ``hermes``
when the chat template mentions ``<tool_call>``, else ``json``):

* ``hermes`` (Qwen2.5, Hermes): each call is
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, free text around it;
* ``json``: the whole answer is one call object ``{"name": ..., "arguments": {...}}``,
  or a JSON list of them.

``grammar`` gives the Lark grammar (llguidance's, with ``%json`` for the
arguments' schema) a forced call (``tool_choice`` required or named, or a
``strict`` tool under ``auto``) is decoded with; ``parse`` turns the answer into
(content, calls). Both are pure functions of their inputs.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

PARSERS = ("hermes", "json")
_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_ARGUMENTS = re.compile(r'"(?:arguments|parameters)"\s*:\s*')
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object as text, as OpenAI sends it
    id: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def default_parser(template_source: str | None) -> str:
    return "hermes" if template_source and "<tool_call>" in template_source else "json"


def _call_schema(tool: Mapping[str, Any]) -> dict[str, Any]:
    function = tool["function"]
    parameters = function.get("parameters") or {"type": "object"}
    return {"type": "object", "properties": {"name": {"const": function["name"]}, "arguments": parameters},
            "required": ["name", "arguments"], "additionalProperties": False}


def _calls_schema(tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    schemas = [_call_schema(t) for t in tools]
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def grammar(parser: str, tools: Sequence[Mapping[str, Any]], parallel: bool, optional: bool) -> str:
    """The Lark grammar of calls to ``tools`` in ``parser``'s format.

    ``parallel``: one or more calls, else exactly one; ``optional`` (``auto`` with strict
    tools, hermes only): plain text without a call is allowed too.
    """
    schema = {**_calls_schema(tools), "x-guidance": {"whitespace_flexible": False}}  # compact, as in constraints
    body = "%json " + json.dumps(schema)
    if parser == "hermes":
        calls = "call (\"\\n\" call)*" if parallel else "call"
        lines = [f"start: {'TEXT | ' if optional else ''}{calls}",
                 f"call: \"<tool_call>\\n\" {body} \"\\n</tool_call>\""]
        if optional:  # text that never opens a call; a call is then decoded under the grammar
            lines.append(r"TEXT: /(?s:.+)/ & ~/(?s:.*<tool_call>.*)/")
        return "\n".join(lines) + "\n"
    if parallel:
        return f"start: \"[\" call (\", \" call)* \"]\"\ncall: {body}\n"
    return f"start: {body}\n"


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def raw_arguments(text: str, value: Any, start: int = 0) -> tuple[str | None, int]:
    """The arguments object ``value`` as the model wrote it in ``text`` (searched from ``start``), and
    where it ends; (None, start) when not found. Sending the model's own text keeps a streamed call's
    arguments (sent as written) and the whole answer's the same string."""
    for match in _ARGUMENTS.finditer(text, start):
        try:
            decoded, end = _DECODER.raw_decode(text, match.end())
        except ValueError:
            continue
        if decoded == value:
            return text[match.end():end], end
    return None, start


def _call_of(value: Any, text: str = "", start: int = 0) -> tuple[ToolCall | None, int]:
    """The call in a decoded JSON ``value`` (written in ``text`` from ``start``), and where it ends in ``text``."""
    if not isinstance(value, Mapping) or not isinstance(value.get("name"), str):
        return None, start
    arguments = value.get("arguments", value.get("parameters", {}))
    raw, end = raw_arguments(text, arguments, start) if isinstance(arguments, Mapping) else (None, start)
    if isinstance(arguments, str):  # some models write the arguments pre-serialised
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None, start
    if not isinstance(arguments, Mapping):
        return None, start
    return ToolCall(value["name"], raw if raw is not None else json.dumps(arguments, ensure_ascii=False),
                    new_call_id()), end


def parse(parser: str, text: str) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of an answer; no calls found: (text, []). A malformed call stays content."""
    if parser == "hermes":
        calls, spans = [], []
        for match in _HERMES_CALL.finditer(text):
            try:
                call, _ = _call_of(json.loads(match.group(1)), match.group(1))
            except ValueError:
                call = None
            if call is not None:
                calls.append(call)
                spans.append(match.span())
        if not calls:
            return text, []
        kept, last = [], 0
        for start, end in spans:
            kept.append(text[last:start])
            last = end
        kept.append(text[last:])
        content = "".join(kept).strip()
        return content or None, calls
    try:
        value = json.loads(text)
    except ValueError:
        return text, []
    values = value if isinstance(value, list) else [value]
    calls, cursor = [], 0
    for item in values:
        call, cursor = _call_of(item, text, cursor)
        if call is None:
            return text, []
        calls.append(call)
    return (None, calls) if calls else (text, [])


def assemble(deltas: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Whole tool calls from streamed OpenAI deltas (a cloud peer's), by ``index``, in index order."""
    calls: dict[int, dict[str, Any]] = {}
    for delta in deltas:
        index = delta.get("index", 0)
        call = calls.setdefault(index if isinstance(index, int) else 0,
                                {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
        call["id"] = delta.get("id") or call["id"]
        function = delta.get("function")
        if isinstance(function, Mapping):
            call["function"]["name"] += function.get("name") or ""
            call["function"]["arguments"] += function.get("arguments") or ""
    return [calls[i] for i in sorted(calls)]
