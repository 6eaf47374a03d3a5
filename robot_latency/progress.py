"""A progress bar of a run: cycles done and deadline misses so far (tqdm, on stderr).

Off when the output is not a terminal (tqdm's ``disable=None``), so logs and pipes stay clean;
the counts are kept either way. Fed one cycle record at a time (a planner run's ``on_record``),
or with totals read from a cycle log another process writes (:class:`CycleLogFollower`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import IO, Any

from tqdm import tqdm


class CycleProgress:
    """Cycles done and misses so far, drawn as a tqdm bar when the output is a terminal.

    Args:
        total: cycles expected (None: unknown, the bar counts up).
        desc: the bar's label.
        enabled: False: never draw; True: draw when ``file`` is a terminal.
        force: draw even when ``file`` is not a terminal.
        file: where the bar goes (default stderr).
    """

    def __init__(self, total: int | None = None, *, desc: str = "cycles", enabled: bool = True,
                 force: bool = False, file: IO[str] | None = None) -> None:
        self.cycles = 0
        self.misses = 0
        disable: bool | None = False if force else (None if enabled else True)
        self._bar = tqdm(total=total, desc=desc, unit="cycle", file=file or sys.stderr,
                         disable=disable, dynamic_ncols=True, leave=True)
        self._show()

    @property
    def drawing(self) -> bool:
        """True when the bar is drawn (a terminal, or forced)."""
        return not self._bar.disable

    def set_total(self, total: int | None) -> None:
        """Set the number of cycles expected, once it is known."""
        self._bar.total = total
        self._bar.refresh()

    def add(self, cycles: int, misses: int) -> None:
        """Count ``cycles`` more cycles, ``misses`` of them past their deadline."""
        if cycles <= 0 and misses <= 0:
            return
        self.cycles += cycles
        self.misses += misses
        self._bar.update(cycles)
        self._show()

    def record(self, rec: Any) -> None:
        """Count one cycle record (anything with ``deadline_met``): a planner run's
        ``on_record``."""
        self.add(1, 0 if rec.deadline_met else 1)

    def _show(self) -> None:
        self._bar.set_postfix_str(f"misses={self.misses}", refresh=False)
        self._bar.refresh()

    def close(self) -> None:
        """Draw the final state and release the line (idempotent)."""
        self._bar.close()

    def __enter__(self) -> CycleProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CycleLogFollower:
    """Counts the cycles and misses another process appends to a cycle log (``cycles.jsonl``).

    Reads only complete lines past what it has read; a missing file counts as empty (the writer
    has not started). Each :meth:`poll` returns the new (cycles, misses).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._offset = 0

    def poll(self) -> tuple[int, int]:
        """Return the cycles and misses logged since the previous poll."""
        try:
            with self.path.open("rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except FileNotFoundError:
            return 0, 0
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next poll
        self._offset += end
        cycles = misses = 0
        for line in data[:end].splitlines():
            if not line.strip():
                continue
            try:
                met = json.loads(line).get("deadline_met")
            except (ValueError, AttributeError):
                continue  # not a record line; the cycle log's own reader reports it
            cycles += 1
            misses += met is False
        return cycles, misses
