"""A thinking model's reasoning apart from its answer: ``<think> ... </think>``, as vLLM's reasoning parsers.

``[generation] reasoning_parser`` turns it on per model (off by default, as in vLLM: it changes what
clients read). Qwen3 (hybrid and -Thinking), QwQ, the DeepSeek-R1 distills, GLM-4.1V-Thinking and
GLM-4.5 all write their reasoning between ``<think>`` and ``</think>``; vLLM's names for their
parsers (``qwen3``, ``deepseek_r1``, ``glm45``) are accepted and all read that one format.

Where the reasoning starts is read from the rendered prompt, not guessed per family: a chat
template that opens the block itself (R1 distills, Qwen3-Thinking-2507, an assistant message
continued after its ``<think>``) leaves the prompt with a ``<think>`` not closed after it, and the
answer then begins inside the reasoning; otherwise the reasoning is there only when the answer
begins with ``<think>`` (leading whitespace aside). A hybrid model asked not to think (Qwen3's
``enable_thinking: false`` renders an empty closed block into the prompt) answers plain content.
The reasoning ends at the first ``</think>``; an answer cut short before it (``max_tokens``) is all
reasoning, with no content. Text after ``</think>`` is the content as written (whitespace kept, as
vLLM keeps it), and tool calls are read from the content only.

``split`` reads a whole answer; ``ReasoningStream`` reads it as it streams and sends each piece as
soon as it cannot be part of a tag, so the pieces assemble to ``split``'s two parts.
Hand-written: a tag scan over streamed text; vLLM's parsers work on its own token ids and
request types and are not a library.
"""

from __future__ import annotations

from typing import Any

OPEN = "<think>"
CLOSE = "</think>"
PARSERS = ("think", "qwen3", "deepseek_r1", "glm45")  # vLLM's names for the same <think> format


def opens_in_prompt(prompt_text: str) -> bool:
    """Whether the rendered prompt leaves a ``<think>`` block open (its answer starts in the reasoning)."""
    opened = prompt_text.rfind(OPEN)
    return opened >= 0 and prompt_text.rfind(CLOSE) < opened


def split(text: str, opened: bool) -> tuple[str | None, str | None]:
    """(reasoning, content) of a whole answer; reasoning None when the answer has none. ``opened``: the
    prompt left a ``<think>`` open (``opens_in_prompt``)."""
    stripped = text.lstrip()
    if stripped.startswith(OPEN):  # a model that writes the tag the prompt opened already: read once
        text = stripped[len(OPEN):]
    elif not opened:
        return None, text
    end = text.find(CLOSE)
    if end < 0:
        return text, None
    return text[:end], text[end + len(CLOSE):] or None


def read_answer(text: str, given: str, opened: bool | None) -> tuple[str | None, str | None]:
    """(reasoning, content) of a whole answer as the routes send it: ``given``, a cloud peer's own reasoning,
    is passed on with the text as content; ``opened`` None (no parser) leaves the text whole; else ``split``."""
    if given:
        return given, text
    return (None, text) if opened is None else split(text, opened)


def token_count(tokenizer: Any, text: str | None) -> int:
    """The reasoning's tokens for ``usage`` (``reasoning_tokens``), counted by encoding its text: a token
    that straddled ``</think>`` in the answer counts once, on this side."""
    return len(tokenizer.encode(text, add_special_tokens=False).ids) if text else 0


def _held(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` could begin ``tag`` (kept back until the next piece)."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


class ReasoningStream:
    """``feed(text)`` gives the ``("reasoning", piece)`` / ``("content", piece)`` events the new text
    completes; ``finish()`` those of what was held back."""

    def __init__(self, opened: bool) -> None:
        self.opened = opened
        self.state = "start"  # start -> thinking -> content, or start -> content
        self.pending = ""

    def feed(self, text: str) -> list[tuple[str, str]]:
        self.pending += text
        events: list[tuple[str, str]] = []
        if self.state == "start":
            stripped = self.pending.lstrip()
            if len(stripped) < len(OPEN) and OPEN.startswith(stripped):
                return events  # whitespace, or the opening tag not whole yet
            if stripped.startswith(OPEN):
                self.state, self.pending = "thinking", stripped[len(OPEN):]
            else:
                self.state = "thinking" if self.opened else "content"
        if self.state == "thinking":
            end = self.pending.find(CLOSE)
            if end >= 0:
                if end:
                    events.append(("reasoning", self.pending[:end]))
                self.state, self.pending = "content", self.pending[end + len(CLOSE):]
            else:
                keep = _held(self.pending, CLOSE)
                if len(self.pending) > keep:
                    events.append(("reasoning", self.pending[:len(self.pending) - keep]))
                    self.pending = self.pending[len(self.pending) - keep:]
        if self.state == "content" and self.pending:
            events.append(("content", self.pending))
            self.pending = ""
        return events

    def parts(self, text: str, finished: bool) -> tuple[str, str]:
        """(reasoning, content) that ``text``, one streamed piece, completes; ``finished``: the answer's last
        piece, so nothing is held back."""
        events = self.feed(text) + (self.finish() if finished else [])
        return ("".join(piece for kind, piece in events if kind == "reasoning"),
                "".join(piece for kind, piece in events if kind == "content"))

    def finish(self) -> list[tuple[str, str]]:
        """The held-back text at the answer's end: a partial tag is text of the part it was in."""
        pending, self.pending = self.pending, ""
        if not pending:
            return []
        inside = self.state == "thinking" or (self.state == "start" and self.opened)
        return [("reasoning" if inside else "content", pending)]
