"""M-RoPE positions and the image-feature splice, against transformers' own code as the oracle."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from edge_runtime.errors import InvalidInputError
from edge_runtime.generation.vision.positions import mrope_positions, text_positions
from edge_runtime.generation.vision.splice import splice_image_features

IMAGE, START, END, VIDEO = 151, 150, 152, 153
MERGE = 2


def _layout(rng: np.random.Generator, images: int) -> tuple[list[int], list[tuple[int, int, int]]]:
    tokens = list(rng.integers(0, 100, rng.integers(0, 6)))
    grids = []
    for _ in range(images):
        grid = (int(rng.integers(1, 3)), 2 * int(rng.integers(1, 5)), 2 * int(rng.integers(1, 5)))
        grids.append(grid)
        count = grid[0] * grid[1] * grid[2] // MERGE ** 2
        tokens += [START] + [IMAGE] * count + [END] + list(rng.integers(0, 100, rng.integers(0, 6)))
    return tokens, grids


def _transformers(tokens: list[int], grids: list[tuple[int, int, int]]) -> tuple[np.ndarray, int]:
    import torch
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

    config = SimpleNamespace(vision_config=SimpleNamespace(spatial_merge_size=MERGE), image_token_id=IMAGE,
                             video_token_id=VIDEO, vision_start_token_id=START)
    positions, deltas = Qwen2VLModel.get_rope_index(
        SimpleNamespace(config=config), torch.tensor([tokens]),
        torch.tensor(grids) if grids else None, None, torch.ones(1, len(tokens), dtype=torch.long))
    return positions[:, 0].numpy(), int(deltas.reshape(-1)[0])


@pytest.mark.parametrize("seed", range(12))
def test_mrope_positions_equal_transformers_get_rope_index(seed: int) -> None:
    rng = np.random.default_rng(seed)
    tokens, grids = _layout(rng, seed % 4)
    tokens = tokens or [7]
    ours, delta = mrope_positions(tokens, grids, image_token_id=IMAGE, vision_start_token_id=START,
                                  spatial_merge_size=MERGE)
    expected, expected_delta = _transformers(tokens, grids)
    np.testing.assert_array_equal(ours, expected)
    assert delta == expected_delta


def test_decode_positions_continue_as_transformers_does() -> None:
    """transformers decodes the token at cache index ``past`` at position ``past + rope_delta``: the
    positions of the prompt extended by a text token equal that (the no-cache recompute)."""
    tokens, grids = _layout(np.random.default_rng(5), 2)
    positions, delta = mrope_positions(tokens, grids, image_token_id=IMAGE, vision_start_token_id=START,
                                       spatial_merge_size=MERGE)
    longer, _ = mrope_positions(tokens + [9, 9], grids, image_token_id=IMAGE, vision_start_token_id=START,
                                spatial_merge_size=MERGE)
    np.testing.assert_array_equal(longer[:, :len(tokens)], positions)
    np.testing.assert_array_equal(longer[:, len(tokens):], text_positions(len(tokens) + delta, 2))
    assert delta < 0  # images advance positions by their grid side, not their token count


def test_mrope_positions_refuse_grids_that_do_not_match_the_images() -> None:
    tokens, grids = _layout(np.random.default_rng(1), 2)
    kwargs = dict(image_token_id=IMAGE, vision_start_token_id=START, spatial_merge_size=MERGE)
    with pytest.raises(InvalidInputError, match="2 image.*1 image grid"):
        mrope_positions(tokens, grids[:1], **kwargs)
    big = [(grids[0][0], grids[0][1] * 4, grids[0][2] * 4)] + grids[1:]
    with pytest.raises(InvalidInputError, match="image"):
        mrope_positions(tokens, big, **kwargs)


def test_splice_overwrites_image_rows_in_order() -> None:
    rng = np.random.default_rng(0)
    tokens = [1, START, IMAGE, IMAGE, END, 2, START, IMAGE, END]
    embeds = rng.standard_normal((len(tokens), 4)).astype(np.float32)
    features = rng.standard_normal((3, 4)).astype(np.float64)
    before = embeds.copy()
    spliced = splice_image_features(tokens, embeds, features, image_token_id=IMAGE)
    expected = embeds.copy()
    expected[[2, 3, 7]] = features  # the oracle: row by row, in order
    np.testing.assert_array_equal(spliced, expected.astype(np.float32))
    assert spliced.dtype == np.float32
    np.testing.assert_array_equal(embeds, before)  # the input is not modified


def test_splice_count_mismatch_names_both_counts() -> None:
    tokens = [1, IMAGE, IMAGE, 2]
    embeds = np.zeros((4, 4), np.float32)
    with pytest.raises(InvalidInputError, match="2 image tokens.*3 feature rows"):
        splice_image_features(tokens, embeds, np.zeros((3, 4), np.float32), image_token_id=IMAGE)
    with pytest.raises(InvalidInputError, match="hidden size"):
        splice_image_features(tokens, embeds, np.zeros((2, 5), np.float32), image_token_id=IMAGE)
