"""``[generation]``: per-model settings of a generative model (``<repo>/<model>/config.toml``).

::

    [generation]
    max_batch_size = 8            # sequences decoded together (continuous batching)
    max_queue = 64                # requests waiting for admission; beyond: QueueFullError (429)
    kv_budget_tokens = 0          # KV positions reserved by admitted sequences (prompt + max new);
                                  # 0 = max_batch_size * max_seq_len
    max_seq_len = 4096            # cap on the model's context length (sizes the KV buffers)
    prefill_chunk_tokens = 256    # a prompt is prefilled in chunks this long between decode steps
    idle_prefill_chunk_tokens = 512  # ... and up to this long while no stream is decoding (nobody
                                  # waits between chunks; capped so the chunk's logits stay <= 64 MiB);
                                  # 0 = always prefill_chunk_tokens
    prefix_cache_bytes = 67108864 # KV of prompt prefixes kept across requests (0 = off)
                                  # (the KV buffers and this cap are charged to the server's [memory] budget)
    prefix_block_tokens = 16      # prefix cache granularity
    prefix_cache_disk_bytes = 0   # > 0: the prefix cache's blocks also kept on disk, up to this many bytes
                                  # (<cache>/prefix-kv/), so a restarted daemon reuses them (0 = off)
    threads = 0                   # ONNX Runtime intra-op threads; 0 = the runtime's
    flush_denormals = true        # decode and prefill with subnormal floats flushed to zero (x86-64:
                                  # 1.75-1.91x a decode step at 1,024 tokens of context on an Intel Xeon)
    fuse_exports = true           # rebuild an optimum Qwen2/Llama export as the fused graph at its first
                                  # load (checked against its logits, cached): GroupQueryAttention, KV in place;
                                  # other int8 exports (and VLM q8 decoders) get per-token activation scales;
                                  # false: every graph served exactly as exported
    precision = ""                # an onnx-community folder's onnx/model<suffix>.onnx: fp32, q8, int8,
                                  # uint8, q4, bnb4, fp16, q4f16 ("" = the first present, fp32 first)
    tool_parser = ""              # tool-call format: "hermes" (Qwen2.5 <tool_call>) or "json";
                                  # "" = hermes when the chat template mentions <tool_call>, else json
    reasoning_parser = ""         # "think" (or vLLM's qwen3 / deepseek_r1 / glm45): a chat answer's
                                  # <think>...</think> goes to reasoning_content, the rest to content; "" = off
    structured_in_reasoning = false  # with a reasoning parser: a grammar (response_format, tools, ...)
                                  # constrains the reasoning too; false = only the answer after it (vLLM's
                                  # enable_in_reasoning)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from edge_runtime.config import from_mapping
from edge_runtime.errors import ConfigError


# An idle chunk's logits output at most, for a decoder that computes the logits of every chunk position
# (one without ``logits_to_keep``: an optimum export, a folder converted before it existed): with
# the benchmark's 4,096-token vocabulary a 1,024-token chunk gives 16 MiB; with Qwen2's 151,936 one it
# would give 594 MiB, so such a model keeps ``prefill_chunk_tokens`` chunks.
IDLE_CHUNK_LOGITS_BYTES = 64 * 2**20


@dataclass(frozen=True)
class GenerationSettings:
    max_batch_size: int = 8
    max_queue: int = 64
    kv_budget_tokens: int = 0
    max_seq_len: int = 4096
    prefill_chunk_tokens: int = 256
    # Longer chunks run the same matrix products in fewer, larger calls, but ONNX Runtime's CPU
    # GroupQueryAttention computes and keeps a chunk's whole chunk x context score matrix (the causal
    # half too). Which wins depends on the CPU: on an AMD Zen 4 host 1,024-token chunks prefilled
    # 1.07x faster than 256; on an Intel Xeon with AVX-512 (the VLM benchmark's decoder, 600-2,886
    # prompt tokens, 2 threads) 256 beat 1,024 by 1.13-1.29x and 512 was within 0.93-1.0x of 256.
    # 512 (llama.cpp's default micro-batch too) keeps most of either gain.
    idle_prefill_chunk_tokens: int = 512
    prefix_cache_bytes: int = 64 * 1024 * 1024
    prefix_block_tokens: int = 16
    prefix_cache_disk_bytes: int = 0  # generation.prefix_store: the blocks kept on disk too (0 = off)
    threads: int = 0
    tool_parser: str = ""
    reasoning_parser: str = ""  # generation.reasoning: "" (off) or one of its PARSERS
    structured_in_reasoning: bool = False  # vLLM's enable_in_reasoning: a grammar holds from the first token
    flush_denormals: bool = True  # edge_runtime.denormals: the engine's session and the batcher thread
    # A text decoder in onnxruntime-genai's format: "engine" runs it in ours (continuous batching, prefix
    # cache) when its graph fits (folder.read_genai_decoder), else onnxruntime-genai; "onnxruntime-genai"
    # always hands it to onnxruntime-genai (the genai extra).
    genai_runtime: str = "engine"
    # An optimum / onnx-community Qwen2 or Llama export is rebuilt as our fused graph at its first load
    # (``generation.fused_exports``: checked against the export's logits, cached); other int8 exports and VLM
    # q8 decoders get per-token activation scales (``generation.per_token_exports``); false serves every
    # graph as exported.
    fuse_exports: bool = True
    # Which ``onnx/model<suffix>.onnx`` of an onnx-community text folder to run (``folder.decoder_file``):
    # fp32, q8, int8, uint8, q4, bnb4, fp16, q4f16; "" = the first present, fp32 first.
    precision: str = ""

    def __post_init__(self) -> None:
        for key in ("max_batch_size", "max_seq_len", "prefill_chunk_tokens", "prefix_block_tokens"):
            if getattr(self, key) < 1:
                raise ConfigError(f"[generation] {key} must be >= 1, got {getattr(self, key)}")
        for key in ("max_queue", "kv_budget_tokens", "prefix_cache_bytes", "threads", "idle_prefill_chunk_tokens",
                    "prefix_cache_disk_bytes"):
            if getattr(self, key) < 0:
                raise ConfigError(f"[generation] {key} must be >= 0, got {getattr(self, key)}")
        if self.genai_runtime not in ("engine", "onnxruntime-genai"):
            raise ConfigError(f"[generation] genai_runtime must be 'engine' or 'onnxruntime-genai', "
                              f"got {self.genai_runtime!r}")
        from edge_runtime.generation.folder import SUFFIXES

        if self.precision not in ("", *SUFFIXES):
            raise ConfigError(f"[generation] precision must be one of {list(SUFFIXES)}, got {self.precision!r}")
        if self.tool_parser not in ("", "hermes", "json"):
            raise ConfigError(f"[generation] tool_parser must be 'hermes' or 'json', got {self.tool_parser!r}")
        from edge_runtime.generation.reasoning import PARSERS

        if self.reasoning_parser not in ("", *PARSERS):
            raise ConfigError(f"[generation] reasoning_parser must be one of {list(PARSERS)} (or \"\" for off), "
                              f"got {self.reasoning_parser!r}")

    def chunk_tokens(self, streams_decoding: bool, vocab_size: int) -> int:
        """Prefill chunk length: ``prefill_chunk_tokens`` while streams decode between chunks, else up to
        ``idle_prefill_chunk_tokens`` — as long as the chunk's logits ([chunk, vocab_size] float32, where the
        graph gives every position's; ``vocab_size`` 0: it gives the last only) stay under
        ``IDLE_CHUNK_LOGITS_BYTES``; never below ``prefill_chunk_tokens``."""
        if streams_decoding:
            return self.prefill_chunk_tokens
        fits = IDLE_CHUNK_LOGITS_BYTES // (4 * max(vocab_size, 1))
        return max(self.prefill_chunk_tokens, min(self.idle_prefill_chunk_tokens, fits))


def generation_settings(extra: Mapping[str, Any], where: str) -> GenerationSettings:
    """The ``[generation]`` table of a model config's ``extra`` sections (defaults when absent)."""
    table = extra.get("generation", {})
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: [generation] must be a table")
    return from_mapping(GenerationSettings, table, f"{where}: [generation]")
