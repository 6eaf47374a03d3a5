"""From flags to a run: the settings a command's flags give, and the run the builder resolves.

A :class:`~robot_latency.planner.config.SettingsError` names the setting (``.name``); it is
reported here under the flag that sets it: ``--`` and the name with dashes, or the flag in
:data:`FLAG_OF` where they differ.
"""

from __future__ import annotations

import sys
from typing import Any

from robot_latency.cli.common import UsageError
from robot_latency.planner.config import RunSettings, SettingsError

#: The flag of each setting whose flag is not ``--`` + its name with dashes.
FLAG_OF = {"draft_model": "--draft", "target_device": "--device", "log_dir": "--out",
           "engine_options": "--engine-opt"}


def flag_of(name: str) -> str:
    """Return the flag that sets the setting ``name``."""
    return FLAG_OF.get(name, "--" + name.replace("_", "-"))


def usage_error(err: SettingsError) -> UsageError:
    """Return the error as a usage error naming the flag."""
    return UsageError(f"{flag_of(err.name)}: {err.message}")


def settings_from_flags(**values: Any) -> RunSettings:
    """Return the settings for these values (field names).

    Raises:
        UsageError: a bad value; the message names its flag.
    """
    try:
        return RunSettings(**values)
    except SettingsError as err:
        raise usage_error(err) from err


def resolve_or_usage(settings: RunSettings, *, cores: frozenset[int] | None = None) -> Any:
    """Resolve the run with the builder the nodes use too; print its notes on stderr.

    Raises:
        UsageError: settings that cannot go together; the message names the flag.
    """
    from robot_latency.planner.resolve import resolve_run

    try:
        run, notes = resolve_run(settings, cores=cores)
    except SettingsError as err:
        raise usage_error(err) from err
    for note in notes:
        sys.stderr.write(f"note: {note}\n")
    return run
