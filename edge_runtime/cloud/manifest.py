"""``edge-runtime split``: write ``head.onnx``, ``tail.onnx`` and ``manifest.json`` for one cut.

``--at auto`` profiles the candidate cuts (``choice.profile_cuts``) and picks
the cheapest proper cut under the given network and cloud speed; the manifest
records every estimate behind the choice, and which plan would be cheapest
overall (``recommended``: it may be ``local`` or ``cloud``, when no cut pays).
``--at NAME`` cuts after that tensor or node. Optionally every candidate's tail
is laid out as a Triton-style repository for the cloud (``<remote>.k<index>``,
plus ``<remote>`` for the chosen cut), which is what ``split_at = "auto"``
serving re-chooses among.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_runtime.cloud.choice import SplitProfile, cut_index, profile_cuts
from edge_runtime.cloud.network import NetworkSnapshot
from edge_runtime.cloud.split import Cut, ModelCutter

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class SplitRequest:
    """What the command asks for; ``network`` and ``cloud_speedup`` drive ``at = "auto"``."""

    at: str
    network: NetworkSnapshot
    cloud_speedup: float
    network_source: str = "configured"  # or "measured"
    speedup_source: str = "configured"
    repeat: int = 10
    threads: int | None = None
    max_cut_tensors: int = 4
    max_candidates: int = 16


def tail_model_name(remote_model: str, index: int) -> str:
    """The cloud-side name of the tail for cut ``index`` (``split_at = "auto"`` serving)."""
    return f"{remote_model}.k{index}"


def split_model(model_path: str | os.PathLike, request: SplitRequest, out_dir: str | os.PathLike, *,
                cloud_repository: str | os.PathLike | None = None, remote_model: str = "") -> dict[str, Any]:
    """Cut the model, write the files, return the manifest (also written as ``manifest.json``).

    Raises InvalidInputError for an unknown ``at`` name, ModelLoadError for an
    unreadable model or a cut that cannot be extracted.
    """
    import onnx

    from backends.onnx_graph import load_onnx
    model = load_onnx(model_path)
    cutter = ModelCutter(model)
    candidates = cutter.candidates(request.max_cut_tensors, request.max_candidates)
    fixed = None if request.at == "auto" else cutter.resolve(request.at)
    cuts = candidates if fixed is None else [fixed]
    if not cuts:
        raise _no_cut(cutter, request)
    feeds = cutter.sample_feeds()
    profile = profile_cuts(cutter, cuts, feeds, repeat=request.repeat, threads=request.threads)
    chosen = fixed or _best_cut(profile, request)
    head, tail = cutter.extract(chosen)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(head, str(out / "head.onnx"))
    onnx.save(tail, str(out / "tail.onnx"))
    manifest = _manifest(str(model_path), request, cutter, chosen, profile)
    if cloud_repository is not None:
        manifest["cloud_repository"] = write_cloud_repository(cutter, [c.cut for c in profile.cuts], chosen,
                                                              Path(cloud_repository), remote_model or "tail")
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest



def _best_cut(profile: SplitProfile, request: SplitRequest) -> Cut:
    best = profile.best(request.network, request.cloud_speedup, splits_only=True)
    cost = profile.cost_of(cut_index(best.plan))
    assert cost is not None
    return cost.cut


def _no_cut(cutter: ModelCutter, request: SplitRequest) -> Exception:
    from edge_runtime.errors import InvalidInputError

    return InvalidInputError(f"no candidate cut in a graph of {cutter.node_count} nodes crosses at most "
                             f"{request.max_cut_tensors} tensor(s) of known size; cut by name with --at")


def _manifest(model_path: str, request: SplitRequest, cutter: ModelCutter, chosen: Cut,
              profile: SplitProfile) -> dict[str, Any]:
    net, speedup = request.network, request.cloud_speedup
    estimates = [e.to_dict() for e in profile.estimates(net, speedup)]
    for entry in estimates:
        cost = profile.cost_of(cut_index(entry["plan"])) if entry["plan"].startswith("split@") else None
        if cost is not None:
            entry.update(cut_tensors=list(cost.cut.tensors), cut_bytes=cost.cut.nbytes,
                         head_ms=round(cost.head_ms, 3), last_head_node=cost.cut.last_head_node)
    return {
        "format": FORMAT_VERSION,
        "model": model_path,
        "at": request.at,
        **chosen.to_dict(),
        "node_count": cutter.node_count,
        "input_shapes": {name: list(shape) for name, shape in cutter.input_shapes.items()},
        "head": "head.onnx",
        "tail": "tail.onnx",
        "estimates": {
            "network": {**net.to_dict(), "source": request.network_source},
            "cloud_speedup": {"value": speedup, "source": request.speedup_source},
            "local_total_ms": round(profile.local_total_ms, 3),
            "input_bytes": profile.input_bytes,
            "output_bytes": profile.output_bytes,
            "plans": estimates,
            "chosen": chosen.name,
            "recommended": profile.best(net, speedup).plan,
            "repeat": request.repeat,
        },
    }


def write_cloud_repository(cutter: ModelCutter, cuts: list[Cut], chosen: Cut, root: Path,
                           remote_model: str) -> dict[str, Any]:
    """Lay out tails for the cloud: ``<root>/<remote>.k<i>/1/model.onnx`` per cut, ``<remote>`` = chosen."""
    import onnx

    names = {}
    for cut in cuts:
        _, tail = cutter.extract(cut)
        name = tail_model_name(remote_model, cut.index)
        _save(tail, root / name)
        names[cut.name] = name
    _save(cutter.extract(chosen)[1], root / remote_model)
    whole = onnx.ModelProto()
    whole.CopyFrom(cutter.prepared)
    _save(whole, root / f"{remote_model}.whole")
    return {"root": str(root), "chosen": remote_model, "whole": f"{remote_model}.whole", "tails": names}


def _save(model: "onnx.ModelProto", model_dir: Path) -> None:
    import onnx

    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(model_dir / "1" / "model.onnx"))
