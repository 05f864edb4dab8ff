"""What every served model shares: one LoadMonitor, at most one CloudClient, the cloud call counts.

Built once per server from the ``[load]`` and ``[cloud]`` tables, opened when
the app starts (the monitor's sampling thread, the client's event-loop thread)
and closed on app cleanup, after the models drained.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from edge_runtime.cloud.client import CloudClient
    from edge_runtime.cloud.config import CloudConfig
    from edge_runtime.load_monitor import LoadConfig, LoadMonitor

log = logging.getLogger(__name__)


class CloudCallCounts:
    """Cloud calls per ``(model, outcome)``; outcome ``"ok"`` or a ``CloudCallError.kind``.

    Thread-safe: cloud plans report from the scheduler's worker threads.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str]] = Counter()

    def hook(self, model: str) -> Callable[[str], None]:
        """The ``on_call`` hook for the cloud plans of ``model``."""
        return lambda outcome: self.add(model, outcome)

    def add(self, model: str, outcome: str) -> None:
        with self._lock:
            self._counts[(model, outcome)] += 1

    def items(self) -> list[tuple[tuple[str, str], int]]:
        with self._lock:
            return sorted(self._counts.items())


@dataclass
class SharedServices:
    """The server's one LoadMonitor (sampling once started) and its CloudClient (None without ``[cloud]``)."""

    monitor: "LoadMonitor"
    cloud: "CloudClient | None" = None
    cloud_calls: CloudCallCounts = field(default_factory=CloudCallCounts)

    @classmethod
    def open(cls, runtime: Any, load: "LoadConfig | None" = None,
             cloud: "CloudConfig | None" = None) -> "SharedServices":
        """Start the monitor on the runtime's probe root and, with a ``[cloud]`` url, the cloud client."""
        from edge_runtime.scheduler.factory import monitor_for

        monitor = monitor_for(runtime, load).start()
        client = None
        if cloud is not None:
            from edge_runtime.cloud.client import CloudClient

            client = CloudClient(cloud)
            log.info("cloud peer %s%s", cloud.base_url, " (with a token)" if cloud.token else "")
        return cls(monitor, client)

    def close(self) -> None:
        """Stop the monitor's thread and close the client's pool; idempotent."""
        self.monitor.stop()
        if self.cloud is not None:
            self.cloud.close()
