"""``tools/bench_matmul_rows.py`` times what it says: each form is the kernel it is named for, computing
the fp32 product within its quantization error, at every row count it is timed at."""

from __future__ import annotations

import numpy as np
import pytest

KERNELS = {"fp32": ("MatMul", None), "int4": ("MatMulNBits", (4, 32)), "int4-block128": ("MatMulNBits", (4, 128)),
           "int8": ("MatMulNBits", (8, 32)), "int8-per-token": ("MatMulInteger", None)}


def test_forms_are_the_named_kernels_and_agree_with_fp32() -> None:
    from onnx import helper

    from bench_matmul_rows import ROWS, forms, session

    k, n = 256, 96
    built = forms(k, n)
    assert set(built) == set(KERNELS)
    x = np.random.default_rng(3).normal(0, 1, (max(ROWS), k)).astype(np.float32)
    reference = session(built["fp32"], 1).run(None, {"X": x})[0]
    for name, proto in built.items():
        op, bits_block = KERNELS[name]
        nodes = [node for node in proto.graph.node if node.op_type == op]
        assert len(nodes) == 1, f"{name}: expected one {op}, got {[node.op_type for node in proto.graph.node]}"
        if bits_block:
            attributes = {a.name: helper.get_attribute_value(a) for a in nodes[0].attribute}
            assert (attributes["bits"], attributes["block_size"], attributes["accuracy_level"]) == (*bits_block, 4)
        s = session(proto, 1)
        for rows in ROWS:
            y = s.run(None, {"X": x[:rows]})[0]
            assert y.shape == (rows, n)
            expected = reference[:rows]
            cosine = (y * expected).sum(1) / np.linalg.norm(y, axis=1) / np.linalg.norm(expected, axis=1)
            assert cosine.min() > (0.999 if name == "fp32" else 0.98), (name, rows, cosine.min())


def test_report_gives_the_ceiling_from_the_timings(monkeypatch) -> None:
    import bench_matmul_rows as bench

    monkeypatch.setattr(bench, "WEIGHTS", {"small": (64, 32)})
    # a stand-in clock: a call costs (1 + rows) ms, rows read from the output the timed run returns
    monkeypatch.setattr(bench, "timer", lambda run, calls: (1 + run()[0].shape[0]) * 1e-3)
    table = bench.measure(threads=1, rounds=2, calls=1)["weights"]["small"]
    assert set(table) == set(KERNELS)
    for row in table.values():
        assert row["us"] == {"1": 2000.0, "2": 3000.0, "4": 5000.0, "8": 9000.0}
        assert row["rows8_over_rows1"] == 4.5
        assert row["gain_ceiling_8"] == 1.78  # 8 x 2 ms / 9 ms
