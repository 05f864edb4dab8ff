"""A quantized decoder's token-embedding table in its weights' bits: ``Gather`` → ``GatherBlockQuantized``.

``MatMulNBits`` and the per-token ``MatMulInteger`` form quantize MatMuls only, so the embedding
``Gather`` kept its float table — at a real vocabulary the largest tensor of a small model:
Qwen2.5-0.5B's 151,936 x 896 table is 545 MB in fp32, where its 24 layers take ~200 MB at int4
(llama.cpp's q4_0 stores the table in 4 bits too). ``quantize_embeddings`` stores it as the
MatMuls are stored: blocks of ``block_size`` values along the hidden axis, one scale per block,
symmetric, 4 or 8 bits, and reads rows with ONNX Runtime's ``GatherBlockQuantized`` (a Gather
that dequantizes only the rows it takes). The integers and scales come from onnxruntime's own
block quantizer (``DefaultWeightOnlyQuantizer.qbits_block_quant``, the one ``MatMulNBits``
weights come from): its ``MatMulNBitsQuantizer`` turns a Gather into ``GatherBlockQuantized`` at
4 bits only, so the node is written here, for both widths, from its packed blocks.

Only the embedding is touched: a ``Gather`` of ``input_ids`` (the graph input) from a constant
2-D float table on axis 0 that nothing else reads, whose width is a multiple of ``block_size``.

A tied head is a transposed copy of the table in our graphs (``decoder_zoo``), and ``MatMulNBits``
quantizes it into the very same blocks — one row of its ``B`` per vocabulary entry, blocks along the
hidden axis. ``share_tied_table`` then lets the Gather read the head's integers instead of a copy of
them (what onnxruntime-genai's builder calls shared embeddings): ``MatMulNBits`` checks its ``B`` is
[N, blocks, block bytes], so the Gather reads that 3-D form, quantized along its last axis, and a
Reshape joins the blocks of each row again; the scales stay a copy (the op checks theirs too).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

IDS = "input_ids"


def quantize_embeddings(proto: Any, bits: int, block_size: int) -> list[str]:
    """Replace (in place) each token-embedding ``Gather`` of ``proto`` (weights loaded) by
    ``GatherBlockQuantized`` at ``bits`` (4 or 8); returns the tables quantized."""
    import onnx
    from onnx import numpy_helper

    if bits not in (4, 8):
        raise ValueError(f"embedding tables take 4 or 8 bits, got {bits}")
    graph = proto.graph
    tables, readers = _initializers_and_readers(graph)
    outputs = {o.name for o in graph.output}
    done = []
    for index, node in enumerate(list(graph.node)):
        if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            continue
        name, ids = node.input
        table = tables.get(name)
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if ids != IDS or table is None or axis != 0 or readers.get(name) != 1 or name in outputs:
            continue
        if len(table.dims) != 2 or table.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16):
            continue
        vocab, hidden = (int(d) for d in table.dims)
        if hidden % block_size:
            log.info("embedding %s kept as it is: width %d is not a multiple of block %d", name, hidden, block_size)
            continue
        packed, scales = _blocks(numpy_helper.to_array(table), bits, block_size)
        data = numpy_helper.from_array(packed.reshape(vocab, -1), f"{name}_q{bits}")
        scale = numpy_helper.from_array(scales.reshape(vocab, hidden // block_size), f"{name}_scales")
        graph.initializer.remove(table)
        graph.initializer.extend([data, scale])
        for value in list(graph.input):  # an initializer listed as an input too (older exporters)
            if value.name == name:
                graph.input.remove(value)
        # No zero points: symmetric blocks, stored offset by 2**(bits-1), the op's default for uint8.
        gather = onnx.helper.make_node("GatherBlockQuantized", [data.name, ids, scale.name], list(node.output),
                                       name=(node.name or name) + f"_q{bits}", domain="com.microsoft",
                                       gather_axis=0, quantize_axis=1, block_size=block_size, bits=bits)
        graph.node.remove(node)
        graph.node.insert(index, gather)
        done.append(name)
    if done and not any(o.domain == "com.microsoft" for o in proto.opset_import):
        proto.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    return done


def _initializers_and_readers(graph: Any) -> tuple[dict[str, Any], dict[str, int]]:
    """The graph's initializers by name, and how many node inputs read each name."""
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    return {t.name: t for t in graph.initializer}, readers


def _blocks(table: np.ndarray, bits: int, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(packed uint8 [vocab, hidden / block, block * bits / 8], scales [vocab, hidden / block]) of ``table``
    [vocab, hidden] quantized per row in blocks along the hidden axis: onnxruntime's quantizer sees the
    table as a MatMul weight [hidden, vocab] whose columns (our rows) it quantizes block by block."""
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, DefaultWeightOnlyQuantizer

    config = DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=True, bits=bits)
    packed, scales, _ = DefaultWeightOnlyQuantizer(config).qbits_block_quant(np.ascontiguousarray(table.T))
    return packed, scales


def share_tied_table(proto: Any) -> list[str]:
    """Where a ``GatherBlockQuantized`` table of ``proto`` (weights loaded) holds the same integers and scales as
    a ``MatMulNBits`` weight (a tied head), read them from that weight and drop the copy (in place); returns
    the tables dropped."""
    import onnx
    from onnx import numpy_helper

    graph = proto.graph
    tables, readers = _initializers_and_readers(graph)
    heads = {}
    for node in graph.node:
        if node.op_type == "MatMulNBits" and len(node.input) >= 3 and not any(node.input[3:]) \
                and node.input[1] in tables and node.input[2] in tables:
            attrs = {a.name: a.i for a in node.attribute}
            heads[(attrs.get("N"), attrs.get("K"), attrs.get("bits", 4), attrs.get("block_size"))] = node
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in graph.input}
    shared = []
    for node in list(graph.node):
        if node.op_type != "GatherBlockQuantized" or node.input[0] not in tables or len(node.input) != 3 \
                or ranks.get(node.input[1]) != 2:  # the Reshape below keeps two leading dims: [batch, seq]
            continue
        attrs = {a.name: a.i for a in node.attribute}
        data, scales = tables[node.input[0]], tables[node.input[2]]
        bits, block = attrs.get("bits", 4), attrs.get("block_size", 128)
        if len(data.dims) != 2 or attrs.get("quantize_axis", 1) != 1 or readers.get(scales.name) != 1:
            continue
        vocab, hidden = int(data.dims[0]), int(data.dims[1]) * 8 // bits
        head = heads.get((vocab, hidden, bits, block))
        if head is None:
            continue
        head_data, head_scales = tables[head.input[1]], tables[head.input[2]]
        if not (np.array_equal(numpy_helper.to_array(head_data).reshape(vocab, -1), numpy_helper.to_array(data))
                and np.array_equal(numpy_helper.to_array(head_scales).reshape(scales.dims),
                                   numpy_helper.to_array(scales))):
            continue
        scales.dims[:] = [vocab, hidden // block, 1]  # the same bytes, one block per row of the 3-D form
        blocks = node.output[0] + "_blocks"
        shape = numpy_helper.from_array(np.array([0, 0, hidden], np.int64), node.output[0] + "_shape")
        read = onnx.helper.make_node("GatherBlockQuantized", [head_data.name, node.input[1], scales.name], [blocks],
                                     name=node.name, domain="com.microsoft", gather_axis=0, quantize_axis=2,
                                     block_size=block, bits=bits)
        join = onnx.helper.make_node("Reshape", [blocks, shape.name], list(node.output), name=node.name + "_rows")
        index = next(i for i, n in enumerate(graph.node) if n == node)
        graph.node.remove(node)
        graph.node.insert(index, join)
        graph.node.insert(index, read)
        graph.initializer.remove(data)
        graph.initializer.append(shape)
        shared.append(data.name)
    return shared
