"""``DecoderEngine``: one ONNX Runtime session of an ``optimum`` decoder, run as prefill or decode.

``prefill`` runs one sequence's prompt chunk on top of its past (numpy arrays,
at most one chunk per call, so a scheduler can interleave it with decode
steps); ``decode`` runs one token for every row of the running batch through
IO binding over preallocated KV buffers: ``kv_inplace.InPlaceKV`` (past and present
the same memory) for a GroupQueryAttention graph, ``kv_cache.BatchKV`` (ping-pong)
for one that concatenates. The engine is synchronous
and single-threaded: one caller (the batcher's loop) owns it.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import numpy as np

from edge_runtime.errors import ModelLoadError
from edge_runtime.generation import kv_cache, kv_inplace
from edge_runtime.generation.folder import LOGITS_TO_KEEP, DecoderFolder

log = logging.getLogger(__name__)

_LAST_ONLY = np.array(1, np.int64)  # ``logits_to_keep``: a prefill chunk needs its last position's logits only


def kv_names(layers: int) -> tuple[list[str], list[str]]:
    """(past input names, present output names) in layer, key, value order."""
    past = [f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    return past, [name.replace("past_key_values", "present") for name in past]


def decode_rows(folder: DecoderFolder, max_batch: int) -> int:
    """Rows the engine's decode batch gets for ``max_batch`` asked: left-padded rows need explicit
    positions, and without a ``position_ids`` input the graph derives them from the past length,
    which is wrong for a padded row. Such a model decodes one stream at a time — unless it appends
    in place (GroupQueryAttention): its rows are not padded, and each row's rotary position is its
    own length (``seqlens_k``), as in onnxruntime-genai's graphs, which take no ``position_ids``."""
    return max_batch if folder.has_position_ids or folder.kv_in_place else 1


def kv_buffer_bytes(folder: DecoderFolder, max_batch: int, max_len: int) -> int:
    """Bytes of the KV buffers the engine allocates for ``folder`` (before allocating them)."""
    module = kv_inplace if folder.kv_in_place else kv_cache
    return module.buffer_bytes(folder.kv, max_batch, max_len)


class DecoderEngine:
    """Runs the model; ``max_batch`` rows of at most ``max_len`` positions in the decode batch."""

    def __init__(self, folder: DecoderFolder, *, threads: int, max_batch: int, max_len: int,
                 flush_denormals: bool = False) -> None:
        """``flush_denormals``: the session's pool threads flush subnormal floats to zero
        (``edge_runtime.denormals``; the calling thread needs ``flushed_denormals`` as well)."""
        import onnxruntime as ort

        from edge_runtime.denormals import SESSION_ENTRY, thread_mode_kept

        self.folder = folder
        if decode_rows(folder, max_batch) < max_batch:
            log.warning("%s has no position_ids input: decoding one sequence at a time", folder.model_path)
            max_batch = 1
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        if flush_denormals:
            options.add_session_config_entry(SESSION_ENTRY, "1")
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if folder.keeps_logits:
            # Errors only: ORT warns at every load that an input backed by an initializer (``logits_to_keep``,
            # meant to be overridden) blocks constant folding; it feeds only the LM head's Slice.
            options.log_severity_level = 3
        # NOTE: ORT's default spinning stays on purpose. Stopping the pool between steps (the scheduler's
        # ``load`` policy, force_spinning_stop) was tried with tools/bench_token_loop.py on 2 cores, two runs
        # each, alternated with runs of the spinning engine:
        # in-process decode the same, HTTP streaming 0.86-0.91x in-process against 0.96-1.0x spinning
        # (each step then wakes sleeping pool threads while the event loop and the client want the cores).
        try:
            with thread_mode_kept():  # ORT flushes the thread that makes its first session flush_denormals
                self.session = ort.InferenceSession(str(folder.model_path), options,
                                                    providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
            raise ModelLoadError(f"{folder.model_path}: onnxruntime cannot load it ({exc})") from None
        self.past_names, self.present_names = kv_names(folder.kv.layers)
        # A GroupQueryAttention graph appends in place into one buffer (past and present bound to the
        # same memory); a graph that concatenates needs the two-buffer ping-pong.
        kv_type = kv_inplace.InPlaceKV if folder.kv_in_place else kv_cache.BatchKV
        self.kv: kv_cache.BatchKV | kv_inplace.InPlaceKV = kv_type(folder.kv, max_batch, max_len)
        self._binding = self.session.io_binding()
        self._logits = np.zeros(max_batch * folder.vocab_size, np.float32)
        logits_type = next(o.type for o in self.session.get_outputs() if o.name == "logits")
        self._logits_fp16 = logits_type == "tensor(float16)"
        self.runs = 0
        self._bound_rows: int | None = None  # rows whose KV/logits bindings are still in place (see decode)

    def empty_past(self) -> list[np.ndarray]:
        layout = self.folder.kv
        return [np.zeros((1, layout.kv_heads, 0, layout.head_dim), layout.dtype) for _ in self.past_names]

    def prefill(self, tokens: Sequence[int], past: list[np.ndarray] | None,
                prompt: Any = None, every_position: bool = False) -> tuple[np.ndarray, list[np.ndarray]]:
        """Run ``tokens`` after ``past`` (None: empty); returns (logits of the last token [vocab], present);
        ``every_position``: the logits of every token of the chunk instead, [n, vocab] (prompt logprobs).

        ``prompt``: the whole prompt's precomputed inputs (an embedding engine's ``EmbeddedPrompt``),
        of which this chunk is ``[past length, past length + len(tokens))``; a text decoder takes none.
        """
        past = past if past is not None else self.empty_past()
        start = int(past[0].shape[2])
        n = len(tokens)
        feeds = self._chunk_inputs(tokens, start, prompt)
        feeds["attention_mask"] = np.ones((1, start + n), np.int64)
        if self.folder.keeps_logits:
            feeds[LOGITS_TO_KEEP] = np.array(n, np.int64) if every_position else _LAST_ONLY
        feeds.update(zip(self.past_names, past))
        outputs = self.session.run(["logits", *self.present_names], feeds)
        self.runs += 1
        if every_position:
            return np.asarray(outputs[0][0, -n:], np.float32), outputs[1:]
        return np.asarray(outputs[0][0, -1], np.float32), outputs[1:]

    def _chunk_inputs(self, tokens: Sequence[int], start: int, prompt: Any) -> dict[str, np.ndarray]:
        """The token and position inputs of a prefill chunk starting at cache index ``start``."""
        if prompt is not None:
            raise ValueError("a text decoder takes token ids only, not precomputed prompt inputs")
        n = len(tokens)
        feeds = {"input_ids": np.asarray(tokens, np.int64).reshape(1, n)}
        if self.folder.has_position_ids:
            feeds["position_ids"] = np.arange(start, start + n, dtype=np.int64).reshape(1, n)
        return feeds

    def _step_inputs(self, tokens: Sequence[int]) -> dict[str, np.ndarray]:
        """The token and position inputs of one decode step (one token per batch row)."""
        rows = len(tokens)
        feeds = {"input_ids": np.asarray(tokens, np.int64).reshape(rows, 1)}
        if self.folder.has_position_ids:
            feeds["position_ids"] = np.asarray(self.kv.positions(), np.int64).reshape(rows, 1)
        return feeds

    def decode(self, tokens: Sequence[int]) -> np.ndarray:
        """One step for every batch row (``tokens[i]`` for row ``i``); returns logits [rows, vocab]."""
        kv = self.kv
        rows = kv.rows
        assert len(tokens) == rows and rows > 0, "one token per batch row"
        binding = self._binding
        # In place, the KV and logits bindings depend on the row count only (the same OrtValues every
        # step): keep them and rebind just the small inputs. Ping-pong swaps buffers every step.
        kept = self._bound_rows == rows
        if not kept:
            binding.clear_binding_inputs()
            binding.clear_binding_outputs()
        for name, value in self._step_inputs(tokens).items():
            binding.bind_cpu_input(name, value)  # NOTE: binding a bound name again replaces it
        binding.bind_cpu_input("attention_mask", kv.attention_mask())
        if not kept:
            self._bind_outputs(rows)
        self.session.run_with_iobinding(binding)
        self.runs += 1
        kv.advance()
        if self._logits_fp16:
            return binding.copy_outputs_to_cpu()[-1][:, -1].astype(np.float32)
        return self._logits[:rows * self.folder.vocab_size].reshape(rows, self.folder.vocab_size)

    def _bind_outputs(self, rows: int) -> None:
        """Bind past, present and logits for ``rows`` rows; note them as kept when they stay valid."""
        binding = self._binding
        past, present = self.kv.bindings()
        for name, value in zip(self.past_names, past):
            binding.bind_ortvalue_input(name, value)
        for name, value in zip(self.present_names, present):
            binding.bind_ortvalue_output(name, value)
        if self._logits_fp16:
            binding.bind_output("logits", "cpu")
        else:
            from onnxruntime import OrtValue

            logits = self._logits[:rows * self.folder.vocab_size].reshape(rows, 1, self.folder.vocab_size)
            binding.bind_ortvalue_output("logits", OrtValue.ortvalue_from_numpy(logits))
        in_place = isinstance(self.kv, kv_inplace.InPlaceKV)
        self._bound_rows = rows if in_place and not self._logits_fp16 else None
