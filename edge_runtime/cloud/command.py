"""The ``edge-runtime split`` subcommand: arguments, and the thin layer over ``manifest.split_model``.

Network and cloud speed for ``--at auto`` are configured (``--rtt-ms``,
``--bandwidth-mbps``, ``--cloud-speedup``) or measured against a live peer
(``--cloud-url``: health probes for RTT; with ``--remote-model``, the whole
model's calls for bandwidth and, where the peer reports its compute time,
the speedup). Only argparse is imported at module level.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any


def add_split_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=Path, help="ONNX model to cut")
    parser.add_argument("--at", default="auto", help="auto (default), a tensor name, or a node name (its outputs)")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR",
                        help="write head.onnx, tail.onnx and manifest.json here")
    parser.add_argument("--rtt-ms", type=float, default=50.0, help="network round trip (default 50)")
    parser.add_argument("--bandwidth-mbps", type=float, default=20.0, help="network bandwidth (default 20)")
    parser.add_argument("--cloud-speedup", type=float, default=4.0,
                        help="how many times faster the cloud computes than this device (default 4)")
    parser.add_argument("--cloud-url", help="measure RTT (and with --remote-model, bandwidth/speed) against this peer")
    parser.add_argument("--remote-model", default="",
                        help="the whole model's name on the peer (measuring); names the tails with --cloud-repository")
    parser.add_argument("--token-env", default="EDGE_RUNTIME_CLOUD_TOKEN", help="env var holding the peer's token")
    parser.add_argument("--ca-file", type=Path, help="extra CA bundle for an https peer")
    parser.add_argument("--cloud-repository", type=Path, metavar="DIR",
                        help="also write every candidate tail as a model repository for the cloud")
    parser.add_argument("--repeat", type=int, default=10, help="timed runs per candidate head (default 10)")
    parser.add_argument("--threads", type=int, default=None, help="ONNX Runtime intra-op threads when timing")
    parser.add_argument("--max-cut-tensors", type=int, default=4, help="candidate cuts cross at most this many")
    parser.add_argument("--json", action="store_true", help="print the manifest as JSON")


def run_split(args: argparse.Namespace) -> int:
    from edge_runtime.cloud.manifest import SplitRequest, split_model
    from edge_runtime.cloud.network import NetworkSnapshot
    from edge_runtime.errors import InvalidInputError

    if args.rtt_ms < 0 or args.bandwidth_mbps <= 0 or args.cloud_speedup <= 0 or args.repeat < 1:
        raise InvalidInputError("--rtt-ms must be >= 0; --bandwidth-mbps, --cloud-speedup and --repeat > 0")
    network = NetworkSnapshot(args.rtt_ms, args.bandwidth_mbps * 1e6 / 8, 0, 0)
    speedup, network_source, speedup_source = args.cloud_speedup, "configured", "configured"
    if args.cloud_url:
        network, measured_speedup = _measure(args, network)
        network_source = "measured"
        if measured_speedup is not None:
            speedup, speedup_source = measured_speedup, "measured"
    request = SplitRequest(args.at, network, speedup, network_source, speedup_source, args.repeat, args.threads,
                           args.max_cut_tensors)
    manifest = split_model(args.model, request, args.out, cloud_repository=args.cloud_repository,
                           remote_model=args.remote_model)
    if args.json:
        print(json.dumps(manifest, indent=2))
    else:
        print(_summary(manifest, args.out))
    return 0


def _measure(args: argparse.Namespace, prior: Any) -> tuple[Any, float | None]:
    """Network snapshot and cloud speedup measured against ``--cloud-url``."""
    from backends.onnx_graph import load_onnx
    from edge_runtime.cloud.choice import ort_session, time_ms
    from edge_runtime.cloud.client import CloudClient
    from edge_runtime.cloud.config import CloudConfig
    from edge_runtime.cloud.network import NetworkEstimator
    from edge_runtime.cloud.plans import CloudSpeed
    from edge_runtime.cloud.split import ModelCutter
    from edge_runtime.errors import CloudError

    config = CloudConfig(url=args.cloud_url, token_env=args.token_env, ca_file=args.ca_file,
                         token=os.environ.get(args.token_env) or None)
    network = NetworkEstimator(prior.rtt_ms, prior.bandwidth_bps)
    speed = CloudSpeed()
    with CloudClient(config, network=network) as client:
        if not client.ready():
            raise CloudError(f"cloud peer {args.cloud_url} is not ready")
        for _ in range(4):
            client.ready()
        if args.remote_model:
            cutter = ModelCutter(load_onnx(args.model))
            feeds = cutter.sample_feeds()
            session = ort_session(cutter.prepared, args.threads)
            local_ms = time_ms(lambda: session.run(None, feeds), args.repeat)
            for _ in range(5):
                call = client.infer(args.remote_model, feeds)
                speed.observe(local_ms, call.server_ms)
                server_ms = call.server_ms if call.server_ms is not None else speed.cloud_ms(local_ms)
                network.observe_call(call.elapsed_ms, call.sent_bytes + call.received_bytes, server_ms)
    return network.snapshot(), (speed.speedup if speed.samples else None)


def _summary(manifest: dict[str, Any], out: Path) -> str:
    estimates = manifest["estimates"]
    net = estimates["network"]
    lines = [f"cut {manifest['at']!r} -> split@{manifest['cut_index']} after {manifest['last_head_node']}: "
             f"{len(manifest['cut_tensors'])} tensor(s), {manifest['cut_bytes']} bytes cross",
             f"  cut_tensors: {', '.join(manifest['cut_tensors'])}",
             f"  network ({net['source']}): rtt {net['rtt_ms']} ms, {net['bandwidth_mbps']} Mbit/s; "
             f"cloud speedup {estimates['cloud_speedup']['value']:.2f} ({estimates['cloud_speedup']['source']})",
             "  estimates: " + ", ".join(f"{e['plan']} {e['estimated_ms']} ms" for e in estimates["plans"]),
             f"  recommended overall: {estimates['recommended']}",
             f"  wrote {out / 'head.onnx'}, {out / 'tail.onnx'}, {out / 'manifest.json'}"]
    return "\n".join(lines)
