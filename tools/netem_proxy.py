"""A TCP shaping proxy on loopback: delay, bandwidth, and connection resets, like ``tc netem``.

Used where network namespaces with ``tc netem`` are not available (containers
without the ``sch_netem`` module, which is the case on our CI machines). Each
connection to the proxy opens one to the target; bytes in each direction are
paced at ``rate_bps`` (serialisation) and released ``delay_ms`` later
(propagation), so RTT = 2 x ``delay_ms`` plus the target's own time. A
connection may be reset (RST, not FIN) after ``reset_after_bytes`` bytes of
the target's answer, always or with ``reset_probability``; or go silent after
``stall_after_bytes`` (the rest of the answer is dropped, the connection stays
open until one end closes it, and that close is passed on: a stalled peer, or
one killed mid-answer at a moment the test chooses).

Bounded: at most ``max_connections`` at once (extra ones are closed at once),
at most ``QUEUE_CHUNKS`` chunks of ``CHUNK_BYTES`` buffered per direction, and
the command line stops itself after ``--max-seconds``. With an ``ssl_context`` the
proxy also terminates TLS (tests of certificate checking in front of a plain server).

In a test::

    with ShapingProxy("127.0.0.1", server_port, PROFILES["4g"]) as proxy:
        url = f"http://127.0.0.1:{proxy.port}"
        proxy.set_profile(PROFILES["poor"])        # takes effect for the next chunks

From a shell (prints ``{"port": N, "pid": P}`` once listening)::

    python tools/netem_proxy.py --target 127.0.0.1:8080 --profile 4g --max-seconds 120
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import random
import socket
import ssl
import struct
import sys
import threading
import time
from dataclasses import dataclass

log = logging.getLogger("netem_proxy")

CHUNK_BYTES = 16 * 1024  # pacing granularity: a chunk is released whole
QUEUE_CHUNKS = 256  # per direction: at most 4 MiB in flight inside the proxy


@dataclass(frozen=True)
class LinkProfile:
    """One emulated link. ``rate_bps`` is bytes per second per direction (None: unlimited)."""

    name: str = "ideal"
    delay_ms: float = 0.0
    rate_bps: float | None = None
    reset_after_bytes: int | None = None
    reset_probability: float = 0.0  # with reset_after_bytes: share of connections reset (0 = all)
    stall_after_bytes: int | None = None  # the answer's bytes beyond this are dropped (the link went silent)

    def describe(self) -> dict[str, object]:
        rate = None if self.rate_bps is None else round(self.rate_bps * 8 / 1e6, 3)
        return {"name": self.name, "rtt_ms": 2 * self.delay_ms, "rate_mbps": rate,
                "reset_after_bytes": self.reset_after_bytes, "stall_after_bytes": self.stall_after_bytes}


# Typical figures: home Wi-Fi to a nearby region, a decent 4G cell, a poor mobile link.
PROFILES: dict[str, LinkProfile] = {
    "wifi": LinkProfile("wifi", delay_ms=4.0, rate_bps=100e6 / 8),
    "4g": LinkProfile("4g", delay_ms=25.0, rate_bps=20e6 / 8),
    "poor": LinkProfile("poor", delay_ms=75.0, rate_bps=2e6 / 8),
}


class ShapingProxy:
    """The proxy on its own event-loop thread; ``start()``/``stop()`` or a ``with`` block."""

    def __init__(self, target_host: str, target_port: int, profile: LinkProfile = LinkProfile(), *,
                 listen_host: str = "127.0.0.1", listen_port: int = 0, max_connections: int = 64,
                 seed: int = 0, ssl_context: ssl.SSLContext | None = None) -> None:
        self.target = (target_host, target_port)
        self.profile = profile
        self.listen = (listen_host, listen_port)
        self.max_connections = max_connections
        self.ssl_context = ssl_context  # set: clients speak TLS to the proxy, which forwards plain TCP
        self.port = 0
        self.connections = 0  # accepted so far
        self.resets = 0  # connections reset on purpose
        self.stalls = 0  # connections whose answer went silent on purpose
        self._active = 0
        self._rng = random.Random(seed)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    def set_profile(self, profile: LinkProfile) -> None:
        self.profile = profile

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> "ShapingProxy":
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def run() -> None:
            assert self._loop is not None
            self._loop.run_until_complete(self._open())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="netem-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("netem proxy did not start within 10 s")
        return self

    async def _open(self) -> None:
        self._server = await asyncio.start_server(self._accept, *self.listen, ssl=self.ssl_context)
        self.port = self._server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        if self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        assert self._thread is not None
        self._thread.join(timeout=10)
        self._loop.close()
        self._loop = None

    async def _close(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def __enter__(self) -> "ShapingProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- connections -----------------------------------------------------------------------
    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            if self._active >= self.max_connections:
                log.warning("netem proxy: %d connections open, refusing another", self._active)
                return
            self._active += 1
            try:
                await self._relay(client_r, client_w)
            finally:
                self._active -= 1
        except asyncio.CancelledError:
            return  # stop() ends open connections; asyncio would log a cancelled handler as an error
        finally:
            _close(client_w)
            self._tasks.discard(task)

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError as exc:
            log.info("netem proxy: target %s:%d unreachable (%s); resetting the client", *self.target, exc)
            _reset(client_w)
            return
        profile = self.profile
        reset_at = profile.reset_after_bytes
        if reset_at is not None and profile.reset_probability and self._rng.random() >= profile.reset_probability:
            reset_at = None
        upstream = asyncio.ensure_future(self._pipe(client_r, server_w, None))
        downstream = asyncio.ensure_future(self._pipe(server_r, client_w, reset_at, profile.stall_after_bytes))
        try:
            done, _ = await asyncio.wait({upstream, downstream}, return_when=asyncio.FIRST_COMPLETED)
            if downstream in done and downstream.result():  # reset on purpose: drop both sides at once
                self.resets += 1
                _reset(client_w)
                _reset(server_w)
            else:
                await asyncio.wait({upstream, downstream}, timeout=30)
        finally:
            for task in (upstream, downstream):
                task.cancel()
            await asyncio.gather(upstream, downstream, return_exceptions=True)
            _close(server_w)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, reset_at: int | None,
                    stall_at: int | None = None) -> bool:
        """Shape one direction; True when it stopped to reset the connection."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(QUEUE_CHUNKS)
        sender = asyncio.ensure_future(self._release(queue, writer))
        forwarded, link_free_at = 0, time.monotonic()
        try:
            while True:
                limit = CHUNK_BYTES
                for edge in (reset_at, stall_at):  # a read ends exactly at the byte where the link changes
                    if edge is not None and forwarded < edge:
                        limit = min(limit, edge - forwarded)
                chunk = await reader.read(limit)
                if not chunk:
                    await queue.put((0.0, b""))
                    await sender
                    _half_close(writer)
                    return False
                if stall_at is not None and forwarded >= stall_at:
                    continue  # silent: read and dropped, so the target's close is still seen and passed on
                profile = self.profile
                now = time.monotonic()
                link_free_at = max(now, link_free_at)
                if profile.rate_bps:
                    link_free_at += len(chunk) / profile.rate_bps
                await queue.put((link_free_at + profile.delay_ms / 1e3, chunk))
                forwarded += len(chunk)
                if stall_at is not None and forwarded >= stall_at:
                    self.stalls += 1
                if reset_at is not None and forwarded >= reset_at:
                    await queue.put((0.0, b""))
                    await sender
                    return True
        except (ConnectionError, OSError):
            return False
        finally:
            sender.cancel()

    @staticmethod
    async def _release(queue: asyncio.Queue, writer: asyncio.StreamWriter) -> None:
        while True:
            due, chunk = await queue.get()
            if not chunk:
                return
            wait_s = due - time.monotonic()
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            writer.write(chunk)
            await writer.drain()


def _half_close(writer: asyncio.StreamWriter) -> None:
    try:
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        pass  # the peer is already gone: nothing left to tell it


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST: SO_LINGER 0 drops the socket without the FIN handshake."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass  # already closed by the peer: there is nothing left to reset
    writer.transport.abort()


def _close(writer: asyncio.StreamWriter) -> None:
    if not writer.transport.is_closing():
        writer.close()


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", type=_host_port, required=True, metavar="HOST:PORT")
    parser.add_argument("--listen", type=_host_port, default=("127.0.0.1", 0), metavar="HOST:PORT")
    parser.add_argument("--profile", choices=sorted(PROFILES), help="a named link (wifi, 4g, poor)")
    parser.add_argument("--delay-ms", type=float, help="one-way delay per direction")
    parser.add_argument("--rate-mbps", type=float, help="bandwidth per direction, Mbit/s")
    parser.add_argument("--reset-after-bytes", type=int, help="reset connections after this many answer bytes")
    parser.add_argument("--reset-probability", type=float, default=0.0)
    parser.add_argument("--stall-after-bytes", type=int, help="drop the answer after this many bytes")
    parser.add_argument("--max-connections", type=int, default=64)
    parser.add_argument("--max-seconds", type=float, default=600.0, help="stop after this long (bounded runs)")
    args = parser.parse_args(argv)
    profile = PROFILES[args.profile] if args.profile else LinkProfile("custom")
    overrides = {"delay_ms": args.delay_ms, "reset_after_bytes": args.reset_after_bytes,
                 "stall_after_bytes": args.stall_after_bytes,
                 "rate_bps": None if args.rate_mbps is None else args.rate_mbps * 1e6 / 8}
    profile = dataclasses.replace(profile, reset_probability=args.reset_probability,
                                  **{k: v for k, v in overrides.items() if v is not None})
    if args.listen[0] not in ("127.0.0.1", "localhost", "::1"):
        parser.error("the proxy listens on loopback only")
    proxy = ShapingProxy(*args.target, profile, listen_host=args.listen[0], listen_port=args.listen[1],
                         max_connections=args.max_connections).start()
    print(json.dumps({"port": proxy.port, "pid": os.getpid(), "profile": profile.describe()}),
          flush=True)
    try:
        time.sleep(args.max_seconds)
    except KeyboardInterrupt:
        pass
    proxy.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
