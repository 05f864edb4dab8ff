"""Write the deterministic test/benchmark models as ``.onnx`` files.

``python tools/make_models.py --out DIR [mlp mobilenet transformer]``. The builders
live in ``edge_runtime.model_zoo`` so the installed package (the demo) has them
too; they are re-exported here for tests and benchmarks.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from edge_runtime.model_zoo import BUILDERS, build_mlp, build_mobilenet, build_transformer  # noqa: E402

__all__ = ["BUILDERS", "build_mlp", "build_mobilenet", "build_transformer", "main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("models"), help="output directory")
    parser.add_argument("names", nargs="*", help=f"models to build: {', '.join(BUILDERS)} (default: all)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(BUILDERS))
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {sorted(BUILDERS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.names or BUILDERS:
        path = args.out / f"{name}.onnx"
        onnx.save(BUILDERS[name](), str(path))
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
