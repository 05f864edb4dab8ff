"""Helpers for server tests: tiny models, the ONNX Runtime oracle, a slow plan, a live server.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

TYPE_INPUTS = {  # input name -> ONNX element type name
    "b": "BOOL", "u8": "UINT8", "u16": "UINT16", "u32": "UINT32", "u64": "UINT64",
    "i8": "INT8", "i16": "INT16", "i32": "INT32", "i64": "INT64",
    "f16": "FLOAT16", "f32": "FLOAT", "f64": "DOUBLE", "s": "STRING",
}
SLOW_PLAN_S = 0.3


def build_types_model() -> Any:
    """Identity per datatype: x_<t> [2, 3] -> y_<t>; ONNX Runtime is the oracle."""
    from onnx import TensorProto, helper

    nodes, inputs, outputs = [], [], []
    for name, onnx_type in TYPE_INPUTS.items():
        elem = getattr(TensorProto, onnx_type)
        inputs.append(helper.make_tensor_value_info(f"x_{name}", elem, [2, 3]))
        outputs.append(helper.make_tensor_value_info(f"y_{name}", elem, [2, 3]))
        nodes.append(helper.make_node("Identity", [f"x_{name}"], [f"y_{name}"]))
    model = helper.make_model(helper.make_graph(nodes, "types", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def type_feeds(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, onnx_type in TYPE_INPUTS.items():
        if onnx_type == "BOOL":
            feeds[f"x_{name}"] = rng.random((2, 3)) < 0.5
        elif onnx_type == "STRING":
            feeds[f"x_{name}"] = np.array([["a", "bé", ""], ["ccc", "日本", "x y"]], dtype=object)
        else:
            dtype = {"FLOAT16": np.float16, "FLOAT": np.float32, "DOUBLE": np.float64}.get(onnx_type)
            if dtype is not None:
                feeds[f"x_{name}"] = rng.standard_normal((2, 3)).astype(dtype)
            else:
                dtype = np.dtype(onnx_type.lower())
                info = np.iinfo(dtype)
                feeds[f"x_{name}"] = rng.integers(info.min, info.max, size=(2, 3), dtype=dtype, endpoint=True)
    return feeds


WIRE = {"bool": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
        "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64", "float16": "FP16",
        "float32": "FP32", "float64": "FP64", "object": "BYTES"}  # numpy dtype -> KServe datatype, by hand


def triton_inputs(arrays: Mapping[str, np.ndarray], binary: bool) -> list[Any]:
    """``tritonclient.http.InferInput``s carrying ``arrays`` (the reference client's encoder)."""
    import tritonclient.http as triton

    inputs = []
    for name, array in arrays.items():
        item = triton.InferInput(name, list(array.shape), WIRE[array.dtype.name])
        item.set_data_from_numpy(array, binary_data=binary)
        inputs.append(item)
    return inputs


def write(path: Path, model: Any) -> None:
    import onnx

    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def ort_run(path: Path, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The oracle: a plain ONNX Runtime session on the same file."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, dict(feeds))))


@dataclass(frozen=True)
class SlowPlan:
    """Wraps a plan so that every run takes at least ``delay_s`` (overload and deadline tests)."""

    name: str
    backends: tuple[str, ...]
    inner: Any
    delay_s: float

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        time.sleep(self.delay_s)
        return self.inner.run(feeds)


def slow_plans(model: Any) -> dict[str, Any]:
    """``extra_plans`` that slows down the model called ``slow`` only (its own plan, replaced)."""
    from edge_runtime.scheduler import model_plans

    if model.name != "slow":
        return {}
    return {name: SlowPlan(plan.name, plan.backends, plan, SLOW_PLAN_S) for name, plan in model_plans(model).items()}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LiveServer:
    """The real app on 127.0.0.1 in a background thread, for synchronous clients (tritonclient)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._main, name="live-server", daemon=True)

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "LiveServer":
        self._thread.start()
        if not self._started.wait(60):
            raise RuntimeError("live server did not start within 60 s")
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        from aiohttp import web

        self._stop = asyncio.Event()
        runner = web.AppRunner(self.app, handle_signals=False, shutdown_timeout=5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = runner.addresses[0][1]
        self._started.set()
        await self._stop.wait()
        await runner.cleanup()


