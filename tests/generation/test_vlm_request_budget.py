"""A request's own image budget on a tiny random-weight VLM: vLLM's ``mm_processor_kwargs`` and
qwen-vl-utils' per-image ``min_pixels`` / ``max_pixels``.

Oracle: the same folder loaded with that budget in ``[vision]`` (whose preprocessing
``test_vision_preprocess`` holds against transformers, and whose generation the engine tests hold
against a no-cache recompute): a request under budget B answers as the model configured with B,
token for token, with the same prompt tokens. Caches keep the two budgets' images apart.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edge_runtime.errors import InvalidInputError


@pytest.fixture(scope="module", params=["qwen2_vl", "smolvlm"])
def vlm_folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edge_runtime.vlm_zoo import write_vlm_folder

    return write_vlm_folder(tmp_path_factory.mktemp(request.param), request.param, seed=1)


@pytest.fixture(scope="module")
def models(vlm_folder: Path):
    """(model with the folder's own budget, model loaded with BUDGET in [vision], the request's kwargs)."""
    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.settings import GenerationSettings
    from edge_runtime.generation.vision.preprocess import VisionBudget
    from edge_runtime.generation.vision.settings import VisionSettings

    small = "smolvlm" in str(vlm_folder)
    budget, kwargs = ((VisionBudget(longest_edge=32, split_image=False),
                       {"size": {"longest_edge": 32}, "do_image_splitting": False}) if small
                      else (VisionBudget(max_pixels=28 * 28 * 8), {"max_pixels": 28 * 28 * 8}))
    settings = GenerationSettings(max_seq_len=2048)
    default = GenerativeModel("agent", vlm_folder, settings, threads=1, vision=VisionSettings())
    configured = GenerativeModel("agent", vlm_folder, settings, threads=1, vision=VisionSettings(budget=budget))
    yield default, configured, kwargs
    default.close()
    configured.close()


def _screen(seed: int, size: tuple[int, int] = (224, 448)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def _messages(image, **part_keys) -> list[dict]:
    return [{"role": "system", "content": "You are a phone agent."},
            {"role": "user", "content": [{"type": "image", "image": image, **part_keys},
                                         {"type": "text", "text": "What should I tap?"}]}]


def test_a_request_budget_answers_as_the_model_configured_with_it(models) -> None:
    default, configured, kwargs = models
    image = _screen(1)
    expected = configured.generate(messages=_messages(image), max_tokens=8)
    got = default.generate(messages=_messages(image), max_tokens=8, mm_processor_kwargs=kwargs)
    assert got.token_ids == expected.token_ids
    assert got.usage.prompt_tokens == expected.usage.prompt_tokens
    own = default.generate(messages=_messages(image), max_tokens=8)
    assert own.usage.prompt_tokens > got.usage.prompt_tokens  # the request asked for fewer image tokens
    # the count without encoding (the tokenize route's) follows the request's budget too
    counted = default.tokenize(messages=_messages(image), chat=_chat(kwargs))
    assert len(counted) == got.usage.prompt_tokens


def test_per_image_keys_win_over_the_request_and_the_model(models) -> None:
    default, configured, kwargs = models
    if "max_pixels" not in kwargs:
        with pytest.raises(InvalidInputError, match=r"^messages\[1\].content\[0\]: unknown image processor argument"
                                                    r"\(s\) \['max_pixels'\] for smolvlm"):
            default.generate(messages=_messages(_screen(2), max_pixels=4000), max_tokens=2)
        return
    image = _screen(2)
    expected = configured.generate(messages=_messages(image), max_tokens=8)
    # qwen-vl-utils' per-image key, over a request that asked for more
    got = default.generate(messages=_messages(image, max_pixels=kwargs["max_pixels"]), max_tokens=8,
                           mm_processor_kwargs={"max_pixels": 28 * 28 * 40})
    assert got.token_ids == expected.token_ids and got.usage.prompt_tokens == expected.usage.prompt_tokens


def test_two_budgets_of_one_screenshot_share_no_features_and_no_image_kv(models) -> None:
    default, _, kwargs = models
    image = _screen(3)
    features = default.prompter.features
    before = features.stats()
    first = default.prepare(messages=_messages(image))
    default.generate(messages=_messages(image), max_tokens=2)
    budgeted = default.prepare(messages=_messages(image), chat=_chat(kwargs))
    assert features.stats().misses - before.misses == 2  # encoded once per budget
    assert len(budgeted.ids) < len(first.ids)
    text_before = first.ids.index(default.prompter.vlm.image_token_id)
    assert default.cached_tokens(budgeted) <= text_before + 1  # no KV of the other budget's image tokens
    again = default.prepare(messages=_messages(image), chat=_chat(kwargs))
    assert features.stats().misses - before.misses == 2 and again.cache_key == budgeted.cache_key


def test_bad_request_budgets_are_400s_naming_the_argument(models) -> None:
    default, _, kwargs = models
    image = _screen(4)
    with pytest.raises(InvalidInputError, match=r"^mm_processor_kwargs: unknown image processor argument\(s\) "
                                                r"\['colour'\]"):
        default.generate(messages=_messages(image), max_tokens=2, mm_processor_kwargs={"colour": 1})
    key = next(iter(k for k in kwargs if k != "size"), "size")
    with pytest.raises(InvalidInputError, match=r"^mm_processor_kwargs"):
        default.generate(messages=_messages(image), max_tokens=2, mm_processor_kwargs={key: -1})
    with pytest.raises(InvalidInputError, match=r"^'mm_processor_kwargs' must be an object"):
        default.generate(messages=_messages(image), max_tokens=2, mm_processor_kwargs=[1])
    # the model's [vision] budget caps a request's: a shared daemon's operator keeps the steps' cost bounded
    more = {"max_pixels": 10**8} if "max_pixels" in kwargs else {"size": {"longest_edge": 4096}}
    with pytest.raises(InvalidInputError, match=r"^mm_processor_kwargs: \w+ \d+ is over this model's image budget"):
        default.generate(messages=_messages(image), max_tokens=2, mm_processor_kwargs=more)
    assert default.generate(messages=_messages(image), max_tokens=2).usage.completion_tokens == 2


@pytest.fixture(scope="module")
def roomy_qwen(tmp_path_factory: pytest.TempPathFactory):
    """A Qwen2-VL whose own budget allows far more image tokens than its context."""
    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.settings import GenerationSettings
    from edge_runtime.generation.vision.preprocess import VisionBudget
    from edge_runtime.generation.vision.settings import VisionSettings
    from edge_runtime.vlm_zoo import write_vlm_folder

    folder = write_vlm_folder(tmp_path_factory.mktemp("roomy"), "qwen2_vl", seed=1)
    model = GenerativeModel("agent", folder, GenerationSettings(max_seq_len=2048), threads=1,
                            vision=VisionSettings(budget=VisionBudget(max_pixels=10**8)))
    yield model
    model.close()


def test_an_image_over_the_context_is_refused_before_it_is_encoded(roomy_qwen) -> None:
    """A request for more image tokens than the context is a 400 before any resizing or encoding, and
    /tokenize never writes out its prompt text; the model then answers as before."""
    huge = {"min_pixels": 10**7}
    entries = roomy_qwen.prompter.features.stats().entries
    with pytest.raises(InvalidInputError, match=r"^messages\[1\].content\[0\].image: a 224x448 image is \d+ image "
                                                r"tokens under its image budget, more than the model's context of "
                                                r"\d+ tokens"):
        roomy_qwen.generate(messages=_messages(_screen(5)), max_tokens=2, mm_processor_kwargs=huge)
    with pytest.raises(InvalidInputError, match=r"more than the model's context"):
        roomy_qwen.tokenize(messages=_messages(_screen(5)), chat=_chat(huge))
    assert roomy_qwen.prompter.features.stats().entries == entries  # nothing was encoded
    assert roomy_qwen.generate(messages=_messages(_screen(5)), max_tokens=2).usage.completion_tokens == 2


def _chat(kwargs):
    from edge_runtime.generation.chat import ChatOptions

    return ChatOptions(processor_kwargs=kwargs)


def test_the_generate_command_takes_a_budget(models, tmp_path: Path) -> None:
    """``edge-runtime generate --mm-processor-kwargs`` as a process: the embedded API's answer under the
    same arguments; a malformed value is a usage error."""
    import json
    import os
    import subprocess
    import sys

    default, _, kwargs = models
    image = tmp_path / "screen.png"
    _screen(6).save(image)
    expected = default.generate(prompt="Describe:", images=[image], max_tokens=6, mm_processor_kwargs=kwargs)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "EDGE_RUNTIME_CACHE": str(tmp_path), "PYTHONPATH": str(root), "EDGE_RUNTIME_THREADS": "1"}
    command = [sys.executable, "-m", "edge_runtime", "generate", str(default.path), "--prompt", "Describe:",
               "--image", str(image), "--max-tokens", "6", "--json"]
    run = subprocess.run([*command, "--mm-processor-kwargs", json.dumps(kwargs)], capture_output=True, text=True,
                         env=env, timeout=240)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["token_ids"] == list(expected.token_ids)
    assert report["usage"]["prompt_tokens"] == expected.usage.prompt_tokens
    bad = subprocess.run([*command, "--mm-processor-kwargs", "[1]"], capture_output=True, text=True, env=env,
                         timeout=240)
    assert bad.returncode == 2 and "expected a JSON object" in bad.stderr
