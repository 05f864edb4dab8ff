"""A vision-language model with a ``[cloud]`` peer: routed before its images are decoded.

On a phone an agent step's image work (decode, preprocess, vision encoder) is most of its time, so the
router decides from an estimate made from the images' headers, the processor's budget, the prefix
cache and the image work measured on earlier requests; a request sent to the cloud never pays that
work here. The oracles: the prepared prompt (the estimate's token counts), the prefix cache's own
match on the next request, the model's image-work counters (``vision_stats``: nothing encoded here
for a request the cloud answered) and the VLM's embedded API for the answers (the peer is a second
edge-runtime process serving the same weights).
"""

from __future__ import annotations

import base64
import io
import shutil
import socket
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from cloud_peer import ServerProcess
from generation_fixtures import base_url, served_repository, start_vlm_peer

TOKEN = "vlm-route-token"


def _url(seed: int, width: int = 140, height: int = 308) -> str:  # a small phone-shaped screenshot
    from PIL import Image

    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _rotated_jpeg_url() -> str:
    """A 308x140 JPEG whose EXIF orientation (6: rotate 90°) makes it a 140x308 screenshot."""
    from PIL import Image

    buffer = io.BytesIO()
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(np.random.default_rng(9).integers(0, 256, (140, 308, 3), dtype=np.uint8)).save(
        buffer, "JPEG", exif=exif)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()


SYSTEM = "You are a phone agent. Look at the screen and answer with the next action. " * 8


def _step(url: str, text: str = "Open the settings.") -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": [{"type": "text", "text": text},
                                         {"type": "image_url", "image_url": {"url": url}}]}]


@pytest.fixture(scope="module")
def qwen_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edge_runtime.vlm_zoo import write_vlm_folder

    return write_vlm_folder(tmp_path_factory.mktemp("vlm"), "qwen2_vl", seed=4)


@pytest.mark.parametrize("family", ["qwen2_vl", "smolvlm"])
def test_the_estimate_counts_the_prepared_prompt_and_learns_the_image_work(
        family: str, qwen_vlm: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.vlm_zoo import write_vlm_folder

    folder = qwen_vlm if family == "qwen2_vl" else write_vlm_folder(tmp_path_factory.mktemp("vlm"), family, seed=4)
    model = GenerativeModel("agent", folder, threads=1)
    try:
        first = _step(_url(1))
        estimate = model.estimate(messages=first)
        assert estimate is not None and estimate.image_ms is None  # no image work measured yet
        prepared = model.prepare(messages=first)
        assert estimate.prompt_tokens == len(prepared.ids)  # tiles and their row/column markers included
        assert prepared.image_timings.image_tokens > 0
        learnt = model.estimate(messages=_step(_url(2)))
        assert learnt is not None and learnt.image_ms is not None and learnt.image_ms > 0
        again = model.estimate(messages=first)  # the same data URL: its features are cached, nothing to do
        assert again is not None and again.image_ms == 0.0 and again.prompt_tokens == estimate.prompt_tokens
        model.generate(messages=first, max_tokens=2)
        second = _step(_url(3), "Now open Wi-Fi.")
        cached = model.estimate(messages=second).cached_tokens
        assert 0 < cached < len(model.prepare(messages=[second[0]]).ids) + 8  # the system prompt, not the image
        assert cached == model.generate(messages=second, max_tokens=2).usage.cached_tokens  # the cache's own match
        turned = _step(_rotated_jpeg_url())  # decoding turns it: a tiled one's rows become columns
        assert model.estimate(messages=turned).prompt_tokens == len(model.prepare(messages=turned).ids)
        # No estimate where a size is not known without fetching: the route then waits for prepare.
        assert model.estimate(messages=_step("https://example.invalid/shot.png")) is None
        assert model.estimate(messages=[{"role": "user", "content": "no image"}]) is None
    finally:
        model.close()


@pytest.fixture(scope="module")
def vlm_peer(tmp_path_factory: pytest.TempPathFactory, qwen_vlm: Path) -> Iterator[ServerProcess]:
    server = start_vlm_peer(tmp_path_factory, qwen_vlm, TOKEN)
    yield server
    server.stop()


def _edge(tmp_path_factory: pytest.TempPathFactory, folder: Path, url: str, cloud_table: str) -> Any:
    from edge_runtime.cloud.config import CloudConfig

    root = tmp_path_factory.mktemp("edge-vlm-repository")
    shutil.copytree(folder, root / "agent" / "1")
    (root / "agent" / "config.toml").write_text(
        f'[vision]\nplan = "cpu"\n[cloud]\nremote_model = "agent"\n{cloud_table}')
    cloud = CloudConfig(url=url, token=TOKEN, timeout_ms=120000, breaker_failures=5)
    return served_repository(root, tmp_path_factory.mktemp("cache"), cloud=cloud)


def _served(live: Any) -> Any:
    from edge_runtime.server.state import STATE

    return live.app[STATE].repository.get("agent")


def _chat(live: Any, messages: list[dict[str, Any]], stream: bool = True) -> str:
    import openai

    client = openai.OpenAI(base_url=base_url(live) + "/v1", api_key=TOKEN, max_retries=0, timeout=120)
    if not stream:
        return client.chat.completions.create(model="agent", messages=messages, max_tokens=8,
                                              temperature=0).choices[0].message.content
    chunks = client.chat.completions.create(model="agent", messages=messages, max_tokens=8, temperature=0,
                                            stream=True)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_mode_always_sends_a_screenshot_without_encoding_it_here(
        vlm_peer: ServerProcess, qwen_vlm: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    import openai

    with _edge(tmp_path_factory, qwen_vlm, vlm_peer.url, 'mode = "always"\n') as live:
        model = _served(live).model
        messages = _step(_url(11))
        assert _chat(live, messages) == model.generate(messages=messages, max_tokens=8).text  # the peer's answer
        assert model.vision_stats.images == 1  # that oracle call only: the request encoded nothing here
        assert _chat(live, _step(_url(12)), stream=False) == model.generate(messages=_step(_url(12)),
                                                                               max_tokens=8).text
        assert model.vision_stats.images == 2
        # A screenshot cut short after its header: estimated, so sent on; the peer refuses it, and the
        # local attempt names the part as the no-cloud path does (a 400, nothing else disturbed).
        png = base64.b64decode(_url(14).split(",", 1)[1])
        cut = _step("data:image/png;base64," + base64.b64encode(png[:len(png) // 2]).decode())
        assert model.estimate(messages=cut) is not None
        for _ in range(6):  # more than breaker_failures: a request's own fault must not open the breaker
            with pytest.raises(openai.BadRequestError) as caught:
                _chat(live, cut)
            assert "messages[1].content[1].image_url" in caught.value.body["message"]
            assert "truncated" in caught.value.body["message"]
        counted = model.vision_stats.images
        again = _step(_url(15))
        assert _chat(live, again) == model.generate(messages=again, max_tokens=8).text
        assert model.vision_stats.images == counted + 1  # the oracle's only: the peer still answered the step
    # The peer down before the first token: the request is prepared and answered here after all.
    with _edge(tmp_path_factory, qwen_vlm, f"http://127.0.0.1:{_closed_port()}", 'mode = "always"\n') as live:
        model = _served(live).model
        messages = _step(_url(13))
        assert _chat(live, messages) == model.generate(messages=messages, max_tokens=8).text
        assert model.vision_stats.images == 2  # the local answer's images, then the oracle's


def test_fallback_learns_the_image_work_here_and_then_sends_steps_over_target_to_the_cloud(
        vlm_peer: ServerProcess, qwen_vlm: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Real calibration: the local rates and image work are measured on this machine by the first step
    (nothing is pinned); with a target no step can meet here, the next ones go to the peer unencoded."""
    with _edge(tmp_path_factory, qwen_vlm, vlm_peer.url, 'mode = "fallback"\nlatency_target_ms = 1\n') as live:
        served = _served(live)
        model, router = served.model, served.dispatcher.router
        first = _step(_url(21))
        assert _chat(live, first) == model.generate(messages=first, max_tokens=8).text
        assert model.vision_stats.images == 2  # nothing measured before it: the first step ran here
        second = _step(_url(22), "Now open Wi-Fi.")
        estimate = model.estimate(messages=second)
        assert estimate.image_ms > 0 and estimate.cached_tokens > 0
        where, why = router.route_estimate(estimate, _sampling(8))
        assert where == "cloud" and "> target" in why
        assert _chat(live, second) == model.generate(messages=second, max_tokens=8).text
        assert model.vision_stats.images == 3  # the oracle's: the step itself went to the cloud unencoded


def _sampling(max_tokens: int) -> Any:
    from edge_runtime.generation.sampling import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0)


def test_a_cheaper_cloud_wins_only_while_the_image_work_here_costs_more(qwen_vlm: Path) -> None:
    """The decision's arithmetic with a pinned peer speed: a request goes to a peer that is slower than
    this machine's prefill and decode but faster than those plus its image work, and the same request
    stays here when its image is in the feature cache (no image work left)."""
    from edge_runtime.cloud.breaker import CircuitBreaker
    from edge_runtime.cloud.config import CloudConfig, CloudModelConfig
    from edge_runtime.generation.cloud_router import GenerationRouter
    from edge_runtime.generation.model import GenerativeModel

    model = GenerativeModel("agent", qwen_vlm, threads=1)
    try:
        model.generate(messages=_step(_url(31)), max_tokens=4)  # measures prefill, decode and image work here
        router = GenerationRouter(model, CloudModelConfig(mode="fallback", remote_model="agent"),
                                  CloudConfig(url="http://127.0.0.1:1", token=TOKEN), CircuitBreaker())
        params = _sampling(4)
        fresh, cached = model.estimate(messages=_step(_url(32))), model.estimate(messages=_step(_url(31)))
        assert fresh.prompt_tokens == cached.prompt_tokens and fresh.cached_tokens == cached.cached_tokens
        text_only = router.local_estimate_ms(fresh.prompt_tokens, 4, fresh.cached_tokens)
        assert fresh.image_ms > 0 and cached.image_ms == 0.0  # the same data URL: its features are cached
        # A peer slower than this machine's prefill and decode, faster than those plus the image work:
        router.client.first_token_ms, router.client.tokens_per_s = text_only + fresh.image_ms / 2, 1e9
        assert router.route_estimate(fresh, params)[0] == "cloud"
        assert router.route_estimate(cached, params)[0] == "local"
    finally:
        model.close()
