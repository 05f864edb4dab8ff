"""Edge-cloud benchmark: the automatic plan against all-local, all-cloud and every split point.

Setup, all on loopback: a second edge-runtime process is the cloud (``python -m
edge_runtime serve``, one intra-op thread) serving the whole model and the
tail of every candidate cut; ``tools/netem_proxy.py`` shapes the path to it
as fast Wi-Fi, 4G or a poor link. The device is this machine running plain
ONNX Runtime (one thread) emulating a device ``--device-slowdown`` times
slower: each local run (the whole model or a head) runs for real and is padded
with sleep to ``slowdown x`` its profiled median (a phone core against a
server: the default 20 is a low-end phone; with 1 the "cloud" is exactly as
fast as the "device", as it is on this host). The network path and the cloud
peer's compute are real.

Per network profile: a short warm-up (3 health probes and one whole-model
call teach the RTT/bandwidth estimator), then ``auto`` serves requests,
re-choosing per request among local, cloud and every split@k with the live
estimates (choice.SplitProfile.best). Then every plan is measured on its own.
Reported: per-plan median latency, auto's choice(s) and median, the best
measured plan, and ``auto_vs_best`` (auto median / best median; 1.0 = auto
found the best). Outputs of every plan are checked against ONNX Runtime.

    python tools/bench_cloud.py --out bench_cloud.json --plot bench_cloud.png
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cloud_peer import ServerProcess  # noqa: E402
from netem_proxy import PROFILES, ShapingProxy  # noqa: E402

SEED = 0


def build_model() -> Any:
    """A CNN with an early data-reducing stem (224x224 image -> 56x56 features), then heavy blocks."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(SEED)
    nodes, inits, x, channels = [], [], "image", 3

    def conv(out_ch: int, kernel: int, stride: int, pad: int) -> None:
        nonlocal x, channels
        i = len(inits)
        scale = 1.0 / np.sqrt(channels * kernel * kernel)
        inits.append(numpy_helper.from_array((rng.standard_normal((out_ch, channels, kernel, kernel)) * scale)
                                             .astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("Conv", [x, f"w{i}"], [f"conv{i}"], name=f"conv{i}", strides=[stride, stride],
                                      pads=[pad] * 4))
        nodes.append(helper.make_node("Relu", [f"conv{i}"], [f"relu{i}"], name=f"relu{i}"))
        x, channels = f"relu{i}", out_ch

    def pool() -> None:
        nonlocal x
        nodes.append(helper.make_node("MaxPool", [x], [f"pool{len(nodes)}"], name=f"pool{len(nodes)}",
                                      kernel_shape=[2, 2], strides=[2, 2]))
        x = nodes[-1].output[0]

    conv(8, 4, 4, 0)
    for width, pooled in ((32, True), (64, True), (128, False), (128, True), (256, False)):
        conv(width, 3, 1, 1)
        if pooled:
            pool()
    inits.append(numpy_helper.from_array((rng.standard_normal((256, 10)) * 0.06).astype(np.float32), "fc"))
    nodes += [helper.make_node("GlobalAveragePool", [x], ["gap"], name="gap"),
              helper.make_node("Flatten", ["gap"], ["flat"], name="flat"),
              helper.make_node("MatMul", ["flat", "fc"], ["logits"], name="fc")]
    graph = helper.make_graph(nodes, "bench_cnn",
                              [helper.make_tensor_value_info("image", TensorProto.FLOAT, (1, 3, 224, 224))],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, (1, 10))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def emulated(run: Callable[[], Any], device_ms: float) -> Callable[[], Any]:
    """``run`` taking ``device_ms`` (the emulated device's time): it runs for real, then sleeps the rest.

    NOTE: padding to a fixed time, not multiplying each run's own time: on a shared
    host a 20x multiplier would turn every scheduling hiccup into a 20x longer one.
    """
    def slow() -> Any:
        started = time.perf_counter()
        result = run()
        time.sleep(max(0.0, device_ms / 1e3 - (time.perf_counter() - started)))
        return result
    return slow


def measure(call: Callable[[], dict], reps: int, limit_s: float, check: Callable[[dict], None]) -> dict[str, Any]:
    samples, stop = [], time.monotonic() + limit_s
    for _ in range(reps):
        started = time.perf_counter()
        outputs = call()
        samples.append((time.perf_counter() - started) * 1e3)
        check(outputs)
        if time.monotonic() > stop:
            break
    return {"median_ms": round(float(np.median(samples)), 2), "min_ms": round(min(samples), 2), "runs": len(samples)}


def bench_profile(name: str, setup: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    from edge_runtime.cloud.client import CloudClient
    from edge_runtime.cloud.config import CloudConfig
    from edge_runtime.cloud.network import NetworkEstimator
    from edge_runtime.cloud.plans import CloudSpeed

    cutter, profile, feeds, expected = setup["cutter"], setup["profile"], setup["feeds"], setup["expected"]
    heads, local_run = setup["heads"], setup["local_run"]

    def check(outputs: dict) -> None:
        np.testing.assert_allclose(outputs["logits"], expected, rtol=1e-4, atol=1e-5)

    with ShapingProxy("127.0.0.1", setup["port"], PROFILES[name]) as proxy, CloudClient(
            CloudConfig(url=f"http://127.0.0.1:{proxy.port}", timeout_ms=30_000),
            network=NetworkEstimator()) as client:
        speed = CloudSpeed()
        total_ms = profile.local_total_ms

        def cloud_whole() -> dict:
            call = client.infer(setup["whole"], feeds)
            speed.observe(total_ms, call.server_ms)
            client.network.observe_call(call.elapsed_ms, call.sent_bytes + call.received_bytes, call.server_ms or 0.0)
            return call.outputs

        def split(index: int) -> Callable[[], dict]:
            cost = profile.cost_of(index)
            cut = cost.cut

            def run() -> dict:
                produced = heads[index]()
                crossing = {t: feeds[t] if t in cut.passthrough else produced[t] for t in cut.tensors}
                call = client.infer(setup["tails"][cut.name], crossing)
                speed.observe(max(0.0, total_ms - cost.head_ms), call.server_ms)
                client.network.observe_call(call.elapsed_ms, call.sent_bytes + call.received_bytes,
                                            call.server_ms or 0.0)
                return call.outputs
            return run

        runners = {"local": local_run, "cloud": cloud_whole,
                   **{c.cut.name: split(c.cut.index) for c in profile.cuts}}
        for run in [*heads.values(), local_run]:  # first ONNX Runtime runs are slow: not the device's fault
            run()
        for _ in range(3):
            client.ready()
        cloud_whole()  # one real transfer: the bandwidth estimate's first sample
        choices: list[str] = []

        def auto() -> dict:
            best = profile.best(client.network.snapshot(), speed.speedup)
            choices.append(best.plan)
            return runners[best.plan]()

        auto_result = measure(auto, args.auto_requests, args.plan_seconds * 2, check)
        estimates = {e.plan: e.estimated_ms for e in profile.estimates(client.network.snapshot(), speed.speedup)}
        measured = {plan: measure(run, args.reps, args.plan_seconds, check) for plan, run in runners.items()}
        best = min(measured, key=lambda p: measured[p]["median_ms"])
        return {
            "profile": PROFILES[name].describe(),
            "network_estimate": client.network.snapshot().to_dict(),
            "cloud_speedup_estimate": round(speed.speedup, 2),
            "plans": {p: {**m, "estimated_ms": round(estimates[p], 2)} for p, m in measured.items()},
            "auto": {**auto_result, "choices": choices, "final_choice": choices[-1]},
            "best_measured": best,
            "auto_vs_best": round(auto_result["median_ms"] / measured[best]["median_ms"], 3),
            "auto_vs_local": round(auto_result["median_ms"] / measured["local"]["median_ms"], 3),
            "auto_vs_cloud": round(auto_result["median_ms"] / measured["cloud"]["median_ms"], 3),
        }


def prepare(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from edge_runtime.cloud.choice import ort_session, profile_cuts
    from edge_runtime.cloud.manifest import write_cloud_repository
    from edge_runtime.cloud.split import ModelCutter

    model = build_model()
    cutter = ModelCutter(model)
    cuts = cutter.candidates(max_tensors=2, max_candidates=args.max_cuts)
    repository = work / "cloud"
    layout = write_cloud_repository(cutter, cuts, cuts[0], repository, "bench")
    feeds = cutter.sample_feeds(SEED)
    measured = profile_cuts(cutter, cuts, feeds, repeat=args.profile_repeat, threads=1)
    profile = dataclasses.replace(
        measured, local_total_ms=measured.local_total_ms * args.device_slowdown,
        cuts=tuple(dataclasses.replace(c, head_ms=c.head_ms * args.device_slowdown) for c in measured.cuts))
    whole = ort_session(cutter.prepared, 1)
    heads = {}
    for cost in profile.cuts:
        session = ort_session(cutter.extract(cost.cut)[0], 1)
        names = [o.name for o in session.get_outputs()]
        head_feeds = {n: feeds[n] for n in cost.cut.head_inputs}
        heads[cost.cut.index] = emulated(lambda s=session, n=names, f=head_feeds: dict(zip(n, s.run(n, f))),
                                         cost.head_ms)
    local_run = emulated(lambda: {"logits": whole.run(["logits"], feeds)[0]}, profile.local_total_ms)
    return {"cutter": cutter, "profile": profile, "feeds": feeds, "expected": whole.run(["logits"], feeds)[0],
            "heads": heads, "local_run": local_run, "repository": repository, "whole": layout["whole"],
            "tails": layout["tails"], "measured_profile": measured}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profiles", nargs="+", default=["wifi", "4g", "poor"], choices=sorted(PROFILES))
    parser.add_argument("--device-slowdown", type=float, default=20.0)
    parser.add_argument("--reps", type=int, default=5, help="runs per plan (fewer when --plan-seconds runs out)")
    parser.add_argument("--plan-seconds", type=float, default=2.5, help="time limit per plan and profile")
    parser.add_argument("--auto-requests", type=int, default=8)
    parser.add_argument("--max-cuts", type=int, default=8)
    parser.add_argument("--profile-repeat", type=int, default=10)
    parser.add_argument("--out", type=Path, help="write the JSON here too")
    parser.add_argument("--plot", type=Path, help="write a PNG bar chart here")
    args = parser.parse_args(argv)
    if args.device_slowdown < 1:
        parser.error("--device-slowdown must be >= 1")

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench_cloud_") as tmp:
        setup = prepare(args, Path(tmp))
        server = ServerProcess.start(setup["repository"], Path(tmp) / "server.log", timeout_s=120)
        try:
            setup["port"] = server.port
            results = {name: bench_profile(name, setup, args) for name in args.profiles}
        finally:
            server.stop()
    measured = setup["measured_profile"]
    report = {
        "model": "bench_cnn 1x3x224x224 (stem conv 4x4/4, 6 conv blocks), ORT 1 thread both sides",
        "device_slowdown": args.device_slowdown,
        "host_local_ms": round(measured.local_total_ms, 2),
        "device_local_ms": round(measured.local_total_ms * args.device_slowdown, 2),
        "cuts": [{"plan": c.cut.name, "cut_tensors": list(c.cut.tensors), "cut_bytes": c.cut.nbytes,
                  "device_head_ms": round(c.head_ms * args.device_slowdown, 2)} for c in measured.cuts],
        "profiles": results,
        "wall_s": round(time.monotonic() - started, 1),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.plot:
        plot(report, args.plot)
    return 0


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    profiles = report["profiles"]
    fig, axes = plt.subplots(1, len(profiles), figsize=(5 * len(profiles), 4.5), squeeze=False)
    for ax, (name, result) in zip(axes[0], profiles.items()):
        plans = list(result["plans"])
        values = [result["plans"][p]["median_ms"] for p in plans]
        colours = ["tab:green" if p == result["best_measured"] else "tab:grey" for p in plans]
        ax.bar(range(len(plans)), values, color=colours)
        ax.axhline(result["auto"]["median_ms"], color="tab:red", linestyle="--",
                   label=f"auto ({result['auto']['final_choice']}): x{result['auto_vs_best']} of best")
        ax.set_xticks(range(len(plans)), plans, rotation=60, ha="right", fontsize=8)
        ax.set_title(f"{name}: rtt {result['profile']['rtt_ms']:.0f} ms, {result['profile']['rate_mbps']} Mbit/s")
        ax.set_ylabel("median latency, ms")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    fig.suptitle(f"edge-cloud plans (device = host x{report['device_slowdown']:g})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
