"""``tools/soak.py`` runs end to end in a few seconds and reports every kind of traffic (shared-memory
inference and streamed generation among them), nothing unexpected, and leaves no shm object behind."""

from __future__ import annotations

import json
import os
from pathlib import Path


def test_a_short_soak_reports_every_kind_and_nothing_unexpected(tmp_path: Path) -> None:
    import soak

    code = soak.main(["--seconds", "4", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "soak.json").read_text())
    assert (tmp_path / "soak.png").stat().st_size > 0
    assert code == 0, result["examples"]
    assert set(result["requests"]) == set(soak.CLIENTS) and result["kinds"] == len(soak.CLIENTS)
    assert all(n > 0 for n in result["requests"].values()), result["requests"]
    assert result["unexpected"] == {} and result["wrong_values"] == {} and result["daemon_alive"]
    assert result["rss_mib"]["peak"] >= result["rss_mib"]["start"] > 0
    assert result["generation"]["decode_tokens"] >= result["requests"]["chat_stream"]  # the daemon's own count
    assert not list(Path("/dev/shm").glob(f"soak-{os.getpid()}-*")), "the soak left shm objects behind"
