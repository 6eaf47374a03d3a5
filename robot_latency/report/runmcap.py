"""Reading a run's records and manifest back from its run.mcap
(:mod:`robot_latency.planner.mcap_log`).

The ``/planner/cycle_record`` channel holds each cycle's record as cycles.jsonl's line, and the
file's ``manifest`` metadata the manifest at close, so a run directory that holds only run.mcap
(or a run.mcap on its own) can be reported like one with cycles.jsonl. The file is read as a
stream, record by record: one a crash left without its closing index gives every cycle it holds
(a warning says it ended early), as cycles.jsonl does with a partial last line.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from robot_latency.errors import RobotLatencyError
from robot_latency.planner.mcap_log import RECORD_CHANNEL
from robot_latency.records import CycleRecord, RecordError

log = logging.getLogger(__name__)


class McapReadError(RobotLatencyError, ValueError):
    """A run.mcap that cannot be read as a run; the message names the file."""


def read_run_mcap(path: str | os.PathLike[str]) -> tuple[list[CycleRecord], dict[str, Any]]:
    """Return the records (``/planner/cycle_record``, in order) and the manifest (the
    ``manifest`` metadata; empty when the run did not close) of a run.mcap.

    Raises:
        McapReadError: the file cannot be opened, is no MCAP, has no record channel, or holds
            a record that is not a cycle record; the message names the file.
    """
    from mcap.exceptions import EndOfFile, McapError
    from mcap.records import Channel, Message, Metadata
    from mcap.stream_reader import StreamReader

    p = Path(path)
    records: list[CycleRecord] = []
    manifest: dict[str, Any] = {}
    record_channels: set[int] = set()
    try:
        fh = open(p, "rb")
    except OSError as err:
        raise McapReadError(f"cannot read {p}: {err.strerror or err}") from err
    with fh:
        try:
            for item in StreamReader(fh, skip_magic=False).records:
                if isinstance(item, Channel) and item.topic == RECORD_CHANNEL:
                    record_channels.add(item.id)
                elif isinstance(item, Message) and item.channel_id in record_channels:
                    records.append(_record(p, item.data, len(records)))
                elif isinstance(item, Metadata) and item.name == "manifest":
                    manifest = _manifest(p, item.metadata.get("json", "null"))
        except EndOfFile:
            log.warning("%s ends early (a run that did not close): %d cycle records read",
                        p, len(records))
        except McapError as err:
            raise McapReadError(f"{p} is not a readable MCAP file: {err}") from err
    if not record_channels:
        raise McapReadError(f"{p} has no {RECORD_CHANNEL} channel: not a run.mcap of "
                            "robot-latency")
    return records, manifest


def _record(path: Path, data: bytes, index: int) -> CycleRecord:
    try:
        return CycleRecord.from_dict(json.loads(data))
    except (ValueError, RecordError) as err:
        raise McapReadError(f"{path}, {RECORD_CHANNEL} message {index + 1}: not a valid cycle "
                            f"record: {err}") from err


def _manifest(path: Path, text: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except ValueError as err:
        raise McapReadError(f"{path}: its manifest metadata is not JSON: {err}") from err
    return doc if isinstance(doc, dict) else {}
