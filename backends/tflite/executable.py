"""A compiled ``.tflite`` model: one LiteRT interpreter per variant, entry points, quantization.

Variants: ``"delegate"`` (the external delegate, XNNPACK for what it leaves)
when a delegate was accepted, and always ``"cpu"`` (XNNPACK). Both stay
compiled so a request can switch at no cost: ``run(feeds, variant="cpu")``.

Entry points: the primary subgraph, fed by tensor name (``inputs`` /
``outputs``), and each signature, fed by the signature's names
(``run(feeds, signature="name")``).

Thread safety: one lock per interpreter. A run holds its variant's lock from
the first ``set_tensor`` to the last ``get_tensor`` (LiteRT interpreters are
not re-entrant), so runs on one variant are serialised and runs on different
variants proceed in parallel (``invoke`` releases the GIL). Outputs are
copies, never views into interpreter memory.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from backends.base import TensorSpec
from backends.errors import BackendError, InvalidInputError
from backends.tflite.coverage import Coverage
from backends.tflite.delegates import DelegateStatus
from backends.tflite.quantization import QuantParams, dequantize, quant_params, quantize

VARIANT_DELEGATE = "delegate"
VARIANT_CPU = "cpu"


@dataclass(frozen=True)
class _Port:
    """One input or output of an entry point."""

    name: str
    index: int
    dtype: str
    shape: tuple[int, ...]  # -1 marks a dimension the model leaves open
    quant: QuantParams | None
    np_dtype: np.dtype = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "np_dtype", np.dtype(self.dtype))  # compared on every request

    def accepts(self, shape: tuple[int, ...]) -> bool:
        """Same rank, and every fixed dimension matches."""
        return len(shape) == len(self.shape) and all(d < 0 or d == got for d, got in zip(self.shape, shape))

    def spec(self, auto_quantize: bool) -> TensorSpec:
        dtype = "float32" if auto_quantize and self.quant is not None else self.dtype
        return TensorSpec(self.name, dtype, tuple(None if d < 0 else d for d in self.shape))


def ports(details: list[dict[str, Any]]) -> tuple[_Port, ...]:
    """Ports from LiteRT tensor details (``get_input_details()``-style dicts carrying "name")."""
    return tuple(_Port(d["name"], int(d["index"]), np.dtype(d["dtype"]).name,
                       tuple(int(x) for x in d.get("shape_signature", d["shape"])), quant_params(d))
                 for d in details)


Entry = tuple[tuple[_Port, ...], tuple[_Port, ...]]
"""Inputs and outputs of one entry point (the primary subgraph, or a signature)."""


@dataclass
class Variant:
    """An interpreter, its lock, its current input shapes and what XNNPACK took of it."""

    interpreter: Any
    xnnpack: Coverage
    lock: threading.Lock = field(default_factory=threading.Lock)
    shapes: dict[int, tuple[int, ...]] = field(default_factory=dict)  # current input shapes


class TFLiteExecutable:
    """The Executable of the ``tflite`` backend (see the module docstring).

    ``auto_quantize`` (default False): when True, float feeds for quantized
    inputs are quantized and quantized outputs are returned dequantized as
    float32; ``inputs``/``outputs`` then show those tensors as float32.

    ``delegate_status``: the delegate in use, else the last one that failed,
    else None (none requested); ``delegate_attempts`` lists every try.
    """

    def __init__(self, variants: dict[str, Variant], entries: dict[str | None, Entry],
                 delegate_attempts: tuple[DelegateStatus, ...], info: dict[str, Any],
                 auto_quantize: bool = False) -> None:
        self._variants = variants
        self._entries = entries
        self.variants = tuple(variants)
        self.default_variant = self.variants[0]
        self.signatures = tuple(name for name in entries if name is not None)
        self.delegate_attempts = delegate_attempts
        chosen = [s for s in delegate_attempts if s.loaded]
        self.delegate_status: DelegateStatus | None = (chosen or list(delegate_attempts[-1:]) or [None])[0]
        self.backend_nodes = {"tflite": int(info["total_nodes"])}
        # A loaded delegate takes the work off the CPU cores: the scheduler runs it as a GPU plan.
        loaded = self.delegate_status is not None and self.delegate_status.loaded
        self.device = "gpu" if loaded else "cpu"
        self.auto_quantize = auto_quantize
        self._info = info

    @property
    def inputs(self) -> list[TensorSpec]:
        return [port.spec(self.auto_quantize) for port in self._entries[None][0]]

    @property
    def outputs(self) -> list[TensorSpec]:
        return [port.spec(self.auto_quantize) for port in self._entries[None][1]]

    @property
    def quantization(self) -> dict[str, tuple[float, int]]:
        """``{tensor name: (scale, zero_point)}`` of the quantized primary inputs and outputs."""
        return {p.name: p.quant.as_tuple() for side in self._entries[None] for p in side if p.quant}

    @property
    def low_coverage(self) -> bool:
        """True when the delegate in use splits the model and takes under half of it (prefer ``cpu``)."""
        return self.delegate_status is not None and self.delegate_status.low_coverage

    def signature_specs(self, signature: str) -> tuple[list[TensorSpec], list[TensorSpec]]:
        """Input and output specs of one signature, by the signature's names."""
        inputs, outputs = self._entry(signature)
        return [p.spec(self.auto_quantize) for p in inputs], [p.spec(self.auto_quantize) for p in outputs]

    def run(self, feeds: Mapping[str, np.ndarray], variant: str | None = None,
            signature: str | None = None) -> dict[str, np.ndarray]:
        """Run once on ``variant`` (default: the delegate when loaded) through ``signature`` (default: primary).

        Raises InvalidInputError for a wrong name, dtype or shape (or unknown
        variant/signature), BackendError when LiteRT fails or after ``close``.
        """
        name = variant or self.default_variant
        if name not in self._variants:
            raise InvalidInputError(f"tflite: unknown variant {name!r}; this executable has {list(self.variants)}")
        inputs, outputs = self._entry(signature)
        values = self._prepare_feeds(feeds, inputs, signature)
        chosen = self._variants[name]
        with chosen.lock:
            if chosen.interpreter is None:
                raise BackendError("tflite: executable is closed")
            try:
                if signature is None:
                    raw = self._invoke_primary(chosen, inputs, outputs, values)
                else:
                    # NOTE: a SignatureRunner holds the interpreter's native wrapper, and LiteRT
                    # refuses to invoke while anyone else does: never keep one past the call.
                    runner = chosen.interpreter.get_signature_runner(signature)
                    raw = runner(**{p.name: v for p, v in zip(inputs, values)})
                    del runner
            except (RuntimeError, ValueError) as exc:
                raise BackendError(f"tflite: {name} interpreter failed: {exc}") from exc
        if not self.auto_quantize:
            return {p.name: raw[p.name] for p in outputs}
        return {p.name: dequantize(raw[p.name], p.quant) if p.quant else raw[p.name] for p in outputs}

    def _entry(self, signature: str | None) -> Entry:
        if signature not in self._entries:
            raise InvalidInputError(f"tflite: unknown signature {signature!r}; the model has {list(self.signatures)}")
        return self._entries[signature]

    def _prepare_feeds(self, feeds: Mapping[str, np.ndarray], inputs: tuple[_Port, ...],
                       signature: str | None) -> list[np.ndarray]:
        values = []
        for port in inputs:
            value = feeds.get(port.name)
            if value is None:
                _check_names(feeds, inputs, signature)
                raise InvalidInputError(f"tflite: {_where(signature)} input {port.name!r} is missing")
            value = np.asarray(value)
            if self.auto_quantize and port.quant is not None and value.dtype.kind == "f":
                value = quantize(value, port.quant)
            # Checks compare dtype and shape objects: this runs on every request.
            if value.dtype != port.np_dtype:
                hint = (f" (quantized scale={port.quant.scale:g} zero_point={port.quant.zero_point}; "
                        "set auto_quantize to pass floats)") if port.quant else ""
                raise InvalidInputError(f"tflite: input {port.name!r}: expected dtype {port.dtype}{hint}, "
                                        f"got {value.dtype}")
            if value.shape != port.shape and not port.accepts(value.shape):
                expected = [None if d < 0 else d for d in port.shape]
                raise InvalidInputError(f"tflite: input {port.name!r}: expected shape {expected}, "
                                        f"got {list(value.shape)}")
            values.append(value)
        if len(feeds) > len(inputs):
            _check_names(feeds, inputs, signature)
        return values

    @staticmethod
    def _invoke_primary(variant: Variant, inputs: tuple[_Port, ...], outputs: tuple[_Port, ...],
                        values: list[np.ndarray]) -> dict[str, np.ndarray]:
        interpreter = variant.interpreter
        resized = False
        for port, value in zip(inputs, values):
            if variant.shapes[port.index] != value.shape:
                interpreter.resize_tensor_input(port.index, value.shape)
                variant.shapes[port.index] = value.shape
                resized = True
        if resized:
            interpreter.allocate_tensors()
        for port, value in zip(inputs, values):
            interpreter.set_tensor(port.index, value)
        interpreter.invoke()
        return {port.name: interpreter.get_tensor(port.index) for port in outputs}

    def describe(self) -> dict[str, Any]:
        status = self.delegate_status
        return {**self._info, "backend": "tflite", "variants": list(self.variants),
                "default_variant": self.default_variant, "auto_quantize": self.auto_quantize,
                "signatures": {name: {"inputs": [p.name for p in self._entries[name][0]],
                                      "outputs": [p.name for p in self._entries[name][1]]}
                               for name in self.signatures},
                "quantization": {name: list(q) for name, q in self.quantization.items()},
                "delegate": status.to_dict() if status else None,
                "delegate_attempts": [s.to_dict() for s in self.delegate_attempts],
                "low_coverage": self.low_coverage,
                "xnnpack": {name: v.xnnpack.to_dict() for name, v in self._variants.items()}}

    def close(self) -> None:
        for variant in self._variants.values():
            with variant.lock:
                variant.interpreter = None


def _where(signature: str | None) -> str:
    return f"signature {signature!r}" if signature else "model"


def _check_names(feeds: Mapping[str, np.ndarray], inputs: tuple[_Port, ...], signature: str | None) -> None:
    unknown = sorted(set(feeds) - {p.name for p in inputs})
    if unknown:
        raise InvalidInputError(f"tflite: {_where(signature)} has no input(s) {unknown}; "
                                f"inputs are {[p.name for p in inputs]}")
