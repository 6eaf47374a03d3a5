"""Which published sources agree with the rest: the check that keeps one source from poisoning a
device's answer.

Each source's rows are predicted from a fit of its engine family over every *other* source's rows
(pooled over devices, each row against its own device's bandwidth floor, as the ``family`` scope
of :func:`~robot_latency.floor.published_fit.fitted_calibration` pools them). ``ratio`` is the
geometric mean of ``measured / predicted`` over the source's rows: 1 where the source measures
what the others would lead one to expect, 5 where its step times are five times the others'. A
source past ``SOURCE_DISAGREEMENT_FACTOR`` either way is *flagged*: its rows still predict its
own setup (a user who has that build on that device gets its figures), but it cannot alone set
a device's answer: where a device has rows of other sources, the flagged source is set aside; where
it has no others, the answer comes from the family's unflagged rows, and says so.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

from robot_latency.floor.calibration import check_engine_family
from robot_latency.floor.errors import CalibrationError
from robot_latency.floor.fit import distinct_sizes, fit_two_term
from robot_latency.floor.published_table import PublishedRow, not_predicted_reason, row_point

__all__ = [
    "SOURCE_DISAGREEMENT_FACTOR",
    "SourceCheck",
    "flagged_sources",
    "source_checks",
]

#: A source whose rows sit further than this factor from the other sources' fit (either way, as
#: a geometric mean over its rows) is flagged. Setups of one engine family differ by up to about
#: 2x in efficiency for reasons the rows state (power mode, clocks, build); past 2x the rows say
#: more about the source's conditions than about the device.
SOURCE_DISAGREEMENT_FACTOR = 2.0


@dataclass(frozen=True)
class SourceCheck:
    """One source's rows against the fit of every other source of its engine family."""

    source: str
    engine_family: str
    rows: int
    devices: tuple[str, ...]
    ratio: float | None
    flagged: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return asdict(self)


def _predictable(rows: Sequence[PublishedRow], family: str) -> list[PublishedRow]:
    return [r for r in rows if r.engine_family == family and not_predicted_reason(r) is None]


@lru_cache(maxsize=64)
def source_checks(table: tuple[PublishedRow, ...], engine_family: str) -> tuple[SourceCheck, ...]:
    """Check every source of ``engine_family`` in ``table`` against the others' pooled fit.

    A source whose family has no two model sizes left without it gets no ratio and is not
    flagged (the reason says why).
    """
    family = check_engine_family(engine_family)
    mine = _predictable(table, family)
    out = []
    for source in sorted({r.source for r in mine}):
        own = [r for r in mine if r.source == source]
        rest = [r for r in mine if r.source != source]
        devices = tuple(sorted({r.device for r in own}))
        points = [row_point(r) for r in rest]
        if len(points) < 2 or distinct_sizes([p.floor_ms for p in points]) < 2:
            out.append(SourceCheck(source, family, len(own), devices, None, False,
                                   "no two model sizes of the family without it"))
            continue
        try:
            fit = fit_two_term([p.floor_ms for p in points], [p.measured_ms for p in points])
        except CalibrationError as err:
            out.append(SourceCheck(source, family, len(own), devices, None, False, str(err)))
            continue
        logs = [math.log(r.itl_ms / fit.predict_ms(row_point(r).floor_ms)) for r in own]
        ratio = math.exp(statistics.fmean(logs))
        flagged = max(ratio, 1.0 / ratio) > SOURCE_DISAGREEMENT_FACTOR
        out.append(SourceCheck(
            source, family, len(own), devices, ratio, flagged,
            (f"its step times are x{ratio:.2f} what the other sources' fit predicts "
             f"({len(rest)} rows), past the x{SOURCE_DISAGREEMENT_FACTOR:g} flag" if flagged
             else f"x{ratio:.2f} of the other sources' fit, inside the "
                  f"x{SOURCE_DISAGREEMENT_FACTOR:g} flag")))
    return tuple(out)


def flagged_sources(table: Sequence[PublishedRow], engine_family: str) -> dict[str, SourceCheck]:
    """Return the flagged sources of ``engine_family`` in ``table``, by name."""
    return {c.source: c for c in source_checks(tuple(table), engine_family) if c.flagged}
