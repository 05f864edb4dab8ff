"""Token ids → the decoder's input embeddings (``embed_tokens``), for prompts and for every decode step.

When ``embed_tokens`` is a plain ``Gather`` of an initializer by ``input_ids``
(what the fp32/fp16 exports are), its table is read once into numpy —
memory-mapped from the external-data file when it lives there, so the
weights stay in the page cache rather than in a private copy — and a lookup
is a numpy take: no ONNX Runtime call per decode step (a session run costs
tens of microseconds of overhead for a few-kilobyte result), and nothing to
serialise between the batcher thread and the threads preparing prompts.
Any other graph (quantized ``GatherBlockQuantized``, a scale ``Mul``) runs in
an ONNX Runtime session, which is thread-safe.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from edge_runtime.errors import InvalidInputError, ModelLoadError

log = logging.getLogger(__name__)


def gather_table(path: Path) -> np.ndarray | None:
    """The [vocab, hidden] table when ``path`` is exactly ``inputs_embeds = Gather(table, input_ids)``
    (axis 0, an optional Identity after it), else None."""
    import onnx
    from onnx import numpy_helper

    proto = onnx.load(str(path), load_external_data=False)
    graph = proto.graph
    nodes = [n for n in graph.node if n.op_type != "Identity"]
    if len(nodes) != 1 or nodes[0].op_type != "Gather" or len(graph.node) > 2:
        return None
    gather = nodes[0]
    axis = next((a.i for a in gather.attribute if a.name == "axis"), 0)
    tables = {t.name: t for t in graph.initializer}
    if axis != 0 or gather.input[0] not in tables or gather.input[1] != "input_ids":
        return None
    if len(graph.node) == 2:  # Identity must take the Gather's output to the graph output
        identity = next(n for n in graph.node if n.op_type == "Identity")
        if identity.input[0] != gather.output[0] or identity.output[0] != "inputs_embeds":
            return None
    elif gather.output[0] != "inputs_embeds":
        return None
    tensor = tables[gather.input[0]]
    if len(tensor.dims) != 2:
        return None
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
