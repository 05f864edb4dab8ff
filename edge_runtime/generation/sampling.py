"""Token choice with OpenAI's parameters: greedy, temperature, top-p, seed, penalties, logprobs.

``SamplingParams`` validates once (InvalidInputError names the parameter, the
allowed range and the value); ``Sampler`` holds one sequence's random stream
and token counts. Penalties follow OpenAI's definition: every logit drops by
``frequency_penalty * count + presence_penalty * (count > 0)``, counting the
tokens generated so far. ``temperature == 0`` is greedy (argmax; ties go to
the lowest id, as ``numpy.argmax`` and ``torch.argmax`` agree).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge_runtime.errors import InvalidInputError
from edge_runtime.generation.constraints import GrammarSpec

MAX_STOP = 4
MAX_TOP_LOGPROBS = 20


def _check_range(name: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise InvalidInputError(f"'{name}' must be a number in [{low:g}, {high:g}], got {value!r}")
    return float(value)


@dataclass(frozen=True)
class SamplingParams:
    """One request's generation settings (``max_tokens`` None: up to the context length)."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: bool = False
    top_logprobs: int = 0
    ignore_eos: bool = False  # benchmarks: generate exactly max_tokens (a guided answer still ends when complete)
    guide: GrammarSpec | None = None  # what the answer must match (None: free text)

    def __post_init__(self) -> None:
        if self.max_tokens is not None and (isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int)
                                            or self.max_tokens < 1):
            raise InvalidInputError(f"'max_tokens' must be a positive integer, got {self.max_tokens!r}")
        _check_range("temperature", self.temperature, 0.0, 2.0)
        if _check_range("top_p", self.top_p, 0.0, 1.0) <= 0.0:
            raise InvalidInputError(f"'top_p' must be in (0, 1], got {self.top_p!r}")
        _check_range("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _check_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise InvalidInputError(f"'seed' must be an integer, got {self.seed!r}")
        if not isinstance(self.stop, tuple) or len(self.stop) > MAX_STOP or not all(
                isinstance(s, str) and s for s in self.stop):
            raise InvalidInputError(f"'stop' must be a string or a list of at most {MAX_STOP} non-empty strings, "
                                    f"got {self.stop!r}")
        if isinstance(self.top_logprobs, bool) or not isinstance(self.top_logprobs, int) or not (
                0 <= self.top_logprobs <= MAX_TOP_LOGPROBS):
            raise InvalidInputError(f"'top_logprobs' must be an integer in [0, {MAX_TOP_LOGPROBS}], "
                                    f"got {self.top_logprobs!r}")
        if self.guide is not None and not isinstance(self.guide, GrammarSpec):
            raise InvalidInputError(f"'guide' must be a GrammarSpec, got {type(self.guide).__name__}")
        if self.top_logprobs and not self.logprobs:
            raise InvalidInputError("'top_logprobs' needs 'logprobs': true")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class TokenChoice:
    token: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()  # (token, logprob), best first


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max()
    return shifted - np.log(np.exp(shifted).sum())


@dataclass
class Sampler:
    """One sequence's sampler: call ``choose`` with the last position's logits [vocab]."""

    params: SamplingParams
    rng: np.random.Generator = field(init=False)
    counts: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.params.seed)

    def choose(self, logits: np.ndarray) -> TokenChoice:
        p = self.params
        if p.greedy and not p.logprobs and not (p.presence_penalty or p.frequency_penalty):
            # Greedy without penalties, every token: argmax over the logits as they come (float32),
            # without the float64 copy the arithmetic below needs. Same token: widening is exact.
            # (Agents that send frequency_penalty take the path below.)
            token = int(np.argmax(logits))
            self.counts[token] = self.counts.get(token, 0) + 1
            return TokenChoice(token)
        logits = np.asarray(logits, dtype=np.float64)
        if self.counts and (p.presence_penalty or p.frequency_penalty):
            ids = np.fromiter(self.counts, dtype=np.int64)
            counts = np.fromiter(self.counts.values(), dtype=np.float64)
            logits = logits.copy()
            logits[ids] -= p.frequency_penalty * counts + p.presence_penalty
        if p.greedy:
            token = int(np.argmax(logits))
        else:
            token = self._sample(logits / p.temperature)
        self.counts[token] = self.counts.get(token, 0) + 1
        if not p.logprobs:
            return TokenChoice(token)
        logprobs = _log_softmax(logits)
        top: tuple[tuple[int, float], ...] = ()
        if p.top_logprobs:
            best = np.argsort(-logprobs, kind="stable")[:p.top_logprobs]
            top = tuple((int(t), float(logprobs[t])) for t in best)
        return TokenChoice(token, float(logprobs[token]), top)

    def _sample(self, scaled: np.ndarray) -> int:
        probs = np.exp(scaled - scaled.max())
        probs /= probs.sum()
        if self.params.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            cumulative = np.cumsum(probs[order])
            keep = order[:int(np.searchsorted(cumulative, self.params.top_p)) + 1]
            kept = probs[keep] / probs[keep].sum()
            return int(keep[self.rng.choice(len(keep), p=kept)])
        return int(self.rng.choice(len(probs), p=probs))


class StopMatcher:
    """Holds back streamed text that could still become a stop string; cuts at the first match."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self._pending = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """The text safe to emit now; sets ``stopped`` (and drops the rest) once a stop string appears."""
        if not self.stops:
            return text
        self._pending += text
        cut = min((i for i in (self._pending.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            out, self._pending = self._pending[:cut], ""
            return out
        hold = max((k for s in self.stops for k in range(1, len(s)) if self._pending.endswith(s[:k])), default=0)
        out, self._pending = self._pending[:len(self._pending) - hold], self._pending[len(self._pending) - hold:]
        return out

    def flush(self) -> str:
        out, self._pending = self._pending, ""
        return out
