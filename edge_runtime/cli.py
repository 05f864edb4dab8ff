"""``edge-runtime`` command line: probe, demo, run, plan, split, convert, serve.

The spellings here are a contract other tools and checks rely on; see README.
Each subcommand is a thin layer over the library and returns an exit code:
0 success, 1 runtime/model error (message on stderr), 2 usage error, 141 stdout
closed by its reader (quietly, as SIGPIPE ends ``cat``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any, Callable

from edge_runtime.errors import EdgeRuntimeError

log = logging.getLogger("edge_runtime")

PLAN_CHOICES = ("cpu", "gpu", "hybrid", "auto")


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edge-runtime", description="Inference runtime for ARM/Android edge devices.")
    parser.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING (default), ERROR")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    probe = sub.add_parser("probe", help="describe this device and the matched catalogue profile")
    probe.add_argument("--json", action="store_true", help="print the profile and match as JSON")
    probe.add_argument("--root", default="/", help="read procfs/sysfs under this directory (tests)")
    probe.set_defaults(handler=_cmd_probe)

    demo = sub.add_parser("demo", help="build the demo CNN and run it on every available backend")
    demo.add_argument("--repeat", type=int, default=30, help="timed runs per backend (default 30)")
    demo.add_argument("--json", action="store_true", help="print the table as JSON")
    demo.set_defaults(handler=_cmd_demo)

    run = sub.add_parser("run", help="run a model file and report latency and outputs")
    run.add_argument("model", type=Path, help="model file (.onnx or .tflite)")
    from edge_runtime.backend_table import USER_BACKENDS  # light: names and descriptors only

    run.add_argument("--backend", default="auto", help=f"auto (default), {', '.join(USER_BACKENDS)}")
    run.add_argument("--input", action="append", default=[], type=_key_value, metavar="NAME=FILE.npy",
                     help="feed input NAME from a .npy file (repeatable); seeded random otherwise")
    run.add_argument("--output", type=Path, help="write the outputs to this .npz file")
    run.add_argument("--repeat", type=int, default=10, help="timed runs (default 10)")
    run.add_argument("--delegate", action="append", default=[], metavar="LIB",
                     help="TFLite external delegate library to load (repeatable)")
    run.add_argument("--delegate-option", action="append", default=[], type=_key_value, metavar="KEY=VALUE",
                     help="option for the last --delegate (repeatable)")
    run.add_argument("--plan", choices=PLAN_CHOICES, default=None,
                     help="partition across backends: cpu, gpu (accelerator + cpu fallback), hybrid, auto")
    run.add_argument("--json", action="store_true", help="print one JSON object")
    run.set_defaults(handler=_cmd_run)

    plan = sub.add_parser("plan", help="show how a model's plans split it into stages across backends")
    plan.add_argument("model", type=Path, help="ONNX model file")
    plan.add_argument("--plan", choices=PLAN_CHOICES, action="append", default=None,
                      help="only this plan (repeatable; default: every plan this device has)")
    plan.add_argument("--shape", action="append", default=[], type=_key_value, metavar="NAME=D1,D2,...",
                      help="bind input NAME's dynamic dims for the cost estimates (repeatable)")
    plan.add_argument("--json", action="store_true", help="print one JSON object")
    plan.set_defaults(handler=_cmd_plan)

    split = sub.add_parser("split", help="cut an ONNX model: head on this device, tail in the cloud")
    from edge_runtime.cloud.command import add_split_arguments  # argparse only: cheap to import

    add_split_arguments(split)
    split.set_defaults(handler=_cmd_split)

    generate = sub.add_parser("generate", help="generate text with a decoder LLM folder (optimum export) or a vision-language one (--image)")
    from edge_runtime.generation.command import add_generate_arguments  # argparse only: cheap to import

    add_generate_arguments(generate)
    generate.set_defaults(handler=_cmd_generate)
    convert = sub.add_parser("convert", help="convert an ONNX model for ncnn (pnnx) into the cache, gated; "
                                             "or a VLM checkpoint to ONNX (--to onnx --out DIR)")
    from edge_runtime.convert_command import add_convert_arguments  # argparse only: cheap to import

    add_convert_arguments(convert)
    convert.set_defaults(handler=_cmd_convert)
    from edge_runtime.optimize.command import register as register_optimize  # argparse only

    register_optimize(sub)  # quantize, profile

    serve = sub.add_parser("serve", help="serve models over HTTP (KServe v2 / Open Inference Protocol)")
    serve.add_argument("--host", default=None, help="address to bind (default 127.0.0.1; others need a token)")
    serve.add_argument("--port", type=int, default=None, help="port (default 8080)")
    serve.add_argument("--grpc-port", type=int, default=None, metavar="PORT",
                       help="also serve KServe v2 gRPC on this port (Triton's is 8001; needs the grpc extra)")
    serve.add_argument("--model-repository", type=Path, default=None, metavar="DIR",
                       help="Triton-style repository: <model>/<version>/model.onnx (default: the demo model)")
    serve.add_argument("--config", type=Path, default=None, metavar="FILE.toml", help="server configuration")
    serve.add_argument("--log-level", default=argparse.SUPPRESS, help="DEBUG, INFO, WARNING (default), ERROR")
    serve.set_defaults(handler=_cmd_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        code = handler(args)
        sys.stdout.flush()  # a reader that left surfaces here when the output fit in the buffer
        return code
    except BrokenPipeError:
        return _reader_went_away()
    except EdgeRuntimeError as exc:
        print(f"edge-runtime {args.command}: {exc}", file=sys.stderr)
        return 1


def _reader_went_away() -> int:
    """Exit status for a closed stdout (``edge-runtime probe --json | head -c 400``).

    Quiet, like ``cat`` or ``grep`` killed by SIGPIPE, and with their status as a
    shell reports it, 128 + SIGPIPE = 141: ``set -o pipefail`` scripts then see
    what they see from coreutils, and it stays apart from 1, which means a model
    or runtime error here. Python ignores SIGPIPE, so the signal arrives as
    ``BrokenPipeError``; stdout is pointed at /dev/null so that the interpreter's
    last flush at exit does not raise (and print) a second one.
    """
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 128 + signal.SIGPIPE


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=False, default=str))


def _cmd_probe(args: argparse.Namespace) -> int:
    from device_profiles import match, probe
    from device_profiles.report import format_profile

    profile = probe(args.root)
    matched = match(profile)
    if args.json:
        _print_json({"profile": profile, "match": matched.to_dict()})
    else:
        print(format_profile(profile, matched))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from edge_runtime.demo import format_table, run_demo

    from edge_runtime.generation.command import format_generation, generation_demo
    from edge_runtime.generation.vision.demo import format_vlm_demo, vlm_demo
    from edge_runtime.runtime import Runtime

    runtime = Runtime()
    try:
        rows, chosen = run_demo(repeat=args.repeat, runtime=runtime)
        generation = generation_demo(runtime)
        vision = vlm_demo(runtime)
    finally:
        runtime.close()
    if args.json:
        _print_json({"rows": rows, "auto_backend": chosen, "generation": generation, "vision": vision})
    else:
        print(format_table(rows, chosen) + format_generation(generation) + format_vlm_demo(vision))
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    from edge_runtime.generation.command import run_generate

    return run_generate(args)


def _cmd_serve(args: argparse.Namespace) -> int:
    from edge_runtime.server.daemon import main as serve_main

    return serve_main(args)


def _cmd_run(args: argparse.Namespace) -> int:
    import dataclasses

    import numpy as np

    from backends.base import DelegateSpec
    from edge_runtime.feeds import random_feeds
    from edge_runtime.runtime import Runtime
    from edge_runtime.timing import measure_ms, summarise_ms

    runtime = Runtime()
    options = runtime.compile_options()
    if args.delegate:
        # --delegate-option applies to the delegate named last on the command line.
        specs = [DelegateSpec(lib) for lib in args.delegate]
        specs[-1] = DelegateSpec(specs[-1].library, tuple(args.delegate_option))
        options = dataclasses.replace(options, delegates=tuple(specs) + options.delegates)
    elif args.delegate_option:
        raise SystemExit("edge-runtime run: --delegate-option needs a --delegate")
    if args.plan is not None and args.backend != "auto":
        print("edge-runtime run: give --backend NAME or --plan NAME, not both", file=sys.stderr)
        return 2
    given = {name: np.load(file) for name, file in args.input}
    model = runtime.load(args.model, backend=args.backend, options=options, plan=args.plan,
                         input_shapes={name: array.shape for name, array in given.items()})
    feeds = {**random_feeds(model.inputs), **given}
    outputs = model.run(feeds)
    samples = measure_ms(lambda: model.run(feeds), args.repeat, warmup=0)
    if args.output:
        np.savez(args.output, **outputs)
    result = {
        "model": str(args.model),
        "backend": model.backend,
        "backend_nodes": model.backend_nodes,
        "plan": _plan_summary(model),
        "latency_ms": summarise_ms(samples),
        "inputs": {name: {"shape": list(a.shape), "dtype": a.dtype.name} for name, a in feeds.items()},
        "outputs": {name: {"shape": list(a.shape), "dtype": a.dtype.name} for name, a in outputs.items()},
        "load": model.describe(),
    }
    # fp32 unless configured (runtime.precision / EDGE_RUNTIME_PRECISION); a backend that ran fp16
    # reports the drift it measured against fp32 on the CPU.
    result["precision"] = result["load"]["executable"].get("precision") or {"mode": options.precision}
    if args.json:
        _print_json(result)
    else:
        lat = result["latency_ms"]
        print(f"{args.model} on {model.backend}: p50 {lat['p50']} ms, p95 {lat['p95']} ms, mean {lat['mean']} ms")
        for name, meta in result["outputs"].items():
            print(f"  {name}: {meta['dtype']}{meta['shape']}")
    model.close()
    runtime.close()
    return 0


def _plan_summary(model: Any) -> dict[str, Any]:
    """``{"name", "stages"}`` of a loaded model; a single-backend load is a one-stage plan."""
    described = model.describe()["executable"]
    if "stages" in described:
        return {"name": described["plan"], "est_ms": described.get("est_ms"), "stages": described["stages"]}
    stage = {"stage": 0, "backend": model.backend, "node_count": model.report.node_count,
             "inputs": [s.name for s in model.inputs], "outputs": [s.name for s in model.outputs]}
    return {"name": model.backend, "stages": [stage]}


def _cmd_plan(args: argparse.Namespace) -> int:
    from edge_runtime.planning.report import format_plans
    from edge_runtime.runtime import Runtime

    shapes = {}
    for name, text in args.shape:
        try:
            shapes[name] = tuple(int(d) for d in text.replace("x", ",").split(","))
        except ValueError:
            print(f"edge-runtime plan: --shape {name}={text}: expected integers like 1,3,224,224", file=sys.stderr)
            return 2
    runtime = Runtime()
    planner = runtime.planner(args.model, shapes)
    names = args.plan or list(planner.available())
    plans = [planner.describe(planner.layout(name)) for name in names]
    report = {"model": str(args.model), "node_count": planner.prepared.original_node_count,
              "backends": {name: planner.table.speeds[name].to_dict() for name in planner.backends},
              "plans": plans}
    # What auto would load: every candidate's estimate beside its measurement on this device.
    decision = runtime.measured_choice(args.model, planner.model, runtime.compile_options(), shapes or None)
    report["auto_decision"] = decision.to_dict() if decision is not None else None
    if args.json:
        _print_json(report)
    else:
        print(format_plans(report))
    runtime.close()
    return 0


def _cmd_split(args: argparse.Namespace) -> int:
    from edge_runtime.cloud.command import run_split

    return run_split(args)


def _cmd_convert(args: argparse.Namespace) -> int:
    from edge_runtime.convert_command import run_convert

    return run_convert(args)
