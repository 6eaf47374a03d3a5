"""What a published-table answer rests on, and the wider interval of one that rests on one source.

A device's decode answer rests on the sources that measured the engine family there: the
distinct sources of the family's rows on the device (flagged sources set aside, as the answer
sets them aside), or, on a device without rows, those of the rows its fit borrows (module or
family scope). Where that is one source, the 80% interval (``family_interval``: residuals that
mostly measure how one source's setups agree with each other) says nothing about how far a
second source would land; it is widened on each side by the family's leave-one-source-out
median absolute error (``published_checks.leave_one_source_out``), the typical miss of an
answer whose source is new. A family whose every row comes from one source has no such error
of its own: the error pooled over every family's rows stands in, and a note says so.

The TTFT answer is counted and widened the same way from the prefill table: its sources are the
distinct sources of the family's prefill rows on the device (the same sources set aside), or,
on a device without any, those of the rows its prefill fit borrows; where that is one source, the
TTFT interval (``prefill_interval``: leave-one-out residuals, each row predicted from its own
setup) is widened on each side by the family's prefill leave-one-source-out median absolute error
(``published_checks.validate_prefill``'s ``new_source_median_abs_error``: each row predicted as
its device's answer from a table without its source), pooled over every family where the family
has none of its own.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from robot_latency.floor.calibration import Calibration
from robot_latency.floor.published_checks import leave_one_source_out, validate_prefill
from robot_latency.floor.published_fit import family_interval, fitted_calibration
from robot_latency.floor.published_prefill import (
    PrefillRow,
    load_prefill_table,
    prefill_not_predicted_reason,
)
from robot_latency.floor.published_table import (
    PublishedRow,
    load_table,
    not_predicted_reason,
    row_point,
)

__all__ = ["answer_sources", "leave_one_source_out_coverage", "loso_error", "prefill_loso_error",
           "prefill_sources", "table_calibration", "widen_interval", "with_source_support"]


def answer_sources(cal: Calibration, rows: Sequence[PublishedRow]) -> tuple[str, ...]:
    """The distinct sources ``cal``'s answer on its device rests on (see the module doc)."""
    here = {r.source for r in rows
            if r.engine_family == cal.engine_family and r.device == cal.device_id
            and not_predicted_reason(r) is None and r.source not in cal.set_aside}
    return tuple(sorted(here)) if here else tuple(cal.sources)


def prefill_sources(cal: Calibration, rows: Sequence[PrefillRow]) -> tuple[str, ...]:
    """The distinct sources ``cal``'s TTFT answer on its device rests on (see the module doc)."""
    here = {r.source for r in rows
            if r.engine_family == cal.engine_family and r.device == cal.device_id
            and prefill_not_predicted_reason(r) is None and r.source not in cal.set_aside}
    basis = set(cal.prefill_basis)
    return tuple(sorted(here or {r.source for r in rows if r.id in basis}))


@functools.lru_cache(maxsize=64)
def _prefill_loso_by_family(table: tuple[PrefillRow, ...]) -> tuple[dict[str, float | None],
                                                                     float | None]:
    got = validate_prefill(table)
    errs = [abs(r["new_source_error_rel"]) for r in got["rows"]
            if r.get("new_source_error_rel") is not None]
    return ({f: s["new_source_median_abs_error"] for f, s in got["by_family"].items()},
            statistics.median(errs) if errs else None)


def prefill_loso_error(engine_family: str, rows: Sequence[PrefillRow]
                       ) -> tuple[float | None, str]:
    """The family's prefill leave-one-source-out median absolute error over ``rows``, and where
    it comes from (the family's own rows, or every family's pooled where it has none)."""
    by_family, pooled = _prefill_loso_by_family(tuple(rows))
    own = by_family.get(engine_family)
    if own is not None:
        return own, f"{engine_family}'s prefill leave-one-source-out median error"
    return pooled, (f"prefill leave-one-source-out median error pooled over every family "
                    f"({engine_family} has none of its own: its prefill rows come from one "
                    "source)")


@functools.lru_cache(maxsize=64)
def _loso_by_family(table: tuple[PublishedRow, ...]) -> tuple[dict[str, float | None],
                                                                float | None]:
    got = leave_one_source_out(table)
    errs = [abs(r["error_rel"]) for r in got["rows"] if r["error_rel"] is not None]
    return ({f: s["median_abs_error"] for f, s in got["by_family"].items()},
            statistics.median(errs) if errs else None)


def loso_error(engine_family: str, rows: Sequence[PublishedRow]) -> tuple[float | None, str]:
    """The family's leave-one-source-out median absolute error over ``rows``, and where it
    comes from (the family's own rows, or every family's pooled where it has none)."""
    by_family, pooled = _loso_by_family(tuple(rows))
    own = by_family.get(engine_family)
    if own is not None:
        return own, f"{engine_family}'s leave-one-source-out median error"
    return pooled, (f"leave-one-source-out median error pooled over every family ({engine_family}"
                    " has none of its own: its rows come from one source)")


def widen_interval(interval_rel: tuple[float, float],
                   widening_rel: float) -> tuple[float, float]:
    """``interval_rel`` widened by ``widening_rel`` on each side (the low end kept above -1)."""
    lo, hi = interval_rel
    return (max(-0.99, lo - widening_rel), hi + widening_rel)


def with_source_support(cal: Calibration, rows: Sequence[PublishedRow],
                        prefill_rows: Sequence[PrefillRow] | None = None) -> Calibration:
    """``cal`` with its answer's sources counted (decode, and prefill from ``prefill_rows``,
    the shipped table by default) and, where an answer rests on one source, its interval (the
    decode interval, the TTFT interval) widened by the family's leave-one-source-out error
    (noted)."""
    pf = prefill_rows if prefill_rows is not None else load_prefill_table()
    return _widen_prefill(_widen_decode(cal, rows), pf)


def _widen_decode(cal: Calibration, rows: Sequence[PublishedRow]) -> Calibration:
    sources = answer_sources(cal, rows)
    cal = replace(cal, answer_sources=sources)
    if len(sources) != 1:
        return cal
    error, what = loso_error(cal.engine_family, rows)
    if not error:
        return cal
    return replace(cal, interval_rel=widen_interval(cal.interval_rel, error),
                   source_widening_rel=error, notes=(
                       *cal.notes, f"rests on one source ({sources[0]}): interval widened by "
                       f"{100 * error:.1f}% each side, {what}"))


def _widen_prefill(cal: Calibration, rows: Sequence[PrefillRow]) -> Calibration:
    if not cal.prefill_calibrated:
        return cal
    sources = prefill_sources(cal, rows)
    cal = replace(cal, prefill_sources=sources)
    if len(sources) != 1 or cal.prefill_interval_rel is None:
        return cal
    error, what = prefill_loso_error(cal.engine_family, rows)
    if not error:
        return cal
    return replace(cal, prefill_interval_rel=widen_interval(cal.prefill_interval_rel, error),
                   prefill_source_widening_rel=error, prefill_notes=(
                       *cal.prefill_notes, f"prefill rests on one source ({sources[0]}): TTFT "
                       f"interval widened by {100 * error:.1f}% each side, {what}"))


def table_calibration(engine_family: str, device_id: str, *,
                      rows: Sequence[PublishedRow] | None = None,
                      exclude: str | None = None, setup: str | None = None,
                      prefill_rows: Sequence[PrefillRow] | None = None) -> Calibration:
    """The calibration a device's answer states: ``published_fit.fitted_calibration``'s fit
    (its arguments and errors), its sources counted, and its decode interval widened by the
    family's leave-one-source-out error where it rests on one source."""
    table = list(rows if rows is not None else load_table())
    cal = fitted_calibration(engine_family, device_id, rows=table, exclude=exclude,
                             setup=setup, prefill_rows=prefill_rows)
    return with_source_support(cal, table, prefill_rows)


def leave_one_source_out_coverage(rows: Sequence[PublishedRow] | None = None
                                  ) -> dict[str, Any]:
    """``published_checks.leave_one_source_out`` with each held-out row's stated 80% interval
    (the answer from the table without its source, widened where that rests on one source, by
    the smaller table's leave-one-source-out error) and whether the row lies inside it, with and
    without the widening."""
    return leave_one_source_out(rows, interval_of=_held_out_interval)


def _held_out_interval(row: PublishedRow, pred_ms: float,
                       rest: Sequence[PublishedRow]) -> dict[str, Any]:
    key = tuple(rest)
    cal = _answer_calibration(row.engine_family, row.device, key)
    plain = family_interval(row.engine_family, rows=key)
    floor = row_point(row).floor_ms

    def ms(rel: tuple[float, float]) -> list[float]:
        return [max(floor, pred_ms * (1 + rel[0])), pred_ms * (1 + rel[1])]

    wide, narrow = ms(cal.interval_rel), ms(plain)
    return {"interval_ms": wide, "inside_interval": wide[0] <= row.itl_ms <= wide[1],
            "inside_unwidened": narrow[0] <= row.itl_ms <= narrow[1],
            "answer_sources": list(cal.answer_sources),
            "source_widening_rel": cal.source_widening_rel}


@functools.lru_cache(maxsize=256)
def _answer_calibration(family: str, device_id: str,
                        table: tuple[PublishedRow, ...]) -> Calibration:
    return table_calibration(family, device_id, rows=table)
