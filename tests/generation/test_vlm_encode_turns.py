"""Concurrent requests' screenshots take turns in the vision encoder, and get the features they would alone.

The oracle for the features is the same model preparing each request alone. The turn-taking is
observed, not timed: the encoder's runner is wrapped to count runs in flight, and the first run
waits (up to a bound) for a second one to join it — which it can only do if encodes overlap.
"""

from __future__ import annotations

import base64
import io
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest


def _step(seed: int) -> list[dict[str, Any]]:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (150, 70, 3), dtype=np.uint8)).save(buffer, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": "What should I tap?"}]}]


class _Overlap:
    """Wraps a runner: counts runs in flight; the first run waits up to ``window_s`` for another."""

    def __init__(self, runner: Any, window_s: float = 0.5) -> None:
        self.runner = runner
        self.window_s = window_s
        self.lock = threading.Lock()
        self.in_flight = self.most = 0
        self.joined = threading.Event()

    def run(self, feeds: Any) -> Any:
        with self.lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            first = self.in_flight == 1
            if not first:
                self.joined.set()
        try:
            if first:
                self.joined.wait(self.window_s)  # overlapping encodes would meet here
            return self.runner.run(feeds)
        finally:
            with self.lock:
                self.in_flight -= 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)


@pytest.mark.parametrize("family", ["qwen2_vl", "smolvlm"])
def test_concurrent_screenshots_are_encoded_one_at_a_time(family: str, tmp_path: Path) -> None:
    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.vision.settings import VisionSettings
    from edge_runtime.vlm_zoo import write_vlm_folder

    folder = write_vlm_folder(tmp_path, family, seed=2)
    alone = GenerativeModel("alone", folder, threads=1, vision=VisionSettings(feature_cache_bytes=0))
    model = GenerativeModel("agent", folder, threads=1, vision=VisionSettings(feature_cache_bytes=0))
    try:
        expected = [alone.prepare(messages=_step(seed)).inputs.embeds for seed in range(4)]
        watch = _Overlap(model.prompter.encoder.model)
        model.prompter.encoder.model = watch
        results: dict[int, Any] = {}
        threads = [threading.Thread(target=lambda s=seed: results.__setitem__(s, model.prepare(messages=_step(s))))
                   for seed in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert sorted(results) == [0, 1, 2, 3]
        assert watch.most == 1 and not watch.joined.is_set()
        for seed in range(4):
            np.testing.assert_array_equal(results[seed].inputs.embeds, expected[seed])
    finally:
        model.close()
        alone.close()

