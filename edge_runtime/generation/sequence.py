"""One generation request as the batcher sees it, and the chunks it emits.

A ``Sequence`` moves ``queued`` → ``prefill`` (chunk by chunk) → ``running``
(one token per batch step) → finished. Each chosen token goes through the
incremental detokenizer and the stop matcher; the resulting ``Chunk`` goes to
the request's ``sink`` (called on the batcher's thread; it must not block).
The last chunk carries ``finish_reason`` and ``usage``.

A vision-language request also carries its precomputed decoder inputs
(``inputs``: the prompt's embeddings with the image features spliced in, and
its positions) and its prefix-cache key (``cache_key``: the prompt's ids with
each image token replaced by an id derived from its image's content, so two
different images never share cached KV).
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

import numpy as np

from edge_runtime.errors import InvalidInputError
from edge_runtime.generation.detokenizer import IncrementalDetokenizer
from edge_runtime.generation.sampling import Sampler, SamplingParams, StopMatcher, TokenChoice

_ids = itertools.count(1)


def new_token_room(prompt_tokens: int, max_tokens: int | None, context: int, model_context: int) -> int:
    """How many tokens may follow a prompt of ``prompt_tokens`` in ``context`` positions (the KV
    buffers' length); InvalidInputError when the prompt or ``max_tokens`` does not fit.

    ``model_context``: the model's own context. Where ``[generation] max_seq_len`` cut it shorter
    (a memory choice: it sizes the KV buffers), the error says so and how to change it: an agent
    client sends the same ``max_tokens`` at every step, and the message is all its user sees.
    """
    capped = (f" ([generation] max_seq_len = {context} caps the model's {model_context}: raise it, which "
              f"costs KV memory, to fit more)" if model_context > context else "")
    if not prompt_tokens:
        raise InvalidInputError("the prompt is empty: give at least one token")
    if prompt_tokens >= context:
        raise InvalidInputError(f"the prompt is {prompt_tokens} tokens; this model's context is {context} "
                                f"tokens (the prompt must leave room for at least one new token){capped}")
    room = context - prompt_tokens
    if max_tokens is not None and max_tokens > room:
        raise InvalidInputError(f"the prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) exceeds this "
                                f"model's context of {context} tokens: ask for at most {room} new tokens{capped}")
    return room


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


@dataclass(frozen=True)
class Chunk:
    """Text produced by one step (may be '' while a character or a possible stop string is held)."""

    text: str
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[TokenChoice, ...] = ()
    finish_reason: str | None = None  # "stop", "length", "cancelled", "error"
    usage: Usage | None = None
    error: BaseException | None = None
    tool_calls: tuple[dict[str, Any], ...] = ()  # a cloud peer's tool-call deltas, passed through as sent
    reasoning: str = ""  # a cloud peer's reasoning delta, passed through as sent
    # the prompt's tokens scored (params.prompt_logprobs), on the first chunk; the first one's logprob is None
    prompt_logprobs: tuple[TokenChoice, ...] | None = None


Sink = Callable[[Chunk], None]


@dataclass(eq=False)
class Sequence:
    prompt: list[int]
    params: SamplingParams
    max_new: int
    eos: frozenset[int]
    decode: Callable[[Any], str]
    sink: Sink
    id: int = field(default_factory=lambda: next(_ids))
    cancelled: threading.Event = field(default_factory=threading.Event)
    created_s: float = field(default_factory=time.perf_counter)
    first_token_s: float | None = None
    state: str = "queued"
    position: int = 0  # prompt tokens whose KV exists (prefill progress)
    cached_tokens: int = 0
    past: list[np.ndarray] | None = None  # KV while prefilling
    generated: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    inputs: Any = None  # the engine's precomputed prompt inputs (vision.engine.EmbeddedPrompt); dropped after prefill
    cache_key: list[int] | None = None  # prefix-cache key of the prompt; None: the prompt itself
    prefill_started_s: float | None = None  # first prefill chunk began (after any queueing)
    prefill_done_s: float | None = None  # last prefill chunk ended
    guide: Any = None  # constraints.RowGuide of a constrained request: masks the logits, consumes each token
    prompt_choices: list[Any] = field(default_factory=list)  # prompt tokens scored so far (prompt_logprobs)

    @property
    def key(self) -> list[int]:
        """The prompt as the prefix cache knows it."""
        return self.cache_key if self.cache_key is not None else self.prompt

    def __post_init__(self) -> None:
        self.sampler = Sampler(self.params, self.prompt)
        # what min_tokens holds back: every token that would end the answer
        self._ends = np.array(sorted(set(self.eos) | set(self.params.stop_token_ids)), dtype=np.int64)
        decode = self.decode if self.params.skip_special_tokens else partial(self.decode, skip_special_tokens=False)
        self.detokenizer = IncrementalDetokenizer(decode)
        self.stops = StopMatcher(self.params.stop, include=self.params.include_stop_str_in_output)
        # Decode position minus cache index: an M-RoPE prompt's rope_delta (0 for text). Kept apart
        # from ``inputs``, which the batcher drops once the prompt is prefilled.
        self.position_offset = int(getattr(self.inputs, "rope_delta", 0))

    @property
    def reserved_tokens(self) -> int:
        """KV positions this sequence may come to hold (its admission cost)."""
        return len(self.prompt) + self.max_new

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.generated)

    def usage(self) -> Usage:
        return Usage(len(self.prompt), len(self.generated), self.cached_tokens)

    def accept(self, logits: np.ndarray) -> bool:
        """Choose the next token from ``logits``, emit its chunk; True when the sequence finished.

        A guided sequence samples among the tokens its grammar allows, and finishes ("stop") when
        the grammar is complete, ``ignore_eos`` or not; a grammar failure finishes it ("error").
        """
        guide = self.guide
        if guide is not None:
            try:
                logits = guide.masked(logits)
            except RuntimeError as exc:
                self.finish("error", exc)
                return True
        if len(self.generated) < self.params.min_tokens and self._ends.size:
            held = np.array(logits, dtype=np.float32)  # a copy: logits may be the engine's buffer
            held[self._ends[self._ends < held.shape[-1]]] = -np.inf
            if np.isfinite(held).any():  # a grammar that allows only an end still ends
                logits = held
        choice = self.sampler.choose(logits)
        if guide is not None:
            guide.consume(choice.token)
        if self.first_token_s is None:
            self.first_token_s = time.perf_counter()
        self.generated.append(choice.token)
        reason = None
        if choice.token in self.eos and (not self.params.ignore_eos or guide is not None):
            text = self.detokenizer.flush()
            reason = "stop"
        elif (guide is not None and guide.finished) or choice.token in self.params.stop_token_ids:
            text = self.detokenizer.push(choice.token) + self.detokenizer.flush()
            reason = "stop"
        else:
            text = self.detokenizer.push(choice.token)
            if len(self.generated) >= self.max_new:
                text += self.detokenizer.flush()
                reason = "length"
        # stop strings count once min_tokens are out (vLLM's rule; one may start in earlier, held-back text)
        text = self.stops.feed(text, match=len(self.generated) > self.params.min_tokens)
        if self.stops.stopped:
            reason = "stop"
        elif reason is not None:
            text += self.stops.flush()
        logprobs = (choice,) if self.params.logprobs else ()
        self.finish_reason = reason
        scored = None
        if self.params.prompt_logprobs is not None and len(self.generated) == 1:
            # the first prompt token: nothing before it scores it (logprob None)
            scored = (TokenChoice(self.prompt[0]), *self.prompt_choices)
        self.sink(Chunk(text, (choice.token,), logprobs, reason, self.usage() if reason else None,
                        prompt_logprobs=scored))
        return reason is not None

    def finish(self, reason: str, error: BaseException | None = None) -> None:
        """End without a new token (cancelled, failed, shutting down)."""
        if self.finish_reason is None:
            self.finish_reason = reason
            self.sink(Chunk("", (), (), reason, self.usage(), error))
