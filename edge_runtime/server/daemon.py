"""``edge-runtime serve``: run the server until SIGTERM/SIGINT, then drain and exit 0.

On a signal the listening socket closes at once (no new connections),
readiness turns false, in-flight requests get ``drain_timeout_s`` to finish,
then pending async tasks get the same, then model queues drain and models
close. Logs go to stderr (the CLI configures levels with ``--log-level``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from edge_runtime.server.config import Settings, load_settings

log = logging.getLogger(__name__)

# How long a thread may hold the GIL while another waits for it. The event loop and the device
# workers share the GIL: a worker whose ORT run just returned needs it to split the outputs and
# take the next batch, and a busy loop (parsing requests at concurrency 16) only hands it over
# when CPython's switch interval forces it (5 ms by default: the loop's own brief releases in
# select() are taken back before the waiting worker wakes). Measured on 2 cores (PP-OCR cls,
# c=16, two interleaved A/B runs on a loaded machine): 228 / 243 req/s at 5 ms, 274 / 425 at
# 0.5 ms, the batch's compute 28.5 -> 17.2 ms for ~9 rows.
SWITCH_INTERVAL_S = 0.0005


def main(args: argparse.Namespace) -> int:
    """Entry point of ``edge-runtime serve``; returns the exit code (ConfigError propagates to the CLI)."""
    if getattr(args, "log_level", None):
        logging.getLogger().setLevel(str(args.log_level).upper())
    overrides = {"host": args.host, "port": args.port, "grpc_port": getattr(args, "grpc_port", None),
                 "model_repository": args.model_repository}
    settings = load_settings(args.config, overrides)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        return asyncio.run(serve(settings))
    except OSError as exc:  # port taken, address not available
        log.error("cannot listen on %s:%d: %s", settings.server.host, settings.server.port, exc)
        return 1


async def serve(settings: Settings) -> int:
    """Serve until SIGTERM or SIGINT arrives, then drain; returns 0."""
    from aiohttp import web

    from edge_runtime.heap_trim import release_free_heap
    from edge_runtime.runtime import Runtime
    from edge_runtime.server.app import create_app
    from edge_runtime.server.state import STATE
    from edge_runtime.serving.layout import demo_repository
    from edge_runtime.serving.repository import ModelRepository

    config = settings.server
    runtime = Runtime(settings.runtime)
    try:
        root = config.model_repository or demo_repository(settings.runtime.cache_dir)
        if config.model_repository is None:
            log.info("no --model-repository: serving the demo model as 'demo'")
        repository = ModelRepository(root, runtime, load=settings.load, cloud=settings.cloud,
                                     drain_timeout_s=config.drain_timeout_s, memory=settings.memory)
        app = create_app(config, repository)
        runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=config.drain_timeout_s,
                               access_log=logging.getLogger("edge_runtime.server.access"))
        await runner.setup()  # loads the models (cleanup_ctx) before the socket opens
        # Loading parsed and optimised every graph on the heap and freed most of it: give the free
        # pages back, or the idle daemon keeps them (heap_trim.py; the classifier's daemon with
        # single_thread = "never": 106 MiB idle after a warm-up without this, 104.5 with it).
        release_free_heap()
        try:
            site = web.TCPSite(runner, config.host, config.port)
            await site.start()
            port = runner.addresses[0][1] if runner.addresses else config.port
            grpc_port = app[STATE].grpc_port
            log.warning("edge-runtime serving %s on http://%s:%d%s%s", root, config.host, port,
                        f" and gRPC {config.host}:{grpc_port}" if grpc_port is not None else "",
                        " (token required)" if config.token else "")
            await _wait_for_signal()
            log.warning("signal received: draining for up to %.1f s", config.drain_timeout_s)
        finally:
            await runner.cleanup()
    finally:
        runtime.close()
    log.warning("stopped")
    return 0


async def _wait_for_signal() -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
