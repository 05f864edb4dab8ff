"""Streams an answer's tool calls as OpenAI does: a call opens with its id and name, then its
arguments follow in pieces as the model writes them.

``ToolStream(parser).feed(text)`` returns the events the new text completes:
``("content", text)``, ``("call", index, id, name)``, ``("arguments", index, piece)``.
Text that cannot be part of a call goes out as content at once; a call whose
header is written ``{"name": ..., "arguments": `` (the order our grammars
force, and models' usual one) streams its arguments as written, up to the
object's closing brace; any other shape is held and parsed whole by
``finish``, which also sends the calls the stream could not. The arguments
sent are the model's own text, as ``tool_parsers.parse`` returns them, so
the deltas assemble to the non-streamed answer.
"""

from __future__ import annotations

import json
import re
from typing import Any

from edge_runtime.generation import tool_parsers

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*')
_HEADER_LIMIT = 512  # characters of a call's start before we stop waiting for the usual header


_FIRST_KEY = re.compile(r'\s*\{\s*"((?:[^"\\]|\\.)*)"')
_SECOND_KEY = re.compile(r'\s*\{\s*"name"\s*:\s*"(?:[^"\\]|\\.)*"\s*([,}])\s*("(?:[^"\\]|\\.)*")?')


def _may_become_header(pending: str) -> bool:
    """False once the call's start has shown a shape other than ``{"name": .., "arguments": ``."""
    stripped = pending.lstrip()
    if stripped and stripped[0] != "{":
        return False
    first = _FIRST_KEY.match(pending)
    if first is not None and first.group(1) != "name":
        return False
    second = _SECOND_KEY.match(pending)
    if second is not None and (second.group(1) == "}" or (
            second.group(2) is not None and json.loads(second.group(2)) not in ("arguments", "parameters"))):
        return False
    return True


class _ObjectEnd:
    """Finds where a streamed JSON object ends (depth back to 0), strings and escapes aside.

    Hand-written: it only counts braces outside strings; no maintained library reports where a
    partial JSON value ends, and the value itself is parsed by ``json`` once complete.
    """

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False

    def feed(self, text: str) -> int | None:
        """Index just past the object's end in ``text``, or None when it goes on."""
        for i, char in enumerate(text):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif char == "\\":
                    self.escaped = True
                elif char == '"':
                    self.in_string = False
            elif char == '"':
                self.in_string = True
            elif char in "{[":
                self.depth += 1
            elif char in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return i + 1
        return None


class ToolStream:
    def __init__(self, parser: str) -> None:
        self.parser = parser
        self._text = ""
        self._at = 0  # characters of _text already handled
        self._mode = "content"  # content, free (json: a plain answer), header, arguments, after, held
        self._streamed: list[tuple[str, str]] = []  # (name, arguments) of the calls sent whole
        self._arguments = ""
        self._end: _ObjectEnd | None = None

    def feed(self, text: str) -> list[tuple[Any, ...]]:
        self._text += text
        events: list[tuple[Any, ...]] = []
        while self._step(events):
            pass
        return events

    def _step(self, events: list[tuple[Any, ...]]) -> bool:
        """Handle what the pending text allows; True when another step may make progress."""
        pending = self._text[self._at:]
        if not pending or self._mode == "held":
            return False
        if self._mode == "free":
            events.append(("content", pending))
            self._at = len(self._text)
            return False
        if self._mode == "content":
            return self._content(pending, events)
        if self._mode == "header":
            return self._header(pending, events)
        if self._mode == "arguments":
            return self._arguments_piece(pending, events)
        return self._after(pending)

    def _content(self, pending: str, events: list[tuple[Any, ...]]) -> bool:
        if self.parser == "json":
            stripped = pending.lstrip()
            if not stripped:
                return False
            if stripped[0] not in "{[":
                self._mode = "free"
                return True
            self._at += len(pending) - len(stripped) + (1 if stripped[0] == "[" else 0)
            self._mode = "header"
            return True
        at = pending.find(OPEN)
        if self._streamed and not pending[:at if at >= 0 else len(pending)].strip():
            # whitespace between calls is no content (the whole answer's content drops it too)
            if at < 0:
                return False
            self._at += at + len(OPEN)
            self._mode = "header"
            return True
        if at < 0:
            keep = max((k for k in range(1, len(OPEN)) if pending.endswith(OPEN[:k])), default=0)
            if len(pending) > keep:
                events.append(("content", pending[:len(pending) - keep]))
                self._at += len(pending) - keep
            return False
        if at:
            events.append(("content", pending[:at]))
        self._at += at + len(OPEN)
        self._mode = "header"
        return True

    def _header(self, pending: str, events: list[tuple[Any, ...]]) -> bool:
        match = _HEADER.match(pending)
        if match is None:
            if len(pending) > _HEADER_LIMIT or not _may_become_header(pending):
                self._mode = "held"  # another shape: parsed whole at the end
            return False
        index = len(self._streamed)
        events.append(("call", index, tool_parsers.new_call_id(), json.loads(match.group(1))))
        self._streamed.append((json.loads(match.group(1)), ""))
        self._at += match.end()
        self._mode, self._arguments, self._end = "arguments", "", _ObjectEnd()
        return True

    def _arguments_piece(self, pending: str, events: list[tuple[Any, ...]]) -> bool:
        assert self._end is not None
        if not self._arguments:
            stripped = pending.lstrip()
            self._at += len(pending) - len(stripped)  # the space after the colon is not the arguments'
            if not stripped.startswith("{"):
                if stripped:
                    self._mode = "held"  # arguments not an object (pre-serialised text): parsed whole at the end
                return False
            pending = stripped
        end = self._end.feed(pending)
        piece = pending if end is None else pending[:end]
        self._arguments += piece
        events.append(("arguments", len(self._streamed) - 1, piece))
        self._at += len(piece)
        if end is None:
            return False
        self._streamed[-1] = (self._streamed[-1][0], self._arguments)
        self._mode = "after"
        return True

    def _after(self, pending: str) -> bool:
        """Skip the rest of the call: its closing brace, then ``</tool_call>`` or the list's comma."""
        if self.parser == "hermes":
            at = pending.find(CLOSE)
            if at < 0:
                return False
            self._at += at + len(CLOSE)
            self._mode = "content"
            return True
        close = re.match(r"\s*\}\s*(,|\])?", pending)
        if close is None or (close.group(1) is None and close.end() == len(pending)):
            return False  # wait: a comma (another call) or the end may follow
        self._at += close.end()
        self._mode = "header" if close.group(1) == "," else "held"
        return True

    def finish(self) -> list[tuple[Any, ...]]:
        """Events at the end of the answer: held content, and the calls not yet streamed, whole."""
        events: list[tuple[Any, ...]] = []
        if self._mode in ("content", "free"):
            rest = self._text[self._at:]
            return [("content", rest)] if rest.strip() or (rest and not self._streamed) else []
        content, calls = tool_parsers.parse(self.parser, self._text)
        sent = len(self._streamed)
        if not calls and not sent:
            return [("content", self._text[self._at:])] if self._text[self._at:] else []
        for index, call in enumerate(calls[sent:], start=sent):
            events.append(("call", index, call.id, call.name))
            events.append(("arguments", index, call.arguments))
        return events
