"""What every command module shares: the usage error, output helpers and argument types."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from robot_latency.errors import RobotLatencyError
from robot_latency.models.ladder_manifest import VALID_QUANTS, LadderError, normalize_quant
from robot_latency.planner.budget import parse_cpu_list
from robot_latency.report.table import markdown_table as render_table

__all__ = [
    "UsageError",
    "check_quant_flags",
    "count_arg",
    "cpu_list_arg",
    "echo",
    "emit_json",
    "fmt_bytes",
    "nonneg_int",
    "positive_int",
    "quant_level",
    "render_table",
    "split_list",
]


class UsageError(RobotLatencyError):
    """Bad command-line input; printed as one line, exit status 2."""


def emit_json(obj: Any) -> None:
    """Print ``obj`` as JSON (NaN refused: a script reading it must get valid JSON)."""
    sys.stdout.write(json.dumps(obj, indent=2, allow_nan=False) + "\n")


def echo(line: str = "") -> None:
    """Print one line of a command's output."""
    sys.stdout.write(line + "\n")


def fmt_bytes(n: float) -> str:
    """Return a byte count in GB, MB, kB or B."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


class Parser(argparse.ArgumentParser):
    """argparse's parser that takes no abbreviated flag (``--deadline`` is not silently
    ``--deadline-ms``); its subcommands' parsers are of this class too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def split_list(text: str | None, cast: Any = str, *, flag: str = "a list") -> list[Any]:
    """Split a comma-separated option into typed items (blank items dropped).

    Raises:
        UsageError: an item ``cast`` refuses (the message names ``flag`` and the item).
    """
    out = []
    for item in (x.strip() for x in (text.split(",") if text else [])):
        if not item:
            continue
        try:
            out.append(cast(item))
        except ValueError:
            kind = "a number" if cast in (float, int) else getattr(cast, "__name__", "valid")
            raise UsageError(f"{flag}: {item!r} is not {kind}") from None
    return out


def cpu_list_arg(text: str) -> tuple[int, ...]:
    """argparse type: a CPU list such as ``0`` or ``0,2-3``."""
    try:
        return parse_cpu_list(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from err
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def nonneg_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from err
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def count_arg(text: str) -> int:
    """argparse type: a count that may be written 494e6 or 0.5e9."""
    try:
        value = float(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from err
    if not value >= 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return round(value)


#: Every flag that names quant levels, by its argparse destination: one level, or a list of
#: them, written ``A B`` or ``A,B`` (:func:`check_quant_flags` makes it ``A,B``).
QUANT_FLAGS = {"quant": "--quant", "draft_quant": "--draft-quant", "quants": "--quants",
               "inflated_quants": "--inflated-quants"}


def quant_level(text: str, *, flag: str = "--quant") -> str:
    """Return a quant level's canonical name (``q4_k_m`` -> ``Q4_K_M``), checked by the one
    function the ladder uses (:func:`~robot_latency.models.ladder_manifest.normalize_quant`).

    Raises:
        UsageError: not a level (``Q4_K`` is a ggml type, not a level); names the flag.
    """
    try:
        return normalize_quant(text)
    except LadderError:
        raise UsageError(f"{flag}: unknown level {text!r}; valid: "
                         f"{', '.join(VALID_QUANTS)}") from None


def quant_list_arg(p: Any, flag: str, **kwargs: Any) -> None:
    """Add a flag of quant levels that takes ``A B`` and ``A,B`` alike (one syntax for every
    command's ``--quants``)."""
    p.add_argument(flag, nargs="+", metavar="QUANT", **kwargs)


def check_quant_flags(args: argparse.Namespace) -> None:
    """Check and make canonical every quant flag a command has (:data:`QUANT_FLAGS`), so every
    command accepts and refuses the same names, before it does anything.

    Raises:
        UsageError: an unknown level; names the flag. (An empty list is the command's to
            judge: some take it as "none".)
    """
    for dest, flag in QUANT_FLAGS.items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        if dest in ("quant", "draft_quant"):
            setattr(args, dest, quant_level(value, flag=flag))
        else:  # a list: space-separated (nargs="+"), comma-separated, or both, everywhere
            items = value if isinstance(value, list) else [value]
            setattr(args, dest, ",".join(quant_level(q, flag=flag)
                                         for item in items for q in split_list(item)))


def search_answer_lines(title: str, *, held: str | None, failed: str | None,
                        miss_held: float | None, miss_failed: float | None, rate_name: str,
                        what: str, more_flag: str) -> list[str]:
    """A capacity search's answer in words: the ``held`` setting and the first ``failed`` one
    (already in words, e.g. ``"x1.7 = 0.75 commands/s"``), each with its ``rate_name``."""
    lines = [title]
    if held is None:
        lines.append(f"  none held: {failed} missed {100 * (miss_failed or 0.0):.2f}%")
    else:
        lines.append(f"  held   {held}, {rate_name} {100 * (miss_held or 0.0):.2f}%")
    if failed is None:
        lines.append(f"  failed none: every {what} tried held (more {more_flag} go higher)")
    elif held is not None:
        lines.append(f"  failed {failed}, {rate_name} {100 * (miss_failed or 0.0):.2f}%")
    return lines
