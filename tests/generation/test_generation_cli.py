"""``edge-runtime generate`` as a real subprocess, against the embedded API on the same folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "EDGE_RUNTIME_CACHE": str(cache), "PYTHONPATH": str(ROOT), "EDGE_RUNTIME_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "edge_runtime", "generate", *args], capture_output=True,
                          text=True, env=env, timeout=240)


def test_generate_json_and_streaming_equal_the_embedded_api(qwen_folder: Path, tmp_path: Path, model_factory) -> None:
    model = model_factory(qwen_folder)
    messages = [{"role": "user", "content": "open the settings menu"}]
    expected = model.generate(messages=messages, max_tokens=12)
    (tmp_path / "messages.json").write_text(json.dumps(messages))
    result = cli(str(qwen_folder), "--messages", str(tmp_path / "messages.json"), "--max-tokens", "12", "--json",
                 cache=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["token_ids"] == list(expected.token_ids) and report["text"] == expected.text
    assert report["usage"]["completion_tokens"] == expected.usage.completion_tokens
    plain = model.generate("the agent taps", max_tokens=10)
    streamed = cli(str(qwen_folder), "--prompt", "the agent taps", "--max-tokens", "10", cache=tmp_path)
    assert streamed.returncode == 0 and streamed.stdout == plain.text + "\n"


def test_generate_reports_bad_input_clearly(qwen_folder: Path, tmp_path: Path) -> None:
    missing = cli(str(tmp_path / "nope"), "--prompt", "x", cache=tmp_path)
    assert missing.returncode == 1 and "not a generative model folder" in missing.stderr
    (tmp_path / "bad.json").write_text(json.dumps([{"role": "robot", "content": "x"}]))
    bad = cli(str(qwen_folder), "--messages", str(tmp_path / "bad.json"), cache=tmp_path)
    assert bad.returncode == 1 and "role must be one of" in bad.stderr
    usage = cli(str(qwen_folder), cache=tmp_path)
    assert usage.returncode == 2  # neither --prompt nor --messages
