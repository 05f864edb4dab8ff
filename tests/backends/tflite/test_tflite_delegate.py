"""External delegates, for real: a delegate built from C here, loaded by LiteRT through the backend.

The delegate (``edge_test_delegate.c``) logs every option it receives and,
with ``claim=ADD``, runs every float ADD in its own kernel, so the reported
nodes/partitions and the per-request variant switch can be checked.
"""

from __future__ import annotations

import gc
import hashlib
import logging
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from backends.base import CompileOptions, DelegateSpec
from backends.tflite import TFLiteBackend

pytestmark = pytest.mark.requires_litert

# LiteRT's half-built Delegate may print this from __del__ after a failed load.
DELEGATE_DEL_WARNING = "ignore:Exception ignored in.*Delegate.__del__:pytest.PytestUnraisableExceptionWarning"


def _compile(model: Path, *specs: DelegateSpec, **options: object) -> object:
    return TFLiteBackend().compile(model, CompileOptions(intra_op_threads=1, delegates=specs, **options))


def _spec(library: Path, log: Path, **options: str) -> DelegateSpec:
    return DelegateSpec(str(library), (("log_path", str(log)), *options.items()))


def test_delegate_gets_its_options_and_keeps_cpu_results(
        tflite_models: dict[str, Path], delegate_library: Path, tmp_path: Path, litert_oracle: Callable,
        image: Callable, read_log: Callable) -> None:
    log = tmp_path / "delegate.log"
    executable = _compile(tflite_models["float_cnn"], _spec(delegate_library, log, claim="none", color="blue"))
    assert read_log(log)[:4] == [f"option log_path={log}", "option claim=none", "option color=blue", "created"]
    status = executable.delegate_status
    assert (status.loaded, status.error) == (True, "")
    assert status.to_dict()["nodes_delegated"] == 0 and status.to_dict()["partitions"] == 0
    assert executable.variants == ("delegate", "cpu") and executable.default_variant == "delegate"
    x = image((1, 16, 16, 3), 1)
    np.testing.assert_allclose(executable.run({"image": x})["probs"],
                               litert_oracle(tflite_models["float_cnn"], {"image": x})["probs"], rtol=1e-6)


def test_claimed_nodes_are_counted_and_run_in_the_delegate(
        tflite_models: dict[str, Path], delegate_library: Path, tmp_path: Path, litert_oracle: Callable,
        image: Callable, read_log: Callable) -> None:
    log = tmp_path / "delegate.log"
    executable = _compile(tflite_models["float_cnn"], _spec(delegate_library, log, claim="ADD"))
    described = executable.describe()["delegate"]
    # The two ADDs sit apart (after HARD_SWISH and after FULLY_CONNECTED): two partitions.
    assert {k: described[k] for k in ("loaded", "nodes_delegated", "partitions", "total_nodes")} == {
        "loaded": True, "nodes_delegated": 2, "partitions": 2, "total_nodes": 10}
    assert "prepare plan_nodes=10 claimed=2" in read_log(log)
    assert executable.low_coverage  # 2 partitions, 20 % of the nodes
    x = image((1, 16, 16, 3), 2)
    expected = litert_oracle(tflite_models["float_cnn"], {"image": x})["probs"]
    invokes = read_log(log).count("invoke nodes=1")
    np.testing.assert_allclose(executable.run({"image": x})["probs"], expected, rtol=1e-6)
    assert read_log(log).count("invoke nodes=1") == invokes + 2  # both partitions ran our kernel
    np.testing.assert_allclose(executable.run({"image": x}, variant="cpu")["probs"], expected, rtol=1e-6)
    assert read_log(log).count("invoke nodes=1") == invokes + 2  # the CPU variant never touches it


def test_single_partition_is_not_low_coverage(tflite_models: dict[str, Path], delegate_library: Path,
                                              tmp_path: Path) -> None:
    # The primary subgraph of two_signatures is ADD, MUL: the ADD is half of it, in one partition.
    executable = _compile(tflite_models["two_signatures"], _spec(delegate_library, tmp_path / "d.log", claim="ADD"))
    status = executable.delegate_status
    assert (status.coverage.nodes_delegated, status.coverage.partitions, status.coverage.total_nodes) == (1, 1, 2)
    assert not executable.low_coverage


def test_close_releases_the_delegate(tflite_models: dict[str, Path], delegate_library: Path, tmp_path: Path,
                                     read_log: Callable) -> None:
    log = tmp_path / "delegate.log"
    executable = _compile(tflite_models["float_cnn"], _spec(delegate_library, log))
    assert "destroyed" not in read_log(log)
    executable.close()
    gc.collect()
    assert read_log(log)[-1] == "destroyed"


def _assert_cpu_fallback(executable: object, library: Path, error_part: str, model: Path,
                         litert_oracle: Callable, image: Callable) -> None:
    status = executable.delegate_status
    assert status.library == str(library) and status.loaded is False
    assert error_part in status.error
    assert status.to_dict()["nodes_delegated"] == 0 and status.to_dict()["total_nodes"] == 10
    assert executable.variants == ("cpu",) and not executable.low_coverage
    x = image((1, 16, 16, 3), 4)
    np.testing.assert_array_equal(executable.run({"image": x})["probs"], litert_oracle(model, {"image": x})["probs"])


@pytest.mark.filterwarnings(DELEGATE_DEL_WARNING)
def test_missing_library_falls_back_to_cpu(tflite_models: dict[str, Path], tmp_path: Path,
                                           litert_oracle: Callable, image: Callable,
                                           caplog: pytest.LogCaptureFixture) -> None:
    missing = tmp_path / "libno_such_delegate.so"
    with caplog.at_level(logging.WARNING, logger="backends.tflite"):
        executable = _compile(tflite_models["float_cnn"], DelegateSpec(str(missing)))
    _assert_cpu_fallback(executable, missing, "OSError", tflite_models["float_cnn"], litert_oracle, image)
    assert "cannot open shared object file" in executable.delegate_status.error
    assert any(str(missing) in r.getMessage() and "running on CPU" in r.getMessage() for r in caplog.records)


@pytest.mark.filterwarnings(DELEGATE_DEL_WARNING)
def test_library_without_plugin_symbols_falls_back(tflite_models: dict[str, Path], no_symbol_library: Path,
                                                   litert_oracle: Callable, image: Callable) -> None:
    executable = _compile(tflite_models["float_cnn"], DelegateSpec(str(no_symbol_library)))
    _assert_cpu_fallback(executable, no_symbol_library, "AttributeError", tflite_models["float_cnn"],
                         litert_oracle, image)
    assert "tflite_plugin_create_delegate" in executable.delegate_status.error


def test_create_returning_null_falls_back(tflite_models: dict[str, Path], delegate_library: Path, tmp_path: Path,
                                          litert_oracle: Callable, image: Callable) -> None:
    executable = _compile(tflite_models["float_cnn"], _spec(delegate_library, tmp_path / "d.log", fail="create"))
    _assert_cpu_fallback(executable, delegate_library, "ValueError", tflite_models["float_cnn"],
                         litert_oracle, image)
    assert "create failed on request" in executable.delegate_status.error  # the delegate's own report


def test_failing_prepare_falls_back(tflite_models: dict[str, Path], delegate_library: Path, tmp_path: Path,
                                    litert_oracle: Callable, image: Callable, read_log: Callable) -> None:
    log = tmp_path / "d.log"
    executable = _compile(tflite_models["float_cnn"], _spec(delegate_library, log, fail="prepare"))
    _assert_cpu_fallback(executable, delegate_library, "Prepare failed", tflite_models["float_cnn"],
                         litert_oracle, image)
    assert "prepare failing on request" in read_log(log)


def test_delegates_are_a_preference_list(tflite_models: dict[str, Path], delegate_library: Path,
                                         tmp_path: Path) -> None:
    missing = DelegateSpec(str(tmp_path / "libmissing.so"))
    first, second = _spec(delegate_library, tmp_path / "1.log"), _spec(delegate_library, tmp_path / "2.log")
    executable = _compile(tflite_models["float_cnn"], missing, first, second)
    assert [s.loaded for s in executable.delegate_attempts] == [False, True]  # second never tried
    assert executable.delegate_status.options == first.options
    assert not (tmp_path / "2.log").exists()


def _logged_options(lines: list[str]) -> dict[str, str]:
    return dict(line.removeprefix("option ").split("=", 1) for line in lines if line.startswith("option "))


def test_gpu_delegate_gets_serialization_options(tflite_models: dict[str, Path], gpu_named_delegate: Path,
                                                 tmp_path: Path, read_log: Callable) -> None:
    model = tflite_models["float_cnn"]
    log, cache = tmp_path / "gpu.log", tmp_path / "cache"
    _compile(model, _spec(gpu_named_delegate, log), cache_dir=cache, cache_key_extra="dev-1")
    seen = _logged_options(read_log(log))
    token = hashlib.sha256(model.read_bytes() + b"|dev-1").hexdigest()[:32]
    assert seen["serialization_dir"] == str(cache / "tflite") and (cache / "tflite").is_dir()
    assert seen["model_token"] == token
    # The backend's own cache_dir serves when the options carry none; another device key, another token.
    log.unlink()
    TFLiteBackend(cache_dir=cache).compile(model, CompileOptions(
        delegates=(_spec(gpu_named_delegate, log),), cache_key_extra="dev-2"))
    assert _logged_options(read_log(log))["model_token"] not in ("", token)


def test_spec_options_win_over_serialization_defaults(tflite_models: dict[str, Path], gpu_named_delegate: Path,
                                                      tmp_path: Path, read_log: Callable) -> None:
    log = tmp_path / "gpu.log"
    _compile(tflite_models["float_cnn"], _spec(gpu_named_delegate, log, model_token="mine"), cache_dir=tmp_path)
    assert _logged_options(read_log(log))["model_token"] == "mine"


def test_other_delegates_get_no_serialization_options(tflite_models: dict[str, Path], delegate_library: Path,
                                                      tmp_path: Path, read_log: Callable) -> None:
    log = tmp_path / "d.log"
    _compile(tflite_models["float_cnn"], _spec(delegate_library, log), cache_dir=tmp_path / "cache")
    assert set(_logged_options(read_log(log))) == {"log_path"}
