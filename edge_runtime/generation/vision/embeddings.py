"""Token ids → the decoder's input embeddings (``embed_tokens``), for prompts and for every decode step.

When ``embed_tokens`` is a plain ``Gather`` of an initializer by ``input_ids``
(what the fp32/fp16 exports are), or a ``GatherBlockQuantized`` of 4- or 8-bit
blocks along the hidden axis without zero points (what ``convert --quantize``
writes), its table is read once into numpy —
memory-mapped from the external-data file when it lives there, so the
weights stay in the page cache rather than in a private copy — and a lookup
is a numpy take: no ONNX Runtime call per decode step (a session run costs
tens of microseconds of overhead for a few-kilobyte result), and nothing to
serialise between the batcher thread and the threads preparing prompts; a
quantized table's rows are dequantized as the op's contract says, when taken. A ``Pad`` of zero
columns after either (Qwen3-VL's widened rows) is appended in numpy.
Any other graph (zero points, a scale ``Mul``) runs in an ONNX Runtime session,
which is thread-safe.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from edge_runtime.errors import InvalidInputError, ModelLoadError

log = logging.getLogger(__name__)


class QuantizedTable:
    """A [vocab, hidden] table as ``GatherBlockQuantized`` stores it — uint8 ``packed`` rows (two 4-bit
    values a byte, the low first, or one 8-bit), one ``scales`` entry per ``block`` values of a row, no
    zero points (so 2**(bits-1)) — whose rows are dequantized when taken: ``table[ids]``."""

    def __init__(self, packed: np.ndarray, scales: np.ndarray, bits: int, block: int) -> None:
        self.packed, self.scales, self.bits, self.block = packed, scales, bits, block
        self.shape = (int(packed.shape[0]), int(scales.shape[1]) * block)

    def __getitem__(self, index: np.ndarray) -> np.ndarray:
        rows = np.asarray(self.packed[index])
        if self.bits == 4:
            rows = np.stack([rows & 0x0F, rows >> 4], axis=-1)
        values = rows.reshape(len(rows), -1, self.block).astype(np.float32) - 2 ** (self.bits - 1)
        return (values * np.asarray(self.scales[index], np.float32)[..., None]).reshape(len(rows), -1)


def gather_table(path: Path) -> np.ndarray | QuantizedTable | PaddedTable | None:
    """The [vocab, hidden] table when ``path`` is exactly ``inputs_embeds = Gather(table, input_ids)``
    (axis 0, an optional Identity after it) or the ``GatherBlockQuantized`` form above, either one
    optionally followed by a ``Pad`` of zero columns (Qwen3-VL's widened embeddings: ``PaddedTable``),
    else None."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    graph = proto.graph
    nodes = [n for n in graph.node if n.op_type != "Identity"]
    pad = nodes.pop() if len(nodes) == 2 and nodes[1].op_type == "Pad" else None
    if len(nodes) != 1 or nodes[0].op_type not in ("Gather", "GatherBlockQuantized") or \
            len(graph.node) > 2 + (pad is not None):
        return None
    gather = nodes[0]
    tables = {t.name: t for t in graph.initializer}
    if gather.input[0] not in tables or gather.input[1] != "input_ids":
        return None
    if not _output_is_embeds(graph, gather if pad is None else pad):
        return None
    extra = 0 if pad is None else _zero_columns(path, pad, gather, tables)
    if extra is None:
        return None
    if gather.op_type == "GatherBlockQuantized":
        table = _quantized_table(path, gather, tables)
    else:
        tensor = tables[gather.input[0]]
        axis = next((a.i for a in gather.attribute if a.name == "axis"), 0)
        table = _array(path, tensor) if axis == 0 and len(tensor.dims) == 2 else None
    return PaddedTable(table, extra) if table is not None and extra else table


class PaddedTable:
    """A table whose rows are taken with ``extra`` zero columns after them (``embed_tokens`` of Qwen3-VL: the
    decoder's ``inputs_embeds`` also carries the DeepStack sets, zero on text rows)."""

    def __init__(self, table: np.ndarray | QuantizedTable, extra: int) -> None:
        self.table, self.extra = table, extra
        self.shape = (int(table.shape[0]), int(table.shape[1]) + extra)

    def __getitem__(self, index: np.ndarray) -> np.ndarray:
        rows = np.asarray(self.table[index], np.float32)
        return np.concatenate([rows, np.zeros((len(rows), self.extra), np.float32)], axis=1)


def _zero_columns(path: Path, pad: Any, gather: Any, tables: dict[str, Any]) -> int | None:
    """Zero columns ``pad`` appends to ``gather``'s [batch, seq, hidden] rows, or None when it pads otherwise."""
    import onnx

    mode = next((onnx.helper.get_attribute_value(a) for a in pad.attribute if a.name == "mode"), b"constant")
    if pad.input[0] != gather.output[0] or len(pad.input) < 2 or pad.input[1] not in tables or mode != b"constant":
        return None
    if len(pad.input) > 2 and pad.input[2]:
        value = tables.get(pad.input[2])
        if value is None or np.any(_array(path, value)):
            return None
    pads = [int(v) for v in np.asarray(_array(path, tables[pad.input[1]])).reshape(-1)]
    if len(pads) != 6 or any(pads[:5]) or pads[5] <= 0:
        return None
    return pads[5]


def _output_is_embeds(graph: Any, last: Any) -> bool:
    """Whether ``last``'s output is ``inputs_embeds``, directly or through the graph's one Identity."""
    identity = next((n for n in graph.node if n.op_type == "Identity"), None)
    if identity is not None:  # Identity must take the last node's output to the graph output
        return identity.input[0] == last.output[0] and identity.output[0] == "inputs_embeds"
    return last.output[0] == "inputs_embeds"


def _quantized_table(path: Path, node: Any, tables: dict[str, Any]) -> QuantizedTable | None:
    import onnx

    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    bits, block = int(attrs.get("bits", 4)), int(attrs.get("block_size", 128))
    data, scales = (tables.get(name) for name in (node.input[0], node.input[2] if len(node.input) > 2 else ""))
    if (len(node.input) > 3 and node.input[3]) or data is None or scales is None or bits not in (4, 8) \
            or attrs.get("gather_axis", 0) != 0 or attrs.get("quantize_axis", 1) not in (1, -1) \
            or data.data_type != onnx.TensorProto.UINT8 or len(data.dims) != 2 or len(scales.dims) != 2 \
            or data.dims[1] * 8 != scales.dims[1] * block * bits or data.dims[0] != scales.dims[0]:
        return None  # zero points, another layout or type: the session runs it
    return QuantizedTable(_array(path, data), _array(path, scales), bits, block)


def _array(path: Path, tensor: Any) -> np.ndarray:
    """An initializer of the graph at ``path`` as an array, memory-mapped when it lives in a data file."""
    import onnx
    from onnx import numpy_helper

    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        info = {e.key: e.value for e in tensor.external_data}
        offset = int(info.get("offset", 0))
        return np.memmap(path.parent / info["location"], dtype=dtype, mode="r", offset=offset,
                         shape=tuple(tensor.dims))
    return numpy_helper.to_array(tensor)


class TokenEmbedder:
    """``embed(ids)`` → [len(ids), hidden] in the decoder's ``inputs_embeds`` dtype. Thread-safe."""

    def __init__(self, path: Path, dtype: Any, *, threads: int = 1) -> None:
        self.path = Path(path)
        self.dtype = np.dtype(dtype)
        self.table = gather_table(self.path)
        self.session = None
        if self.table is None:
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            try:
                self.session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
            except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
                raise ModelLoadError(f"{self.path}: onnxruntime cannot load it ({exc})") from None
            self.vocab_size = None
        else:
            self.vocab_size = int(self.table.shape[0])
        log.info("embed_tokens %s: %s", self.path.name,
                 "Gather table read into numpy" if self.table is not None else "run by onnxruntime")

    def embed(self, ids: Sequence[int]) -> np.ndarray:
        index = np.asarray(ids, dtype=np.int64).reshape(-1)
        if self.table is not None:
            if index.size and (index.min() < 0 or index.max() >= self.table.shape[0]):
                raise InvalidInputError(f"token ids must lie in [0, {self.table.shape[0]}), got "
                                        f"{int(index.min())}..{int(index.max())}")
            return np.asarray(self.table[index], dtype=self.dtype)
        assert self.session is not None
        out = self.session.run(["inputs_embeds"], {"input_ids": index.reshape(1, -1)})[0]
        return np.asarray(out[0], dtype=self.dtype)
