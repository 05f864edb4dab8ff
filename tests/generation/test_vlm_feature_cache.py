"""The image feature cache: an image sent again is not encoded again, and the answer does not change.

``ImageFeatureCache`` on its own (LRU under a byte budget), then on tiny random-weight folders
(``vlm_zoo.write_vlm_folder``; Qwen2-VL and SmolVLM, whose features come per tile): a chat that
resends its screenshot, and an agent that keeps its last two screenshots in the history (so the
text before them changes and the prefix cache cannot help). The oracles are the no-cache greedy
recompute (``vlm_oracle``) and the same requests with the cache off.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_runtime.errors import ConfigError
from vlm_oracle import Oracle

SYSTEM = "You are a phone agent. Answer with the next action: tap, swipe, type or done."


def _image(seed: int, width: int = 112, height: int = 84):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def _processed(tokens: int = 4):
    from edge_runtime.generation.vision.preprocess import ProcessedImage

    return ProcessedImage({"pixel_values": np.ones((8, 8), np.float32)}, tokens, (1, 2, 2), "<image>" * tokens)


def test_the_cache_keeps_the_most_recent_images_within_its_budget() -> None:
    from edge_runtime.generation.vision.feature_cache import ImageFeatureCache

    rows = lambda value: np.full((4, 16), value, np.float32)  # noqa: E731 - 256 bytes each
    cache = ImageFeatureCache(600)
    for key in (b"a", b"b"):
        assert cache.put(key, _processed(), rows(ord(key)))
    assert cache.get(b"a") is not None  # a is now the most recently used
    cache.put(b"c", _processed(), rows(3.0))  # 768 bytes > 600: the least recently used (b) goes
    assert cache.get(b"b") is None
    entry = cache.get(b"a")
    assert entry is not None and float(entry.features[0, 0]) == ord("a")
    assert entry.processed.feeds == {} and entry.processed.num_tokens == 4  # the feeds are not kept
    assert not entry.features.flags.writeable  # shared by later prompts: nobody may change it
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.evicted, stats.entries, stats.bytes) == (2, 1, 1, 2, 512)
    assert not cache.put(b"big", _processed(), np.zeros((100, 16), np.float32))  # alone over the budget
    assert cache.get(b"big") is None


def test_a_zero_budget_keeps_and_counts_nothing() -> None:
    from edge_runtime.generation.vision.feature_cache import ImageFeatureCache

    cache = ImageFeatureCache(0)
    assert not cache.put(b"a", _processed(), np.zeros((4, 16), np.float32))
    assert cache.get(b"a") is None
    assert cache.stats() == cache.stats().__class__(0, 0, 0, 0, 0, 0, 0)
    assert cache.source_key("data:image/png;base64,AAAA") is None  # off: not even hashed
    with pytest.raises(ValueError, match="budget_bytes must be >= 0"):
        ImageFeatureCache(-1)


@pytest.mark.parametrize("value", [-1, "64MiB", True, 1.5])
def test_the_budget_setting_is_checked(value) -> None:
    from edge_runtime.generation.vision.settings import vision_settings

    with pytest.raises(ConfigError, match="feature_cache_bytes"):
        vision_settings({"vision": {"feature_cache_bytes": value}}, "agent/config.toml")
    assert vision_settings({"vision": {"feature_cache_bytes": 0}}, "x").feature_cache_bytes == 0
    assert vision_settings({}, "x").feature_cache_bytes == 64 * 1024 * 1024


@pytest.fixture(scope="module", params=["qwen2_vl", "smolvlm"])
def vlm_folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edge_runtime.vlm_zoo import write_vlm_folder

    return write_vlm_folder(tmp_path_factory.mktemp(request.param), request.param, seed=1)


@pytest.fixture
def vlm_factory(vlm_folder: Path):
    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.settings import GenerationSettings
    from edge_runtime.generation.vision.settings import VisionSettings

    made = []

    def build(feature_cache_bytes: int = 64 * 1024 * 1024, **settings):
        settings.setdefault("max_seq_len", 2048)
        model = GenerativeModel(vlm_folder.name, vlm_folder, GenerationSettings(**settings), threads=1,
                                vision=VisionSettings(feature_cache_bytes=feature_cache_bytes))
        made.append(model)
        return model

    yield build
    for model in made:
        model.close()


def _turn(role: str, text: str, image=None) -> dict:
    if image is None:
        return {"role": role, "content": text}
    return {"role": role, "content": [{"type": "image", "image": image}, {"type": "text", "text": text}]}


def _encoded(model) -> int:
    return model.prompter.features.stats().misses


def _data_url(image, **save) -> str:
    import base64
    import io

    buffer = io.BytesIO()
    image.save(buffer, "PNG", **save)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _url_turn(text: str, url: str) -> dict:
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                        {"type": "text", "text": text}]}


def test_the_same_data_url_is_not_even_decoded_again(vlm_factory) -> None:
    model = vlm_factory(prefix_cache_bytes=0)
    plain = vlm_factory(prefix_cache_bytes=0, feature_cache_bytes=0)
    screen = _image(30)
    first = [_turn("system", SYSTEM), _url_turn("What should I tap?", _data_url(screen))]
    answer = model.generate(messages=first, max_tokens=4, ignore_eos=True)
    # The same screen saved again with other PNG settings: other bytes, the same pixels.
    second = [*first, _turn("assistant", answer.text),
              _url_turn("Did it work?", _data_url(screen, compress_level=1))]
    result = model.generate(messages=second, max_tokens=6, ignore_eos=True)
    stats = model.prompter.features.stats()
    # the resent URL found by its data, the re-saved PNG by its pixels
    assert (stats.misses, stats.hits, stats.source_hits) == (1, 2, 1)
    assert result.timings.image_decode_ms > 0  # the re-saved PNG was decoded
    assert list(result.token_ids) == list(plain.generate(messages=second, max_tokens=6, ignore_eos=True).token_ids)
    again = model.generate(messages=first, max_tokens=4, ignore_eos=True)
    assert model.prompter.features.stats().source_hits == 2 and again.token_ids == answer.token_ids


def test_a_data_key_of_an_evicted_image_finds_nothing() -> None:
    from edge_runtime.generation.vision.feature_cache import ImageFeatureCache

    cache = ImageFeatureCache(256)
    key = cache.source_key(b"png bytes")
    assert key == cache.source_key(bytearray(b"png bytes")) and key != cache.source_key(b"other bytes")
    assert cache.source_key("https://example.com/a.png") is None  # may change behind the same name
    cache.add_source(key, b"a")  # no entry a yet: nothing remembered
    cache.put(b"a", _processed(), np.zeros((4, 16), np.float32))
    assert cache.get_source(key) is None
    cache.add_source(key, b"a")
    assert cache.get_source(key).digest == b"a"
    cache.put(b"b", _processed(), np.zeros((4, 16), np.float32))  # evicts a
    assert cache.get_source(key) is None
    assert cache.stats().source_hits == 1


def test_a_chat_that_resends_its_screenshot_encodes_it_once(vlm_factory) -> None:
    # The prefix cache is off: only the feature cache can spare the first screenshot's encoder run.
    model = vlm_factory(prefix_cache_bytes=0)
    plain = vlm_factory(prefix_cache_bytes=0, feature_cache_bytes=0)
    oracle = Oracle(model)
    one, two = _image(1), _image(2, 56, 140)
    first = [_turn("system", SYSTEM), _turn("user", "What should I tap?", one)]
    answer = model.generate(messages=first, max_tokens=6, ignore_eos=True)
    second = [*first, _turn("assistant", answer.text), _turn("user", "And on this screen?", two)]
    result = model.generate(messages=second, max_tokens=8, ignore_eos=True)
    assert _encoded(model) == 2 and model.prompter.features.stats().hits == 1  # one, then two only
    assert result.timings.image_decode_ms > 0  # still decoded (the digest is of the pixels)
    assert list(result.token_ids) == list(plain.generate(messages=second, max_tokens=8, ignore_eos=True).token_ids)
    prepared = plain.prepare(messages=second)
    processed = [plain.prompter.processor.process(image) for image in (one, two)]
    assert list(result.token_ids) == oracle.greedy(prepared.ids, processed, 8)
    assert plain.prompter.features.stats().hits == 0  # off: nothing kept


def test_an_agent_keeping_two_screenshots_encodes_each_once(vlm_factory) -> None:
    # UI-TARS-style history: the oldest screenshot drops out of the window, so the prompt after the
    # system prompt changes at every step and the prefix cache holds only the system prompt.
    model = vlm_factory(prefix_block_tokens=4)
    plain = vlm_factory(prefix_cache_bytes=0, feature_cache_bytes=0)
    screens = [_image(10 + i) for i in range(4)]
    actions = ["tap(100, 200)", "swipe(up)", "type('hello')"]
    for step in range(1, 4):
        window = range(max(0, step - 1), step + 1)  # the last two screenshots
        messages = [_turn("system", SYSTEM)]
        for i in window:
            messages.append(_turn("user", f"Step {i}: what now?", screens[i]))
            if i < step:
                messages.append(_turn("assistant", actions[i]))
        result = model.generate(messages=messages, max_tokens=5, ignore_eos=True)
        expected = plain.generate(messages=messages, max_tokens=5, ignore_eos=True)
        assert list(result.token_ids) == list(expected.token_ids), step
    stats = model.prompter.features.stats()
    assert (stats.misses, stats.hits) == (4, 2)  # screens 0..3 encoded once each; 1 and 2 reused
    assert plain.prompter.features.stats().misses == 0


def test_a_small_budget_evicts_the_oldest_screenshot(vlm_factory) -> None:
    probe = vlm_factory(prefix_cache_bytes=0)
    probe.generate(prompt="Describe.", images=[_image(20)], max_tokens=1)
    one_image = probe.prompter.features.stats().bytes
    model = vlm_factory(prefix_cache_bytes=0, feature_cache_bytes=one_image)  # room for one screenshot
    for seed in (20, 21, 20):
        model.generate(prompt="Describe.", images=[_image(seed)], max_tokens=1)
    stats = model.prompter.features.stats()
    assert (stats.misses, stats.hits, stats.evicted, stats.entries) == (3, 0, 2, 1)
    model.generate(prompt="Again.", images=[_image(20)], max_tokens=1)
    assert model.prompter.features.stats().hits == 1


def test_the_cache_is_charged_to_the_memory_budget(vlm_folder: Path, vlm_factory) -> None:
    from edge_runtime.generation.footprint import loaded_footprint, planned_footprint
    from edge_runtime.generation.settings import GenerationSettings
    from edge_runtime.generation.vision.settings import VisionSettings

    settings = GenerationSettings(max_seq_len=2048)
    planned = planned_footprint(vlm_folder, settings, 1.0, VisionSettings(feature_cache_bytes=12345))
    assert planned.parts()["image_cache"] == 12345 and "image feature cache 12345" in planned.describe()
    loaded = loaded_footprint(vlm_factory(feature_cache_bytes=12345), 1.0)
    assert loaded.parts() == planned.parts()
