"""Byte-level BPE tokenizers trained locally with ``tokenizers`` (no download), with their chat templates.

``write_tokenizer_files(folder, vocab, style)`` writes ``tokenizer.json``,
``tokenizer_config.json`` and the template the way a ``transformers`` save
does: ``style="qwen2"`` keeps a ChatML template in ``chat_template.jinja``
(newer layout, EOS ``<|im_end|>`` and ``<|endoftext|>``); ``style="llama"``
keeps its template in ``tokenizer_config.json`` (older layout) and adds BOS to
plain prompts. A small corpus stops merging early, so the vocabulary is
filled with ``<extra_i>`` tokens: every id of the model decodes.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

QWEN_TEMPLATE = ("{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
                 "+ '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}"
                 "{{ '<|im_start|>assistant\\n' }}{%- endif %}")
LLAMA_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{% if message['role'] not in ['system', 'user', "
                  "'assistant'] %}{{ raise_exception('unknown role ' + message['role']) }}{% endif %}"
                  "{{ '[' + message['role'] | upper + '] ' + message['content'] | trim + eos_token }}{% endfor %}"
                  "{% if add_generation_prompt %}{{ '[ASSISTANT] ' }}{% endif %}")
CORPUS_WORDS = ("the agent taps the button and reads the screen then scrolls down to find the settings menu "
                "open close swipe left right home back wait type search result page title label value ok cancel "
                "phone screenshot action history system prompt user assistant tool call json name arguments "
                "héllo wörld 你好 世界 ✓ → emoji 🙂 naïve café").split()


def corpus(seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(CORPUS_WORDS) for _ in range(rng.randint(4, 24))) for _ in range(4000)] + [
        "".join(chr(rng.randint(0x20, 0x7E)) for _ in range(64)) for _ in range(400)]


def _train(folder: Path, vocab: int, style: str, seed: int, extra_specials: tuple[str, ...] = ()) -> list[str]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] if style == "qwen2" else ["<unk>", "<s>", "</s>"]
    specials += [s for s in extra_specials if s not in specials]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>" if style == "llama" else None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus(seed), trainer)
    if style == "llama":
        bos = tokenizer.token_to_id("<s>")
        tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                                 special_tokens=[("<s>", bos)])
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    extra = vocab - tokenizer.get_vocab_size()
    if extra > 0:
        tokenizer.add_tokens([f"<extra_{i}>" for i in range(extra)])
    tokenizer.save(str(folder / "tokenizer.json"))
    return specials


def write_tokenizer_files(folder: Path, vocab: int, style: str = "qwen2", *, seed: int = 0,
                          max_positions: int = 2048) -> tuple[int, list[int]]:
    """Train and write the tokenizer files; returns (bos id, eos ids)."""
    from tokenizers import Tokenizer

    if style not in ("qwen2", "llama"):
        raise ValueError(f"unknown tokenizer style {style!r}: expected 'qwen2' or 'llama'")
    folder = Path(folder)
    specials = _train(folder, vocab, style, seed)
    ids = {s: Tokenizer.from_file(str(folder / "tokenizer.json")).token_to_id(s) for s in specials}
    if style == "qwen2":
        (folder / "chat_template.jinja").write_text(QWEN_TEMPLATE)
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
                  "pad_token": "<|endoftext|>", "bos_token": None, "model_max_length": max_positions,
                  "add_bos_token": False}
        bos, eos = ids["<|endoftext|>"], [ids["<|im_end|>"], ids["<|endoftext|>"]]
    else:
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
                  "unk_token": "<unk>", "model_max_length": max_positions, "chat_template": LLAMA_TEMPLATE}
        bos, eos = ids["<s>"], [ids["</s>"]]
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (folder / "special_tokens_map.json").write_text(json.dumps(
        {k: v for k, v in config.items() if k.endswith("_token") and v}, indent=2))
    return bos, eos
