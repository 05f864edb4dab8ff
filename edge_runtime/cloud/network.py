"""RTT and bandwidth of the path to the cloud peer, learned from live calls (EWMA).

Model of one call: ``elapsed = rtt + bytes / bandwidth + server compute``.
Two moving averages are kept:

* RTT from health probes and calls moving at most ``SMALL_BYTES``:
  ``rtt = elapsed - server``;
* bandwidth from larger calls: ``bw = bytes / (elapsed - server - rtt)``, the
  divisor floored at ``MIN_TRANSFER_SHARE`` of the network time.

The estimates start at configured priors (the first sample replaces a prior).
RTT follows changes with weight ``alpha``; bandwidth is averaged in log space
with weight ``bandwidth_alpha`` (a geometric mean), because links differ by
orders of magnitude and a linear average would take tens of samples to follow
a drop from Wi-Fi to a poor cell (or back), where this takes two or three.
Thread-safe.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

MIN_TRANSFER_SHARE = 0.2
SMALL_BYTES = 4096  # a call moving at most this much is an RTT sample


@dataclass(frozen=True)
class NetworkSnapshot:
    rtt_ms: float
    bandwidth_bps: float  # bytes per second
    rtt_samples: int
    bandwidth_samples: int

    def transfer_ms(self, nbytes: float) -> float:
        """Milliseconds to move ``nbytes`` at the estimated bandwidth (no RTT)."""
        return nbytes / self.bandwidth_bps * 1e3

    def call_ms(self, nbytes: float, server_ms: float = 0.0) -> float:
        """Expected wall time of one call moving ``nbytes`` (both directions) with ``server_ms`` of compute."""
        return self.rtt_ms + self.transfer_ms(nbytes) + server_ms

    def to_dict(self) -> dict[str, float | int]:
        return {"rtt_ms": round(self.rtt_ms, 3), "bandwidth_mbps": round(self.bandwidth_bps * 8 / 1e6, 3),
                "rtt_samples": self.rtt_samples, "bandwidth_samples": self.bandwidth_samples}


class NetworkEstimator:
    """EWMA estimates of RTT and bandwidth; priors until samples arrive."""

    def __init__(self, rtt_ms: float = 50.0, bandwidth_bps: float = 2.5e6, alpha: float = 0.3,
                 bandwidth_alpha: float = 0.5) -> None:
        if rtt_ms < 0 or bandwidth_bps <= 0 or not 0.0 < alpha <= 1.0 or not 0.0 < bandwidth_alpha <= 1.0:
            raise ValueError(f"bad estimator settings: rtt_ms={rtt_ms}, bandwidth_bps={bandwidth_bps}, "
                             f"alpha={alpha}, bandwidth_alpha={bandwidth_alpha}")
        self.alpha = alpha
        self.bandwidth_alpha = bandwidth_alpha
        self._rtt_ms = rtt_ms
        self._bandwidth_bps = bandwidth_bps
        self._rtt_n = 0
        self._bw_n = 0
        self._lock = threading.Lock()
        self.last_rtt_sample_s: float | None = None  # time.monotonic() of the newest RTT sample
        self.last_bandwidth_sample_s: float | None = None

    def snapshot(self) -> NetworkSnapshot:
        with self._lock:
            return NetworkSnapshot(self._rtt_ms, self._bandwidth_bps, self._rtt_n, self._bw_n)

    def observe_rtt(self, rtt_ms: float) -> None:
        """A round trip that moved (almost) no payload, e.g. a health probe."""
        with self._lock:
            self._rtt_ms = self._mix(self._rtt_ms, max(0.0, rtt_ms), self._rtt_n)
            self._rtt_n += 1
            self.last_rtt_sample_s = time.monotonic()

    def observe_call(self, elapsed_ms: float, nbytes: int, server_ms: float = 0.0) -> None:
        """A call that moved ``nbytes`` (request + response) and spent ``server_ms`` computing remotely."""
        network_ms = max(0.0, elapsed_ms - server_ms)
        with self._lock:
            if nbytes <= SMALL_BYTES:
                self._rtt_ms = self._mix(self._rtt_ms, network_ms, self._rtt_n)
                self._rtt_n += 1
                self.last_rtt_sample_s = time.monotonic()
                return
            # NOTE: when the transfer hides under RTT noise, the floor turns the sample into a lower
            # bound on bandwidth; that still corrects a prior that was far too low.
            moving_ms = max(network_ms - self._rtt_ms, MIN_TRANSFER_SHARE * network_ms, 1e-3)
            sample = nbytes / (moving_ms / 1e3)
            if self._bw_n == 0:
                self._bandwidth_bps = sample
            else:
                self._bandwidth_bps *= (sample / self._bandwidth_bps) ** self.bandwidth_alpha
            self._bw_n += 1
            self.last_bandwidth_sample_s = time.monotonic()

    def _mix(self, old: float, sample: float, count: int) -> float:
        # The first sample replaces the prior outright: priors are guesses, samples are facts.
        return sample if count == 0 else old + self.alpha * (sample - old)
