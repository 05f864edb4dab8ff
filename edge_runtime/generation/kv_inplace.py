"""The running batch's KV cache for a fused (GroupQueryAttention) decoder: one buffer, appended in place.

GroupQueryAttention writes each row's new key/value at the row's own length
(``seqlens_k``) straight into ``present`` when ``present`` is the very memory
bound as ``past``. So each layer's key and value get one flat buffer
(``max_batch * kv_heads * max_len * head_dim``), bound as both past and present
through the same ``OrtValue`` ``[rows, kv_heads, max_len, head_dim]``: a decode
step copies nothing, whatever the context length. (``kv_cache.BatchKV``, for
graphs that concatenate, needs two buffers and copies the whole past each step.)

Rows are left-aligned: row ``i`` holds its ``lengths[i]`` positions at the
start of its slot, anything after is stale and never read. The attention mask
tells the graph each row's length (its row sum, the new token included) and
the batch's longest total (its width); its ones are each row's first positions.
A layout change (sequences join or leave) moves only the rows that change slot.

Same interface as ``BatchKV`` (the engine and batcher use either), including the
per-row position offset (a Qwen2-VL sequence's ``rope_delta``).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from edge_runtime.generation.folder import KVLayout

SIDES = 1  # past and present are the same buffer


def buffer_bytes(layout: KVLayout, max_batch: int, max_len: int) -> int:
    """What ``InPlaceKV(layout, max_batch, max_len)`` allocates, in bytes (before allocating it)."""
    return SIDES * max_batch * max_len * layout.bytes_per_token


class InPlaceKV:
    """KV of up to ``max_batch`` sequences, each at most ``max_len`` positions long, appended in place."""

    in_place = True

    def __init__(self, layout: KVLayout, max_batch: int, max_len: int) -> None:
        self.layout = layout
        self.max_batch = max_batch
        self.max_len = max_len
        size = max_batch * layout.kv_heads * max_len * layout.head_dim
        self._flat = [np.zeros(size, layout.dtype) for _ in range(2 * layout.layers)]
        self._lengths: list[int] = []
        self.offsets: list[int] = []  # position offset per row
        self._bound: dict[int, list[Any]] = {}  # rows -> OrtValues over the buffers (made once per batch size)

    @property
    def rows(self) -> int:
        return len(self._lengths)

    @property
    def length(self) -> int:
        """The longest row's length (the columns a step reads at most, before its new token)."""
        return max(self._lengths, default=0)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._flat)

    def lengths(self) -> list[int]:
        """True length (tokens cached) of each row."""
        return list(self._lengths)

    def positions(self) -> list[int]:
        """Position of each row's next token: its length plus its offset."""
        return [n + offset for n, offset in zip(self._lengths, self.offsets)]

    def past(self) -> list[np.ndarray]:
        """Views [rows, kv_heads, max_len, head_dim] of every layer tensor (layer, key/value order)."""
        return self._slots(self.rows)

    def bindings(self) -> tuple[list[Any], list[Any]]:
        """(past OrtValues, present OrtValues): the same objects, so the graph appends in place."""
        bound = self._bound.get(self.rows)
        if bound is None:
            from onnxruntime import OrtValue

            # The views keep no reference of their own beyond the OrtValue's; the flat buffers live
            # as long as this object, so the OrtValues stay valid.
            bound = self._bound[self.rows] = [OrtValue.ortvalue_from_numpy(v) for v in self.past()]
        return bound, bound

    def advance(self) -> None:
        """After a step appended one token to every row."""
        self._lengths = [n + 1 for n in self._lengths]

    def attention_mask(self) -> np.ndarray:
        """[rows, longest + 1]: ones over each row's first ``length + 1`` positions (right padding)."""
        lengths = np.asarray(self._lengths, np.int64)
        return (np.arange(self.length + 1)[None, :] <= lengths[:, None]).astype(np.int64)

    def can_grow(self) -> bool:
        return self.length + 1 <= self.max_len

    def rebuild(self, keep: Sequence[int], joining: Sequence[list[np.ndarray]],
                offsets: Sequence[int] | None = None) -> list[int]:
        """New layout: rows ``keep`` (old indices, increasing) then one row per ``joining`` sequence.

        ``joining[j]`` is a sequence's KV, ``2 * layers`` arrays [1, heads, n_j, dim], and
        ``offsets[j]`` its position offset (default 0). Returns the new row index of each joining one.
        """
        offsets = list(offsets) if offsets is not None else [0] * len(joining)
        assert len(offsets) == len(joining), "one offset per joining sequence"
        assert list(keep) == sorted(set(keep)), "kept rows in increasing order"
        new_lengths = [self._lengths[r] for r in keep] + [int(kv[0].shape[2]) for kv in joining]
        if len(new_lengths) > self.max_batch:
            raise ValueError(f"batch of {len(new_lengths)} rows exceeds max_batch {self.max_batch}")
        if max(new_lengths, default=0) > self.max_len:
            raise ValueError(f"a sequence of {max(new_lengths)} positions exceeds the cache's {self.max_len}")
        slots = self._slots(self.max_batch)
        for tensor, slot in enumerate(slots):
            # Rows only move towards the front (keep is increasing), so copying in order never
            # overwrites a row still to be moved.
            for row, (source, n) in enumerate(zip(keep, new_lengths)):
                if source != row:
                    slot[row, :, :n] = slot[source, :, :n]
            for j, kv in enumerate(joining):
                row = len(keep) + j
                slot[row, :, :new_lengths[row]] = kv[tensor][0]
        self._lengths = new_lengths
        self.offsets = [self.offsets[r] for r in keep] + offsets
        return list(range(len(keep), len(new_lengths)))

    def row_kv(self, row: int) -> list[np.ndarray]:
        """A copy of one row's KV, ``2 * layers`` arrays [1, heads, n, dim]."""
        n = self._lengths[row]
        return [slot[row:row + 1, :, :n].copy() for slot in self._slots(self.max_batch)]

    def _slots(self, rows: int) -> list[np.ndarray]:
        h, d = self.layout.kv_heads, self.layout.head_dim
        return [flat[:rows * h * self.max_len * d].reshape(rows, h, self.max_len, d) for flat in self._flat]
