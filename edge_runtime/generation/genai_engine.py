"""onnxruntime-genai folders (``genai_config.json``): generation through ``onnxruntime_genai``.

Optional (the ``genai`` extra). genai owns the model and its KV cache; we keep
the rest — chat template, sampling (from genai's logits, so every OpenAI
parameter means the same as on the ORT engine), detokenisation, stop strings,
cancellation — by driving one ``og.Generator`` per sequence: append the prompt,
read the logits, choose, append the token. ``GenaiBatcher`` has the
``ContinuousBatcher`` interface but runs one sequence at a time (genai's
batching is static: a batch starts and ends together), so concurrent requests
queue. ``genai_config_for`` describes an ``optimum`` folder in genai's format.

A VLM folder (``genai_config.json`` with a ``model.vision`` section) runs the same way,
except that each prompt goes in through ``generator.set_inputs``: the named tensors
``genai_vision.GenaiVisionPrompter`` built (images, grids, our prompt ids), or just the
ids for a text-only prompt (genai's multimodal pipeline always takes that route).
"""

from __future__ import annotations

import collections
import json
import logging
import threading
from pathlib import Path
from typing import Any, Callable

import numpy as np

from edge_runtime.errors import InvalidInputError, ModelLoadError, QueueFullError
from edge_runtime.generation.batcher import BatcherStats
from edge_runtime.generation.folder import GENAI_CONFIG, DecoderFolder, KVLayout
from edge_runtime.generation.sampling import SamplingParams
from edge_runtime.generation.sequence import Sequence, Sink, new_token_room
from edge_runtime.generation.settings import GenerationSettings

log = logging.getLogger(__name__)


def read_genai_folder(folder: Path) -> DecoderFolder:
    """Describe a genai folder from its ``genai_config.json``; ModelLoadError when unusable."""
    folder = Path(folder)
    try:
        config = json.loads((folder / GENAI_CONFIG).read_text(encoding="utf-8"))["model"]
        decoder = config["decoder"]
        eos = config.get("eos_token_id", [])
        model_path = folder / decoder.get("filename", "model.onnx")
        # genai's exports keep weights beside the graph as "<filename>.data": every file named after it,
        # for each graph (a VLM's vision and embedding graphs too)
        graphs = [model_path.name] + [part["filename"] for part in config.values()
                                      if isinstance(part, dict) and isinstance(part.get("filename"), str)]
        weights = tuple(sorted({p for p in folder.iterdir() if p.is_file()
                                and any(p.name.startswith(name) for name in graphs)}))
        return DecoderFolder(folder, model_path,
                             KVLayout(int(decoder["num_hidden_layers"]), int(decoder["num_key_value_heads"]),
                                      int(decoder["head_size"]), np.float32),
                             int(config["vocab_size"]), int(config["context_length"]),
                             tuple(int(e) for e in (eos if isinstance(eos, list) else [eos])),
                             "position_ids" in decoder.get("inputs", {}), str(config.get("type", "")), weights)
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"{folder / GENAI_CONFIG}: not a usable genai config ({exc})") from None


def genai_config_for(description: DecoderFolder, threads: int) -> dict[str, Any]:
    """genai's config for an optimum export (``past`` and ``present`` separate buffers)."""
    kv = description.kv
    inputs = {"input_ids": "input_ids", "attention_mask": "attention_mask",
              "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"}
    if description.has_position_ids:
        inputs["position_ids"] = "position_ids"
    return {"model": {
        "type": description.model_type or "qwen2", "context_length": description.context_length,
        "vocab_size": description.vocab_size, "eos_token_id": list(description.eos_token_ids),
        "pad_token_id": description.eos_token_ids[0] if description.eos_token_ids else 0,
        "bos_token_id": description.eos_token_ids[-1] if description.eos_token_ids else 0,
        "decoder": {"filename": description.model_path.name, "head_size": kv.head_dim,
                    "hidden_size": kv.head_dim * kv.kv_heads, "num_attention_heads": kv.kv_heads,
                    "num_hidden_layers": kv.layers, "num_key_value_heads": kv.kv_heads,
                    "session_options": {"intra_op_num_threads": threads, "inter_op_num_threads": 1},
                    "inputs": inputs, "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                                                  "present_value_names": "present.%d.value"}}},
        "search": {"past_present_share_buffer": False, "do_sample": False, "max_length": description.context_length}}


class GenaiBatcher:
    """Runs sequences through onnxruntime-genai one at a time on its own thread."""

    def __init__(self, folder: DecoderFolder, settings: GenerationSettings, decode: Callable) -> None:
        from edge_runtime.generation.genai_vision import genai_vision_section

        try:
            import onnxruntime_genai as og
        except ImportError as exc:
            raise ModelLoadError(f"{folder.path} is an onnxruntime-genai folder; install the 'genai' extra "
                                 f"(pip install onnxruntime-genai): {exc}") from None
        self.og = self._og = og
        try:
            self.model = og.Model(str(folder.path))
        except Exception as exc:  # genai raises RuntimeError for every load problem
            raise ModelLoadError(f"{folder.path}: onnxruntime-genai cannot load it ({exc})") from None
        config = json.loads((folder.path / GENAI_CONFIG).read_text(encoding="utf-8"))
        self.vision = genai_vision_section(config)  # a VLM: prompts go in through set_inputs
        self.settings = settings
        self.eos = frozenset(folder.eos_token_ids)
        self._decode = decode
        self.max_len = min(folder.context_length, settings.max_seq_len)
        self.model_context = folder.context_length
        self.budget_tokens = self.max_len
        self._queue: collections.deque[Sequence] = collections.deque()
        self._current: Sequence | None = None
        self._wake = threading.Condition()
        self._stopping = False
        self._generated = self._prefill = self._steps = 0
        self._thread = threading.Thread(target=self._loop, name="edge-runtime-genai", daemon=True)

    def submit(self, prompt: list[int], params: SamplingParams, sink: Sink, *, inputs: Any = None,
               cache_key: list[int] | None = None) -> Sequence:
        """Queue one prompt; ``inputs``: a VLM prompt's named tensors (``genai_vision``);
        ``cache_key`` is ignored (genai keeps no prefix cache of ours)."""
        if params.prompt_logprobs is not None:
            raise InvalidInputError("'prompt_logprobs' is not supported by models onnxruntime-genai runs (it gives "
                                    "no logits of prompt positions)")
        room = new_token_room(len(prompt), params.max_tokens, self.max_len, self.model_context)
        sequence = Sequence(list(prompt), params, params.max_tokens or room, self.eos, self._decode, sink)
        sequence.inputs = inputs
        with self._wake:
            if self._stopping or len(self._queue) >= self.settings.max_queue:
                raise QueueFullError(f"generation queue full: {len(self._queue)} requests waiting "
                                     f"(max_queue {self.settings.max_queue}); retry later")
            self._queue.append(sequence)
            self._wake.notify()
        return sequence

    def cancel(self, sequence: Sequence) -> None:
        sequence.cancelled.set()

    @property
    def pending(self) -> int:
        with self._wake:
            return len(self._queue) + (self._current is not None)

    def stats(self) -> BatcherStats:
        with self._wake:
            running = int(self._current is not None)
            return BatcherStats(len(self._queue), 0, running, 0, self.budget_tokens, self._steps, self._generated,
                                self._prefill, None, None)

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout_s: float = 10.0) -> None:
        with self._wake:
            self._stopping = True
            for sequence in self._queue:
                sequence.cancelled.set()
            self._wake.notify()
        self._thread.join(timeout=max(1.0, timeout_s))

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._queue:
                    if self._stopping:
                        return
                    self._wake.wait()
                self._current = sequence = self._queue.popleft()
            try:
                self._run(sequence)
            except Exception as exc:  # one failing sequence must not end the loop
                log.exception("onnxruntime-genai generation failed")
                sequence.finish("error", exc)
            finally:
                with self._wake:
                    self._current = None

    def _run(self, sequence: Sequence) -> None:
        if sequence.cancelled.is_set():
            sequence.finish("cancelled")
            return
        og = self._og
        params = og.GeneratorParams(self.model)
        params.set_search_options(max_length=len(sequence.prompt) + sequence.max_new, do_sample=False)
        generator = og.Generator(self.model, params)
        if self.vision is not None:
            named = sequence.inputs if sequence.inputs is not None else og.NamedTensors()
            named["input_ids"] = np.asarray([sequence.prompt], np.int32)
            sequence.inputs = None  # pixel buffers are not needed past the prefill
            generator.set_inputs(named)  # vision, embedding (splice) and the prompt's prefill
        else:
            generator.append_tokens(np.asarray([sequence.prompt], np.int32))
        self._prefill += len(sequence.prompt)
        while True:
            if sequence.cancelled.is_set():
                sequence.finish("cancelled")
                return
            logits = np.asarray(generator.get_logits(), np.float32).reshape(-1)
            self._steps += 1
            self._generated += 1
            if sequence.accept(logits):
                return
            generator.append_tokens(np.asarray([[sequence.generated[-1]]], np.int32))
