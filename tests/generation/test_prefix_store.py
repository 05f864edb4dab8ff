"""The prefix cache's blocks on disk (``generation.prefix_store``): a restarted model reuses them.

Oracles: the export's no-cache recompute (a hit read from disk decodes what a miss decodes) and
the files themselves (budget, names, removal of a damaged one).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from generation_fixtures import oracle_greedy

SYSTEM = "You are a phone agent. Read the screen, then answer with one action per step. " * 2
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "open the settings"}]
DISK = 16 * 2**20


def _model(folder: Path, cache: Path, **settings):
    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.settings import GenerationSettings

    return GenerativeModel(folder.name, folder, GenerationSettings(**settings), threads=1, cache_dir=cache)


def _store_files(cache: Path) -> list[Path]:
    return sorted((cache / "prefix-kv").glob("*/*.kv"))


def test_a_restarted_model_reuses_the_prompt_blocks_it_stored(qwen_folder: Path, tmp_path: Path) -> None:
    first = _model(qwen_folder, tmp_path, prefix_cache_disk_bytes=DISK)
    try:
        answer = first.generate(messages=MESSAGES, max_tokens=12)
        assert answer.usage.cached_tokens == 0
    finally:
        first.close()  # writes what is pending
    assert _store_files(tmp_path)
    second = _model(qwen_folder, tmp_path, prefix_cache_disk_bytes=DISK)
    try:
        ids = second.prepare(messages=MESSAGES).ids
        assert second.cached_tokens(second.prepare(messages=MESSAGES)) > 0  # routing sees the disk too
        again = second.generate(messages=MESSAGES, max_tokens=12)
        blocks = (len(ids) - 1) // 16
        assert again.usage.cached_tokens == blocks * 16 and second.prefix_cache.store.stats()["read_blocks"] == blocks
        expected = oracle_greedy(qwen_folder, ids, 12, set(second.folder.eos_token_ids))
        assert list(again.token_ids) == list(answer.token_ids) == expected
    finally:
        second.close()


def test_another_graph_or_setting_does_not_reuse_them(qwen_folder: Path, tmp_path: Path) -> None:
    first = _model(qwen_folder, tmp_path, prefix_cache_disk_bytes=DISK)
    try:
        first.generate(messages=MESSAGES, max_tokens=4)
    finally:
        first.close()
    for settings in ({"fuse_exports": False}, {"flush_denormals": False}):  # another graph; other arithmetic
        other = _model(qwen_folder, tmp_path, prefix_cache_disk_bytes=DISK, **settings)
        try:
            assert other.generate(messages=MESSAGES, max_tokens=4).usage.cached_tokens == 0
        finally:
            other.close()


def test_off_by_default_and_the_disk_budget_holds(qwen_folder: Path, tmp_path: Path) -> None:
    plain = _model(qwen_folder, tmp_path / "off")
    try:
        plain.generate(messages=MESSAGES, max_tokens=4)
        assert plain.prefix_cache.store is None
    finally:
        plain.close()
    assert not (tmp_path / "off" / "prefix-kv").exists()
    block_bytes = 2 * 2 * 2 * 16 * 16 * 4  # 2 layers x (key, value) x 2 KV heads x 16 tokens x 16 dims, float32
    budget = 5 * (block_bytes + 1024)  # about five blocks with their file overhead
    small = _model(qwen_folder, tmp_path / "small", prefix_cache_disk_bytes=budget)
    try:
        for i in range(4):
            small.generate(messages=[{"role": "system", "content": f"agent {i}: " + SYSTEM}, MESSAGES[1]], max_tokens=2)
        small.prefix_cache.store.flush()
        stats = small.prefix_cache.store.stats()
    finally:
        small.close()
    files = _store_files(tmp_path / "small")
    assert stats["written_blocks"] > len(files) > 0
    assert sum(f.stat().st_size for f in files) <= budget


def test_a_damaged_block_is_a_miss_and_is_removed(qwen_folder: Path, tmp_path: Path) -> None:
    first = _model(qwen_folder, tmp_path, prefix_cache_disk_bytes=DISK)
    try:
        ids = first.prepare(messages=MESSAGES).ids
        answer = first.generate(messages=MESSAGES, max_tokens=8)
    finally:
        first.close()
    from edge_runtime.generation.prefix_cache import PrefixCache

    keys = PrefixCache(16, 1)._keys(ids, (len(ids) - 1) // 16)
    damaged = next(p for p in _store_files(tmp_path) if p.name.startswith(f"{keys[2][0] & 0xFFFFFFFFFFFFFFFF:016x}"))
    damaged.write_bytes(b"not a block")
    second = _model(qwen_folder, tmp_path, prefix_cache_disk_bytes=DISK)
    try:
        again = second.generate(messages=MESSAGES, max_tokens=8)
        assert again.usage.cached_tokens == 2 * 16  # the two blocks before the damaged one
        assert list(again.token_ids) == list(answer.token_ids)
    finally:
        second.close()
    assert not damaged.exists() or damaged.read_bytes() != b"not a block"  # removed (or written anew)


def test_a_block_under_another_prefix_is_not_returned(tmp_path: Path) -> None:
    from edge_runtime.generation.prefix_store import PrefixStore

    store = PrefixStore(tmp_path, DISK)
    kv = np.arange(2 * 2 * 4 * 3, dtype=np.float32).reshape(2, 2, 4, 3)
    store.put(7, (1, 2, 3, 4), kv)
    store.flush()
    np.testing.assert_array_equal(store.get(7, (1, 2, 3, 4)), kv)
    assert store.get(7, (1, 2, 3, 5)) is None  # same key, other tokens: a collision is a miss
    assert store.get(8, (1, 2, 3, 4)) is None
    store.close()


def test_blocks_past_the_pending_bytes_are_not_queued(tmp_path: Path, monkeypatch) -> None:
    """The writer's queue holds at most PENDING_BYTES of copies: a burst beyond it is dropped (and
    counted), never memory without bound; what was queued is written."""
    import threading

    import edge_runtime.generation.prefix_store as prefix_store

    kv = np.zeros((2, 2, 16, 16), np.float32)
    monkeypatch.setattr(prefix_store, "PENDING_BYTES", 3 * kv.nbytes)
    store = prefix_store.PrefixStore(tmp_path, DISK)
    gate = threading.Event()
    real_write = store._write
    monkeypatch.setattr(store, "_write", lambda *item: (gate.wait(10), real_write(*item)))
    for key in range(6):
        store.put(key, (key,) * 16, kv)
    gate.set()
    store.flush()
    stats = store.stats()
    store.close()
    assert stats["written_blocks"] == 3 and stats["dropped_blocks"] == 3


def test_the_served_model_reports_its_disk_blocks_in_metrics(qwen_folder: Path, tmp_path: Path) -> None:
    """``[generation] prefix_cache_disk_bytes`` from config.toml; ``/metrics`` counts the blocks written."""
    import shutil
    import urllib.request

    from edge_runtime.server.state import STATE
    from generation_fixtures import base_url, served_repository

    root = tmp_path / "repository"
    shutil.copytree(qwen_folder, root / "agent" / "1")
    (root / "agent" / "config.toml").write_text(f"[generation]\nprefix_cache_disk_bytes = {DISK}\n")
    with served_repository(root, tmp_path / "cache") as live:
        model = live.app[STATE].repository.get("agent").model
        model.generate(messages=MESSAGES, max_tokens=2)
        model.prefix_cache.store.flush()
        with urllib.request.urlopen(base_url(live) + "/metrics", timeout=30) as response:
            text = response.read().decode()
    written = [line for line in text.splitlines()
               if line.startswith('edge_runtime_prefix_cache_disk_written_blocks_total{model="agent"}')]
    assert written and float(written[0].split()[-1]) >= 1
    assert any(line.startswith('edge_runtime_prefix_cache_disk_budget_bytes{model="agent"}') and float(line.split()[-1]) == DISK
               for line in text.splitlines())
    assert _store_files(tmp_path / "cache")


def test_a_disk_that_refuses_writes_is_said_once_and_costs_nothing_else(tmp_path: Path, monkeypatch,
                                                                        caplog) -> None:
    import logging

    from edge_runtime.generation.prefix_store import PrefixStore

    store = PrefixStore(tmp_path, DISK)

    def full(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "_write", full)
    kv = np.zeros((2, 2, 16, 16), np.float32)
    with caplog.at_level(logging.WARNING, logger="edge_runtime.generation.prefix_store"):
        for key in range(5):
            store.put(key, (key,) * 16, kv)
        store.flush()
    stats = store.stats()
    store.close()
    assert stats["failed_writes"] == 5 and stats["written_blocks"] == 0
    assert len([r for r in caplog.records if "cannot write" in r.getMessage()]) == 1
