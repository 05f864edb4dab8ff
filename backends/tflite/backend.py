"""The ``tflite`` backend: ``.tflite`` files on the LiteRT interpreter, with external delegates.

``compile`` builds a CPU interpreter (XNNPACK) and, for the first delegate in
``CompileOptions.delegates`` that loads and is accepted, a second interpreter
with that delegate (the list is a preference order; later entries are not
tried once one works). Every failed attempt is reported in
``executable.delegate_attempts``; the model still runs on the CPU.

NOTE: an external delegate is applied before XNNPACK and all remaining nodes
are then prepared by the builtin kernels, so a custom op that only XNNPACK
implements (mediapipe's ``Convolution2DTransposeBias``) makes every external
delegate fail for that model: the CPU variant still runs it, and the status
says "unresolved custom op".
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from backends.base import Availability, CompileOptions, DelegateSpec, ModelSource, TensorSpec
from backends.errors import BackendUnavailableError, ModelLoadError, ModelNotFoundError
from backends.tflite import delegates
from backends.tflite.coverage import delegate_coverage, node_count
from backends.tflite.executable import VARIANT_CPU, VARIANT_DELEGATE, Entry, TFLiteExecutable, Variant, ports
from backends.tflite.runtime import interpreter_module, runtime_description

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

_IDENTIFIER = b"TFL3"  # flatbuffer file identifier, bytes 4..8 of every .tflite file


class TFLiteBackend:
    """LiteRT (``ai_edge_litert``, else ``tflite_runtime``); takes ``.tflite`` models, no ONNX nodes."""

    name = "tflite"

    def __init__(self, *, cache_dir: Path | None = None) -> None:
        self._cache_dir = cache_dir

    def availability(self) -> Availability:
        try:
            interpreter_module()
        except BackendUnavailableError as exc:
            return Availability.no(str(exc))
        return Availability.yes("CPU (XNNPACK) + external delegates", runtime_description())

    def supports(self, node: "onnx.NodeProto", shapes: Mapping[str, TensorSpec]) -> bool:
        """Always False: this backend runs whole ``.tflite`` files, never ONNX nodes."""
        return False

    def compile(self, model: ModelSource | bytes, options: CompileOptions) -> TFLiteExecutable:
        """Compile a ``.tflite`` file (path or bytes).

        Raises ModelNotFoundError (no such file), ModelLoadError (not a TFLite
        model, or LiteRT rejects it), BackendUnavailableError (no LiteRT).
        Delegate problems never raise: see ``executable.delegate_status``.
        """
        litert = interpreter_module()
        model_bytes = read_model(model)
        threads = options.intra_op_threads or _usable_cores()
        try:
            cpu = litert.Interpreter(model_content=model_bytes, num_threads=threads)
            total_nodes = node_count(cpu)
            cpu.allocate_tensors()
        except (ValueError, RuntimeError) as exc:
            raise ModelLoadError(f"tflite: LiteRT cannot load the model: {' '.join(str(exc).split())}") from exc
        variants = {VARIANT_CPU: _variant(cpu, total_nodes, total_nodes)}
        cache_dir = options.cache_dir if options.cache_dir is not None else self._cache_dir
        attempts: list[delegates.DelegateStatus] = []
        for spec in options.delegates:
            status, interpreter, first_xnnpack_node = _with_delegate(
                litert, spec, model_bytes, threads, total_nodes, cache_dir, options.cache_key_extra)
            attempts.append(status)
            if interpreter is not None:
                variants = {VARIANT_DELEGATE: _variant(interpreter, total_nodes, first_xnnpack_node), **variants}
                break
        entries: dict[str | None, Entry] = {None: (ports(cpu.get_input_details()), ports(cpu.get_output_details()))}
        entries.update((signature, _signature_entry(cpu, signature)) for signature in cpu.get_signature_list())
        info = {"runtime": runtime_description(), "threads": threads, "model_bytes": len(model_bytes),
                "total_nodes": total_nodes}
        return TFLiteExecutable(variants, entries, tuple(attempts), info)


def read_model(model: ModelSource | bytes) -> bytes:
    """The bytes of a ``.tflite`` model given as a path or as bytes; checks the TFLite identifier."""
    if isinstance(model, (bytes, bytearray, memoryview)):
        data, where = bytes(model), "model bytes"
    elif isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise ModelNotFoundError(f"tflite: no model file {path}")
        data, where = path.read_bytes(), str(path)
    else:
        raise ModelLoadError(f"tflite: takes a .tflite path or bytes, not {type(model).__name__} "
                             "(ONNX models go to the other backends)")
    if data[4:8] != _IDENTIFIER:
        raise ModelLoadError(f"tflite: {where} is not a TFLite flatbuffer "
                             f"(identifier {data[4:8]!r}, expected {_IDENTIFIER!r})")
    return data


def _signature_entry(interpreter: Any, signature: str) -> Entry:
    """Ports of one signature, named by the signature's own input/output names."""
    # NOTE: the runner must die with this call: while it lives, the interpreter refuses to invoke.
    runner = interpreter.get_signature_runner(signature)
    inputs, outputs = runner.get_input_details(), runner.get_output_details()
    return (ports([{**d, "name": name} for name, d in inputs.items()]),
            ports([{**d, "name": name} for name, d in outputs.items()]))


def _variant(interpreter: Any, total_nodes: int, first_xnnpack_node: int) -> Variant:
    xnnpack = delegate_coverage(interpreter, total_nodes, first_xnnpack_node, node_count(interpreter))
    shapes = {int(d["index"]): tuple(int(x) for x in d["shape"]) for d in interpreter.get_input_details()}
    return Variant(interpreter, xnnpack, shapes=shapes)


def _with_delegate(litert: Any, spec: DelegateSpec, model_bytes: bytes, threads: int, total_nodes: int,
                   cache_dir: Path | None, cache_key_extra: str
                   ) -> tuple[delegates.DelegateStatus, Any | None, int]:
    """Try one delegate: (status, interpreter or None, index of the first XNNPACK node)."""
    options = delegates.delegate_options(spec, model_bytes, cache_dir, cache_key_extra)
    delegate, error = delegates.load_delegate(litert, spec.library, options)
    if delegate is None:
        return delegates.failed(spec.library, error, options, total_nodes), None, 0
    try:
        # The delegate's Prepare runs in the constructor; XNNPACK follows at allocate_tensors.
        interpreter = litert.Interpreter(model_content=model_bytes, num_threads=threads,
                                         experimental_delegates=[delegate])
        delegate_end = node_count(interpreter)
        interpreter.allocate_tensors()
    except (RuntimeError, ValueError) as exc:
        reason = f"delegate rejected the model (Prepare failed): {type(exc).__name__}: {' '.join(str(exc).split())}"
        return delegates.failed(spec.library, reason, options, total_nodes), None, 0
    coverage = delegate_coverage(interpreter, total_nodes, total_nodes, delegate_end)
    log.info("tflite: delegate %s took %d/%d nodes in %d partition(s)", spec.library,
             coverage.nodes_delegated, coverage.total_nodes, coverage.partitions)
    status = delegates.DelegateStatus(spec.library, True, "", coverage, tuple(options.items()))
    return status, interpreter, delegate_end


def _usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)
