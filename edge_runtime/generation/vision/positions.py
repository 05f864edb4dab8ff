"""M-RoPE position ids of Qwen2-VL / Qwen2.5-VL / GLM-4.1V prompts, and the offset carried into decode.

The decoder of these models rotates each query/key by three position ids
(temporal, height, width) instead of one. ``mrope_positions`` computes them as
transformers' ``Qwen2VLModel.get_rope_index`` does for one unpadded sequence
of text and images (no video):

* a text token gets ``t = h = w = i``, where ``i`` continues from the largest
  position so far plus one;
* the ``t * (h / merge) * (w / merge)`` image tokens of one image (found, in
  order, as the next run of ``image_token_id`` after the previous image) get
  their grid coordinates plus the offset where the image starts, so an image
  advances the positions by ``max(t, h / merge, w / merge)``, not by its token
  count;
* ``rope_delta = max(position) + 1 - len(tokens)``: during decode the token at
  cache index ``past_len`` has position ``past_len + rope_delta`` on all three
  rows.

GLM-4.1V's ``get_rope_index`` gives images the same positions (it finds each image as a run of
image tokens; its prompts open each run with ``image_start_token_id``, passed here as the start
token). Like transformers' Qwen2-VL, the image count is the number of ``vision_start_token_id``
tokens immediately followed by ``image_token_id``; images beyond the given
grids, or grids beyond the images, are an error here (transformers would index
out of range or silently ignore them). Pure numpy, no model needed.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from edge_runtime.errors import InvalidInputError


def text_positions(start: int, count: int, rows: int = 3) -> np.ndarray:
    """[rows, count] positions ``start .. start + count - 1`` on every row (text only, or decode)."""
    return np.broadcast_to(np.arange(start, start + count, dtype=np.int64), (rows, count)).copy()


def mrope_positions(tokens: Sequence[int], grids: Sequence[tuple[int, int, int]], *, image_token_id: int,
                    vision_start_token_id: int, spatial_merge_size: int) -> tuple[np.ndarray, int]:
    """(position ids [3, len(tokens)] int64, rope_delta) of one sequence.

    ``grids`` holds each image's (t, h, w) in vision patches (the preprocessor's ``grid_thw``),
    in prompt order. Raises InvalidInputError when the prompt's images and ``grids`` disagree.
    """
    ids = np.asarray(tokens, dtype=np.int64)
    n = int(ids.shape[0])
    starts = np.flatnonzero(ids[:-1] == vision_start_token_id) if n else np.zeros(0, np.int64)
    images = int(np.count_nonzero(ids[starts + 1] == image_token_id)) if starts.size else 0
    if images != len(grids):
        raise InvalidInputError(f"the prompt has {images} image(s) (<vision_start> then an image token) but "
                                f"{len(grids)} image grid(s) were given")
    if not grids:
        return text_positions(0, n), 0
    merge = spatial_merge_size
    parts: list[np.ndarray] = []
    next_position = 0  # the largest position so far + 1
    cursor = 0  # first token not placed yet
    image_at = np.flatnonzero(ids == image_token_id)
    for index, (t, h, w) in enumerate(grids):
        later = image_at[image_at >= cursor]
        if not later.size:
            raise InvalidInputError(f"image {index} has a grid but no image tokens left in the prompt")
        first = int(later[0])
        grid_t, grid_h, grid_w = int(t), int(h) // merge, int(w) // merge
        count = grid_t * grid_h * grid_w
        if first + count > n:
            raise InvalidInputError(f"image {index} needs {count} image tokens from position {first}, but the "
                                    f"prompt ends after {n - first}")
        parts.append(text_positions(next_position, first - cursor))
        offset = next_position + first - cursor
        cell = np.arange(count, dtype=np.int64)
        parts.append(np.stack([cell // (grid_h * grid_w), (cell // grid_w) % grid_h, cell % grid_w]) + offset)
        next_position = int(parts[-1].max()) + 1 if count else offset
        cursor = first + count
    parts.append(text_positions(next_position, n - cursor))
    positions = np.concatenate(parts, axis=1)
    return positions, int(positions.max()) + 1 - n
