"""Token choice with OpenAI's parameters: greedy, temperature, top-p, seed, penalties, logit bias,
logprobs; and vLLM's ``top_k``, ``min_p`` and ``repetition_penalty`` (its ``min_tokens`` and
``stop_token_ids`` are validated here and applied by ``sequence.Sequence``, which decides the end).

``SamplingParams`` validates once (InvalidInputError names the parameter, the
allowed range and the value); ``Sampler`` holds one sequence's random stream
and token counts. Penalties follow OpenAI's definition: every logit drops by
``frequency_penalty * count + presence_penalty * (count > 0)``, counting the
tokens generated so far; ``logit_bias`` adds its value to its token's logit
before anything else (OpenAI: -100 bans a token, 100 all but forces it).
``repetition_penalty`` (vLLM's and transformers' CTRL-style penalty, applied
after the bias and before the OpenAI penalties, as vLLM does) divides the
positive logits and multiplies the negative ones of every token seen in the
prompt or the answer.
``temperature == 0`` is greedy (argmax; ties go to the lowest id, as
``numpy.argmax`` and ``torch.argmax`` agree). Sampling keeps the tokens whose
probability is at least ``min_p`` times the best one's, then the ``top_k``
most likely, then the smallest set whose probability reaches ``top_p``, in
vLLM's order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from edge_runtime.errors import InvalidInputError
from edge_runtime.generation.constraints import GrammarSpec

MAX_STOP = 4
MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 1024  # entries per request
MAX_STOP_TOKEN_IDS = 64


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
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100])
    top_k: int = 0  # 0 or -1: every token
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # 1: off
    min_tokens: int = 0  # vLLM's: no end (EOS, stop_token_ids, stop strings) before this many tokens
    stop_token_ids: tuple[int, ...] = ()  # vLLM's: these tokens end the answer (their text kept unless special)
    ignore_eos: bool = False  # benchmarks: generate exactly max_tokens (a guided answer still ends when complete)
    include_stop_str_in_output: bool = False  # vLLM's: a matched stop string stays at the end of the text
    skip_special_tokens: bool = True  # vLLM's: False keeps special tokens' text in the answer
    guide: GrammarSpec | None = None  # what the answer must match (None: free text)
    # vLLM's: each prompt token's logprob given the tokens before it, with this many alternatives (None: off)
    prompt_logprobs: int | None = None

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
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            raise InvalidInputError(f"'top_k' must be an integer >= 1, or 0 or -1 for every token, got {self.top_k!r}")
        _check_range("min_p", self.min_p, 0.0, 1.0)
        if _check_range("repetition_penalty", self.repetition_penalty, 0.0, 2.0) <= 0.0:
            raise InvalidInputError(f"'repetition_penalty' must be in (0, 2], got {self.repetition_penalty!r}")
        if not isinstance(self.logit_bias, tuple) or len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise InvalidInputError(f"'logit_bias' must map at most {MAX_LOGIT_BIAS} token ids to biases")
        for entry in self.logit_bias:
            token, bias = entry if isinstance(entry, tuple) and len(entry) == 2 else (None, None)
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise InvalidInputError(f"'logit_bias' keys must be token ids (integers >= 0), got {entry!r}")
            _check_range(f"logit_bias[{token}]", bias, -100.0, 100.0)
        if isinstance(self.min_tokens, bool) or not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise InvalidInputError(f"'min_tokens' must be an integer >= 0, got {self.min_tokens!r}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise InvalidInputError(f"'min_tokens' ({self.min_tokens}) must not exceed 'max_tokens' ({self.max_tokens})")
        if not isinstance(self.stop_token_ids, tuple) or len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids):
            raise InvalidInputError(f"'stop_token_ids' must be a list of at most {MAX_STOP_TOKEN_IDS} token ids "
                                    f"(integers >= 0), got {self.stop_token_ids!r}"[:300])
        if self.prompt_logprobs is not None and (isinstance(self.prompt_logprobs, bool) or not isinstance(
                self.prompt_logprobs, int) or not 0 <= self.prompt_logprobs <= MAX_TOP_LOGPROBS):
            raise InvalidInputError(f"'prompt_logprobs' must be an integer in [0, {MAX_TOP_LOGPROBS}] or null, "
                                    f"got {self.prompt_logprobs!r}")
        if self.top_logprobs and not self.logprobs:
            raise InvalidInputError("'top_logprobs' needs 'logprobs': true")
        for flag in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            if not isinstance(getattr(self, flag), bool):
                raise InvalidInputError(f"'{flag}' must be true or false, got {getattr(self, flag)!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def logit_bias_of(value: Any) -> tuple[tuple[int, float], ...]:
    """``logit_bias`` as ``SamplingParams`` keeps it, from OpenAI's JSON object (token ids as strings)
    or a mapping of ints; InvalidInputError for a key that is not a token id."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise InvalidInputError(f"'logit_bias' must be an object mapping token ids to biases, got {value!r}"[:300])
    entries = []
    for key, bias in value.items():
        try:
            token = int(key) if not isinstance(key, bool) else None
        except (TypeError, ValueError):
            token = None
        if token is None or str(key).strip() != str(token):
            raise InvalidInputError(f"'logit_bias' keys must be token ids, got {key!r}"[:300])
        entries.append((token, bias))
    return tuple(sorted(entries))


@dataclass(frozen=True)
class TokenChoice:
    token: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()  # (token, logprob), best first
    rank: int | None = None  # the token's place among all (1: the most likely); given for prompt tokens


def prompt_choices(logits: np.ndarray, tokens: Any, top: int) -> list[TokenChoice]:
    """Row ``i`` of ``logits`` [n, vocab] scored against ``tokens[i]``, the token that followed: its logprob,
    its rank and the ``top`` most likely tokens (vLLM's prompt_logprobs entries)."""
    rows = np.asarray(logits, np.float32)
    shifted = rows - rows.max(axis=1, keepdims=True)
    logprobs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    choices = []
    for row, token in zip(logprobs, tokens):
        own = float(row[token])
        best = np.argpartition(-row, top)[:top] if 0 < top < row.size else np.arange(row.size if top else 0)
        best = best[np.argsort(-row[best], kind="stable")]
        choices.append(TokenChoice(int(token), own, tuple((int(t), float(row[t])) for t in best),
                                   1 + int((row > own).sum())))
    return choices


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max()
    return shifted - np.log(np.exp(shifted).sum())


@dataclass
class Sampler:
    """One sequence's sampler: call ``choose`` with the last position's logits [vocab]."""

    params: SamplingParams
    prompt: Any = ()  # the prompt's token ids (read by repetition_penalty only)
    rng: np.random.Generator = field(init=False)
    counts: dict[int, int] = field(default_factory=dict)
    _prompt_ids: np.ndarray | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.params.seed)
        if self.params.repetition_penalty != 1.0:
            self._prompt_ids = np.unique(np.asarray(list(self.prompt), dtype=np.int64))

    def choose(self, logits: np.ndarray) -> TokenChoice:
        p = self.params
        if p.greedy and not p.logprobs and not (p.presence_penalty or p.frequency_penalty or p.logit_bias
                                                or p.repetition_penalty != 1.0):
            # Greedy without penalties, every token: argmax over the logits as they come (float32),
            # without the float64 copy the arithmetic below needs. Same token: widening is exact.
            # (Agents that send frequency_penalty take the path below.)
            token = int(np.argmax(logits))
            self.counts[token] = self.counts.get(token, 0) + 1
            return TokenChoice(token)
        logits = np.array(logits, dtype=np.float64)  # our own copy: the adjustments below write into it
        if p.logit_bias:
            for token, bias in p.logit_bias:
                logits[token] += bias
        if self._prompt_ids is not None:
            seen = np.union1d(self._prompt_ids, np.fromiter(self.counts, dtype=np.int64))
            seen = seen[seen < logits.shape[0]]
            picked = logits[seen]
            logits[seen] = np.where(picked > 0, picked / p.repetition_penalty, picked * p.repetition_penalty)
        if self.counts and (p.presence_penalty or p.frequency_penalty):
            ids = np.fromiter(self.counts, dtype=np.int64)
            counts = np.fromiter(self.counts.values(), dtype=np.float64)
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
        p = self.params
        if p.min_p > 0.0 or p.top_k > 0:
            kept = probs >= p.min_p * probs.max()
            if 0 < p.top_k < int(kept.sum()):
                # the k most likely (ties at the k-th place by lower id, as the stable sort orders them)
                kept = np.zeros_like(kept)
                kept[np.argsort(-probs, kind="stable")[:p.top_k]] = True
            probs = np.where(kept, probs, 0.0)
            probs /= probs.sum()
        if p.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            cumulative = np.cumsum(probs[order])
            keep = order[:int(np.searchsorted(cumulative, self.params.top_p)) + 1]
            kept = probs[keep] / probs[keep].sum()
            return int(keep[self.rng.choice(len(keep), p=kept)])
        return int(self.rng.choice(len(probs), p=probs))


class StopMatcher:
    """Holds back streamed text that could still become a stop string; cuts at the first match.

    ``include``: vLLM's ``include_stop_str_in_output``: the text ends after the stop string instead
    of before it, so nothing needs holding back (the last characters are kept only to find a stop
    string that spans two feeds)."""

    def __init__(self, stops: tuple[str, ...], include: bool = False) -> None:
        self.stops = stops
        self.include = include
        self._pending = ""
        self._emitted = 0  # chars at the start of _pending already emitted (``include`` only)
        self.stopped = False

    def feed(self, text: str, match: bool = True) -> str:
        """The text safe to emit now; sets ``stopped`` (and drops the rest) once a stop string appears.

        ``match`` False (before ``min_tokens``): the text is held back as usual but no stop string ends
        in it. As in vLLM, a stop string counts when it ends in text fed with ``match``, wherever it
        starts: one that straddles the ``min_tokens`` boundary cuts the answer at its start."""
        if not self.stops:
            return text
        start = len(self._pending)
        self._pending += text
        # only occurrences that end in the new text: earlier ones were looked for already, or were fed
        # before matching began
        found = (self._pending.find(s, max(0, start - len(s) + 1)) for s in self.stops) if match else ()
        hits = [(i, i + len(s)) for i, s in zip(found, self.stops) if i >= 0]
        if self.include:
            return self._feed_included(min(hits, default=None))
        cut = min((i for i, _ in hits), default=-1)
        if cut >= 0:
            self.stopped = True
            out, self._pending = self._pending[:cut], ""
            return out
        hold = max((k for s in self.stops for k in range(1, len(s)) if self._pending.endswith(s[:k])), default=0)
        out, self._pending = self._pending[:len(self._pending) - hold], self._pending[len(self._pending) - hold:]
        return out

    def _feed_included(self, hit: tuple[int, int] | None) -> str:
        """``include``: emit everything new, up to the end of the first stop string found."""
        end = len(self._pending) if hit is None else hit[1]
        out = self._pending[self._emitted:end]
        if hit is not None:
            self.stopped, self._pending, self._emitted = True, "", 0
            return out
        keep = max(len(s) for s in self.stops) - 1  # enough to find a stop string the next feed completes
        self._pending = self._pending[len(self._pending) - keep:] if keep else ""
        self._emitted = len(self._pending)
        return out

    def flush(self) -> str:
        out, self._pending = self._pending[self._emitted:], ""
        self._emitted = 0
        return out
