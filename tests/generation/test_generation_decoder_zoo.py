"""The torch-free decoder (``edge_runtime.decoder_zoo``) against transformers' Qwen2 and the oracle."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from generation_fixtures import oracle_greedy


def test_logits_equal_transformers_qwen2_on_the_same_weights() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import onnxruntime as ort

    from edge_runtime.decoder_zoo import DecoderShape, build_decoder, random_weights

    shape = DecoderShape(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=96, vocab=300, max_positions=64)
    weights = random_weights(shape, seed=4)
    config = transformers.Qwen2Config(vocab_size=shape.vocab, hidden_size=shape.hidden, num_hidden_layers=shape.layers,
                                      num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                                      intermediate_size=shape.intermediate, max_position_embeddings=shape.max_positions,
                                      rms_norm_eps=shape.rms_eps, rope_theta=shape.rope_theta, tie_word_embeddings=True)
    hf = transformers.Qwen2ForCausalLM(config).eval()
    state = {k: torch.from_numpy(v) for k, v in weights.items()}
    state["lm_head.weight"] = state["model.embed_tokens.weight"]
    hf.load_state_dict(state, strict=True)
    session = ort.InferenceSession(build_decoder(shape, weights).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    ids = np.random.default_rng(0).integers(0, shape.vocab, (2, 11))
    mask = np.ones((2, 11), np.int64)
    mask[1, :3] = 0  # left padding in row 1, as batched decoding uses
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
    for n in range(shape.layers):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{n}.{kind}"] = np.zeros((2, shape.kv_heads, 0, shape.head_dim), np.float32)
    ours = session.run(["logits"], feeds)[0]
    with torch.no_grad():
        theirs = hf(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                    position_ids=torch.from_numpy(positions)).logits.numpy()
    np.testing.assert_allclose(ours[0], theirs[0], atol=2e-3, rtol=1e-3)
    np.testing.assert_allclose(ours[1, 3:], theirs[1, 3:], atol=2e-3, rtol=1e-3)  # padded queries are undefined


@pytest.mark.aarch64  # greedy decoding against the no-cache oracle, on arm64 too (no torch needed)
def test_demo_folder_generates_like_the_oracle(tmp_path: Path, model_factory) -> None:
    from edge_runtime.decoder_zoo import DecoderShape, write_decoder_folder

    folder = write_decoder_folder(tmp_path / "tiny", DecoderShape(vocab=600, max_positions=128), seed=1)
    model = model_factory(folder, max_batch_size=2)
    messages = [{"role": "user", "content": "open the settings menu"}]
    result = model.generate(messages=messages, max_tokens=16)
    expected = oracle_greedy(folder, model.prepare(messages=messages).ids, 16, set(model.folder.eos_token_ids))
    assert list(result.token_ids) == expected
    assert len(set(expected)) > 3  # varied tokens, not one repeated


def test_our_graph_from_hf_weights_generates_like_the_optimum_export(hf_model_folder: Path, onnx_folder: Path,
                                                                     tmp_path: Path, model_factory) -> None:
    pytest.importorskip("safetensors")
    from edge_runtime.decoder_zoo import decoder_folder_from_hf

    lean = model_factory(decoder_folder_from_hf(hf_model_folder, tmp_path / "lean"), max_batch_size=2)
    exported = model_factory(onnx_folder)
    messages = [{"role": "user", "content": "open the settings menu then scroll down"}]
    a = lean.generate(messages=messages, max_tokens=20)
    b = exported.generate(messages=messages, max_tokens=20)
    assert a.token_ids == b.token_ids
    assert list(a.token_ids) == oracle_greedy(onnx_folder, exported.prepare(messages=messages).ids, 20,
                                              set(exported.folder.eos_token_ids))


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_fp16_kv_cache_matches_its_own_no_cache_oracle(fused: bool, tmp_path: Path, model_factory) -> None:
    import onnx
    from onnxconverter_common import float16

    from edge_runtime.decoder_zoo import DecoderShape, write_decoder_folder

    folder = write_decoder_folder(tmp_path / "fp16", DecoderShape(vocab=600, max_positions=128), seed=2, fused=fused)
    model = onnx.load(str(folder / "model.onnx"))
    onnx.save(float16.convert_float_to_float16(model, keep_io_types=False), str(folder / "model.onnx"))
    fp16 = model_factory(folder, max_batch_size=2)
    assert fp16.folder.kv.dtype == np.float16 and fp16.folder.kv_in_place == fused
    prompt = fp16.prepare("the agent taps the button").ids
    result = fp16.generate(prompt, max_tokens=12)
    assert list(result.token_ids) == oracle_greedy(folder, prompt, 12, set(fp16.folder.eos_token_ids))


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_prefill_asks_for_the_last_positions_logits_only(fused: bool, tmp_path: Path) -> None:
    """Our graphs take ``logits_to_keep`` (the LM head over the last k positions; 0, the default a runtime
    that does not know it gets, keeps all); the engine's prefill asks for one position, with the logits the
    full head gives there, and idle prefill chunks are then no longer capped by logits memory."""
    import onnxruntime as ort

    from edge_runtime.decoder_zoo import DecoderShape, write_decoder_folder
    from edge_runtime.generation.engine import DecoderEngine
    from edge_runtime.generation.folder import LOGITS_TO_KEEP, read_folder
    from edge_runtime.generation.settings import GenerationSettings

    shape = DecoderShape(vocab=600, max_positions=128)
    description = read_folder(write_decoder_folder(tmp_path / "d", shape, seed=3, fused=fused))
    assert description.keeps_logits and description.prefill_logits_vocab == 0
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(description.model_path), options, providers=["CPUExecutionProvider"])
    assert LOGITS_TO_KEEP not in [i.name for i in session.get_inputs()]  # nobody has to feed it
    assert LOGITS_TO_KEEP in [i.name for i in session.get_overridable_initializers()]
    tokens = list(range(5, 25))
    empty = np.zeros((1, shape.kv_heads, 0, shape.head_dim), np.float32)
    feeds = {"input_ids": np.asarray([tokens], np.int64), "attention_mask": np.ones((1, len(tokens)), np.int64),
             "position_ids": np.arange(len(tokens), dtype=np.int64)[None],
             **{i.name: empty for i in session.get_inputs() if i.name.startswith("past_key_values.")}}
    full = session.run(["logits"], feeds)[0]
    assert full.shape == (1, len(tokens), shape.vocab)
    for keep in (1, 3):
        kept = session.run(["logits"], {**feeds, LOGITS_TO_KEEP: np.array(keep, np.int64)})[0]
        np.testing.assert_allclose(kept, full[:, -keep:], atol=1e-5, rtol=1e-5)

    engine = DecoderEngine(description, threads=1, max_batch=1, max_len=64)
    asked: list[dict] = []
    session = engine.session

    class Spy:  # what the engine feeds its session (prefill calls run only)
        def run(self, names, feeds):  # noqa: ANN001, ANN201
            asked.append(dict(feeds))
            return session.run(names, feeds)

    engine.session = Spy()
    last, _ = engine.prefill(tokens, None)
    assert int(asked[-1][LOGITS_TO_KEEP]) == 1
    np.testing.assert_allclose(last, full[0, -1], atol=1e-5, rtol=1e-5)

    settings = GenerationSettings()
    assert settings.chunk_tokens(False, description.prefill_logits_vocab) == settings.idle_prefill_chunk_tokens
    assert settings.chunk_tokens(False, 151_936) == settings.prefill_chunk_tokens  # a graph giving every position


def test_convert_writes_a_text_checkpoint_in_bf16_shards_as_our_fused_folder(hf_model_folder: Path,
                                                                              tmp_path: Path) -> None:
    """``edge-runtime convert CHECKPOINT --to onnx --out DIR`` on a text checkpoint saved as bfloat16 in
    shards (how released checkpoints come): the folder generates what transformers generates from the
    same checkpoint (its weights read as float32); the flags that belong to VLMs are refused."""
    import torch
    import transformers

    from edge_runtime.cli import main
    from edge_runtime.generation.folder import read_folder
    from generation_fixtures import make_model

    checkpoint = tmp_path / "bf16"
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_model_folder)
    hf.to(torch.bfloat16).save_pretrained(checkpoint, max_shard_size="100KB")
    for item in hf_model_folder.iterdir():
        if item.suffix in (".json", ".jinja") and not (checkpoint / item.name).exists():
            shutil.copy2(item, checkpoint / item.name)
    assert (checkpoint / "model.safetensors.index.json").is_file()
    assert main(["convert", str(checkpoint), "--to", "onnx", "--out", str(tmp_path / "out")]) == 0
    assert read_folder(tmp_path / "out").kv_in_place
    reference = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, torch_dtype=torch.float32).eval()
    ids = list(range(5, 45))
    with torch.no_grad():
        out = reference.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)
    model = make_model(tmp_path / "out")
    try:
        assert list(model.generate(prompt=ids, max_tokens=16, ignore_eos=True).token_ids) == out[0, len(ids):].tolist()
    finally:
        model.close()
    assert main(["convert", str(checkpoint), "--to", "onnx", "--out", str(tmp_path / "q"), "--quantize"]) == 2
