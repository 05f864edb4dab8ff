"""The running batch's KV cache in preallocated buffers, bound to ONNX Runtime as OrtValues.

An ``optimum`` decoder concatenates ``past`` and the new key/value into
``present`` inside the graph, so ``present`` cannot alias ``past``. Each layer's
key and value therefore get two flat buffers allocated once (capacity
``max_batch * max_len`` positions): one step reads ``past`` from one as a
``[B, heads, L, dim]`` view and writes ``present`` into the other as
``[B, heads, L + 1, dim]``, then the two swap. Nothing is allocated per token
and the cache never passes through a numpy copy between steps.

Rows hold sequences of different lengths right-aligned: row ``i`` has
``pads[i]`` leading zero positions that the attention mask hides, so every
row appends its next token at the same column ``L``. The layout is rebuilt
(one copy) only when sequences join or leave.

Each row also carries a position offset (0 for text; a Qwen2-VL sequence's
M-RoPE ``rope_delta``): the next token of a row with ``n`` cached positions
sits at position ``n + offset``.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from edge_runtime.generation.folder import KVLayout

SIDES = 2  # each layer tensor has two buffers: one read as past, one written as present


def buffer_bytes(layout: KVLayout, max_batch: int, max_len: int) -> int:
    """What ``BatchKV(layout, max_batch, max_len)`` allocates, in bytes (before allocating it)."""
    return SIDES * max_batch * max_len * layout.bytes_per_token


class BatchKV:
    """KV of up to ``max_batch`` sequences, each at most ``max_len`` positions long."""

    def __init__(self, layout: KVLayout, max_batch: int, max_len: int) -> None:
        self.layout = layout
        self.max_batch = max_batch
        self.max_len = max_len
        size = max_batch * layout.kv_heads * max_len * layout.head_dim
        tensors = 2 * layout.layers
        self._flat = [[np.zeros(size, layout.dtype) for _ in range(tensors)] for _ in range(SIDES)]
        self._current = 0
        self.length = 0  # L: columns in use
        self.pads: list[int] = []  # leading pad positions per row
        self.offsets: list[int] = []  # position offset per row (see the module docstring)

    @property
    def rows(self) -> int:
        return len(self.pads)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for side in self._flat for a in side)

    def lengths(self) -> list[int]:
        """True length (tokens cached) of each row."""
        return [self.length - pad for pad in self.pads]

    def positions(self) -> list[int]:
        """Position of each row's next token: its length plus its offset."""
        return [self.length - pad + offset for pad, offset in zip(self.pads, self.offsets)]

    def _views(self, side: int, rows: int, length: int) -> list[np.ndarray]:
        h, d = self.layout.kv_heads, self.layout.head_dim
        count = rows * h * length * d
        return [flat[:count].reshape(rows, h, length, d) for flat in self._flat[side]]

    def past(self) -> list[np.ndarray]:
        return self._views(self._current, self.rows, self.length)

    def present(self) -> list[np.ndarray]:
        """Views the next step writes into: one column longer."""
        return self._views(1 - self._current, self.rows, self.length + 1)

    def bindings(self) -> tuple[list[Any], list[Any]]:
        """(past OrtValues, present OrtValues) over the buffers, in layer/key/value order."""
        from onnxruntime import OrtValue

        return ([OrtValue.ortvalue_from_numpy(v) for v in self.past()],
                [OrtValue.ortvalue_from_numpy(v) for v in self.present()])

    def advance(self) -> None:
        """After a step wrote ``present``: it becomes the past."""
        self._current = 1 - self._current
        self.length += 1

    def attention_mask(self) -> np.ndarray:
        """[B, L + 1]: zeros over each row's pads, ones over its tokens and the new one."""
        mask = np.ones((self.rows, self.length + 1), np.int64)
        for row, pad in enumerate(self.pads):
            mask[row, :pad] = 0
        return mask

    def can_grow(self) -> bool:
        return self.length + 1 <= self.max_len

    def rebuild(self, keep: Sequence[int], joining: Sequence[list[np.ndarray]],
                offsets: Sequence[int] | None = None) -> list[int]:
        """New layout: rows ``keep`` (old indices, in order) then one row per ``joining`` sequence.

        ``joining[j]`` is a sequence's KV, ``2 * layers`` arrays [1, heads, n_j, dim], and
        ``offsets[j]`` its position offset (default 0). Leading columns padded in every row are
        dropped. Returns the new row index of each joining one.
        """
        offsets = list(offsets) if offsets is not None else [0] * len(joining)
        assert len(offsets) == len(joining), "one offset per joining sequence"
        old_lengths = [self.length - self.pads[r] for r in keep]
        new_lengths = old_lengths + [int(kv[0].shape[2]) for kv in joining]
        if len(new_lengths) > self.max_batch:
            raise ValueError(f"batch of {len(new_lengths)} rows exceeds max_batch {self.max_batch}")
        length = max(new_lengths, default=0)
        if length > self.max_len:
            raise ValueError(f"a sequence of {length} positions exceeds the cache's {self.max_len}")
        old = self.past()
        side = 1 - self._current
        new = self._views(side, len(new_lengths), length)
        for tensor in range(len(new)):
            target = new[tensor]
            for row, (source_row, n) in enumerate(zip(keep, old_lengths)):
                target[row, :, :length - n] = 0
                target[row, :, length - n:] = old[tensor][source_row, :, self.length - n:]
            for j, kv in enumerate(joining):
                row = len(keep) + j
                n = new_lengths[row]
                target[row, :, :length - n] = 0
                target[row, :, length - n:] = kv[tensor][0]
        self._current = side
        self.length = length
        self.pads = [length - n for n in new_lengths]
        self.offsets = [self.offsets[r] for r in keep] + offsets
        return list(range(len(keep), len(new_lengths)))

    def row_kv(self, row: int) -> list[np.ndarray]:
        """A copy of one row's KV without pads, ``2 * layers`` arrays [1, heads, n, dim]."""
        pad = self.pads[row]
        return [v[row:row + 1, :, pad:].copy() for v in self.past()]
