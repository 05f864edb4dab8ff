"""Benchmark: a Qwen2-VL vision encoder on the ``cpu`` plan against the ``gpu`` plan per accelerator.

On a phone the vision encoder is what should run on the GPU while the CPU decodes; this
measures what that costs and where the nodes land. One random-weight Qwen2-VL folder
(``--tower tiny``: the test folders' 2-block tower; ``bench``: depth 8, width 384, as the
issue-22 benchmark asks), one synthetic 1080x2400 screenshot preprocessed at a pixel budget of
about ``--tokens`` image tokens. Per side: nodes per backend, load and first-run seconds
(kernel/shader builds), p50 ms and the best per-round median of the steady runs (sides
alternate within each round, so machine noise hits all alike), and the max |diff| from ``cpu``
(absolute, and over the largest |value|: a deep random-weight tower grows its activations, and
fp32 summation order then shows: on the ``bench`` tower ONNX Runtime's CPU result is itself 9e-5
of the largest value off a float64 evaluation of the same graph).

On PoCL (OpenCL on the CPU) and lavapipe (Vulkan on the CPU) the accelerator figures measure
placement and overhead, not GPU speed: both run on the cores the ``cpu`` plan uses.

Usage: ``python tools/bench_vision_plans.py --out bench_out/vision [--tower bench] [--tokens 256]`` —
JSON on stdout and in ``OUT/bench_vision_plans.json``, plot in ``OUT/bench_vision_plans.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

PATCH_AREA = 28 * 28  # pixels per image token of Qwen2-VL (14x14 patches, 2x2 merge)


def build_folder(out: Path, tower: str, tokens: int) -> Path:
    from edge_runtime.vision_graphs import QwenVisionSpec
    from edge_runtime.vlm_zoo import VLMShape, write_vlm_folder

    vision = QwenVisionSpec() if tower == "tiny" else QwenVisionSpec(depth=8, embed_dim=384, heads=6, mlp_hidden=1536)
    folder = out / f"qwen2_vl-{tower}"
    if not (folder / "onnx" / "vision_encoder.onnx").exists():
        write_vlm_folder(folder, "qwen2_vl", VLMShape(vision=vision, max_pixels=PATCH_AREA * tokens), seed=0)
    return folder


def screenshot_feeds(folder: Path, tokens: int) -> tuple[dict[str, np.ndarray], int]:
    from PIL import Image

    from edge_runtime.generation.vision.preprocess import VisionBudget, image_processor

    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (2400 // 16, 1080 // 16, 3), dtype=np.uint8)
    image = Image.fromarray(np.repeat(np.repeat(blocks, 16, axis=0), 16, axis=1))
    config = json.loads((folder / "config.json").read_text())
    processed = image_processor(folder, config, VisionBudget(max_pixels=PATCH_AREA * tokens)).process(image)
    return dict(processed.feeds), processed.num_tokens


def _runtime(cache: Path, accelerator: str | None) -> Any:
    from edge_runtime.config import runtime_config
    from edge_runtime.runtime import Runtime

    order = f"{accelerator},cpu" if accelerator else "cpu"
    return Runtime(runtime_config(env={"EDGE_RUNTIME_CACHE": str(cache), "EDGE_RUNTIME_BACKENDS": order}))


def load_sides(path: Path, feeds: dict[str, np.ndarray], accelerators: list[str], cache: Path) -> dict[str, Any]:
    """side name -> {model, runtime, report}; an accelerator that is not usable here is reported, not loaded."""
    shapes = {name: value.shape for name, value in feeds.items()}
    sides: dict[str, Any] = {}
    for accelerator in [None, *accelerators]:
        runtime = _runtime(cache, accelerator)
        name = f"gpu:{accelerator}" if accelerator else "cpu"
        if accelerator and runtime.accelerator() != accelerator:
            sides[name] = {"report": {"skipped": f"{accelerator}: {runtime.availability(accelerator).reason}"}}
            runtime.close()
            continue
        started = time.perf_counter()
        model = runtime.load(path, plan="gpu" if accelerator else "cpu", input_shapes=shapes)
        load_s = time.perf_counter() - started
        started = time.perf_counter()
        outputs = model.run(feeds)
        sides[name] = {"model": model, "runtime": runtime, "outputs": outputs, "report": {
            "backend": model.backend, "backend_nodes": model.backend_nodes, "load_s": round(load_s, 3),
            "first_run_s": round(time.perf_counter() - started, 3),
            "stages": [f"{s['backend']}:{s['node_count']}" for s in model.describe()["executable"]["stages"]]}}
    return sides


def measure(sides: dict[str, Any], feeds: dict[str, np.ndarray], rounds: int, runs: int) -> None:
    """Interleaved rounds: every side runs ``runs`` times per round, in turn."""
    live = {k: v for k, v in sides.items() if "model" in v}
    samples: dict[str, list[list[float]]] = {k: [] for k in live}
    for _ in range(rounds):
        for name, side in live.items():
            times = []
            for _ in range(runs):
                started = time.perf_counter()
                side["model"].run(feeds)
                times.append((time.perf_counter() - started) * 1e3)
            samples[name].append(times)
    want = live["cpu"]["outputs"]["image_features"]
    for name, side in live.items():
        flat = [t for rnd in samples[name] for t in rnd]
        got = side["outputs"]["image_features"]
        side["report"].update(p50_ms=round(float(np.median(flat)), 3),
                              best_round_median_ms=round(min(float(np.median(r)) for r in samples[name]), 3),
                              max_abs_diff_vs_cpu=float(np.max(np.abs(got - want))),
                              max_diff_over_max_cpu=float(np.max(np.abs(got - want)) / np.max(np.abs(want))),
                              fallbacks=len(side["model"].describe()["executable"].get("fallbacks", [])))


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sides = {k: v for k, v in report["sides"].items() if "p50_ms" in v}
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.bar(list(sides), [v["p50_ms"] for v in sides.values()], color="tab:blue")
    left.set_ylabel("p50 ms per image")
    left.set_title(f"vision encoder, {report['image_tokens']} image tokens ({report['tower']} tower)")
    backends = sorted({b for v in sides.values() for b in v["backend_nodes"]})
    bottom = np.zeros(len(sides))
    for backend in backends:
        counts = np.array([v["backend_nodes"].get(backend, 0) for v in sides.values()], float)
        right.bar(list(sides), counts, bottom=bottom, label=backend)
        bottom += counts
    right.set_ylabel("graph nodes")
    right.set_title("where the nodes ran")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench_out/vision"), help="output directory")
    parser.add_argument("--tower", choices=("tiny", "bench"), default="tiny", help="vision tower size")
    parser.add_argument("--tokens", type=int, default=256, help="image budget, in image tokens (default 256)")
    parser.add_argument("--accelerators", default="opencl,vulkan", help="gpu-plan backends, comma-separated")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--runs", type=int, default=5, help="runs per side per round (default 5)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    folder = build_folder(args.out, args.tower, args.tokens)
    feeds, tokens = screenshot_feeds(folder, args.tokens)
    path = folder / "onnx" / "vision_encoder.onnx"
    sides = load_sides(path, feeds, [a for a in args.accelerators.split(",") if a], args.out / "cache")
    measure(sides, feeds, args.rounds, args.runs)
    import onnx

    report = {"tower": args.tower, "image_tokens": tokens, "patches": int(feeds["pixel_values"].shape[0]),
              "grid_thw": feeds["grid_thw"].tolist(), "graph_nodes": len(onnx.load(path).graph.node),
              "rounds": args.rounds, "runs_per_round": args.runs,
              "sides": {k: v["report"] for k, v in sides.items()}}
    for side in sides.values():
        if "model" in side:
            side["model"].close()
            side["runtime"].close()
    text = json.dumps(report, indent=2)
    (args.out / "bench_vision_plans.json").write_text(text)
    plot(report, args.out / "bench_vision_plans.png")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
