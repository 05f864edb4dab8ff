"""A decoder graph quantized by onnxruntime's ``quantize_dynamic``, served with per-token activation scales.

transformers.js' q8 files (``decoder_model_merged_quantized.onnx`` of an onnx-community VLM folder,
``model_quantized.onnx`` of a text family ``fused_exports`` cannot rebuild) quantize each MatMul's
input with one ``DynamicQuantizeLinear`` scale for the whole call. In the engine's continuous batch a
call holds the rows of several requests, so a request's rounding — and at a near-tie its tokens —
would depend on what else is decoding. ``per_token_graph`` serves such a graph with the same integer
weights, scales and zero points but each row's activations rounded with its own scale
(``decoder_from_export.dequantized_export``, then ``per_token_int8`` on the given integers): a
request then decodes alike alone and batched, and each row is rounded at least as finely as the
whole call was.

The rewrite is made at the first load and kept in the cache (``<cache>/per-token/<key>/``, keyed by
the graph's files, sizes and times and this module's version); ``[generation] fuse_exports = false``
serves the graph exactly as exported instead. A graph without such MatMuls is served as it is.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from edge_runtime.generation.folder import files_key, weight_files

log = logging.getLogger(__name__)

CACHE_SUBDIR = "per-token"
VERSION = 1
GRAPH = "model.onnx"


def per_tensor_int8(proto: Any) -> bool:
    """Whether ``proto`` (its graph, weights not needed) has a ``DynamicQuantizeLinear`` feeding a
    ``MatMulInteger`` of constant 2-D 8-bit weights: the per-call activation scale this module replaces."""
    from onnx import TensorProto

    dynamic = {n.output[0] for n in proto.graph.node if n.op_type == "DynamicQuantizeLinear"}
    eight_bit = {t.name for t in proto.graph.initializer
                 if t.data_type in (TensorProto.INT8, TensorProto.UINT8) and len(t.dims) == 2}
    return any(n.op_type == "MatMulInteger" and n.input[0] in dynamic and n.input[1] in eight_bit
               for n in proto.graph.node)


def per_token_graph(model_path: Path, cache_dir: Path) -> tuple[Path, str]:
    """The graph to run for ``model_path``: its cached per-token rewrite (made now when missing), or
    ``model_path`` itself when it has no per-call int8 activation scales; and why (for the load log).
    A rewrite that fails (a full disk, a graph the rewrite does not know) serves the graph as it is,
    with a warning."""
    import onnx

    model_path = Path(model_path)
    proto = onnx.load(str(model_path), load_external_data=False)
    if not per_tensor_int8(proto):
        return model_path, "no per-call int8 activation scales"
    key = files_key(weight_files(model_path, proto), f"v{VERSION}".encode())
    target = Path(cache_dir) / CACHE_SUBDIR / key
    if not (target / GRAPH).is_file():
        try:
            _rewrite(model_path, target)
        except Exception as exc:  # noqa: BLE001  (onnx, onnxruntime and the file system raise their own)
            log.warning("%s: served with per-call int8 activation scales; the per-token rewrite failed: %s: %s",
                        model_path, type(exc).__name__, exc)
            return model_path, f"as exported: the per-token rewrite failed ({type(exc).__name__}: {exc})"
    return target / GRAPH, f"int8 activations rounded per token ({target})"


def _rewrite(model_path: Path, target: Path) -> None:
    """Write the per-token form of ``model_path`` to ``target`` atomically (a temporary folder beside it,
    renamed; a concurrent load that got there first wins)."""
    import onnx

    from edge_runtime.decoder_from_export import dequantized_export

    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        proto = onnx.load(str(model_path))  # its weights too: the integers are kept
        done = save_per_token(dequantized_export(proto), work / GRAPH)
        if not done:
            raise ValueError("no MatMulInteger of its could take per-token scales")
        log.info("%s: %d MatMuls with int8 activations rounded per token, kept in %s", model_path, done, target)
        try:
            os.replace(work, target)
        except OSError:  # another load finished first: use its result
            pass
    finally:
        shutil.rmtree(work, ignore_errors=True)


def save_per_token(proto: Any, path: Path) -> int:
    """``proto`` (weights loaded) with each MatMul of ``DequantizeLinear``'d 8-bit weights as per-token
    ``MatMulInteger`` on those integers (``per_token_int8``), written to ``path`` with its weights in
    ``<path>.data``; how many were rewritten (nothing is written when none)."""
    import onnx

    from edge_runtime.optimize.per_token_int8 import per_token_int8
    from edge_runtime.optimize.quantize import host_int8_settings

    converted, done = per_token_int8(proto, host_int8_settings(), only_given=True)
    if done:
        data = path.with_name(path.name + ".data")
        data.unlink(missing_ok=True)  # onnx appends to an existing data file
        onnx.save(converted, str(path), save_as_external_data=True, location=data.name)
    return done
