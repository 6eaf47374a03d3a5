"""``robot-latency doctor``: check this machine for the planner (OK/WARN/FAIL, each with a fix)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from robot_latency.hostcheck import DoctorInput, exit_status, run_checks


def cmd_doctor(args: argparse.Namespace) -> int:
    """Run the checks; print one line per finding; exit 1 when any failed."""
    # The same flags as run, winning over the params file as they do there.
    overrides = {name: value for name, value in (
        ("engine", args.engine), ("loop_cpus", args.loop_cpus),
        ("engine_cpus", args.engine_cpus), ("loop_priority", args.loop_priority))
        if value is not None}
    checks = run_checks(DoctorInput(
        root=Path(args.root), params_file=Path(args.params_file) if args.params_file else None,
        model=Path(args.model) if args.model else None,
        cache_dir=Path(args.cache_dir) if args.cache_dir else None,
        overrides=overrides, quant=args.quant,
        run_dir=Path(args.run) if args.run else None))
    if args.json:
        sys.stdout.write(json.dumps([c.to_dict() for c in checks], indent=2) + "\n")
    else:
        sys.stdout.write("".join(c.line() + "\n" for c in checks))
        failed = sum(c.status == "FAIL" for c in checks)
        warned = sum(c.status == "WARN" for c in checks)
        sys.stdout.write(f"{len(checks)} checks: {failed} FAIL, {warned} WARN\n")
    return exit_status(checks)


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``doctor`` command."""
    p = sub.add_parser(
        "doctor", help="check this machine for the planner: OK / WARN / FAIL with fixes",
        description="Checks the Jetson module, nvpmodel mode and jetson_clocks, the ROS 2 distro "
                    "and rclpy, llama.cpp's GPU offload, the ONNX Runtime providers that can "
                    "start, the rtprio limit, CPUs and memory against a params file or the "
                    "same flags as run (--model, --quant, --loop-cpus, ...; flags win), and "
                    "the model cache; with --run, a finished run's late fallbacks. Without "
                    "--model or a params file's model, memory is checked for the bundled "
                    "planner. Exits 1 when a check fails.")
    p.add_argument("--params-file", default=None,
                   help="node params file to check against (e.g. config/orin_nano_8gb.yaml)")
    p.add_argument("--model", default=None, help="GGUF to check memory for (default: the "
                                                 "params file's, else the bundled planner)")
    p.add_argument("--quant", default=None,
                   help="ladder level of --model, as for run (its built file is checked)")
    p.add_argument("--engine", default=None, help="engine, as for run (sim: no model file)")
    p.add_argument("--loop-cpus", default=None,
                   help="as for run; wins over the params file's loop_cpus")
    p.add_argument("--engine-cpus", default=None,
                   help="as for run; wins over the params file's engine_cpus")
    p.add_argument("--loop-priority", type=int, default=None,
                   help="as for run; wins over the params file's loop_priority")
    p.add_argument("--run", default=None, metavar="RUN_DIR",
                   help="a finished run: warn when its fallbacks were published late")
    p.add_argument("--root", default="/", help="read device files under DIR (fixture trees)")
    p.add_argument("--cache-dir", default=None, help="model cache (default: the user cache)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_doctor)
