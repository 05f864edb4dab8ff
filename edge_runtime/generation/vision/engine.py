"""``EmbeddingDecoderEngine``: a VLM's decoder, fed input embeddings instead of token ids.

A prompt with images arrives as an ``EmbeddedPrompt``: its token embeddings
with the image features spliced in, computed once before the sequence is
queued, plus its position ids. Each prefill chunk feeds its slice of them. A
prompt without one (text only, or the load-time warm-up) is embedded chunk by
chunk. Decode embeds each row's new token (``TokenEmbedder``) and places it at
the row's length plus its offset (``BatchKV.positions``: the M-RoPE
``rope_delta``), repeated on the three M-RoPE rows when the decoder takes
``position_ids`` [3, batch, seq].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from edge_runtime.generation.engine import DecoderEngine
from edge_runtime.generation.vision.embeddings import TokenEmbedder
from edge_runtime.generation.vision.folder import VLMFolder


@dataclass(frozen=True)
class EmbeddedPrompt:
    """A prompt's decoder inputs, computed before it is queued (on the caller's thread)."""

    embeds: np.ndarray  # [n, hidden], image features spliced in
    positions: np.ndarray | None  # [3, n] M-RoPE position ids; None: 0 .. n - 1
    rope_delta: int = 0  # decode positions are cache index + rope_delta


class EmbeddingDecoderEngine(DecoderEngine):
    """A ``DecoderEngine`` over ``vlm.decoder`` whose token input is ``inputs_embeds``."""

    def __init__(self, vlm: VLMFolder, embedder: TokenEmbedder, *, threads: int, max_batch: int,
                 max_len: int, flush_denormals: bool = False) -> None:
        super().__init__(vlm.decoder, threads=threads, max_batch=max_batch, max_len=max_len,
                         flush_denormals=flush_denormals)
        self.vlm = vlm
        self.embedder = embedder

    def _positions(self, positions: np.ndarray) -> np.ndarray:
        """[3, rows, seq] for an M-RoPE decoder, [rows, seq] otherwise, from [rows, seq]."""
        return np.broadcast_to(positions, (3, *positions.shape)).copy() if self.vlm.mrope else positions

    def _chunk_inputs(self, tokens: Sequence[int], start: int, prompt: Any) -> dict[str, np.ndarray]:
        n = len(tokens)
        if prompt is None:
            embeds = self.embedder.embed(tokens)
            positions = self._positions(np.arange(start, start + n, dtype=np.int64).reshape(1, n))
        else:
            assert isinstance(prompt, EmbeddedPrompt) and start + n <= prompt.embeds.shape[0]
            embeds = prompt.embeds[start:start + n]
            if prompt.positions is None:
                positions = self._positions(np.arange(start, start + n, dtype=np.int64).reshape(1, n))
            else:
                positions = np.ascontiguousarray(prompt.positions[:, None, start:start + n])
        return {"inputs_embeds": np.ascontiguousarray(embeds).reshape(1, n, -1), "position_ids": positions}

    def _step_inputs(self, tokens: Sequence[int]) -> dict[str, np.ndarray]:
        rows = len(tokens)
        positions = np.asarray(self.kv.positions(), np.int64).reshape(rows, 1)
        return {"inputs_embeds": self.embedder.embed(tokens).reshape(rows, 1, -1),
                "position_ids": self._positions(positions)}
