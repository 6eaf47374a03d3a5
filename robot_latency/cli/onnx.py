"""``robot-latency models onnx``: export a GGUF (default: the bundled planner) to ONNX, cached."""

from __future__ import annotations

import argparse
import json
import sys

from robot_latency.models.onnx_cache import ensure_onnx_export


def cmd_models_onnx(args: argparse.Namespace) -> int:
    """Export (or find in the cache) the ONNX decoder of a GGUF; print where it is."""
    export = ensure_onnx_export(args.model or None, cache_dir=args.cache_dir,
                                rebuild=args.rebuild)
    if args.json:
        sys.stdout.write(json.dumps({"source": str(export.source),
                                     "directory": str(export.directory),
                                     "fp32": str(export.fp32), "int8": str(export.int8),
                                     "built": export.built}, indent=2) + "\n")
        return 0
    state = "exported" if export.built else "already in the cache"
    sys.stdout.write(f"{export.source.name}: {state}\n  fp32 {export.fp32}\n"
                     f"  int8 {export.int8}\n"
                     f"run it: robot-latency run --engine onnx --model {export.fp32} ...\n")
    return 0


def register_models(msub: argparse._SubParsersAction) -> None:
    """Add ``onnx`` to the ``models`` command group."""
    p = msub.add_parser(
        "onnx", help="export a GGUF (default: the bundled planner) to ONNX, into the cache",
        description="Writes the FP32 ONNX decoder with KV cache and its dynamic INT8 copy into "
                    "the model cache, once per GGUF; `run --engine onnx` without --model does "
                    "the same on first use.")
    p.add_argument("--model", default=None,
                   help="F32/F16 GGUF to export (default: the bundled planner)")
    p.add_argument("--cache-dir", default=None, help="default: the user cache")
    p.add_argument("--rebuild", action="store_true", help="export again even if cached")
    p.add_argument("--json", action="store_true", help="print the paths as JSON")
    p.set_defaults(func=cmd_models_onnx)
