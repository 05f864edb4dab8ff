"""Text generation for small decoder LLMs exported to ONNX (``optimum`` layout).

``folder`` recognises and reads a model folder; ``chat`` renders chat templates
and tokenises; ``detokenizer`` streams text without splitting a UTF-8
character; ``sampling`` picks tokens; ``kv_cache`` (ping-pong buffers, for graphs
that concatenate the cache) or ``kv_inplace`` (one buffer appended in place, for
GroupQueryAttention graphs such as ``decoder_fused``'s) and ``engine`` run prefill
and decode with the KV cache in preallocated buffers; ``prefix_cache`` reuses
the KV of prompt prefixes; ``batcher`` schedules sequences per token
(continuous batching); ``model`` is the embedded API (``GenerativeModel``);
``openai_params`` parses OpenAI request bodies; ``openai_cloud`` and
``cloud_router`` send requests to an OpenAI-compatible peer; ``genai_engine``
runs onnxruntime-genai folders; ``command`` is the CLI; ``vision`` adds images
(vision-language models: the vision encoder, the splice, M-RoPE) in front of the
same engine and batcher.

This package knows no HTTP: the server's ``openai_routes`` and
``generate_routes`` translate requests into it. Heavy imports (onnxruntime,
tokenizers, jinja2) happen when a model loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edge_runtime.generation.folder import is_generative_folder
    from edge_runtime.generation.model import GenerativeModel, load_generative

_LAZY = {"GenerativeModel": "edge_runtime.generation.model", "load_generative": "edge_runtime.generation.model",
         "is_generative_folder": "edge_runtime.generation.folder"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'edge_runtime.generation' has no attribute {name!r}")


__all__ = list(_LAZY)
