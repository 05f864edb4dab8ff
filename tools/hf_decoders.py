"""Tiny random-weight decoder LLMs in Hugging Face layout, exported by ``optimum`` (tests, benchmark).

``hf_folder(spec, root)`` builds a ``transformers`` model (Qwen2-style: GQA, tied
embeddings, q/k/v biases; or Llama-style: untied head, no biases) from a fixed
seed, trains a byte-level BPE tokenizer locally with ``tokenizers`` and saves
both. ``optimum_folder(spec, root)`` exports it with ``optimum`` as
``text-generation-with-past`` (one ``model.onnx`` with ``past_key_values.*``).
Both are cached under ``root`` keyed by the spec, so a second call is free.

Random weights at the default init std (0.02) make greedy decoding repeat one
token; ``init_std`` ~0.2 and non-trivial biases and norm weights give varied
tokens, and a runtime that drops a bias or a norm then fails the oracles.
Needs torch, transformers and optimum-onnx (the test extra).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from edge_runtime.tokenizer_zoo import write_tokenizer_files

@dataclass(frozen=True)
class DecoderSpec:
    arch: str = "qwen2"  # "qwen2", "qwen3" or "llama"
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    vocab: int = 512
    max_positions: int = 512
    init_std: float = 0.2
    seed: int = 0
    # Llama 3's rope scaling: (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings)
    llama3_rope: tuple[float, float, float, int] | None = None
    head_dim: int = 0  # qwen3: its own head size (0: hidden / heads)

    @property
    def key(self) -> str:
        fields = asdict(self)
        for name, unset in (("llama3_rope", None), ("head_dim", 0)):
            if fields[name] == unset:  # keys of specs from before the field stay as they were
                del fields[name]
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


def _perturb(model, seed: int) -> None:
    """Non-trivial biases and norm weights (zeros and ones would hide a runtime that drops them)."""
    import torch

    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.copy_(0.1 * torch.randn(parameter.shape, generator=generator))
            elif "norm" in name:
                parameter.copy_(1.0 + 0.2 * torch.randn(parameter.shape, generator=generator))


def hf_folder(spec: DecoderSpec, root: Path) -> Path:
    """The model saved with ``save_pretrained`` plus its tokenizer files (cached by spec)."""
    out = Path(root) / f"hf-{spec.arch}-{spec.key}"
    if (out / "done").is_file():
        return out
    import torch
    import transformers

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    style = "llama" if spec.arch == "llama" else "qwen2"  # Qwen3 keeps Qwen2's ChatML tokenizer
    bos, eos = write_tokenizer_files(tmp, spec.vocab, style, seed=spec.seed, max_positions=spec.max_positions)
    common = dict(vocab_size=spec.vocab, hidden_size=spec.hidden, num_hidden_layers=spec.layers,
                  num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads,
                  intermediate_size=spec.intermediate, max_position_embeddings=spec.max_positions,
                  initializer_range=spec.init_std, bos_token_id=bos, eos_token_id=eos, rms_norm_eps=1e-6)
    if spec.arch == "qwen2":
        config = transformers.Qwen2Config(tie_word_embeddings=True, rope_theta=10000.0, **common)
        cls = transformers.Qwen2ForCausalLM
    elif spec.arch == "qwen3":  # q/k norms, no q/k/v biases, a head size of its own
        config = transformers.Qwen3Config(tie_word_embeddings=True, rope_theta=10000.0,
                                          head_dim=spec.head_dim or spec.hidden // spec.heads, **common)
        cls = transformers.Qwen3ForCausalLM
    elif spec.arch == "llama":
        scaling = None if spec.llama3_rope is None else dict(zip(
            ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"), spec.llama3_rope),
            rope_type="llama3")
        config = transformers.LlamaConfig(tie_word_embeddings=False, rope_theta=10000.0, rope_scaling=scaling, **common)
        cls = transformers.LlamaForCausalLM
    else:
        raise ValueError(f"unknown arch {spec.arch!r}: expected 'qwen2', 'qwen3' or 'llama'")
    torch.manual_seed(spec.seed)
    model = cls(config).eval()
    _perturb(model, spec.seed)
    model.save_pretrained(tmp)
    transformers.GenerationConfig(bos_token_id=bos, eos_token_id=eos, do_sample=False).save_pretrained(tmp)
    (tmp / "done").write_text("ok")
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return out


def optimum_folder(spec: DecoderSpec, root: Path) -> Path:
    """The ``optimum`` export (``text-generation-with-past``) of ``hf_folder(spec)``, cached."""
    source = hf_folder(spec, root)
    out = Path(root) / f"onnx-{spec.arch}-{spec.key}"
    if (out / "done").is_file():
        return out
    from optimum.exporters.onnx import main_export

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    main_export(str(source), output=str(tmp), task="text-generation-with-past", no_post_process=False,
                do_validation=False)
    for name in ("chat_template.jinja", "tokenizer.json", "tokenizer_config.json"):
        if (source / name).is_file() and not (tmp / name).is_file():
            shutil.copyfile(source / name, tmp / name)
    (tmp / "done").write_text("ok")
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return out


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--arch", default="qwen2")
    args = parser.parse_args()
    print(optimum_folder(DecoderSpec(arch=args.arch), args.root))
