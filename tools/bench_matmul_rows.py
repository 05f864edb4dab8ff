"""Benchmark: how a decode step's matrix kernels scale with the rows of a continuous batch.

A decode step of n streams multiplies an [n, K] activation by each weight. A kernel that
reads (or unpacks) the weight once for all rows costs little more at 8 rows than at one;
one that does it per row costs about 8 times as much, and then eight streams cannot decode
much faster together than one alone (issue 24's goal: >= 3.5x one stream). Timed here:
one weight of the 0.5B decoder of ``tools/bench_generate.py`` (Qwen2.5-0.5B's MLP, 896 x
4,864 and 4,864 x 896) in the forms the engine runs —

* ``fp32``: ONNX Runtime's ``MatMul``;
* ``int4``: ``MatMulNBits``, 4 bits, block 32, accuracy level 4 (int8 compute), what
  ``quantize --mode int4`` writes (``decoder_quant.matmul_nbits``); ``int4-block128`` the same
  at block 128;
* ``int8-per-token``: the per-token ``MatMulInteger`` form (``optimize/per_token_int8``: each
  row quantized on its own, the integer GEMM, the scales), one of the two ``quantize --mode int8``
  chooses between; ``int8``: ``MatMulNBits`` at 8 bits, level 4, the other.

at 1, 2, 4 and 8 rows, all forms alternated in each round, best of rounds (µs per call). The
report gives each form's 8-row / 1-row cost and ``gain_ceiling_8`` = 8 x t(1) / t(8): the most
eight streams could gain over one if the whole step were this kernel (the rest of a step —
attention, norms, the per-token loop — gains more; so a form whose ceiling is below 3.5 keeps
the step below it once it is most of the step).

Usage: ``python tools/bench_matmul_rows.py [--threads 2] [--rounds 8] [--calls 200] [--out DIR]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "tools"):
    if str(_path) not in sys.path:  # run as a script from a checkout
        sys.path.insert(0, str(_path))

from bench_report import publish  # noqa: E402

WEIGHTS = {"mlp_up_896x4864": (896, 4864), "mlp_down_4864x896": (4864, 896)}
ROWS = (1, 2, 4, 8)


def matmul_model(k: int, n: int, seed: int = 0) -> Any:
    """An fp32 graph ``Y = X @ W`` with a constant [k, n] weight at Hugging Face's init scale."""
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(seed).normal(0, 0.02, (k, n)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["Y"], name="matmul")], "rows",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["rows", k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["rows", n])],
                              [numpy_helper.from_array(weight, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def forms(k: int, n: int) -> dict[str, Any]:
    """The weight as each kernel form the engine runs (model protos)."""
    from edge_runtime.optimize.decoder_quant import matmul_nbits
    from edge_runtime.optimize.per_token_int8 import per_token_int8
    from edge_runtime.optimize.quantize import host_int8_settings

    built = {"fp32": matmul_model(k, n)}
    built["int4"] = matmul_nbits(matmul_model(k, n), 4, 32, 4)
    built["int4-block128"] = matmul_nbits(matmul_model(k, n), 4, 128, 4)
    built["int8"] = matmul_nbits(matmul_model(k, n), 8, 32, 4)
    built["int8-per-token"], done = per_token_int8(matmul_model(k, n), host_int8_settings())
    assert done == 1, "the per-token form rewrote no MatMul"
    return built


def session(proto: Any, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


def timer(run: Callable[[], Any], calls: int) -> float:
    """Seconds per call over ``calls`` calls (after one warm call)."""
    run()
    started = time.perf_counter()
    for _ in range(calls):
        run()
    return (time.perf_counter() - started) / calls


def measure(threads: int, rounds: int, calls: int) -> dict[str, Any]:
    result: dict[str, Any] = {"threads": threads, "rounds": rounds, "calls": calls, "weights": {}}
    rng = np.random.default_rng(1)
    for label, (k, n) in WEIGHTS.items():
        sessions = {name: session(proto, threads) for name, proto in forms(k, n).items()}
        feeds = {rows: rng.normal(0, 1, (rows, k)).astype(np.float32) for rows in ROWS}
        best = {name: dict.fromkeys(ROWS, float("inf")) for name in sessions}
        for _ in range(rounds):
            for rows in ROWS:
                for name, s in sessions.items():  # every form alternated within the round
                    seconds = timer(lambda: s.run(None, {"X": feeds[rows]}), calls)
                    best[name][rows] = min(best[name][rows], seconds)
        table = {}
        for name, per_rows in best.items():
            us = {str(rows): round(seconds * 1e6, 1) for rows, seconds in per_rows.items()}
            table[name] = {"us": us, "rows8_over_rows1": round(per_rows[8] / per_rows[1], 2),
                           "gain_ceiling_8": round(8 * per_rows[1] / per_rows[8], 2)}
        result["weights"][label] = table
    return result


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    weights = list(result["weights"])
    fig, axes = plt.subplots(1, len(weights), figsize=(6 * len(weights), 4.5), squeeze=False)
    for ax, label in zip(axes[0], weights):
        for name, row in result["weights"][label].items():
            ax.plot(ROWS, [row["us"][str(r)] for r in ROWS], marker="o",
                    label=f"{name} (8 rows = {row['rows8_over_rows1']}x one)")
        ax.set_xticks(ROWS)
        ax.set_xlabel("rows (streams in the decode batch)")
        ax.set_ylabel("µs per call (best of rounds)")
        ax.set_title(f"{label}, {result['threads']} threads")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=200, help="calls per timing (default 200)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "matmul-rows")
    args = parser.parse_args(argv)
    publish(measure(args.threads, args.rounds, args.calls), args.out, "bench_matmul_rows", plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
