"""Structured-output and tool fields of a request, to a grammar and a tool-call plan.

Reads OpenAI's ``response_format`` (``json_schema``, ``json_object``, ``text``),
``tools`` / ``tool_choice`` (``auto``, ``required``, ``none``, a named
function) / ``parallel_tool_calls``, and vLLM's ``structured_outputs``
extension (``json``, ``regex``, ``choice``, ``grammar``, ``json_object``; and
its older top-level ``guided_*`` spellings). The same reader serves the HTTP
routes and the embedded API. Every refusal is an InvalidInputError naming the
field; a grammar's own errors surface when the model compiles it (``resolve``),
still before any token is generated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Mapping

from edge_runtime.errors import InvalidInputError
from edge_runtime.generation import tool_parsers
from edge_runtime.generation.constraints import GrammarSpec

STRUCTURED_FIELDS = ("response_format", "tools", "tool_choice", "parallel_tool_calls", "structured_outputs",
                     "guided_json", "guided_regex", "guided_choice", "guided_grammar")


@dataclass(frozen=True)
class ToolRequest:
    tools: tuple[dict[str, Any], ...]
    choice: str  # "auto", "required", "none" or "function" (then ``name``)
    name: str | None = None
    parallel: bool = True

    @property
    def forced(self) -> bool:
        return self.choice in ("required", "function")

    @property
    def offered(self) -> tuple[dict[str, Any], ...]:
        """The tools a call may use (the named one only, when named)."""
        return tuple(t for t in self.tools if self.choice != "function" or t["function"]["name"] == self.name)

    @property
    def strict(self) -> bool:
        return any(t["function"].get("strict") is True for t in self.tools)


@dataclass(frozen=True)
class Structured:
    """A request's constraint (``guide``) and tools; both None for free text."""

    guide: GrammarSpec | None = None
    tools: ToolRequest | None = None

    @property
    def parses_tools(self) -> bool:
        """The answer is read for tool calls (tools offered and ``tool_choice`` not ``none``)."""
        return self.tools is not None and self.tools.choice != "none"


def _response_format(value: Any) -> GrammarSpec | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidInputError(f"'response_format' must be an object, got {value!r}"[:300])
    kind = value.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return GrammarSpec("json_object", "", "response_format")
    if kind == "json_schema":
        inner = value.get("json_schema")
        if not isinstance(inner, Mapping) or "schema" not in inner:
            raise InvalidInputError("response_format.json_schema must be an object with 'name' and 'schema'")
        return GrammarSpec.json_schema(inner["schema"], "response_format.json_schema.schema")
    raise InvalidInputError(f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}")


def _structured_outputs(options: Mapping[str, Any], where: str) -> GrammarSpec | None:
    given = {k: v for k, v in options.items() if k in ("json", "regex", "choice", "grammar", "json_object")
             and v is not None and v is not False}
    if not given:
        return None
    if len(given) > 1:
        raise InvalidInputError(f"{where}: give one of json, regex, choice, grammar; got {sorted(given)}")
    (key, value), = given.items()
    at = f"{where}.{key}"
    if key == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise InvalidInputError(f"{at} is not valid JSON: {exc}") from None
        return GrammarSpec.json_schema(value, at)
    if key == "json_object":
        return GrammarSpec("json_object", "", at)
    if key == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            raise InvalidInputError(f"{at} must be a non-empty list of strings, got {value!r}"[:300])
        return GrammarSpec("choice", json.dumps(value), at)
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"{at} must be a non-empty string, got {value!r}"[:300])
    return GrammarSpec(key, value, at)


def _tool(index: int, tool: Any) -> dict[str, Any]:
    where = f"tools[{index}]"
    if not isinstance(tool, Mapping) or tool.get("type") != "function" or not isinstance(tool.get("function"), Mapping):
        raise InvalidInputError(f"{where} must be {{'type': 'function', 'function': {{'name', 'parameters'}}}}, "
                                f"got {tool!r}"[:300])
    function = tool["function"]
    if not isinstance(function.get("name"), str) or not function["name"]:
        raise InvalidInputError(f"{where}.function.name must be a non-empty string")
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, Mapping):
        raise InvalidInputError(f"{where}.function.parameters must be a JSON schema object")
    return {"type": "function", "function": dict(function)}


def _tools(body: Mapping[str, Any]) -> ToolRequest | None:
    raw = body.get("tools")
    choice = body.get("tool_choice")
    if raw is None or raw == []:
        if choice not in (None, "none", "auto"):
            raise InvalidInputError(f"tool_choice {choice!r} needs 'tools'")
        return None
    if not isinstance(raw, list):
        raise InvalidInputError("'tools' must be a list of {'type': 'function', 'function': {...}} objects")
    tools = tuple(_tool(i, t) for i, t in enumerate(raw))
    names = [t["function"]["name"] for t in tools]
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise InvalidInputError(f"'parallel_tool_calls' must be true or false, got {parallel!r}")
    parallel = True if parallel is None else parallel
    if choice is None or choice in ("auto", "required", "none"):
        return ToolRequest(tools, choice or "auto", None, parallel)
    function = choice.get("function") if isinstance(choice, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(name, str):
        raise InvalidInputError("tool_choice must be 'auto', 'required', 'none' or "
                                f"{{'type': 'function', 'function': {{'name': ...}}}}, got {choice!r}"[:300])
    if name not in names:
        raise InvalidInputError(f"tool_choice.function.name {name!r} is not among the tools {names}")
    return ToolRequest(tools, "function", name, parallel)


def parse_structured(body: Mapping[str, Any], chat: bool = True) -> Structured:
    """The structured-output fields of a request body (chat: tools and response_format too)."""
    guides = [_response_format(body.get("response_format"))]
    options = body.get("structured_outputs")
    if options is not None:
        if not isinstance(options, Mapping):
            raise InvalidInputError(f"'structured_outputs' must be an object, got {options!r}"[:300])
        guides.append(_structured_outputs(options, "structured_outputs"))
    legacy = {k[len("guided_"):]: body.get(k) for k in ("guided_json", "guided_regex", "guided_choice",
                                                        "guided_grammar") if body.get(k) is not None}
    if legacy:
        guides.append(_structured_outputs(legacy, "guided"))
    guides = [g for g in guides if g is not None]
    if len(guides) > 1:
        raise InvalidInputError(f"give one output constraint, got {[g.where for g in guides]}")
    tools = _tools(body) if chat else None
    if not chat and body.get("tools") is not None:
        raise InvalidInputError("'tools' is a chat completions field: use /v1/chat/completions")
    if tools is not None and tools.forced and guides:
        raise InvalidInputError(f"{guides[0].where} cannot be combined with a forced tool_choice")
    return Structured(guides[0] if guides else None, tools)


def tool_guide(tools: ToolRequest, parser: str) -> GrammarSpec | None:
    """The grammar a call is decoded under: forced choice, or ``auto`` with a strict tool (hermes only,
    whose free text and calls are told apart by their tags); None for unconstrained ``auto``."""
    if tools.forced:
        return GrammarSpec("lark", tool_parsers.grammar(parser, tools.offered, tools.parallel, False), "tools")
    if tools.choice == "auto" and tools.strict and parser == "hermes":
        return GrammarSpec("lark", tool_parsers.grammar(parser, tools.tools, tools.parallel, True), "tools")
    return None


def resolve(structured: Structured, params: Any, grammars: Any, parser: str, after_reasoning: str = "") -> Any:
    """``params`` with the request's guide, every grammar compiled (cached) by ``grammars``;
    ``after_reasoning``: the guide holds after a thinking model's reasoning (``GrammarSpec``).

    Each tool's parameters are compiled on their own first, so a bad schema is named by its tool.
    InvalidInputError when a grammar does not compile or the model cannot constrain.
    """
    guide, specs = _grammars_of(structured, parser, after_reasoning)
    for spec in specs:
        if grammars is None:
            raise InvalidInputError(f"{spec.where}: this model cannot constrain its output")
        grammars.compile(spec)
    return params if guide is None else replace(params, guide=guide)


def compiles_anew(structured: Structured, grammars: Any, parser: str, after_reasoning: str = "") -> bool:
    """Whether ``resolve`` would compile a grammar ``grammars`` has not cached (milliseconds to
    seconds for a large schema: a server runs that off its event loop; a cached one costs nothing)."""
    if grammars is None:
        return False  # resolve only raises
    return any(not grammars.holds(spec) for spec in _grammars_of(structured, parser, after_reasoning)[1])


def _grammars_of(structured: Structured, parser: str,
                 after_reasoning: str = "") -> tuple[GrammarSpec | None, list[GrammarSpec]]:
    """(the request's guide, the grammars to compile for it, each tool's parameters first).
    ``after_reasoning``: the guide holds after a thinking model's reasoning (``GrammarSpec``)."""
    guide = structured.guide
    specs: list[GrammarSpec] = []
    if structured.tools is not None and structured.parses_tools:
        guide = tool_guide(structured.tools, parser) or guide
        if guide is not None and guide.where == "tools":
            for index, tool in enumerate(structured.tools.tools):
                parameters = tool["function"].get("parameters")
                if parameters is not None:
                    specs.append(GrammarSpec.json_schema(dict(parameters), f"tools[{index}].function.parameters"))
    if guide is not None:
        guide = replace(guide, after_reasoning=after_reasoning) if after_reasoning else guide
        specs.append(guide)
    return guide, specs
