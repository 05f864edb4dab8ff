"""Subnormal floats flushed to zero on a decoder's threads (``edge_runtime.denormals``).

The oracle of the mode is IEEE arithmetic itself: with it off, numpy's float32 ``1e-39 * 1`` is
1e-39 (a subnormal); with it on, 0. The engine's tokens are held to the no-cache oracle by the other
generation tests, which run with the default (flushed); here the same greedy tokens with it off.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from edge_runtime.denormals import flushed_denormals, supported, thread_flushes, thread_mode_kept
from edge_runtime.generation.sampling import SamplingParams

SUBNORMAL = np.float32(1e-39)
ROOT = Path(__file__).resolve().parents[2]


def _flushes_now() -> bool:
    return float(SUBNORMAL * np.float32(1.0)) == 0.0


def test_the_mode_is_set_for_the_block_and_this_thread_only() -> None:
    if not supported():  # ARM, other C libraries: nothing is changed, and the block says so
        with flushed_denormals() as on:
            assert on is False and not _flushes_now()
        return
    assert not _flushes_now() and not thread_flushes()
    seen = {}
    ready, done = threading.Event(), threading.Event()

    def other() -> None:  # a thread that existed before the block
        ready.set()
        done.wait(10)
        seen["other"] = _flushes_now()

    thread = threading.Thread(target=other)
    thread.start()
    ready.wait(10)
    with flushed_denormals() as on:
        assert on and _flushes_now() and thread_flushes()
        done.set()
        thread.join(10)
        with flushed_denormals(False) as inner:  # off: leaves the mode as it is
            assert inner is False and _flushes_now()
    assert seen["other"] is False
    assert not _flushes_now() and not thread_flushes()  # the previous mode is back


def test_onnx_runtime_would_flush_the_thread_making_its_first_session_and_the_engine_prevents_it(
        fused_folder: Path) -> None:
    # ONNX Runtime sets the mode, once per process, on the thread creating the first session with the
    # entry: a fresh process shows it (the oracle), and that the engine's session leaves the thread as it was.
    script = """
import sys
import onnxruntime as ort
from edge_runtime.denormals import SESSION_ENTRY, thread_flushes
from edge_runtime.generation.engine import DecoderEngine
from edge_runtime.generation.folder import read_folder
folder = read_folder(sys.argv[2])
if sys.argv[1] == "ort":
    options = ort.SessionOptions()
    options.add_session_config_entry(SESSION_ENTRY, "1")
    ort.InferenceSession(str(folder.model_path), options, providers=["CPUExecutionProvider"])
else:
    engine = DecoderEngine(folder, threads=1, max_batch=1, max_len=32, flush_denormals=True)
    assert engine.session.get_session_options().get_session_config_entry(SESSION_ENTRY) == "1"
print(thread_flushes())
"""
    if not supported():
        pytest.skip("flush-to-zero is switched on x86-64 Linux only")
    out = {side: subprocess.run([sys.executable, "-c", script, side, str(fused_folder)], capture_output=True,
                                text=True, cwd=ROOT, timeout=120) for side in ("ort", "engine")}
    for side, result in out.items():
        assert result.returncode == 0, (side, result.stderr[-2000:])
    assert out["ort"].stdout.split()[-1] == "True"  # what the engine guards against
    assert out["engine"].stdout.split()[-1] == "False"


@pytest.mark.parametrize("flush", [True, False])
def test_the_batcher_thread_decodes_flushed_by_default(fused_folder: Path, model_factory, flush: bool) -> None:
    model = model_factory(fused_folder, flush_denormals=flush, prefix_cache_bytes=0)
    seen, done = [], threading.Event()

    def sink(chunk) -> None:  # called on the batcher thread
        seen.append((thread_flushes(), _flushes_now()))
        if chunk.finish_reason is not None:
            done.set()

    model.batcher.submit([5, 6, 7, 8], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True), sink)
    assert done.wait(60)
    expected = flush and supported()
    assert seen and all(state == (expected, expected) for state in seen)
    assert not _flushes_now()  # the caller's thread untouched either way


def test_greedy_tokens_are_the_same_flushed_or_not(fused_folder: Path, model_factory) -> None:
    prompt = "The screen shows a settings list with Wi-Fi, Bluetooth and Display; tap"
    results = [model_factory(fused_folder, flush_denormals=flush, prefix_cache_bytes=0)
               .generate(prompt=prompt, max_tokens=16, ignore_eos=True) for flush in (True, False)]
    assert results[0].token_ids == results[1].token_ids


def test_a_thread_keeps_its_mode_across_a_block_that_changes_it() -> None:
    from edge_runtime import denormals

    if not supported():
        pytest.skip("flush-to-zero is switched on x86-64 Linux only")
    with thread_mode_kept():
        denormals._set(denormals._libm(), denormals.FTZ_DAZ)  # what ONNX Runtime does to the thread
        assert _flushes_now()
    assert not thread_flushes() and not _flushes_now()
