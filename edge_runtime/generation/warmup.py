"""Warm-up of a generative model at load: one short prefill and a few decode steps before it is served.

The first prefill and the first decode step pay what later ones do not: ONNX
Runtime's arena allocations, first-touch page faults of the KV buffers, the IO
binding's first run. Warm-up pays them at load, through the real engine and
batch KV layout (``ContinuousBatcher.warm_up``), so the first request costs
what the tenth does. The model's ``[warmup]`` table (the same table as a tensor
model's; ``shapes`` is a tensor model's key and is refused here)::

    [warmup]
    enabled = true        # default
    runs = 1              # warm-up sequences run
    prompt_tokens = 16    # prompt length (capped to fit the context); prefilled in prefill_chunk_tokens chunks
    decode_steps = 2      # decode steps after the prefill

Unlike a tensor model's seeded random inputs, these inputs are valid by
construction (token ids inside the vocabulary), so a warm-up that fails means
the model cannot generate: the load fails (ModelLoadError). onnxruntime-genai
folders are not warmed up (genai owns its session); their report says so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from edge_runtime.config import from_mapping
from edge_runtime.errors import ConfigError, ModelLoadError

if TYPE_CHECKING:
    from edge_runtime.generation.model import GenerativeModel

log = logging.getLogger(__name__)
PLAN = "generate"  # the generative version's plan name (GenerationDispatcher.plans)


@dataclass(frozen=True)
class GenerationWarmupConfig:
    enabled: bool = True
    runs: int = 1
    prompt_tokens: int = 16
    decode_steps: int = 2

    def __post_init__(self) -> None:
        for key in ("runs", "prompt_tokens"):
            if getattr(self, key) < 1:
                raise ConfigError(f"[warmup] {key} must be >= 1, got {getattr(self, key)}")
        if self.decode_steps < 0:
            raise ConfigError(f"[warmup] decode_steps must be >= 0, got {self.decode_steps}")


def generation_warmup_config(table: Mapping[str, Any] | None, where: str) -> GenerationWarmupConfig:
    """A generative model's ``[warmup]`` table; ConfigError names ``where`` and the key."""
    if table is not None and not isinstance(table, Mapping):
        raise ConfigError(f"{where}: [warmup] must be a table")
    if table and "shapes" in table:
        raise ConfigError(f"{where}: [warmup] shapes are tensor shapes; a generative model warms up with "
                          "prompt_tokens and decode_steps")
    return from_mapping(GenerationWarmupConfig, table or {}, f"{where}: [warmup]")


@dataclass(frozen=True)
class GenerationWarmupReport:
    """What warm-up ran; ``to_dict`` has a tensor model's report keys (``done``, ``first_run_ms``,
    ``shapes``, ``errors``) plus the prefill and decode split of the first run."""

    prompt_tokens: int = 0
    decode_steps: int = 0
    runs: int = 0
    prefill_ms: float = 0.0  # first run
    decode_ms: float = 0.0  # first run, all its decode steps
    vision_ms: float = 0.0  # a vision-language model: one small image preprocessed and encoded
    errors: Mapping[str, str] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.runs > 0

    def to_dict(self) -> dict[str, Any]:
        ran = self.done
        return {"done": ran, "first_run_ms": {PLAN: [round(self.prefill_ms + self.decode_ms, 3)]} if ran else {},
                "shapes": [{"prompt_tokens": self.prompt_tokens, "decode_steps": self.decode_steps}] if ran else [],
                "errors": dict(self.errors), "runs": self.runs, "prefill_ms": round(self.prefill_ms, 3),
                "decode_ms": round(self.decode_ms, 3), **({"vision_ms": round(self.vision_ms, 3)}
                                                          if self.vision_ms else {})}


def warm_up_generative(model: "GenerativeModel", config: GenerationWarmupConfig) -> GenerationWarmupReport:
    """Run ``config.runs`` warm-up sequences on ``model`` (blocking; before it is served).

    Raises ModelLoadError when the engine fails on them (see the module docstring).
    """
    if not config.enabled:
        return GenerationWarmupReport()
    if model.engine is None:
        log.info("warm-up: %s runs on onnxruntime-genai, which owns its session: not warmed up", model.name)
        return GenerationWarmupReport(errors={PLAN: "onnxruntime-genai folders are not warmed up"})
    batcher = model.batcher
    decode_steps = max(0, min(config.decode_steps, batcher.max_len - 2))
    prompt_tokens = max(1, min(config.prompt_tokens, batcher.max_len - decode_steps - 1))
    vocab = model.folder.vocab_size
    tokens = [(7 * i + 1) % vocab for i in range(prompt_tokens)]  # any ids inside the vocabulary
    first: tuple[float, float] | None = None
    vision_ms = 0.0
    try:
        for _ in range(config.runs):
            times = batcher.warm_up(tokens, decode_steps)
            first = first or times
        if model.prompter is not None:  # a VLM's vision encoder: first-run costs out of the first request
            vision_ms = model.prompter.warm_up()
    except Exception as exc:  # onnxruntime raises its own types; valid inputs failing means a broken model
        raise ModelLoadError(f"model {model.name!r}: warm-up generation ({prompt_tokens} prompt tokens, "
                             f"{decode_steps} decode steps) failed: {type(exc).__name__}: {exc}") from exc
    assert first is not None
    log.info("warm-up: %s prefill of %d tokens %.1f ms, %d decode steps %.1f ms", model.name, prompt_tokens,
             first[0], decode_steps, first[1])
    return GenerationWarmupReport(prompt_tokens, decode_steps, config.runs, first[0], first[1], vision_ms=vision_ms)
