"""onnxruntime-genai folders: a text decoder runs in our engine (``[generation] genai_runtime = "engine"``,
the default), or through onnxruntime_genai (the ``genai`` extra) with our sampler on top.

The folders are our exports described in genai's format (``genai_config_for``): the
optimum export, and our GroupQueryAttention graph with its KV dims left symbolic and
its position input dropped, as genai's model builder writes them (the builder itself
needs transformers 5, which the test environment's optimum cannot take). Oracles:
onnxruntime-genai's own tokens on the same folder, the ORT engine on the same ONNX
file, and the no-cache recompute.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime_genai")  # the genai extra; the test extra installs it


@pytest.fixture(scope="module")
def genai_folder(qwen_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edge_runtime.generation.folder import read_folder
    from edge_runtime.generation.genai_engine import genai_config_for

    folder = Path(shutil.copytree(qwen_folder, tmp_path_factory.mktemp("genai") / "qwen"))
    (folder / "genai_config.json").write_text(json.dumps(genai_config_for(read_folder(qwen_folder), threads=1)))
    return folder


def test_genai_folder_generates_the_same_tokens_as_the_ort_engine(genai_folder: Path, qwen_folder: Path,
                                                                   model_factory) -> None:
    from edge_runtime.generation.folder import is_generative_folder

    assert is_generative_folder(genai_folder)
    genai = model_factory(genai_folder, genai_runtime="onnxruntime-genai")
    ours = model_factory(qwen_folder)
    assert genai.backend == "onnxruntime-genai"
    messages = [{"role": "user", "content": "open the settings menu"}]
    for kwargs in ({"messages": messages, "max_tokens": 16}, {"prompt": "the agent taps", "max_tokens": 12},
                   {"prompt": "the agent taps", "max_tokens": 12, "temperature": 0.8, "seed": 3}):
        a, b = genai.generate(**kwargs), ours.generate(**kwargs)
        assert a.token_ids == b.token_ids and a.text == b.text and a.finish_reason == b.finish_reason


def test_genai_folder_reports_context_and_queue_errors(genai_folder: Path, model_factory) -> None:
    from edge_runtime.errors import InvalidInputError

    model = model_factory(genai_folder, max_seq_len=32, genai_runtime="onnxruntime-genai")
    with pytest.raises(InvalidInputError, match="context is 32 tokens"):
        model.generate(list(range(3, 43)), max_tokens=2)


@pytest.fixture(scope="module")
def builder_like_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Our GroupQueryAttention graph of the test Qwen2 weights as genai's builder lays it out: no
    ``position_ids`` (rotary from the cache's lengths), past/present dims symbolic but the batch, one
    KV buffer shared by past and present, no ``config.json`` (``genai_config.json`` says it all)."""
    import onnx

    from edge_runtime.decoder_zoo import decoder_folder_from_hf
    from edge_runtime.generation.folder import read_folder
    from edge_runtime.generation.genai_engine import genai_config_for
    from generation_fixtures import SPECS, models_root
    from hf_decoders import hf_folder

    root = tmp_path_factory.mktemp("builder-like")
    fused = decoder_folder_from_hf(hf_folder(SPECS["qwen2"], models_root()), root / "fused", fused=True)
    config = genai_config_for(read_folder(fused), threads=1)
    folder = root / "genai"
    folder.mkdir()
    model = onnx.load(str(fused / "model.onnx"))
    inputs = [v for v in model.graph.input if v.name != "position_ids"]
    readers = [n for n in model.graph.node if "position_ids" in n.input]
    assert readers and all(n.op_type == "GroupQueryAttention" for n in readers)
    for node in readers:  # rotary positions from each row's cache length, as the builder's graph has them
        node.input[:] = ["" if name == "position_ids" else name for name in node.input]
    for value in list(model.graph.input):
        if value.name.startswith("past_key_values."):
            dims = value.type.tensor_type.shape.dim
            dims[1].ClearField("dim_value")
            dims[1].dim_param = "kv_heads"
            dims[3].ClearField("dim_value")
            dims[3].dim_param = "head_size"
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    onnx.save(model, str(folder / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (fused / name).is_file():
            shutil.copy(fused / name, folder / name)
    config["model"]["decoder"]["inputs"].pop("position_ids", None)
    config["search"]["past_present_share_buffer"] = True
    (folder / "genai_config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("which", ["optimum", "builder-like"])
def test_a_genai_text_folder_runs_in_our_engine_with_onnxruntime_genai_s_tokens(
        which: str, genai_folder: Path, builder_like_folder: Path, model_factory) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from generation_fixtures import oracle_greedy

    folder = genai_folder if which == "optimum" else builder_like_folder
    ours = model_factory(folder, max_batch_size=3, prefill_chunk_tokens=8)  # genai_runtime "engine": the default
    theirs = model_factory(folder, genai_runtime="onnxruntime-genai")
    assert ours.backend == "cpu" and theirs.backend == "onnxruntime-genai"
    assert ours.folder.kv_in_place is (which == "builder-like")  # GroupQueryAttention: KV appended in place
    assert ours.folder.has_position_ids is (which == "optimum")
    prompts = [ours.prepare(messages=[{"role": "user", "content": "open the settings menu then scroll"}]).ids,
               ours.prepare(prompt="the agent taps the back button").ids, list(range(5, 40))]
    alone = [ours.generate(prompt=ids, max_tokens=14, ignore_eos=True) for ids in prompts]
    for ids, got in zip(prompts, alone):
        assert got.token_ids == theirs.generate(prompt=ids, max_tokens=14, ignore_eos=True).token_ids
    if which == "optimum":  # and the no-cache recompute (this folder keeps the export's config.json)
        eos = set(ours.folder.eos_token_ids)
        assert list(ours.generate(prompt=prompts[2], max_tokens=10).token_ids) == oracle_greedy(
            folder, prompts[2], 10, eos)
    with ThreadPoolExecutor(3) as pool:  # continuous batching: three rows at once, each as alone
        together = list(pool.map(lambda ids: ours.generate(prompt=ids, max_tokens=14, ignore_eos=True), prompts))
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    from edge_runtime.generation.footprint import loaded_footprint, planned_footprint

    planned = planned_footprint(folder, ours.settings, 1.0)  # the memory budget counts our KV and caches
    assert planned == loaded_footprint(ours, 1.0) and planned.kv_cache_bytes > 0
    assert planned_footprint(folder, theirs.settings, 1.0).kv_cache_bytes == 0  # genai owns its KV
    again = ours.generate(prompt=prompts[0] + [7, 8, 9], max_tokens=6, ignore_eos=True)  # our prefix cache
    assert again.usage.cached_tokens >= len(prompts[0]) - ours.settings.prefix_block_tokens
    assert again.token_ids == theirs.generate(prompt=prompts[0] + [7, 8, 9], max_tokens=6, ignore_eos=True).token_ids


def test_a_genai_folder_the_engine_cannot_run_stays_onnxruntime_genai_s(genai_folder: Path, tmp_path: Path) -> None:
    from edge_runtime.config import ConfigError
    from edge_runtime.generation.folder import read_genai_decoder
    from edge_runtime.generation.settings import GenerationSettings

    def variant(name: str, change) -> Path:
        folder = Path(shutil.copytree(genai_folder, tmp_path / name))
        config = json.loads((folder / "genai_config.json").read_text())
        change(config["model"])
        (folder / "genai_config.json").write_text(json.dumps(config))
        return folder

    assert read_genai_decoder(genai_folder)[0] is not None
    renamed = variant("renamed", lambda m: m["decoder"]["inputs"].update(input_ids="tokens"))
    assert read_genai_decoder(renamed) == (None, "its graph names {'input_ids': 'tokens'} differ from the engine's")
    vision = variant("vision", lambda m: m.update(vision={"filename": "vision.onnx"}))
    assert read_genai_decoder(vision) == (None, "it has parts besides the decoder (vision)")
    with pytest.raises(ConfigError, match="genai_runtime must be 'engine' or 'onnxruntime-genai', got 'genai'"):
        GenerationSettings(genai_runtime="genai")


def test_n_choices_on_a_folder_genai_runs_are_a_400(genai_folder: Path,
                                                    tmp_path_factory: pytest.TempPathFactory) -> None:
    import openai

    from generation_fixtures import base_url, served_repository

    root = tmp_path_factory.mktemp("genai-repository")
    shutil.copytree(genai_folder, root / "genai" / "1")
    (root / "genai" / "config.toml").write_text('[generation]\ngenai_runtime = "onnxruntime-genai"\n')
    with served_repository(root, tmp_path_factory.mktemp("cache")) as live:
        client = openai.OpenAI(base_url=base_url(live) + "/v1", api_key="unused", max_retries=0, timeout=60)
        messages = [{"role": "user", "content": "open the settings menu"}]
        with pytest.raises(openai.BadRequestError, match="'n' must be 1 for genai: onnxruntime-genai runs it"):
            client.chat.completions.create(model="genai", messages=messages, max_tokens=4, n=2)
        one = client.chat.completions.create(model="genai", messages=messages, max_tokens=4, n=1)
        assert len(one.choices) == 1 and one.usage.completion_tokens >= 1
