"""``profiles``: list the shipped planner profiles."""

from __future__ import annotations

import argparse

from robot_latency.cli.common import echo, emit_json, render_table


def cmd_profiles(args: argparse.Namespace) -> int:
    from robot_latency.profiles.profile import load_profile, shipped_profiles

    profiles = [load_profile(str(path)) for path in shipped_profiles().values()]
    if args.json:
        emit_json([{"name": p.name, "description": p.description, "path": p.source,
                    "chat_format": p.chat_format, "contract": p.output.contract,
                    "normalize": p.normalize, "fallback_rule": p.fallback.rule}
                   for p in profiles])
        return 0
    echo(render_table(["name", "chat format", "output", "normalize", "rule fallback",
                       "description"],
                      [[p.name, p.chat_format, p.output.contract, p.normalize,
                        p.fallback.rule, p.description] for p in profiles]))
    echo("\nA profile is named by its shipped name or by the path of a YAML file "
         "(--profile, planner_profile).")
    return 0

def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``profiles`` command to the ``robot-latency`` parser."""
    p = sub.add_parser("profiles", help="list the shipped planner profiles")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_profiles)
