"""The server's descriptive documents — server and model metadata, model configuration, statistics —
as plain dicts in the KServe v2 / Triton JSON shapes, for every transport.

The HTTP routes send them as JSON; the gRPC service fills its protobuf messages from the same
dicts, so the two transports cannot drift apart.
"""

from __future__ import annotations

from typing import Any, Sequence

import edge_runtime
from edge_runtime.protocol.codec import wire_datatype, wire_shape
from edge_runtime.server.state import ServerState
from edge_runtime.serving.repository import LoadedVersion
from edge_runtime.serving.text_tensors import is_text_generator
from edge_runtime.serving.text_tensors import tensor_metadata as text_tensor_metadata

SERVER_NAME = "edge-runtime"
EXTENSIONS = ("binary_tensor_data", "model_repository", "statistics", "model_configuration",
              "schedule_policy", "parameters", "async_tasks", "system_shared_memory", "generate")


def server_metadata() -> dict[str, Any]:
    return {"name": SERVER_NAME, "version": edge_runtime.__version__, "extensions": list(EXTENSIONS)}


def tensor_metadata(specs: Sequence[Any]) -> list[dict[str, Any]]:
    return [{"name": s.name, "datatype": wire_datatype(s.dtype), "shape": wire_shape(s)} for s in specs]


def platform(target: LoadedVersion) -> str:
    return "tflite" if target.model.path.suffix.lower() in (".tflite", ".lite") else "onnx"


def tensors(target: LoadedVersion) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(inputs, outputs) of a version: its graph's, or a text generator's ``text_input`` / ``text_output``."""
    if is_text_generator(target):
        return text_tensor_metadata()
    return tensor_metadata(target.model.inputs), tensor_metadata(target.model.outputs)


def model_metadata(state: ServerState, target: LoadedVersion) -> dict[str, Any]:
    """v2 model metadata, with our ``edge_runtime`` section (backend, plans, batching, auto's decision)."""
    model = target.model
    inputs, outputs = tensors(target)
    return {
        "name": target.name,
        "versions": [str(v) for v in state.repository.versions_served(target.name)],
        "platform": platform(target),
        "inputs": inputs,
        "outputs": outputs,
        "edge_runtime": {"version": str(target.version), "backend": model.backend,
                         "backend_nodes": model.backend_nodes, "plans": target.dispatcher.plans,
                         "cloud_mode": target.dispatcher.cloud.mode,
                         "batching": _batching(target), "auto_decision": _auto_decision(target),
                         "spin": _spin(target)},
    }


def _auto_decision(target: LoadedVersion) -> dict[str, Any] | None:
    """``auto``'s race (estimate and measurement per candidate) and the live re-check, when auto chose."""
    decision = getattr(getattr(target.model, "report", None), "decision", None)
    scheduler = target.scheduler
    recheck = scheduler.recheck.snapshot() if scheduler is not None and scheduler.recheck is not None else None
    if decision is None and recheck is None:
        return None
    return {**(decision.to_dict() if decision is not None else {}), "recheck": recheck}


def _batching(target: LoadedVersion) -> dict[str, Any]:
    scheduler = target.scheduler
    if is_text_generator(target):
        return {"enabled": False, "max_batch_size": 1,
                "reason": "a text generator: its sequences share the engine's continuous batch instead"}
    if scheduler is None:
        return {"enabled": False, "reason": "served by the cloud alone", "max_batch_size": 1}
    return scheduler.batching_decision.to_dict()


def _spin(target: LoadedVersion) -> dict[str, Any] | None:
    """The spin policy (``scheduler/spin.py``): its mode, runs on the spinning session and its quiet
    twin, runs on the event loop (``scheduler/inline.py``), runs on the pool and the one-thread
    session with their measured cost (``scheduler/single_thread.py``), and the batcher's live cost
    curve (ms per row by batch size)."""
    scheduler = target.scheduler
    if scheduler is None:
        return None
    stats = scheduler.stats()
    return {"mode": scheduler.config.scheduler.spin, "runs": stats.get("spin_runs"),
            "inline_runs": stats.get("inline", 0), "single_thread": stats.get("single_thread"),
            "cost_ms_per_row": {str(rows): ms for rows, ms in (stats.get("cost_ms_per_row") or {}).items()},
            "batch_knee": stats.get("batch_knee")}


def model_config(target: LoadedVersion) -> dict[str, Any]:
    """The serving configuration of a version (our config.toml, in Triton's terms where they exist)."""
    config = target.config
    inputs, outputs = tensors(target)
    return {
        "name": target.name,
        "platform": platform(target),
        "backend": target.model.backend,
        "max_batch_size": 0 if is_text_generator(target) else config.batching.max_batch_size,
        "input": inputs,
        "output": outputs,
        "dynamic_batching": {"preferred_batch_size": list(config.batching.preferred_batch_sizes),
                             "max_queue_delay_microseconds": config.batching.max_queue_delay_us},
        "queue_policy": {"max_queue_size": config.queue.max_queue_size,
                         "default_timeout_microseconds": config.queue.default_timeout_ms * 1000},
        "scheduler": {"policy": config.scheduler.policy, "plan": config.scheduler.plan},
        "cloud": {"mode": target.dispatcher.cloud.mode, "remote_model": target.dispatcher.cloud.remote_model},
        "version_policy": target.serving.version_policy if isinstance(target.serving.version_policy, str)
        else list(target.serving.version_policy),
    }


def model_stats(state: ServerState, versions: Sequence[LoadedVersion]) -> dict[str, Any]:
    """Triton's statistics of ``versions``, with our residency figures beside them."""
    return {"model_stats": [{**state.stats.triton(v.name, str(v.version)),
                             "memory_usage": [{"type": "CPU", "id": 0, "byte_size": v.memory_bytes}],
                             **_residency(state, v)}
                            for v in versions]}


def _residency(state: ServerState, version: Any) -> dict[str, Any]:
    """Our additions to a version's Triton statistics: memory charge (the model's, with its parts),
    warm-up, result cache, and for a generative version its KV and prefix cache bytes."""
    budget = state.repository.budget
    charged, measured = budget.owner_bytes(version.name)
    extras = version.extras
    document = {
        "memory_bytes": {"charged": charged, "measured": measured, "parts": budget.owner_parts(version.name)},
        "warmup": extras.warmup.to_dict() if extras is not None else None,
        "result_cache": extras.result_cache.snapshot() if extras is not None and extras.result_cache else None}
    prefix_cache = getattr(version.model, "prefix_cache", None)  # a GenerativeModel
    if prefix_cache is not None:
        cache = prefix_cache.stats()
        document["generation"] = {"kv_cache_bytes": version.model.kv_cache_bytes,
                                  "prefix_cache_bytes": cache.bytes, "prefix_cache_budget_bytes": cache.budget_bytes}
    return {"edge_runtime": document}


def versions_of(state: ServerState, name: str | None, version: str | None) -> list[LoadedVersion]:
    """The versions a statistics request names: all served (no name), a model's, or one version.
    ModelNotFoundError for a model or version not served."""
    from edge_runtime.serving.layout import check_model_name, parse_version

    if not name:
        return state.repository.served()
    target = state.repository.get(check_model_name(name), parse_version(version) if version else None)
    return [target] if version else [v for v in state.repository.served() if v.name == target.name]
