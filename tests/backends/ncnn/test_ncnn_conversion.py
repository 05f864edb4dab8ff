"""Conversion: failures stay on ORT with the reason, the gate refuses bad conversions, the cache."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from backends.errors import ModelLoadError
from backends.ncnn import NcnnBackend, convert
from backends.ncnn.gate import ConversionRefusedError
from ncnn_helpers import assert_close, conv_model, ort_outputs

pytestmark = pytest.mark.requires_ncnn


def _folders(cache) -> list:
    return sorted(p for p in (cache / "ncnn").iterdir() if p.is_dir()) if (cache / "ncnn").is_dir() else []


def test_model_pnnx_cannot_convert_stays_on_onnxruntime_with_the_reason(make_runtime, tmp_path) -> None:
    proto = conv_model(quantise=True)  # Cast to int64 and back: pnnx leaves an unmapped Tensor.to
    path = tmp_path / "quantise.onnx"
    onnx.save(proto, str(path))
    rt = make_runtime()
    with pytest.raises(ModelLoadError, match="Tensor.to"):
        rt.load(path, backend="ncnn", input_shapes={"x": (1, 4, 16, 16)}).run(
            {"x": np.zeros((1, 4, 16, 16), np.float32)})
    model = rt.load(path, input_shapes={"x": (1, 4, 16, 16)})  # auto
    assert model.backend != "ncnn"
    why = dict(model.report.tried)["ncnn"]
    assert "pnnx" in why and "Tensor.to" in why
    x = np.random.default_rng(0).standard_normal((1, 4, 16, 16)).astype(np.float32)
    np.testing.assert_array_equal(model.run({"x": x})["y"], ort_outputs(proto, {"x": x})[0])


def test_static_model_fails_at_load_with_unsupported_style_message(options) -> None:
    proto = conv_model(quantise=True)
    proto.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1  # static: converts at compile
    with pytest.raises(convert.ConversionError, match=r"pnnx left 1 layer type\(s\) ncnn cannot run: Tensor.to"):
        NcnnBackend().compile(proto, options)


def test_dynamic_shape_that_fails_runs_on_onnxruntime_and_says_so(options) -> None:
    proto = conv_model(quantise=True, dynamic=True)
    executable = NcnnBackend().compile(proto, options)  # dynamic H, W: nothing converted yet
    assert executable.describe()["buckets"] == []
    x = np.random.default_rng(0).standard_normal((2, 4, 16, 16)).astype(np.float32)
    np.testing.assert_array_equal(executable.run({"x": x})["y"], ort_outputs(proto, {"x": x})[0])
    refused = executable.describe()["on_onnxruntime"]
    assert refused[0]["input_shapes"] == [[4, 16, 16]] and "Tensor.to" in refused[0]["reason"]


def test_gate_refuses_a_corrupted_conversion_with_the_numbers(options, ncnn_cache) -> None:
    proto = conv_model()
    NcnnBackend().compile(proto, options).prepare(((4, 16, 16),))
    (folder,) = _folders(ncnn_cache)
    weights = np.fromfile(folder / convert.BIN, dtype=np.uint8)
    # Scale the float32 weights (ncnn's .bin: a 4-byte tag then floats) by 1.01: a plausible-looking model.
    floats = weights[4:4 + (len(weights) - 4) // 4 * 4].view(np.float32) * np.float32(1.01)
    (folder / convert.BIN).write_bytes(weights[:4].tobytes() + floats.tobytes() + weights[4 + floats.size * 4:].tobytes())
    with pytest.raises(ConversionRefusedError, match=r"outputs differ from onnxruntime beyond 0.0001 \(fp32\): y: "
                                                     r"[0-9.e-]+") as info:
        NcnnBackend().compile(proto, options).prepare(((4, 16, 16),))
    worst = float(str(info.value).rsplit("y: ", 1)[1])
    assert 1e-4 < worst < 1.0


def test_conversion_cache_is_reused_and_invalidated_on_model_or_pnnx_change(options, ncnn_cache, monkeypatch) -> None:
    first = NcnnBackend().compile(conv_model(seed=0, dynamic=True), options).prepare(((4, 16, 16),))
    again = NcnnBackend().compile(conv_model(seed=0, dynamic=True), options).prepare(((4, 16, 16),))
    assert first.converted_now and not again.converted_now and first.folder == again.folder
    changed = NcnnBackend().compile(conv_model(seed=1, dynamic=True), options).prepare(((4, 16, 16),))
    assert changed.converted_now and changed.folder != first.folder
    other_shape = NcnnBackend().compile(conv_model(seed=0, dynamic=True), options).prepare(((4, 8, 8),))
    assert other_shape.converted_now and other_shape.folder not in (first.folder, changed.folder)
    manifest = first.folder / convert.MANIFEST
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "pnnx_version": "0.0.1-old"}))
    upgraded = NcnnBackend().compile(conv_model(seed=0, dynamic=True), options).prepare(((4, 16, 16),))
    assert upgraded.converted_now and json.loads(manifest.read_text())["pnnx_version"] == convert.pnnx_version()


def test_device_without_pnnx_runs_a_folder_converted_elsewhere(options, ncnn_cache, tmp_path, monkeypatch) -> None:
    proto = conv_model(seed=3, dynamic=True)
    made = NcnnBackend().compile(proto, options).prepare(((4, 16, 16),))
    monkeypatch.setattr(convert, "pnnx_version", lambda: None)
    monkeypatch.setattr(convert, "pnnx_binary", lambda: None)
    executable = NcnnBackend().compile(proto, options)
    x = np.random.default_rng(4).standard_normal((2, 4, 16, 16)).astype(np.float32)
    assert_close(executable.run({"x": x})["y"], ort_outputs(proto, {"x": x})[0])
    assert executable.describe()["buckets"][0]["folder"] == str(made.folder)
    with pytest.raises(Exception, match="pnnx is not installed"):
        NcnnBackend().compile(proto, options).prepare(((4, 8, 8),))  # a shape nobody converted


def test_convert_command_converts_into_the_cache_and_reports_the_gate(tmp_path, ncnn_cache, monkeypatch, capsys) -> None:
    from edge_runtime.cli import main

    path = tmp_path / "block.onnx"
    onnx.save(conv_model(seed=5, dynamic=True), str(path))
    monkeypatch.setenv("EDGE_RUNTIME_CACHE", str(ncnn_cache))
    assert main(["convert", str(path), "--to", "ncnn", "--shape", "x=1,4,16,16", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["converted_now"] and report["input_shapes"] == {"x": [1, 4, 16, 16]}
    assert report["gate_worst_error"] <= report["gate_tolerance"] == 1e-4
    assert (ncnn_cache / "ncnn").is_dir() and str(ncnn_cache) in report["folder"]
    assert main(["convert", str(path), "--shape", "x=1,4,16,16"]) == 0
    assert "already in the cache" in capsys.readouterr().out
    assert main(["convert", str(path), "--shape", "nope=1,2"]) == 2
    assert "unknown input" in capsys.readouterr().err


def test_least_recently_used_nets_are_unloaded_and_reload_from_disk(options, monkeypatch) -> None:
    from backends.ncnn import executable as executable_module

    monkeypatch.setattr(executable_module, "MAX_LOADED_BUCKETS", 1)
    proto = conv_model(seed=6, dynamic=True)
    executable = NcnnBackend().compile(proto, options)
    rng = np.random.default_rng(7)
    for shape in ((1, 4, 8, 8), (1, 4, 12, 8), (1, 4, 8, 8)):
        x = rng.standard_normal(shape).astype(np.float32)
        assert_close(executable.run({"x": x})["y"], ort_outputs(proto, {"x": x})[0])
    (loaded,) = executable.describe()["buckets"]
    assert loaded["input_shapes"] == [[4, 8, 8]] and not loaded["converted_now"]  # reloaded from the cache
