"""``NcnnExecutable``: a model converted per input-shape bucket, gated, looped over the batch.

Dynamic input sizes go through **shape buckets**: pnnx bakes the input shape
into Reshape/Slice parameters (a PP-OCR rec model converted at width 320 is
wrong, or crashes, at width 96), so each distinct per-sample input shape gets
its own conversion (cached on disk, see ``convert``) and its own gate run.
A shape whose conversion fails or is refused by the gate runs on ONNX
Runtime instead, logged once and reported in ``describe()["on_onnxruntime"]``:
never served wrong, never silent. At most ``MAX_LOADED_BUCKETS`` nets stay
in memory (least recently used dropped; their conversions stay on disk).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from backends.base import TensorSpec
from backends.errors import BackendError, BackendUnavailableError, ModelLoadError
from backends.ncnn import gate
from backends.ncnn.convert import cached_or_convert
from backends.ncnn.net import NetOptions, load_net, run_sample

if TYPE_CHECKING:
    import ncnn
    import onnxruntime

log = logging.getLogger(__name__)

MAX_LOADED_BUCKETS = 16
ShapeKey = tuple[tuple[int, ...], ...]  # per-sample shape of every input (batch axis dropped)


@dataclass
class Bucket:
    """A loaded, gated ncnn net for one ShapeKey, with ORT's per-sample output shapes."""

    net: "ncnn.Net"
    output_shapes: tuple[tuple[int, ...], ...]
    gate: gate.GateResult
    converted_now: bool
    folder: Path


class NcnnExecutable:
    """The Executable contract over ncnn; see the module docstring."""

    def __init__(self, backend: str, model_bytes: bytes, inputs: list[TensorSpec], outputs: list[TensorSpec],
                 options: NetOptions, cache_dir: Path) -> None:
        self.backend = backend
        self.inputs = inputs
        self.outputs = outputs
        self.options = options
        self._model_bytes = model_bytes
        self._cache_dir = cache_dir
        self._buckets: OrderedDict[ShapeKey, Bucket] = OrderedDict()
        self._refused: dict[ShapeKey, str] = {}
        self._reference: onnxruntime.InferenceSession | None = None
        self._lock = threading.Lock()
        self._closed = False
        # Extractors of one CPU net run concurrently; a Vulkan queue is safer one call at a time.
        self.thread_safe = options.vulkan_device is None

    # -- buckets ---------------------------------------------------------------------
    def prepare(self, key: ShapeKey) -> Bucket:
        """Convert (or load from cache), load and gate the net for ``key``; raise on any failure."""
        with self._lock:
            if key in self._buckets:
                return self._buckets[key]
            shapes = [(1, *s) for s in key]
            conversion = cached_or_convert(self._model_bytes, shapes, self._cache_dir, self.options.precision)
            net = load_net(conversion.param, conversion.bin, self.options)
            try:
                samples = gate.seeded_samples(shapes)
                want = self.reference().run([o.name for o in self.outputs],
                                            {spec.name: x for spec, x in zip(self.inputs, samples)})
                try:
                    got = run_sample(net, [x[0] for x in samples], len(self.outputs))
                except BackendError as exc:
                    raise gate.ConversionRefusedError(f"ncnn: converted model refused for input shape {shapes}: "
                                                      f"it fails on the seeded input: {exc}") from exc
                got = [g.reshape(w.shape) if g.size == w.size else g for g, w in zip(got, want)]
                result = gate.check([o.name for o in self.outputs], got, want, self.options.precision,
                                    f"input shape {shapes}")
            except Exception:
                del net
                raise
            log.info("ncnn: %s gate passed at %s (worst error %.2g)", self.backend, shapes, result.worst)
            bucket = Bucket(net, tuple(tuple(s[1:]) for s in result.output_shapes), result,
                            conversion.converted_now, conversion.folder)
            self._buckets[key] = bucket
            while len(self._buckets) > MAX_LOADED_BUCKETS:
                dropped, _ = self._buckets.popitem(last=False)
                log.info("ncnn: %s unloads the net for %s (more than %d shapes in use)", self.backend, dropped,
                         MAX_LOADED_BUCKETS)
            return bucket

    def reference(self) -> "onnxruntime.InferenceSession":
        """ONNX Runtime on the original model: the gate's oracle and the refused shapes' engine."""
        if self._reference is None:
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.intra_op_num_threads = self.options.threads
            self._reference = ort.InferenceSession(self._model_bytes, options, providers=["CPUExecutionProvider"])
        return self._reference

    # -- running -----------------------------------------------------------------------
    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._closed:
            raise BackendError(f"{self.backend}: executable is closed")
        arrays = [np.asarray(feeds[spec.name]) for spec in self.inputs]
        batch = {a.shape[0] if a.ndim else 1 for a in arrays}
        if len(batch) != 1 or any(a.ndim == 0 for a in arrays):
            raise BackendError(f"{self.backend}: every input needs the same batch axis, got shapes "
                               f"{[a.shape for a in arrays]}")
        key: ShapeKey = tuple(tuple(int(d) for d in a.shape[1:]) for a in arrays)
        bucket = self._bucket(key)
        if bucket is None:
            return self._on_reference(feeds)
        per_sample: list[list[np.ndarray]] = [[] for _ in self.outputs]
        for b in range(batch.pop()):
            values = run_sample(bucket.net, [a[b] for a in arrays], len(self.outputs))
            for k, (value, shape) in enumerate(zip(values, bucket.output_shapes)):
                if value.size != int(np.prod(shape)):
                    raise BackendError(f"{self.backend}: output {self.outputs[k].name} has {value.size} "
                                       f"elements, expected shape {shape}")
                per_sample[k].append(value.reshape(shape))
        return {spec.name: np.stack(parts).astype(_dtype(spec), copy=False)
                for spec, parts in zip(self.outputs, per_sample)}

    def _bucket(self, key: ShapeKey) -> Bucket | None:
        bucket = self._buckets.get(key)
        if bucket is not None:
            try:
                self._buckets.move_to_end(key)
            except KeyError:  # unloaded by another thread meanwhile; this call keeps its reference
                pass
            return bucket
        if key in self._refused:
            return None
        try:
            return self.prepare(key)
        except (ModelLoadError, BackendUnavailableError) as exc:
            self._refused[key] = f"{type(exc).__name__}: {exc}"
            log.warning("%s: input shape %s stays on onnxruntime: %s", self.backend, key, exc)
            return None

    def _on_reference(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [o.name for o in self.outputs]
        with self._lock:  # the session is created under the lock the gate also takes
            session = self.reference()
        return dict(zip(names, session.run(names, {s.name: feeds[s.name] for s in self.inputs})))

    def describe(self) -> dict[str, Any]:
        return {"backend": self.backend, "precision": self.options.precision, "threads": self.options.threads,
                "vulkan_device": self.options.vulkan_device,
                "buckets": [{"input_shapes": [list(s) for s in key], "worst_error": b.gate.worst,
                             "converted_now": b.converted_now, "folder": str(b.folder)}
                            for key, b in self._buckets.items()],
                "on_onnxruntime": [{"input_shapes": [list(s) for s in key], "reason": why}
                                   for key, why in self._refused.items()]}

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._buckets.clear()  # ncnn.Net frees its blobs (and Vulkan buffers) when dropped
            self._reference = None


def _dtype(spec: TensorSpec) -> np.dtype:
    try:
        return np.dtype(spec.dtype)
    except TypeError:
        return np.dtype(np.float32)
