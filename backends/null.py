"""The ``null`` backend: answers at once with zeros of the declared output shapes.

A fake for scheduler, batcher and server tests that need no hardware and no
numeric work. Symbolic dimensions take the size of the first input dimension
of the same name (so a dynamic batch follows the feed), else 1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

import numpy as np

from backends.base import Availability, CompileOptions, ModelSource, TensorSpec
from backends.onnx_graph import graph_inputs, graph_outputs, load_onnx

if TYPE_CHECKING:
    import onnx


class NullBackend:
    name = "null"

    def __init__(self, *, cache_dir: object = None) -> None:
        del cache_dir

    def availability(self) -> Availability:
        return Availability.yes("no device (returns zeros)")

    def supports(self, node: "onnx.NodeProto", shapes: Mapping[str, TensorSpec]) -> bool:
        return True

    def compile(self, model: ModelSource, options: CompileOptions) -> "NullExecutable":
        proto = load_onnx(model)
        return NullExecutable(graph_inputs(proto), graph_outputs(proto))


class NullExecutable:
    def __init__(self, inputs: list[TensorSpec], outputs: list[TensorSpec]) -> None:
        self.inputs = inputs
        self.outputs = outputs
        self.runs = 0

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.runs += 1
        named: dict[str, int] = {}
        for spec in self.inputs:
            if spec.name in feeds:
                for dim, size in zip(spec.shape, feeds[spec.name].shape):
                    if isinstance(dim, str):
                        named.setdefault(dim, int(size))
        result = {}
        for spec in self.outputs:
            shape = [d if isinstance(d, int) else named.get(str(d), 1) for d in spec.shape]
            result[spec.name] = np.zeros(shape, dtype=spec.dtype)
        return result

    def close(self) -> None:
        pass
