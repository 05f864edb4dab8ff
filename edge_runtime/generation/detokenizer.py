"""Incremental detokenisation: text deltas for a growing list of ids, never half a UTF-8 character.

Byte-level BPE tokens can carry part of a multi-byte character; decoding them
alone yields U+FFFD. Hand-written because ``tokenizers`` 0.22's Python API has
no incremental decoder. The idea is the one vLLM and TGI use: decode a short
window of recent ids twice (with and without the newest), emit the difference
only once it no longer ends in U+FFFD, and slide the window so each step
decodes a few tokens, not the whole text.
"""

from __future__ import annotations

from typing import Callable, Sequence

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Feed ids one at a time with ``push``; the concatenated deltas equal ``decode(all ids)``
    (for tokenizers whose decoding is prefix-stable, as byte-level BPE is)."""

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._prefix = 0  # window start: ids before it are already emitted and stable
        self._read = 0  # ids up to here are emitted

    def push(self, token_id: int) -> str:
        """Add one id; return the text it completes ('' while a character is still incomplete)."""
        self._ids.append(int(token_id))
        before = self._decode(self._ids[self._prefix:self._read])
        after = self._decode(self._ids[self._prefix:])
        if len(after) > len(before) and not after.endswith(REPLACEMENT):
            delta = after[len(before):]
            self._prefix, self._read = self._read, len(self._ids)
            return delta
        return ""

    def flush(self) -> str:
        """Whatever is left at the end (an incomplete character is emitted as U+FFFD, as decode would)."""
        before = self._decode(self._ids[self._prefix:self._read])
        after = self._decode(self._ids[self._prefix:])
        self._prefix = self._read = len(self._ids)
        return after[len(before):] if len(after) > len(before) else ""
