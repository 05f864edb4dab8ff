"""``tools/bench_generate.py``'s bookkeeping: side names, matching precisions, token agreement, peer protocol.

The peers themselves (onnxruntime-genai, llama.cpp) live in venvs CI builds only
when asked for, so what is checked here is the arithmetic that turns their
answers into the README's ratios, and the JSON-lines protocol with a stand-in
worker.
"""

from __future__ import annotations

import sys

import pytest


def test_side_names_carry_precision_and_context() -> None:
    from bench_generate import side

    assert side("edge-runtime-fused", "fp32", 64) == "edge-runtime-fused"
    assert side("edge-runtime-fused", "int4", 1024) == "edge-runtime-fused-int4-ctx1024"
    assert side("onnxruntime-genai", "fp32", 1024) == "onnxruntime-genai-ctx1024"
    # llama.cpp's f32 is named: its three formats must not collapse onto one key.
    assert side("llama.cpp", "f32", 64) == "llama.cpp-f32"


def test_agreement_counts_positions_and_first_difference() -> None:
    from bench_generate import agreement

    assert agreement([1, 2, 3, 4], [1, 2, 3, 4]) == {"equal": True, "first_difference": None,
                                                     "same_position_share": 1.0}
    assert agreement([1, 2, 3, 4], [1, 2, 9, 4]) == {"equal": False, "first_difference": 2,
                                                     "same_position_share": 0.75}
    # A shorter answer differs where it stops, though every token it has matches.
    assert agreement([1, 2, 3, 4], [1, 2]) == {"equal": False, "first_difference": 2, "same_position_share": 0.5}


def test_precision_table_pairs_each_format_with_its_peer() -> None:
    from bench_generate import precision_table

    rate = lambda tps, ttft=10.0: {"decode_tokens_per_s_best": tps, "ttft_ms_best": ttft}  # noqa: E731
    single = {"edge-runtime-fused": rate(200), "onnxruntime-genai": rate(250), "llama.cpp-f32": rate(100),
              "edge-runtime-fused-int8": rate(300), "llama.cpp-q8_0": rate(600),
              "edge-runtime-fused-int4-ctx1024": rate(90), "onnxruntime-genai-int4-ctx1024": rate(45),
              "llama.cpp-q4_0-ctx1024": rate(180), "llama.cpp-q4_0": rate(999)}
    table = precision_table(single, [64, 1024], ["fp32", "int8", "int4"])
    assert table["ctx64-fp32"]["ours_vs_genai"] == 0.8 and table["ctx64-fp32"]["ours_vs_llama.cpp"] == 2.0
    # int8 has no genai side (its builder's int8 is not measured): only llama.cpp's q8_0 is beside it.
    assert table["ctx64-int8"] == {"ours_decode_tokens_per_s": 300, "ours_ttft_ms": 10.0,
                                   "llama.cpp_q8_0_decode_tokens_per_s": 600, "llama.cpp_q8_0_ttft_ms": 10.0,
                                   "ours_vs_llama.cpp": 0.5}
    # Ratios never cross contexts: int4 at 1,024 is against q4_0 at 1,024, not at 64.
    assert table["ctx1024-int4"]["ours_vs_genai"] == 2.0 and table["ctx1024-int4"]["ours_vs_llama.cpp"] == 0.5
    assert "ctx64-int4" not in table and "ctx1024-fp32" not in table


def test_json_worker_answers_and_reports_errors(tmp_path) -> None:
    from generate_peers import JsonWorker

    script = tmp_path / "worker.py"
    script.write_text(
        "import json, sys\n"
        "print(json.dumps({'ready': True, 'version': '9.9'}), flush=True)\n"
        "for line in sys.stdin:\n"
        "    c = json.loads(line)\n"
        "    out = {'tokens': c['prompt'][::-1]} if c['cmd'] == 'single' else {'error': 'no ' + c['cmd']}\n"
        "    print(json.dumps(out), flush=True)\n")
    worker = JsonWorker([sys.executable, str(script)], "stand-in")
    try:
        assert worker.version == "9.9"
        assert worker.ask(cmd="single", prompt=[1, 2, 3]) == {"tokens": [3, 2, 1]}
        with pytest.raises(RuntimeError, match="stand-in: no batch"):
            worker.ask(cmd="batch")
    finally:
        worker.close()
    assert worker.process.returncode == 0


def test_json_worker_that_dies_says_so(tmp_path) -> None:
    from generate_peers import JsonWorker

    script = tmp_path / "dies.py"
    script.write_text("import sys\nsys.exit(3)\n")
    with pytest.raises(RuntimeError, match=r"stand-in worker exited \(code 3\)"):
        JsonWorker([sys.executable, str(script)], "stand-in")
