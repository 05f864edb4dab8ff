"""Put image features into a prompt's token embeddings (the host-side merge of the transformers.js layout).

The prompt holds one ``image_token_id`` per image feature row; the rows of
``inputs_embeds`` at those positions are overwritten, in order, by the rows of
the images' ``image_features`` (transformers' ``masked_scatter``, transformers.js'
``default_merge_input_ids_with_features``). Every other row keeps its token
embedding.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from edge_runtime.errors import InvalidInputError


def splice_image_features(tokens: Sequence[int], embeds: np.ndarray, features: np.ndarray, *,
                          image_token_id: int) -> np.ndarray:
    """``embeds`` [n, hidden] with the rows at ``image_token_id`` replaced by ``features`` [m, hidden].

    Returns a new array in ``embeds``' dtype (``features`` is cast to it). Raises
    InvalidInputError naming both counts when the prompt has a different number of image
    tokens than there are feature rows, or when the shapes do not line up.
    """
    ids = np.asarray(tokens, dtype=np.int64)
    if embeds.ndim != 2 or embeds.shape[0] != ids.shape[0]:
        raise InvalidInputError(f"token embeddings must be [{ids.shape[0]}, hidden] for {ids.shape[0]} tokens, "
                                f"got {list(embeds.shape)}")
    if features.ndim != 2 or features.shape[1] != embeds.shape[1]:
        raise InvalidInputError(f"image features must be [rows, {embeds.shape[1]}] (the text hidden size), "
                                f"got {list(features.shape)}")
    where = np.flatnonzero(ids == image_token_id)
    if where.size != features.shape[0]:
        raise InvalidInputError(f"the prompt has {where.size} image tokens (id {image_token_id}) but the images "
                                f"gave {features.shape[0]} feature rows")
    spliced = embeds.copy()
    spliced[where] = features.astype(embeds.dtype, copy=False)
    return spliced
