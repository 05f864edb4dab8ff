"""Where ``auto``'s measured race runs, and remembering its verdict.

``decide_plan`` returns the ``PlanDecision`` of ``plan_race`` for a model:

* read back from ``cache_dir/plan_choice.json``, keyed on the model bytes, the
  caller's input shapes, the device key, the backend order and the versions of
  the engines' libraries (as ``engine_choice.json`` is), so it is measured once
  per device and model;
* else raced in a short-lived child process (``python -m edge_runtime.plan_choice``,
  request and verdict as JSON over stdin/stdout) when this process has not
  loaded a GPU driver yet: calibrating and timing the accelerator maps its
  driver (PoCL, LLVM, libclang: ~100 MiB resident) for good, and a process
  whose models end up on the CPU should never carry it;
* else raced in this process (the driver is mapped anyway, or the runtime holds
  backends a child could not rebuild: injected fakes, patched methods).

None when there is nothing to race: no accelerator in the backend order (then
the host engine, ``engine_choice``'s winner, is the only candidate).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from backends.base import CompileOptions
from backends.descriptors import descriptor
from edge_runtime.planning.calibration import read_entries, write_entry
from edge_runtime.plan_race import OVER_BUDGET, PlanDecision, RaceEntry, race_in_process

if TYPE_CHECKING:
    import onnx

    from edge_runtime.runtime import Runtime

log = logging.getLogger(__name__)

CACHE_FILE = "plan_choice.json"
CHILD_TIMEOUT_S = 300.0  # kernel builds of a large model on a slow device take minutes, not hours
_FORMAT = 1
_DRIVER_LIBRARIES = ("libpocl", "libOpenCL", "libvulkan", "libllvm", "libLLVM", "libclang")
_VERSIONED = ("onnxruntime", "pyopencl", "ncnn", "ai-edge-litert", "onnx")
_PATCHABLE = ("accelerator", "backend_speed", "planner", "backend", "availability", "backend_order")


def gpu_driver_loaded() -> bool:
    """Whether this process has a GPU driver in it: pyopencl imported, or a driver library mapped."""
    if "pyopencl" in sys.modules:
        return True
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:  # no procfs (not Linux): judge by the imports alone
        return False
    return any(f"/{lib}" in maps for lib in _DRIVER_LIBRARIES)


def has_candidates(runtime: "Runtime") -> bool:
    """Whether the backend order holds an accelerator to race against ``cpu`` (read from the
    descriptors only: nothing is imported or constructed)."""
    for name in runtime.backend_order():
        described = descriptor(name)
        if described is not None and described.takes("onnx") and described.device == "gpu":
            return True
    return False


def decide_plan(runtime: "Runtime", path: Path, model: "onnx.ModelProto", options: CompileOptions,
                input_shapes: Mapping[str, Sequence[int]] | None,
                sample: Mapping[str, np.ndarray] | None = None) -> PlanDecision | None:
    """The measured choice of ``auto`` for ``model`` (see the module docstring); None: nothing to race.
    ``sample``: input values the race runs on (``plan_race.race_in_process``).

    Never raises for a candidate's failure; a failed race (child crash, host
    cannot run the model) gives an unmeasured ``cpu`` decision, not cached.
    """
    rebuildable = _rebuildable(runtime)
    # A runtime built from its config is judged by the descriptors (constructing the accelerator
    # would map its driver); one holding injected backends by what it holds.
    if not (has_candidates(runtime) if rebuildable else runtime.accelerator() is not None):
        return None
    key = decision_key(runtime, model, input_shapes, options, sample)
    cache = None if runtime.config.cache_dir is None else Path(runtime.config.cache_dir) / CACHE_FILE
    cached = read_entries(cache).get(key)
    if isinstance(cached, dict):
        try:
            return replace(PlanDecision.from_dict(cached), where="cache")
        except (KeyError, TypeError, ValueError) as exc:
            log.info("plan choice cache entry for %s unusable (%s); racing again", path, exc)
    started = time.perf_counter()
    try:
        if gpu_driver_loaded() or not rebuildable:
            decision = race_in_process(runtime, model, options, input_shapes, sample=sample)
        else:
            decision = _race_in_child(runtime, path, options, input_shapes, sample)
    except Exception as exc:  # NOTE: loading must not fail because measuring failed; cpu is always safe
        log.warning("plan race for %s failed (%s: %s); running it on cpu", path, type(exc).__name__, exc)
        return PlanDecision("cpu", "plan", {}, (RaceEntry("cpu", "plan", ("cpu",), None, note="race failed"),),
                            f"race failed: {exc}")
    log.info("plan choice for %s: %s (%s, %.2f s)", path, decision.winner, decision.where,
             time.perf_counter() - started)
    if cache is not None and not any(e.note.startswith(OVER_BUDGET) for e in decision.entries):
        write_entry(cache, key, {**decision.to_dict(), "measured_at": time.time()})
    return decision


def decision_key(runtime: "Runtime", model: "onnx.ModelProto", input_shapes: Mapping[str, Sequence[int]] | None,
                 options: CompileOptions, sample: Mapping[str, np.ndarray] | None = None) -> str:
    """Cache key: model bytes, given shapes and sample values, device, backend order, precision and
    library versions."""
    from importlib import metadata

    versions = {}
    for dist in _VERSIONED:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    digest = hashlib.sha256(model.SerializeToString())
    for name, value in sorted((sample or {}).items()):  # the values steer what runs (a patch grid, a mask)
        array = np.ascontiguousarray(value)
        digest.update(f"{name}:{array.dtype}:{array.shape}".encode())
        digest.update(array.tobytes())
    digest.update(json.dumps({
        "shapes": {k: list(v) for k, v in sorted((input_shapes or {}).items())}, "device": runtime.device_key(),
        "order": runtime.backend_order(), "precision": options.precision,
        "opencl": _opencl_devices(runtime.profile), "versions": versions, "format": _FORMAT,
    }, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:32]


def _opencl_devices(profile: Mapping[str, Any]) -> list[list[str]]:
    """The OpenCL devices the probe saw, by name and driver (not their free memory, which moves
    between processes seconds apart)."""
    devices = (profile.get("opencl") or {}).get("devices") or []
    return [[str(d.get(k, "")) for k in ("name", "platform", "driver_version", "version")]
            for d in devices if isinstance(d, dict)]


def _rebuildable(runtime: "Runtime") -> bool:
    """Whether a child built from the runtime's config would see the same backends (nothing injected)."""
    patched = any(name in vars(runtime) for name in _PATCHABLE)
    return not patched and runtime.injected_backends() == []


def _race_in_child(runtime: "Runtime", path: Path, options: CompileOptions,
                   input_shapes: Mapping[str, Sequence[int]] | None,
                   sample: Mapping[str, np.ndarray] | None = None) -> PlanDecision:
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(runtime.config).items()
              if k != "delegates"}
    request = {"model": str(path), "input_shapes": {k: list(v) for k, v in (input_shapes or {}).items()},
               "config": config, "profile": runtime.profile,
               "options": {"intra_op_threads": options.intra_op_threads, "precision": options.precision}}
    with tempfile.TemporaryDirectory(prefix="edge-runtime-race-") as scratch:
        if sample:  # arrays travel as an .npz beside the JSON request (a mask can be megabytes)
            request["sample"] = str(Path(scratch) / "sample.npz")
            np.savez(request["sample"], **{k: np.asarray(v) for k, v in sample.items()})
        return _run_child(request)


def _run_child(request: dict[str, Any]) -> PlanDecision:
    # The child imports this very checkout (a script may have put it on sys.path, not PYTHONPATH).
    import edge_runtime

    root = str(Path(edge_runtime.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-m", "edge_runtime.plan_choice"], input=json.dumps(request, default=str),
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False, env=env)
    for line in done.stderr.splitlines():  # the child's log: kept, but its failures are race entries
        log.debug("plan race child: %s", line)
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError) as exc:
        raise RuntimeError(f"race child exited {done.returncode} with no verdict: {done.stderr.strip()[-400:]}") from exc
    if "error" in answer:
        raise RuntimeError(f"race child: {answer['error']}")
    return replace(PlanDecision.from_dict(answer["decision"]), where="child")


def main() -> int:
    """The child: one JSON request on stdin, one JSON line on stdout (``{"decision": ...}`` or ``{"error": ...}``)."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    from backends.onnx_graph import load_onnx
    from edge_runtime.config import RuntimeConfig
    from edge_runtime.runtime import Runtime

    request = json.loads(sys.stdin.read())
    try:
        config = dict(request["config"])
        config["cache_dir"] = Path(config["cache_dir"]) if config.get("cache_dir") else None
        config["backend_order"] = tuple(config.get("backend_order") or ())
        runtime = Runtime(RuntimeConfig(**config), profile=request["profile"])
        options = replace(runtime.compile_options(), **request["options"])
        model = load_onnx(Path(request["model"]))
        shapes = {k: tuple(v) for k, v in request["input_shapes"].items()} or None
        sample = None
        if request.get("sample"):
            with np.load(request["sample"]) as stored:
                sample = {k: stored[k] for k in stored.files}
        decision = race_in_process(runtime, model, options, shapes, sample=sample)
        answer: dict[str, Any] = {"decision": decision.to_dict()}
    except Exception as exc:  # the parent decides what a failed race means
        log.exception("plan race failed")
        answer = {"error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
    import threading

    if any(t.name == "plan-race-compile" and t.is_alive() for t in threading.enumerate()):
        os._exit(0)  # a compile over budget is still in a driver call: the verdict is out, do not wait for it
    return 0


if __name__ == "__main__":
    sys.exit(main())
