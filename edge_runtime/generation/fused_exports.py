"""An ``optimum`` text decoder export served as our fused graph: rebuilt once, checked, cached.

``[generation] fuse_exports = true`` (the default): loading a folder whose graph is an ``optimum`` /
onnx-community export of a Qwen2, Qwen3 or Llama decoder rebuilds it with ``decoder_from_export``
(GroupQueryAttention, KV appended in place, last-position prefill logits), checks that the rebuilt
graph's logits equal the export's (``same_logits``: a prompt and a decode step) and keeps it in the
cache (``<cache>/fused-exports/<key>/``), keyed by the export's files (path, size, modification
time), its ``config.json`` and the rebuild's version, so later loads reuse it; a new rebuild of an
export removes the earlier ones of the same file. An export quantized by onnxruntime's
``quantize_dynamic`` (transformers.js' ``model_quantized.onnx``, ``model_uint8.onnx``) is rebuilt
with its own int8 weights and scales, checked with the activations in float on both sides (its
per-tensor ``DynamicQuantizeLinear`` and our per-token scales round differently), then served as
per-token ``MatMulInteger`` (``per_token_int8``): a row's result does not depend on the rows batched
with it, as it does under the export's per-tensor activation scale, and the integer GEMM reads the
weights once per step, not once per row (see ``_integer_matmuls`` for its speed). An export that
cannot be rebuilt (``NotFusable``: another family, fp16 weights, a rope scaling other than Llama
3's, logits that differ) is served as it is — but for per-call int8 activation scales, made per
token (``per_token_exports``) — and the reason is logged and kept beside the key so the check is not
repeated at every load. A rebuild that fails otherwise (a full disk, a read-only cache, a bug) is
not kept: the export is served as it is, with a warning, and the next load tries again.

The folder stays the user's: tokenizer, chat template and generation config are read from it; only
the graph the engine runs changes. The memory budget charges the export's files (the same weights;
``footprint.planned_footprint`` follows this module's rule, so planned equals loaded).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from edge_runtime.generation.folder import (MODEL_FILE, DecoderFolder, describe_decoder, files_key, read_folder,
                                            read_json)
from edge_runtime.generation.settings import GenerationSettings

log = logging.getLogger(__name__)

CACHE_SUBDIR = "fused-exports"
VERSION = 4  # of the rebuild: a change to decoder_fused/decoder_from_export that alters the graph bumps it
DONE, REFUSED = "fused.json", "refused.json"


def text_decoder(path: Path, settings: GenerationSettings,
                 cache_dir: Path | None = None) -> tuple[DecoderFolder, str]:
    """The description of the text decoder folder ``path`` the engine runs under ``settings`` (the one rule
    ``GenerativeModel`` and the memory budget's footprint both follow), and why (for a log line);
    ``cache_dir`` default: the runtime's (``$EDGE_RUNTIME_CACHE``)."""
    from edge_runtime.config import default_cache_dir

    return fused_export(read_folder(path, settings.precision), settings.fuse_exports, cache_dir or default_cache_dir())


def _per_token(folder: DecoderFolder, cache_dir: Path, why: str) -> tuple[DecoderFolder, str]:
    """An export not rebuilt, with its per-call int8 activation scales (if any) made per token
    (``per_token_exports``: same integers; a row then decodes alike alone and batched)."""
    from edge_runtime.generation.per_token_exports import per_token_graph

    served, how = per_token_graph(folder.model_path, cache_dir)
    if served == folder.model_path:
        return folder, why
    return dataclasses.replace(folder, model_path=served), f"{why}; {how}"


def export_key(folder: DecoderFolder) -> str:
    """The cache key of ``folder``'s export: its graph files' paths, sizes and times, its config, VERSION."""
    config = folder.path / "config.json"
    return files_key(folder.weight_files, f"v{VERSION}".encode(), config.read_bytes() if config.is_file() else b"")


def fused_export(folder: DecoderFolder, enabled: bool, cache_dir: Path) -> tuple[DecoderFolder, str]:
    """The description the engine should run for ``folder``: the cached fused rebuild of its export
    (made now when missing), or ``folder`` itself; and why (one line, for the load log)."""
    if not enabled:
        return folder, "[generation] fuse_exports is off"
    if folder.kv_in_place:
        return folder, "its graph is already fused (GroupQueryAttention)"
    target = Path(cache_dir) / CACHE_SUBDIR / export_key(folder)
    if not (target / DONE).is_file() and not (target / REFUSED).is_file():
        try:
            _rebuild(folder, target)
        except Exception as exc:  # noqa: BLE001  (onnx, onnxruntime and the file system raise their own)
            log.warning("%s: served as exported; rebuilding it as the fused graph failed: %s: %s",
                        folder.model_path, type(exc).__name__, exc)
            return folder, f"served as exported: the rebuild failed ({type(exc).__name__}: {exc})"
    if (target / REFUSED).is_file():
        return _per_token(folder, cache_dir, read_json(target / REFUSED).get("reason", "refused"))
    fused = describe_decoder(folder.path, target / MODEL_FILE, read_json(folder.path / "config.json"),
                             read_json(folder.path / "generation_config.json"))
    record = read_json(target / DONE)
    return (dataclasses.replace(fused, weight_files=folder.weight_files),
            f"rebuilt as the fused graph ({target}; logits within {record.get('logit_difference', 0):.1e} of the "
            "export's)")


def _checked_pair(export_path: Path, work: Path, export: Any, fused: Any) -> tuple[str, str, bool]:
    """The two graphs ``same_logits`` compares, and whether it runs them with float weights: the export and
    its rebuild as written, or — where their MatMulNBits quantize activations to int8 (accuracy level
    above 0: one fp32 rounding apart before a node, its int8 rounding can flip and the logits move by far
    more than fp32 noise) — both at level 0, which dequantizes the same weights in fp32: the check is of
    the weights read and the graph's function; the level is an attribute carried over unchanged. An
    int8 ``MatMulInteger`` export is compared the same way: its weights dequantized
    (``dequantized_export``) against the rebuild's ``DequantizeLinear`` weights, both in float."""
    import onnx

    from edge_runtime.decoder_from_export import dequantized_export
    from edge_runtime.optimize.decoder_quant import set_accuracy_level

    if any(n.op_type == "MatMulInteger" for n in export.graph.node):
        copy = onnx.ModelProto()
        copy.CopyFrom(export)
        onnx.load_external_data_for_model(copy, str(export_path.parent))
        onnx.save(dequantized_export(copy), str(work / "check-export.onnx"), save_as_external_data=True,
                  location="check-export.onnx.data")
        return str(work / "check-export.onnx"), str(work / MODEL_FILE), True
    levels = {a.i for n in export.graph.node if n.op_type == "MatMulNBits" for a in n.attribute
              if a.name == "accuracy_level"}
    if not levels - {0}:
        return str(export_path), str(work / MODEL_FILE), False
    # the export's copy takes its (quantized: small) weights along; the rebuild's keeps pointing at its data
    # file in ``work``, beside which the copy is written
    copy = onnx.ModelProto()
    copy.CopyFrom(export)
    onnx.load_external_data_for_model(copy, str(export_path.parent))
    onnx.save(set_accuracy_level(copy, 0), str(work / "check-export.onnx"), save_as_external_data=True,
              location="check-export.onnx.data")
    copy = onnx.ModelProto()
    copy.CopyFrom(fused)
    onnx.save(set_accuracy_level(copy, 0), str(work / "check-fused.onnx"))
    return str(work / "check-export.onnx"), str(work / "check-fused.onnx"), False


def _integer_matmuls(work: Path) -> int:
    """The checked rebuild in ``work`` with its 8-bit weights (``DequantizeLinear`` of the export's integers)
    as per-token ``MatMulInteger`` on those integers (``per_token_int8``); how many. Left as it is, ONNX
    Runtime would fuse each DequantizeLinear into an 8-bit MatMulNBits at accuracy level 4 (per-row
    int8 blocks: batch-invariant too), which reads its weights once per row: on an AMD Zen 4 host, 2
    threads, a quiet machine, an 896 x 4,864 int8 weight took 97 / 173 µs at 1 / 8 rows in this form
    against 63 / 307 fused (best of 5 x 300 runs of a one-off script); whole decode steps, as
    ``quantize --mode int8`` timed them there, 2.67 / 7.23 ms against 2.31 / 7.58 on the 31M decoder
    and 28.3 / 52.0 against 32.0 / 63.1 on the 0.5B. So this form is kept: it wins wherever several
    streams share a step and on the larger model alone; ``quantize`` still times both for the folders
    it writes (a measured choice here is left for later)."""
    import onnx

    from edge_runtime.generation.per_token_exports import save_per_token

    # its weights too (the rewrite needs the integers), so the data file can be written anew
    return save_per_token(onnx.load(str(work / MODEL_FILE)), work / MODEL_FILE)


def _drop_stale(kept: Path, source: Path) -> None:
    """Remove the cache's other entries for ``source`` (an export since changed, or an older rebuild
    version): a phone keeps one rebuild per export, not one per edit of it."""
    for entry in kept.parent.iterdir():
        if entry == kept or not entry.is_dir():
            continue
        record = next((entry / name for name in (DONE, REFUSED) if (entry / name).is_file()), None)
        try:
            stale = record is not None and json.loads(record.read_text()).get("source") == str(source)
        except (OSError, ValueError):
            stale = False
        if stale:
            shutil.rmtree(entry, ignore_errors=True)
            log.info("%s: removed %s, an earlier rebuild of the same export", kept, entry.name)


def _rebuild(folder: DecoderFolder, target: Path) -> None:
    """Write the rebuild (or the reason there is none) to ``target``, atomically: a build goes to a
    temporary folder beside it and is renamed; a concurrent load that got there first wins."""
    import onnx

    from edge_runtime.decoder_from_export import NotFusable, fused_from_export, same_logits
    from edge_runtime.model_zoo import external_weights

    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        config = read_json(folder.path / "config.json")
        try:
            # the export's weights are read one at a time as the builder takes them, and the rebuild's are
            # written to its data file as they are made: about one tensor in memory, whatever the model
            export = onnx.load(str(folder.model_path), load_external_data=False)
            with external_weights(work / (MODEL_FILE + ".data")):
                fused = fused_from_export(export, config, str(folder.model_path.parent))
            onnx.save(fused, str(work / MODEL_FILE))
            export_check, fused_check, float_weights = _checked_pair(folder.model_path, work, export, fused)
            difference = same_logits(export_check, fused_check, folder.vocab_size, float_weights=float_weights)
            del export, fused
            integer = _integer_matmuls(work) if float_weights else 0
        except NotFusable as exc:
            for stale in work.iterdir():
                stale.unlink()
            (work / REFUSED).write_text(json.dumps({"source": str(folder.model_path.resolve()), "version": VERSION,
                                                    "reason": f"served as exported, not rebuilt as the fused "
                                                              f"graph: {exc}"}))
        else:
            for check in work.glob("check-*"):
                check.unlink()
            (work / DONE).write_text(json.dumps({"source": str(folder.model_path.resolve()), "version": VERSION,
                                                 "logit_difference": difference, "per_token_int8": integer}))
        try:
            os.replace(work, target)
        except OSError:  # another load finished first: use its result
            pass
        else:
            _drop_stale(target, folder.model_path.resolve())
    finally:
        shutil.rmtree(work, ignore_errors=True)
