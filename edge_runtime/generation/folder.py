"""A generative model folder: recognised by its contents, read into a typed description.

An ``optimum`` export of a decoder with past key values holds ``model.onnx``
(``input_ids``, ``attention_mask``, optional ``position_ids``,
``past_key_values.N.key/value``; outputs ``logits``, ``present.N.key/value``),
``config.json``, ``generation_config.json`` and the tokenizer files. The
onnx-community / transformers.js layout keeps the same graph, in several precisions,
under ``onnx/`` (``model.onnx``, ``model_q4.onnx``, ``model_quantized.onnx``,
``model_fp16.onnx`` ...; the suffixes of ``SUFFIXES``): ``[generation]
precision`` picks one, by default the first present in ``PRECISION_ORDER`` (fp32 first).
A folder with ``genai_config.json`` is in onnxruntime-genai's format instead; a text
decoder among them runs in our engine too (``read_genai_decoder``).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from edge_runtime.errors import ModelLoadError, ModelNotFoundError

MODEL_FILE = "model.onnx"
ONNX_DIR = "onnx"  # the onnx-community layout's graphs, one file per precision
# transformers.js' dtype -> file suffix (src/utils/dtypes.js): onnx/<stem><suffix>.onnx, for text
# folders (model_q4.onnx) and a VLM's parts alike
SUFFIXES = {"fp32": "", "fp16": "_fp16", "q8": "_quantized", "int8": "_int8", "uint8": "_uint8", "q4": "_q4",
            "q4f16": "_q4f16", "bnb4": "_bnb4"}
# Without a setting: fp32 first (what the graphs were exported as), then the integer forms, which
# ONNX Runtime's CPU kernels run fast; fp16 forms last, since on CPU they mostly run through casts.
PRECISION_ORDER = ("fp32", "q8", "int8", "uint8", "q4", "bnb4", "fp16", "q4f16")
GENAI_CONFIG = "genai_config.json"
# The decoder input (an overridable initializer, default 0 = every position) naming how many trailing
# positions get logits, transformers' ``logits_to_keep`` (``decoder_zoo`` writes it); the engine feeds 1
# to a prefill chunk.
LOGITS_TO_KEEP = "logits_to_keep"
_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
_ONNX_TO_NUMPY = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


def is_generative_folder(folder: Path) -> bool:
    """True when ``folder`` holds a decoder LLM: a tokenizer and either ``genai_config.json`` or a
    ``config.json`` beside ``model.onnx``, or a vision-language model in the transformers.js layout
    (``edge_runtime.generation.vision.folder``). Reads no ONNX (cheap enough for a repository scan)."""
    from edge_runtime.generation.vision.folder import is_vlm_folder

    folder = Path(folder)
    if not (folder / "tokenizer.json").is_file():
        return False
    return (folder / GENAI_CONFIG).is_file() or ((folder / "config.json").is_file() and (
        (folder / MODEL_FILE).is_file() or bool(text_models(folder)))) or is_vlm_folder(folder)


def text_models(folder: Path) -> dict[str, Path]:
    """The onnx-community layout's decoder files present under ``folder/onnx``, by precision."""
    found = {name: Path(folder) / ONNX_DIR / f"model{suffix}.onnx" for name, suffix in SUFFIXES.items()}
    return {name: path for name, path in found.items() if path.is_file()}


def decoder_file(folder: Path, precision: str = "") -> Path:
    """The decoder graph of ``folder``: ``model.onnx`` (optimum; for "" and "fp32" it comes first), or the
    ``onnx/model<suffix>.onnx`` of ``precision`` ("" = the first present in ``PRECISION_ORDER``).
    ModelLoadError names what is there."""
    folder = Path(folder)
    present = text_models(folder)
    if (folder / MODEL_FILE).is_file() and precision in ("", "fp32"):  # the optimum layout's own file first
        return folder / MODEL_FILE
    if (folder / MODEL_FILE).is_file() and not present:
        raise ModelLoadError(f"{folder}: [generation] precision {precision!r} names a file of the onnx/ layout; "
                             f"this folder has only {MODEL_FILE}")
    if not present:
        raise ModelLoadError(f"{folder}: no {MODEL_FILE} (an optimum text-generation-with-past export) and no "
                             f"{ONNX_DIR}/model*.onnx")
    if precision:
        if precision not in present:
            raise ModelLoadError(f"{folder}: [generation] precision {precision!r} has no {ONNX_DIR}/ file here; "
                                 f"present: {sorted(present)}")
        return present[precision]
    return present[next(name for name in PRECISION_ORDER if name in present)]


def is_genai_folder(folder: Path) -> bool:
    return (Path(folder) / GENAI_CONFIG).is_file()


@dataclass(frozen=True)
class KVLayout:
    """Shape of the cache as the graph wants it: per layer a key and a value [batch, heads, past, dim]."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: Any  # np.float32 or np.float16

    @property
    def bytes_per_token(self) -> int:
        """KV bytes one token position costs in one sequence (all layers, key and value)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class DecoderFolder:
    """What the engine needs from a folder, checked at load time."""

    path: Path
    model_path: Path
    kv: KVLayout
    vocab_size: int
    context_length: int
    eos_token_ids: tuple[int, ...]
    has_position_ids: bool
    model_type: str
    weight_files: tuple[Path, ...] = ()  # model.onnx and its external-data files (the memory budget's weights)
    kv_in_place: bool = False  # the graph attends with GroupQueryAttention: one KV buffer, appended in place
    # The graph takes ``logits_to_keep`` (decoder_zoo.lm_head): a prefill chunk gets its last position's
    # logits only; without it the graph gives every position's.
    keeps_logits: bool = False

    @property
    def prefill_logits_vocab(self) -> int:
        """The vocabulary-wide logits a prefill chunk outputs per position: ``vocab_size``, or 0 when the graph
        gives the last position's only (``keeps_logits``)."""
        return 0 if self.keeps_logits else self.vocab_size

    @property
    def weight_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.weight_files if p.is_file())


def files_key(paths: Sequence[Path], before: bytes, after: bytes = b"") -> str:
    """A short cache key for what was made from the files ``paths`` (plus ``before`` and ``after``): each file
    by its resolved path, size and modification time, so a key costs stat calls, not reading gigabytes."""
    digest = hashlib.sha256(before)
    for path in paths:
        stat = Path(path).stat()
        digest.update(f"\0{Path(path).resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    digest.update(after)
    return digest.hexdigest()[:20]


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(document, dict):
        raise ModelLoadError(f"{path}: expected a JSON object")
    return document


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in (value if isinstance(value, list) else [value]))


def weight_files(model_path: Path, proto: Any) -> tuple[Path, ...]:
    """``model_path`` and the external-data files its initializers name (``model.onnx_data`` ...)."""
    import onnx

    locations = {entry.value for tensor in proto.graph.initializer
                 if tensor.data_location == onnx.TensorProto.EXTERNAL
                 for entry in tensor.external_data if entry.key == "location"}
    return (model_path, *(model_path.parent / location for location in sorted(locations)))


def read_folder(folder: Path, precision: str = "") -> DecoderFolder:
    """Describe an ``optimum`` decoder folder (or the onnx-community layout's file of ``precision``,
    see ``decoder_file``); ModelLoadError names what is missing or wrong."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelNotFoundError(f"model folder not found: {folder}")
    return describe_decoder(folder, decoder_file(folder, precision), read_json(folder / "config.json"),
                            read_json(folder / "generation_config.json"))


def describe_decoder(folder: Path, model_path: Path, config: dict[str, Any], generation: dict[str, Any],
                     first_input: str = "input_ids", kv_dims: tuple[int, int] | None = None) -> DecoderFolder:
    """Describe the decoder graph ``model_path`` (its token input named ``first_input``: ``input_ids``,
    or ``inputs_embeds`` for a vision-language model's decoder) with its text ``config`` and
    ``generation`` config; ``kv_dims``: (kv heads, head dim) where the graph leaves them symbolic and
    the folder's config gives them. ModelLoadError names what is missing or wrong."""
    import onnx

    proto = onnx.load(str(model_path), load_external_data=False)
    inputs = {v.name: v for v in proto.graph.input}
    outputs = {v.name for v in proto.graph.output}
    missing = [n for n in (first_input, "attention_mask") if n not in inputs] + (
        [] if "logits" in outputs else ["logits (output)"])
    past = sorted({int(m.group(1)) for n in inputs if (m := _PAST.match(n))})
    if missing or not past:
        raise ModelLoadError(f"{model_path}: not a decoder with past key values: missing "
                             f"{missing or ['past_key_values.N.key/value']}")
    if past != list(range(len(past))):
        raise ModelLoadError(f"{model_path}: past_key_values layers {past} are not 0..{len(past) - 1}")
    for layer in past:
        for kind in ("key", "value"):
            if f"present.{layer}.{kind}" not in outputs:
                raise ModelLoadError(f"{model_path}: input past_key_values.{layer}.{kind} has no output "
                                     f"present.{layer}.{kind}")
    first = inputs["past_key_values.0.key"].type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else None for d in first.shape.dim]
    if len(dims) == 4 and kv_dims is not None:
        dims[1], dims[3] = dims[1] or kv_dims[0], dims[3] or kv_dims[1]
    if len(dims) != 4 or dims[1] is None or dims[3] is None:
        raise ModelLoadError(f"{model_path}: past_key_values.0.key must be [batch, kv_heads, past, head_dim] "
                             f"with fixed heads and head_dim, got {dims}")
    elem = onnx.helper.tensor_dtype_to_np_dtype(first.elem_type)
    if elem not in (np.float32, np.float16):
        raise ModelLoadError(f"{model_path}: KV cache dtype {elem} is not float32 or float16")
    logits = next(v for v in proto.graph.output if v.name == "logits").type.tensor_type.shape.dim
    vocab = logits[-1].dim_value if logits and logits[-1].HasField("dim_value") else int(config.get("vocab_size", 0))
    if vocab <= 0:
        raise ModelLoadError(f"{model_path}: vocabulary size unknown (logits' last dim and config.json vocab_size)")
    context = int(config.get("max_position_embeddings") or read_json(folder / "tokenizer_config.json").get(
        "model_max_length") or 2048)
    eos = _ids(generation.get("eos_token_id")) or _ids(config.get("eos_token_id"))
    return DecoderFolder(folder, model_path, KVLayout(len(past), int(dims[1]), int(dims[3]), np.dtype(elem).type),
                         int(vocab), context, eos, "position_ids" in inputs, str(config.get("model_type", "")),
                         weight_files(model_path, proto), appends_in_place(proto),
                         LOGITS_TO_KEEP in inputs and any(t.name == LOGITS_TO_KEEP for t in proto.graph.initializer))


# genai_config.json's decoder input/output names that mean what the engine feeds and reads under these names
_GENAI_NAMES = {"input_ids": "input_ids", "attention_mask": "attention_mask", "position_ids": "position_ids",
                "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value",
                "logits": "logits", "present_key_names": "present.%d.key", "present_value_names": "present.%d.value"}


def read_genai_decoder(folder: Path) -> tuple[DecoderFolder | None, str]:
    """An onnxruntime-genai folder described for our engine, or None and why it cannot be.

    Its ``genai_config.json`` stands in for ``config.json``: a text decoder whose graph's inputs and
    outputs carry the names the engine uses (what genai's model builder writes for Llama/Qwen/Phi-style
    decoders: ``input_ids``, ``attention_mask``, ``past_key_values.%d.key``, ``present.%d.key`` ...).
    Folders with other parts (vision, speech, embeddings) or other names stay onnxruntime-genai's.
    """
    folder = Path(folder)
    config = read_json(folder / GENAI_CONFIG).get("model")
    if not isinstance(config, dict) or not isinstance(config.get("decoder"), dict):
        return None, f"{GENAI_CONFIG} has no model.decoder section"
    parts = [key for key, value in config.items() if isinstance(value, dict) and key != "decoder"]
    if parts:
        return None, f"it has parts besides the decoder ({', '.join(sorted(parts))})"
    decoder = config["decoder"]
    inputs, outputs = decoder.get("inputs", {}), decoder.get("outputs", {})
    if not isinstance(inputs, dict) or not isinstance(outputs, dict):
        return None, "its decoder inputs/outputs are not name tables"
    names = {**inputs, **outputs}
    other = {key: value for key, value in names.items() if _GENAI_NAMES.get(key) != value}
    if other:
        return None, f"its graph names {other} differ from the engine's"
    model_path = folder / str(decoder.get("filename", MODEL_FILE))
    if not model_path.is_file():
        raise ModelLoadError(f"{folder}: {GENAI_CONFIG} names {model_path.name}, which is not there")
    text_config = {"vocab_size": config.get("vocab_size"), "max_position_embeddings": config.get("context_length"),
                   "eos_token_id": config.get("eos_token_id"), "model_type": config.get("type", "")}
    try:
        kv_dims = (int(decoder["num_key_value_heads"]), int(decoder["head_size"]))
    except (KeyError, TypeError, ValueError):
        kv_dims = None
    return describe_decoder(folder, model_path, text_config, {}, kv_dims=kv_dims), ""


def engine_genai_decoder(folder: Path, genai_runtime: str) -> tuple[DecoderFolder | None, str]:
    """The genai folder's decoder for our engine under ``[generation] genai_runtime``, or None and why not
    (the one rule ``GenerativeModel`` and the memory budget's footprint both follow)."""
    if genai_runtime != "engine":
        return None, f"[generation] genai_runtime is {genai_runtime!r}"
    return read_genai_decoder(folder)


def appends_in_place(proto: Any) -> bool:
    """True when the graph attends with ``com.microsoft.GroupQueryAttention``, which appends new
    keys/values into ``present`` in place when it is bound to the same memory as ``past``."""
    return any(node.op_type == "GroupQueryAttention" and node.domain == "com.microsoft" for node in proto.graph.node)
