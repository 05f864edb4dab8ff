"""Mesa's shader cache lives under the runtime cache dir unless the user chose one; a fresh one says so."""

from __future__ import annotations

import os

from backends.vulkan import driver_env


def test_shader_cache_goes_under_the_runtime_cache_and_reports_freshness(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(driver_env.SHADER_CACHE_ENV, raising=False)
    first = driver_env.prepare_shader_cache(tmp_path)
    assert first.path == str(tmp_path / "vulkan" / "mesa") and first.owner == "edge-runtime" and first.fresh
    assert os.environ[driver_env.SHADER_CACHE_ENV] == first.path  # set before any driver loads
    (tmp_path / "vulkan" / "mesa" / "index").write_bytes(b"x")  # what Mesa leaves after a compile
    again = driver_env.prepare_shader_cache(tmp_path / "elsewhere")
    assert again.path == first.path and not again.fresh  # the process keeps the first directory


def test_a_shader_cache_the_user_chose_is_kept(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(driver_env.SHADER_CACHE_ENV, str(tmp_path / "mine"))
    chosen = driver_env.prepare_shader_cache(tmp_path / "runtime")
    assert chosen.owner == "user" and chosen.path == str(tmp_path / "mine")


def test_the_software_switch_is_only_in_the_child_env_when_asked(monkeypatch) -> None:
    monkeypatch.delenv(driver_env.SOFTWARE_ADAPTER_ENV, raising=False)
    assert driver_env.SOFTWARE_ADAPTER_ENV not in driver_env.child_env(False)
    assert driver_env.child_env(True)[driver_env.SOFTWARE_ADAPTER_ENV] == "1"
