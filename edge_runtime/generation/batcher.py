"""Continuous batching: sequences join and leave the running decode batch at token boundaries.

Iteration-level scheduling as Orca and vLLM do it, on one thread that owns the
engine. Each iteration (1) admits queued requests while the batch has a free
row and their reserved KV positions fit ``kv_budget_tokens``, (2) runs one
decode step for every running sequence, (3) runs at most one prefill chunk of
the oldest admitted sequence, so a new prompt delays running streams by one
chunk at most, then (4) rebuilds the batch's KV layout when sequences left or
finished their prefill. A cancelled sequence (client gone) leaves at the next
iteration. ``submit`` beyond ``max_queue`` waiting requests raises
``QueueFullError``.

The prefix cache is consulted before a prefill and filled after it (the
prompt's blocks) and when a sequence finishes (prompt and answer), so an
agent's next step finds its history cached.

A constrained request (``params.guide``) gets its grammar compiled by
``grammars`` (the model's ``constraints.GrammarCache``) in ``submit``, before it
is queued, so a bad grammar is refused before any token; the guided rows'
token masks are computed by ``MaskPrefetch`` while the decode step runs.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from edge_runtime.errors import InvalidInputError, QueueFullError
from edge_runtime.generation.constraints import MaskPrefetch
from edge_runtime.generation.engine import DecoderEngine
from edge_runtime.generation.prefix_cache import PrefixCache
from edge_runtime.generation.sampling import SamplingParams, prompt_choices
from edge_runtime.generation.sequence import Sequence, Sink, new_token_room
from edge_runtime.generation.settings import GenerationSettings

log = logging.getLogger(__name__)
EWMA = 0.2


@dataclass(frozen=True)
class BatcherStats:
    queued: int
    prefilling: int
    running: int
    reserved_tokens: int
    budget_tokens: int
    steps: int
    tokens_generated: int
    prefill_tokens: int
    prefill_tokens_per_s: float | None
    decode_tokens_per_s: float | None  # one stream's rate at the recent batch sizes


class ContinuousBatcher:
    """Owns ``engine`` on its own thread (started by ``start``, stopped by ``close``)."""

    def __init__(self, engine: DecoderEngine, settings: GenerationSettings, prefix_cache: PrefixCache,
                 eos: frozenset[int], decode: Callable) -> None:
        self.engine = engine
        self.settings = settings
        self.prefix_cache = prefix_cache
        self.eos = eos
        self._decode = decode
        self.max_len = engine.kv.max_len
        self.model_context = engine.folder.context_length  # max_len is it capped by [generation] max_seq_len
        self.budget_tokens = settings.kv_budget_tokens or engine.kv.max_batch * self.max_len
        self._queue: collections.deque[Sequence] = collections.deque()
        self._prefilling: list[Sequence] = []
        self._running: list[Sequence] = []  # in batch row order
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._steps = self._generated = self._prefill_tokens = 0
        self._prefill_rate: float | None = None
        self._decode_rate: float | None = None
        self.warmups = 0  # warm_up calls that ran (load-time work a request no longer pays)
        self.grammars: Any = None  # constraints.GrammarCache; None: this model cannot constrain
        self._masks = MaskPrefetch()

    # -- client side (any thread) -------------------------------------------------------
    def submit(self, prompt: list[int], params: SamplingParams, sink: Sink, *, inputs: Any = None,
               cache_key: list[int] | None = None) -> Sequence:
        """Queue a request; InvalidInputError when it cannot fit the context, QueueFullError when full.

        ``inputs``: the prompt's precomputed decoder inputs for the engine (a VLM's
        ``EmbeddedPrompt``); ``cache_key``: the prompt as the prefix cache should key it (same
        length as ``prompt``); see ``Sequence``.
        """
        if cache_key is not None and len(cache_key) != len(prompt):
            raise ValueError(f"cache_key has {len(cache_key)} ids for a prompt of {len(prompt)}")
        room = new_token_room(len(prompt), params.max_tokens, self.max_len, self.model_context)
        guide = None
        if params.guide is not None:
            if self.grammars is None:
                raise InvalidInputError("this model cannot constrain its output (no grammar support)")
            guide = self.grammars.guide(params.guide)  # InvalidInputError for a bad grammar
        sequence = Sequence(list(prompt), params, params.max_tokens or room, self.eos, self._decode, sink,
                            inputs=inputs, cache_key=list(cache_key) if cache_key is not None else None,
                            guide=guide)
        if sequence.reserved_tokens > self.budget_tokens:
            raise InvalidInputError(f"the request needs {sequence.reserved_tokens} KV positions (prompt + max_tokens);"
                                    f" the model's budget is {self.budget_tokens}: lower max_tokens")
        with self._wake:
            if self._stopping:
                raise QueueFullError("the model is shutting down")
            if len(self._queue) >= self.settings.max_queue:
                raise QueueFullError(f"generation queue full: {len(self._queue)} requests waiting "
                                     f"(max_queue {self.settings.max_queue}); retry later")
            self._queue.append(sequence)
            self._wake.notify()
        return sequence

    def cancel(self, sequence: Sequence) -> None:
        sequence.cancelled.set()
        with self._wake:
            self._wake.notify()

    def stats(self) -> BatcherStats:
        with self._wake:
            active = self._prefilling + self._running
            return BatcherStats(len(self._queue), len(self._prefilling), len(self._running),
                                sum(s.reserved_tokens for s in active), self.budget_tokens, self._steps,
                                self._generated, self._prefill_tokens, self._prefill_rate, self._decode_rate)

    @property
    def pending(self) -> int:
        with self._wake:
            return len(self._queue) + len(self._prefilling) + len(self._running)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="edge-runtime-generate", daemon=True)
            self._thread.start()

    def close(self, timeout_s: float = 10.0) -> None:
        """Finish running sequences for up to ``timeout_s``, then cancel the rest and stop."""
        deadline = time.monotonic() + timeout_s
        with self._wake:
            self._stopping = True
            self._wake.notify()
        while self.pending and time.monotonic() < deadline and self._thread is not None:
            time.sleep(0.01)
        with self._wake:
            for sequence in [*self._queue, *self._prefilling, *self._running]:
                sequence.cancelled.set()
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=max(1.0, timeout_s))
            self._thread = None
        self._masks.close()

    def warm_up(self, tokens: list[int], decode_steps: int) -> tuple[float, float]:
        """Run ``tokens`` as one sequence's prefill (in chunks) and ``decode_steps`` decode steps through
        the engine and the batch KV layout, on the caller's thread; returns (prefill ms, decode ms).

        For load time, before requests arrive: it touches neither the prefix cache nor the
        statistics, and raises RuntimeError if any sequence is queued or active. The token choice
        is the argmax (no sampler). The prompt plus the steps must fit ``max_len``.
        """
        if not tokens or len(tokens) + decode_steps >= self.max_len:
            raise ValueError(f"warm-up of {len(tokens)} prompt tokens and {decode_steps} decode steps does not "
                             f"fit the context of {self.max_len} tokens")
        # Holding the admission lock keeps the loop thread out: it needs it to see any work.
        with self._wake:
            if self._queue or self._prefilling or self._running:
                raise RuntimeError("warm-up needs an idle batcher (call it before serving requests)")
            engine = self.engine
            chunk = self.settings.chunk_tokens(False, engine.folder.prefill_logits_vocab)
            started = time.perf_counter()
            past = None
            for start in range(0, len(tokens), chunk):
                logits, past = engine.prefill(tokens[start:start + chunk], past)
            prefilled = time.perf_counter()
            try:
                engine.kv.rebuild([], [past])
                token = int(logits.argmax())
                for _ in range(decode_steps):
                    token = int(engine.decode([token])[0].argmax())
            finally:
                engine.kv.rebuild([], [])
            done = time.perf_counter()
            self.warmups += 1
        return (prefilled - started) * 1e3, (done - prefilled) * 1e3

    # -- the loop (batcher thread) --------------------------------------------------------
    def _loop(self) -> None:
        from edge_runtime.denormals import flushed_denormals

        with flushed_denormals(self.settings.flush_denormals):  # the engine's runs do part of their work here
            self._serve()

    def _serve(self) -> None:
        while True:
            with self._wake:
                while not (self._queue or self._prefilling or self._running):
                    if self._stopping:
                        return
                    self._wake.wait()
                self._admit()
            try:
                self._iteration()
            except Exception as exc:  # a failing step must end its sequences, never the loop
                log.exception("generation step failed")
                with self._wake:
                    failed = [*self._prefilling, *self._running]
                    self._prefilling, self._running = [], []
                    self.engine.kv.rebuild([], [])
                for sequence in failed:
                    sequence.finish("error", exc)

    def _admit(self) -> None:
        reserved = sum(s.reserved_tokens for s in self._prefilling + self._running)
        while self._queue:
            head = self._queue[0]
            if head.cancelled.is_set():
                self._queue.popleft().finish("cancelled")
                continue
            rows = len(self._prefilling) + len(self._running)
            if rows >= self.engine.kv.max_batch or reserved + head.reserved_tokens > self.budget_tokens:
                return
            self._queue.popleft()
            head.state = "prefill"
            reserved += head.reserved_tokens
            self._prefilling.append(head)

    def _iteration(self) -> None:
        leaving = [i for i, s in enumerate(self._running) if s.cancelled.is_set()]
        for i in leaving:
            self._running[i].finish("cancelled")
        for sequence in [s for s in self._prefilling if s.cancelled.is_set()]:
            self._prefilling.remove(sequence)
            sequence.finish("cancelled")
        keep = [i for i in range(len(self._running)) if i not in set(leaving)]
        if leaving:
            self._relayout(keep, [])
        if self._running:
            self._decode_step()
        if self._prefilling:
            self._prefill_chunk(self._prefilling[0])

    def _decode_step(self) -> None:
        kv = self.engine.kv
        running = self._running
        started = time.perf_counter()
        masks = self._masks.start([s.guide for s in running])  # guided rows' masks, while the model runs
        try:
            logits = self.engine.decode([s.generated[-1] for s in running])
        finally:
            if masks is not None:
                masks.result()
        self._rate("decode", 1.0 / max(time.perf_counter() - started, 1e-9))
        self._steps += 1
        self._generated += len(running)
        keep = []
        for row, sequence in enumerate(running):
            done = sequence.accept(logits[row])
            if not done and sequence.length >= self.max_len:
                sequence.finish("length")
                done = True
            if done:
                self._remember(sequence, row)
            else:
                keep.append(row)
        if len(keep) < len(running):
            self._relayout(keep, [])
        elif not kv.can_grow():
            # Every row is right-aligned: a full buffer means some row reached max_len (handled above),
            # or leading pads remain; dropping them makes room.
            self._relayout(list(range(len(running))), [])

    def _prefill_chunk(self, sequence: Sequence) -> None:
        started = time.perf_counter()
        scoring = sequence.params.prompt_logprobs is not None  # every prompt position's logits wanted
        if sequence.past is None and sequence.position == 0:
            sequence.prefill_started_s = started
            # a cached prefix has KV but no logits: a scored prompt is prefilled whole
            matched, past = self.prefix_cache.lookup(sequence.key) if not scoring else (0, None)
            sequence.position, sequence.past, sequence.cached_tokens = matched, past, matched
        # Only running streams wait between chunks (a queued request waits for this prefill either way).
        vocab = self.engine.folder.vocab_size if scoring else self.engine.folder.prefill_logits_vocab
        chunk = self.settings.chunk_tokens(bool(self._running), vocab)
        end = min(len(sequence.prompt), sequence.position + chunk)
        logits, present = self.engine.prefill(sequence.prompt[sequence.position:end], sequence.past,
                                              sequence.inputs, every_position=scoring)
        if scoring:  # position i's logits score the prompt token after it; the last one's, the first answer's
            following = sequence.prompt[sequence.position + 1:end + 1]
            sequence.prompt_choices += prompt_choices(logits[:len(following)], following,
                                                      sequence.params.prompt_logprobs)
            logits = logits[-1]
        self._rate("prefill", (end - sequence.position) / max(time.perf_counter() - started, 1e-9))
        self._prefill_tokens += end - sequence.position
        sequence.position, sequence.past = end, present
        if end < len(sequence.prompt):
            return
        sequence.prefill_done_s = time.perf_counter()
        sequence.inputs = None  # a VLM prompt's embeddings: the KV holds what they gave
        self._prefilling.remove(sequence)
        self.prefix_cache.insert(sequence.key, present)
        if sequence.accept(logits):
            sequence.past = None
            return
        sequence.state = "running"
        with self._wake:  # stats() reads the lists from other threads
            self._running.append(sequence)
        self._relayout(list(range(len(self._running) - 1)), [present], [sequence.position_offset])
        sequence.past = None

    def _relayout(self, keep: list[int], joining: list, offsets: list[int] | None = None) -> None:
        """Rebuild the KV layout; ``self._running`` must already list the joining sequences at its end."""
        self.engine.kv.rebuild(keep, joining, offsets)
        with self._wake:
            kept = [self._running[i] for i in keep]
            self._running = kept + self._running[len(self._running) - len(joining):] if joining else kept

    def _remember(self, sequence: Sequence, row: int) -> None:
        """Cache the finished sequence's prompt + answer blocks (its KV holds all but the last token)."""
        if self.prefix_cache.budget_bytes > 0:
            tokens = sequence.key + sequence.generated[:-1]
            self.prefix_cache.insert(tokens, self.engine.kv.row_kv(row))

    def _rate(self, kind: str, value: float) -> None:
        attribute = f"_{kind}_rate"
        old = getattr(self, attribute)
        setattr(self, attribute, value if old is None else old + EWMA * (value - old))
