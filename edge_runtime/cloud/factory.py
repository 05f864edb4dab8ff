"""Build a model's cloud plans from its ``[cloud]`` section (see ``config.py``).

=========  ====================================================================
mode       plans
=========  ====================================================================
never      none
fallback   ``cloud`` (the whole model on the peer as ``remote_model``)
always     ``cloud``
split      ``split@k`` for ``split_at = "<tensor>"`` (the tail is ``remote_model``);
           for ``split_at = "auto"``: one ``split@k`` per candidate cut whose tail
           the peer serves as ``<remote_model>.k<k>``, plus ``split`` choosing among
           them by the live network estimate
=========  ====================================================================

Heads and local tails are compiled with ``compile`` (the runtime's cpu backend
in the server; anything taking an ``onnx.ModelProto`` in tests). Building
profiles the model on this device (``choice.profile_cuts``), so it belongs at
load time, never on the request path.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable

from backends.base import Executable
from edge_runtime.cloud.choice import SplitProfile, profile_cuts
from edge_runtime.cloud.client import CloudClient
from edge_runtime.cloud.config import CloudModelConfig
from edge_runtime.cloud.manifest import tail_model_name
from edge_runtime.cloud.plans import AutoSplitPlan, CallHook, CloudPlan, CloudSpeed, SplitPlan
from edge_runtime.cloud.split import ModelCutter
from edge_runtime.errors import CloudError

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

Compiler = Callable[["onnx.ModelProto"], Executable]


def runtime_compiler(runtime: Any) -> Compiler:
    """Compile extracted heads/tails on the runtime's cpu backend with its options."""
    backend = runtime.backend("cpu")
    options = runtime.compile_options()
    return lambda model: backend.compile(model, options)


def cloud_plans(model: "onnx.ModelProto", config: CloudModelConfig, client: CloudClient, compile: Compiler, *,
                speed: CloudSpeed | None = None, repeat: int = 10, threads: int | None = None,
                probe_interval_s: float = 2.0, bandwidth_stale_s: float = 5.0,
                on_call: CallHook | None = None) -> dict[str, Any]:
    """The plans ``config.mode`` asks for, keyed by plan name (empty for ``never``).

    ``on_call`` (optional) hears every cloud call's outcome (see ``plans.py``).

    Raises CloudError when ``split_at = "auto"`` finds no candidate tail on the
    peer, InvalidInputError for an unknown ``split_at`` name.
    """
    if config.mode == "never":
        return {}
    if speed is None:
        speed = CloudSpeed(config.cloud_speedup, fixed=True) if config.cloud_speedup else CloudSpeed()
    cutter = ModelCutter(model)
    feeds = cutter.sample_feeds()
    if config.mode in ("fallback", "always"):
        profile = profile_cuts(cutter, [], feeds, repeat=repeat, threads=threads)
        return {"cloud": CloudPlan(client, config.remote_model, local_ms=profile.local_total_ms,
                                   io_bytes=profile.input_bytes + profile.output_bytes, speed=speed,
                                   on_call=on_call)}
    if config.split_at != "auto":
        cut = cutter.resolve(config.split_at)
        profile = profile_cuts(cutter, [cut], feeds, repeat=repeat, threads=threads)
        plan = _split_plan(cutter, profile, cut.index, client, config.remote_model, compile, speed, on_call)
        return {plan.name: plan}
    cuts = [cut for cut in cutter.candidates()
            if client.ready(tail_model_name(config.remote_model, cut.index))]
    if not cuts:
        raise CloudError(f"split_at = 'auto': the peer serves no tail named "
                         f"{tail_model_name(config.remote_model, 0).replace('.k0', '.k<index>')} "
                         "(write them with: edge-runtime split MODEL --at auto --cloud-repository DIR)")
    profile = profile_cuts(cutter, cuts, feeds, repeat=repeat, threads=threads)
    plans: dict[str, Any] = {}
    for cut in cuts:
        plan = _split_plan(cutter, profile, cut.index, client, tail_model_name(config.remote_model, cut.index),
                           compile, speed, on_call)
        plans[plan.name] = plan
    plans["split"] = AutoSplitPlan(dict(plans), profile, client, speed, probe_interval_s=probe_interval_s,
                                   bandwidth_stale_s=bandwidth_stale_s)
    return plans


def _split_plan(cutter: ModelCutter, profile: SplitProfile, index: int, client: CloudClient, remote_model: str,
                compile: Compiler, speed: CloudSpeed, on_call: CallHook | None) -> SplitPlan:
    cost = profile.cost_of(index)
    assert cost is not None, "profiled cuts and built plans come from the same list"
    head, tail = cutter.extract(cost.cut)
    return SplitPlan(cost, compile(head), client, remote_model, local_total_ms=profile.local_total_ms,
                     speed=speed, tail_local=compile(tail), on_call=on_call)

