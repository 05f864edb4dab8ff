"""Token enforcement, loopback-only by default, and the server settings (file, environment, flags)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edge_runtime.errors import ConfigError
from edge_runtime.server.config import is_loopback, load_settings
from server_fixtures import ROOT, free_port

TOKEN = "s3cret-token"


async def test_token_is_required_everywhere_but_health(aiohttp_client: Any, make_app: Any) -> None:
    client = await aiohttp_client(make_app(token=TOKEN))
    assert (await client.get("/v2/health/live")).status == 200
    assert (await client.get("/v2/health/ready")).status == 200
    for method, path in [("GET", "/v2"), ("GET", "/metrics"), ("GET", "/openapi.json"), ("GET", "/v2/models/mlp"),
                         ("POST", "/v2/repository/index"), ("POST", "/v2/models/mlp/infer"),
                         ("GET", "/v2/tasks/abc")]:
        response = await client.request(method, path)
        assert response.status == 401, path
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
        assert "bearer token" in (await response.json())["error"]
        wrong = await client.request(method, path, headers={"Authorization": "Bearer nope"})
        assert wrong.status == 401
    ok = await client.get("/v2", headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status == 200
    ok = await client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status == 200


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.8.0.1", True), ("::1", True),
                                            ("localhost", True), ("0.0.0.0", False), ("", False),
                                            ("192.168.1.4", False), ("phone.lan", False)])
def test_loopback_detection(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_non_loopback_without_token_is_refused() -> None:
    with pytest.raises(ConfigError, match="refusing to listen on '0.0.0.0' without a token"):
        load_settings(None, {"host": "0.0.0.0"}, env={})


def test_token_from_environment_or_file(tmp_path: Path) -> None:
    settings = load_settings(None, {"host": "0.0.0.0"}, env={"EDGE_RUNTIME_TOKEN": TOKEN})
    assert settings.server.token == TOKEN
    config = tmp_path / "server.toml"
    config.write_text('[server]\nhost = "0.0.0.0"\ntoken_env = "MY_TOKEN"\nport = 9000\n'
                      'overload_status = 503\n[runtime]\nintra_op_threads = 2\n')
    settings = load_settings(config, {}, env={"MY_TOKEN": "abc"})
    assert (settings.server.token, settings.server.port, settings.server.overload_status) == ("abc", 9000, 503)
    assert settings.runtime.intra_op_threads == 2
    with pytest.raises(ConfigError, match="without a token"):
        load_settings(config, {}, env={"EDGE_RUNTIME_TOKEN": "not the variable named by token_env"})


def test_precedence_flags_over_environment_over_file(tmp_path: Path) -> None:
    config = tmp_path / "server.toml"
    config.write_text("[server]\nport = 9000\nmax_tasks = 9\nretry_after_s = 4\n")
    env = {"EDGE_RUNTIME_PORT": "9100", "EDGE_RUNTIME_MAX_TASKS": "11"}
    server = load_settings(config, {"port": 9200, "host": None}, env=env).server
    assert (server.port, server.max_tasks, server.retry_after_s, server.host) == (9200, 11, 4, "127.0.0.1")


@pytest.mark.parametrize("text, message", [
    ("[server]\nprot = 1\n", "unknown key(s) ['prot']"),
    ("[server]\noverload_status = 500\n", "overload_status must be 429 or 503"),
    ("[server]\nmax_body_bytes = 0\n", "max_body_bytes must be >= 1"),
    ("[servre]\n", "unknown table(s) ['servre']"),
    ("[server]\nport = 'x'\n", "expected int"),
    ("[load]\npin_gpu_busy = 1.5\n", "pin_gpu_busy must be in [0, 1]"),
    ("[load]\nsample_ms = 5\n", "[load]: unknown key(s) ['sample_ms']"),
    ("load = 3\n", "[load] must be a table"),
    ("[cloud]\nurl = 'ftp://peer'\n", "[cloud] url must be http(s)"),
    ("[cloud]\nurl = 'http://peer'\ntoken = 'inline'\n", "[cloud] takes no 'token'"),
])
def test_bad_settings_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "server.toml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_settings(config, {}, env={})


def test_bad_environment_value_is_named() -> None:
    with pytest.raises(ConfigError, match="EDGE_RUNTIME_PORT='eighty'"):
        load_settings(None, {}, env={"EDGE_RUNTIME_PORT": "eighty"})


def test_serve_refuses_to_bind_a_public_address_without_a_token(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "EDGE_RUNTIME_TOKEN"}
    env.update(EDGE_RUNTIME_CACHE=str(tmp_path), PYTHONPATH=str(ROOT))
    port = free_port()
    result = subprocess.run([sys.executable, "-m", "edge_runtime", "serve", "--host", "0.0.0.0", "--port", str(port)],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 1
    assert "refusing to listen on '0.0.0.0' without a token" in result.stderr
    assert "Traceback" not in result.stderr
