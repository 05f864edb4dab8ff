"""The ``cpu`` backend: ONNX Runtime's CPU execution provider (XNNPACK first where built in).

The graph-optimised model is written to the cache directory on first load,
keyed on the model bytes, the ORT version and the caller's device key, so the
next load reads the optimised graph and skips optimisation.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from backends.base import Availability, CompileOptions, ModelSource, TensorSpec
from backends.errors import BackendError, ModelLoadError
from backends.onnx_graph import graph_inputs, graph_outputs, load_onnx

if TYPE_CHECKING:
    import numpy as np
    import onnx
    import onnxruntime

log = logging.getLogger(__name__)

# Domains whose operators ONNX Runtime's CPU provider implements.
_ORT_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft"})


class CPUBackend:
    """ONNX Runtime on the CPU; takes any standard ONNX node."""

    name = "cpu"

    def __init__(self, *, cache_dir: Path | None = None) -> None:
        # The optimised-model cache location comes per compile (CompileOptions.cache_dir).
        del cache_dir

    def availability(self) -> Availability:
        try:
            import onnxruntime
        except ImportError as exc:
            return Availability.no(f"onnxruntime is not importable: {exc}")
        providers = onnxruntime.get_available_providers()
        device = "XNNPACK" if "XnnpackExecutionProvider" in providers else "ORT CPU"
        return Availability.yes(f"{device} (onnxruntime {onnxruntime.__version__})")

    def supports(self, node: "onnx.NodeProto", shapes: Mapping[str, TensorSpec]) -> bool:
        return node.domain in _ORT_DOMAINS

    def compile(self, model: ModelSource, options: CompileOptions) -> "CPUExecutable":
        import onnxruntime as ort

        proto = load_onnx(model)
        model_bytes = proto.SerializeToString()
        sess_options = ort.SessionOptions()
        sess_options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        sess_options.inter_op_num_threads = 1
        sess_options.add_session_config_entry("session.intra_op.allow_spinning",
                                              "1" if options.allow_spinning else "0")
        if options.allow_spinning:
            if options.spin_only_in_runs:
                sess_options.add_session_config_entry("session.force_spinning_stop", "1")
            if options.spin_duration_us > 0:
                sess_options.add_session_config_entry("session.intra_op.spin_duration_us",
                                                      str(int(options.spin_duration_us)))
        if options.intra_op_threads:
            sess_options.intra_op_num_threads = options.intra_op_threads
        source: bytes | str = model_bytes
        cached = _cached_model_path(model_bytes, options, ort.__version__)
        if cached is not None and cached.is_file():
            log.debug("cpu: loading optimised model from cache %s", cached)
            source = str(cached)
            # The cached graph is already optimised: do not pay for it again.
            sess_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        else:
            sess_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            if cached is not None and not _writable_dir(cached.parent):
                cached = None  # an unwritable cache costs the warm start, never the load
            if cached is not None:
                sess_options.optimized_model_filepath = str(cached)
                # ORT warns that the saved graph may hold hardware-specific (NCHWc) nodes; the
                # cache key includes the device fingerprint, so that is intended. Errors still show.
                sess_options.log_severity_level = 3
        providers = ["CPUExecutionProvider"]
        if "XnnpackExecutionProvider" in ort.get_available_providers():
            providers.insert(0, "XnnpackExecutionProvider")
        try:
            session = ort.InferenceSession(source, sess_options, providers=providers)
        except Exception as exc:  # ORT raises its own Fail/InvalidGraph/... types
            if source is not model_bytes and cached is not None:
                # NOTE: a stale or truncated cache entry must never block a load.
                log.warning("cpu: cached model %s unusable (%s); rebuilding", cached, exc)
                _discard(cached)
                return self.compile(proto, options)
            if cached is not None:
                # ORT failed while writing the optimised graph (disk full, a read-only file):
                # load once more without the cache before calling the model broken.
                log.warning("cpu: cannot write optimised model cache %s (%s); loading without it", cached, exc)
                _discard(cached)
                return self.compile(proto, dataclasses.replace(options, cache_dir=None))
            raise ModelLoadError(f"onnxruntime cannot load model: {exc}") from exc
        return CPUExecutable(session, graph_inputs(proto), graph_outputs(proto),
                             from_cache=source is not model_bytes)


def _writable_dir(directory: Path) -> bool:
    """Create ``directory`` if needed; False (with a warning) when it cannot be written."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".probe-"):
            pass
    except OSError as exc:
        log.warning("cpu: optimised-model cache %s is not writable (%s); loading without it", directory, exc)
        return False
    return True


def _discard(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        log.warning("cpu: cannot delete cache entry %s: %s", path, exc)


def _cached_model_path(model_bytes: bytes, options: CompileOptions, ort_version: str) -> Path | None:
    if options.cache_dir is None:
        return None
    digest = hashlib.sha256(model_bytes)
    digest.update(f"|ort={ort_version}|threads={options.intra_op_threads}|{options.cache_key_extra}".encode())
    return Path(options.cache_dir) / "cpu" / f"{digest.hexdigest()[:32]}.onnx"


class CPUExecutable:
    """An ``onnxruntime.InferenceSession`` behind the Executable contract."""

    def __init__(self, session: "onnxruntime.InferenceSession", inputs: list[TensorSpec],
                 outputs: list[TensorSpec], from_cache: bool) -> None:
        self._session: onnxruntime.InferenceSession | None = session
        self.inputs = inputs
        self.outputs = outputs
        self.from_cache = from_cache
        self._output_names = [spec.name for spec in outputs]
        self.thread_safe = True  # InferenceSession.run may be called concurrently

    def run(self, feeds: Mapping[str, "np.ndarray"]) -> dict[str, "np.ndarray"]:
        if self._session is None:
            raise BackendError("cpu: executable is closed")
        try:
            values = self._session.run(self._output_names, dict(feeds))
        except Exception as exc:  # ORT's runtime errors have no common base we can name
            raise BackendError(f"cpu: onnxruntime run failed: {exc}") from exc
        return dict(zip(self._output_names, values))

    def describe(self) -> dict[str, object]:
        assert self._session is not None
        return {"backend": "cpu", "providers": self._session.get_providers(),
                "optimised_model_from_cache": self.from_cache}

    def close(self) -> None:
        self._session = None
