"""The smallest server ``tools/bench_c1_floor.py`` compares the daemon with: aiohttp and nothing else.

``POST /v2/models/<model>/infer`` reads the body and answers a canned v2 response (the bytes the
daemon gave for the same request), after running the model once in the default executor unless
``--session canned``. ``--session`` picks the ONNX Runtime session's spinning: ``ort`` (its default),
``load`` (the daemon's ``[scheduler] spin = "load"`` settings: spin only inside a run, 1 ms bound) or
``never``. No validation, decoding, scheduling or statistics: what is left of the daemon's c=1
overhead over this is the daemon's own.

    python tools/c1_floor_server.py --port P --model M.onnx --response R.bin --header-length N --session load
"""

from __future__ import annotations

import argparse
import asyncio

import numpy as np
from aiohttp import web

SPIN_ENTRIES = {
    "ort": {},
    "load": {"session.intra_op.allow_spinning": "1", "session.force_spinning_stop": "1",
             "session.intra_op.spin_duration_us": "1000"},
    "never": {"session.intra_op.allow_spinning": "0"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", required=True, help="ONNX file with one float32 input")
    parser.add_argument("--shape", default="1,3,48,192")
    parser.add_argument("--response", required=True, help="file holding the response body to send")
    parser.add_argument("--header-length", required=True, help="its Inference-Header-Content-Length")
    parser.add_argument("--session", choices=["canned", *SPIN_ENTRIES], default="ort")
    args = parser.parse_args()
    body = open(args.response, "rb").read()
    headers = {"Inference-Header-Content-Length": args.header_length, "Content-Type": "application/octet-stream"}
    run = None
    if args.session != "canned":
        import onnxruntime as ort

        options = ort.SessionOptions()
        for key, value in SPIN_ENTRIES[args.session].items():
            options.add_session_config_entry(key, value)
        session = ort.InferenceSession(args.model, options, providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        x = np.random.default_rng(0).random(tuple(int(d) for d in args.shape.split(",")), dtype=np.float32)
        run = lambda: session.run(None, {name: x})  # noqa: E731

    async def infer(request: web.Request) -> web.Response:
        await request.read()
        if run is not None:
            await asyncio.get_running_loop().run_in_executor(None, run)
        return web.Response(body=body, headers=headers)

    async def ready(request: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    app.router.add_post("/v2/models/{model}/infer", infer)
    app.router.add_get("/v2/health/ready", ready)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None, handle_signals=True)


if __name__ == "__main__":
    main()
