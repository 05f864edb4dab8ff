"""Benchmark: what deciding where an agent step runs costs, against preparing it first.

A vision-language model with a ``[cloud]`` peer routes a request with images from an estimate
made before any image is decoded (``GenerativeModel.estimate``: sizes from the image headers,
tokens from the ``[vision]`` budget, the prefix cache's match, the image work learnt here). What
the router did before, and what it would take without the estimate, is to prepare the request
first (decode, preprocess, vision encoder, splice: ``GenerativeModel.prepare``) and decide after
it; a step sent to the cloud then had paid all of that on the device before it left.

Model: ``tools/bench_vlm.py``'s random-weight Qwen2-VL (vision depth 8, text 31M), its agent
prompt (a ~1,500-token system prompt) and 1080x2400 screenshots sent as PNG data URLs, as an
agent sends them; a new screenshot every round. Per budget (about 256 and 1,024 image tokens) and
round, the two sides run one after the other on the same request; best of rounds. Reported: ms to
estimate, ms to prepare, their ratio, and whether the estimate's prompt length equals the
prepared prompt's. Prints JSON, writes a PNG.

Usage: ``python tools/bench_vlm_route.py [--rounds 5] [--threads 2] [--out bench-results/vlm-route]``
"""

from __future__ import annotations

import argparse
import base64
import io
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "tools"):
    if str(_path) not in sys.path:  # run as a script from a checkout
        sys.path.insert(0, str(_path))

from bench_report import publish  # noqa: E402
from bench_vlm import BUDGETS, build_folders, edge_model, screenshot, system_prompt  # noqa: E402


def data_url(image: Any) -> str:
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def step(system: str, url: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": system},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": "Open the settings app."}]}]


def run(args: argparse.Namespace) -> dict[str, Any]:
    _, folder = build_folders(args.models, quick=False)
    system = system_prompt()
    report: dict[str, Any] = {"threads": args.threads, "rounds": args.rounds, "budgets": {}}
    for name, max_pixels in BUDGETS.items():
        model = edge_model(folder, args.threads, max_pixels, {})
        model.prepare(messages=step(system, data_url(screenshot(99))))  # the image work is learnt here
        estimate_ms, prepare_ms, exact = [], [], True
        try:
            for round_ in range(args.rounds):
                messages = step(system, data_url(screenshot(round_)))
                started = time.perf_counter()
                estimate = model.estimate(messages=messages)
                estimated = time.perf_counter()
                prepared = model.prepare(messages=messages)
                estimate_ms.append((estimated - started) * 1e3)
                prepare_ms.append((time.perf_counter() - estimated) * 1e3)
                exact = exact and estimate is not None and estimate.prompt_tokens == len(prepared.ids)
                image_ms = estimate.image_ms if estimate is not None else None
        finally:
            model.close()
        report["budgets"][name] = {
            "prompt_tokens": len(prepared.ids), "image_tokens": prepared.image_timings.image_tokens,
            "estimate_ms_best": round(min(estimate_ms), 2), "prepare_ms_best": round(min(prepare_ms), 1),
            "prepare_over_estimate": round(min(prepare_ms) / min(estimate_ms), 1),
            "estimated_image_ms_last": None if image_ms is None else round(image_ms, 1),
            "estimate_prompt_tokens_exact": exact}
    return report


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["budgets"])
    rows = [report["budgets"][n] for n in names]
    fig, axis = plt.subplots(figsize=(7, 4))
    x = range(len(names))
    axis.bar([i - 0.2 for i in x], [r["prepare_ms_best"] for r in rows], 0.4, label="prepare, then decide")
    axis.bar([i + 0.2 for i in x], [r["estimate_ms_best"] for r in rows], 0.4, label="estimate, then decide")
    axis.set_xticks(list(x), [f"~{n} image tokens" for n in names])
    axis.set_ylabel("ms on the device before a cloud-bound step leaves")
    axis.set_yscale("log")
    axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "vlm-route")
    parser.add_argument("--models", type=Path, default=Path.home() / ".cache" / "edge-runtime" / "bench-vlm")
    args = parser.parse_args(argv)
    report = run(args)
    report["command"] = " ".join([Path(sys.executable).name, *sys.argv])
    publish(report, args.out, "bench_vlm_route", plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
